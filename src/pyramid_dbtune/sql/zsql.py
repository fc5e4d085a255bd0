"""Zope's ZSQL Method files (``.zsql``), read into SQL methods.

A ``.zsql`` file is a ``<dtml-comment>`` header (``connection_id``,
``arguments``, ``max_rows``, ``max_cache``, ``cache_time``), or the
arguments in ``<params>`` as Zope's "view source" writes them, and a
statement written with DTML's SQL tags. Every value the tags insert
becomes a bound parameter: nothing a caller passes is ever formatted
into the statement's text, whatever the tag (``'<dtml-var name
sql_quote>'`` included). A tag where a database would not read a
parameter (a comment, a quoted name) is an error when the file loads,
and each text rendered is checked as PostgreSQL and MySQL read it
(:func:`.readings.hidden_parameters`).

Optional tests, ``<dtml-sqlgroup>`` and ``<dtml-if>`` make the statement's
text depend on which arguments are given. A :class:`ZSQLMethod` renders
that text on each call and keeps one compiled statement per text. Its
cache key is the text and the values bound, so two calls that run
different statements never share cached rows.

A tag, an attribute or a form (a Python expression) that this module does
not translate is an error when the file is loaded, naming the file, the
line and the tag: a template is never run half-understood.
"""

import itertools
import math
import re
from pathlib import Path

from sqlalchemy import BigInteger, Numeric, bindparam, text

from ..convert import as_bool
from . import analysis, readings
from .analysis import ANY_TABLE
from .dtml import ABSENT, Render, if_nodes, place, render_all
from .dtml_parser import MAX_VARIANTS, Parser
from .method import (
    COUNT,
    SECONDS,
    SQLFileError,
    SQLMethod,
    header_key,
    load_sql_file,
    read_header,
    read_source,
    table_names,
)

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
        parser = Parser(body, where, first_line, list(arguments))
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
        ifs = list(dict.fromkeys(if_nodes(self.nodes)))
        choices = [range(node.choices()) for node in ifs]
        variants = {}
        for chosen in itertools.islice(
            itertools.product(*choices), MAX_VARIANTS
        ):
            render = Render(self.name, {}, dict(zip(ifs, chosen, strict=True)))
            sql = render_all(self.nodes, render).strip()
            variants.setdefault(place(sql, render.expanding), render.binds)
        glued = None
        if math.prod(len(c) for c in choices) > MAX_VARIANTS:
            render = Render(self.name, {}, {})
            glued = render_all(self.nodes, render).strip()
            glued = place(glued, render.expanding)
        return variants, glued

    def _pins(self, sql, pipes_or=True):
        return ()  # a template's texts: its rows are not told apart

    def _write_shape(self, sql):
        return None

    def _shape(self, sql):
        return None

    def _analyse(self, sql):
        if self._glued is None:
            return analysis.analyse_any(self._variants)
        # Too many texts to read each: whether it writes, from them and
        # every branch at once; which tables, not told.
        writes, _ = analysis.analyse_any([*self._variants, self._glued])
        return (True, None) if writes else (False, frozenset([ANY_TABLE]))

    def _names(self, sql):
        return analysis.names(self._variants)

    def _check(self, sql, names, error):
        """Refuse a text where a value would not be a bound parameter:
        glued to a name, or inside a string or a comment as a database
        reads it (the template's tags put it next to one)."""
        if ';' in analysis.tokens(sql):
            raise error(
                f'{self.where}: SQL method {self.name!r} holds more than one '
                'statement; write one method per statement'
            )
        hidden = readings.hidden_parameters(sql, names)
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
        render = Render(
            self.name, {n: params.get(n, d) for n, d in self._defaults}
        )
        sql = render_all(self.nodes, render).strip()
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
            placed = place(sql, render.expanding)
            self._check(placed, render.binds, ValueError)
            statement = text(placed)
            typed = render.expanding | set(render.kinds)
            if typed:
                statement = statement.bindparams(
                    *(
                        bindparam(
                            n,
                            expanding=n in render.expanding,
                            type_=_BIND_TYPES.get(render.kinds.get(n)),
                        )
                        for n in typed
                    )
                )
            self._statements[sql] = statement
        return statement, render.binds


#: How ``type=int`` and ``type=float`` values are bound: as Zope's
#: literals were typed (PostgreSQL casts them, so that ``:n IS NULL`` has
#: a type, and ``:a * :b`` of two small numbers is not a ``smallint``).
_BIND_TYPES = {'int': BigInteger(), 'float': Numeric()}


#: The header keys of a ``.zsql`` file, how each is read, what it takes.
_ZSQL_KEYS = {
    'title': (str, 'text'),
    'connection_id': (str, 'a name'),
    'arguments': (parse_arguments, 'arguments', True),
    'max_rows': COUNT,
    'max_cache': COUNT,
    'cache_time': SECONDS,
    'tables': (table_names, 'table names, separated by commas'),
    'writes': (as_bool, 'true or false'),
    'invalidate': (as_bool, 'true or false'),
}
#: Zope keys that change what a call returns or where it runs, which this
#: package does not do: an error when set, never silently dropped.
_UNSUPPORTED_KEYS = {
    'class_name': 'result classes ("brains") are not supported',
    'class_file': 'result classes ("brains") are not supported',
    'connection_hook': 'the database is chosen by dbtune.url and '
    'dbtune.read_urls, not per method',
}
#: Blank lines and SQL comments. Each part matches in one way only (a
#: ``--`` comment to the end of its line): else a file with no header
#: would be read over in exponentially many ways.
_LEAD = r'(?:\s|--[^\n]*(?![^\n])|/\*(?:[^*]|\*(?!/))*\*/)*'
_OPEN, _CLOSE = r'<dtml-comment\s*>', r'</dtml-comment\s*>'
_HEADER = re.compile(
    rf'{_LEAD}{_OPEN}(?P<block>.*?){_CLOSE}', re.DOTALL | re.IGNORECASE
)
#: The arguments as Zope's ``document_src()`` writes them, before the
#: template.
_PARAMS = re.compile(
    rf'{_LEAD}<params>(?P<params>.*?)</params>', re.DOTALL | re.IGNORECASE
)
_OPENS = re.compile(_OPEN, re.IGNORECASE)
_CLOSES = re.compile(_CLOSE, re.IGNORECASE)
_HEADER_LINE = re.compile(r'^\s*([A-Za-z_][\w -]*?)\s*:(.*)$')
#: Header keys kept on the method as attributes, for the record.
_KEPT = ('title', 'connection_id', 'max_cache')


