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

#: Statements that begin with these words read; anything else writes.
_READ_WORDS = frozenset(
    ['select', 'with', 'values', 'table', 'show', 'describe', 'explain']
)

# Literals and comments are blanked before the text is analysed, so that a
# word inside a string ("... from the station") is not taken for a table.
_NOISE = re.compile(
    r"(?P<literal>'(?:''|\\.|[^'\\])*')|--[^\n]*|/\*.*?\*/", re.DOTALL
)
_PART = r'(?:"[^"]+"|`[^`]+`|\[[^\]]+\]|[A-Za-z_][\w$]*)'
_NAME = rf'{_PART}(?:\s*\.\s*{_PART})*'
# An alias is any word that is not a keyword that may follow a table.
_KEYWORDS = (
    'where|join|inner|left|right|full|cross|natural|outer|on|using|group|'
    'order|limit|having|union|intersect|except|window|offset|fetch|for|'
    'lateral|straight_join|returning|set|values|lock|into'
)
_ALIASED = rf'{_NAME}(?:\s+(?:as\s+)?(?!(?:{_KEYWORDS})\b)[A-Za-z_]\w*)?'
_READS = re.compile(
    rf'\b(?:from|join)\s+({_ALIASED}(?:\s*,\s*{_ALIASED})*)', re.IGNORECASE
)
_WRITES = re.compile(
    r'(?:\b(\w+)\s+)?\b(?:insert(?:\s+ignore)?\s+into|replace\s+into|'
    r'merge\s+into|delete\s+from|truncate(?:\s+table)?|'
    rf'update(?:\s+only)?)\s+({_NAME})',
    re.IGNORECASE,
)
_DML = re.compile(r'\b(?:insert|update|delete|merge)\b', re.IGNORECASE)
_LOCKING = re.compile(
    r'\bfor\s+(?:no\s+key\s+)?(?:update|share|key\s+share)\b'
    r'|\block\s+in\s+share\s+mode\b',
    re.IGNORECASE,
)
# Words before UPDATE that make it part of another clause, not a statement:
# FOR UPDATE, ON CONFLICT DO UPDATE, ON DUPLICATE KEY UPDATE, MERGE's
# WHEN MATCHED THEN UPDATE.
_NOT_A_TARGET = frozenset(['for', 'do', 'key', 'then'])


def _table_name(name):
    """``"Public".Property`` -> ``property``: the last part, unquoted."""
    last = re.split(r'\s*\.\s*', name)[-1]
    return last.strip('"`[]').lower()


def analyse(sql):
    """Tell whether ``sql`` writes, and which tables it reads or writes.

    Returns ``(writes, tables)``. For a read, ``tables`` is the set of
    tables named after FROM and JOIN. For a write it is the set of tables
    the statement changes, or ``None`` when that cannot be told (DDL,
    procedure calls): such a write invalidates every cached result. A
    locking read (``SELECT ... FOR UPDATE``) counts as a write of no table:
    it must run in the writing transaction, and it changes nothing.

    The analysis is lexical; a method that declares ``tables=`` is not
    analysed for tables.
    """
    clean = _NOISE.sub(lambda m: "''" if m.group('literal') else ' ', sql)
    words = clean.split(None, 1)
    first = words[0].lower().lstrip('(') if words else ''
    if first in _READ_WORDS and not (first == 'with' and _DML.search(clean)):
        if _LOCKING.search(clean):
            return True, frozenset()
        tables = set()
        for match in _READS.finditer(clean):
            for item in match.group(1).split(','):
                tables.add(_table_name(_leading_name(item)))
        return False, frozenset(tables)
    if first in (
        'insert',
        'update',
        'delete',
        'merge',
        'replace',
        'truncate',
        'with',
    ):
        tables = {
            _table_name(m.group(2))
            for m in _WRITES.finditer(clean)
            if (m.group(1) or '').lower() not in _NOT_A_TARGET
        }
        if tables:
            return True, frozenset(tables)
    return True, None


def _leading_name(item):
    return re.match(_NAME, item.strip()).group(0)


