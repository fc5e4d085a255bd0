"""Pins to what was written. A client's, a cookie: until a time (the
writer's, for ``dbtune.pin_after_write``), or a log position (causal
reads); both signed. A process's, :class:`TablePins`: the tables its
commits wrote, which no cache is filled with from a replica that has
not replayed the write."""

import threading
from time import monotonic

from pyramid import threadlocal

from ..convert import whole_number
from ..deploy import forks
from ..sql.analysis import ANY_TABLE
from .lag import NO_POSITION, signed

#: The name of the cookie that pins a client to the writer after a write.
PIN_COOKIE = 'dbtune_pin'

#: Seconds a causal pin is kept by the client: replicas replay long before.
PIN_FOR = 3600


def parent_of(request):
    """The request under ``request`` that goes on in its transaction, if
    any: a subrequest's parent, the nearest request below it on Pyramid's
    stack of current requests (Pyramid pushes each request it invokes
    there) whose transaction manager is its own. Pyramid has no public
    way to look below the top of that stack (``get_current_request``),
    hence its ``manager.stack``."""
    tm = request.tm
    for pushed in reversed(threadlocal.manager.stack):
        below = pushed.get('request')
        if below is not request and getattr(below, 'tm', None) is tm:
            return below
    return None


def time_pin(value, key):
    """The time until which a time pin's cookie ``value`` pins its
    client, or None: for no pin, or one not signed with ``key`` (else a
    client could send every read of its own to the writer)."""
    return signed(value, key, whole_number)


class TablePins:
    """The tables a process's commits wrote (and those its listener heard
    were changed), and where their reads go, so that no cache is filled
    from a replica that has not replayed a write:
    with causal reads, to a replica that has replayed the commit's log
    position; else for ``seconds`` (``dbtune.pin_after_write`` where there
    are replicas, else 0: none) to the writer."""

    def __init__(self, seconds):
        self.seconds = seconds
        #: table: when its pin by time ends (:func:`time.monotonic`); of
        #: a change heard of, which pins fills alone
        self._until = {}
        self._heard_until = {}
        #: table: the log position of the last commit that wrote it, or
        #: of the writer as the listener heard of a change of it
        self._at = {}
        self.after_fork()
        forks.renew_after_fork(self)

    def after_fork(self):
        """A lock held in the parent as it forked would stay held here."""
        self._lock = threading.Lock()

    def wrote(self, tables, position=None):
        """Note a committed write of ``tables`` (None: which, unknown; none:
        a locking read alone): reads of them are filled from a replica that
        has replayed ``position``, where the commit ended; without one, go
        to the writer for :attr:`seconds`."""
        self._pin(tables, position, self._until)

    def heard(self, tables, position=None):
        """Note a change of ``tables`` (None: any) committed anywhere, as
        the listener of changes heard of it (``position``: the writer's
        since): fills of them, and fills alone, are pinned as by
        :meth:`wrote`."""
        self._pin(tables, position, self._heard_until)

    def _pin(self, tables, position, until):
        tables = [ANY_TABLE] if tables is None else tables
        if position is not None:
            with self._lock:
                for table in tables:
                    self._at[table] = position | self._at.get(
                        table, NO_POSITION
                    )
            return
        if not self.seconds:
            return
        end = monotonic() + self.seconds
        with self._lock:
            for table in tables:
                until[table] = end

    def by_time(self, tables, fill=False):
        """Whether a read of ``tables`` goes to the writer, by time; a
        cache ``fill``, since a change heard of too."""
        if not (self._until or fill and self._heard_until):
            return False
        now = monotonic()
        with self._lock:
            return _meets(self._until, tables, now) or (
                fill and _meets(self._heard_until, tables, now)
            )

    def position(self, tables):
        """The log position a replica must have replayed to fill a read
        of ``tables`` (:data:`~.lag.NO_POSITION`: any)."""
        position = NO_POSITION
        if not self._at:
            return position
        with self._lock:
            # A read whose tables cannot be told waits for every write.
            written = (
                self._at.values()
                if ANY_TABLE in tables
                else [self._at.get(t) for t in (*tables, ANY_TABLE)]
            )
            for at in written:
                position |= at or NO_POSITION
        return position


def _meets(until, tables, now):
    """Whether a pin of ``until`` (table: when it ends) meets a read of
    ``tables``; those that ended go."""
    for table, end in list(until.items()):
        if end <= now:
            del until[table]
    # A write or a read whose tables cannot be told meets any.
    if ANY_TABLE in until or ANY_TABLE in tables:
        return bool(until)
    return not until.keys().isdisjoint(tables)
