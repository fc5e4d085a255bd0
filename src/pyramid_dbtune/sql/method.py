"""SQL methods: named, parameterised statements with timed row caching.

The idea is Zope's ZSQL Method: a statement with ``:name`` parameters, a
``max_rows`` limit and a per-method ``cache_time``. Parameters are always
bound by the driver, never formatted into the statement's text.
"""

import datetime
import decimal
import difflib
import math
import re
import uuid
from operator import itemgetter
from pathlib import Path

from sqlalchemy import bindparam, text

from ..convert import as_bool, as_count, as_seconds
from . import analysis, conditions, readings, shapes
from .analysis import ANY_TABLE

_SCALARS = (
    type(None), bool, int, float, str, bytes, decimal.Decimal, datetime.date,
    datetime.datetime, datetime.time, datetime.timedelta, uuid.UUID,
)  # fmt: skip
SEQUENCES = (list, tuple, set, frozenset)


def _check_number(what, value, *, integer=False):
    kind = int if integer else (int, float)
    if (
        isinstance(value, bool)
        or not isinstance(value, kind)
        or not math.isfinite(value)
        or value < 0
    ):
        noun = 'a whole number' if integer else 'a number of seconds'
        raise ValueError(f'{what} must be {noun}, 0 or more, not {value!r}')
    return value


def _normalise_tables(method, tables):
    if isinstance(tables, str):
        tables = tables.replace(',', ' ').split()
    try:
        names = frozenset(analysis.table_name(t) for t in tables)
    except (TypeError, AttributeError):
        raise TypeError(
            f'SQL method {method!r}: tables must be table names (a list, '
            f'or one string separated by commas), not {tables!r}'
        ) from None
    return names


#: Types whose equal values may be bound otherwise: an aware time of
#: another offset (12:00+00:00 equals 14:00+02:00, and PyMySQL sends the
#: wall clock), a decimal of more places (1.0 equals 1.00).
_EQUAL_NOT_SAME = frozenset(
    [datetime.datetime, datetime.time, decimal.Decimal]
)


#: Types whose values are keyed item by item (``IN :ids``).
_ITEMS = frozenset([list, tuple, set, frozenset])


def call_key(prefix, values):
    """The cache key of a call of method ``prefix`` (its key) with
    ``values`` (:meth:`SQLMethod.values`): the values and their types (1,
    1.0 and True are equal, but not the same argument), and what equality
    overlooks of a time or a decimal; a list's items likewise."""
    types = tuple(map(type, values))
    if not (_EQUAL_NOT_SAME.isdisjoint(types) and _ITEMS.isdisjoint(types)):
        values = tuple(map(_keyed, values))
    return (prefix, values, types)


def _keyed(value):
    kind = type(value)
    if kind in _EQUAL_NOT_SAME:
        return (value, repr(value))
    if kind is list or kind is tuple:
        return tuple([(type(v), _keyed(v)) for v in value])
    if kind is set or kind is frozenset:
        return frozenset([(type(v), _keyed(v)) for v in value])
    return value


