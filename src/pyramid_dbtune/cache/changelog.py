"""What a MySQL listener has read of the table of changes,
``dbtune_changes`` (:mod:`.changes`), and how old changes leave it."""

import json
from decimal import Decimal

import sqlalchemy as sa

from .triggers import CHANNEL

#: Seconds that MySQL's ``dbtune_changes`` keeps a change.
KEEP_CHANGES = 3600


def forget_old(connection, floor):
    """Delete the changes older than :data:`KEEP_CHANGES`, up to ``floor``.
    One by one, by id: a scan would wait on a change not yet committed,
    and hold up the listener."""
    old = connection.exec_driver_sql(
        f'SELECT id FROM {CHANNEL} WHERE id <= %s AND at < NOW(6) - '
        f'INTERVAL {KEEP_CHANGES} SECOND ORDER BY id LIMIT 1000',
        (floor,),
    ).scalars()
    ids = ', '.join(map(str, old))
    if ids:
        connection.exec_driver_sql(
            f'DELETE FROM {CHANNEL} WHERE id IN ({ids})'
        )


class ChangeLog:
    """What a MySQL listener has read of ``dbtune_changes``: every id up
    to ``floor``, and those in ``seen`` above it. An id missing below one
    seen belongs to a transaction still open, or one rolled back."""

    def __init__(self, floor):
        self.floor = floor
        self.seen = set()
        #: ids missing: noted at the last read, or before
        self.missing = set()

    @property
    def waiting(self):
        """How many changes are waited for: their transactions may still
        commit."""
        return len(self.missing)

    def read(self, connection, apply):
        """Read what is new, and ``apply(table, rows)`` each change (none
        where ``apply`` is ``None``)."""
        # Noted at an earlier read: by now their rows are there, if their
        # transactions still run (an id is taken, then its row added).
        for id_ in sorted(self.missing):
            try:
                found = connection.exec_driver_sql(
                    f'SELECT id, tbl, cols, origin FROM {CHANNEL} '
                    'WHERE id = %s FOR UPDATE NOWAIT',
                    (id_,),
                ).all()
            except sa.exc.OperationalError as exc:
                if exc.orig.args[0] not in _LOCKED:
                    raise
                continue  # its transaction is open: wait
            # Committed (then read here), or rolled back.
            self._apply(found, apply)
            self.missing.discard(id_)
            self.seen.add(id_)
        rows = connection.exec_driver_sql(
            f'SELECT id, tbl, cols, origin FROM {CHANNEL} WHERE id > %s '
            'ORDER BY id',
            (self.floor,),
        ).all()
        self._apply(rows, apply)
        if rows:
            self.missing.update(
                set(range(self.floor + 1, rows[-1][0])) - self.seen
            )
        while self.floor + 1 in self.seen:
            self.floor += 1
            self.seen.discard(self.floor)

    def _apply(self, rows, apply):
        for id_, table, cols, origin in rows:
            if id_ not in self.seen:
                self.seen.add(id_)
                self.missing.discard(id_)
                if apply is not None:  # the images, where it tells them
                    changed = cols and json.loads(cols, parse_float=Decimal)
                    apply(table, changed, origin)


#: The error for a row locked by another transaction, at once with
#: ``NOWAIT``: MariaDB's (a lock wait timeout), MySQL 8's
#: (``ER_LOCK_NOWAIT``; no MySQL server runs in the tests).
_LOCKED = frozenset([1205, 3572])
