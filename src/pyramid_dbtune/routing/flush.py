"""What a flush of ``request.dbsession`` writes: the tables, and the tags
of the rows, it takes the request's write slot for, and those the
database or the ORM change in turn (foreign keys' actions, relationships,
columns an update fills itself). Imported by :mod:`.session`, whose
sessions' flushes it listens to."""

from time import perf_counter

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import MANYTOONE, Session

from ..sql.conditions import value_tag
from .schema import aliases
from .work import UNIT

#: What a write of the session is said to be, in errors and counts.
WHAT = 'request.dbsession'


# On every session, so that an application's own ``request.dbsession``,
# adopted, is routed as the package's is; a session no unit adopted has no
# ``UNIT`` in its ``info`` and is left alone.
@event.listens_for(Session, 'before_flush')
def _before_flush(session, flush_context, instances):
    unit = session.info.get(UNIT)
    if unit is None:
        return
    # An attribute set to the value it had is in session.dirty, but its
    # flush sends nothing: no write slot for it, and no pin.
    changed = [o for o in session.dirty if session.is_modified(o)]
    deleted = set(map(id, session.deleted))
    flushed = [
        (sa.inspect(obj), id(obj) in deleted)
        for obj in (*session.new, *changed, *session.deleted)
    ]
    pinned = unit.request.registry.dbtune.pinned
    touched = {}  # table name: the tags of the rows, None if untold
    stored = {}  # table: the states of its rows in the database
    deleting = set()  # the tables of those that go
    related = {}  # tables whose rows relationships write, untold
    keyed = {}  # state: its own columns a many-to-one sets
    for state, going in flushed:
        keyed[state], tables = _related(state, going)
        for table in tables:
            related[table.name.lower()] = table
    for name in related:
        touched[name] = None
    for state, going in flushed:
        for table in state.mapper.tables:
            name = table.name.lower()
            if touched.get(name, ()) is not None:
                columns = pinned.get(name, ())
                schema = unit.router.schema
                enums = schema.enums(session, name) if columns else {}
                updating = not (going or state.pending)
                tags = _tags(
                    state, table, columns, enums, keyed[state], updating
                )
                if columns and tags is not None:
                    # What the database sets itself is not what is given.
                    itself = schema.sets_itself(session, name)
                    if itself is None or not itself.isdisjoint(columns):
                        tags = None
                touched[name] = (
                    None if tags is None else tags | touched.get(name, set())
                )
                if name in pinned and not state.pending:
                    stored.setdefault(table, []).append(state)
                    if going:
                        deleting.add(table)
    for name, tags in touched.items():
        unit.begin_write({name}, WHAT, tags)
        if tags is None:
            unit.count_untold(f'ORM {name}', name in pinned)
    # What the database changes in turn, by foreign keys' actions.
    for state, going in flushed:
        tables = {table.name.lower() for table in state.mapper.tables}
        updated = None  # deleted
        if state.pending:  # inserted: changes no row already there
            updated = frozenset()
        elif not going:
            updated = {
                column.name.lower()
                for prop in state.mapper.column_attrs
                if state.attrs[prop.key].history.has_changes()
                for column in prop.columns
            } | {column.name.lower() for column in keyed[state]}
        unit.cascade(session, tables, updated)
    if related:  # rows set to NULL, deleted or inserted: as deletes
        unit.cascade(session, set(related), None)
    for table, states in stored.items():
        name = table.name.lower()
        if touched[name] is not None:
            found = _stored(
                session, table, states, sorted(pinned[name]),
                updating=table not in deleting,
            )  # fmt: skip
            unit.begin_write({name}, WHAT, found)
            if found is None:
                unit.count_untold(f'ORM {name}', True)
    if touched:
        session.info['dbtune_flush'] = perf_counter()


def _related(state, deleting):
    """What the flush of ``state`` writes by relationships, which the
    history of its columns does not tell: its own foreign key columns
    that a many-to-one sets (to a key known only as the flush runs), and
    the tables whose rows a one-to-many or many-to-many writes (the rows
    that refer to it, set or set to NULL, orphans deleted; its secondary
    table's). ``deleting``: ``state`` is deleted."""
    keyed, tables = set(), set()
    for rel in state.mapper.relationships:
        if rel.viewonly:
            continue
        changed = state.attrs[rel.key].history.has_changes()
        if rel.direction is MANYTOONE:
            if changed and not deleting:
                keyed.update(rel.local_columns)
        elif changed or (
            # Its secondary rows go with it; the rows that refer to it
            # are set to NULL, unless they go with it (then they are in
            # session.deleted) or are left to the database.
            deleting
            and (
                rel.secondary is not None
                or not (rel.cascade.delete or rel.passive_deletes == 'all')
            )
        ):
            tables.update(_written_for(rel))
    if not (deleting or state.pending) and _rekeyed(state):
        tables.update(_rekeying(state.mapper))
    return keyed, tables


