"""Where each unit of work runs: the cache, a reader, or the writer.

Routing is by unit of work, not by statement. While a request's
transaction has not written, its reads run on a reader (a replica, or the
writer's database through a pool of its own), read-only, through the cache
when the method has a ``cache_time``. Its first write takes a **write
slot** (``dbtune.write_concurrency`` per process), held until the
transaction ends, and runs in the request's session on the writer, which
joins ``request.tm`` through zope.sqlalchemy. From then on every read of
the request runs there too: it sees its own writes, and is neither served
from nor stored in the cache. After a commit the cached results of the
tables written are invalidated; an abort invalidates nothing.
"""

import functools
import itertools
import logging
import threading
import time
from time import monotonic, perf_counter

import transaction.interfaces
from pyramid_retry import mark_error_retryable
from sqlalchemy import create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from zope.sqlalchemy import mark_changed, register

from ..cache import HIT, MISS, STALE, WAITED
from ..deploy import forks
from ..sql.rows import Rows
from .errors import (
    WriteInReadError,
    WriteSlotTimeout,
    is_read_only_refusal,
    mark_retryable,
)

log = logging.getLogger(__name__)

#: How a read on the writer is made read-only, and the connection made
#: writable again after, by dialect. PostgreSQL's driver does it by an
#: execution option. SET TRANSACTION applies to the transaction the read is
#: about to begin.
_SET_TRANSACTION = ('mysql', 'mariadb', 'oracle')
_READ_ONLY = {
    'sqlite': ('PRAGMA query_only = ON', 'PRAGMA query_only = OFF'),
    **dict.fromkeys(_SET_TRANSACTION, ('SET TRANSACTION READ ONLY', None)),
}
#: A reader that failed is left alone this long, doubling to the maximum.
FIRST_BACKOFF = 1.0
MAX_BACKOFF = 60.0
#: The name of the cookie that pins a client to the writer after a write.
PIN_COOKIE = 'dbtune_pin'


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


def make_engine(url, **kw):
    engine = create_engine(url, **kw)
    event.listen(engine, 'handle_error', mark_retryable)
    return engine


def make_read_only(engine):
    """Make every transaction on ``engine`` read-only: a statement taken
    for a read that writes then fails, rather than being rolled back
    unseen, and a session that writes through a reader fails too."""
    dialect = engine.dialect.name
    if dialect == 'postgresql':
        engine.update_execution_options(postgresql_readonly=True)
    elif dialect in _READ_ONLY_SESSION:
        # Once per connection: no statement before each read.
        event.listen(
            engine,
            'connect',
            functools.partial(_read_only_session, _READ_ONLY_SESSION[dialect]),
        )
    elif dialect == 'oracle':  # pragma: no cover (no Oracle server here)
        # Oracle has no read-only session: each transaction says it.
        event.listen(
            engine,
            'begin',
            lambda connection: connection.exec_driver_sql(
                'SET TRANSACTION READ ONLY'
            ),
        )


#: How a connection is made read-only for good, by dialect.
_READ_ONLY_SESSION = {
    'sqlite': 'PRAGMA query_only = ON',
    'mysql': 'SET SESSION TRANSACTION READ ONLY',
    'mariadb': 'SET SESSION TRANSACTION READ ONLY',
}


def _read_only_session(sql, dbapi_connection, record):
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(sql)
    finally:
        cursor.close()


class Reader:
    """One read engine, its load, and whether it is taken out."""

    def __init__(self, engine):
        self.engine = engine
        self.name = engine.url.render_as_string(hide_password=True)
        self.in_flight = 0
        #: Reads sent to this reader.
        self.reads = 0
        self.down_until = 0.0
        self.backoff = 0.0


