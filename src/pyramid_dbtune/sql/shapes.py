"""Which rows a cached read holds, told from its text, so that a committed
change can be applied to its rows rather than drop them.

A read of one table whose WHERE (if any) is a conjunction of comparisons
of plain columns with parameters (``=``, ``<>``, ``!=``, ``<``, ``<=``,
``>``, ``>=``) has a :class:`ReadShape`. A change's row images (the old
and new values of the table's watched columns) tell whether it touched
the read's rows at all (:func:`matches`); and for three kinds of read,
how the rows change (:func:`~pyramid_dbtune.sql.patch.patch`):

``rows``
    ``SELECT`` plain columns, ``ORDER BY`` plain columns: a row leaves,
    enters, or moves, within the first ``max_rows``.
``count``
    ``SELECT count(*)``: the count goes up or down.
``groups``
    ``SELECT`` the ``GROUP BY`` columns and ``count(*)``, ``count(c)``,
    ``sum(c)``, ``min(c)``, ``max(c)``, ordered by the group columns.

Values are compared only where every database compares them alike:
numbers with numbers; strings of digits with the same punctuation at the
same places (dates, times) by their characters; other strings for
equality alone, and only where no collation could find them equal. Where
the module cannot be sure (a string compared by a collation, a value of
another type), a change is taken to touch the rows.
"""

import datetime
import decimal
import functools
import re
from dataclasses import dataclass

from .analysis import TokenReader
from .conditions import (
    ACCENTS,
    PRINTABLE,
    UUID_TEXT,
    split_runs,
    standard_words,
    where_span,
)

_OPS = {'=', '<>', '!=', '<', '<=', '>', '>='}
_FLIP = {'<': '>', '<=': '>=', '>': '<', '>=': '<='}
_AGGREGATES = {'count', 'sum', 'min', 'max'}
#: What a clause of a shaped read may not hold.
_REFUSED = frozenset(
    """join distinct having limit offset fetch for union intersect except
    window over case select lock into returning""".split()
)
_NUMBERS = (int, float, decimal.Decimal)
#: A string every collation orders as its characters: digits with the same
#: punctuation at the same places (``2026-09-01``, ``10:30``).
_ORDERED = re.compile(r'[0-9]+(?:[-:./ T][0-9]+)*\Z')
_DIGIT = re.compile('[0-9]')
#: A date written day or month first (``12/01/2025``, ``01.12.2025``):
#: its characters do not order it, and a column parses it as its
#: database's date style says.
_LITTLE_ENDIAN = re.compile(
    r'[0-9]{1,2}([-/.])[0-9]{1,2}\1(?:[0-9]{2}|[0-9]{4})(?:[ T][0-9:.]*)?\Z'
)
#: A time of day and its offset from UTC, at the end of a text
#: (``2026-01-01T10:30:00-05:00``): an instant, which its characters do
#: not order.
_OFFSET = re.compile(
    r'[0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]+)?)?[+-][0-9]{2}(?::?[0-9]{2})?\Z'
)

#: :func:`compare`: unequal, but in an order the module cannot tell.
UNEQUAL = 'unequal'


@dataclass(frozen=True)
class ReadShape:
    """The rows a read of one table holds, as its text tells them."""

    #: the table, as written (plain)
    table: str
    #: ``(column, operator, parameter)`` that every row meets
    conditions: tuple
    #: ``rows``, ``count``, ``groups``, or None (matched, never patched)
    kind: str | None
    #: each result column: ``(None, column)`` for a column's value, or
    #: ``(aggregate, column or None)``
    items: tuple
    #: ``(item index, descending)`` of the ORDER BY
    order: tuple
    #: the columns a row image must hold to be patched in
    columns: frozenset

    @property
    def keys(self):
        """The columns a row image must hold to be matched: those its
        conditions compare, and those it groups by."""
        keys = {column for column, _, _ in self.conditions}
        if self.kind == 'groups':
            keys.update(c for a, c in self.items if a is None)
        return frozenset(keys)


def read_shape(sql, tables):
    """The :class:`ReadShape` of a read of the one table ``tables`` holds,
    or None."""
    words = standard_words(sql)
    if words is None or len(tables) != 1:
        return None
    reader = TokenReader(words)
    lower = reader.lower
    if lower[:1] != ['select'] or _REFUSED & set(lower[1:]):
        return None
    try:
        start = lower.index('from')
    except ValueError:
        return None
    (table,) = tables
    where = where_span(reader)
    after = where[0] - 1 if where else _clause_start(reader, start + 2)
    if lower[start + 1 : start + 2] != [table] or after != start + 2:
        return None  # a schema, an alias, a second table
    conditions = []
    if where is not None:
        for run in split_runs(reader, *where, 'and'):
            condition = _comparison([words[i] for i in run])
            if condition is None:
                return None
            conditions.append(condition)
        rest = where[1]
    else:
        rest = start + 2
    clauses = _clauses(lower, words, rest)
    items = _items(reader, 1, start)
    if clauses is None or items is None:
        return None
    group, order_by = clauses
    columns = {c for c, _, _ in conditions}
    columns.update(c for _, c in items if c is not None)
    kind, order = _kind(items, group, order_by)
    return ReadShape(
        table, tuple(conditions), kind, tuple(items), order,
        frozenset(columns),
    )  # fmt: skip


