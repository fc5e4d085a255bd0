"""How far each replica is behind the writer, looked at from a thread of
each process every :data:`EVERY` seconds, never on a read:
``dbtune.max_replica_lag``.

A reader further behind than the setting is passed over until it catches
up (:meth:`~pyramid_dbtune.routing.engines.Router.pick`); while every
reader is, reads go to the writer. A reader whose lag cannot be read (it
is down, or it answered with an error) is left to the failover rules.
"""

import logging
import threading

from ..deploy import forks

log = logging.getLogger(__name__)

#: Seconds between two looks at the replicas' lag.
EVERY = 0.25

#: Seconds a replica is behind, as the database tells it: 0 when it is
#: not a replica, or has replayed all it received.
_LAG = {
    'postgresql': (
        'SELECT CASE WHEN NOT pg_is_in_recovery() OR '
        'pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0 ELSE '
        'EXTRACT(EPOCH FROM clock_timestamp() - '
        'pg_last_xact_replay_timestamp()) END'
    ),
    'mysql': 'SHOW SLAVE STATUS',
}


def position_of(connection):
    """The log position a PostgreSQL server has replayed (a standby) or
    written (a primary), as a number."""
    text = connection.exec_driver_sql(
        'SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() '
        'ELSE pg_current_wal_lsn() END'
    ).scalar()
    return None if text is None else lsn(text)


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
        self.after_fork()
        forks.renew_after_fork(self)

    def after_fork(self):
        """Start a thread of this process's (the parent's did not come)."""
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name='pyramid_dbtune lag watch', daemon=True
        )
        self._thread.start()

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
        """Read ``reader``'s lag now; None where it cannot be read."""
        try:
            with reader.engine.connect() as connection:
                reader.lag = lag_of(connection)
                if self.positions:
                    reader.position = position_of(connection)
        except Exception as exc:
            if reader.lag is not None:
                log.warning(
                    'pyramid_dbtune: cannot read the lag of %s (%s: %s)',
                    reader.name,
                    exc.__class__.__name__,
                    exc,
                )
            reader.lag = reader.position = None
