"""What a MySQL listener has read of the table of changes,
``dbtune_changes`` (:mod:`.changes`), and how old changes leave it.

A row's origin is the app's writer connection's; the app's commit adds a
row (:data:`~.triggers.MARK`) that names the tags it drops itself. A
change is told as the app's own only where its connection's next mark
names every tag it drops: a change a trigger of the user's made to
another table, or to other rows of a table the app wrote, is anyone's.
A connection runs one transaction at a time, so the next mark is its
transaction's, or a later commit's, whose drop comes after the change in
any case; a transaction's rows are read together."""

import json
import logging

import sqlalchemy as sa

from ..sql.conditions import any_row
from .triggers import (
    CHANNEL,
    MARK,
    MY_ORIGIN,
    PROBE,
    images,
    loads,
    tags_of,
)

log = logging.getLogger(__name__)

#: Seconds that MySQL's ``dbtune_changes`` keeps a change.
KEEP_CHANGES = 3600
#: Tags a mark names at the most: one that names some of its commit's
#: tags passes over fewer of the commit's changes, and none it did not
#: drop (a transaction of a million rows' writes would make a mark of
#: more bytes than the server takes in a statement).
MAX_MARKED = 1000


def mark(session, tags):
    """In the app's ``session``, before it commits: add the row
    (:data:`~.triggers.MARK`) that names ``tags``, what the commit drops
    itself; :data:`MAX_MARKED` of them at the most."""
    session.execute(
        sa.text(
            f'INSERT INTO {CHANNEL} (tbl, cols, origin) '
            f'VALUES (:mark, :tags, @{MY_ORIGIN})'
        ),
        {'mark': MARK, 'tags': json.dumps(sorted(tags)[:MAX_MARKED])},
        execution_options={'dbtune_routed': True},
    )


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

    def __init__(self, floor, listener):
        self.floor = floor
        #: the :class:`~.changes.Listener` it reads for
        self.listener = listener
        self.seen = set()
        #: ids missing: noted at the last read, or before
        self.missing = set()

    @property
    def waiting(self):
        """How many changes are waited for: their transactions may still
        commit."""
        return len(self.missing)

    def read(self, connection, apply):
        """Read what is new, and ``apply(table, rows, origin)`` each change
        (none where ``apply`` is ``None``): ``origin`` is the app's, without
        its connection's, where the app's commit dropped the table, else
        None."""
        found = []
        # Noted at an earlier read: by now their rows are there, if their
        # transactions still run (an id is taken, then its row added).
        for id_ in sorted(self.missing):
            try:
                rows = connection.exec_driver_sql(
                    f'SELECT id, tbl, cols, origin FROM {CHANNEL} '
                    'WHERE id = %s FOR UPDATE NOWAIT',
                    (id_,),
                ).all()
            except sa.exc.OperationalError as exc:
                if exc.orig.args[0] not in _LOCKED:
                    raise
                continue  # its transaction is open: wait
            # Committed (then read here), or rolled back.
            found += self._new(rows)
            self.missing.discard(id_)
            self.seen.add(id_)
        rows = connection.exec_driver_sql(
            f'SELECT id, tbl, cols, origin FROM {CHANNEL} WHERE id > %s '
            'ORDER BY id',
            (self.floor,),
        ).all()
        found += self._new(rows)
        if rows:
            self.missing.update(
                set(range(self.floor + 1, rows[-1][0])) - self.seen
            )
        while self.floor + 1 in self.seen:
            self.floor += 1
            self.seen.discard(self.floor)
        if apply is not None:
            for change in _told(found, self.listener):
                apply(*change)

    def _new(self, rows):
        new = [row for row in rows if row[0] not in self.seen]
        for row in new:
            self.seen.add(row[0])
            self.missing.discard(row[0])
        return new


def _told(rows, listener):
    """``(table, rows, origin)`` of each change of ``rows``, in order:
    ``rows`` the images, where it tells them; ``origin`` the app's where
    its connection's next mark tells that its commit dropped what the
    change could have changed (:func:`_dropped`)."""
    marks, told = {}, []
    for _, table, cols, origin in sorted(rows, reverse=True):
        changed = _parsed(table, cols)
        if table == MARK:
            marks[origin] = frozenset(changed or ())
        elif (
            table != PROBE  # a question of who listens: never the app's
            and origin is not None
            and _dropped(
                listener, marks.get(origin, frozenset()), table, changed
            )
        ):
            told.append((table, changed, origin.rpartition(' ')[0]))
        else:
            told.append((table, changed, None))
    return reversed(told)


def _dropped(listener, mark, table, changed):
    """Whether the commit of ``mark`` (the tags it dropped) dropped all
    that a change of ``table`` could have changed: every read of the
    table, or the change's rows. Never where the in-process cache matched
    the table's reads with the rows the commit wrote, not by their tags:
    the change may be of others (a trigger's of the user's)."""
    dbtune = listener.dbtune
    if table in dbtune.watched and dbtune.settings.cache_backend == 'memory':
        return False
    if any_row(table) in mark:
        return True
    rows = None if table in listener.untagged else changed
    return tags_of(table, rows, dbtune.pinned) <= mark


def _parsed(table, cols):
    """What a row of ``dbtune_changes`` tells; None (its table's every
    row) where that is nothing, or not what the triggers and marks write
    (anyone who may write to the table may write there)."""
    if cols is None:
        return None
    try:
        changed = loads(cols)
        if table == PROBE:
            return changed  # a token, checked where it is answered
        if table != MARK:
            return images(changed)
        if type(changed) is list and all(type(t) is str for t in changed):
            return changed
    except (TypeError, ValueError, RecursionError):
        pass
    log.warning(
        'pyramid_dbtune: a change in %s that the listener cannot read (not '
        'written by its triggers?): %.200r', CHANNEL, cols,
    )  # fmt: skip
    return None


#: The error for a row locked by another transaction, at once with
#: ``NOWAIT``: MariaDB's (a lock wait timeout), MySQL 8's
#: (``ER_LOCK_NOWAIT``; no MySQL server runs in the tests).
_LOCKED = frozenset([1205, 3572])