class Router:
    """The engines: one writer, one or more readers; the write slots.

    ``failovers`` counts the reads that went to the writer because their
    reader was down; ``write_waits`` and ``write_wait_seconds`` count the
    writes that had to wait for a slot, and how long they waited.
    ``writer_reads`` counts the reads run on the writer outside a write
    transaction, ``write_transactions`` the transactions that took a
    write slot, and ``writes`` the writing SQL method calls (each
    reader counts its ``reads``).
    """

    def __init__(self, settings):
        self.settings = settings
        self.writer = make_engine(settings.url)
        # Cache keys name the database read, never its password; replicas
        # hold the writer's data, so the writer names them all.
        self.key = make_url(settings.url).render_as_string(hide_password=True)
        urls = settings.read_urls or (settings.url,)
        self.readers = [
            Reader(make_engine(url, pool_size=settings.read_pool_size))
            for url in urls
        ]
        for reader in self.readers:
            make_read_only(reader.engine)
            event.listen(
                reader.engine,
                'handle_error',
                functools.partial(self._reader_error, reader),
            )
        self._turn = itertools.count()
        self.replicas = settings.read_urls is not None
        self.dialect = self.writer.dialect.name
        self._read_only, self._writable = _READ_ONLY.get(
            self.dialect, (None, None)
        )
        self.failovers = 0
        self.writer_reads = 0
        self.write_transactions = 0
        self.writes = 0
        self.write_waits = 0
        self.write_wait_seconds = 0.0
        self._recent = {}
        self._reset_locks()
        forks.renew_after_fork(self)

    def _reset_locks(self):
        self._lock = threading.Lock()
        self.write_slots = threading.BoundedSemaphore(
            self.settings.write_concurrency
        )

    def after_fork(self):
        """In a forked child: drop the parent's connections unclosed (they
        are the parent's) and make the locks anew."""
        for engine in self.engines():
            engine.dispose(close=False)
        self._reset_locks()

    def engines(self):
        return [self.writer] + [r.engine for r in self.readers]

    def dispose(self):
        for engine in self.engines():
            engine.dispose()

    # Reads

    def pick(self, count=True):
        """The reader with the fewest reads in flight, or None if all are
        down (then the writer serves); ``count``: one more in flight."""
        now = monotonic()
        with self._lock:
            up = [r for r in self.readers if r.down_until <= now]
            if not up:
                return None
            # Ties go round: the rotation starts each pick elsewhere.
            turn = next(self._turn) % len(up)
            reader = min(up[turn:] + up[:turn], key=lambda r: r.in_flight)
            reader.in_flight += count
            reader.reads += count
            return reader

    def read(self, statement, params, max_rows, tables=(), writer=False):
        """Run a read, read-only, on a reader; on the writer when ``writer``
        is true, when ``tables`` were written within the replicas' lag
        window, or when no reader is up."""
        if not writer and self._recently_written(tables):
            writer = True
        reader = None if writer else self.pick()
        if reader is None:
            if not writer:
                self.failovers += 1
            return self._read_on(self.writer, statement, params, max_rows)
        try:
            try:
                connection = reader.engine.connect()
            except DBAPIError as exc:
                failed = exc  # refused, unreachable, out of connections
            else:
                try:
                    rows = self._read_with(
                        connection, statement, params, max_rows
                    )
                except DBAPIError as exc:
                    if not exc.connection_invalidated:
                        raise  # the statement's fault, not the reader's
                    failed = exc  # the reader went away mid-read
                else:
                    self._up(reader)
                    return rows
        finally:
            with self._lock:
                reader.in_flight -= 1
        self._down(reader, failed)
        self.failovers += 1
        return self._read_on(self.writer, statement, params, max_rows)

    def _read_on(self, engine, statement, params, max_rows):
        """A read on the writer, made read-only for the read alone."""
        self.writer_reads += 1
        with engine.connect() as connection:
            if self.dialect == 'postgresql':
                connection.execution_options(postgresql_readonly=True)
            if self._read_only:
                connection.exec_driver_sql(self._read_only)
            try:
                return fetch(connection.execute(statement, params), max_rows)
            finally:
                if self._writable:
                    connection.exec_driver_sql(self._writable)

    def _read_with(self, connection, statement, params, max_rows):
        """A read on a reader's connection (read-only already)."""
        with connection:
            return fetch(connection.execute(statement, params), max_rows)

    def _reader_error(self, reader, context):
        """``handle_error`` on a reader: one that cannot be reached is
        taken out, and the error made retryable, so that pyramid_retry
        runs a session's read again, on the writer."""
        error = context.sqlalchemy_exception
        # A driver's error on connecting, or a lost connection: the reader
        # is out. Anything else is the statement's, or the program's.
        if error is not None and (
            context.connection is None or context.is_disconnect
        ):
            self._down(reader, context.original_exception)
            mark_error_retryable(error)

    def _down(self, reader, exc):
        now = monotonic()
        with self._lock:
            if reader.down_until > now:
                return  # taken out already, by a read at the same time
            was_up = reader.backoff == 0
            reader.backoff = min(
                MAX_BACKOFF, max(FIRST_BACKOFF, reader.backoff * 2)
            )
            reader.down_until = now + reader.backoff
        if was_up:
            log.warning(
                'read database %s is down, its reads go to the writer: %s',
                reader.name,
                getattr(exc, 'orig', exc),
            )

    def _up(self, reader):
        if reader.backoff:
            with self._lock:
                reader.backoff = 0.0
                reader.down_until = 0.0
            log.warning('read database %s is back', reader.name)

    def reader_engine(self):
        """An engine for a session's reads: the least busy reader that is
        up, or the writer."""
        reader = self.pick(count=False)
        return self.writer if reader is None else reader.engine

    # Replica lag

    def wrote(self, tables):
        """Note a committed write: with replicas and
        ``dbtune.pin_after_write``, reads of these tables go to the writer
        for that long, so that no cache is filled from a replica that has
        not caught up."""
        if not (self.replicas and self.settings.pin_after_write):
            return
        until = monotonic() + self.settings.pin_after_write
        with self._lock:
            for table in tables:
                self._recent[table] = until

    def _recently_written(self, tables):
        if not self._recent:
            return False
        now = monotonic()
        with self._lock:
            for table, until in list(self._recent.items()):
                if until <= now:
                    del self._recent[table]
            return not self._recent.keys().isdisjoint(tables)

    # Writes

    def acquire_write_slot(self):
        """Wait for a write slot; raise :class:`WriteSlotTimeout` after
        ``dbtune.write_timeout`` seconds. Returns the seconds waited."""
        if self.write_slots.acquire(blocking=False):
            return 0.0
        start = perf_counter()
        got = self.write_slots.acquire(timeout=self.settings.write_timeout)
        waited = perf_counter() - start
        with self._lock:
            self.write_waits += 1
            self.write_wait_seconds += waited
        if not got:
            raise WriteSlotTimeout(
                self.settings.write_timeout, self.settings.write_concurrency
            )
        return waited


