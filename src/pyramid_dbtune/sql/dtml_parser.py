"""The reader of a ``.zsql`` template: DTML text into the nodes of
:mod:`.dtml`, an error naming the file, the line and the tag for anything
it does not translate."""

import difflib
import re

from .dtml import (
    OPERATORS,
    SUPPORTED,
    TYPES,
    Group,
    If,
    Literal,
    SQLTest,
    SQLVar,
    Text,
)
from .method import (
    SQLFileError,
)

# DTML's entity and comment forms, not translated wherever they stand.
_OTHER = r'<!--\#\s*[\w.-]*|&dtml[\w.-]*;?'
# A tag; a comment to the end of the line; the start of a comment, a
# quoted name or a string where no value may go; a quote (a literal
# starts); or a DTML form not translated.
_SCAN = re.compile(
    rf"""(?P<tag><(?P<close>/?)dtml-(?P<name>[\w.-]*)
          (?P<args>(?:[^>"']|"[^"]*"|'[^']*')*)>)
      | (?P<comment>--[^\n]*|\#[^\n]*)
      | (?P<region>/\*|"|`|(?<![\w$])\$(?:[^\W\d]\w*)?\$)
      | (?P<quote>')
      | (?P<other>{_OTHER})""",
    re.VERBOSE | re.IGNORECASE,
)
_TAG = re.compile(rf'(?P<tag></?dtml-[\w.-]*)|{_OTHER}', re.IGNORECASE)
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
MAX_VARIANTS = 64

_LITERAL_PART = re.compile(
    rf"''|'|</?dtml-|(?P<other>{_OTHER})", re.IGNORECASE
)
_COMMENT_END = re.compile(r'</dtml-comment\s*>', re.IGNORECASE)
_COLUMN = re.compile(r'[\w.$"`\[\]]+')


class Parser:
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
                self._text(pos, end)
            if match is None:
                break
            pos = match.end()
            if match.group('comment') is not None:
                self._comment(match)
                self.nodes.append(Text(match.group('comment')))
            elif match.group('region'):
                pos = self._region(match)
            elif match.group('quote'):
                pos = self._literal(match.start())
            elif match.group('other'):
                raise self._not_supported(match.start(), match.group(0))
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

    def _text(self, start, end):
        """Plain SQL from ``start`` to ``end``: a ``<dtml-`` left in it is
        a tag the scanner could not read, which would be sent as SQL."""
        tag = _TAG.search(self.source, start, end)
        if tag:
            raise self._unread(tag.start())
        self.nodes.append(Text(self.source[start:end]))

    def _unread(self, pos):
        """The error for a ``<dtml-`` at ``pos`` not read as a tag."""
        end = self.source.find('>', pos)
        if end >= 0 and re.search('["\']', self.source[pos:end]):
            return self.error(pos, 'a DTML tag with an unbalanced quote')
        head = _TAG.match(self.source, pos).group(0)
        return self.error(pos, f'{head}: a DTML tag not closed with >')

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

    def _not_supported(self, pos, form, where=''):
        """The error for ``&dtml-name;`` or ``<!--#var ...-->`` at ``pos``;
        ``where``: the region it stands in, and what to do instead."""
        return self.error(
            pos,
            f'{form.strip()} is not supported: write DTML as <dtml-...> '
            f'tags{where}',
        )

    def _inside(self, start, region, what):
        """Refuse a DTML tag or form in ``region`` (which begins at
        ``start``): a value there would not be a parameter."""
        tag = _TAG.search(region)
        if tag:
            where, advice = _REGIONS[what]
            if not tag.group('tag'):
                raise self._not_supported(
                    start + tag.start(),
                    tag.group(0),
                    f', not inside {where}{advice}',
                )
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
        self.nodes.append(Text(region))
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
            elif match.group('other'):
                raise self.error(
                    match.start(),
                    f'{match.group(0).strip()} inside a quoted literal is not '
                    "supported: write '<dtml-var name sql_quote>'",
                )
            else:
                tag_match = _SCAN.match(source, match.start())
                if tag_match is None:
                    raise self._unread(match.start())
                pos = tag_match.end()
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
            self.nodes.append(Text(source[start:pos]))
            return pos
        if re.match(r'\w', source[start - 1 : start]):
            raise self.error(
                start,
                f"a prefixed literal ({source[start - 1]}'...') holding "
                '<dtml-var>: the literal is bound as one string; drop the '
                'prefix',
            )
        name = self._bind_name(pieces[1][0], first)
        self.nodes.append(Literal([p for p in pieces if p != ''], name))
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
            node = SQLVar(
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
            self._check(match, tag, attrs, Group.FLAGS)
            node = Group(frozenset(attrs), self.line(match.start()))
            self._push(tag, node, match, node.blocks[0][1])
            return
        else:  # if, unless
            self._check(match, tag, attrs, ('name',))
            node = If(self._argument(match, tag, attrs), tag == 'unless')
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
        return SQLTest(
            arg, kind, column, OPERATORS[op.lower()], 'optional' in attrs,
            'multiple' in attrs, self._bind_name(arg, match),
        )  # fmt: skip
