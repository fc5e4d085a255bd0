"""The Zope side: the package in a Zope site, through ZCML.

A database connection that a Zope site's ZSQL Methods use by
``connection_id``, unchanged, on the package's cache, read pool and write
slots (``<include package="pyramid_dbtune.zope" />``); and :data:`sql`,
the package's own SQL methods for code-first sites.
"""

from .connection import (
    DBTuneConnection,
    add_form,
    database,
    has_settings,
    manage_addDBTuneConnection,
)
from .methods import sql

__all__ = [
    'DBTuneConnection',
    'add_form',
    'database',
    'initialize',
    'manage_addDBTuneConnection',
    'sql',
]


def initialize(context):
    """Zope's product registration, as Zope starts: the settings of
    ``zope.conf`` checked (a bad one stops Zope, as it would stop
    Pyramid), and the connection in the ZMI's add list. Settings given in
    the WSGI pipeline instead are checked when its filter is made."""
    if has_settings():
        database()
    context.registerClass(
        DBTuneConnection,
        permission='Add Z Database Connections',
        constructors=(add_form, manage_addDBTuneConnection),
    )