def _clause_start(reader, i):
    return i if i >= len(reader.words) or reader.lower[i] in (
        'group', 'order'
    ) else -1  # fmt: skip


def _comparison(words):
    """``(column, operator, parameter)`` of ``column op :parameter`` (or
    the other way round), else None."""
    if len(words) == 4 and words[1] + words[2] in _OPS:
        words = [words[0], words[1] + words[2], words[3]]
    if len(words) != 3 or words[1] not in _OPS:
        return None
    column, op, parameter = words
    if column.startswith(':'):
        column, parameter, op = parameter, column, _FLIP.get(op, op)
    if not _plain(column) or not parameter.startswith(':'):
        return None
    return column.lower(), '<>' if op == '!=' else op, parameter[1:]


def _plain(word):
    return bool(re.match(r'[A-Za-z_][A-Za-z0-9_]*\Z', word))


def _clauses(lower, words, i):
    """The GROUP BY columns and the ORDER BY ``(column, descending)`` from
    ``i`` to the end, or None for anything else there."""
    group, order = (), ()
    if lower[i : i + 2] == ['group', 'by']:
        group, i = _names(lower, words, i + 2)
        if group is None:
            return None
    if lower[i : i + 2] == ['order', 'by']:
        order, i = _names(lower, words, i + 2, directions=True)
        if order is None:
            return None
    return (group, order) if i == len(words) else None


def _names(lower, words, i, directions=False):
    names = []
    while i < len(words) and _plain(words[i]):
        name, i = lower[i], i + 1
        if directions:
            descending = lower[i : i + 1] == ['desc']
            i += lower[i : i + 1] in (['asc'], ['desc'])
            name = (name, descending)
        names.append(name)
        if lower[i : i + 1] != [',']:
            return tuple(names), i
        i += 1
    return None, i


def _items(reader, i, stop):
    """The select list's items, each ``(aggregate or None, column or
    None)``, or None where one is something else."""
    items = []
    for run in split_runs(reader, i, stop, ','):
        words = [reader.lower[j] for j in run]
        if len(words) >= 3 and words[-2] == 'as':
            words = words[:-2]  # the name a column is given changes nothing
        if len(words) == 1 and _plain(words[0]):
            items.append((None, words[0]))
        elif (
            len(words) == 4
            and words[0] in _AGGREGATES
            and words[1] == '('
            and words[3] == ')'
            and (_plain(words[2]) or words[2:3] == ['*'])
        ):
            column = None if words[2] == '*' else words[2]
            if column is None and words[0] != 'count':
                return None
            items.append((words[0], column))
        else:
            return None
    return items


def _kind(items, group, order_by):
    """``(kind, order)`` of a read with ``items``, grouped by ``group``
    and ordered by ``order_by``."""
    plain = [c for a, c in items if a is None]
    position = {c: n for n, (a, c) in enumerate(items) if a is None}
    order = tuple((position.get(c), d) for c, d in order_by)
    if any(n is None for n, _ in order):
        return None, ()  # ordered by a column it does not show
    if not group and len(plain) == len(items):
        return 'rows', order
    if not group and items == [('count', None)]:
        return 'count', ()
    if (
        group
        and sorted(plain) == sorted(group)
        and {c for c, _ in order_by} <= set(group)
    ):
        return 'groups', order
    return None, ()


# Comparing values as every database would


def compare(a, b):
    """-1, 0 or 1 as ``a`` is less than, equal to or more than ``b`` in any
    database; :data:`UNEQUAL` where they differ but their order cannot be
    told; None where even that cannot be."""
    try:
        return _remembered(a, b)
    except TypeError:  # unhashable: a JSON array, say
        return _compare(a, b)


def _compare(a, b):
    a, b = _comparable(a), _comparable(b)
    if isinstance(a, datetime.datetime) and isinstance(b, datetime.datetime):
        return (a > b) - (a < b)  # instants, whatever their offsets
    if isinstance(a, _NUMBERS) and isinstance(b, _NUMBERS):
        if isinstance(a, float) or isinstance(b, float):
            a, b = float(a), float(b)  # as the database compares them
        try:
            return (a > b) - (a < b)
        except ArithmeticError:  # a NaN
            return None
    if not (isinstance(a, str) and isinstance(b, str)):
        return None
    if a == b:
        return 0
    if (
        _DIGIT.sub('0', a) == _DIGIT.sub('0', b)
        and _ORDERED.match(a)
        and not _LITTLE_ENDIAN.match(a)
    ):
        return (a > b) - (a < b)
    if (
        _DIGIT.search(a)
        or _DIGIT.search(b)
        or _folded(a) == _folded(b)
        or not (PRINTABLE.match(a) and PRINTABLE.match(b))
        or UUID_TEXT.fullmatch(a.strip())
        or UUID_TEXT.fullmatch(b.strip())
    ):
        # Equal where a collation ignores case, accents or spaces (or
        # takes 'ß' for 's', 'Æ' for 'AE'), where they are a date or a
        # time written two ways, or a uuid ('{ffff...}', 'ffff-...').
        return None
    return UNEQUAL