def _header_key(line):
    """The key of a header line that sets one the header knows, else
    None."""
    match = _HEADER_LINE.match(line)
    key = match and header_key(match.group(1))
    return key if key in _ZSQL_KEYS or key in _UNSUPPORTED_KEYS else None


def _read_header(path, block, first_line):
    """The header's keys, read; raises :class:`SQLFileError`. A line
    indented further than ``arguments`` goes on with it, unless it sets
    a key of its own: Zope strips each line, so an indented header is
    one key a line."""
    entries, indent = [], None  # the margin of arguments, while it goes on
    for number, line in enumerate(block.splitlines(), first_line):
        margin = len(line) - len(line.lstrip())
        further = indent is not None and line.strip() and margin > indent
        if further and _header_key(line) is None:
            last, written, value = entries[-1]
            entries[-1] = (last, written, value + ' ' + line)
            continue
        match = _HEADER_LINE.match(line)
        indent = None
        if match is not None:
            entries.append((number, match.group(1), match.group(2).strip()))
            if header_key(match.group(1)) == 'arguments':
                indent = margin
    return read_header(path, entries, _ZSQL_KEYS, _UNSUPPORTED_KEYS)


def _refuse_later_headers(path, source, first_line):
    """Raise :class:`SQLFileError` for a ``<dtml-comment>`` of the
    statement that reads as a header, its every line a header key's: it
    would be a comment, its values silently dropped. A comment of prose
    that holds a line such as ``Tables: see below`` is a comment."""
    pos = 0
    while opened := _OPENS.search(source, pos):
        closed = _CLOSES.search(source, opened.end())
        if closed is None:
            return  # the template's error, told by its parser
        pos = closed.end()
        block = source[opened.end() : closed.start()]
        start = first_line + source.count('\n', 0, opened.end())
        lines = [
            (number, line)
            for number, line in enumerate(block.splitlines(), start)
            if line.strip()
        ]
        keys = [_header_key(line) for _, line in lines]
        if lines and all(keys):
            raise SQLFileError(
                f'{path}:{lines[0][0]}: {keys[0]}: the header must come '
                'first in the file, after nothing but blank lines and SQL '
                'comments: a <dtml-comment> after the statement begins is '
                'not read'
            )


def load_zsql_file(path, **overrides):
    """Read a Zope ``.zsql`` file into a :class:`ZSQLMethod`.

    The file may begin (after blank lines and SQL comments) with a
    ``<dtml-comment>`` header of ``key: value`` lines: ``arguments`` (a
    line indented further continues it), ``max_rows``, ``cache_time``,
    and, beyond Zope's, ``tables``, ``writes`` and ``invalidate`` as in
    a ``.sql`` file; ``title``, ``connection_id`` and ``max_cache`` are
    read and kept (one cache bounds every method). A header key in a
    later ``<dtml-comment>`` is an error. The file may begin with
    ``<params>arguments</params>`` instead, or before its header, as
    Zope's ``document_src()`` writes it. The method is named after the
    file. Raises
    :class:`SQLFileError` naming the file and the line. ``overrides``
    (``name`` and the keywords of :class:`~pyramid_dbtune.SQLMethod`) win
    over the header.
    """
    path = Path(path)
    source = read_source(path)
    options, start = {}, 0
    params = _PARAMS.match(source)
    if params:
        line = source.count('\n', 0, params.start('params')) + 1
        entry = (line, 'arguments', params.group('params'))
        options = read_header(path, [entry], _ZSQL_KEYS)
        start = params.end()
    header = _HEADER.match(source, start)
    if header:
        lead = source.count('\n', 0, header.start('block'))
        read = _read_header(path, header.group('block'), lead + 1)
        given = options.get('arguments')
        if given is not None and read.get('arguments', given) != given:
            raise SQLFileError(
                f'{path}: arguments are given by <params> and by the '
                'header, and they differ: give them once'
            )
        options.update(read)
        start = header.end()
    first_line = source.count('\n', 0, start) + 1
    source = source[start:]
    _refuse_later_headers(path, source, first_line)
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


def load_directory(path):
    """``(file, method)`` of every ``*.sql`` and ``*.zsql`` file of the
    directory ``path``, by file name. Raises :class:`SQLFileError` for a
    file it cannot read, two files of one method name, or a path that is
    not a directory holding such files."""
    path = Path(path)
    files = (
        sorted(f for f in path.iterdir() if f.suffix.lower() in LOADERS)
        if path.is_dir()
        else []
    )
    if not files:
        raise SQLFileError(
            f'{path} is not a directory that holds *.sql or *.zsql files'
        )
    loaded = {}
    for file in files:
        method = load_file(file)
        if method.name in loaded:
            raise SQLFileError(
                f'{file} and {loaded[method.name][0]} both name SQL method '
                f'{method.name!r}'
            )
        loaded[method.name] = (file, method)
    return list(loaded.values())
