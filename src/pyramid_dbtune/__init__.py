"""pyramid_dbtune: make database-backed Pyramid applications fast under load.

Include it with ``config.include('pyramid_dbtune')`` (or
``pyramid.includes = pyramid_dbtune``); see :doc:`quickstart`.
"""

import logging
from functools import partial
from pathlib import Path

from pyramid.events import ApplicationCreated
from pyramid.exceptions import ConfigurationError
from pyramid.path import AssetResolver

from . import fastpath
from . import settings as _settings
from .ops import access, probes
from .registry import DBTune
from .routing import retry, session
from .routing.errors import WriteInReadError, WriteSlotTimeout
from .routing.request import RequestContext, SQLNamespace
from .routing.session import RoutingSession
from .sql import zsql
from .sql.method import SQLFileError, SQLMethod
from .sql.rows import Record, Rows
from .sql.zsql import ZSQLMethod

log = logging.getLogger(__name__)

__all__ = [
    'DBTune',
    'Record',
    'Rows',
    'SQLFileError',
    'RoutingSession',
    'SQLMethod',
    'WriteInReadError',
    'WriteSlotTimeout',
    'ZSQLMethod',
    'includeme',
    'install',
]


def add_sql_method(config, name, sql=None, **kw):
    """Register a SQL method: ``config.add_sql_method(name, sql, **kw)``.

    The keywords are those of :class:`SQLMethod`; ``name`` may also be a
    ready :class:`SQLMethod` (then give nothing else). Two methods of one
    name conflict, as two views of one name do.
    """
    if isinstance(name, SQLMethod) and sql is None and not kw:
        method = name
    else:
        method = SQLMethod(name, sql, **kw)
    dbtune = config.registry.dbtune
    intr = config.introspectable(
        'dbtune sql methods', method.name, method.name, 'dbtune sql method'
    )
    intr['method'] = method
    intr['sql'] = method.sql
    config.action(
        ('dbtune-sql-method', method.name),
        dbtune.register,
        args=(method,),
        introspectables=(intr,),
    )
    return method


def add_sql_methods(config, spec):
    """Register every ``*.sql`` and ``*.zsql`` file in a directory, given
    as an asset spec or a path.

    ``config.add_sql_methods('myapp:sql/')``; a ``.sql`` file is read by
    :func:`~pyramid_dbtune.sql.method.load_sql_file`, a Zope ``.zsql`` file
    by :func:`~pyramid_dbtune.sql.zsql.load_zsql_file`.
    """
    path = Path(AssetResolver(config.package).resolve(spec).abspath())
    try:
        loaded = zsql.load_directory(path)
    except SQLFileError as exc:
        raise ConfigurationError(f'add_sql_methods({spec!r}): {exc}') from None
    return [add_sql_method(config, m) for _, m in loaded]


def _say_untold(dbtune):
    for name, table in dbtune.untold_writes():
        log.info(
            'SQL method %s writes %s, whose cached reads are dropped by row, '
            'but the rows it touches cannot be told from its text: each of '
            'its writes drops them all (see "By row" in the docs)',
            name,
            table,
        )


def _check_when_made(dbtune, settings, included, check_names, event):
    """As the WSGI app is made: what the settings name is there, a
    security policy for ``dbtune.stats.permission`` too, and they are as
    they were at the include; a ``request.dbsession`` added after a
    commit is routed too."""
    if check_names:
        _check_overrides(dbtune)
    _settings.check_unchanged(settings, included)
    registry = event.app.registry
    if dbtune.settings.stats_permission is not None:
        access.check_policy(registry)
    if dbtune.settings.dbsession:
        session.provide(registry)


def _check_overrides(dbtune):
    settings = dbtune.settings
    for prefix, overrides in (
        ('cache_time', settings.cache_times),
        ('invalidate', settings.invalidates),
    ):
        unknown = sorted(set(overrides) - set(dbtune.methods))
        if unknown:
            known = ', '.join(sorted(dbtune.methods)) or 'none'
            raise ConfigurationError(
                f'dbtune.{prefix}.{unknown[0]} names no SQL method '
                f'(registered: {known})'
            )


