"""The unit of work: the writing side of a request's transaction.

Routing is by unit of work, not by statement. While a request's
transaction has not written, its reads run on a reader (a replica, or the
writer's database through a pool of its own), read-only, through the cache
when the method has a ``cache_time``. Its first write takes a **write
slot** (``dbtune.write_concurrency`` per process), held until the
transaction ends, and runs in the request's session on the writer, which
joins ``request.tm`` through zope.sqlalchemy. From then on every read of
the request runs there too: it sees its own writes, and is neither served
from nor stored in the cache. After a commit the cached results of the
tables written are invalidated; an abort invalidates nothing. Where the
listener applies the app's own changes to the cached rows (PostgreSQL,
the in-process cache), the commit leaves the reads of the tables it wrote
to it, and returns once the listener has heard of it.
"""

import logging
import math
import time
from functools import partial
from time import perf_counter

import transaction.interfaces
from sqlalchemy.exc import DBAPIError
from zope.sqlalchemy import mark_changed, register

from ..sql.conditions import any_row, foreign_reach
from .connect import fetch
from .errors import WriteSlotTimeout
from .lag import NO_POSITION, read_pin, sign_pin
from .pins import PIN_COOKIE, PIN_FOR, parent_of, time_pin
from .touched import touched

log = logging.getLogger(__name__)

#: The key of a routed session's ``info`` that holds its unit of work.
UNIT = 'dbtune.unit'
#: ... and the bind it had before it was adopted.
OWN_BIND = 'dbtune.own_bind'


