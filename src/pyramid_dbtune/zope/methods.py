"""Code-first Zope sites: SQL methods registered by ZCML
(``<dbtune:sqlmethods directory="sql" />``), called from a view or a
script as ``pyramid_dbtune.zope.sql.<name>(**params)``, the way a
Pyramid view calls ``request.sql``, in Zope's current transaction."""

from zope.configuration.exceptions import ConfigurationError
from zope.configuration.fields import Path as PathField
from zope.interface import Interface

from ..sql import zsql
from ..sql.method import SQLFileError
from .connection import add_method, database


class IZopeSQLMethodsDirective(Interface):
    """``<dbtune:sqlmethods>``: every .sql and .zsql file of a directory."""

    directory = PathField(title='A directory of .sql and .zsql files')


def sqlmethods(_context, directory):
    """Register every ``*.sql`` and ``*.zsql`` file of ``directory``; two
    methods of one name conflict, as two views of one name do."""
    try:
        loaded = zsql.load_directory(directory)
    except SQLFileError as exc:
        raise ConfigurationError(
            f'<dbtune:sqlmethods directory="{directory}">: {exc}'
        ) from None
    for _, method in loaded:
        _context.action(
            discriminator=('dbtune-sql-method', method.name),
            callable=add_method,
            args=(method,),
        )


class ZopeSQLNamespace:
    """``pyramid_dbtune.zope.sql``: the SQL methods ZCML registered, each
    called in Zope's current transaction: a read through the cache on the
    read pool (in a transaction that wrote: on the writer, uncached), a
    write on the writer, in a write slot, dropping what it changed when
    the transaction commits."""

    def __getattr__(self, name):
        if name.startswith('_'):
            raise AttributeError(name)
        methods = database().dbtune.methods
        try:
            registered = methods[name]
        except KeyError:
            known = ', '.join(sorted(methods)) or 'none'
            raise AttributeError(
                f'no SQL method named {name!r} (registered: {known})'
            ) from None

        def call(**params):
            return database().call(registered, params)

        return call


sql = ZopeSQLNamespace()