class UnitOfWork:
    """The writing side of a transaction: its write slot, its session, what
    it wrote, and whether the client is pinned to the writer.

    One unit serves every request that shares a transaction: a subrequest
    run in its parent's transaction reads the parent's writes and does not
    wait for the slot its parent holds.
    """

    def __init__(self, request, router, cache):
        self.request = request
        self.router = router
        self.cache = cache
        #: True from the first write until its transaction ends.
        self.dirty = False
        #: True when reads must go to the writer (pinned after a write).
        self.pinned = False
        self.write_wait = 0.0
        self._session = None
        self._tables = set()
        self._all_tables = False
        self._committed_writes = False
        if router.replicas and router.settings.pin_after_write:
            pin = request.cookies.get(PIN_COOKIE, '')
            # A client's cookie: digits of ASCII ('²' is a digit too), and
            # few enough for int().
            self.pinned = (
                pin.isascii()
                and pin.isdigit()
                and len(pin) < 20
                and int(pin) > time.time()
            )

    @classmethod
    def of(cls, request, router, cache):
        """The unit of the request's transaction, made if it has none."""
        try:
            txn = request.tm.get()
        except transaction.interfaces.NoTransaction:
            return cls(request, router, cache)
        try:
            return txn.data(router)
        except KeyError:
            unit = cls(request, router, cache)
            txn.set_data(router, unit)
            return unit

    @property
    def session(self):
        """The :class:`~pyramid_dbtune.RoutingSession` of this unit."""
        if self._session is None:
            from .session import RoutingSession

            self._session = RoutingSession(self)
            register(self._session, transaction_manager=self.request.tm)
        return self._session

    def flush(self):
        """Flush the session's pending changes, as an ORM query would,
        before a SQL method routes its call."""
        session = self._session
        if session is not None and session.autoflush:
            session.flush()

    def begin_write(self, tables, what):
        """Note a write of ``tables`` (``None``: unknown) in the current
        transaction, taking a write slot if this is its first write."""
        if not self.dirty:
            try:
                txn = self.request.tm.get()
            except transaction.interfaces.NoTransaction:
                raise RuntimeError(
                    f'{what} writes, but request.tm has no active '
                    'transaction (is pyramid_tm active for this request?)'
                ) from None
            start = perf_counter()
            try:
                self.write_wait += self.router.acquire_write_slot()
            except WriteSlotTimeout:
                self.write_wait += perf_counter() - start
                raise
            self.dirty = True  # and the slot is held until the end
            self.router.write_transactions += 1
            txn.set_data(self.router, self)
            txn.addAfterCommitHook(self._after_commit)
            txn.addAfterAbortHook(self._finish)
            self.request.add_finished_callback(self._release_at_the_end)
            self._let_go_of_the_reader()
        if tables is None:
            self._all_tables = True
        else:
            self._tables.update(tables)

    def _let_go_of_the_reader(self):
        # From the first write on, the session works on the writer. Its
        # reader connection is rolled back and returned now, so that it is
        # neither held nor committed with the writer's transaction.
        # SQLAlchemy has no public way to drop one bind of a session's
        # transaction, hence its private table of connections.
        if self._session is None:
            return
        txn = self._session.get_transaction()
        connections = getattr(txn, '_connections', None) or {}
        for reader in self.router.readers:
            entry = connections.pop(reader.engine, None)
            if entry is not None:
                connection, reading = entry[0], entry[1]
                connections.pop(connection, None)
                reading.rollback()
                connection.close()

    def execute(self, method, statement, params):
        """Run a SQL method's statement in the transaction's session."""
        if method.writes:
            self.begin_write(method.tables, f'SQL method {method.name}()')
            self.router.writes += 1
        session = self.session
        result = session.execute(
            statement, params, execution_options={'dbtune_routed': True}
        )
        if method.writes:
            self.session_wrote(session)
        return fetch(result, method.max_rows)

    def session_wrote(self, session):
        # Text DML is invisible to zope.sqlalchemy: without this the
        # transaction would be rolled back at commit time.
        mark_changed(session, transaction_manager=self.request.tm)

    def _after_commit(self, committed):
        if committed:
            tables = None if self._all_tables else self._tables
            self.cache.invalidate(tables)
            if tables is not None:
                self.router.wrote(tables)
            self._pin()
        self._finish()

    def _pin(self):
        seconds = self.router.settings.pin_after_write
        if not (self.router.replicas and seconds):
            return
        if not self._committed_writes:
            self._committed_writes = True
            self.request.add_response_callback(
                lambda request, response: response.set_cookie(
                    PIN_COOKIE,
                    str(int(time.time() + seconds)),
                    max_age=int(seconds + 0.999),
                    httponly=True,
                    samesite='Lax',
                    path='/',
                )
            )
        self.pinned = True

    def _finish(self):
        if self.dirty:
            self.dirty = False
            self.router.write_slots.release()
        self._tables = set()
        self._all_tables = False

    def _release_at_the_end(self, request):
        # A transaction left open past its request would hold its slot,
        # and every writer of the process would wait for it in vain.
        if self.dirty:
            log.error('a write transaction outlived its request; aborting')
            self.request.tm.abort()


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
        runtime = request.registry.dbtune
        self.runtime = runtime
        if runtime.router is None:
            raise RuntimeError(
                'pyramid_dbtune has no database: set dbtune.url (or '
                'sqlalchemy.url) to use request.sql or request.dbsession'
            )
        self.unit = UnitOfWork.of(request, runtime.router, runtime.cache)
        self.cache = dict.fromkeys((HIT, MISS, STALE, WAITED, 'uncached'), 0)
        self.queries = 0
        self.db_seconds = 0.0
        self.write_seconds = 0.0

    def read(self, method, params):
        """Run a read on a reader (a cache fill, or uncached)."""
        statement, params = method.bind(params)
        start = perf_counter()
        try:
            return self.runtime.router.read(
                statement,
                params,
                method.max_rows,
                method.tables,
                writer=self.unit.pinned,
            )
        except DBAPIError as exc:
            if is_read_only_refusal(exc.orig):
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
        unit = self.unit
        waited = unit.write_wait
        start = perf_counter()
        try:
            return unit.execute(method, statement, params)
        finally:
            # The wait for a write slot is not database time: it is
            # counted apart (``unit.write_wait``, Server-Timing's
            # write-slot).
            elapsed = perf_counter() - start - (unit.write_wait - waited)
            self.queries += 1
            self.db_seconds += elapsed
            self.write_seconds += elapsed