class _Settings:
    """Where an error found in the settings comes from, as Pyramid's error
    shows it: they have no file or line of their own."""

    def __str__(self):
        return "the application's dbtune.* settings"


def includeme(config):
    """Set up pyramid_dbtune: parse the settings, add directives.

    Adds ``config.add_sql_method`` and ``config.add_sql_methods``,
    ``request.sql``, ``request.dbsession`` and ``request.dbtune``, and
    includes pyramid_tm. With
    ``dbtune.fast_paths`` set, answers those paths before Pyramid builds a
    request (:mod:`pyramid_dbtune.fastpath`); with ``dbtune.server_timing``,
    ``dbtune.stats`` or ``dbtune.profile``, adds the timing tween and the
    ``/_dbtune/`` views (:mod:`pyramid_dbtune.ops.dashboard`); with
    ``dbtune.probes`` on, adds the probe views of
    :mod:`pyramid_dbtune.ops.probes`.

    Once a registry: included again (by Python and by ZCML's ``<include
    package="pyramid_dbtune"/>``, in either order), it does nothing.
    """
    if getattr(config.registry, 'dbtune', None) is not None:
        return  # Pyramid would include it again, and conflict
    # Parsed now, not in a deferred action as pyramid_retry does: the
    # settings decide the routes, and an action added during the commit
    # runs after every action of its order, the application's routes'
    # among them. A later change is refused (check_unchanged).
    install(config, DBTune(_settings.parse(config.get_settings())))


def install(config, dbtune, check_names=True):
    """What :func:`includeme` installs, around ``dbtune``: a
    :class:`DBTune` made already, its settings parsed. The Zope side
    (:mod:`pyramid_dbtune.zope.ops`) gives it the Zope process's own, so
    that the operator's views count what Zope's SQL runs, and
    ``check_names`` false: a ``dbtune.cache_time.<id>`` may name a ZSQL
    Method, which is in the ZODB, not registered here."""
    parsed = dbtune.settings
    included = _settings.read(config.get_settings())
    config.include('pyramid_tm')
    config.registry.dbtune = dbtune
    config.add_directive('add_sql_method', add_sql_method)
    config.add_directive('add_sql_methods', add_sql_methods)
    config.add_request_method(RequestContext, 'dbtune', reify=True)
    config.add_request_method(SQLNamespace, 'sql', reify=True)
    if parsed.fast_paths:
        fastpath.install(config, parsed.fast_paths)
    if parsed.server_timing or parsed.stats or parsed.profile:
        from .ops import dashboard

        dashboard.install(config, dbtune)
    if parsed.probes:
        probes.install(config)
    retry.install(config, parsed.retry_backoff, parsed.retry_max_backoff)
    if parsed.dbsession:
        # After the application's actions: it may add its own.
        config.action(None, session.provide, args=(config.registry,), order=1)
    if parsed.cache_listen:
        from .cache import changes

        config.action(None, changes.start, args=(dbtune,), order=10)
    if dbtune.views:
        access.add_route(config)
    # After every other action: the untold writes are of registered
    # methods.
    # Their errors say they come from the settings: Pyramid would name
    # "Line 0 of file None" (these actions are no call of a directive).
    settings_config = config.with_package(config.package)
    settings_config.info = _Settings()
    settings_config.action(None, _say_untold, args=(dbtune,), order=10)
    settings_config.action(
        None,
        _settings.check_unchanged,
        args=(config.registry.settings, included),
        order=10,
    )
    # Once every commit is done: an app may commit before it registers
    # its methods, sets its security policy, or changes a setting.
    config.add_subscriber(
        partial(
            _check_when_made,
            dbtune,
            config.registry.settings,
            included,
            check_names,
        ),
        ApplicationCreated,
    )
