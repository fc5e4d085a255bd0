"""How each database reads a statement's text (its strings, quoted names
and comments), and the parameters a reading hides."""

import re
from collections import Counter

# How each database reads what is not SQL code: strings, quoted names and
# comments. PostgreSQL and SQLite: '' doubles a quote (E'' takes
# backslashes), "" is a name, $tag$ quotes, /* */ nests. MySQL and
# MariaDB: "" is a string too (a name with ANSI_QUOTES), a backslash
# escapes (unless NO_BACKSLASH_ESCAPES), # is a comment, -- needs a space
# after it, and /*! */ is code. Each pattern names what it finds: a
# literal, a name, a nested comment's start, MySQL's code and its end;
# anything else it finds is a comment. PostgreSQL without
# standard_conforming_strings takes a backslash as an escape in '' too.
_POSTGRESQL_HIDDEN = r"""(?P<literal>(?<![\w$])[Ee]'(?:''|\\.|[^'\\])*'?
        | PLAIN
        | (?<![\w$])\$(?P<tag>(?:[^\W\d]\w*)?)\$.*?(?:\$(?P=tag)\$|\Z))
      | (?P<name>"(?:""|[^"])*"?)
      | --[^\n]*
      | (?P<nested>/\*)"""
_STANDARD_HIDDEN = re.compile(
    _POSTGRESQL_HIDDEN.replace('PLAIN', r"'(?:''|[^'])*'?"),
    re.VERBOSE | re.DOTALL,
)
_ESCAPING_HIDDEN = re.compile(
    _POSTGRESQL_HIDDEN.replace('PLAIN', r"'(?:''|\\.|[^'\\])*'?"),
    re.VERBOSE | re.DOTALL,
)
_MYSQL_CODE = r'(?P<code>/\*M?!\d*)|(?P<close>\*/)'
_MYSQL_COMMENTS = r'\#[^\n]*|--(?=\s|\Z)[^\n]*|/\*.*?(?:\*/|\Z)'
_MYSQL_HIDDEN = re.compile(
    rf"""{_MYSQL_CODE}
      | (?P<literal>'(?:''|\\.|[^'\\])*'?)
      | (?P<name>"(?:""|\\.|[^"\\])*"?|`(?:``|[^`])*`?)
      | {_MYSQL_COMMENTS}""",
    re.VERBOSE | re.DOTALL,
)
_MYSQL_NO_BACKSLASH_HIDDEN = re.compile(
    rf"""{_MYSQL_CODE}
      | (?P<literal>'(?:''|[^'])*'?)
      | (?P<name>"(?:""|[^"])*"?|`(?:``|[^`])*`?)
      | {_MYSQL_COMMENTS}""",
    re.VERBOSE | re.DOTALL,
)
#: How each database reads the text, by the name given in errors.
READINGS = {
    'PostgreSQL or SQLite': _STANDARD_HIDDEN,
    'MySQL': _MYSQL_HIDDEN,
    'MySQL with NO_BACKSLASH_ESCAPES': _MYSQL_NO_BACKSLASH_HIDDEN,
    'PostgreSQL without standard_conforming_strings': _ESCAPING_HIDDEN,
}


# Literals and comments are blanked before the text is read; what is
# double-quoted or backquoted is kept (a name, or MySQL's string), and
# hides what it holds (a quote, a comment's start). Databases differ in
# what they take as a literal or a comment (a backslash, #, $$, nesting):
# the text is read as each of them reads it and the findings joined, so
# that none hides a table. SQLite reads as LITERAL_STANDARD does;
# LITERAL_BACKSLASH is PostgreSQL without standard_conforming_strings.
_COMMENT = r'--[^\n]*|/\*.*?\*/'
LITERAL_STANDARD = re.compile(
    rf"""(?P<literal>'(?:''|[^'])*')
      | (?P<name>"(?:""|[^"])*"|`(?:``|[^`])*`)
      | {_COMMENT}""",
    re.DOTALL | re.VERBOSE,
)
LITERAL_BACKSLASH = re.compile(
    rf"""(?P<literal>'(?:''|\\.|[^'\\])*')
      | (?P<name>"(?:""|\\.|[^"\\])*"|`(?:``|[^`])*`)
      | {_COMMENT}""",
    re.DOTALL | re.VERBOSE,
)