_SCALARS = (
    type(None), bool, int, float, str, bytes, decimal.Decimal, datetime.date,
    datetime.datetime, datetime.time, datetime.timedelta, uuid.UUID,
)  # fmt: skip
_SEQUENCES = (list, tuple, set, frozenset)


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
        names = frozenset(_table_name(t) for t in tables)
    except (TypeError, AttributeError):
        raise TypeError(
            f'SQL method {method!r}: tables must be table names (a list, '
            f'or one string separated by commas), not {tables!r}'
        ) from None
    return names


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
    """

    def __init__(
        self, name, sql, *, cache_time=None, max_rows=1000, tables=None
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
        if ';' in _NOISE.sub("''", sql):
            raise ValueError(
                f'SQL method {name!r} holds more than one statement; '
                'write one method per statement'
            )
        what = f'SQL method {name!r}:'
        if cache_time is not None:
            _check_number(f'{what} cache_time', cache_time)
        _check_number(f'{what} max_rows', max_rows, integer=True)

        self.name = name
        self.sql = sql
        self.cache_time = cache_time
        self.max_rows = max_rows
        self.statement = text(sql)
        self.params = tuple(self.statement.compile().params)
        self._param_set = frozenset(self.params)
        # The argument values in parameter order, as a tuple, in C: this is
        # the cache-hit path (benchmarks/bench_cache.py).
        self._getter = (
            itemgetter(*self.params)
            if len(self.params) > 1
            else lambda params: tuple(params[p] for p in self.params)
        )
        self.writes, found = analyse(sql)
        self.tables = (
            found if tables is None else _normalise_tables(name, tables)
        )
        self._expanding = {frozenset(): self.statement}

    def __repr__(self):
        kind = 'write' if self.writes else 'read'
        return f'<SQLMethod {self.name} ({kind})>'

    def bind(self, params):
        """Check ``params`` against the statement; return it ready to run.

        Returns ``(statement, params)``: lists, tuples and sets become an
        expanding ``IN`` parameter. A missing or extra argument raises
        :class:`TypeError`; a value no driver can bind raises
        :class:`ValueError`. Both name the method and the argument.
        """
        self.check_names(params)
        expanding = []
        for key, value in params.items():
            if isinstance(value, _SEQUENCES):
                bad = [v for v in value if not isinstance(v, _SCALARS)]
                if bad:
                    self._unbindable(key, bad[0], ' inside a list')
                expanding.append(key)
            elif not isinstance(value, _SCALARS):
                self._unbindable(key, value, '')
        if not expanding:
            return self.statement, params
        names = frozenset(expanding)
        statement = self._expanding.get(names)
        if statement is None:
            statement = self.statement.bindparams(
                *(bindparam(n, expanding=True) for n in names)
            )
            self._expanding[names] = statement
        params = dict(params)
        for key in names:
            params[key] = list(params[key])
        return statement, params

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


#: The header keys of a ``.sql`` file, and how each value is read.
_HEADER_KEYS = {
    'name': str,
    'cache_time': float,
    'max_rows': int,
    'tables': str,
}
_HEADER = re.compile(r'^--\s*([A-Za-z_]\w*)\s*:\s*(.*?)\s*$')


class SQLFileError(ValueError):
    """A ``.sql`` file that cannot be loaded; the text names file and line."""


def load_sql_file(path):
    """Read a ``.sql`` file into a :class:`SQLMethod`.

    The leading ``--`` comment lines may carry ``name``, ``cache_time``,
    ``max_rows`` and ``tables`` as ``-- key: value``; the name defaults to
    the file's stem. A header key close to one of these but not one of
    them (``-- cache_tme: 20``) is an error rather than prose, so that a
    typo cannot silently turn caching off.
    """
    path = Path(path)
    options = {'name': path.stem}
    lines = path.read_text(encoding='utf-8').splitlines()
    body = 0
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped and not stripped.startswith('--'):
            break
        body = number
        match = _HEADER.match(stripped)
        if match is None:
            continue
        key, value = match.group(1).lower(), match.group(2)
        if key not in _HEADER_KEYS:
            close = difflib.get_close_matches(key, _HEADER_KEYS, n=1)
            if close:
                raise SQLFileError(
                    f'{path}:{number}: unknown header key {key!r} (did you '
                    f'mean {close[0]!r}? accepted: {", ".join(_HEADER_KEYS)})'
                )
            continue
        try:
            options[key] = _HEADER_KEYS[key](value)
        except ValueError:
            raise SQLFileError(
                f'{path}:{number}: {key} = {value!r} is not a number'
            ) from None
    if 'cache_time' in options and options['cache_time'].is_integer():
        options['cache_time'] = int(options['cache_time'])
    sql = '\n'.join(lines[body:])
    name = options.pop('name')
    try:
        return SQLMethod(name, sql, **options)
    except ValueError as exc:
        raise SQLFileError(f'{path}: {exc}') from None
