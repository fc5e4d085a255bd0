"""pyramid_dbtune: make database-backed Pyramid applications fast under load.

Include it with ``config.include('pyramid_dbtune')`` (or
``pyramid.includes = pyramid_dbtune``); see :doc:`quickstart`.
"""

from pathlib import Path

from pyramid.exceptions import ConfigurationError
from pyramid.path import AssetResolver

from . import access, fastpath, probes
from . import settings as _settings
from .cache import MAX_EXPIRY, make_cache
from .errors import WriteInReadError, WriteSlotTimeout
from .routing import RequestContext, Router, SQLNamespace
from .rows import Record, Rows
from .session import RoutingSession, dbsession
from .sqlmethod import SQLFileError, SQLMethod, load_sql_file

__all__ = [
    'DBTune',
    'Record',
    'Rows',
    'SQLFileError',
    'RoutingSession',
    'SQLMethod',
    'WriteInReadError',
    'WriteSlotTimeout',
    'includeme',
]


class DBTune:
    """``registry.dbtune``: the application's settings, engines and cache.

    ``settings`` is the parsed :class:`~pyramid_dbtune.settings.Settings`;
    ``router`` holds the writer and reader engines and the write slots
    (``None`` until a URL is set); ``cache`` holds the results; ``methods``
    maps each SQL method's name to ``(method, cache_time, cache_key)`` once
    registered.
    """

    def __init__(self, settings):
        self.settings = settings
        self.router = Router(settings) if settings.url else None
        self.cache = make_cache(settings)
        self.methods = {}

    def cache_time(self, method):
        """The seconds ``method``'s rows are kept, settings applied."""
        if method.name in self.settings.cache_times:
            return self.settings.cache_times[method.name]
        if method.cache_time is None:
            return self.settings.cache_default_time
        return method.cache_time

    def register(self, method):
        if self.router is None:
            raise ConfigurationError(
                f'SQL method {method.name!r} needs a database: set '
                'dbtune.url (or sqlalchemy.url)'
            )
        cache_time = self.cache_time(method)
        if (
            self.settings.cache_backend == 'memcached'
            and cache_time > MAX_EXPIRY
        ):
            raise ConfigurationError(
                f'SQL method {method.name!r}: a cache time of {cache_time} s '
                f'is more than memcached keeps (30 days, {MAX_EXPIRY} s)'
            )
        key = '\0'.join(
            [method.name, str(method.max_rows), self.router.key, method.sql]
        )
        self.methods[method.name] = (method, cache_time, key)


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
    runtime = config.registry.dbtune
    intr = config.introspectable(
        'dbtune sql methods', method.name, method.name, 'dbtune sql method'
    )
    intr['method'] = method
    intr['sql'] = method.sql
    config.action(
        ('dbtune-sql-method', method.name),
        runtime.register,
        args=(method,),
        introspectables=(intr,),
    )
    return method


def add_sql_methods(config, spec):
    """Register every ``*.sql`` file in a directory, as an asset spec.

    ``config.add_sql_methods('myapp:sql/')``; each file's header is read
    by :func:`~pyramid_dbtune.sqlmethod.load_sql_file`.
    """
    path = Path(AssetResolver(config.package).resolve(spec).abspath())
    files = sorted(path.glob('*.sql')) if path.is_dir() else []
    if not files:
        raise ConfigurationError(
            f'add_sql_methods({spec!r}): {path} is not a directory that '
            'holds *.sql files'
        )
    loaded = {}
    for file in files:
        try:
            method = load_sql_file(file)
        except SQLFileError as exc:
            raise ConfigurationError(str(exc)) from None
        if method.name in loaded:
            raise ConfigurationError(
                f'{file} and {loaded[method.name][0]} both name SQL method '
                f'{method.name!r}'
            )
        loaded[method.name] = (file, method)
    return [add_sql_method(config, m) for _, m in loaded.values()]


def _check_cache_times(runtime):
    unknown = sorted(set(runtime.settings.cache_times) - set(runtime.methods))
    if unknown:
        known = ', '.join(sorted(runtime.methods)) or 'none'
        raise ConfigurationError(
            f'dbtune.cache_time.{unknown[0]} names no SQL method '
            f'(registered: {known})'
        )


def includeme(config):
    """Set up pyramid_dbtune: parse the settings, add directives.

    Adds ``config.add_sql_method`` and ``config.add_sql_methods``,
    ``request.sql``, ``request.dbsession`` and ``request.dbtune``, and
    includes pyramid_tm. With
    ``dbtune.fast_paths`` set, answers those paths before Pyramid builds a
    request (:mod:`pyramid_dbtune.fastpath`); with ``dbtune.probes`` on,
    adds the probe views of :mod:`pyramid_dbtune.probes`.
    """
    parsed = _settings.parse(config.get_settings())
    config.include('pyramid_tm')
    runtime = config.registry.dbtune = DBTune(parsed)
    config.add_directive('add_sql_method', add_sql_method)
    config.add_directive('add_sql_methods', add_sql_methods)
    config.add_request_method(RequestContext, 'dbtune', reify=True)
    config.add_request_method(SQLNamespace, 'sql', reify=True)
    config.add_request_method(dbsession, 'dbsession', reify=True)
    if parsed.fast_paths:
        fastpath.install(config, parsed.fast_paths)
    if parsed.probes:
        probes.install(config)
    # After every other action: overrides may only name registered methods,
    # and a permission needs the security policy the app sets up.
    config.action(None, _check_cache_times, args=(runtime,), order=10)
    if parsed.stats_permission is not None:
        config.action(
            None, access.check_policy, args=(config.registry,), order=10
        )
