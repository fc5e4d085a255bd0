"""Writes made anywhere: the database tells every process what changed.

``dbtune triggers`` installs triggers on the tables that cached SQL
methods read. Each committed change then reaches a thread of every
process (``dbtune.cache.listen``), which drops the cached reads it could
have changed, by row where the reads are pinned:

- PostgreSQL: statement triggers send a ``NOTIFY`` at commit, with the
  watched columns of the rows changed, old and new, and the id of their
  transaction; the thread ``LISTEN`` s on a connection of its own. The
  in-process cache applies the change to the rows it holds that were read
  before it (:mod:`~pyramid_dbtune.sql.shapes`).
- MySQL and MariaDB, which have no ``NOTIFY``: row triggers add a row to
  the table ``dbtune_changes``, in the write's transaction; the thread
  reads what is new every ``dbtune.cache.listen_every`` seconds. The
  ids are taken as changes are made, not as they commit: an id missing
  below one read is asked for again at each read, until its row is
  there, or is neither there nor locked by a transaction (it was rolled
  back).

Having lost its connection, the thread drops every cached result once it
is back: what changed meanwhile is not known. So does a process's first,
but with a cache that processes share where another listens already
(:mod:`.shared`).

On PostgreSQL with the in-process cache, the app's own commits are
applied by the thread too, as anyone's are: the commit leaves the rows it
changed to it, and waits until the thread has heard of it (see
:meth:`Listener.expect`).

With replicas, before the thread applies what it heard, it pins the
process's cache fills of the tables changed, as a commit of the process
does (:class:`~pyramid_dbtune.routing.pins.TablePins`): a read it drops
is not filled again from a replica that has not replayed the change.
"""

import json
import logging
import os
import threading
import time
import uuid

import sqlalchemy as sa

from ..deploy import forks
from ..routing.connect import ANSWER_WITHIN, listener_engine
from ..routing.lag import position_of
from ..routing.stored import untold_tables
from ..sql.shapes import Change
from . import shared
from .changelog import ChangeLog, forget_old, mark
from .triggers import (
    CHANNEL,
    MY_ORIGIN,
    ORIGIN,
    PROBE,
    misnamed,
    read_notice,
    schemas_of,
    tables_to_watch,
    tags_of,
    watched,
)

log = logging.getLogger(__name__)

#: Seconds between attempts to connect again, at the most.
MAX_BACKOFF = 2.0
#: Seconds between two checks that the listener's connection still works:
#: one cut unsaid is given up within two (:data:`.connect.ANSWER_WITHIN`).
CHECK_EVERY = ANSWER_WITHIN / 2
#: MySQL: seconds a transaction may have been open, holding a change, when
#: a listener connects, for the listener to wait for it.
OPEN_FOR = 60
#: Seconds a commit of the app waits for the listener to apply it, at the
#: most; then it drops what it changed itself.
SETTLE_WITHIN = 0.5
#: PostgreSQL: notices read ahead, at the most, to apply together.
READ_AHEAD = 1000


# Listening