def _rekeyed(state):
    """Whether the flush of ``state`` changes its primary key."""
    mapper = state.mapper
    return any(
        state.attrs[mapper.get_property_by_column(c).key].history.has_changes()
        for c in mapper.primary_key
    )


def _rekeying(mapper):
    """The tables whose rows the ORM itself updates as a row of
    ``mapper`` changes its primary key: by the relationships, from it or
    to it, that do not leave it to the database (``passive_updates``)."""
    return {
        table
        for other in mapper.registry.mappers
        for rel in other.relationships
        if not (rel.viewonly or rel.passive_updates)
        and mapper.isa(rel.mapper if rel.direction is MANYTOONE else other)
        for table in _written_for(rel)
    }


def _written_for(rel):
    """The tables whose rows the ORM writes for relationship ``rel``: its
    secondary table, else that of the foreign key columns it sets."""
    if rel.secondary is not None:
        return {rel.secondary}
    columns = (
        rel.local_columns if rel.direction is MANYTOONE else rel.remote_side
    )
    return {column.table for column in columns}


def _fills(mapper, column):
    """Whether an update of a row of ``mapper`` that does not set
    ``column`` may set it: by its ``onupdate`` or ``server_onupdate``,
    or as the mapper's version counter (``version_id_col``)."""
    return (
        column.onupdate is not None
        or column.server_onupdate is not None
        or column is mapper.version_id_col
    )


def _stored(session, table, states, columns, updating):
    """The tags of the rows of ``states`` as ``table`` holds them now,
    locked until the commit: another transaction may have changed them
    since they were loaded. None where they cannot be found by one
    primary key column. ``updating``: none of them is deleted, and their
    lock is no stronger than their UPDATE's (PostgreSQL's FOR NO KEY
    UPDATE, which a reference being made to a row does not wait for)."""
    key = list(table.primary_key.columns)
    if len(key) != 1 or any(
        len(s.mapper.primary_key) != 1 or s.mapper.primary_key[0] is not key[0]
        for s in states
    ):
        return None
    select = (
        sa.select(*(table.c[c] for c in columns))
        .where(key[0].in_([s.identity[0] for s in states]))
        .with_for_update(key_share=updating)
    )
    rows = session.execute(select, execution_options={'dbtune_routed': True})
    name = table.name.lower()
    tags = {
        value_tag(name, c, v)
        for row in rows
        for c, v in zip(columns, row, strict=True)
    }
    return None if None in tags else tags


def _tags(state, table, columns, enums, keyed, updating):
    """The tags of the rows the flush of ``state`` touches in ``table``,
    as they were and as they will be, by the ``columns`` that reads of it
    are pinned by (and by the other name of a value of MySQL ``ENUM``
    ``enums``); None where they cannot be told (a value not loaded, a
    default the database gives, a column of ``keyed``: a many-to-one's
    foreign key; ``updating``, a column the update fills itself)."""
    tags = set()
    for column in columns:
        try:
            mapped = table.c[column]
            key = state.mapper.get_property_by_column(mapped).key
        except (KeyError, sa.orm.exc.UnmappedColumnError):
            return None
        if mapped in keyed:
            return None
        history = state.attrs[key].history
        values = [*history.added, *history.deleted, *history.unchanged]
        if not values or (
            history.added and not history.deleted and not state.pending
        ):
            return None
        if updating and not history.added and _fills(state.mapper, mapped):
            return None
        members = enums.get(column, ())
        for value in values:
            for name in (value, *aliases(members, value)):
                tag = value_tag(table.name.lower(), column, name)
                if tag is None:
                    return None
                tags.add(tag)
    return tags


@event.listens_for(Session, 'after_flush_postexec')
def _after_flush(session, flush_context):
    # The flush's time is the request's database and write time, as a
    # writing SQL method's is (Server-Timing's db-write).
    start = session.info.pop('dbtune_flush', None)
    if start is not None:
        session.info[UNIT].wrote_for(perf_counter() - start)
