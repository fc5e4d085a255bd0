"""How far each replica is behind the writer, looked at from a thread of
each process every :data:`EVERY` seconds, never on a read:
``dbtune.max_replica_lag``.

A reader further behind than the setting is passed over until it catches
up (:meth:`~pyramid_dbtune.routing.engines.Router.pick`); while every
reader is, reads go to the writer. A reader whose lag cannot be read (it
is down, or it answered with an error) is left to the failover rules.

With causal reads the thread also reads each replica's log position
(:class:`Position`): how far it has replayed the writer's log; a
client's pin, the position its reads must see, is a signed cookie
(:func:`sign_pin`, :func:`read_pin`).
"""

import hashlib
import hmac
import logging
import threading

from ..convert import whole_number
from ..deploy import forks

log = logging.getLogger(__name__)

#: Seconds between two looks at the replicas' lag.
EVERY = 0.25

#: Seconds a replica is behind, as the database tells it: 0 when it is
#: not a replica, or has replayed all it received; NULL (not known) for a
#: PostgreSQL standby whose streaming stopped, which has replayed all it
#: received for good (one fed from an archive alone receives nothing).
_LAG = {
    'postgresql': (
        'SELECT CASE WHEN NOT pg_is_in_recovery() THEN 0 '
        'WHEN pg_last_wal_receive_lsn() IS NOT NULL AND NOT EXISTS '
        '(SELECT 1 FROM pg_stat_wal_receiver) THEN NULL '
        'WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0 '
        'ELSE EXTRACT(EPOCH FROM clock_timestamp() - '
        'pg_last_xact_replay_timestamp()) END'
    ),
    'mysql': 'SHOW SLAVE STATUS',
    'mariadb': 'SHOW SLAVE STATUS',  # a mariadb:// URL's dialect
}


class Position:
    """A log position: for each replication domain, the last transaction
    replayed or written. PostgreSQL has one domain (0), its log sequence
    number; MariaDB has its GTID domains, each with its sequence number.
    A position is later than another where it is in every domain of the
    other. ``Position()`` is none: every position covers it."""

    __slots__ = ('numbers',)

    def __init__(self, numbers=()):
        self.numbers = dict(numbers)

    def __bool__(self):
        return bool(self.numbers)

    def __eq__(self, other):
        return isinstance(other, Position) and self.numbers == other.numbers

    def __repr__(self):
        return f'Position({self})'

    def __str__(self):
        """The cookie's form: ``domain-number`` items, joined by ``_``."""
        return '_'.join(f'{d}-{n}' for d, n in sorted(self.numbers.items()))

    @classmethod
    def parse(cls, text):
        """The position :meth:`__str__` wrote, or None."""
        numbers = {}
        if not text:
            return cls()
        for item in text.split('_'):
            domain, _, number = item.partition('-')
            domain, number = whole_number(domain), whole_number(number)
            if domain is None or number is None:
                return None
            numbers[domain] = number
        return cls(numbers)

    def covers(self, other):
        """Whether a server at this position has replayed ``other``."""
        mine = self.numbers
        return all(mine.get(d, -1) >= n for d, n in other.numbers.items())

    def __or__(self, other):
        """The later of the two in each domain."""
        numbers = dict(self.numbers)
        for domain, number in other.numbers.items():
            numbers[domain] = max(number, numbers.get(domain, -1))
        return Position(numbers)


#: The execution option of the lag watch's connections: an answer to
#: one does not tell that reads are served again.
LOOK = 'dbtune_lag_look'
#: No position: every position covers it.
NO_POSITION = Position()


def position_of(connection):
    """The log position (:class:`Position`) the PostgreSQL or MySQL
    database of ``connection`` has replayed (a replica) or written (a
    primary); None where it tells none (a standby that replays nothing
    yet; MySQL, which has no MariaDB GTIDs)."""
    dialect = connection.dialect
    if dialect.name == 'postgresql':
        # A primary's insert position: with synchronous_commit = off a
        # commit returns before its record is written out, so the write
        # position (pg_current_wal_lsn) may lie before it.
        text = connection.exec_driver_sql(
            'SELECT CASE WHEN pg_is_in_recovery() THEN '
            'pg_last_wal_replay_lsn() ELSE pg_current_wal_insert_lsn() END'
        ).scalar()
        return None if text is None else Position({0: lsn(text)})
    if dialect.is_mariadb:
        return gtids(
            connection.exec_driver_sql('SELECT @@gtid_current_pos').scalar()
        )
    return None  # pragma: no cover (MySQL's GTIDs: no MySQL server here)


