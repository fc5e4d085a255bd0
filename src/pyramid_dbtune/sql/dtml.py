"""DTML's SQL tags as nodes: what each renders, every value a bound
parameter (``sqlvar``, ``sqltest``, ``sqlgroup``, ``if``), and how a value
is converted to its type."""

import decimal
import math
import re

from . import analysis
from .method import SEQUENCES


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

# A ':' that SQLAlchemy's text() would take for a parameter.
_COLON = re.compile(r'(?<![:\w\\]):(?=\w)')


class Render:
    """One call's rendering: the text, the bound values, the lists.

    A value's place in the text is marked ``\\0name\\0`` until the text is
    compiled (:func:`place`), so that what stands next to it is known.
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
        #: ``type=int`` and ``type=float`` values' names, and their type
        self.kinds = {}

    def get(self, arg):
        return self.args.get(arg, ABSENT)

    def bind(self, name, value, expanding=False, kind=None):
        self.binds[name] = value
        if expanding:
            self.expanding.add(name)
        if kind in _NUMBERS:
            self.kinds[name] = kind
        return f'\0{name}\0'

    def fail(self, exc_type, arg, what):
        raise exc_type(f'ZSQL method {self.method}(): argument {arg!r} {what}')


_MARK = re.compile(r'\0(\w+)\0')
_GLUED_AFTER = re.compile(r'[\0:\w]')


def place(sql, expanding):
    """The text with each value's mark as a ``:name`` parameter; in
    parentheses where text glued to it would hide it from SQLAlchemy
    (``<dtml-sqlvar d type=string>::date`` is ``(:d)::date``). A list's
    (``IN :name``) is set apart by spaces instead: SQLAlchemy writes its
    parentheses, and ``IN ((1, 2))`` would be a row."""

    def parameter(match):
        name, start, end = match.group(1), match.start(), match.end()
        before = start and sql[start - 1] in '\0:'
        after = _GLUED_AFTER.match(sql, end)
        if name in expanding:
            return f'{" " * bool(before)}:{name}{" " * bool(after)}'
        if before or after:
            return f'(:{name})'
        return f':{name}'

    return _MARK.sub(parameter, sql)


_NUMBERS = {'int': (int, 'an integer'), 'float': (float, 'a number')}


def _number(kind, value):
    """``value`` as an int, or for ``float`` as a float (a decimal where it
    was text or a decimal, kept exact as Zope's text was); None if it is
    not one."""
    number = _NUMBERS[kind][0]
    if isinstance(value, str | bytes):
        value = value.strip()
        if kind == 'float':
            return _decimal(value)
    elif isinstance(value, bool):
        return None
    elif isinstance(value, decimal.Decimal):
        if kind == 'float':
            return _decimal(value)
        if not (value.is_finite() and value == value.to_integral_value()):
            return None
    elif not isinstance(value, int | float):
        return None
    try:
        # + 0 binds -0.0 as 0.0: the two are equal in a cache key.
        value = number(value) + 0
    except (ValueError, OverflowError):  # 'x', inf for an int
        return None
    # NaN and infinities: no database column holds them all.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _decimal(value):
    """``value``, text or a decimal, as a finite decimal, or None."""
    try:
        if not math.isfinite(float(value)):  # what Zope checked, and less
            return None
        number = decimal.Decimal(
            value.decode('ascii') if isinstance(value, bytes) else value
        )
    except (ValueError, UnicodeDecodeError, decimal.InvalidOperation):
        return None
    # Every digit kept (+ 0 would round to 28), but -0 bound as 0.
    return number.copy_abs() if number.is_zero() else number


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
        try:
            value = value.decode('utf-8')
        except UnicodeDecodeError:
            render.fail(ValueError, arg, f'is not UTF-8 text: {value!r}')
    if not isinstance(value, str):
        # Anything else as its text, as Zope wrote it (a Zope DateTime,
        # say); but for lists and dicts, whose text is no value.
        if isinstance(value, (*SEQUENCES, dict)):
            render.fail(ValueError, arg, f'cannot be bound: {value!r}')
        value = str(value)
    return value


def _blank(value):
    return isinstance(value, str | bytes) and not value.strip()


class Text:
    def __init__(self, source):
        # Colons in the template's own text are not parameters.
        self.text = _COLON.sub(r'\\:', source)

    def render(self, r):
        return self.text


class SQLVar:
    """``<dtml-sqlvar name type=T [optional]>``: one bound value."""

    def __init__(self, arg, kind, optional, bind):
        self.arg, self.kind, self.optional, self.name = (
            arg, kind, optional, bind,
        )  # fmt: skip

    def render(self, r):
        value = r.get(self.arg)
        if r.skeleton:
            return r.bind(self.name, None, kind=self.kind)
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
        return r.bind(self.name, value, kind=self.kind)


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


class SQLTest:
    """``<dtml-sqltest name type=T [column=C] [op=O] [optional]
    [multiple]>``: ``C O :value``, or ``C IN :values`` for a list."""

    def __init__(self, arg, kind, column, op, optional, multiple, bind):
        self.arg, self.kind, self.column, self.op = arg, kind, column, op
        self.optional, self.multiple, self.name = optional, multiple, bind

    def render(self, r):
        if r.skeleton:
            # A multiple test as a list renders it, for the checks at load.
            return self._test(r, [None, None] if self.multiple else [None])
        value = r.get(self.arg)
        if value is ABSENT:
            if self.optional:
                return ''
            r.fail(TypeError, self.arg, 'is missing')
        values = _items(value)
        if len(values) > 1 and not self.multiple:
            r.fail(ValueError, self.arg, 'takes one value, not a list')
        # None is refused: Zope compared with the text 'None', and to
        # leave the test out would widen the read.
        if any(v is None for v in values):
            r.fail(
                ValueError,
                self.arg,
                'is None: to test for NULL, write IS NULL',
            )
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
        return self._test(r, values)

    def _test(self, r, values):
        if len(values) == 1:
            bound = r.bind(self.name, values[0], kind=self.kind)
            return f'{self.column} {self.op} {bound}'
        negate = 'NOT ' if self.op == '<>' else ''
        bound = r.bind(self.name, values, True, kind=self.kind)
        return f'{self.column} {negate}IN {bound}'


class Literal:
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


def render_all(nodes, r):
    return ''.join(node.render(r) for node in nodes)


# A # comment to the end of the line, as MySQL reads it (the parser
# refuses a quote after #, so no literal starts inside one).
_HASH_COMMENT = re.compile(r'#[^\n]*')


def _only_comments(part):
    """Whether a group's part is only ``--``, ``/* */`` or ``#``
    comments (its literals and comments blanked, no text is left)."""
    if '--' not in part and '/*' not in part and '#' not in part:
        return False  # most parts: not blanked (a microsecond a part)
    return not _HASH_COMMENT.sub('', analysis.blank(part)).strip()


class Group:
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
            part = render_all(nodes, r).strip()
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


class If:
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
                return ' '.join(render_all(n, r) for _, _, n in self.branches)
            if choice == len(self.branches):
                return ''
            return render_all(self.branches[choice][2], r)
        for arg, negate, nodes in self.branches:
            value = r.get(arg) if arg else True
            if arg is None or bool(value and value is not ABSENT) != negate:
                return render_all(nodes, r)
        return ''


def if_nodes(nodes):
    """Every ``<dtml-if>`` among ``nodes``, those inside them included."""
    for node in nodes:
        if isinstance(node, If):
            yield node
            for _, _, branch in node.branches:
                yield from if_nodes(branch)
        elif isinstance(node, Group):
            for _, block in node.blocks:
                yield from if_nodes(block)


#: Texts a template's ``<dtml-if>`` choices may render that are each read
#: for tables (and checked) when it loads; past this many, a read is
#: invalidated by any write, and a write invalidates everything.
