"""What a SQL statement does, told from its text: read or write, which
tables, which parameters stand after ``IN``.

The analysis is lexical, for the statements SQL methods hold. Where it
cannot be sure, it errs on the safe side: a statement it cannot place is
a write, a write whose tables it cannot tell invalidates everything, and a
read whose tables it cannot tell (a function in FROM) is invalidated by
any write. A method that declares ``tables=`` or ``writes=`` is not
second-guessed.
"""

import functools
import re

from . import commands
from .readings import (
    DIALECT_READINGS,
    ESCAPING,
    EVERY_READING,
    LITERAL_STANDARD,
    pieces,
)

#: Tables of a read that cannot be told: any committed write invalidates it.
ANY_TABLE = '*'

_READ_WORDS = frozenset(
    ['select', 'with', 'values', 'table', 'show', 'describe', 'explain']
)
_DML_WORDS = frozenset(['insert', 'update', 'delete', 'merge', 'replace'])
# Words before UPDATE that make it part of another clause: FOR UPDATE,
# ON CONFLICT DO UPDATE, ON DUPLICATE KEY UPDATE, WHEN MATCHED THEN UPDATE,
# ON UPDATE CASCADE.
_NOT_A_STATEMENT = frozenset(['for', 'do', 'key', 'then', 'on'])
# Words that may follow a table but are not its alias.
_KEYWORDS = frozenset(
    """where join inner left right full cross natural outer on using group
    order limit having union intersect except window offset fetch for
    lateral straight_join returning set values lock into tablesample select
    from as with when then else end and or not only default""".split()
)
# What may follow the first table of a join in parentheses.
_JOINS = frozenset(
    'join inner left right full cross natural straight_join ,'.split()
)
# Words that end the tables an UPDATE names.
_UPDATE_ENDS = frozenset(['set', 'where'])
# SQLite's conflict actions: UPDATE OR IGNORE t.
_CONFLICT_ACTIONS = frozenset('rollback abort replace fail ignore'.split())
# Functions whose arguments hold a FROM of no table.
_FROM_FUNCTIONS = frozenset(
    ['extract', 'substring', 'substr', 'trim', 'overlay', 'position']
)
# Words before PostgreSQL's TABLE x where it is a query: (TABLE x),
# UNION [ALL] TABLE x.
_QUERIES = frozenset('( union intersect except all distinct'.split())
# Words that end a FROM clause, at its depth.
_FROM_ENDS = frozenset(
    """where group having order limit union intersect except window offset
    fetch for returning set select values into update do ;""".split()
)

_TOKEN = re.compile(
    r'"[^"]*"|`[^`]*`|\[[^\]]*\]'  # quoted names
    r'|(?<![:\w\\]):\w+(?!:)'  # a parameter, as SQLAlchemy's text() reads it
    r'|[^\W\d][\w$]*'  # a name or a keyword, in any script
    r"|''"  # a blanked literal
    r'|\d[\w.]*'  # a number
    r'|\S'  # anything else, one character
)


_BLANKED = {'literal': "''", 'comment': ' '}


def blank(sql, literal=LITERAL_STANDARD):
    """``sql`` with each literal as ``''`` and each comment as a space."""
    return ''.join(
        _BLANKED.get(kind, text) for kind, text in pieces(sql, literal)
    )


def tokens(sql, literal=LITERAL_STANDARD):
    """The words of ``sql`` as ``literal`` reads it: each literal as
    ``''``, a quoted name as one word, no comments."""
    words = []
    for kind, text in pieces(sql, literal):
        if kind is None:
            words += _TOKEN.findall(text)
        elif kind != 'comment':
            words.append(_BLANKED.get(kind, text))
    return words


def _is_name(token):
    return token[0] in '"`[' or (
        token[0].isalpha() or token[0] == '_'
    )  # not a parameter, number, literal or punctuation


def table_name(name):
    """``"Public".Property`` -> ``property``: the last part, unquoted,
    lower case, as tables are compared."""
    return name.split('.')[-1].strip('"`[] ').lower()


def _how_named(words):
    """How the tokens of one table's name write it, when not by its
    plain name: ``'schema'`` (``b.item``), ``'quoted'`` (``"Item"``),
    ``'capitals'`` (``Item``); None for ``item`` or ``"item"``."""
    if len(words) > 1:
        return 'schema'
    unquoted = words[0].strip('"`[]')
    if unquoted == unquoted.lower():
        return None
    return 'quoted' if unquoted != words[0] else 'capitals'