def gtids(text):
    """MariaDB's GTID position (``0-1-42,1-2-7``) as a :class:`Position`:
    each domain's sequence number (its server's id does not order it)."""
    numbers = {}
    for gtid in filter(None, text.split(',')):
        domain, _, number = gtid.strip().split('-')
        numbers[int(domain)] = int(number)
    return Position(numbers)


def lsn(text):
    """PostgreSQL's ``pg_lsn`` text (``16/B374D848``) as a number."""
    high, low = str(text).split('/')
    return (int(high, 16) << 32) + int(low, 16)


def lag_of(connection):
    """Seconds the database of ``connection`` is behind its primary;
    infinite where it does not know (it replays nothing yet, or its
    replication stopped)."""
    dialect = connection.dialect.name
    result = connection.exec_driver_sql(_LAG[dialect])
    if dialect == 'postgresql':
        lag = result.scalar()
    else:
        status = result.mappings().first()
        lag = 0 if status is None else status['Seconds_Behind_Master']
    return float('inf') if lag is None else max(float(lag), 0.0)


class LagWatch:
    """The thread that keeps each reader's ``lag`` up to date."""

    def __init__(self, readers, positions=False):
        self.readers = readers
        #: Whether it reads their log positions too (causal reads).
        self.positions = positions
        self.start()
        forks.renew_after_fork(self)

    def after_fork(self):
        """Nothing to renew: it keeps no connection nor lock of its own.
        The parent's thread did not come; :meth:`start_after_fork` starts
        one once the readers' engines are renewed."""

    def start(self):
        """Start the thread that looks at the readers."""
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name='pyramid_dbtune lag watch', daemon=True
        )
        self._thread.start()

    start_after_fork = start

    def stop(self):
        self._stopping.set()
        self._thread.join(5)

    def _run(self):
        while True:
            for reader in self.readers:
                self.look(reader)
            if self._stopping.wait(EVERY):
                return

    def look(self, reader):
        """Read ``reader``'s lag, and its position, now; None for each
        that cannot be read (a lag that can be read while the position
        cannot, or the other way round, is kept). Said once, until both
        are read again."""
        failed = []
        try:
            with reader.engine.connect() as connection:
                connection.execution_options(**{LOOK: True})
                reader.lag = _read(connection, lag_of, failed)
                if self.positions:
                    reader.position = _read(connection, position_of, failed)
        except Exception as exc:  # no connection
            failed.append(exc)
            reader.lag = reader.position = None
        if failed and not reader.unread:
            log.warning(
                'pyramid_dbtune: cannot read the %s of %s (%s: %s)',
                'lag' if reader.lag is None else 'log position',
                reader.name,
                failed[0].__class__.__name__,
                failed[0],
            )
        reader.unread = bool(failed)


def _read(connection, read, failed):
    """``read(connection)``, or None and its error added to ``failed``."""
    try:
        return read(connection)
    except Exception as exc:
        failed.append(exc)
        connection.rollback()  # PostgreSQL's transaction failed with it
        return None


def sign_pin(position, key):
    """A causal pin's cookie value: the position, signed with ``key``."""
    mac = hmac.new(key, str(position).encode(), hashlib.sha256)
    return f'{position}.{mac.hexdigest()[:32]}'


def signed(value, key, parse):
    """``parse(text)`` of a pin's cookie ``value``, ``text.signature`` as
    :func:`sign_pin` makes it; None where it is not signed with ``key``
    (or ``parse`` finds nothing)."""
    text, _, _ = value.partition('.')
    found = parse(text)
    # compare_digest refuses text that is not ASCII (a forged cookie).
    if (
        found is None
        or not value.isascii()
        or not hmac.compare_digest(value, sign_pin(found, key))
    ):
        return None
    return found


def read_pin(value, key):
    """The :class:`Position` of a causal pin's cookie value: none for no
    pin, or one not signed with ``key``."""
    position = signed(value, key, Position.parse)
    return NO_POSITION if position is None else position
