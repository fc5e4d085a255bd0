"""Where each SQL method call runs: the cache, a reader, or the writer.

Routing is by unit of work, not by statement. While a request's
transaction has not written, a read runs on a connection of its own,
through the cache when the method has a ``cache_time``. A write runs in
the request's writing session, which joins ``request.tm`` through
zope.sqlalchemy; from then until the transaction ends, every read of the
request runs in that session too (it sees its own writes) and is neither
served from nor stored in the cache. After a commit, the cached results of
the tables written are invalidated; an abort invalidates nothing.
"""

from time import perf_counter

import transaction.interfaces
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from zope.sqlalchemy import mark_changed, register

from .cache import HIT, MISS, STALE, WAITED
from .rows import Rows


def fetch(result, max_rows):
    """Read a SQLAlchemy result into :class:`Rows`, keeping ``max_rows``."""
    if not result.returns_rows:
        return Rows(rowcount=result.rowcount)
    columns = tuple(result.keys())
    truncated = False
    if max_rows:
        data = result.fetchmany(max_rows + 1)
        truncated = len(data) > max_rows
        del data[max_rows:]
        result.close()
    else:
        data = result.fetchall()
    return Rows(columns, data, truncated=truncated)


#: How a read's connection is made read-only, and made writable again
#: after, by dialect. PostgreSQL's driver does it by an execution option.
#: SET TRANSACTION applies to the transaction the read is about to begin.
_READ_ONLY = {
    'sqlite': ('PRAGMA query_only = ON', 'PRAGMA query_only = OFF'),
    'mysql': ('SET TRANSACTION READ ONLY', None),
    'mariadb': ('SET TRANSACTION READ ONLY', None),
    'oracle': ('SET TRANSACTION READ ONLY', None),
}
#: What each refuses a write in a read-only transaction with: PostgreSQL's
#: SQLSTATE, MySQL's and MariaDB's error number, Oracle's ORA- number.
_READ_ONLY_SQLSTATE = '25006'
_READ_ONLY_ERRNO = frozenset([1792, 1456])


class Database:
    """The engine that SQL methods run on, and its identity for cache keys.

    One engine, from ``dbtune.url`` (or ``sqlalchemy.url``), serves reads
    and writes.
    """

    def __init__(self, url):
        self.engine = create_engine(url)
        # Cache keys name the database read, never its password.
        self.key = make_url(url).render_as_string(hide_password=True)
        self.dialect = self.engine.dialect.name
        self._read_only, self._writable = _READ_ONLY.get(
            self.dialect, (None, None)
        )

    def read(self, statement, params, max_rows):
        """Run a read on a connection of its own, read-only: a statement
        taken for a read that writes fails, rather than being rolled back
        unseen."""
        with self.engine.connect() as connection:
            if self.dialect == 'postgresql':
                connection.execution_options(postgresql_readonly=True)
            if self._read_only:
                connection.exec_driver_sql(self._read_only)
            try:
                return fetch(connection.execute(statement, params), max_rows)
            finally:
                if self._writable:
                    connection.exec_driver_sql(self._writable)

    def dispose(self):
        self.engine.dispose()


class UnitOfWork:
    """The writing side of one request: its session and what it wrote."""

    def __init__(self, request, database, cache):
        self.request = request
        self.database = database
        self.cache = cache
        #: True from the first write until its transaction ends.
        self.dirty = False
        self._session = None
        self._tables = set()
        self._all_tables = False

    def execute(self, method, statement, params):
        """Run ``statement`` in the request's transaction."""
        tm = self.request.tm
        try:
            txn = tm.get()
        except transaction.interfaces.NoTransaction:
            raise RuntimeError(
                f'SQL method {method.name}() needs an active transaction, '
                'and request.tm has none (is pyramid_tm active for this '
                'request?)'
            ) from None
        if self._session is None:
            self._session = Session(bind=self.database.engine)
            register(self._session, transaction_manager=tm)
        result = self._session.execute(statement, params)
        if method.writes:
            # Text DML is invisible to zope.sqlalchemy: without this the
            # transaction would be rolled back at commit time.
            mark_changed(self._session, transaction_manager=tm)
            if not self.dirty:
                self.dirty = True
                txn.addAfterCommitHook(self._after_commit)
                txn.addAfterAbortHook(self._finish)
            if method.tables is None:
                self._all_tables = True
            else:
                self._tables.update(method.tables)
        return fetch(result, method.max_rows)

    def _after_commit(self, committed):
        if committed:
            self.cache.invalidate(None if self._all_tables else self._tables)
        self._finish()

    def _finish(self):
        self.dirty = False
        self._tables = set()
        self._all_tables = False


