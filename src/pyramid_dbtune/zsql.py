"""Zope's ZSQL Method files (``.zsql``), read into SQL methods.

A ``.zsql`` file is a ``<dtml-comment>`` header (``connection_id``,
``arguments``, ``max_rows``, ``max_cache``, ``cache_time``) and a statement
written with DTML's SQL tags. Every value the tags insert becomes a bound
parameter: nothing a caller passes is ever formatted into the statement's
text, whatever the tag (``<dtml-var name sql_quote>`` included).

Optional tests, ``<dtml-sqlgroup>`` and ``<dtml-if>`` make the statement's
text depend on which arguments are given. A :class:`ZSQLMethod` renders
that text on each call that reaches the database and keeps one compiled
statement per text. Its cache key is every declared argument's value, an
argument not given included (as :data:`ABSENT`), so two calls that render
different statements never share cached rows.

A tag, an attribute or a form (a Python expression) that this module does
not translate is an error when the file is loaded, naming the file, the
line and the tag: a template is never run half-understood.
"""

import difflib
import re
from pathlib import Path

from sqlalchemy import bindparam, text

from .sqlmethod import (
    _SCALARS,
    SQLFileError,
    SQLMethod,
    _yes_no,
    check_unknown_key,
    load_sql_file,
)


class _Absent:
    """The value of an argument that was not given (in cache keys)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self):
        return '<absent>'

    def __reduce__(self):
        return (_Absent, ())


#: Stands for an argument not given, in a ZSQL method's cache key.
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

# A tag, a quote (a string literal starts), or a DTML form not translated.
_SCAN = re.compile(
    r"""(?P<tag><(?P<close>/?)dtml-(?P<name>[\w.-]*)
          (?P<args>(?:[^>"']|"[^"]*"|'[^']*')*)>)
      | (?P<comment>--[^\n]*)
      | (?P<quote>')
      | (?P<other><!--\#\s*[\w.-]*|&dtml[\w.-]*;?)""",
    re.VERBOSE | re.IGNORECASE,
)
_ATTR = re.compile(
    r"""\s*(?P<key>[^\s="']+)(?:\s*=\s*(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)'
        |(?P<bare>[^\s"']+)))?|\s*(?P<expr>"[^"]*")""",
    re.VERBOSE,
)
# A ':' that SQLAlchemy's text() would take for a parameter.
_COLON = re.compile(r'(?<![:\w\\]):(?=\w)')


class _Render:
    """One call's rendering: the text, the bound values, the lists."""

    def __init__(self, method, args, skeleton=False):
        self.method = method
        self.args = args
        #: Render every branch, every optional part present: the text that
        #: tells which tables the method reads or writes.
        self.skeleton = skeleton
        self.binds = {}
        self.expanding = set()

    def get(self, arg):
        return self.args.get(arg, ABSENT)

    def bind(self, name, value, expanding=False):
        self.binds[name] = value
        if expanding:
            self.expanding.add(name)
        return f':{name}'

    def fail(self, exc_type, arg, what):
        raise exc_type(f'ZSQL method {self.method}(): argument {arg!r} {what}')


_NUMBERS = {'int': (int, 'an integer'), 'float': (float, 'a number')}


def _convert(render, arg, kind, value):
    """``value`` as the tag's ``type`` says, as Zope's tags checked it."""
    if kind in _NUMBERS:
        number, noun = _NUMBERS[kind]
        try:
            if isinstance(value, str | bytes):
                return number(value.strip())
            if isinstance(value, int | float) and not isinstance(value, bool):
                return number(value)
        except ValueError:
            pass
        render.fail(ValueError, arg, f'must be {noun}, not {value!r}')
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
        values = list(value) if isinstance(value, list | tuple) else [value]
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


class _Var:
    """``<dtml-var name sql_quote>`` outside quotes: the value, bound."""

    def __init__(self, arg, bind):
        self.arg, self.name = arg, bind

    def render(self, r):
        value = r.get(self.arg)
        if value is ABSENT and not r.skeleton:
            r.fail(TypeError, self.arg, 'is missing')
        if value is not ABSENT and not isinstance(value, _SCALARS):
            r.fail(ValueError, self.arg, f'cannot be bound: {value!r}')
        return r.bind(self.name, None if r.skeleton else value)


class _Literal:
    """A quoted literal with ``<dtml-var name sql_quote>`` inside it: one
    bound string, made of the literal's text and the values."""

    def __init__(self, pieces, bind):
        self.pieces = pieces  # str, or _Var for a value
        self.name = bind

    def render(self, r):
        parts = []
        for piece in self.pieces:
            if isinstance(piece, str):
                parts.append(piece)
                continue
            value = r.get(piece.arg)
            if value is ABSENT:
                if r.skeleton:
                    continue
                r.fail(TypeError, piece.arg, 'is missing')
            parts.append(_convert(r, piece.arg, 'string', value))
        return r.bind(self.name, ''.join(parts))


def _render_all(nodes, r):
    return ''.join(node.render(r) for node in nodes)


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
            if part:
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
        sql = ' '.join(parts)
        if len(parts) > 1 and 'noparens' not in self.flags:
            sql = f'({sql})'
        for word in ('set', 'where'):
            if word in self.flags:
                sql = f'{word.upper()} {sql}'
        return sql + ' '


class _If:
    """``<dtml-if name>`` (``<dtml-elif name>``, ``<dtml-else>``) and
    ``<dtml-unless name>``: a part kept when an argument is true (false)."""

    def __init__(self, arg, negate):
        self.branches = [(arg, negate, [])]

    def render(self, r):
        if r.skeleton:
            return ' '.join(_render_all(n, r) for _, _, n in self.branches)
        for arg, negate, nodes in self.branches:
            value = r.get(arg) if arg else True
            if arg is None or bool(value and value is not ABSENT) != negate:
                return _render_all(nodes, r)
        return ''


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
                self.nodes.append(_Text(match.group('comment')))
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

    def _bind_name(self, arg):
        # The argument's own name for its first use; then arg_2, arg_3...,
        # never the name of another argument.
        name, n = arg, 1
        while name in self._names or (n > 1 and name in self.arguments):
            n += 1
            name = f'{arg}_{n}'
        self._names.add(name)
        return name

    def _literal(self, start):
        """A quoted literal from ``start``, as text, or as one bound value
        when it holds ``<dtml-var name sql_quote>``; returns its end."""
        source = self.source
        pieces, chars, pos = [], [], start + 1
        while True:
            match = _LITERAL_PART.search(source, pos)
            if match is None:
                raise self.error(start, 'a quoted literal is not closed')
            chars.append(source[pos : match.start()])
            pos = match.end()
            if match.group(0) == "''":
                chars.append("'")
            elif match.group(0) == "'":
                break
            else:
                tag, attrs = self._attrs(_SCAN.match(source, match.start()))
                if tag != 'var' or match.group(0).startswith('</'):
                    raise self.error(
                        match.start(),
                        f'<dtml-{tag}> inside a quoted literal is not '
                        "supported: only '<dtml-var name sql_quote>' is",
                    )
                pieces += [''.join(chars), _Var(self._var(match, attrs), '')]
                chars = []
        pieces.append(''.join(chars))
        if len(pieces) == 1:
            self.nodes.append(_Text(source[start:pos]))
        else:
            name = self._bind_name(pieces[1].arg)
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
                arg, kind, 'optional' in attrs, self._bind_name(arg)
            )
        elif tag == 'sqltest':
            node = self._sqltest(match, attrs)
        elif tag == 'var':
            before = self.nodes[-1].text if self.nodes else ''
            if isinstance(before, str) and before.endswith('"'):
                raise self.error(
                    match.start(),
                    '<dtml-var name sql_quote> inside double quotes: quote '
                    'it with single quotes',
                )
            arg = self._var(match, attrs)
            node = _Var(arg, self._bind_name(arg))
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
            'multiple' in attrs, self._bind_name(arg),
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
    ``writes`` are read from the template with every part present.
    ``where`` names the template in errors (a file's path).
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
        where = where or f'<ZSQL method {name}>'
        if not isinstance(template, str):
            raise ValueError(f'ZSQL method {name!r}: template must be text')
        body = template.strip().rstrip(';').rstrip()
        first_line += template[: len(template) - len(template.lstrip())].count(
            '\n'
        )
        parser = _Parser(body, where, first_line, list(arguments))
        self.nodes = parser.parse()
        skeleton = _render_all(self.nodes, _Render(name, {}, skeleton=True))
        super().__init__(name, skeleton, **kw)
        self.sql = body
        self.arguments = arguments
        self.params = tuple(arguments)
        self._param_set = frozenset(self.params)
        self.list_params = frozenset(parser.lists)
        self._defaults = tuple(arguments.items())
        #: One compiled statement per text rendered (its shape). Finite:
        #: values are bound, so only the template's choices vary the text.
        self._statements = {}

    def __repr__(self):
        kind = 'write' if self.writes else 'read'
        return f'<ZSQLMethod {self.name} ({kind})>'

    def values(self, params):
        """Every argument's value, default or :data:`ABSENT` where not
        given: the shape of the statement is in the cache key."""
        if not self._param_set.issuperset(params):
            raise self._argument_error(params)
        return tuple([params.get(n, default) for n, default in self._defaults])

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
        argument and :class:`ValueError` for a value its tag refuses."""
        render = _Render(
            self.name, dict(zip(self.params, self.values(params), strict=True))
        )
        sql = _render_all(self.nodes, render).strip()
        shape = (sql, frozenset(render.expanding))
        statement = self._statements.get(shape)
        if statement is None:
            statement = text(sql)
            if render.expanding:
                statement = statement.bindparams(
                    *(bindparam(n, expanding=True) for n in render.expanding)
                )
            self._statements[shape] = statement
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
        key = re.sub(r'[\s-]+', '_', match.group(1).lower())
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
    ``max_rows``, ``cache_time``, and, beyond Zope's, ``tables`` and
    ``writes`` as in a ``.sql`` file; ``title``, ``connection_id`` and
    ``max_cache`` are read and kept (one cache bounds every method). The
    method is named after the file. Raises :class:`SQLFileError` naming
    the file and the line. ``overrides`` (``name`` and the keywords of
    :class:`~pyramid_dbtune.SQLMethod`) win over the header.
    """
    path = Path(path)
    try:
        source = path.read_text(encoding='utf-8-sig')
    except UnicodeDecodeError as exc:
        raise SQLFileError(f'{path}: not UTF-8 text ({exc})') from None
    header = _HEADER.match(source)
    options, first_line = {}, 1
    if header:
        first_line = header.group('lead').count('\n') + 1
        options = _read_header(path, header.group('block'), first_line)
        first_line += header.group(0).count('\n') - header.group('lead').count(
            '\n'
        )
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
    except ValueError as exc:
        if isinstance(exc, SQLFileError):
            raise
        raise SQLFileError(f'{path}: {exc}') from None
    for key, value in info.items():
        setattr(method, key, value)
    return method


#: Header keys kept on the method as attributes, for the record.
_KEPT = ('title', 'connection_id', 'max_cache')


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
