"""The rows a SQL method's write touches, told before it runs: the tags
that choose which cached reads its commit drops, and the change of rows
the listener's notices are matched with."""

import sqlalchemy as sa

from ..sql.conditions import any_row, told, value_tag
from ..sql.shapes import Change
from .schema import aliases
from .stored import inexact, stored_as_given

#: A write that touches more rows than this drops its table's reads whole.
MAX_ROWS_TOLD = 100
#: What begins the SELECT that finds the rows a SQL method's write
#: touches, so that it is told apart in the database's logs.
ROWS_TOLD = '/* pyramid_dbtune: the rows a write touches */ '
#: How the rows a write touches are locked as they are found, by
#: ``(dialect, a DELETE)``: as the write will find them, which no other
#: transaction changes before it does (a plain SELECT reads MySQL's
#: snapshot). No stronger than the write's own lock: PostgreSQL's UPDATE
#: of columns no key names takes FOR NO KEY UPDATE, which a reference being
#: made to the row (FOR KEY SHARE) does not wait for. SQLite has one
#: writer at a time.
_LOCK = '\nFOR UPDATE'
_LOCKS = {
    ('sqlite', False): '',
    ('sqlite', True): '',
    ('postgresql', False): '\nFOR NO KEY UPDATE',
}


def _tags(unit, session, table, columns, rows):
    """The tags of ``rows`` of ``table`` by ``columns``: by each value,
    and by its other name in a MySQL ``ENUM``."""
    enums = unit.router.schema.enums(session, table)
    return {
        value_tag(table, column, name)
        for row in rows
        for column in columns
        for name in (row[column], *aliases(enums.get(column, ()), row[column]))
    }


def touched(unit, method, params, session):
    """The tags of the rows a SQL method's write touches, before and
    after: its WHERE run as a SELECT of the watched columns, first,
    and what it sets them to. Nothing where no read of its table is
    pinned or watched; where they cannot be told, the tag that drops
    every read of its table. The rows, as they were and will be, are
    kept for the commit (:class:`~pyramid_dbtune.sql.shapes.Change`).

    Returns the tags; ``(table, rows found)``, which the write's row count
    must match, or None; and the change of rows, or None.
    """
    dbtune = unit.request.registry.dbtune
    pinned, watched = dbtune.pinned, dbtune.watched
    if len(method.tables) > 1:  # its rows are not told
        tags = [
            any_row(t) for t in method.tables if t in pinned or t in watched
        ]
        unit.count_untold(method.name, tags)
        return tags, None, None
    (table,) = method.tables
    shape = method.write_shape
    keys = sorted(pinned.get(table, ()))
    columns = sorted(set(keys) | watched.get(table, set()))
    if not columns:
        return (), None, None
    itself = unit.router.schema.sets_itself(session, table)
    if (
        method.list_params
        or not told(shape, columns)
        or not set(columns) <= unit.router.schema.columns(session, table)
        or itself is None
        or not itself.isdisjoint(columns)  # a generated column, say
    ):
        unit.count_untold(method.name, True)
        return (any_row(table),), None, None
    new = {c: params.get(shape.sets[c]) for c in columns if c in shape.sets}
    stores = unit.router.schema.stores(session, table)
    if table in watched and not all(
        stored_as_given(stores[c], value) for c, value in new.items()
    ):
        # Its rows as they will be cannot be matched with the reads: a
        # value the column converts, rounds or assigns itself.
        unit.count_untold(method.name, True)
        return (any_row(table),), None, None
    if shape.where is None:  # an INSERT
        old, rows = [], [new]
        found = (table, 1)
    else:
        lock = _LOCKS.get((unit.router.dialect, not shape.sets), _LOCK)
        select = sa.text(
            f'{ROWS_TOLD}SELECT {", ".join(columns)} FROM {shape.table} '
            f'WHERE {shape.where}{lock}'
        )
        result = session.execute(
            select, params, execution_options={'dbtune_routed': True}
        )
        old = result.mappings().fetchmany(MAX_ROWS_TOLD + 1)
        old = [dict(row) for row in old]
        rows = old if len(old) <= MAX_ROWS_TOLD else None
        found = (table, len(old))
        if rows and shape.sets:  # an UPDATE: the rows as they will be
            rows = [*old, *({**row, **new} for row in old)]
    tags = _tags(unit, session, table, keys, rows or ())
    if rows is None or None in tags:
        unit.count_untold(method.name, True)
        return (any_row(table),), found, None
    if table not in watched:
        return tags, found, None
    if inexact(stores, dbtune.compared.get(table, ())):
        # A single-precision float its reads compare: they are dropped.
        return tags, found, None
    # Matched, not patched: the values a write stores may differ from
    # those it was given (rounding, padding, defaults, triggers). The
    # database's own notice tells them.
    new_rows = rows[len(old) :] if shape.where else rows
    return tags, found, Change(table, tuple(old), tuple(new_rows))