class Listener:
    """The thread of a process that hears of committed changes and drops
    what they could have changed from ``dbtune.cache``."""

    def __init__(self, dbtune):
        self.dbtune = dbtune
        settings = dbtune.settings
        self.engine = listener_engine(settings)
        self.every = settings.cache_listen_every
        self.dialect = self.engine.dialect.name
        sa.event.listen(dbtune.router.writer, 'connect', self._mark)
        #: Notices applied; of them, the app's own writes (passed over
        #: where their commit dropped what they changed); connections
        #: made, connections lost or not made; times every cached result
        #: was dropped; commits of the app not heard of in time.
        self.notices = self.own = 0
        self.connects = self.failures = self.drops = self.late = 0
        #: The tables that have the package's triggers, as last connected;
        #: of them, those whose rows are not told by value, and those not
        #: by tag (:func:`~pyramid_dbtune.routing.stored.untold_tables`).
        self.triggered = self.inexact = self.untagged = frozenset()
        self._expected = {}
        self._expected_lock = threading.Lock()
        #: MySQL: what was read of the changes (a :class:`ChangeLog`).
        self.changes = None
        #: Set while the thread is connected and listening.
        self.listening = threading.Event()
        self._stopping = threading.Event()
        self._thread = None
        self._running = False
        self._check_at = 0.0
        self._shared_origin = shared.origin(settings)
        forks.renew_after_fork(self)

    def start(self):
        self._running = True
        self._thread = threading.Thread(
            target=self._run, name='pyramid_dbtune listener', daemon=True
        )
        self._thread.start()
        return self

    def before_fork(self, timeout=5):
        """In a process about to fork the ones that serve (a gunicorn
        master, before it starts its workers): stop this process's
        thread, so that none of its locks is held as they fork. Each
        child starts a thread of its own; this process hears nothing
        more (it serves nothing), and its cache, which children forked
        later (a worker in place of one that ended) inherit, is dropped:
        nothing keeps it fresh from now on (but a cache other processes
        share: they keep it fresh)."""
        self._stopping.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning(
                'pyramid_dbtune: the listener did not stop within %s s '
                'before the fork (still connecting?); each child listens '
                'on an engine of its own all the same',
                timeout,
            )
        self.listening.clear()
        if self.dbtune.settings.cache_backend != 'memcached':
            self.dbtune.cache.invalidate(None)

    def after_fork(self):
        """The parent's thread did not come along: one starts here
        (:meth:`start_after_fork`). No commit of this process waits for
        it yet; a lock held in the parent as it forked would stay held
        here."""
        self.listening = threading.Event()
        self._stopping = threading.Event()
        self._expected = {}
        self._expected_lock = threading.Lock()
        # An engine of its own: the parent's thread may have been in its
        # engine's first connect as it forked (a gunicorn master's, as it
        # starts its workers), and SQLAlchemy holds a lock of the engine's
        # through it, which would stay held here: no connection of this
        # process would ever be made, and nothing heard.
        self.engine = listener_engine(self.dbtune.settings)
        # Its first connection is this process's: not one "again" (the
        # parent's count would say so, and drop a shared cache).
        self.connects = 0

    def start_after_fork(self):
        """Listen in the child, as the parent did, once the cache and the
        rest of the process are renewed."""
        if self._running:
            self.start()

    def stop(self, timeout=5):
        self._running = False
        self._stopping.set()
        self._thread.join(timeout)
        self.engine.dispose()

    def _run(self):
        backoff, said = 0.05, False
        while not self._stopping.is_set():
            try:
                with self.engine.connect() as connection:
                    listen = (
                        self._notices
                        if self.dialect == 'postgresql'
                        else self._changes
                    )
                    listen(connection)
            except Exception as exc:
                self.failures += 1
                if self.listening.is_set() or not said:
                    log.warning(
                        'pyramid_dbtune: does not hear of changes (%s: %s); '
                        'connecting again until it does',
                        exc.__class__.__name__,
                        exc,
                    )
                said = True
                self.listening.clear()
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
            else:
                backoff, said = 0.05, False

    def _connected(self, connection):
        """Once listening: what changed while it was not is not known,
        so every result cached before is dropped; but at its first
        connection, with a cache other processes share, not if one of
        them listens (:func:`.shared.ask`): it heard. Either way, with
        replicas, this process's fills of every table are pinned past the
        writer's position now: it did not hear what changed before."""
        self._pin(connection, None)
        asked = not self.connects and self._shared_origin is not None
        cache, stopping = self.dbtune.cache, self._stopping
        if asked and shared.ask(connection, cache, self.every, stopping):
            pass  # another process listens: it heard
        elif stopping.is_set():
            return  # asked in vain: neither drops nor listens
        else:
            cache.invalidate(None)
            self.drops += 1
            if self.connects or asked:
                why = ('no other process listens' if asked
                       else 'hears of changes again')  # fmt: skip
                log.warning('pyramid_dbtune: %s; every cached result was '
                            'dropped', why)  # fmt: skip
        # A table a method names otherwise may not be the one watched.
        unsure = misnamed(self.dbtune, connection)
        self.triggered = frozenset(watched(connection)) - unsure.keys()
        dbtune = self.dbtune
        self.inexact, self.untagged = untold_tables(
            connection, self.triggered, dbtune.compared, dbtune.pinned
        )
        self.schemas = schemas_of(connection)
        for table, why in unsure.items():
            log.warning(
                'pyramid_dbtune: changes made outside the application to '
                '%s cannot be heard of: %s', table, why,
            )  # fmt: skip
        missing = set(tables_to_watch(self.dbtune)) - self.triggered
        missing = sorted(missing - unsure.keys())
        if missing:
            log.warning(
                'pyramid_dbtune: no triggers tell of changes to %s: run '
                '"dbtune triggers" with the application\'s ini file',
                ', '.join(missing),
            )
        self.connects += 1
        self.listening.set()

    @property
    def origin(self):
        """What the app's writes are marked with: changes whose commit
        dropped what they changed from this cache. With memcached, any
        process's that shares it; else this process's. (MySQL: and the
        connection's, after a space.)"""
        if self._shared_origin is not None:
            return self._shared_origin
        return f'process {os.getpid()} {id(self.dbtune.cache)}'

    def _mark(self, dbapi_connection, record):
        """Mark a new connection of the app's writer with :attr:`origin`
        (the triggers send it with each change)."""
        cursor = dbapi_connection.cursor()
        if self.dialect == 'postgresql':
            cursor.execute(
                'SELECT set_config(%s, %s, false)', (ORIGIN, self.origin)
            )
        else:  # and the connection's, that its commits' marks name
            own = f'{self.origin} {uuid.uuid4().hex[:12]}'
            cursor.execute(f'SET @{MY_ORIGIN} = %s', (own,))
        cursor.close()
        dbapi_connection.commit()

    @property
    def applies_own(self):
        """Whether the app's own changes are applied as they are heard,
        rather than dropped at their commit: where the in-process cache
        holds reads with a shape, and fills tell their snapshots
        (PostgreSQL)."""
        return self.dbtune.router.snapshots

    def applies(self, tables):
        """Which of ``tables``, written by this process, this listener
        applies the changes of: those with triggers, while it listens,
        where it applies the app's own changes (:attr:`applies_own`)."""
        if not (self.applies_own and self.listening.is_set()):
            return frozenset()
        return self.triggered.intersection(tables)

    def committing(self, session, tables, tags):
        """Before a commit of the app, in ``session``, that wrote
        ``tables`` and drops ``tags``: ``(later, token)``, the tables whose
        changes this listener applies (:meth:`applies`) and the token the
        commit waits for (:meth:`settle`), None where it waits for none.
        On MySQL, mark the tags it drops itself: a change of other rows (a
        trigger's of the user's) is applied as anyone's."""
        routed = {'dbtune_routed': True}
        later = self.applies(tables)
        if later:  # PostgreSQL
            token = self.expect()
            session.execute(
                sa.text('SELECT pg_notify(:channel, :message)'),
                {'channel': CHANNEL, 'message': json.dumps({'s': token})},
                execution_options=routed,
            )
            return later, token
        if self.dialect != 'postgresql' and self.triggered & set(tables):
            mark(session, tags)
        return later, None

    def expect(self):
        """A token for a commit of the app to send before it commits (a
        notice after its changes', :data:`~.triggers.CHANNEL`); wait for
        it to be heard with :meth:`settle`."""
        token = uuid.uuid4().hex
        with self._expected_lock:
            self._expected[token] = threading.Event()
        return token

    def settle(self, token):
        """Wait for ``token`` (:meth:`expect`): true once this listener
        has applied what came before it, false if it was not heard of
        within :data:`SETTLE_WITHIN` seconds."""
        with self._expected_lock:
            heard = self._expected[token]
        settled = heard.wait(SETTLE_WITHIN)
        self.forget(token)
        if not settled:
            self.late += 1
        return settled

    def forget(self, token):
        """Wait no more for ``token``: its commit did not happen."""
        with self._expected_lock:
            self._expected.pop(token, None)

    def _heard(self, token):
        with self._expected_lock:
            heard = self._expected.get(token)
        if heard is not None:
            heard.set()

    def apply(self, table, told, origin=None, xid=None):
        """Drop (or patch) what a change of ``table`` could have changed. A
        change from ``origin``, this listener's :attr:`origin`, that its commit
        dropped is passed over; where the cache :attr:`applies_own`, it is
        applied, and one that does not tell its transaction (``xid``) drops
        what it could have changed. ``told``: ``{"old": [...], "new": [...]}``,
        the images of the rows changed, or None where they are not told. A
        process that asks whether this one listens (:data:`.triggers.PROBE`,
        ``told`` its token) is answered, once it does."""
        self.apply_all([(table, told, origin, xid)])

    def apply_all(self, changes):
        """:meth:`apply` each of ``changes``, its arguments, in order; but
        with a cache that processes share, the tags they drop are bumped
        once, after the last, and the questions answered then. A burst of
        writes made outside (a job that updates a row per statement)
        costs memcached a bump per tag, not per change: the listener
        keeps up, and a process that starts meanwhile is answered."""
        cache, bumped, count = self.dbtune.cache, set(), 0
        questions = [told for table, told, *_ in changes if table == PROBE]
        for table, told, *more in changes:
            dropped = table != PROBE and self._dropped(table, told, *more)
            if not dropped:
                continue
            if self._shared_origin is None:
                cache.invalidate(*dropped)
                self.notices += 1
            else:  # it patches no rows: the rows' tags alone
                bumped |= dropped[0]
                count += 1
        if count:
            cache.invalidate(bumped)
            self.notices += count
        if self.listening.is_set() and self._shared_origin is not None:
            for token in questions:
                shared.answer(cache, token)

    def _dropped(self, table, told, origin=None, xid=None):
        """What :meth:`apply` drops of the change: ``(tags, changes)``,
        None if nothing."""
        if origin is not None and origin == self.origin:
            self.own += 1
            # Its commit dropped what it could have changed; but with
            # replicas and a cache processes share, this one may have
            # filled it since, not having heard, from a replica behind:
            # dropped again where its fills are pinned now (:meth:`_pin`).
            router = self.dbtune.router
            pinned = router.replicas and (
                router.positions or router.pins.seconds
            )
            if not (self.applies_own or pinned and self._shared_origin):
                return None
            # Its commit left the reads with a shape to this listener: a
            # change that tells no transaction (more rows than a notice
            # tells, too big, a truncate) drops them, as any untold does.
        changes = ()  # told as a list: by a trigger made before images
        if isinstance(told, dict) and table in self.dbtune.watched:
            old, new = tuple(told.get('old', ())), tuple(told.get('new', ()))
            if table not in self.inexact:
                changes = [Change(table, old, new, xid)]
        rows = None if table in self.untagged else told
        return tags_of(table, rows, self.dbtune.pinned), changes

    def _notices(self, connection):
        connection.exec_driver_sql(f'LISTEN {CHANNEL}')
        driver = connection.connection.driver_connection
        self._connected(connection)
        while not self._stopping.is_set():
            # What came, once it came (the generator holds the connection's
            # lock till it ends), then what came since, up to READ_AHEAD.
            notices = list(driver.notifies(timeout=self.every, stop_after=1))
            while 0 < len(notices) < READ_AHEAD:
                room = READ_AHEAD - len(notices)
                more = list(driver.notifies(timeout=0, stop_after=room))
                if not more:
                    break
                notices += more
            told = [read_notice(n.payload, self.schemas) for n in notices]
            told = [read for read in told if read is not None]
            self._pin(connection, [c[1] for c in told if c[0] is None])
            self.apply_all([c[1:] for c in told if c[0] is None])
            for token in [c[0] for c in told if c[0] is not None]:
                self._heard(token)  # an app's commit: all before it applied
            self._check(connection)

    def _changes(self, connection):
        connection.exec_driver_sql(
            'SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED'
        )
        # What is there of the last minute counts as read (it was, or the
        # cache is dropped now); the ids it skips may be open still.
        (floor,) = connection.exec_driver_sql(
            f'SELECT COALESCE(MAX(id), 0) FROM {CHANNEL} WHERE at < NOW(6) '
            f'- INTERVAL {OPEN_FOR} SECOND'
        ).one()
        changes = self.changes = ChangeLog(floor, self)
        changes.read(connection, None)
        self._connected(connection)
        told = []  # each read's changes, pinned before they are applied
        while not self._stopping.wait(self.every):
            told.clear()
            changes.read(connection, lambda *change: told.append(change))
            self._pin(connection, [change[0] for change in told])
            self.apply_all(told)
            if self._check(connection):
                forget_old(connection, changes.floor)

    def _pin(self, connection, tables):
        """Before the changes of ``tables`` (None: any) are applied: with
        replicas, this process's fills of them come from one that has
        replayed them, or from the writer, as after a write of its own
        (:class:`~pyramid_dbtune.routing.pins.TablePins`). With causal
        reads, they are past the writer's position now; else they are
        pinned by time (``dbtune.pin_after_write``)."""
        router = self.dbtune.router
        tables = None if tables is None else set(tables) - {PROBE}
        if router.replicas and (tables is None or tables):
            position = router.positions and position_of(connection)
            router.pins.heard(tables, position or None)

    def _check(self, connection):
        """Every :data:`CHECK_EVERY` seconds, ask the database something:
        a connection whose server went away unsaid (a host gone, a
        network cut) then fails, within
        :func:`~pyramid_dbtune.routing.connect.listener_engine`'s bounds,
        and is made again. True when it asked."""
        now = time.monotonic()
        if now < self._check_at:
            return False
        self._check_at = now + CHECK_EVERY
        connection.exec_driver_sql('SELECT 1')
        return True


#: False while a command that works on the database loads the app
#: (``dbtune triggers``): its listener would hear nothing, and say so.
STARTS = True


def start(dbtune):
    """Start the listener of ``dbtune`` (``dbtune.cache.listen``), unless
    it has one (a Zope process's operator's views find it listening
    already) or :data:`STARTS` is false."""
    if dbtune.listener is None and STARTS:
        dbtune.listener = Listener(dbtune).start()
