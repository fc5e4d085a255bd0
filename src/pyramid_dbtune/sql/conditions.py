"""Which rows a statement reads or changes, told from its text, for
invalidation by row rather than by table.

A read of one table whose WHERE requires ``column = :parameter`` (alone
or in a conjunction) only ever returns rows whose column holds the call's
value: its cached rows need dropping only when a write touches such a
row. A write of one table tells which rows it touches by its WHERE (run
as a SELECT first, in its transaction) and what it sets. Where the text
says less than that (an OR, a join, a subquery, an expression), nothing
is told, and the table is invalidated as a whole, as before.
"""

import functools
import re
import uuid
from dataclasses import dataclass

from .analysis import TokenReader, tokens
from .readings import LITERAL_BACKSLASH, LITERAL_STANDARD, READINGS

#: Words that end a WHERE clause at the top level.
_ENDS = frozenset(
    """group order limit having offset fetch for window union intersect
    except returning lock""".split()
)
_QUOTED = re.compile(r'"[^"]*"|`[^`]*`|\[[^\]]*\]')
#: A name that is the same unquoted in every database: no case folding.
PLAIN = re.compile(r'[a-z_][a-z0-9_]*\Z')


_INTEGER = re.compile(r'[+-]?[0-9]+\Z')  # not \d: MySQL's digits are ASCII
#: What MySQL reads a number from, comparing a string with one.
_NUMBER_LIKE = re.compile(r'[+-]?\.?\d')
#: Printable ASCII: the strings whose equality every collation tells
#: alike, whatever its case.
PRINTABLE = re.compile('[ -~]*\\Z')
#: Unicode's combining marks (accents), once a string is decomposed.
ACCENTS = re.compile(
    '[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]'
)
#: A uuid as PostgreSQL and MariaDB read one: braces, hyphens after any
#: digits, or none (ASCII alone: no other digit is a collation's).
UUID_TEXT = re.compile(
    r'\{?(?:[0-9a-f]-*){31}[0-9a-f]\}?', re.ASCII | re.IGNORECASE
)
#: The longest string a read is pinned by, or a write's rows told by.
MAX_TAGGED = 200


def any_row(table):
    """The tag of a write to ``table`` whose rows cannot be told: it drops
    every cached read of the table, pinned or not."""
    return f'{table}?'


def value_tag(table, column, value):
    """The tag of the rows of ``table`` whose ``column`` holds ``value``,
    or None for a value other than a whole number or a string of at most
    :data:`MAX_TAGGED` characters.

    Values a database may find equal have one tag: ``'05'`` and ``5``;
    strings whatever their case and the spaces around them (as MySQL's
    ``_ci`` collations compare them); a string that is not printable
    ASCII (an accent, say) has none. As MySQL
    compares a string with a number by the number it begins with, or 0,
    neither 0 nor a string that begins like a number (``'5.0'``, ``'5
    rooms'``) has one. A uuid, or a string a uuid column reads as one
    (``'{A0EEBC99-...}'``, its hex without hyphens), is tagged by its
    standard form, as the database tells a change of such a column.
    Equal values must never have two tags (a write would miss a read's
    rows); unequal ones may share one (a read is dropped that need not
    be).
    """
    if isinstance(value, uuid.UUID):
        value = str(value)
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    if isinstance(value, str) and len(value) > MAX_TAGGED:
        return None
    return _tag(table, column, value)


@functools.lru_cache(maxsize=4096)
def _tag(table, column, value):
    if isinstance(value, str):
        text = value.strip()
        if not _INTEGER.match(text):
            if UUID_TEXT.fullmatch(text):
                text = str(uuid.UUID(text))  # as a uuid column tells it
            if not text or _NUMBER_LIKE.match(text):
                return None  # MySQL may read it as a number, or as 0
            if not PRINTABLE.match(text):
                # Collations differ on the rest: 'é' is 'e' to most, 'ä'
                # is 'ae' to german2_ci, 'å' 'aa' to danish_ci; 'ß' is
                # 's' to general_ci, '²' is '2' to unicode_ci; and they
                # pass over control characters.
                return None
            return f'{table}.{column}={text.casefold()!r}'
        value = text
    value = int(value)
    if not value:
        return None  # MySQL finds 0 equal to every string not a number
    return f'{table}.{column}={value}'