class SQLMethod:
    """A named, parameterised SQL statement whose rows may be cached.

    ``name``
        How the method is called: ``request.sql.<name>(...)``. A Python
        identifier not starting with ``_``.
    ``sql``
        One statement, with ``:name`` parameters. A ``:`` that is not a
        parameter is written ``\\:``. PostgreSQL's ``::type`` casts work,
        but not straight after a parameter: write ``CAST(:id AS int)``.
    ``cache_time``
        Seconds to keep a read's rows; ``0`` never caches. ``None`` (the
        default) takes ``dbtune.cache.default_time``, and the setting
        ``dbtune.cache_time.<name>`` overrides either.
    ``max_rows``
        Keep at most this many rows (``0``: all); ``rows.truncated`` tells
        whether more were there.
    ``tables``
        The tables the statement reads (or, for a write, changes). When
        not given, they are taken from the statement's text.
    ``writes``
        Whether the statement writes. When not given, it is taken from the
        statement's text: a statement that does not begin as a read does
        (:func:`~pyramid_dbtune.sql.analysis.analyse`). Say ``writes=True`` for
        a ``SELECT`` of a function that changes data.
    ``invalidate``
        Whether a committed write to the read's tables drops its cached
        rows (the default). ``False`` keeps them for their ``cache_time``
        whatever is written, as Zope's ZSQL cache did: a page may then
        show rows up to ``cache_time`` old, in return for hits that a
        busy table's writes would otherwise keep taking away. A request
        that has written still reads its own writes.
    """

    def __init__(
        self,
        name,
        sql,
        *,
        cache_time=None,
        max_rows=1000,
        tables=None,
        writes=None,
        invalidate=True,
    ):
        if (
            not isinstance(name, str)
            or not name.isidentifier()
            or (name.startswith('_'))
        ):
            raise ValueError(
                f'SQL method name {name!r} must be a Python identifier '
                'that does not start with "_"'
            )
        if not isinstance(sql, str) or not sql.strip():
            raise ValueError(f'SQL method {name!r}: sql must be a statement')
        sql = sql.strip().rstrip(';').rstrip()
        if ';' in analysis.tokens(sql):
            raise ValueError(
                f'SQL method {name!r} holds more than one statement; '
                'write one method per statement'
            )
        what = f'SQL method {name!r}:'
        for cast in readings.in_code(sql, _CAST):
            before = cast.string[: cast.start()]  # as code
            if before.count('[') > before.count(']'):
                continue  # in an array's slice: [lo:n::int], n a column
            # SQLAlchemy reads no parameter there (2.0: :i of :id::int).
            name_, type_ = cast.group(1), cast.group(2) or '...'
            raise ValueError(
                f'{what} SQLAlchemy does not read {cast.group(0)} as the '
                f'parameter :{name_} and a cast: write CAST(:{name_} AS '
                f'{type_})'
            )
        if cache_time is not None:
            _check_number(f'{what} cache_time', cache_time)
        _check_number(f'{what} max_rows', max_rows, integer=True)

        self.name = name
        self.sql = sql
        self.cache_time = cache_time
        self.max_rows = max_rows
        if writes not in (None, True, False):
            raise ValueError(f'{what} writes must be True, False or None')
        self.statement = text(sql)
        self.params = tuple(self.statement.compile().params)
        self._param_set = frozenset(self.params)
        #: ``{reading: {parameter: reading}}``: for each reading of the
        #: statement (:data:`.readings.READINGS`), the parameters that
        #: stand in a string, a quoted name or a comment as it reads them;
        #: refused where the database reads it so, as the method is
        #: registered.
        self.hidden = {
            reading: readings.hidden_parameters(sql, self.params, [reading])
            for reading in readings.READINGS
        }
        #: Parameters written ``IN :name``: they take a list.
        self.list_params = analysis.in_parameters(sql) & self._param_set
        # The argument values in parameter order, as a tuple, in C: this is
        # the cache-hit path (benchmarks/bench_cache.py).
        self._getter = (
            itemgetter(*self.params)
            if len(self.params) > 1
            else lambda params: tuple(params[p] for p in self.params)
        )
        found_writes, found = self._analyse(sql)
        #: Its tables' names written otherwise than plainly, with a
        #: schema or capitals (:func:`.analysis.names`): ``dbtune
        #: triggers`` cannot tell which table such a name is.
        self.names = self._names(sql)
        self.writes = found_writes if writes is None else writes
        if tables is not None:
            self.tables = _normalise_tables(name, tables)
        elif self.writes == found_writes:
            self.tables = found
        else:
            # Declared a write, read as a read (or the other way round):
            # what the text names is no guide to what the statement does.
            self.tables = None if self.writes else frozenset([ANY_TABLE])
        if invalidate not in (True, False):
            raise ValueError(f'{what} invalidate must be True or False')
        if self.writes and not invalidate:
            raise ValueError(
                f'{what} invalidate=False is for reads: a write always '
                'invalidates the tables it changes'
            )
        self.invalidate = invalidate
        #: The tables whose writes drop this read's cached rows.
        self.invalidated_by = self.tables if invalidate else frozenset()
        # Told from the text, and of tables it names: a read of a function
        # in FROM is dropped by any write, whatever rows it touches.
        told = (
            tables is None
            and self.writes == found_writes
            and ANY_TABLE not in (self.tables or ())
        )
        # A read whose rows its text may tell apart.
        self._by_row = bool(
            told and invalidate and not self.writes and self.tables
        )
        #: ``(column, parameter)`` pairs that pin this read of one table
        #: to the rows whose column holds the argument: only writes that
        #: touch such rows drop its cached rows (:mod:`.conditions`).
        self.pins = self._pins(sql) if self._by_row else ()
        #: Which rows it holds (:mod:`.shapes`): a committed change is
        #: matched against them, and applied to them where it can be.
        self.shape = self._shape(sql) if self._by_row else None
        #: How this write finds the rows it touches, or None.
        self.write_shape = (
            self._write_shape(sql)
            if told and self.writes and self.tables
            else None
        )
        self._expanding = self.statement.bindparams(
            *(bindparam(n, expanding=True) for n in self.list_params)
        )

    def __repr__(self):
        kind = 'write' if self.writes else 'read'
        return f'<SQLMethod {self.name} ({kind})>'

    def _analyse(self, sql):
        # Whether it writes, and its tables, as its text tells; a ZSQL
        # method reads each text its template renders.
        return analysis.analyse(sql)

    def _names(self, sql):
        return analysis.names([sql])

    def pins_for(self, dialect):
        """:attr:`pins` as the database of ``dialect`` (SQLAlchemy's name)
        reads the text: :attr:`pins` take ``||`` for MySQL's ``OR``, which
        the others read as joining strings."""
        if dialect in ('mysql', 'mariadb') or '||' not in self.sql:
            return self.pins
        return self._pins(self.sql, pipes_or=False) if self._by_row else ()

    def _pins(self, sql, pipes_or=True):
        return conditions.read_pins(sql, self.tables, pipes_or)

    def _shape(self, sql):
        if self.list_params:
            return None
        return shapes.read_shape(sql, self.tables)

    def _write_shape(self, sql):
        if len(self.tables) != 1:
            return None
        return conditions.write_shape(sql)

    def bind(self, params):
        """Check ``params`` against the statement; return it ready to run.

        Returns ``(statement, params)``. A parameter written ``IN :name``
        takes a list, tuple or set; elsewhere a list is passed to the driver
        as it is (an array, for PostgreSQL). A missing or extra argument, or
        a single value where ``IN`` wants a list, raises :class:`TypeError`;
        a value no driver can bind raises :class:`ValueError`. Both name the
        method and the argument.
        """
        self.check_names(params)
        for key, value in params.items():
            if isinstance(value, SEQUENCES):
                bad = [v for v in value if not isinstance(v, _SCALARS)]
                if bad:
                    self._unbindable(key, bad[0], ' inside a list')
            elif not isinstance(value, _SCALARS):
                self._unbindable(key, value, '')
            elif key in self.list_params:
                raise TypeError(
                    f'SQL method {self.name}(): argument {key!r} is used as '
                    f'IN :{key} and needs a list, tuple or set, not '
                    f'{type(value).__name__}'
                )
        if not self.list_params:
            return self.statement, params
        params = dict(params)
        for key in self.list_params:
            params[key] = list(params[key])
        return self._expanding, params

    def values(self, params):
        """The values of ``params`` in parameter order, names checked."""
        if len(params) == len(self.params):
            try:
                return self._getter(params)
            except KeyError:
                pass
        raise self._argument_error(params)

    def check_names(self, params):
        if params.keys() != self._param_set:
            raise self._argument_error(params)

    def _argument_error(self, params):
        missing = [p for p in self.params if p not in params]
        if missing:
            return TypeError(
                f'SQL method {self.name}() missing argument '
                f'{missing[0]!r}; it takes: {self._signature()}'
            )
        extra = sorted(set(params) - self._param_set)
        return TypeError(
            f'SQL method {self.name}() got an unexpected argument '
            f'{extra[0]!r}; it takes: {self._signature()}'
        )

    def _signature(self):
        return ', '.join(self.params) or 'no arguments'

    def _unbindable(self, key, value, where):
        raise ValueError(
            f'SQL method {self.name}(): argument {key!r} cannot be bound: '
            f'{type(value).__name__} is not a SQL value{where} (use None, '
            'bool, int, float, Decimal, str, bytes, date, time, datetime, '
            'timedelta, UUID, or a list of them)'
        )