#: The readings a statement's tables are told by, joined.
EVERY_READING = (LITERAL_STANDARD, LITERAL_BACKSLASH, *READINGS.values())
#: Those that apply to a database, by SQLAlchemy's name for it: a text of
#: another, or of a database not known, is read every way.
DIALECT_READINGS = {
    'postgresql': (
        LITERAL_STANDARD,
        LITERAL_BACKSLASH,  # without standard_conforming_strings
        READINGS['PostgreSQL or SQLite'],
    ),
    'sqlite': (LITERAL_STANDARD, READINGS['PostgreSQL or SQLite']),
    'mysql': (READINGS['MySQL'], READINGS['MySQL with NO_BACKSLASH_ESCAPES']),
}
DIALECT_READINGS['mariadb'] = DIALECT_READINGS['mysql']
#: The readings in which a backslash escapes a quote in a string.
ESCAPING = frozenset([LITERAL_BACKSLASH, READINGS['MySQL'], _ESCAPING_HIDDEN])


def readings_of(dialect):
    """The :data:`READINGS` that apply to a database of ``dialect``
    (SQLAlchemy's name for it)."""
    if dialect in ('mysql', 'mariadb'):
        return ('MySQL', 'MySQL with NO_BACKSLASH_ESCAPES')
    if dialect == 'postgresql':
        return (
            'PostgreSQL or SQLite',
            'PostgreSQL without standard_conforming_strings',
        )
    return ('PostgreSQL or SQLite',)


# A parameter as SQLAlchemy's text() finds it, in strings and comments too.
_PARAMETER = re.compile(r'(?<![:\w\\]):(\w+)(?!:)')
_NESTED = re.compile(r'/\*|\*/')


def _comment_end(sql, pos):
    """The end of PostgreSQL's nested ``/* */`` comment at ``pos``."""
    depth = 0
    for match in _NESTED.finditer(sql, pos):
        depth += 1 if match.group(0) == '/*' else -1
        if depth == 0:
            return match.end()
    return len(sql)


def pieces(sql, reading):
    """``sql`` cut as ``reading`` (a pattern of :data:`READINGS`, or
    one like them) reads it: ``(kind, text)``, ``kind`` being ``None``
    for code, or ``'literal'``, ``'name'`` or ``'comment'``."""
    pos, in_code = 0, False
    while match := reading.search(sql, pos):
        start, end = match.span()
        kind = match.lastgroup
        if kind == 'close' and not in_code:
            # A * of code before a /, which may start a comment.
            yield None, sql[pos : start + 1]
            pos = start + 1
            continue
        yield None, sql[pos:start]
        if kind == 'nested':
            end = _comment_end(sql, start)
        elif kind in ('code', 'close'):
            in_code = kind == 'code'
        if kind not in ('literal', 'name'):
            kind = 'comment'
        yield kind, sql[start:end]
        pos = end
    yield None, sql[pos:]


def _code(sql, reading):
    """``sql`` with what a reading of :data:`READINGS` takes as strings,
    quoted names and comments blanked: the text it takes as code."""
    return ''.join(
        ' ' if kind else text for kind, text in pieces(sql, READINGS[reading])
    )


def in_code(sql, pattern):
    """The matches of ``pattern`` in ``sql`` that every reading of
    :data:`READINGS` takes as code: none inside a string, a quoted name
    or a comment as any database reads them."""
    found = None
    for reading in READINGS.values():
        code = ''.join(
            ' ' * len(text) if kind else text
            for kind, text in pieces(sql, reading)
        )
        here = {match.start(): match for match in pattern.finditer(code)}
        found = here if found is None else {
            start: here[start] for start in found if start in here
        }  # fmt: skip
    return [found[start] for start in sorted(found)]


def hidden_parameters(sql, names, readings=tuple(READINGS)):
    """The ``names`` that are not parameters wherever ``sql`` holds them.

    Returns ``{name: why}`` for each name that SQLAlchemy's ``text()``
    does not take as a ``:name`` parameter (``why`` is ``None``), or that
    stands inside a string, a quoted name or a comment as one of the
    ``readings`` (of :data:`READINGS`) reads ``sql`` (``why`` names the
    first). A driver that fills parameters in itself (PyMySQL, psycopg2)
    would then put the value's text into a string or comment, from where
    it can escape.
    """
    counts = _count(sql, names)
    found = {n: None for n in names if not counts[n]}
    for reading in readings:
        seen = _count(_code(sql, reading), names)
        for name in names:
            if name not in found and seen[name] != counts[name]:
                found[name] = reading
    return found


def _count(sql, names):
    return Counter(n for n in _PARAMETER.findall(sql) if n in names)