class TokenReader:
    """Walks a statement's tokens; ``lower`` holds them lower-cased;
    ``written`` gathers the names not written plainly (:func:`names`)."""

    def __init__(self, words, written=None):
        self.words = words
        self.written = set() if written is None else written
        self.lower = [w.lower() for w in words]
        #: How deep in parentheses each token stands.
        self.depth = []
        depth = 0
        for word in words:
            depth -= word == ')'
            self.depth.append(depth)
            depth += word == '('

    def at(self, i):
        return self.lower[i] if i < len(self.lower) else ''

    def name(self, i):
        """Read a dotted name at ``i``: ``(last part, next index)``."""
        start = i
        last = self.words[i]
        i += 1
        while self.at(i) == '.' and i + 1 < len(self.words):
            last = self.words[i + 1]
            i += 2
        how = _how_named(self.words[start:i:2])
        if how is not None:
            written = ''.join(self.words[start:i])
            self.written.add((table_name(last), written, how))
        return table_name(last), i

    def skip_parens(self, i):
        """From a ``(`` at ``i``, the index after its matching ``)``."""
        depth = 0
        while i < len(self.words):
            if self.words[i] == '(':
                depth += 1
            elif self.words[i] == ')':
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return i

    def _joined(self, i):
        """Whether the parentheses before ``i`` hold a join (``(a JOIN
        b ...)``, ``((a AS x JOIN ...))``), not a subquery or an
        expression: a table, maybe its alias, then JOIN or a comma."""
        if i >= len(self.words) or not _is_name(self.words[i]):
            return False
        if self.at(i) in _KEYWORDS or self.at(i) in _READ_WORDS:
            return False
        _, i = self.name(i)
        if self.at(i) == 'as':
            i += 2
        elif self.at(i) not in _KEYWORDS and i < len(self.words):
            i += _is_name(self.words[i])
        return self.at(i) in _JOINS

    def table_list(self, i, tables):
        """Read ``a [AS] x, b, (subquery) y, f(...) z`` from ``i``.

        Adds the tables to ``tables``; returns False if a table list holds
        a function, whose tables cannot be told, or a string (SQLite reads
        ``FROM 'property'`` as a table).
        """
        told = True
        while i < len(self.words):
            while self.at(i) in ('only', 'lateral'):
                i += 1
            if self.at(i) == '{' and self.at(i + 1) == 'oj':
                i += 2  # ODBC's {oj a LEFT JOIN b ON ...}, which MySQL reads
            if self.at(i) == '(':
                # A subquery: its own FROM is read where it stands. A join
                # in parentheses: its first table is read here, the others
                # after their JOIN. Anything else cannot be told.
                first = i + 1
                while self.at(first) == '(':
                    first += 1
                if self.at(first) in _READ_WORDS:
                    pass
                elif self._joined(first):
                    told = self.table_list(i + 1, tables) and told
                else:
                    told = False
                i = self.skip_parens(i)
            elif self.at(i) == "''" or (
                i < len(self.words) and _is_name(self.words[i])
            ):
                name, i = self.name(i)
                if name == "''":
                    return False  # SQLite's 'property': a name
                if self.at(i) == '(':
                    told = False
                    i = self.skip_parens(i)
                else:
                    tables.add(name)
            else:
                break
            if self.at(i) == 'as':
                i += 2
            elif (
                i < len(self.words)
                and _is_name(self.words[i])
                and self.at(i) not in _KEYWORDS
            ):
                i += 1
            if self.at(i) == '(':  # column aliases
                i = self.skip_parens(i)
            if self.at(i) != ',':
                break
            i += 1
        return told

    def statement_words(self):
        """Indexes of DML words that begin a statement or a CTE's body."""
        return [
            i
            for i, word in enumerate(self.lower)
            if word in _DML_WORDS
            and (i == 0 or self.lower[i - 1] not in _NOT_A_STATEMENT)
            and not (word in ('replace', 'merge') and self.at(i + 1) != 'into')
            # MySQL's INSERT() of strings
            and not (word == 'insert' and self.at(i + 1) == '(')
        ]


