"""What the writer's catalog tells of the tables a write changes, read
once a table: their columns and how they store what they are given,
those the database sets itself, and the tables their foreign keys'
actions change in turn."""

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from .stored import stores

#: Whether a table has a trigger that may change the rows written, by
#: dialect: one that runs before they are written on MySQL, whose later
#: triggers cannot write their own table; any on PostgreSQL (but the
#: package's own) and SQLite; any table, elsewhere.
_ANY_TRIGGER = sa.text('SELECT 1')
_BEFORE_TRIGGERS = {
    # By name, not to_regclass(), which fails on a name such as 'a b'.
    'postgresql': sa.text(
        'SELECT count(*) FROM pg_trigger t JOIN pg_class c ON '
        'c.oid = t.tgrelid WHERE c.relname = :t AND '
        'pg_table_is_visible(c.oid) AND NOT t.tgisinternal AND '
        "t.tgname NOT LIKE 'dbtune\\_%'"
    ),
    'sqlite': sa.text(
        "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND "
        'tbl_name = :t COLLATE NOCASE'
    ),
    **dict.fromkeys(
        ('mysql', 'mariadb'),
        sa.text(
            'SELECT count(*) FROM information_schema.triggers WHERE '
            'event_object_schema = DATABASE() AND event_object_table = :t '
            "AND action_timing = 'BEFORE'"
        ),
    ),
}
#: MySQL's columns that an UPDATE stamps (``ON UPDATE CURRENT_TIMESTAMP``),
#: whatever it sets: SQLAlchemy reflects the clause only after a default
#: that is not NULL.
_STAMPED = sa.text(
    'SELECT column_name FROM information_schema.columns WHERE '
    'table_schema = DATABASE() AND table_name = :t AND '
    "extra LIKE '%on update%'"
)
#: Whether a SQLite table has a key or UNIQUE constraint declared ON
#: CONFLICT REPLACE, which deletes the rows any write conflicts with
#: (another text than that clause may match: a table too many).
_REPLACES = sa.text(
    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND "
    "tbl_name = :t COLLATE NOCASE AND sql LIKE '%conflict%replace%'"
)
_ACTS = frozenset(['CASCADE', 'SET NULL', 'SET DEFAULT'])


#: A SQLite table's foreign keys, as SQLite reads them: SQLAlchemy finds
#: the actions of a table's FOREIGN KEY clauses only, not of a column's
#: REFERENCES.
_SQLITE_KEYS = sa.text(
    'SELECT id, "table", "to", on_update, on_delete '
    'FROM pragma_foreign_key_list(:t) ORDER BY id, seq'
)
_SQLITE_PK = sa.text('SELECT name FROM pragma_table_info(:t) WHERE pk > 0')


def _keys(connection):
    """``(table, referred table, referred columns, ON DELETE, ON
    UPDATE)`` of each foreign key of the schema ``connection`` looks at
    that refers to a table of it."""
    if connection.dialect.name == 'sqlite':
        yield from _sqlite_keys(connection)
        return
    found = sa.inspect(connection).get_multi_foreign_keys()
    for (_, table), keys in found.items():
        # A key to another schema's table: none the app's writes name.
        for key in (k for k in keys if k['referred_schema'] is None):
            options = key.get('options') or {}
            yield (
                table,
                key['referred_table'],
                key['referred_columns'],
                options.get('ondelete') or '',
                options.get('onupdate') or '',
            )


def _sqlite_keys(connection):
    for table in sa.inspect(connection).get_table_names():
        keys = {}  # its id: [referred table, columns, ON DELETE, ON UPDATE]
        for id_, referred, to, update, delete in connection.execute(
            _SQLITE_KEYS, {'t': table}
        ):
            keys.setdefault(id_, [referred, [], delete, update])[1].append(to)
        for referred, columns, delete, update in keys.values():
            if None in columns:  # REFERENCES a table: its primary key
                columns = connection.execute(_SQLITE_PK, {'t': referred})
                columns = columns.scalars().all()
            yield table, referred, columns, delete, update


def _children(connection):
    """``{table: [(child, referred columns, acts on an update)]}``, by
    the foreign keys of the schema ``connection`` looks at that act on a
    delete or an update of the table; names in lower case."""
    children = {}
    for table, referred, columns, delete, update in _keys(connection):
        updates = update.upper() in _ACTS
        if updates or delete.upper() in _ACTS:
            children.setdefault(referred.lower(), []).append(
                (table.lower(), frozenset(map(str.lower, columns)), updates)
            )
    return children


