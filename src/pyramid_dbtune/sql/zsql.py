"""Zope's ZSQL Method files (``.zsql``), read into SQL methods.

A ``.zsql`` file is a ``<dtml-comment>`` header (``connection_id``,
``arguments``, ``max_rows``, ``max_cache``, ``cache_time``) and a statement
written with DTML's SQL tags. Every value the tags insert becomes a bound
parameter: nothing a caller passes is ever formatted into the statement's
text, whatever the tag (``'<dtml-var name sql_quote>'`` included). A
tag where a database would not read a parameter (a comment, a quoted
name) is an error when the file loads, and each text rendered is checked
as PostgreSQL and MySQL read it (:func:`.analysis.hidden_parameters`).

Optional tests, ``<dtml-sqlgroup>`` and ``<dtml-if>`` make the statement's
text depend on which arguments are given. A :class:`ZSQLMethod` renders
that text on each call and keeps one compiled statement per text. Its
cache key is the text and the values bound, so two calls that run
different statements never share cached rows.

A tag, an attribute or a form (a Python expression) that this module does
not translate is an error when the file is loaded, naming the file, the
line and the tag: a template is never run half-understood.
"""

import decimal
import difflib
import itertools
import math
import re
from pathlib import Path

from sqlalchemy import bindparam, text

from . import analysis
from .analysis import ANY_TABLE
from .method import (
    _SCALARS,
    SQLFileError,
    SQLMethod,
    _yes_no,
    check_unknown_key,
    header_key,
    load_sql_file,
    read_source,
)