def _reads(reader, top_level=False):
    """The tables named after FROM, JOIN and USING, after each comma
    of a FROM clause (one after a join's condition too) and in TABLE x;
    None if untold."""
    tables = set()
    told = True
    clauses = []  # the depth of each FROM clause this token is in
    calls = []  # the word before each parenthesis this token is in
    for i, word in enumerate(reader.lower):
        depth = reader.depth[i]
        if word == '(':
            calls.append(reader.lower[i - 1] if i else '')
        elif word == ')' and calls:
            calls.pop()
        if word in _HINTED and _index_hint(reader, i):
            continue  # MySQL's USE INDEX FOR ORDER BY (i): the FROM goes on
        while clauses and (
            depth < clauses[-1]
            or (depth == clauses[-1] and word in _FROM_ENDS)
        ):
            clauses.pop()
        if top_level and depth:
            continue
        if word == 'from' and calls and calls[-1] in _FROM_FUNCTIONS:
            continue  # EXTRACT(EPOCH FROM x): no table
        if word == 'from' and reader.lower[max(i - 2, 0) : i] in (
            ['is', 'distinct'],
            ['not', 'distinct'],
        ):
            continue  # a IS [NOT] DISTINCT FROM b: no table
        if word in ('from', 'join', 'straight_join') or (
            word == 'using' and reader.at(i + 1) != '('
        ):
            told = reader.table_list(i + 1, tables) and told
            if word == 'from':
                clauses.append(depth)
        elif (word == ',' and clauses and clauses[-1] == depth) or (
            word == 'table' and (i == 0 or reader.at(i - 1) in _QUERIES)
        ):
            # After a comma of a FROM clause; PostgreSQL's TABLE x.
            told = reader.table_list(i + 1, tables) and told
    return tables if told else None


# The words of MySQL's index hints for a part of a query: USE, FORCE or
# IGNORE INDEX (or KEY) FOR JOIN, FOR ORDER BY, FOR GROUP BY.
_HINTED = frozenset(['for', 'join', 'order', 'group'])


def _index_hint(reader, i):
    """Whether the word at ``i`` is the FOR of an index hint, or the word
    after it."""
    at = i if reader.lower[i] == 'for' else i - 1
    return (
        at > 0
        and reader.lower[at] == 'for'
        and (reader.lower[at - 1] in ('index', 'key'))
    )


def _targets(reader, starts):
    """The tables the DML words at ``starts`` change; None if untold (or
    one of them names no table that can be read)."""
    tables = set()
    for i in starts:
        word = reader.lower[i]
        j = i + 1
        if word in ('insert', 'replace', 'merge'):
            while j < len(reader.words) and reader.at(j) != 'into':
                j += 1
            if j + 1 >= len(reader.words) or not _is_name(reader.words[j + 1]):
                return None
            # One table, maybe with a column list: not a function call.
            name = reader.name(j + 1)[0]
            if name == "''":
                return None  # SQLite's main.'property'
            tables.add(name)
            continue
        if word == 'delete':
            if reader.at(j) != 'from':
                return None  # MySQL's DELETE t1, t2 FROM ...
            j += 1
        else:  # update
            if reader.at(j) == 'or' and reader.at(j + 1) in _CONFLICT_ACTIONS:
                j += 2
            while reader.at(j) in ('only', 'low_priority', 'ignore'):
                j += 1
            # MySQL's UPDATE (a JOIN b ...), UPDATE a, (b JOIN c) SET: the
            # tables in parentheses change too.
            k = j
            while k < len(reader.words) and reader.at(k) not in _UPDATE_ENDS:
                if reader.at(k) == '(' and (
                    k == j or reader.at(k - 1) in _JOINS
                ):
                    return None
                k += 1
        named = set()
        if not reader.table_list(j, named) or not named:
            return None
        tables |= named
    return tables