class UnitOfWork:
    """The writing side of a transaction: its write slot, its session, what
    it wrote, and whether the client is pinned to the writer.

    One unit serves every request that shares a transaction: a subrequest
    run in its parent's transaction reads the parent's writes and does not
    wait for the slot its parent holds.
    """

    def __init__(self, request, router, cache):
        self.request = request
        self.listener = request.registry.dbtune.listener  # its commit's
        self.router = router
        self.cache = cache
        #: True from the first write until its transaction ends.
        self.dirty = False
        #: The settings (``SET``) its session made before it wrote, on
        #: its reader: ``(statement, parameters)``. While it holds one,
        #: SQL methods run in the session, which it applies to.
        self.settings = []
        self.write_wait = 0.0
        #: True when its session came at work (:meth:`adopt`): it stays
        #: on its own connection, where its uncommitted rows are seen.
        self.stays = False
        self._session = self._reader = None
        #: The transaction it serves, once it serves one.
        self._txn = None
        self._tables, self._tags = set(), set()
        self._changes, self._unimaged = [], set()
        self._told = None
        self._all_tables = self._committed_writes = False
        #: The tables whose changes the listener applies, and the token
        #: this commit waits for (:meth:`Listener.expect`).
        self._later, self._token = frozenset(), None
        self._read_pin(request)

    def _read_pin(self, request):
        """Pin the unit as the client of ``request`` is pinned."""
        router = self.router
        #: True when reads must go to the writer (pinned after a write).
        self.pinned = False
        #: With causal reads, the log position the client's reads must see
        #: (its last commit's, from its pin).
        self.position = NO_POSITION
        # The cookie is read only where a pin can mean something: webob
        # parses every cookie of the request to find it.
        timed = router.replicas and router.settings.pin_after_write
        if router.positions or timed:
            pin = request.cookies.get(PIN_COOKIE)
            if pin is None:  # a subrequest's parent holds the client's
                parent = parent_of(request)
                pin = (
                    ''
                    if parent is None
                    else parent.cookies.get(PIN_COOKIE, '')
                )
            if router.positions:
                self.position = read_pin(pin, router.pin_key)
            if timed:
                until = time_pin(pin, router.pin_key)
                self.pinned = until is not None and until > time.time()

    @classmethod
    def of(cls, request, router, cache):
        """The unit of the request's transaction, made if it has none."""
        try:
            txn = request.tm.get()
        except transaction.interfaces.NoTransaction:
            return cls(request, router, cache)
        try:
            unit = txn.data(router)
        except KeyError:
            unit = cls(request, router, cache)
            unit._join(txn)
            return unit
        if unit.request is None:
            # Its request ended and left the transaction open (pyramid_tm
            # did not manage it): this request, maybe another client's,
            # goes on in it with its own pin.
            unit._serve_next(request)
        return unit

    def _serve_next(self, request):
        """Serve ``request``, the next in the transaction of a request
        that ended before it wrote."""
        self.request = request
        self._read_pin(request)
        if self._session is not None and (
            self.stays or not request.registry.dbtune.adopts
        ):  # a reader for its pin; or held again
            self.adopt(self._session)

    def _join(self, txn):
        """Serve transaction ``txn``: the unit its requests share."""
        txn.set_data(self.router, self)
        self._txn = txn

    def ended(self, request, last=False):
        """A finished callback of each request this unit serves: once the
        request has ended, and its transaction too, let go of it.

        ``request.dbtune`` holds the unit, and the unit the request: left
        so, they wait for the garbage collector (run twice as often). Run
        after the request's other finished callbacks, which may use it. A
        subrequest in its parent's transaction hands the unit to the
        parent: its response gets the pin, its end ends the transaction.
        A write transaction open as a request ends, that no request goes
        on in, would hold its write slot for ever: it is aborted."""
        if request.finished_callbacks and not last:
            # The others first; once, in case another callback waits so.
            request.add_finished_callback(partial(self.ended, last=True))
            return
        if request is not self.request:
            return  # a subrequest that shared it; the unit's request goes on
        # Not request.tm.get(): with an implicit manager, it would begin
        # a transaction.
        txn = self._txn
        try:
            going_on = txn is not None and txn.data(self.router) is self
        except KeyError:  # it ended: an ended transaction forgets its data
            going_on = False
        if going_on:
            parent = parent_of(request)
            if parent is not None:
                # It goes on in the transaction, and ends it. Another
                # app's request, that serves this app, is not given its
                # unit.
                if parent.registry is request.registry:
                    self.request = parent
                    self.serve(parent)
                return
            # Clean, it lets go of the request: what comes next in the
            # transaction is served by it (:meth:`of`).
            if self.dirty and not self.stays:
                log.error('a write transaction outlived its request; aborting')
                txn.abort()
        if request.registry.dbtune.adopts:
            self._let_go_of_the_session()
        self.request = None

    def serve(self, request):
        """Let go of the unit when ``request`` ends (:meth:`ended`), if
        that is not arranged already."""
        if self.ended not in request.finished_callbacks:
            request.add_finished_callback(self.ended)

    def _let_go_of_the_session(self):
        """Give the application's session back as it was before it was
        adopted: one it keeps across requests (a ``scoped_session``'s) is
        its own again once the request it was adopted for has ended."""
        session = self._session
        if session is not None and session.info.get(UNIT) is self:
            del session.info[UNIT]
            session.bind = session.info.pop(OWN_BIND)

    @property
    def session(self):
        """The session of this unit: the application's own
        ``request.dbsession`` where it has one, else a
        :class:`~pyramid_dbtune.RoutingSession`."""
        if self._session is None:
            if self.request.registry.dbtune.adopts:
                return self.request.dbsession  # adopted as it is made
            else:
                from .session import RoutingSession

                register(
                    RoutingSession(self), transaction_manager=self.request.tm
                )
        return self._session

    def adopt(self, session):
        """Route ``session`` as this unit's own: its reads run on a reader
        until the unit writes, its flushes that change rows take the write
        slot, and their tables are invalidated when the transaction
        commits. It must join ``request.tm`` (zope.sqlalchemy's
        ``register``). One given at work, in a transaction its caller
        keeps (as the starter's tests hand theirs over), :attr:`stays`:
        SQL methods run in it, and the caller ends the transaction.
        Returns the session it routes: one adopted before in its
        transaction (a subrequest's, or its parent's) stays that one."""
        held = self._session
        adopted = held is not None and held.info.get(UNIT) is self
        if adopted and held is not session:
            return held
        if session is not held and UNIT not in session.info:
            self.stays = self.stays or session.in_transaction()
        self._session = session
        # Its bind before any unit routed it (a subrequest in the same
        # transaction adopts it again).
        session.info.setdefault(OWN_BIND, session.bind)
        router = self.router
        self._reader = (
            router.read_only_writer if self.pinned
            else router.reader_engine(self.position)
        )  # fmt: skip
        session.info[UNIT] = self
        if not self.stays:
            session.bind = self._engine()
        return session

    def _engine(self):
        # The writer once its transaction has written; else, read-only,
        # the writer's database while the client is pinned, or its reader.
        if self.dirty:
            return self.router.writer
        return self.router.read_only_writer if self.pinned else self._reader

    def flush(self):
        """Flush the session's pending changes, as an ORM query would,
        before a SQL method routes its call."""
        session = self._session
        if session is not None and session.autoflush:
            session.flush()

    def begin_write(self, tables, what, tags=None, imaged=False):
        """Note a write of ``tables`` (``None``: unknown) in the current
        transaction, taking a write slot if this is its first write.
        ``tags``: the rows it touched, as :mod:`~pyramid_dbtune.sql.
        conditions` tags them (``None``: they cannot be told); ``imaged``:
        their images are told too, else the reads of ``tables`` they
        reach are dropped, not patched."""
        if not imaged:
            self._unimaged.update(tables or ())
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
            self._join(txn)
            txn.addBeforeCommitHook(self._before_commit)
            txn.addAfterCommitHook(self._after_commit)
            txn.addAfterAbortHook(self._finish)
            self._let_go_of_the_reader()
            if self._session is not None and not self.stays:
                self._session.bind = self.router.writer
        if tables is None:
            self._all_tables = True
        else:
            self._tables.update(tables)
            self._tags.update(tables)
            self._tags.update(map(any_row, tables) if tags is None else tags)

    def _let_go_of_the_reader(self):
        # From the first write on, the session works on the writer. Its
        # reader connection is rolled back and returned now, so that it is
        # neither held nor committed with the writer's transaction (one
        # lost meanwhile had nothing to keep). SQLAlchemy has no public
        # way to drop one bind of a session's transaction, hence its
        # private table of connections, which each savepoint under way has
        # one of: the innermost's first, the root's transaction last.
        session = self._session
        if session is None:
            return
        txn = session.get_nested_transaction() or session.get_transaction()
        held = {}
        while txn is not None:
            connections = getattr(txn, '_connections', None) or {}
            for engine in self.router.reading_engines():
                entry = connections.pop(engine, None)
                if entry is not None:
                    connection, reading = entry[0], entry[1]
                    connections.pop(connection, None)
                    try:
                        reading.rollback()
                    except DBAPIError:
                        connection.invalidate()
                    held[id(connection)] = connection
            txn = txn.parent
        for connection in held.values():
            connection.close()

    def execute(self, method, statement, params):
        """Run a SQL method's statement in the transaction's session."""
        if method.writes:
            self.begin_write(
                method.tables, f'SQL method {method.name}()', (), True
            )
            self.router.writes += 1
        session = self.session
        self._told = None
        if method.writes and method.tables:
            tags, self._told, change = touched(self, method, params, session)
            self._tags.update(tags)
            if change is not None:
                self._changes.append(change)
            updated = foreign_reach(statement.text)
            self.cascade(session, method.tables, updated)
        result = session.execute(
            statement, params, execution_options={'dbtune_routed': True}
        )
        if self._told is not None:
            table, found = self._told
            if result.rowcount not in (-1, found):
                # Rows committed between the SELECT and the write met its
                # WHERE too: which, is not known.
                self._tags.add(any_row(table))
        if method.writes:
            self.session_wrote(session)
        return fetch(result, method.max_rows)

    def cascade(self, session, tables, updated=None):
        """Note the writes the database makes in turn of a write that
        inserts (no columns), updates (columns ``updated``) or deletes
        (None) rows of ``tables``, by foreign keys' actions
        (:meth:`~.schema.Schema.cascades`): every read of their tables is
        dropped. The write has begun (its slot taken)."""
        children = self.router.schema.cascades(session, tables, updated)
        if children:
            self.begin_write(children, 'foreign keys')

    def count_untold(self, name, tags):
        """Count a write of ``name`` whose rows were not told, where it
        drops ``tags`` (pinned reads)."""
        if tags:
            untold = self.router.untold
            untold[name] = untold.get(name, 0) + 1

    def wrote_for(self, seconds):
        """Count ``seconds`` of an ORM flush as the request's database and
        write time, as a writing SQL method's are counted."""
        context = self.request.dbtune
        context.db_seconds += seconds
        context.write_seconds += seconds

    def session_wrote(self, session):
        # Text DML is invisible to zope.sqlalchemy: without this the
        # transaction would be rolled back at commit time.
        mark_changed(session, transaction_manager=self.request.tm)

    def _before_commit(self):
        """Where the listener applies this process's changes to the
        cached rows, leave those of the tables written to it: send, last
        in the transaction, the token it will have heard of once it has
        applied them all. Else tell it what the commit drops itself
        (:meth:`Listener.committing`)."""
        listener = self.listener
        if listener is None or self._all_tables:
            return
        self.session.flush()  # the ORM's changes before the token's
        self._later, self._token = listener.committing(
            self.session, self._tables, self._tags
        )

    def _after_commit(self, committed):
        # The slot goes back whatever happens here (the writer failing to
        # tell its position, say: transaction logs a hook's error).
        token = dropped = None
        try:
            if committed:
                try:
                    # The commit noted first: a read that misses once its
                    # rows are dropped fills from where the commit shows.
                    self._note_commit()
                finally:  # dropped, even where the writer told nothing
                    dropped = self._drop()
                token, self._token = self._token, None
        finally:
            self._finish()
        # The slot given back, wait for the listener to apply what the
        # commit left to it; not heard of in time, drop what it changed.
        listener = self.listener
        if token is not None and not listener.settle(token):
            self.cache.invalidate(*dropped)

    def _note_commit(self):
        """Pin the client, and this process's fills of the tables
        written, to the commit: by its position (causal reads), else for
        ``dbtune.pin_after_write``."""
        position = self.router.positions and self.router.position()
        if position:
            self._pin_position(position)
        else:  # no causal reads: the time pin, if any
            self.router.pins.wrote(None if self._all_tables else self._tables)
            self._pin()

    def _drop(self):
        """Drop the cached rows the commit changed; return the tags and
        changes dropped by row, or None."""
        if self._all_tables:
            self.cache.invalidate(None)
            return None
        changes = [c for c in self._changes if c.table not in self._unimaged]
        self.cache.invalidate(self._tags, changes, self._later)
        return self._tags, changes

    def _pin_position(self, position):
        """Causal reads: the client's reads from now on must see
        ``position``, where this commit ended (a signed cookie); so must
        this process's fills of the tables written."""
        tables = None if self._all_tables else self._tables
        self.router.pins.wrote(tables, position)
        # A transaction commits once: one cookie.
        self._set_pin(lambda: sign_pin(self.position, self.router.pin_key))
        self.position |= position

    def _pin(self):
        seconds = self.router.settings.pin_after_write
        if not (self.router.replicas and seconds):
            return
        if not self._committed_writes:
            self._committed_writes = True
            # Until the end of its last second, not the start: a pin of
            # 0.5 s is no pin else, half the time.
            key = self.router.pin_key
            self._set_pin(
                lambda: sign_pin(math.ceil(time.time() + seconds), key),
                math.ceil(seconds),
            )
        self.pinned = True

    def _set_pin(self, value, seconds=PIN_FOR):
        """Give the client the pin ``value()``, taken as the response is
        made, for ``seconds``; none once its requests have ended (a
        transaction its caller ends, :attr:`stays`)."""
        if self.request is None:
            return
        self.request.add_response_callback(
            lambda request, response: response.set_cookie(
                PIN_COOKIE,
                value(),
                max_age=seconds,
                httponly=True,
                samesite='Lax',
                path='/',
            )
        )

    def _finish(self):
        if self.dirty:
            self.dirty = False
            self.router.write_slots.release()
            if self._session is not None and not self.stays:
                # Its reads from now on must see the commit: a reader
                # that has replayed it, or the writer.
                self._reader = self.router.reader_engine(self.position)
                self._session.bind = self._engine()
        self._tables = set()
        self._tags = set()
        self._changes = []
        self._unimaged = set()
        self._all_tables = False
        self._later = frozenset()
        self.settings = []
        if self._token is not None:  # sent, but not committed
            self.listener.forget(self._token)
            self._token = None