class Schema:
    """The catalog of the writer of dialect ``dialect``, as the
    connections of writes find it; ``router.schema``."""

    def __init__(self, dialect):
        self.dialect = dialect
        #: table: its columns, those the database sets itself, its enums,
        #: whether it replaces the rows a write conflicts with, how its
        #: columns store values
        self._columns = {}
        #: table: the tables whose foreign keys act on a change of it
        self._children = None

    def columns(self, session, table):
        """The names of ``table``'s columns on the writer, in lower case,
        as ``session``'s connection finds them (once); none if it does
        not."""
        return self._table(session, table)[0]

    def stores(self, session, table):
        """``{column: Stores}``: how each of ``table``'s columns stores
        the values a write gives it
        (:class:`~pyramid_dbtune.routing.stored.Stores`)."""
        return self._table(session, table)[4]

    def sets_itself(self, session, table):
        """The columns of ``table`` whose values the database may set
        itself on a write, whatever the write gives: its generated
        columns and MySQL's ``ON UPDATE CURRENT_TIMESTAMP`` ones, or all
        of them (None) where a trigger may change the rows written or a
        write may replace rows (:meth:`replaces`)."""
        return self._table(session, table)[1]

    def replaces(self, session, table):
        """Whether a write of ``table`` deletes the rows it conflicts
        with, whatever it says: SQLite's, where a key or ``UNIQUE``
        constraint is declared ``ON CONFLICT REPLACE``."""
        return self._table(session, table)[3]

    def enums(self, session, table):
        """``{column: its members}`` of ``table``'s MySQL ``ENUM``
        columns, which MySQL compares with a number by the member's place
        (1 for the first): each value has two names."""
        return self._table(session, table)[2]

    def _table(self, session, table):
        known = self._columns.get(table)
        if known is None:
            connection = session.connection()
            try:
                found = sa.inspect(connection).get_columns(table)
            except sa.exc.NoSuchTableError:
                found = []
            before = _BEFORE_TRIGGERS.get(self.dialect, _ANY_TRIGGER)
            triggered = connection.execute(before, {'t': table}).scalar()
            replaces = self.dialect == 'sqlite' and bool(
                connection.execute(_REPLACES, {'t': table}).scalar()
            )
            # A MySQL SET compared with a number is compared by its bits:
            # its rows are not told by value either.
            itself = {
                c['name'].lower()
                for c in found
                if c.get('computed') or isinstance(c['type'], mysql.SET)
            }
            if self.dialect in ('mysql', 'mariadb'):
                stamped = connection.execute(_STAMPED, {'t': table})
                itself.update(name.lower() for name in stamped.scalars())
            known = self._columns[table] = (
                {c['name'].lower() for c in found},
                None if triggered or replaces else itself,
                {
                    c['name'].lower(): tuple(c['type'].enums)
                    for c in found
                    if isinstance(c['type'], mysql.ENUM)
                },
                replaces,
                stores(self.dialect, found),
            )
        return known

    def cascades(self, session, tables, updated=None):
        """The tables, other than ``tables``, whose rows the database
        changes in turn on a write of rows of ``tables``, by their foreign
        keys' ``ON DELETE`` or ``ON UPDATE`` actions (``CASCADE``, ``SET
        NULL``, ``SET DEFAULT``), however far. ``updated``: the columns
        an UPDATE sets, which only the keys that refer to one of them and
        act on an update follow (none for an INSERT); None for a delete,
        or a write whose columns cannot be told. A write of a table that
        :meth:`replaces` rows may delete them: it is a delete. Read from
        the database once, as ``session``'s connection finds them."""
        if self.dialect == 'sqlite' and any(
            self.replaces(session, table) for table in tables
        ):
            updated = None
        if updated is not None and not updated:
            return set()  # an INSERT: no row it changes is referred to
        children = self._children
        if children is None:
            children = self._children = _children(session.connection())
        found = set()
        todo = {
            child
            for table in tables
            for child, referred, updates in children.get(table, ())
            if updated is None
            or (updates and not referred.isdisjoint(updated))
        }
        while todo:
            found |= todo
            todo = {
                child
                for table in todo
                for child, *_ in children.get(table, ())
            } - found
        return found - set(tables)


def aliases(members, value):
    """The other names of ``value`` in an ``ENUM`` of ``members``: its
    place for a member's name, the name for a place; none for another
    value."""
    if isinstance(value, str):
        folded = value.strip().casefold()
        return [i for i, m in enumerate(members, 1) if m.casefold() == folded]
    if type(value) is int and 0 < value <= len(members):
        return [members[value - 1]]
    return []
