"""The engines: the writer, the readers with their failover, and the
write slots that let writes through one at a time (or a few).

Every transaction on a reader is read-only, and so is every read the
writer serves for a reader that is down.
"""

import functools
import hashlib
import itertools
import logging
import threading
from time import monotonic, perf_counter

from pyramid_retry import mark_error_retryable
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from ..deploy import forks
from ..sql.shapes import parse_snapshot
from .connect import (
    READ_ONLY_STATEMENTS,
    fetch,
    make_engine,
    make_read_only,
    unbounded,
)
from .errors import WriteSlotTimeout, is_timeout
from .lag import LOOK, NO_POSITION, LagWatch, position_of
from .pins import TablePins
from .schema import Schema

log = logging.getLogger(__name__)


def pin_key(settings):
    """The key causal pins are signed with: ``dbtune.pin_secret``, else
    one drawn from the writer's URL as the settings give it, password and
    all: every process of the site has it, and no client."""
    secret = settings.pin_secret or f'pyramid_dbtune pins {settings.url}'
    return hashlib.sha256(secret.encode()).digest()


#: A reader that failed is left alone this long, doubling to the maximum.
FIRST_BACKOFF = 1.0
MAX_BACKOFF = 60.0


class ReadEngine:
    """One read engine, its load, and whether it is taken out."""

    def __init__(self, engine):
        self.engine = engine
        self.name = engine.url.render_as_string(hide_password=True)
        self.in_flight = 0
        #: Reads sent to this reader.
        self.reads = 0
        self.down_until = 0.0
        self.backoff = 0.0
        #: Seconds behind the writer, with ``dbtune.max_replica_lag``
        #: (None: not known).
        self.lag = None
        #: With causal reads, the log position it has replayed (None: not
        #: known).
        self.position = None
        #: Whether the last look failed to read one of them (said once).
        self.unread = False


