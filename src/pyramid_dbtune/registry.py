"""What ``registry.dbtune`` holds: the parsed settings, the engines, the
cache, and the SQL methods as registered."""

from dataclasses import dataclass, field
from operator import itemgetter

from pyramid.exceptions import ConfigurationError

from .cache import MAX_EXPIRY, make_cache
from .routing.engines import Router
from .sql.conditions import any_row, told, value_tag
from .sql.method import SQLMethod

#: Tags remembered for each method's calls, at the most.
_MEMO_SIZE = 4096


@dataclass(frozen=True)
class Registered:
    """A SQL method as ``request.sql`` calls it, settings applied."""

    #: the :class:`~pyramid_dbtune.SQLMethod` (or ZSQL method)
    method: SQLMethod
    #: seconds its rows are kept (0: not cached)
    cache_time: float
    #: what its cache keys start with: name, ``max_rows``, database, text
    key: str
    #: the tables whose committed writes drop its rows
    invalidated_by: frozenset
    #: its ``(column, parameter)`` pins (``SQLMethod.pins``), where its
    #: rows are invalidated by row
    pins: tuple = ()
    _memo: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        names = [parameter for _, parameter in self.pins] or ['']
        object.__setattr__(self, '_values', itemgetter(*names))

    def tags(self, params):
        """What drops the cached rows of a call with ``params``: writes
        that touch rows whose pinned columns hold its arguments, and
        writes of its table whose rows cannot be told; its tables where
        it has no pins, or an argument can be no tag. Remembered: this is
        the cache-hit path."""
        if not self.pins:
            return self.invalidated_by
        values = self._values(params)
        try:
            return self._memo[values]
        except (KeyError, TypeError):  # not yet, or unhashable
            pass
        (table,) = self.invalidated_by
        tags = [any_row(table)]
        for column, parameter in self.pins:
            tag = value_tag(table, column, params[parameter])
            if tag is None:
                return self.invalidated_by
            tags.append(tag)
        if len(self._memo) >= _MEMO_SIZE:
            self._memo.clear()
        tags = self._memo[values] = frozenset(tags)
        return tags


class DBTune:
    """``registry.dbtune``: the application's settings, engines and cache.

    ``settings`` is the parsed :class:`~pyramid_dbtune.settings.Settings`;
    ``router`` holds the writer and reader engines and the write slots
    (``None`` until a URL is set); ``cache`` holds the results; ``methods``
    maps each SQL method's name to its :class:`Registered` form, settings
    applied. With
    ``dbtune.stats`` or ``dbtune.profile`` on, ``stats``
    (:class:`~pyramid_dbtune.ops.stats.Stats`) and ``profiler``
    (:class:`~pyramid_dbtune.ops.profiler.Profiler`) hold their figures, and
    ``active`` maps each thread running a request to its request; else
    they are ``None``.
    """

    def __init__(self, settings):
        self.settings = settings
        self.router = Router(settings) if settings.url else None
        self.cache = make_cache(settings)
        self.methods = {}
        self.stats = self.profiler = self.active = None
        #: the paths of the ``/_dbtune/`` views, under ``/_dbtune/``
        self.views = []
        #: True where ``request.dbsession`` is the application's, adopted
        self.adopts = False
        #: table: the columns that SQL methods' reads of it are pinned by
        #: (a write of the table tells its rows by those)
        self.pinned = {}
        #: with ``dbtune.cache.listen``, the thread that hears of changes
        #: (:class:`~pyramid_dbtune.cache.changes.Listener`)
        self.listener = None

    def close(self):
        """Stop the listener, and close the engines' connections."""
        if self.listener is not None:
            self.listener.stop()
        if self.router is not None:
            self.router.dispose()

    def untold_writes(self):
        """``(method, table)`` of each write whose rows cannot be told
        from its text, though reads of its table are pinned: each of its
        writes drops every cached read of the table."""
        found = []
        for registered in self.methods.values():
            method = registered.method
            for table in sorted(method.tables or ()):
                columns = self.pinned.get(table)
                if not columns or not method.writes:
                    continue
                if (
                    len(method.tables) > 1
                    or method.list_params
                    or not (told(method.write_shape, columns))
                ):
                    found.append((method.name, table))
        return found

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
        invalidated_by = method.invalidated_by
        invalidate = self.settings.invalidates.get(method.name)
        if invalidate is not None:
            if method.writes:
                raise ConfigurationError(
                    f'dbtune.invalidate.{method.name} names a write: a '
                    'write always invalidates the tables it changes'
                )
            invalidated_by = method.tables if invalidate else frozenset()
        pins = method.pins if invalidated_by == method.tables else ()
        for column, _ in pins:
            (table,) = method.tables
            self.pinned.setdefault(table, set()).add(column)
        self.methods[method.name] = Registered(
            method, cache_time, key, invalidated_by, pins
        )