def _analyse(words, written=None):
    if not words:
        return True, None
    reader = TokenReader(words, written)
    first = next((w for w in reader.lower if w != '('), '')
    starts = reader.statement_words()
    if (
        first in commands.FIRST_WORDS
        and not starts
        and commands.one_statement(reader.lower)
    ):
        inner = commands.wrapped(reader.lower, reader.depth)
        if inner is not None:
            return _analyse(words[inner:], written)
        return True, set()  # SET, NOTIFY, LOCK...: a write of no table
    if first == 'truncate':
        tables = set()
        j = 1
        while reader.at(j) in ('table', 'only'):
            j += 1
        reader.table_list(j, tables)
        if 'cascade' in reader.lower:
            return True, None  # and every table that refers to them
        return True, tables or None
    if first in _READ_WORDS and not starts:
        if 'into' in reader.lower:
            return True, None  # SELECT ... INTO a new table or a variable
        for i, word in enumerate(reader.lower):
            following = reader.at(i + 1)
            if word == 'for' and following in ('update', 'share', 'no', 'key'):
                return True, set()
            if word == 'lock' and reader.at(i + 1) == 'in':
                return True, set()
        return False, _reads(reader)
    if not starts or first not in _DML_WORDS | {'with', 'explain', '('}:
        return True, None
    tables = _targets(reader, starts)
    if tables is not None and {'update', 'delete'} & {
        reader.lower[i] for i in starts if not reader.depth[i]
    }:
        # UPDATE ... FROM and DELETE ... USING name the changed table by an
        # alias in some dialects: count every table they name as changed.
        more = _reads(reader, top_level=True)
        tables = None if more is None else tables | more
    return True, tables


@functools.lru_cache(maxsize=1024)
def analyse(sql, dialect=None, backslashes=True):
    """Tell whether ``sql`` writes, and which tables it reads or writes,
    as the database of ``dialect`` (SQLAlchemy's name for it) reads it;
    without one, as any database may. ``backslashes=False``: its server
    is known to take a backslash in a string as itself.

    Returns ``(writes, tables)``. For a read, ``tables`` is a frozenset of
    the tables it reads, holding :data:`ANY_TABLE` when they cannot be told.
    For a write it is the frozenset of tables it changes, or ``None`` when
    that cannot be told (DDL, procedure calls): such a write invalidates
    every cached result. A locking read (``SELECT ... FOR UPDATE``) is a
    write of no table: it must run in the writing transaction, and it
    changes nothing. So are ``SET``, ``NOTIFY``, ``LISTEN`` and ``LOCK``
    (:mod:`.commands`).
    """
    return analyse_any([sql], dialect, backslashes)


@functools.lru_cache(maxsize=1024)
def is_setting(sql):
    """Whether ``sql`` is a ``SET`` of the session's connection or of its
    transaction that a read-only transaction may make for the reads that
    follow (:func:`.commands.is_setting`), as every database reads it."""
    return all(
        commands.is_setting([word.lower() for word in tokens(sql, literal)])
        for literal in EVERY_READING
    )


def analyse_any(statements, dialect=None, backslashes=True):
    """:func:`analyse` for a method that runs any one of ``statements``:
    a write if one of them writes, and every table they name."""
    literals = DIALECT_READINGS.get(dialect, EVERY_READING)
    if not backslashes:
        literals = [literal for literal in literals if literal not in ESCAPING]
    # Most texts read alike everywhere: each distinct reading once.
    readings = {
        tuple(tokens(sql, literal))
        for sql in statements
        for literal in literals
    }
    found = [_analyse(list(words)) for words in readings]
    writes = any(w for w, _ in found)
    tables = [t for w, t in found if w == writes]
    if writes:
        if any(t is None for t in tables):
            return True, None
        return True, frozenset().union(*tables)
    if any(t is None for t in tables):
        return False, frozenset([ANY_TABLE])
    return False, frozenset().union(*tables)


def names(statements):
    """How ``statements`` name their tables where not by the plain name
    they are told by (:func:`table_name`): ``(table, as written, how)``,
    ``how`` being ``'schema'`` (``b.item``), ``'quoted'`` (``"Item"``) or
    ``'capitals'`` (``Item``), as any database may read them. Triggers
    put on the plain name may watch another table than such a name does.
    """
    written = set()
    for words in {
        tuple(tokens(sql, literal))
        for sql in statements
        for literal in EVERY_READING
    }:
        _analyse(list(words), written)
    return frozenset(written)


def in_parameters(sql):
    """The names of the parameters written ``IN :name`` (lists)."""
    words = tokens(sql)
    return frozenset(
        word[1:]
        for before, word in zip(words, words[1:], strict=False)
        if word.startswith(':') and len(word) > 1 and before.lower() == 'in'
    )