def table_names(text):
    """A header's ``tables``: names, separated by commas or white space;
    none would mean "no table", never invalidated, and is refused."""
    if not text.replace(',', ' ').split():
        raise ValueError(text)
    return text


#: How a header key both files take is read, and what it takes.
SECONDS = (as_seconds, 'a number of seconds, 0 or more')
COUNT = (as_count, 'a whole number, 0 or more')
#: The header keys of a ``.sql`` file, how each value is read, and what a
#: bad one should have been.
_HEADER_KEYS = {
    'name': (str, 'a name'),
    'cache_time': SECONDS,
    'max_rows': COUNT,
    'tables': (table_names, 'table names, separated by commas'),
    'writes': (as_bool, 'true or false'),
    'invalidate': (as_bool, 'true or false'),
}
#: A parameter followed by PostgreSQL's cast, ``::``.
_CAST = re.compile(r'(?<![:\w\\]):(\w+)::(\w*)')
# A key may be written with spaces or hyphens: "cache-time", "Cache time".
_HEADER = re.compile(r'^--\s*([A-Za-z_][\w -]*?)\s*:\s*(.*?)\s*$')


class SQLFileError(ValueError):
    """A ``.sql`` file that cannot be loaded; the text names file and line."""


def header_key(text):
    """A header key as written (``Cache-time``), as it is looked up
    (``cache_time``)."""
    return re.sub(r'[\s-]+', '_', text.lower())