#: A change is compared with the arguments of every read it may touch:
#: the same few pairs of values, over and over (a value of each type apart:
#: 1, 1.0 and True differ here).
_remembered = functools.lru_cache(maxsize=4096, typed=True)(_compare)


def _comparable(value):
    """``value`` as :func:`_compare` compares it: a date or time as its
    ISO text, but an instant (a datetime with an offset, or its text) as
    an aware datetime; None where it cannot be compared."""
    if isinstance(value, bool):
        return None
    if isinstance(value, datetime.datetime | datetime.time):
        if value.utcoffset() is None:
            return value.isoformat()
        # A time of day with an offset has no instant: not compared.
        return value if isinstance(value, datetime.datetime) else None
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, str) and _OFFSET.search(value):
        try:
            return datetime.datetime.fromisoformat(value)  # with its offset
        except ValueError:  # a time of day alone, or no time at all
            return None
    return value


def parsed_otherwise(text):
    """Whether a column may store ``text`` otherwise than as it is
    written, as a date or time it parses: with an offset, which a column
    without a zone drops, or day or month first."""
    return bool(_OFFSET.search(text) or _LITTLE_ENDIAN.match(text))


def _folded(text):
    import unicodedata

    text = unicodedata.normalize('NFKD', text.strip())
    return ACCENTS.sub('', text).casefold()


def _holds(op, order):
    """Whether ``value op parameter`` holds, given their :func:`compare`:
    True, False, or None."""
    if order is None:
        return None
    if op == '=':
        return order == 0
    if op == '<>':
        return order != 0
    if order == UNEQUAL:
        return None
    if op == '<':
        return order < 0
    if op == '<=':
        return order <= 0
    if op == '>':
        return order > 0
    return order >= 0  # '>='; the parser reads no other


#: For each operator, whether ``value op parameter`` holds, by their
#: :func:`compare`: a lookup where the cache matches each change with
#: every read it may touch.
_TRUTH = {
    op: {order: _holds(op, order) for order in (-1, 0, 1, UNEQUAL, None)}
    for op in _OPS - {'!='}
}


def tests_of(shape, params):
    """The conditions of a read of ``shape`` with ``params``, ready for
    :func:`holds_for`: ``(column, operator, argument)`` each. Plain values
    alone: the garbage collector stops tracking them (a cache holds one
    per entry)."""
    return tuple(
        (column, op, params[parameter])
        for column, op, parameter in shape.conditions
    )


def matches(shape, params, image):
    """Whether a row of ``image`` (column: value) is among the rows a read
    of ``shape`` with ``params`` reads: True, False, or None where it
    cannot be told."""
    return holds_for(tests_of(shape, params), image)


def holds_for(tests, image):
    """:func:`matches`, for the :func:`tests_of` a read."""
    told = True
    for column, op, wanted in tests:
        try:
            value = image[column]
        except KeyError:
            return None
        if value is None or wanted is None:
            return False  # a comparison with NULL holds for no row
        if type(value) is int and type(wanted) is int:  # no memo needed
            holds = _TRUTH[op][(value > wanted) - (value < wanted)]
        else:
            holds = _TRUTH[op][compare(value, wanted)]
        if holds is False:
            return False
        if holds is None:
            told = False
    return True if told else None


# Changes


@dataclass(frozen=True)
class Change:
    """A committed change of ``table``'s rows: the ``old`` images of the
    rows it touched and their ``new`` ones (column: value, for the
    columns watched), and ``xid``, the id of its transaction (PostgreSQL;
    None elsewhere)."""

    table: str
    old: tuple
    new: tuple
    xid: int | None = None


def touches(shape, params, change):
    """Whether ``change`` may touch the rows of a read of ``shape`` with
    ``params``: whether any image it tells is, or may be, one of them."""
    return any(
        matches(shape, params, image) is not False
        for image in (*change.old, *change.new)
    )


def parse_snapshot(text):
    """PostgreSQL's ``pg_current_snapshot()``, ``xmin:xmax:xip,...``, as
    ``(xmin, xmax, tuple of xip)``: tuples of numbers alone, which the
    garbage collector stops tracking (a cache holds one per entry)."""
    xmin, xmax, xip = text.split(':')
    return int(xmin), int(xmax), tuple(int(x) for x in xip.split(',') if x)


def visible(xid, snapshot):
    """Whether the transaction ``xid`` had committed for ``snapshot``:
    whether rows read in it hold its changes."""
    xmin, xmax, running = snapshot
    return xid < xmin or (xid < xmax and xid not in running)