def standard_words(sql):
    """The tokens of ``sql``, or None where a database reads it otherwise
    than standard SQL: a backslash in a literal, MySQL's ``#`` comments,
    ``$$`` strings."""
    words = tokens(sql, LITERAL_STANDARD)
    for literal in _OTHER_READINGS:
        if tokens(sql, literal) != words:
            return None
    return words


#: The other readings a text's words must be the same under, to be told.
_OTHER_READINGS = (LITERAL_BACKSLASH, *READINGS.values())


def split_runs(reader, start, stop, word):
    """The runs of tokens from ``start`` to ``stop`` between ``word`` at
    the depth of ``start``."""
    runs, run = [], []
    depth = reader.depth[start] if start < len(reader.words) else 0
    for i in range(start, stop):
        if reader.lower[i] == word and reader.depth[i] == depth:
            runs.append(run)
            run = []
        else:
            run.append(i)
    return [*runs, run]


def where_span(reader):
    """``(start, stop)`` of the one top-level WHERE's condition, or None."""
    at = [i for i, w in enumerate(reader.lower) if w == 'where']
    if len(at) != 1 or reader.depth[at[0]]:
        return None
    start = at[0] + 1
    stop = next(
        (
            i
            for i in range(start, len(reader.words))
            if reader.lower[i] in _ENDS and not reader.depth[i]
        ),
        len(reader.words),
    )
    return start, stop


def _equality(reader, run):
    """``(column, parameter)`` of a run that is ``[t.]column = :parameter``
    (either way round), else None."""
    words = [reader.words[i] for i in run]
    if len(words) == 5 and words[1] == '.':
        words = words[2:]
    elif len(words) == 5 and words[3] == '.':
        words = words[:2] + words[4:]
    if len(words) != 3 or words[1] != '=':
        return None
    column, parameter = words[0], words[2]
    if column.startswith(':'):
        column, parameter = parameter, column
    if PLAIN.match(column) and parameter.startswith(':'):
        return column, parameter[1:]
    return None


#: Words that make a read's ``AND``-ed conditions no pins: a join, the
#: ``AND`` of ``BETWEEN``.
_UNPINNED = frozenset(['join', 'between'])
#: At the WHERE's depth, a condition that may hold where a pin does not:
#: ``OR``, MySQL's ``XOR``, and ``||`` (MySQL's ``OR``).
_EITHER = frozenset(['or', 'xor', '|'])


def read_pins(sql, tables, pipes_or=True):
    """``((column, parameter), ...)`` that a read of the one table
    ``tables`` holds requires, in order, or ``()``. ``pipes_or``: ``||``
    is ``OR``, as MySQL reads it (others join strings with it)."""
    words = standard_words(sql)
    if words is None or len(tables) != 1:
        return ()
    reader = TokenReader(words)
    lower = reader.lower
    if lower.count('select') != 1 or not _UNPINNED.isdisjoint(lower):
        return ()
    where = where_span(reader)
    if where is None or 'from' not in lower:  # PostgreSQL's TABLE x, say
        return ()
    start = lower.index('from')
    if any(  # FROM a, b: a table twice over, say, of which one is pinned
        lower[i] == ',' and reader.depth[i] == reader.depth[start]
        for i in range(start, where[0])
    ):
        return ()
    if 'case' in lower[slice(*where)]:  # its own ANDs, not the WHERE's
        return ()
    runs = split_runs(reader, *where, 'and')
    either = _EITHER if pipes_or else _EITHER - {'|'}
    if any(
        lower[i] in either and not reader.depth[i] for r in runs for i in r
    ):
        return ()
    pins = (_equality(reader, run) for run in runs)
    return tuple(sorted({p for p in pins if p is not None}))


@dataclass(frozen=True)
class WriteShape:
    """A write of one table, as its text tells it."""

    #: the table, as written (plain: no schema, no quotes)
    table: str
    #: the raw text of its WHERE condition (``None`` for an INSERT)
    where: str | None
    #: column: the parameter it is set to, or ``None`` for anything else
    sets: dict