def read_header(path, entries, keys, unsupported=None):
    """The header of a SQL file (``.sql`` or ``.zsql``), read.

    ``entries`` are its ``(line number, key as written, value)``; ``keys``
    maps each key the file takes to ``(converter, what it accepts)``, and
    a third item, true, where the converter's own complaint is worth
    showing. A key close to one of them is a typo, an error, so that a typo
    cannot silently turn a feature off; any other is prose. A key of
    ``unsupported`` that is given a value is an error that says why.
    Returns ``{key: value}``; an error is a :class:`SQLFileError` naming
    the file and the line.
    """
    options = {}
    for number, written, value in entries:
        key = header_key(written)
        if unsupported and key in unsupported:
            if value.strip():
                raise SQLFileError(
                    f'{path}:{number}: {key}: {unsupported[key]}'
                )
            continue
        if key not in keys:
            close = difflib.get_close_matches(key, keys, n=1)
            if close:
                raise SQLFileError(
                    f'{path}:{number}: unknown header key {key!r} (did you '
                    f'mean {close[0]!r}? accepted: {", ".join(keys)})'
                )
            continue
        convert, accepted, *detailed = keys[key]
        try:
            options[key] = convert(value)
        except ValueError as exc:
            detail = f' ({exc})' if detailed and detailed[0] else ''
            raise SQLFileError(
                f'{path}:{number}: {key} = {value!r} is not {accepted}{detail}'
            ) from None
    return options


def read_source(path):
    """The text of a SQL file; a :class:`SQLFileError` if not UTF-8."""
    try:
        # utf-8-sig: a byte-order mark must not hide the header.
        return Path(path).read_text(encoding='utf-8-sig')
    except UnicodeDecodeError as exc:
        raise SQLFileError(f'{path}: not UTF-8 text ({exc})') from None


def load_sql_file(path, **overrides):
    """Read a ``.sql`` file into a :class:`SQLMethod`.

    The leading ``--`` comment lines may carry ``name``, ``cache_time``,
    ``max_rows``, ``tables``, ``writes`` and ``invalidate`` as
    ``-- key: value`` (a key
    may be spelt with hyphens or spaces); the name defaults to the file's
    stem. A header key close to one of these but not one of them
    (``-- cache_tme: 20``) is an error rather than prose, so that a typo
    cannot silently turn caching off. ``overrides`` (the keywords of
    :class:`SQLMethod`, and ``name``) win over the header.
    """
    path = Path(path)
    options = {'name': path.stem}
    lines = read_source(path).splitlines()
    body = 0
    entries = []
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped and not stripped.startswith('--'):
            break
        body = number
        match = _HEADER.match(stripped)
        if match is not None:
            entries.append((number, match.group(1), match.group(2)))
    options.update(read_header(path, entries, _HEADER_KEYS))
    sql = '\n'.join(lines[body:])
    options.update(overrides)
    name = options.pop('name')
    try:
        return SQLMethod(name, sql, **options)
    except ValueError as exc:
        raise SQLFileError(f'{path}: {exc}') from None
