"""On the request: ``request.sql`` (the SQL methods, bound to it) and
``request.dbtune`` (what it did with the database, and its unit of work).
"""

from time import perf_counter

from sqlalchemy.exc import DBAPIError

from ..cache import HIT, MISS, STALE, WAITED
from ..sql.method import call_key
from .errors import (
    WriteInReadError,
    is_read_only_refusal,
)
from .work import UnitOfWork


class RequestContext:
    """``request.dbtune``: what this request did with the database.

    ``cache`` counts this request's SQL method calls by cache outcome
    (``hit``, ``miss``, ``stale``, ``waited``, ``uncached``); ``queries``
    and ``db_seconds`` count the statements it ran and the time they took;
    ``write_seconds`` is the part of ``db_seconds`` spent on the writer in
    the request's transaction; ``unit.write_wait`` is the time it waited
    for a write slot, which ``db_seconds`` does not include.
    """

    def __init__(self, request):
        dbtune = request.registry.dbtune
        self.dbtune = dbtune
        if dbtune.router is None:
            raise RuntimeError(
                'pyramid_dbtune has no database: set dbtune.url (or '
                'sqlalchemy.url) to use request.sql or request.dbsession'
            )
        self.unit = UnitOfWork.of(request, dbtune.router, dbtune.cache)
        self.unit.serve(request)
        self.cache = dict.fromkeys((HIT, MISS, STALE, WAITED, 'uncached'), 0)
        self.queries = 0
        self.db_seconds = 0.0
        self.write_seconds = 0.0

    def read(self, method, params, fill=False):
        """Run a read on a reader: uncached, or a cache ``fill``."""
        statement, params = method.bind(params)
        start = perf_counter()
        try:
            return self.dbtune.router.read(
                statement,
                params,
                method.max_rows,
                method.tables,
                writer=self.unit.pinned,
                position=self.unit.position,
                fill=fill,
            )
        except DBAPIError as exc:
            _refused(method, exc)
            raise
        finally:
            self.queries += 1
            self.db_seconds += perf_counter() - start

    def execute(self, method, params):
        """Run a write, or a read after a write or a setting of the
        session, in the transaction."""
        statement, params = method.bind(params)
        unit = self.unit
        waited = unit.write_wait
        start = perf_counter()
        try:
            return unit.execute(method, statement, params)
        except DBAPIError as exc:
            if not method.writes:  # in the session, on its reader
                _refused(method, exc)
            raise
        finally:
            # The wait for a write slot is not database time: it is
            # counted apart (``unit.write_wait``, Server-Timing's
            # write-slot).
            elapsed = perf_counter() - start - (unit.write_wait - waited)
            self.queries += 1
            self.db_seconds += elapsed
            if unit.dirty:  # on the writer
                self.write_seconds += elapsed


def _refused(method, exc):
    """Raise the database's refusal of a write in a read of ``method``,
    which runs read-only, as :class:`WriteInReadError`."""
    if is_read_only_refusal(exc.orig):
        raise WriteInReadError(
            f'SQL method {method.name}() tried to change the database, but '
            'its statement reads as a read, and reads run read-only: '
            'declare it with writes=True (or a "-- writes: true" line in '
            'its file)'
        ) from exc


class BoundSQLMethod:
    """``request.sql.<name>``: a SQL method bound to one request."""

    __slots__ = ('method', 'cache_time', '_key', '_tags', '_context')

    def __init__(self, registered, context):
        self.method = registered.method
        self.cache_time = registered.cache_time
        self._key = registered.key
        self._tags = registered.tags
        self._context = context

    def __repr__(self):
        return f'<bound {self.method!r}>'

    def __call__(self, /, *args, **params):
        """Run the method with keyword arguments; return :class:`Rows`."""
        method = self.method
        if args:
            raise TypeError(
                f'SQL method {method.name}() takes keyword arguments only'
            )
        context = self._context
        unit = context.unit
        unit.flush()
        if method.writes or unit.dirty or unit.settings or unit.stays:
            context.cache['uncached'] += 1
            return context.execute(method, params)
        if not self.cache_time or unit.pinned:
            context.cache['uncached'] += 1
            return context.read(method, params)
        values = method.values(params)
        # 1, 1.0 and True are equal, but not the same argument.
        key = call_key(self._key, values)
        try:
            hash(key)
        except TypeError:
            # bind() refuses a value it cannot bind; a ZSQL method's key
            # holds only the values it binds, converted.
            method.bind(params)  # raises the clear ValueError
            raise  # pragma: no cover (bind() refused it)
        rows, status = context.dbtune.cache.get_or_fill(
            key,
            self.cache_time,
            self._tags(params),
            context.read,
            method,
            params,
            True,
        )
        # Causal reads: rows read from a replica that had not replayed the
        # client's last commit are not the client's (this process, or
        # another, filled them).
        if (
            unit.position
            and rows.position is not None
            and not rows.position.covers(unit.position)
        ):
            context.cache['uncached'] += 1
            return context.read(method, params)
        context.cache[status] += 1
        return rows.own()  # the cache's are every caller's


class SQLNamespace:
    """``request.sql``: the registered SQL methods, bound to the request.

    ``request.sql.search(area='Leeds')`` and
    ``request.sql['search'](area='Leeds')`` call the same method.
    """

    def __init__(self, request):
        self._methods = request.registry.dbtune.methods
        self._context = request.dbtune

    def __getattr__(self, name):
        if name.startswith('_'):
            raise AttributeError(name)
        try:
            registered = self._methods[name]
        except KeyError:
            known = ', '.join(sorted(self._methods)) or 'none'
            raise AttributeError(
                f'no SQL method named {name!r} (registered: {known})'
            ) from None
        bound = self.__dict__[name] = BoundSQLMethod(registered, self._context)
        return bound

    def __getitem__(self, name):
        try:
            return getattr(self, name)
        except AttributeError as exc:
            raise KeyError(exc.args[0]) from None

    def __contains__(self, name):
        return name in self._methods

    def __iter__(self):
        return iter(sorted(self._methods))

    def __dir__(self):
        return sorted(self._methods)