class Router:
    """The engines: one writer, one or more readers; the write slots.

    ``failovers`` counts the reads that went to the writer because their
    reader was down or behind (not those that wait for a replay of their
    causal pin); ``write_waits`` and ``write_wait_seconds`` count the
    writes that had to wait for a slot, and how long they waited.
    ``writer_reads`` counts the reads run on the writer outside a write
    transaction, ``write_transactions`` the transactions that took a
    write slot, and ``writes`` the writing SQL method calls (each
    reader counts its ``reads``).
    """

    def __init__(self, settings):
        self.settings = settings
        timeouts = (settings.connect_timeout, settings.statement_timeout)
        # A connection the writer's pool kept may have died with the
        # server (a restart): it is tried as it is taken, and replaced, so
        # that the first write after a restart is made, not a 500. A
        # round trip for each write transaction; a read whose connection
        # was lost runs again instead, which costs the hit path nothing.
        self.writer = make_engine(settings.url, *timeouts, pool_pre_ping=True)
        # Cache keys name the database read, never its password; replicas
        # hold the writer's data, so the writer names them all.
        self.key = make_url(settings.url).render_as_string(hide_password=True)
        urls = settings.read_urls or (settings.url,)
        self.readers = [
            ReadEngine(
                make_engine(url, *timeouts, pool_size=settings.read_pool_size)
            )
            for url in urls
        ]
        for reader in self.readers:
            make_read_only(reader.engine)
            event.listen(
                reader.engine,
                'handle_error',
                functools.partial(self._reader_error, reader),
            )
            # A statement answered: it is up again, whatever read it
            # (request.dbsession's never pass read()); the lag watch's
            # looks do not count.
            event.listen(
                reader.engine,
                'after_cursor_execute',
                functools.partial(self._answered, reader),
            )
        self._turn = itertools.count()
        self.replicas = settings.read_urls is not None
        #: The writer's database for a session's reads that no reader
        #: serves (a pinned client's, or all readers down): read-only as
        #: a reader is, until the session writes.
        self.read_only_writer = self.readers[0].engine
        if self.replicas:
            self.read_only_writer = make_engine(
                settings.url, *timeouts, pool_size=settings.read_pool_size,
                pool_pre_ping=True,
            )  # fmt: skip
            make_read_only(self.read_only_writer)
            event.listen(
                self.read_only_writer,
                'after_cursor_execute',
                self._read_on_writer_read_only,
            )
        #: Statements the sessions ran on :attr:`read_only_writer`, with
        #: replicas.
        self.read_only_writer_reads = 0
        self.dialect = self.writer.dialect.name
        self._read_only, self._writable = READ_ONLY_STATEMENTS.get(
            self.dialect, (None, None)
        )
        self.failovers = 0
        self.writer_reads = 0
        self.write_transactions = 0
        self.writes = 0
        #: SQL method name (``ORM <table>`` for a flush): its writes whose
        #: rows could not be told, which dropped every read of a table
        self.untold = {}
        self.write_waits = 0
        self.write_wait_seconds = 0.0
        #: Reads sent to the writer because every reader up was further
        #: behind than ``dbtune.max_replica_lag`` (failovers count them
        #: too).
        self.behind = 0
        #: Causal reads: pins and fills by the writer's log position, where
        #: the database tells one (PostgreSQL; MariaDB's GTIDs, whose URL
        #: may name either dialect).
        self.positions = (
            self.replicas
            and settings.causal_reads
            and self.dialect in ('postgresql', 'mysql', 'mariadb')
        )
        #: PostgreSQL: cache fills tell the snapshot they read in (set
        #: where the cache applies changes to the rows it holds).
        self.snapshots = False
        #: What pins are signed with.
        self.pin_key = pin_key(settings)
        unsigned = make_url(settings.url).password is None
        if self.replicas and not settings.pin_secret and unsigned:
            log.warning(
                'pyramid_dbtune: dbtune.pin_secret is not set, and the '
                'database URL has no password to sign pins with: whoever '
                'knows the URL can make a pin cookie, and send their reads '
                'to the writer; set dbtune.pin_secret'
            )
        for url in sorted({settings.url, *urls}):
            if missing := unbounded(url, *timeouts):
                log.warning(
                    'pyramid_dbtune: the driver of %s is not given %s; a '
                    'server that hangs holds a request until it answers: '
                    "set the driver's own bound in the URL",
                    make_url(url).render_as_string(hide_password=True),
                    ' and '.join(missing),
                )
        self.lag_watch = (
            LagWatch(self.readers, self.positions)
            if self.replicas and (settings.max_replica_lag or self.positions)
            else None
        )
        #: The tables this process's commits wrote, and those its listener
        #: heard were changed (:class:`~.pins.TablePins`).
        self.pins = TablePins(settings.pin_after_write if self.replicas else 0)
        #: What the writer's catalog tells of the tables written.
        self.schema = Schema(self.dialect)
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
        return list(dict.fromkeys([self.writer, *self.reading_engines()]))

    def reading_engines(self):
        """The engines a session may read on before it writes."""
        return [*(r.engine for r in self.readers), self.read_only_writer]

    def dispose(self):
        if self.lag_watch is not None:
            self.lag_watch.stop()
        for engine in self.engines():
            engine.dispose()

    # Reads

    def pick(self, count=True, position=NO_POSITION):
        """The reader with the fewest reads in flight, or None if all are
        down, or further behind than ``dbtune.max_replica_lag`` (then the
        writer serves); ``count``: one more in flight. ``position``: a
        log position the reader must have replayed (causal reads)."""
        now = monotonic()
        bound = self.settings.max_replica_lag or float('inf')
        with self._lock:
            up = [r for r in self.readers if r.down_until <= now]
            near = [r for r in up if r.lag is None or r.lag <= bound]
            # A causal read passed over is asked again (_replayed_now),
            # which counts it: once, and not when a replay is all it waits.
            if up and not near and not position:
                self.behind += count
            up = [
                r
                for r in near
                if not position
                or (r.position is not None and r.position.covers(position))
            ]
            if not up:
                return None
            # Ties go round: the rotation starts each pick elsewhere.
            turn = next(self._turn) % len(up)
            reader = min(up[turn:] + up[:turn], key=lambda r: r.in_flight)
            reader.in_flight += count
            reader.reads += count
            return reader

    def read(
        self,
        statement,
        params,
        max_rows,
        tables=(),
        writer=False,
        position=NO_POSITION,
        fill=False,
    ):
        """Run a read, read-only, on a reader; on the writer when ``writer``
        is true, when ``tables`` are pinned by time (:attr:`pins`), or
        when no reader is up. With causal reads, on a reader that has
        replayed ``position``, and for a cache ``fill`` the pins of
        ``tables``: the last commit of this process that wrote them, and
        the last change of them its listener heard of (the cache is
        everyone's)."""
        if not writer and self.pins.by_time(tables, fill):
            writer = True
        if fill:
            position |= self.pins.position(tables)
        reader = None if writer else self.pick(position=position)
        replaying = False
        if reader is None and position and not writer:
            reader, replaying = self._replayed_now(position)
        if reader is None:
            if not writer and not replaying:
                self.failovers += 1
            return self._read_on(
                self.writer, statement, params, max_rows, fill
            )
        # With causal reads, the rows are stamped with where the reader
        # was, at least, before they were read.
        read_at = (reader.position or NO_POSITION) if self.positions else None
        connection = None
        try:
            try:
                connection = reader.engine.connect()
            except DBAPIError as exc:
                failed = exc  # refused, unreachable, out of connections
            else:
                try:
                    rows = self._read_with(
                        connection, statement, params, max_rows, read_at, fill
                    )
                except DBAPIError as exc:
                    if not _lost(exc):
                        raise  # the statement's fault, not the reader's
                    failed = exc  # the reader went away mid-read
                else:
                    self._up(reader)
                    return rows
        finally:
            with self._lock:
                reader.in_flight -= 1
        self._down(reader, failed, lost=connection is not None)
        self.failovers += 1
        return self._read_on(self.writer, statement, params, max_rows, fill)

    def _replayed_now(self, position):
        """The least busy reader up and near, if it has replayed
        ``position`` by now (asked: it had not when last seen), else None;
        and whether one up and near is still replaying (the writer serves
        the read then, which is no failover). One short query on a
        replica, for a read that the writer would serve else."""
        reader = self.pick()
        if reader is None:
            return None, False
        replayed = self._asked(reader, position)
        if not replayed:
            with self._lock:
                reader.in_flight -= 1
                reader.reads -= 1
            return None, replayed is False
        return reader, False

    def _asked(self, reader, position):
        """Whether ``reader`` has replayed ``position``, asked now; None
        if it could not be asked."""
        try:
            with reader.engine.connect() as connection:
                seen = position_of(connection) or NO_POSITION
        except DBAPIError:
            return None  # a read's own failover rules will tell
        with self._lock:
            reader.position = seen | (reader.position or NO_POSITION)
        return seen.covers(position)

    def _read_on(self, engine, statement, params, max_rows, fill=False):
        """A read on the writer, made read-only for the read alone. The
        writer's pool tries a connection as it is taken (``pool_pre_ping``):
        one the database's restart cut is replaced, not failed on."""
        self.writer_reads += 1
        with engine.connect() as connection:
            # A fill is stamped as a replica's is, with where the writer
            # was before the read: a client whose pin is later (a commit
            # since, in another process) is not served it.
            read_at = None
            if fill and self.positions:
                read_at = position_of(connection) or NO_POSITION
                connection.commit()  # the read's transaction is its own
            if self.dialect == 'postgresql':
                connection.execution_options(postgresql_readonly=True)
            if self._read_only:
                connection.exec_driver_sql(self._read_only)
            try:
                snapshot = self._snapshot(connection, fill)
                return fetch(
                    connection.execute(statement, params), max_rows,
                    read_at, snapshot,
                )  # fmt: skip
            finally:
                if self._writable:
                    connection.exec_driver_sql(self._writable)

    def _read_with(
        self, connection, statement, params, max_rows, read_at, fill=False
    ):
        """A read on a reader's connection (read-only already)."""
        with connection:
            snapshot = self._snapshot(connection, fill)
            return fetch(
                connection.execute(statement, params), max_rows, read_at,
                snapshot,
            )  # fmt: skip

    def _snapshot(self, connection, fill):
        """For a cache fill, where changes are applied to cached rows
        (:attr:`snapshots`): the snapshot the read will see, fixed for its
        transaction (REPEATABLE READ), so that a change is applied to its
        rows exactly when they do not hold it already."""
        if not (fill and self.snapshots):
            return None
        connection.execution_options(isolation_level='REPEATABLE READ')
        text = connection.exec_driver_sql(
            'SELECT pg_current_snapshot()::text'
        ).scalar()
        return parse_snapshot(text)

    def _reader_error(self, reader, context):
        """``handle_error`` on a reader: one that cannot be reached is
        taken out, and the error made retryable, so that pyramid_retry
        runs a session's read again, on another reader or the writer's
        database (:attr:`read_only_writer`)."""
        error = context.sqlalchemy_exception
        # A driver's error on connecting, or a lost connection: the reader
        # is out. Anything else is the statement's, or the program's.
        if error is not None and (
            context.connection is None
            or (context.is_disconnect and not is_timeout(error.orig))
        ):
            lost = context.connection is not None
            self._down(reader, context.original_exception, lost)
            mark_error_retryable(error)

    def _down(self, reader, exc, lost=False):
        """Take ``reader`` out; ``lost``: a connection it had answered on
        was lost (else it refused one, or did not answer)."""
        now = monotonic()
        with self._lock:
            if reader.down_until > now:
                return  # taken out already, by a read at the same time
            was_up = reader.backoff == 0
            reader.backoff = min(
                MAX_BACKOFF, max(FIRST_BACKOFF, reader.backoff * 2)
            )
            reader.down_until = now + reader.backoff
        if was_up and self.replicas:
            log.warning(
                'read database %s is down, its reads go to the writer: %s',
                reader.name,
                getattr(exc, 'orig', exc),
            )
        elif was_up:
            # No replica: the read pool is the writer's database, which
            # a read on the writer will find down too, unless it is up
            # and only the connection was lost (a restart).
            log.warning(
                'a read lost its connection to the database %s: %s'
                if lost
                else 'the database %s did not answer a read: %s',
                reader.name,
                getattr(exc, 'orig', exc),
            )

    def _read_on_writer_read_only(self, *_):
        self.read_only_writer_reads += 1

    def _answered(self, reader, connection, *_):
        if reader.backoff and not connection.get_execution_options().get(LOOK):
            self._up(reader)

    def _up(self, reader):
        if reader.backoff:
            with self._lock:
                reader.backoff = 0.0
                reader.down_until = 0.0
            log.warning('read database %s is back', reader.name)

    def reader_engine(self, position=NO_POSITION):
        """An engine for a session's reads: the least busy reader that is
        up (and has replayed ``position``), or :attr:`read_only_writer`."""
        reader = self.pick(count=False, position=position)
        return self.read_only_writer if reader is None else reader.engine

    # Replica lag

    def position(self):
        """The writer's log position now (causal reads): None where it
        tells none (MySQL, which has no MariaDB GTIDs)."""
        with self.writer.connect() as connection:
            return position_of(connection)

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


def _lost(exc):
    """Whether a read's connection was lost, rather than given up on by
    the driver's time limit (which is the statement's, as PostgreSQL's
    own limit is)."""
    return exc.connection_invalidated and not is_timeout(exc.orig)