def _freeze(value):
    """A hashable stand-in for a list argument, its items' types kept."""
    if isinstance(value, list | tuple):
        return tuple([(type(v), v) for v in value])
    if isinstance(value, set | frozenset):
        return frozenset([(type(v), v) for v in value])
    return value


class BoundSQLMethod:
    """``request.sql.<name>``: a SQL method bound to one request."""

    __slots__ = ('method', 'cache_time', '_key', '_tables', '_context')

    def __init__(self, registered, context):
        self.method, self.cache_time, self._key, self._tables = registered
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
        unit = context.unit
        if unit._session is not None:
            unit.flush()
        if method.writes or unit.dirty:
            context.cache['uncached'] += 1
            return context.execute(method, params)
        if not self.cache_time or unit.pinned:
            context.cache['uncached'] += 1
            return context.read(method, params)
        values = method.values(params)
        # 1, 1.0 and True are equal, but not the same argument.
        key = (self._key, values, tuple(map(type, values)))
        try:
            hash(key)
        except TypeError:
            key = (self._key, tuple([_freeze(v) for v in values]), key[2])
            try:
                hash(key)
            except TypeError:
                # bind() refuses a value it cannot bind; a ZSQL method's
                # key holds only the values it binds, converted.
                method.bind(params)  # raises the clear ValueError
                raise  # pragma: no cover (bind() refused it)
        rows, status = context.runtime.cache.get_or_fill(
            key,
            self.cache_time,
            self._tables,
            context.read,
            method,
            params,
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