class RequestContext:
    """``request.dbtune``: what this request did with the database.

    ``cache`` counts this request's SQL method calls by cache outcome
    (``hit``, ``miss``, ``stale``, ``waited``, ``uncached``); ``queries``
    and ``db_seconds`` count the statements it ran and the time they took.
    """

    def __init__(self, request):
        runtime = request.registry.dbtune
        self.runtime = runtime
        self.unit = UnitOfWork(request, runtime.database, runtime.cache)
        self.cache = dict.fromkeys((HIT, MISS, STALE, WAITED, 'uncached'), 0)
        self.queries = 0
        self.db_seconds = 0.0

    def read(self, method, params):
        """Run a read on a connection of its own (cache fill or uncached)."""
        statement, params = method.bind(params)
        start = perf_counter()
        try:
            return self.runtime.database.read(
                statement, params, method.max_rows
            )
        except DBAPIError as exc:
            if _refused_as_read_only(exc):
                raise WriteInReadError(
                    f'SQL method {method.name}() tried to change the '
                    'database, but its statement reads as a read, and reads '
                    'run read-only: declare it with writes=True (or a '
                    '"-- writes: true" line in its file)'
                ) from exc
            raise
        finally:
            self.queries += 1
            self.db_seconds += perf_counter() - start

    def execute(self, method, params):
        """Run a write, or a read after a write, in the transaction."""
        statement, params = method.bind(params)
        start = perf_counter()
        try:
            return self.unit.execute(method, statement, params)
        finally:
            self.queries += 1
            self.db_seconds += perf_counter() - start


class WriteInReadError(RuntimeError):
    """A SQL method taken for a read tried to write (see ``writes=``)."""


def _refused_as_read_only(exc):
    orig = exc.orig
    args = getattr(orig, 'args', ())
    code = getattr(args[0], 'code', args[0]) if args else None
    return (
        getattr(orig, 'sqlstate', None) == _READ_ONLY_SQLSTATE
        or code in _READ_ONLY_ERRNO
        or 'readonly database' in str(orig)  # SQLite: SQLITE_READONLY
    )


def _freeze(value):
    """A hashable stand-in for a list argument, its items' types kept."""
    if isinstance(value, list | tuple):
        return tuple([(type(v), v) for v in value])
    if isinstance(value, set | frozenset):
        return frozenset([(type(v), v) for v in value])
    return value


class BoundSQLMethod:
    """``request.sql.<name>``: a SQL method bound to one request."""

    __slots__ = ('method', 'cache_time', '_key', '_context')

    def __init__(self, registered, context):
        self.method, self.cache_time, self._key = registered
        self._context = context

    def __repr__(self):
        return f'<bound {self.method!r}>'

    def __call__(self, *args, **params):
        """Run the method with keyword arguments; return :class:`Rows`."""
        method = self.method
        if args:
            raise TypeError(
                f'SQL method {method.name}() takes keyword arguments only'
            )
        context = self._context
        if method.writes or context.unit.dirty:
            context.cache['uncached'] += 1
            return context.execute(method, params)
        if not self.cache_time:
            context.cache['uncached'] += 1
            return context.read(method, params)
        values = method.values(params)
        # 1, 1.0, True and Decimal(1) are equal, but not the same argument.
        key = (self._key, values, tuple(map(type, values)))
        try:
            hash(key)
        except TypeError:
            key = (self._key, tuple([_freeze(v) for v in values]), key[2])
            try:
                hash(key)
            except TypeError:
                method.bind(params)  # raises the clear ValueError
                raise  # pragma: no cover (bind() rejects all unhashables)
        rows, status = context.runtime.cache.get_or_fill(
            key, self.cache_time, method.tables, context.read, method, params
        )
        context.cache[status] += 1
        return rows


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