class _Absent:
    """The value of an argument that was not given."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self):
        return '<absent>'

    def __reduce__(self):
        return (_Absent, ())


#: Stands for an argument not given (and with no default): a
#: ``<dtml-if>`` of it is false, a tag that needs it a :class:`TypeError`.
ABSENT = _Absent()

#: The value types of ``<dtml-sqlvar>`` and ``<dtml-sqltest>``.
TYPES = ('string', 'nb', 'int', 'float')

#: ``op=`` of ``<dtml-sqltest>``: Zope's names, and the operators.
OPERATORS = {
    'eq': '=', 'ne': '<>', 'lt': '<', 'le': '<=', 'lte': '<=', 'gt': '>',
    'ge': '>=', 'gte': '>=', '=': '=', '<>': '<>', '!=': '<>', '<': '<',
    '<=': '<=', '>': '>', '>=': '>=', 'like': 'LIKE',
}  # fmt: skip

#: Every tag a ``.zsql`` file may hold, and what it is.
SUPPORTED = (
    'sqlvar', 'sqltest', 'sqlgroup', 'and', 'or', 'comma', 'var',
    'if', 'elif', 'else', 'unless', 'comment',
)  # fmt: skip

# A tag; a comment to the end of the line; the start of a comment, a
# quoted name or a string where no value may go; a quote (a literal
# starts); or a DTML form not translated.
_SCAN = re.compile(
    r"""(?P<tag><(?P<close>/?)dtml-(?P<name>[\w.-]*)
          (?P<args>(?:[^>"']|"[^"]*"|'[^']*')*)>)
      | (?P<comment>--[^\n]*|\#[^\n]*)
      | (?P<region>/\*|"|`|(?<![\w$])\$(?:[^\W\d]\w*)?\$)
      | (?P<quote>')
      | (?P<other><!--\#\s*[\w.-]*|&dtml[\w.-]*;?)""",
    re.VERBOSE | re.IGNORECASE,
)
_TAG = re.compile(r'</?dtml-[\w.-]*', re.IGNORECASE)
# Each region that holds no value, by how it starts ($$ strings aside).
_CLOSED = {
    '/*': re.compile(r'/\*.*?\*/', re.DOTALL),
    '"': re.compile(r'"(?:""|[^"])*"'),
    '`': re.compile(r'`(?:``|[^`])*`'),
}
#: Each kind of region a tag cannot be in, and what to do instead.
_OUT_OF_COMMENT = '; take it out of the comment (<dtml-comment> hides text)'
_REGIONS = {
    '--': ('a -- comment (to the end of its line)', _OUT_OF_COMMENT),
    '#': ('a # comment (MySQL reads # as a comment to the end of the line)',
          _OUT_OF_COMMENT),
    '/*': ('a /* */ comment', _OUT_OF_COMMENT),
    '"': ('double quotes (a name in standard SQL, a string in MySQL)',
          '; quote it with single quotes'),
    '`': ('backquotes (a MySQL name)', ''),
    '$': ('a dollar-quoted string', "; quote it with single quotes"),
}  # fmt: skip
_ATTR = re.compile(
    r"""\s*(?P<key>[^\s="']+)(?:\s*=\s*(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)'
        |(?P<bare>[^\s"']+)))?|\s*(?P<expr>"[^"]*")""",
    re.VERBOSE,
)
# A ':' that SQLAlchemy's text() would take for a parameter.
_COLON = re.compile(r'(?<![:\w\\]):(?=\w)')


class _Render:
    """One call's rendering: the text, the bound values, the lists.

    A value's place in the text is marked ``\\0name\\0`` until the text is
    compiled (:func:`_place`), so that what stands next to it is known.
    """

    def __init__(self, method, args, choices=None):
        self.method = method
        self.args = args
        #: Not None: render every optional part present, each value as a
        #: placeholder, and the branch of each ``<dtml-if>`` this maps it
        #: to (all of them, glued, if it has none): the texts that tell
        #: which tables the method reads or writes.
        self.choices = choices
        self.skeleton = choices is not None
        self.binds = {}
        self.expanding = set()

    def get(self, arg):
        return self.args.get(arg, ABSENT)

    def bind(self, name, value, expanding=False):
        self.binds[name] = value
        if expanding:
            self.expanding.add(name)
        return f'\0{name}\0'

    def fail(self, exc_type, arg, what):
        raise exc_type(f'ZSQL method {self.method}(): argument {arg!r} {what}')


_MARK = re.compile(r'\0(\w+)\0')
_GLUED_AFTER = re.compile(r'[\0:\w]')


def _place(sql, expanding):
    """The text with each value's mark as a ``:name`` parameter; in
    parentheses where text glued to it would hide it from SQLAlchemy
    (``<dtml-sqlvar d type=string>::date`` is ``(:d)::date``)."""

    def parameter(match):
        name, start, end = match.group(1), match.start(), match.end()
        glued = (start and sql[start - 1] in '\0:') or _GLUED_AFTER.match(
            sql, end
        )
        if glued and name not in expanding:
            return f'(:{name})'
        return f':{name}'

    return _MARK.sub(parameter, sql)


_NUMBERS = {'int': (int, 'an integer'), 'float': (float, 'a number')}


def _number(kind, value):
    """``value`` as an int or a float, or None if it is not one."""
    number = _NUMBERS[kind][0]
    if isinstance(value, str | bytes):
        value = value.strip()
    elif isinstance(value, bool):
        return None
    elif isinstance(value, decimal.Decimal):
        if kind == 'int' and not (
            value.is_finite() and value == value.to_integral_value()
        ):
            return None
    elif not isinstance(value, int | float):
        return None
    try:
        # + 0 binds -0.0 as 0.0: the two are equal in a cache key.
        return number(value) + 0
    except (ValueError, OverflowError):  # 'x', inf for an int
        return None


def _convert(render, arg, kind, value):
    """``value`` as the tag's ``type`` says, as Zope's tags checked it."""
    if kind in _NUMBERS:
        number = _number(kind, value)
        if number is None:
            render.fail(
                ValueError, arg, f'must be {_NUMBERS[kind][1]}, not {value!r}'
            )
        return number
    if isinstance(value, bytes):
        value = value.decode('utf-8')
    if not isinstance(value, str):
        if not isinstance(value, _SCALARS):
            render.fail(ValueError, arg, f'cannot be bound: {value!r}')
        value = str(value)
    return value


def _blank(value):
    return isinstance(value, str | bytes) and not value.strip()


class _Text:
    def __init__(self, source):
        # Colons in the template's own text are not parameters.
        self.text = _COLON.sub(r'\\:', source)

    def render(self, r):
        return self.text


class _SQLVar:
    """``<dtml-sqlvar name type=T [optional]>``: one bound value."""

    def __init__(self, arg, kind, optional, bind):
        self.arg, self.kind, self.optional, self.name = (
            arg, kind, optional, bind,
        )  # fmt: skip

    def render(self, r):
        value = r.get(self.arg)
        if r.skeleton:
            return r.bind(self.name, None)
        if value is ABSENT:
            if not self.optional:
                r.fail(TypeError, self.arg, 'is missing')
            value = None
        elif value is not None and _blank(value) and self.kind != 'string':
            if not self.optional:
                r.fail(ValueError, self.arg, 'must not be empty')
            value = None
        if value is not None:
            value = _convert(r, self.arg, self.kind, value)
        return r.bind(self.name, value)


def _items(value):
    """The values of a ``multiple`` test: a list, a tuple or a set (in
    order, where its values have one), or one value."""
    if isinstance(value, list | tuple):
        return list(value)
    if isinstance(value, set | frozenset):
        try:
            return sorted(value)
        except TypeError:
            return list(value)
    return [value]


class _SQLTest:
    """``<dtml-sqltest name type=T [column=C] [op=O] [optional]
    [multiple]>``: ``C O :value``, or ``C IN :values`` for a list."""

    def __init__(self, arg, kind, column, op, optional, multiple, bind):
        self.arg, self.kind, self.column, self.op = arg, kind, column, op
        self.optional, self.multiple, self.name = optional, multiple, bind

    def render(self, r):
        if r.skeleton:
            return f'{self.column} {self.op} {r.bind(self.name, None)}'
        value = r.get(self.arg)
        if value is ABSENT:
            if self.optional:
                return ''
            r.fail(TypeError, self.arg, 'is missing')
        values = _items(value)
        if len(values) > 1 and not self.multiple:
            r.fail(ValueError, self.arg, 'takes one value, not a list')
        # As Zope did: a blank string is no value, but for type=string.
        values = [
            _convert(r, self.arg, self.kind, v)
            for v in values
            if self.kind == 'string' or not _blank(v)
        ]
        if not values:
            if self.optional:
                return ''
            r.fail(ValueError, self.arg, 'was given no value')
        if len(values) == 1:
            return f'{self.column} {self.op} {r.bind(self.name, values[0])}'
        negate = 'NOT ' if self.op == '<>' else ''
        return f'{self.column} {negate}IN {r.bind(self.name, values, True)}'


class _Literal:
    """A quoted literal with ``<dtml-var name sql_quote>`` inside it: one
    bound string, made of the literal's text and the values."""

    def __init__(self, pieces, bind):
        self.pieces = pieces  # str, or (argument,) for a value
        self.name = bind

    def render(self, r):
        parts = []
        for piece in self.pieces:
            if isinstance(piece, str):
                parts.append(piece)
                continue
            value = r.get(piece[0])
            if value is ABSENT:
                if r.skeleton:
                    continue
                r.fail(TypeError, piece[0], 'is missing')
            parts.append(_convert(r, piece[0], 'string', value))
        return r.bind(self.name, ''.join(parts))


def _render_all(nodes, r):
    return ''.join(node.render(r) for node in nodes)


def _only_comments(part):
    return ('--' in part or '/*' in part) and not analysis.blank(part).strip()


class _Group:
    """``<dtml-sqlgroup [where] [set] [required] [noparens]>`` with
    ``<dtml-and>``, ``<dtml-or>`` and ``<dtml-comma>`` between parts:
    the parts that are not blank, joined."""

    JOIN = {'and': 'AND', 'or': 'OR', 'comma': ','}
    FLAGS = ('where', 'set', 'required', 'noparens')

    def __init__(self, flags, line):
        self.flags = flags
        self.line = line
        self.blocks = [(None, [])]  # (joiner, nodes)

    def render(self, r):
        parts = []
        for joiner, nodes in self.blocks:
            part = _render_all(nodes, r).strip()
            if part and not _only_comments(part):
                if parts:
                    parts.append(self.JOIN[joiner])
                parts.append(part)
        if not parts:
            if 'required' in self.flags:
                raise ValueError(
                    f'ZSQL method {r.method}(): the <dtml-sqlgroup required> '
                    f'of line {self.line} needs at least one of its tests'
                )
            return ''
        # One part a line, as Zope wrote them: a part's -- comment ends
        # with its line, not swallowing the parts after it.
        sql = '\n'.join(parts)
        if len(parts) > 1 and 'noparens' not in self.flags:
            sql = f'({sql}\n)'
        for word in ('set', 'where'):
            if word in self.flags:
                sql = f'{word.upper()}\n{sql}'
        return sql + '\n'


class _If:
    """``<dtml-if name>`` (``<dtml-elif name>``, ``<dtml-else>``) and
    ``<dtml-unless name>``: a part kept when an argument is true (false)."""

    def __init__(self, arg, negate):
        self.branches = [(arg, negate, [])]

    def choices(self):
        """How many texts it can render: a branch each, or none."""
        return len(self.branches) + (self.branches[-1][0] is not None)

    def render(self, r):
        if r.skeleton:
            choice = r.choices.get(self)
            if choice is None:
                return ' '.join(_render_all(n, r) for _, _, n in self.branches)
            if choice == len(self.branches):
                return ''
            return _render_all(self.branches[choice][2], r)
        for arg, negate, nodes in self.branches:
            value = r.get(arg) if arg else True
            if arg is None or bool(value and value is not ABSENT) != negate:
                return _render_all(nodes, r)
        return ''


def _ifs(nodes):
    """Every ``<dtml-if>`` among ``nodes``, those inside them included."""
    for node in nodes:
        if isinstance(node, _If):
            yield node
            for _, _, branch in node.branches:
                yield from _ifs(branch)
        elif isinstance(node, _Group):
            for _, block in node.blocks:
                yield from _ifs(block)


#: Texts a template's ``<dtml-if>`` choices may render that are each read
#: for tables (and checked) when it loads; past this many, a read is
#: invalidated by any write, and a write invalidates everything.
MAX_VARIANTS = 64

_LITERAL_PART = re.compile(r"''|'|</?dtml-[^>]*>", re.IGNORECASE)
_COMMENT_END = re.compile(r'</dtml-comment\s*>', re.IGNORECASE)
_COLUMN = re.compile(r'[\w.$"`\[\]]+')


class _Parser:
    """Reads a template into nodes; every error names the source and the
    line of the tag at fault."""

    def __init__(self, source, where, first_line, arguments):
        self.source = source
        self.where = where
        self.first_line = first_line
        self.arguments = arguments
        self.lists = set()
        #: Each bound value's line and tag, for errors found later.
        self.tags = {}
        self._names = set()
        self.root = []
        self.nodes = self.root  # where the next node goes
        self.stack = []  # [tag, node, nodes] of each open block

    def line(self, pos):
        return self.source.count('\n', 0, pos) + self.first_line

    def error(self, pos, message):
        return SQLFileError(f'{self.where}:{self.line(pos)}: {message}')

    def parse(self):
        source, pos = self.source, 0
        while True:
            match = _SCAN.search(source, pos)
            end = match.start() if match else len(source)
            if end > pos:
                self.nodes.append(_Text(source[pos:end]))
            if match is None:
                break
            pos = match.end()
            if match.group('comment') is not None:
                self._comment(match)
                self.nodes.append(_Text(match.group('comment')))
            elif match.group('region'):
                pos = self._region(match)
            elif match.group('quote'):
                pos = self._literal(match.start())
            elif match.group('other'):
                raise self.error(
                    match.start(),
                    f'{match.group("other").strip()} is not supported: '
                    'write DTML as <dtml-...> tags',
                )
            else:
                tag, attrs = self._attrs(match)
                if tag == 'comment' and not match.group('close'):
                    comment_end = _COMMENT_END.search(source, pos)
                    if comment_end is None:
                        raise self.error(
                            match.start(), '<dtml-comment> is not closed'
                        )
                    pos = comment_end.end()  # nothing of it is rendered
                else:
                    self._tag(match, tag, attrs)
        if self.stack:
            tag, node, _ = self.stack[-1]
            raise self.error(
                node.start, f'<dtml-{tag}> is not closed (no </dtml-{tag}>)'
            )
        return self.root

    def _bind_name(self, arg, match):
        # The argument's own name for its first use; then arg_2, arg_3...,
        # never the name of another argument.
        name, n = arg, 1
        while name in self._names or (n > 1 and name in self.arguments):
            n += 1
            name = f'{arg}_{n}'
        self._names.add(name)
        self.tags[name] = (self.line(match.start()), match.group(0))
        return name

    def _inside(self, start, region, what):
        """Refuse a DTML tag in ``region`` (which begins at ``start``): a
        value there would not be a parameter."""
        tag = _TAG.search(region)
        if tag:
            where, advice = _REGIONS[what]
            raise self.error(
                start + tag.start(),
                f'<{tag.group(0)[1:]}> inside {where}, where a value would '
                f'not be a bound parameter{advice}',
            )

    def _comment(self, match):
        """A ``--`` or ``#`` comment, to the end of the line."""
        comment = match.group('comment')
        kind = '#' if comment[0] == '#' else '--'
        self._inside(match.start(), comment, kind)
        if kind == '#':
            # PostgreSQL reads # as an operator: a quote after it starts
            # a string there, and a comment in MySQL. Either reading must
            # give one statement.
            quote = re.search(
                r"""['"`]|/\*|(?<![\w$])\$(?:[^\W\d]\w*)?\$""", comment
            )
            if quote:
                raise self.error(
                    match.start(),
                    f'{quote.group(0)} after # on a line: MySQL reads # as '
                    'a comment to the end of the line, PostgreSQL does not; '
                    'write the comment as -- ...',
                )

    def _region(self, match):
        """A ``/* */`` comment, a ``"`` or backquoted name, a ``$$``
        string: text, holding no tag. Returns its end."""
        start, opener = match.start(), match.group(0)
        what = opener if opener in _CLOSED else '$'
        if re.match(r'/\*M?!', self.source[start:]):
            raise self.error(
                start,
                "MySQL's executable comments (/*! ... */) are not "
                'supported: write the SQL as SQL',
            )
        closed = _CLOSED.get(opener) or re.compile(
            rf'{re.escape(opener)}.*?{re.escape(opener)}', re.DOTALL
        )
        found = closed.match(self.source, start)
        if found is None:
            raise self.error(start, f'{opener} ... is not closed')
        region = found.group(0)
        self._inside(start, region, what)
        if what == '/*' and '/*' in region[2:]:
            raise self.error(
                start,
                '/* inside a /* */ comment: PostgreSQL nests comments, '
                'MySQL does not',
            )
        if what == '"' and '\\"' in region:
            raise self.error(
                start,
                'a backslash before a " inside double quotes: MySQL reads '
                'it as an escape, standard SQL does not (write \'\' or "")',
            )
        self.nodes.append(_Text(region))
        return found.end()

    def _literal(self, start):
        """A quoted literal from ``start``, as text, or as one bound value
        when it holds ``<dtml-var name sql_quote>``; returns its end."""
        source, first = self.source, None
        pieces, chars, pos = [], [], start + 1
        while True:
            match = _LITERAL_PART.search(source, pos)
            if match is None:
                raise self.error(start, 'a quoted literal is not closed')
            chars.append(source[pos : match.start()])
            pos = match.end()
            if match.group(0)[0] == "'" and source[match.start() - 1] == '\\':
                raise self.error(
                    match.start(),
                    'a backslash before a quote inside a quoted literal: '
                    'MySQL reads it as an escape, standard SQL does not; '
                    "write a quote as ''",
                )
            if match.group(0) == "''":
                chars.append("'")
            elif match.group(0) == "'":
                break
            else:
                tag_match = _SCAN.match(source, match.start())
                if tag_match is None:
                    raise self.error(
                        match.start(), 'a DTML tag with an unbalanced quote'
                    )
                tag, attrs = self._attrs(tag_match)
                if tag != 'var' or match.group(0).startswith('</'):
                    raise self.error(
                        match.start(),
                        f'<dtml-{tag}> inside a quoted literal is not '
                        "supported: only '<dtml-var name sql_quote>' is",
                    )
                pieces += [''.join(chars), (self._var(match, attrs),)]
                chars = []
                first = first or match
        pieces.append(''.join(chars))
        if len(pieces) == 1:
            self.nodes.append(_Text(source[start:pos]))
            return pos
        if re.match(r'\w', source[start - 1 : start]):
            raise self.error(
                start,
                f"a prefixed literal ({source[start - 1]}'...') holding "
                '<dtml-var>: the literal is bound as one string; drop the '
                'prefix',
            )
        name = self._bind_name(pieces[1][0], first)
        self.nodes.append(_Literal([p for p in pieces if p != ''], name))
        return pos

    def _attrs(self, match):
        """The tag's name, lower case, and its attributes (a flag is
        ``True``); a first bare word is the ``name``."""
        tag = match.group('name').lower()
        attrs = {}
        for attr in _ATTR.finditer(match.group('args')):
            if attr.group('expr') is not None:
                raise self.error(
                    match.start(),
                    f'<dtml-{tag}>: expressions ({attr.group("expr")}) are '
                    'not supported: name an argument',
                )
            key = attr.group('key')
            value = next(
                (v for v in attr.group('dq', 'sq', 'bare') if v is not None),
                True,
            )
            if not attrs and value is True and tag != 'sqlgroup':
                key, value = 'name', key
            if key.lower() in attrs:
                raise self.error(
                    match.start(), f'<dtml-{tag}>: {key} is given twice'
                )
            attrs[key.lower()] = value
        return tag, attrs

    def _check(self, match, tag, attrs, allowed):
        unknown = sorted(set(attrs) - set(allowed))
        if unknown:
            raise self.error(
                match.start(),
                f'<dtml-{tag}>: attribute {unknown[0]!r} is not supported '
                f'(accepted: {", ".join(allowed) or "none"})',
            )

    def _argument(self, match, tag, attrs):
        arg = attrs.get('name')
        if not isinstance(arg, str):
            raise self.error(match.start(), f'<dtml-{tag}> names no argument')
        if arg not in self.arguments:
            close = difflib.get_close_matches(arg, self.arguments, n=1)
            hint = f' (did you mean {close[0]!r}?)' if close else ''
            declared = ', '.join(self.arguments) or 'none'
            raise self.error(
                match.start(),
                f"<dtml-{tag}> names {arg!r}, which is not in the header's "
                f'arguments{hint} (declared: {declared})',
            )
        return arg

    def _type(self, match, tag, attrs):
        kind = attrs.get('type')
        if kind not in TYPES:
            raise self.error(
                match.start(),
                f'<dtml-{tag}>: type={kind!r} is not one of {", ".join(TYPES)}'
                if isinstance(kind, str)
                else f'<dtml-{tag}> needs a type: one of {", ".join(TYPES)}',
            )
        return kind

    def _var(self, match, attrs):
        """The argument of a ``<dtml-var name sql_quote>``."""
        if attrs.get('name') == 'sql_delimiter':
            raise self.error(
                match.start(),
                '<dtml-var sql_delimiter>: write one statement per method',
            )
        if 'sql_quote' not in attrs:
            raise self.error(
                match.start(),
                '<dtml-var> without sql_quote formats a value into the SQL '
                'text, which is not supported: use <dtml-sqlvar name '
                'type=...>, a bound value',
            )
        self._check(match, 'var', attrs, ('name', 'sql_quote'))
        return self._argument(match, 'var', attrs)

    def _tag(self, match, tag, attrs):
        opener = self.stack[-1][0] if self.stack else None
        if tag not in SUPPORTED:
            raise self.error(
                match.start(),
                f'<{match.group("close")}dtml-{tag}> is not supported in a '
                f'.zsql file (supported: {", ".join(SUPPORTED)})',
            )
        if match.group('close'):
            if tag != opener:
                raise self.error(
                    match.start(),
                    f'</dtml-{tag}> closes no <dtml-{tag}>'
                    + (f' (<dtml-{opener}> is open)' if opener else ''),
                )
            self.stack.pop()
            self.nodes = self.stack[-1][2] if self.stack else self.root
        elif tag in ('and', 'or', 'comma', 'elif', 'else'):
            self._continue(match, tag, attrs, opener)
        else:
            self._open(match, tag, attrs)

    def _continue(self, match, tag, attrs, opener):
        """``<dtml-and>`` and its kin; ``<dtml-elif>``, ``<dtml-else>``."""
        block = 'sqlgroup' if tag in ('and', 'or', 'comma') else 'if'
        if opener != block:
            raise self.error(
                match.start(), f'<dtml-{tag}> outside a <dtml-{block}>'
            )
        node, nodes = self.stack[-1][1], []
        if block == 'sqlgroup':
            self._check(match, tag, attrs, ())
            node.blocks.append((tag, nodes))
        else:
            if node.branches[-1][0] is None:
                raise self.error(
                    match.start(), f'<dtml-{tag}> after <dtml-else>'
                )
            self._check(match, tag, attrs, ('name',) if tag == 'elif' else ())
            arg = self._argument(match, tag, attrs) if tag == 'elif' else None
            node.branches.append((arg, False, nodes))
        self.stack[-1][2] = self.nodes = nodes

    def _open(self, match, tag, attrs):
        if tag == 'sqlvar':
            self._check(match, tag, attrs, ('name', 'type', 'optional'))
            arg = self._argument(match, tag, attrs)
            kind = self._type(match, tag, attrs)
            node = _SQLVar(
                arg, kind, 'optional' in attrs, self._bind_name(arg, match)
            )
        elif tag == 'sqltest':
            node = self._sqltest(match, attrs)
        elif tag == 'var':
            arg = self._var(match, attrs)
            # Zope formatted the quoted text in: a name, a keyword, a
            # number. Bound, it would be a string (ORDER BY 'price').
            raise self.error(
                match.start(),
                f'<dtml-var {arg} sql_quote> outside quotes is not '
                'supported: its text would be bound as a string, not read '
                f'as SQL; write <dtml-sqlvar {arg} type=...> for a value, '
                f"'<dtml-var {arg} sql_quote>' for a string, or "
                f'<dtml-if> for a choice of SQL',
            )
        elif tag == 'sqlgroup':
            self._check(match, tag, attrs, _Group.FLAGS)
            node = _Group(frozenset(attrs), self.line(match.start()))
            self._push(tag, node, match, node.blocks[0][1])
            return
        else:  # if, unless
            self._check(match, tag, attrs, ('name',))
            node = _If(self._argument(match, tag, attrs), tag == 'unless')
            self._push(tag, node, match, node.branches[0][2])
            return
        self.nodes.append(node)

    def _push(self, tag, node, match, nodes):
        node.start = match.start()
        self.nodes.append(node)
        self.stack.append([tag, node, nodes])
        self.nodes = nodes

    def _sqltest(self, match, attrs):
        allowed = ('name', 'type', 'column', 'op', 'optional', 'multiple')
        self._check(match, 'sqltest', attrs, allowed)
        arg = self._argument(match, 'sqltest', attrs)
        kind = self._type(match, 'sqltest', attrs)
        column = attrs.get('column', arg)
        if not (isinstance(column, str) and _COLUMN.fullmatch(column)):
            raise self.error(
                match.start(),
                f'<dtml-sqltest>: column={column!r} is not a column name',
            )
        op = attrs.get('op', '=')
        if not (isinstance(op, str) and op.lower() in OPERATORS):
            raise self.error(
                match.start(),
                f'<dtml-sqltest>: op={op!r} is not one of '
                f'{", ".join(OPERATORS)}',
            )
        if 'multiple' in attrs:
            self.lists.add(arg)
        return _SQLTest(
            arg, kind, column, OPERATORS[op.lower()], 'optional' in attrs,
            'multiple' in attrs, self._bind_name(arg, match),
        )  # fmt: skip


_ARGUMENT = re.compile(
    r"""\s*(?P<name>[^\s:=]+)(?P<types>(?::[^\s:=]*)*)
        (?:=(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)'|(?P<bare>[^\s"']*)))?""",
    re.VERBOSE,
)


def parse_arguments(spec):
    """Zope's ``arguments``: ``name``, ``name:type``, ``name=default``,
    ``name:type="a default"``, separated by white space. Returns a dict
    of each name to its default (:data:`ABSENT` if none); the ``:type``
    parts are Zope's form conversions, read and left aside."""
    arguments = {}
    pos, spec = 0, spec.strip()
    while pos < len(spec):
        match = _ARGUMENT.match(spec, pos)
        name = match.group('name') if match else spec[pos:].split()[0]
        if match is None or not name.isidentifier():
            raise ValueError(
                f'argument {name!r} is not a Python identifier (arguments '
                'are written name, name:type or name="default")'
            )
        if name in arguments:
            raise ValueError(f'argument {name!r} is declared twice')
        arguments[name] = next(
            (v for v in match.group('dq', 'sq', 'bare') if v is not None),
            ABSENT,
        )
        pos = match.end()
    return arguments


class ZSQLMethod(SQLMethod):
    """A SQL method whose statement is a ZSQL (DTML) template.

    ``arguments`` are the names the template may use, as a dict of name to
    default (:data:`ABSENT` for none), a list of names, or Zope's string
    (``'area min_rent:int=0'``, see :func:`parse_arguments`). An argument
    with no default that a call leaves out makes the tags that use it
    optional: such a tag marked ``optional`` drops out (``sqltest``) or
    binds ``NULL`` (``sqlvar``); one not so marked is a :class:`TypeError`.
    The other keywords are :class:`~pyramid_dbtune.SQLMethod`'s; tables and
    ``writes`` are read from each text the template's ``<dtml-if>``
    choices render, every optional part present (up to
    :data:`MAX_VARIANTS` texts; past that, a read is invalidated by any
    write and a write invalidates everything). ``where`` names the
    template in errors (a file's path).
    """

    def __init__(
        self,
        name,
        template,
        *,
        arguments=(),
        where=None,
        first_line=1,
        **kw,
    ):
        if isinstance(arguments, str):
            arguments = parse_arguments(arguments)
        elif not isinstance(arguments, dict):
            arguments = dict.fromkeys(arguments, ABSENT)
        for argument in arguments:
            # As parse_arguments checks a string's.
            if not (isinstance(argument, str) and argument.isidentifier()):
                raise ValueError(
                    f'ZSQL method {name!r}: argument {argument!r} is not a '
                    'Python identifier'
                )
        self.where = where = where or f'<ZSQL method {name}>'
        if not isinstance(template, str):
            raise ValueError(f'ZSQL method {name!r}: template must be text')
        body = template.strip().rstrip(';').rstrip()
        first_line += template[: len(template) - len(template.lstrip())].count(
            '\n'
        )
        parser = _Parser(body, where, first_line, list(arguments))
        self.nodes = parser.parse()
        self._tags = parser.tags
        self.name = name
        self._variants, self._glued = self._skeletons()
        for sql, names in self._variants.items():
            self._check(sql, names, SQLFileError)
        super().__init__(name, next(iter(self._variants)), **kw)
        self.sql = body
        self.arguments = arguments
        self.params = tuple(arguments)
        self._param_set = frozenset(self.params)
        self.list_params = frozenset(parser.lists)
        self._defaults = tuple(arguments.items())
        #: One compiled statement per text rendered (its shape). Finite:
        #: values are bound, so only the template's choices vary the text.
        self._statements = {}
        self._texts = {}

    def _skeletons(self):
        """The texts the template renders, each ``<dtml-if>`` choice
        made (up to :data:`MAX_VARIANTS`), with the names each binds;
        and, past that many, every branch glued into one text, else
        None."""
        ifs = list(dict.fromkeys(_ifs(self.nodes)))
        choices = [range(node.choices()) for node in ifs]
        variants = {}
        for chosen in itertools.islice(
            itertools.product(*choices), MAX_VARIANTS
        ):
            render = _Render(
                self.name, {}, dict(zip(ifs, chosen, strict=True))
            )
            sql = _render_all(self.nodes, render).strip()
            variants.setdefault(_place(sql, render.expanding), render.binds)
        glued = None
        if math.prod(len(c) for c in choices) > MAX_VARIANTS:
            render = _Render(self.name, {}, {})
            glued = _render_all(self.nodes, render).strip()
            glued = _place(glued, render.expanding)
        return variants, glued

    def _analyse(self, sql):
        if self._glued is None:
            return analysis.analyse_any(self._variants)
        # Too many texts to read each: whether it writes, from them and
        # every branch at once; which tables, not told.
        writes, _ = analysis.analyse_any([*self._variants, self._glued])
        return (True, None) if writes else (False, frozenset([ANY_TABLE]))

    def _check(self, sql, names, error):
        """Refuse a text where a value would not be a bound parameter:
        glued to a name, or inside a string or a comment as a database
        reads it (the template's tags put it next to one)."""
        if ';' in analysis.blank(sql):
            raise error(
                f'{self.where}: SQL method {self.name!r} holds more than one '
                'statement; write one method per statement'
            )
        hidden = analysis.hidden_parameters(sql, names)
        for name, reading in hidden.items():
            line, tag = self._tags[name]
            where = (
                'glued to the text before it: a value cannot be part of a '
                'name or a word'
                if reading is None
                else f'inside a string, a quoted name or a comment as '
                f'{reading} reads the statement'
            )
            raise error(
                f'{self.where}:{line}: {tag}: the value would not be a '
                f'bound parameter, {where}: {" ".join(sql.split())}'
            )

    def __repr__(self):
        kind = 'write' if self.writes else 'read'
        return f'<ZSQLMethod {self.name} ({kind})>'

    def _render(self, params):
        self.check_names(params)
        render = _Render(
            self.name, {n: params.get(n, d) for n, d in self._defaults}
        )
        sql = _render_all(self.nodes, render).strip()
        return self._texts.setdefault(sql, sql), render

    def values(self, params):
        """What a call runs: the text the template renders for
        ``params`` and the values it binds, converted as its tags say.
        Calls that bind the same values to the same text share a cache
        entry; an argument only tested by ``<dtml-if>`` is in it only as
        the text it chose."""
        sql, render = self._render(params)
        return (sql, *render.binds.values())

    def check_names(self, params):
        if not self._param_set.issuperset(params):
            raise self._argument_error(params)

    def _argument_error(self, params):
        # Any argument may be left out; only an unknown one is an error.
        extra = sorted(set(params) - self._param_set)
        return TypeError(
            f'ZSQL method {self.name}() got an unexpected argument '
            f'{extra[0]!r}; it takes: {self._signature()}'
        )

    def bind(self, params):
        """Render the statement for ``params``; return it and its bound
        values. Raises :class:`TypeError` for an unknown or missing
        argument and :class:`ValueError` for a value its tag refuses, or
        for a text whose values would not be bound parameters."""
        sql, render = self._render(params)
        statement = self._statements.get(sql)
        if statement is None:
            placed = _place(sql, render.expanding)
            self._check(placed, render.binds, ValueError)
            statement = text(placed)
            if render.expanding:
                statement = statement.bindparams(
                    *(bindparam(n, expanding=True) for n in render.expanding)
                )
            self._statements[sql] = statement
        return statement, render.binds


def _count(value):
    number = int(value)
    if number < 0:
        raise ValueError(value)
    return number


def _seconds(value):
    number = float(value)
    if not 0 <= number < float('inf'):
        raise ValueError(value)
    return int(number) if number.is_integer() else number


def _tables(value):
    if not value.replace(',', ' ').split():
        raise ValueError(value)
    return value


#: The header keys of a ``.zsql`` file, how each is read, what it takes.
_ZSQL_KEYS = {
    'title': (str, 'text'),
    'connection_id': (str, 'a name'),
    'arguments': (parse_arguments, 'arguments'),
    'max_rows': (_count, 'a whole number, 0 or more'),
    'max_cache': (_count, 'a whole number, 0 or more'),
    'cache_time': (_seconds, 'a number of seconds, 0 or more'),
    'tables': (_tables, 'table names, separated by commas'),
    'writes': (_yes_no, 'true or false'),
    'invalidate': (_yes_no, 'true or false'),
}
#: Zope keys that change what a call returns or where it runs, which this
#: package does not do: an error when set, never silently dropped.
_UNSUPPORTED_KEYS = {
    'class_name': 'result classes ("brains") are not supported',
    'class_file': 'result classes ("brains") are not supported',
    'connection_hook': 'the database is chosen by dbtune.url and '
    'dbtune.read_urls, not per method',
}
_HEADER = re.compile(
    r'\A(?P<lead>\s*)<dtml-comment\s*>(?P<block>.*?)</dtml-comment\s*>',
    re.DOTALL | re.IGNORECASE,
)
_HEADER_LINE = re.compile(r'^\s*([A-Za-z_][\w -]*?)\s*:(.*)$')
#: Header keys kept on the method as attributes, for the record.
_KEPT = ('title', 'connection_id', 'max_cache')


def _read_header(path, block, first_line):
    """The header's keys, read; raises :class:`SQLFileError`."""
    found, last = {}, None
    for number, line in enumerate(block.splitlines(), first_line):
        match = _HEADER_LINE.match(line)
        if last == 'arguments' and line[:1].isspace() and line.strip():
            found['arguments'] = (found['arguments'][0] + ' ' + line, number)
            continue
        last = None
        if match is None:
            continue
        key = header_key(match.group(1))
        if key in _UNSUPPORTED_KEYS:
            if match.group(2).strip():
                raise SQLFileError(
                    f'{path}:{number}: {key}: {_UNSUPPORTED_KEYS[key]}'
                )
            continue
        if key not in _ZSQL_KEYS:
            check_unknown_key(path, number, key, _ZSQL_KEYS)
            continue
        found[key] = (match.group(2).strip(), number)
        last = key
    options = {}
    for key, (value, number) in found.items():
        convert, accepted = _ZSQL_KEYS[key]
        try:
            options[key] = convert(value)
        except ValueError as exc:
            detail = f' ({exc})' if key == 'arguments' else ''
            raise SQLFileError(
                f'{path}:{number}: {key} = {value!r} is not {accepted}{detail}'
            ) from None
    return options


def load_zsql_file(path, **overrides):
    """Read a Zope ``.zsql`` file into a :class:`ZSQLMethod`.

    The file may begin with a ``<dtml-comment>`` header of ``key: value``
    lines: ``arguments`` (an indented line after it continues it),
    ``max_rows``, ``cache_time``, and, beyond Zope's, ``tables``,
    ``writes`` and ``invalidate`` as in a ``.sql`` file; ``title``,
    ``connection_id`` and ``max_cache`` are read and kept (one cache
    bounds every method). The method is named after the file. Raises
    :class:`SQLFileError` naming the file and the line. ``overrides``
    (``name`` and the keywords of :class:`~pyramid_dbtune.SQLMethod`) win
    over the header.
    """
    path = Path(path)
    source = read_source(path)
    header = _HEADER.match(source)
    options, first_line = {}, 1
    if header:
        lead = header.group('lead').count('\n')
        options = _read_header(path, header.group('block'), lead + 1)
        first_line = header.group(0).count('\n') + 1
        source = source[header.end() :]
    info = {k: options.pop(k, None) for k in _KEPT}
    options.update(overrides)
    try:
        method = ZSQLMethod(
            options.pop('name', path.stem),
            source,
            arguments=options.pop('arguments', {}),
            where=str(path),
            first_line=first_line,
            **options,
        )
    except SQLFileError:
        raise
    except ValueError as exc:
        raise SQLFileError(f'{path}: {exc}') from None
    for key, value in info.items():
        setattr(method, key, value)
    return method


#: How each kind of SQL file is read, by its ending.
LOADERS = {'.sql': load_sql_file, '.zsql': load_zsql_file}


def load_file(path, **overrides):
    """Read a ``.sql`` or ``.zsql`` file into a SQL method."""
    path = Path(path)
    try:
        load = LOADERS[path.suffix.lower()]
    except KeyError:
        raise SQLFileError(
            f'{path}: a SQL file ends in .sql or .zsql'
        ) from None
    return load(path, **overrides)
