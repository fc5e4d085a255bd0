"""How a column stores the values a write gives it, as its reflected type
tells: whether a row image made of a write's arguments holds the values
the database compares, or other ones (``'1.55'`` a ``DECIMAL(10,1)``
stores as 1.6, a date a ``DATE`` cuts, an id the database assigns)."""

import decimal
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from ..sql.shapes import parsed_otherwise

#: Whole numbers a float column of either precision holds exactly.
_EXACT_IN_FLOAT = 2**24


@dataclass(frozen=True)
class Stores:
    """What a column stores: ``kind``, one of ``'integer'``,
    ``'assigned'`` (an integer the database assigns where it is given
    NULL, or MySQL 0: an auto-increment, SQLite's ``INTEGER PRIMARY
    KEY``), ``'decimal'`` (of ``scale`` places, None for any),
    ``'numeric'`` (SQLite's numeric affinity), ``'float'``, ``'single'``
    (a single-precision float), ``'text'``, ``'enum'`` (of ``members``,
    which MySQL takes by their place too), ``'uuid'``, or ``'other'``; and
    whether it takes NULL."""

    kind: str
    scale: int | None = None
    nullable: bool = True
    members: int = 0


def stores(dialect, found):
    """``{column: Stores}`` (names in lower case) of the columns ``found``
    (``Inspector.get_columns()``) on a database of ``dialect``."""
    keys = [c for c in found if c.get('primary_key')]
    return {
        c['name'].lower(): Stores(
            _kind(dialect, c, len(keys) == 1),
            getattr(c['type'], 'scale', None),
            bool(c['nullable']),
            len(getattr(c['type'], 'enums', ())),
        )
        for c in found
    }


def _kind(dialect, column, sole_key):
    type_ = column['type']
    if isinstance(type_, sa.Integer):
        assigned = column.get('autoincrement') is True or (
            dialect == 'sqlite' and sole_key and column.get('primary_key')
        )
        return 'assigned' if assigned else 'integer'
    if isinstance(type_, sa.Float):
        # SQLite's REAL and FLOAT are doubles; elsewhere, a FLOAT or REAL
        # that is no DOUBLE is single precision.
        single = dialect != 'sqlite' and not isinstance(type_, sa.Double)
        return 'single' if single else 'float'
    if isinstance(type_, sa.Numeric):
        return 'numeric' if dialect == 'sqlite' else 'decimal'
    if isinstance(type_, sa.Enum):
        return 'enum'
    if isinstance(type_, mysql.SET):
        return 'other'  # '3' is 'a,b', and 'b,a' too
    if isinstance(type_, sa.Uuid):
        return 'uuid'
    if isinstance(type_, sa.String):
        return 'text'
    return 'other'


def stored_as_given(column, value):
    """Whether a column that :class:`Stores` ``column`` stores ``value`` as
    it is, to be compared as it is: NULL where it takes it and assigns
    nothing; a whole number in a column of numbers (in a float's, one it
    holds exactly; not 0 where MySQL assigns one), or the place of an
    ``ENUM``'s member; a decimal of no more
    places than a decimal column keeps; a string in a column of text,
    but one a date or time column parses otherwise
    (:func:`~pyramid_dbtune.sql.shapes.parsed_otherwise`). No float,
    which a column rounds; no date or time, which a column may cut or
    move to its zone; nothing a column converts (a string into a number
    or a date, a number into text)."""
    kind = column.kind
    if value is None:
        return column.nullable and kind != 'assigned'
    if isinstance(value, str):
        return kind in ('text', 'enum') and not parsed_otherwise(value)
    if isinstance(value, int) and kind == 'enum':
        return 0 < value <= column.members  # a member by its place
    if isinstance(value, int):
        if kind in ('single', 'float'):
            return abs(value) <= _EXACT_IN_FLOAT
        if kind == 'assigned':
            return value != 0
        return kind in ('integer', 'decimal', 'numeric')
    if isinstance(value, decimal.Decimal):
        return (
            kind == 'decimal'
            and value.is_finite()
            and (
                column.scale is None
                or -value.as_tuple().exponent <= column.scale
            )
        )
    return False


def inexact(stores, columns):
    """Whether one of ``columns`` is a single-precision float (of those
    ``stores`` tells, ``{column: Stores}``): its value, read, is the
    shortest decimal of the float (0.1), which the database widens to
    compare it with an argument (0.100000001490116...). A row image does
    not tell how it compares."""
    return any(
        column in stores and stores[column].kind == 'single'
        for column in columns
    )


#: The kinds of column whose values a change tells as a read's argument
#: equal to them is written (or as no tag: ``'05'`` and 5 are one), by
#: dialect: MySQL's ``ENUM`` is read by a member's place too (2 for
#: ``'b'``), which a change does not tell.
_TOLD_AS_WRITTEN = frozenset({'integer', 'assigned', 'text', 'enum', 'uuid'})
_MY_TOLD_AS_WRITTEN = _TOLD_AS_WRITTEN - {'enum'}


def untold_tables(connection, tables, compared, pinned):
    """Of ``tables``, as ``connection`` finds them: ``(inexact,
    untagged)``. ``untagged``, those that a read is pinned (``pinned``,
    ``{table: columns}``) by a column whose values a trigger tells
    otherwise than an argument equal to them may be written: bytes
    (``'abc'``, told ``'\\x616263'``), a MAC address, MySQL's ``ENUM``
    (read by 2, told ``'b'``) and ``SET``: a change of theirs drops every
    read of the table. ``inexact``, those too, and those where a column that
    reads compare (``compared``) is :func:`inexact`: a change's images do
    not tell how it compares."""
    inspector = sa.inspect(connection)
    dialect = connection.dialect.name
    inexact_, untagged = set(), set()
    told = _TOLD_AS_WRITTEN if dialect == 'postgresql' else _MY_TOLD_AS_WRITTEN
    for table in tables:
        if table not in compared and table not in pinned:
            continue
        found = stores(dialect, inspector.get_columns(table))
        if inexact(found, compared.get(table, ())):
            inexact_.add(table)
        for column in pinned.get(table, ()):
            if column not in found or found[column].kind not in told:
                untagged.add(table)
    return frozenset(inexact_ | untagged), frozenset(untagged)