def told(shape, columns):
    """Whether a write of ``shape`` tells the ``columns`` of the rows it
    touches: as they were (its WHERE finds them) and as they will be (it
    sets each to a parameter, or leaves it)."""
    if shape is None:
        return False
    if any(shape.sets.get(c, '') is None for c in columns):
        return False  # set to an expression
    return shape.where is not None or set(columns) <= shape.sets.keys()


def write_shape(sql):
    """The :class:`WriteShape` of a single-table ``UPDATE ... SET ...
    WHERE``, ``DELETE FROM ... WHERE`` or ``INSERT INTO t (...) VALUES
    (...)``, or None."""
    words = standard_words(sql)
    if words is None:
        return None
    reader = TokenReader(words)
    lower = reader.lower
    kind = lower[0]
    if kind == 'insert':
        return _insert(reader)
    if kind == 'update':
        table, i = words[1], 2
    elif kind == 'delete' and reader.at(1) == 'from':
        table, i = words[2], 3
    else:
        return None
    where = where_span(reader)
    if (
        not PLAIN.match(table)
        or where is None
        or where[1] != len(words)
        # A name with a schema, ONLY or an alias: not one plain table.
        or (kind == 'delete' and where[0] != i + 1)
        or {'from', 'join', 'using'} & set(lower[i : where[0]])
        or lower.count('select')
    ):
        return None
    sets = {}
    if kind == 'update':
        if reader.at(i) != 'set':
            return None
        for run in split_runs(reader, i + 1, where[0] - 1, ','):
            named = [words[j] for j in run]
            if len(named) < 3 or named[1] != '=' or not PLAIN.match(named[0]):
                return None
            sets[named[0]] = (
                named[2][1:]
                if len(named) == 3 and named[2][0] == ':'
                else None
            )
    return WriteShape(table, _where_text(sql), sets)


@functools.lru_cache(maxsize=1024)
def foreign_reach(sql):
    """The columns of rows already there that a write ``sql`` changes,
    which the foreign keys that refer to one of them follow: none for an
    ``INSERT`` that neither updates nor replaces a row on a conflict;
    those an ``UPDATE`` sets, where it tells them; None (any, and the
    rows may go) for any other write (a ``DELETE``, say)."""
    words = [w.lower() for w in standard_words(sql) or ()]
    if words[:1] == ['insert'] and 'update' not in words:
        # SQLite's INSERT OR REPLACE deletes the rows it conflicts with.
        return None if words[1:3] == ['or', 'replace'] else frozenset()
    shape = write_shape(sql)
    if shape is not None and shape.where is not None and shape.sets:
        return frozenset(shape.sets)
    return None


def _insert(reader):
    words, lower = reader.words, reader.lower
    if lower[1:2] != ['into'] or not PLAIN.match(reader.at(2)):
        return None
    if reader.at(3) != '(' or 'select' in lower or 'on' in lower:
        return None
    close = reader.skip_parens(3)
    if reader.at(close) != 'values' or reader.at(close + 1) != '(':
        return None
    end = reader.skip_parens(close + 1)
    if end != len(words):
        return None  # several rows, or more after them
    columns = [
        words[i] for i in split_runs(reader, 4, close - 1, ',') for i in i
    ]
    values = [
        [words[i] for i in r]
        for r in split_runs(reader, close + 2, end - 1, ',')
    ]
    if len(columns) != len(values) or not all(map(PLAIN.match, columns)):
        return None
    sets = {
        c: v[0][1:] if len(v) == 1 and v[0][0] == ':' else None
        for c, v in zip(columns, values, strict=True)
    }
    return WriteShape(words[2], None, sets)


def _where_text(sql):
    """The raw text after the WHERE of ``sql``, which has one."""
    # Literals, comments and quoted names blanked to their own length:
    # the one WHERE left is the keyword, where it stands.
    blanked = LITERAL_STANDARD.sub(lambda m: ' ' * len(m.group()), sql)
    blanked = _QUOTED.sub(lambda m: ' ' * len(m.group()), blanked)
    # A parameter (``:where``) is no keyword either.
    found = re.search(r'(?<![:\w])where\b', blanked, re.I)
    return sql[found.end() :].strip()
