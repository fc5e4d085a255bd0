"""What ``registry.dbtune`` holds: the parsed settings, the engines, the
cache, and the SQL methods as registered."""

from dataclasses import dataclass, field
from operator import itemgetter

from pyramid.exceptions import ConfigurationError

from .cache import MAX_EXPIRY, Watch, make_cache
from .routing.engines import Router
from .sql.conditions import MAX_TAGGED, any_row, told, value_tag
from .sql.method import SQLMethod
from .sql.readings import readings_of
from .sql.shapes import ReadShape

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
    #: which rows it holds (``SQLMethod.shape``), where writes told by
    #: row images are matched against them and patched in
    shape: ReadShape | None = None
    # What __post_init__ derives, and the tags remembered by tags(): a
    # memo of the hit path, not part of what the method is.
    _names: list = field(init=False, repr=False, compare=False)
    _values: object = field(init=False, repr=False, compare=False)
    _memo: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        names = [parameter for _, parameter in self.pins]
        if self.shape is not None:
            names = sorted({p for _, _, p in self.shape.conditions})
        object.__setattr__(self, '_names', names)
        object.__setattr__(self, '_values', itemgetter(*names or ['']))

    def tags(self, params):
        """What drops the cached rows of a call with ``params``: writes
        that touch rows whose pinned columns hold its arguments, and
        writes of its table whose rows cannot be told; its tables where
        it has no pins, or an argument can be no tag. With a shape, a
        :class:`~pyramid_dbtune.cache.Watch` of them. Remembered: this is
        the cache-hit path."""
        values = self._values(params) if self._names else ()
        try:
            return self._memo[values]
        except KeyError:
            pass
        except TypeError:  # unhashable: not remembered
            return self._watch(self._tags(params), params)
        tags = self._watch(self._tags(params), params)
        if any(
            isinstance(params[n], str | bytes) and len(params[n]) > MAX_TAGGED
            for n in self._names
        ):
            return tags  # not kept alive here, outside max_bytes
        if len(self._memo) >= _MEMO_SIZE:
            self._memo.clear()
        self._memo[values] = tags
        return tags

    def _tags(self, params):
        if not self.pins:
            return self.invalidated_by
        (table,) = self.invalidated_by
        tags = [any_row(table)]
        for column, parameter in self.pins:
            tag = value_tag(table, column, params[parameter])
            if tag is None:
                return self.invalidated_by
            tags.append(tag)
        return frozenset(tags)

    def _watch(self, tags, params):
        if self.shape is None:
            return tags
        return Watch(
            tags,
            self.shape,
            {name: params[name] for name in self._names},
            self.method.max_rows,
        )


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
        if settings.read_urls and not settings.url:
            raise ConfigurationError(
                'dbtune.read_urls is set, but neither dbtune.url nor '
                'sqlalchemy.url is: replicas read for a writer'
            )
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
        #: table: the columns that cached reads of it need told, to match
        #: a change against their conditions and patch it in
        self.watched = {}
        #: table: the columns that cached reads of it compare with their
        #: arguments (a single-precision float's tells no row by value)
        self.compared = {}
        #: with ``dbtune.cache.listen``, the thread that hears of changes
        #: (:class:`~pyramid_dbtune.cache.changes.Listener`)
        self.listener = None
        #: True where the settings' names came lower-cased (``zope.conf``):
        #: ``dbtune.cache_time.<name>`` then names a method whatever its
        #: case.
        self.folded = False

    def close(self):
        """Stop the listener, and close the engines' connections."""
        if self.listener is not None:
            self.listener.stop()
        if self.router is not None:
            self.router.dispose()

    def untold_writes(self):
        """``(method, table)`` of each write whose rows cannot be told
        from its text, though reads of its table are pinned or watched:
        each of its writes drops every cached read of the table."""
        found = []
        for registered in self.methods.values():
            method = registered.method
            for table in sorted(method.tables or ()):
                columns = sorted(
                    {*self.pinned.get(table, ()), *self.watched.get(table, ())}
                )
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
        cache_time = self.override(self.settings.cache_times, method.name)
        if cache_time is not None:
            return cache_time
        if method.cache_time is None:
            return self.settings.cache_default_time
        return method.cache_time

    def override(self, overrides, name):
        """The setting of ``overrides`` (the parsed
        ``dbtune.cache_time.<name>`` or ``dbtune.invalidate.<name>``)
        that names the method ``name``; None if none does."""
        if name in overrides or not self.folded:
            return overrides.get(name)
        return overrides.get(name.lower())

    def register(self, method):
        if self.router is None:
            raise ConfigurationError(
                f'SQL method {method.name!r} needs a database: set '
                'dbtune.url (or sqlalchemy.url)'
            )
        for reading in readings_of(self.router.dialect):
            for name in method.hidden[reading]:
                # PyMySQL and psycopg2 put the value into the text, where
                # a quote or a line break in it would end the comment.
                raise ConfigurationError(
                    f'SQL method {method.name!r}: :{name} stands inside a '
                    f'string, a quoted name or a comment as {reading} reads '
                    'the statement, where a value put into the text can '
                    f'escape: take it out of there, or write it \\:{name}'
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
        invalidate = self.override(self.settings.invalidates, method.name)
        if invalidate is not None:
            if method.writes:
                raise ConfigurationError(
                    f'dbtune.invalidate.{method.name} names a write: a '
                    'write always invalidates the tables it changes'
                )
            invalidated_by = method.tables if invalidate else frozenset()
        pins = ()
        if invalidated_by == method.tables:
            pins = method.pins_for(self.router.dialect)
        for column, _ in pins:
            (table,) = method.tables
            self.pinned.setdefault(table, set()).add(column)
        shape = method.shape if invalidated_by == method.tables else None
        if shape is not None and cache_time:
            watched = self.watched.setdefault(shape.table, set())
            watched.update(shape.columns)
            compared = self.compared.setdefault(shape.table, set())
            compared.update(c for c, _, _ in shape.conditions)
            # Changes the database tells are applied to the rows the
            # process holds, where fills tell which changes they hold. The
            # app's own writes are matched, never applied: without the
            # listener, a fill's snapshot would serve nothing.
            self.router.snapshots = (
                self.router.dialect == 'postgresql'
                and self.settings.cache_backend == 'memory'
                and self.settings.cache_listen
            )
        self.methods[method.name] = Registered(
            method, cache_time, key, invalidated_by, pins, shape
        )
