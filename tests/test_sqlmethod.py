"""SQL methods (``pyramid_dbtune.sql.method``): their definitions and
errors, binding arguments, and .sql files with their headers."""

import datetime
import decimal
import uuid

import pytest
from pyramid.exceptions import ConfigurationError

from pyramid_dbtune import SQLFileError, SQLMethod
from pyramid_dbtune.sql.method import load_sql_file

from conftest import call, make_app


def test_method_properties():
    method = SQLMethod(
        'search',
        '  SELECT * FROM property WHERE area = :area AND rent < :rent; ',
        cache_time=20,
        max_rows=5,
    )
    assert method.sql.endswith(':rent')
    assert method.params == ('area', 'rent')
    assert method.tables == {'property'}
    assert not method.writes
    assert repr(method) == '<SQLMethod search (read)>'
    write = SQLMethod('up', 'UPDATE t SET a = :a', tables=['X', 'y'])
    assert write.writes and write.tables == {'x', 'y'}
    assert repr(write) == '<SQLMethod up (write)>'
    assert SQLMethod('s', 'select 1', tables='a, b').tables == {'a', 'b'}


def test_postgresql_casts_and_escaped_colons_are_not_parameters():
    method = SQLMethod('m', r"SELECT CAST(:a AS int), b::text, '10\:30'")
    assert method.params == ('a',)
    # A parameter's cast in a string, a comment, or escaped, as any
    # database reads them, is no cast; nor is an array's slice.
    for sql in (
        r"SELECT ':a::int', \:b::int -- :c::int",
        'SELECT $$ :a::int $$, `x :b::c`, (ARRAY[1, 2])[:n::int] # :d::e',
        r"SELECT 'it\'s :a::b', E'\' :c::d'",
        'SELECT a[(lo):hi::int], a[lo :hi::int], a[/* x */:hi::int]',
    ):
        assert SQLMethod('m', sql).params == ()


@pytest.mark.parametrize(
    'kw, message',
    [
        ({'name': '1st'}, "SQL method name '1st' must be a Python identifier"),
        ({'name': '_x'}, 'does not start with "_"'),
        ({'name': None}, 'must be a Python identifier'),
        ({'sql': '  '}, "SQL method 'm': sql must be a statement"),
        ({'sql': 'SELECT 1; DROP TABLE t'}, 'more than one statement'),
        ({'sql': 'SELECT :id::int'}, "SQL method 'm': SQLAlchemy does not "
         'read :id::int as the parameter :id and a cast: write CAST(:id AS '
         'int)'),
        ({'cache_time': -1}, "SQL method 'm': cache_time must be a number"),
        ({'cache_time': float('inf')}, 'cache_time must be a number'),
        ({'cache_time': '20'}, "cache_time must be a number of seconds, 0 "
                               "or more, not '20'"),
        ({'cache_time': True}, 'cache_time must be'),
        ({'max_rows': 1.5}, "SQL method 'm': max_rows must be a whole number"),
        ({'max_rows': -1}, 'max_rows must be a whole number'),
    ],
)  # fmt: skip
def test_bad_definitions(kw, message):
    kw = {'name': 'm', 'sql': 'SELECT 1', **kw}
    with pytest.raises(ValueError) as info:
        SQLMethod(kw.pop('name'), kw.pop('sql'), **kw)
    assert message in str(info.value)


def test_semicolons_inside_literals_are_fine():
    assert SQLMethod('m', "SELECT ';' AS s").sql == "SELECT ';' AS s"


def test_bad_tables():
    with pytest.raises(TypeError, match="SQL method 'm': tables must be"):
        SQLMethod('m', 'SELECT 1', tables=5)
    with pytest.raises(TypeError, match='tables must be'):
        SQLMethod('m', 'SELECT 1', tables=[1])


METHOD = SQLMethod('search', 'SELECT * FROM t WHERE a = :a AND b IN :b')


def test_bind_names_the_missing_and_extra_arguments():
    with pytest.raises(TypeError) as info:
        METHOD.bind({'a': 1})
    assert str(info.value) == (
        "SQL method search() missing argument 'b'; it takes: a, b"
    )
    with pytest.raises(TypeError) as info:
        METHOD.bind({'a': 1, 'b': [1], 'c': 2, 'd': 3})
    assert "got an unexpected argument 'c'; it takes: a, b" in str(info.value)
    with pytest.raises(TypeError, match='it takes: no arguments'):
        SQLMethod('none', 'SELECT 1').bind({'x': 1})


@pytest.mark.parametrize('value', [{'x': 1}, object(), [1, {}]])
def test_bind_refuses_values_no_driver_binds(value):
    with pytest.raises(ValueError) as info:
        METHOD.bind({'a': value, 'b': [1]})
    assert str(info.value).startswith(
        "SQL method search(): argument 'a' cannot be bound:"
    )


@pytest.mark.parametrize(
    'value',
    [None, True, 1, 1.5, 'x', b'x', decimal.Decimal('1.5'),
     datetime.date(2026, 1, 1), datetime.datetime(2026, 1, 1, 12),
     datetime.time(12), datetime.timedelta(1), uuid.uuid4()],
)  # fmt: skip
def test_bind_accepts_sql_values(value):
    statement, params = METHOD.bind({'a': value, 'b': (1, 2)})
    assert params == {'a': value, 'b': [1, 2]}
    again, _ = METHOD.bind({'a': value, 'b': {3}})
    assert again is statement


def test_bind_without_lists_keeps_the_statement():
    method = SQLMethod('m', 'SELECT :a')
    assert method.bind({'a': 1}) == (method.statement, {'a': 1})


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding='utf-8')
    return path


def test_sql_file_header(tmp_path):
    path = write(
        tmp_path,
        'search.sql',
        '-- Search by area.\n'
        '-- Note: this line is prose, not a key.\n'
        '--\n'
        '-- name: find\n'
        '-- cache_time: 20\n'
        '-- MAX_ROWS: 5\n'
        '-- tables: property, area\n'
        '-- invalidate: no\n'
        '\n'
        'SELECT * FROM property\n'
        '-- an inner comment\n'
        'WHERE area = :area\n',
    )
    method = load_sql_file(path)
    assert method.name == 'find'
    assert method.cache_time == 20 and isinstance(method.cache_time, int)
    assert method.max_rows == 5
    assert method.tables == {'property', 'area'}
    assert not method.invalidate and method.invalidated_by == frozenset()
    assert method.sql.startswith('SELECT') and method.params == ('area',)


def test_sql_file_defaults(tmp_path):
    method = load_sql_file(write(tmp_path, 'plain.sql', 'SELECT 1'))
    assert method.name == 'plain'
    assert method.cache_time is None and method.max_rows == 1000
    half = load_sql_file(write(tmp_path, 'h.sql', '-- cache_time: 0.5\nx'))
    assert half.cache_time == 0.5


@pytest.mark.parametrize(
    'text, message',
    [
        ('-- cache_tme: 20\nSELECT 1', "bad.sql:1: unknown header key "
         "'cache_tme' (did you mean 'cache_time'?"),
        ('--\n-- max_rows: lots\nSELECT 1', "bad.sql:2: max_rows = 'lots' "
         'is not a whole number'),
        ('-- cache_time: -3\nSELECT 1', "bad.sql:1: cache_time = '-3' is "
         'not a number of seconds, 0 or more'),
        # Digits of other scripts are no number to a header.
        ('-- max_rows: \u0665\nSELECT 1', "bad.sql:1: max_rows = '\u0665' "
         'is not a whole number, 0 or more'),
        ('-- cache_time: nan\nSELECT 1', "bad.sql:1: cache_time = 'nan' is "
         'not a number of seconds'),
        ('-- name: 9lives\nSELECT 1', 'bad.sql: SQL method name'),
        ('-- cache_time: 1\n-- only comments', 'sql must be a statement'),
    ],
)  # fmt: skip
def test_sql_file_errors_name_file_and_line(tmp_path, text, message):
    with pytest.raises(SQLFileError) as info:
        load_sql_file(write(tmp_path, 'bad.sql', text))
    assert message in str(info.value)
    assert str(tmp_path) in str(info.value)


def test_sql_file_with_a_byte_order_mark(tmp_path):
    path = tmp_path / 'search.sql'
    path.write_bytes('\ufeff-- cache_time: 20\nSELECT 1'.encode())
    method = load_sql_file(path)
    assert method.cache_time == 20 and not method.writes


def test_sql_file_that_is_not_utf8(tmp_path):
    path = tmp_path / 'latin.sql'
    path.write_bytes('-- caf\xe9\nSELECT 1'.encode('latin-1'))
    with pytest.raises(SQLFileError, match='latin.sql: not UTF-8 text'):
        load_sql_file(path)


def test_sql_file_with_an_empty_tables_line(tmp_path):
    path = tmp_path / 'empty.sql'
    path.write_text('-- tables: ,\nSELECT 1')
    with pytest.raises(
        SQLFileError, match="empty.sql:1: tables = ',' is not table names"
    ):
        load_sql_file(path)


def test_invalidate():
    read = SQLMethod('r', 'SELECT * FROM property')
    assert read.invalidate and read.invalidated_by == {'property'}
    with pytest.raises(ValueError, match='invalidate must be True or False'):
        SQLMethod('r', 'SELECT 1', invalidate='no')
    with pytest.raises(ValueError, match='invalidate=False is for reads'):
        SQLMethod('w', 'UPDATE property SET rent = 1', invalidate=False)


@pytest.mark.parametrize(
    'sql',
    [
        'SELECT id FROM property WHERE area = :area /* AND id = :id */',
        'SELECT id FROM property WHERE area = :area -- or :id\n',
        "SELECT id FROM property WHERE area = ':id' OR area = :area",
    ],
)
def test_a_parameter_in_a_comment_or_a_string_is_refused(sql, server_url):
    # PyMySQL and psycopg2 put the value into the text: in a comment, one
    # holding "*/ OR 1=1 /*" (or a line break) would become SQL.
    with pytest.raises(ConfigurationError, match=r':id stands inside a'):
        make_app(server_url, [SQLMethod('find', sql)])


def test_a_parameter_is_refused_only_where_the_database_reads_a_comment(
    sqlite_url,
):
    # PostgreSQL's #> operator is MySQL's comment: refused on MySQL only.
    sql = 'SELECT id FROM property WHERE area #> :path IS NULL'
    method = SQLMethod('find', sql)
    assert method.hidden == {
        'PostgreSQL or SQLite': {},
        'MySQL': {'path': 'MySQL'},
        'MySQL with NO_BACKSLASH_ESCAPES': {
            'path': 'MySQL with NO_BACKSLASH_ESCAPES'
        },
        'PostgreSQL without standard_conforming_strings': {},
    }
    make_app(sqlite_url, [method])


def test_a_parameter_after_a_string_ending_in_a_backslash_is_refused(
    server_url, sqlite_url
):
    # PostgreSQL without standard_conforming_strings, as MySQL, reads
    # 'C:\' as a string not ended: psycopg2 would put the value of :rest
    # inside it, and "' OR true --" would run as SQL.
    method = SQLMethod('find', "SELECT id FROM t WHERE p LIKE 'C:\\' || :rest")
    with pytest.raises(ConfigurationError, match=r':rest stands inside a'):
        make_app(server_url, [method])
    make_app(sqlite_url, [method])  # which takes a backslash as itself


def test_a_semicolon_in_a_quoted_name_or_string_is_one_statement(db_url, apps):
    # "a;b" is a name to PostgreSQL and SQLite, a string to MySQL; both
    # may stand as a column's alias. Neither ends the statement.
    sql = 'SELECT id AS "a;b" FROM property WHERE area = :area ORDER BY id'
    app = apps(db_url, [SQLMethod('find', sql, cache_time=20)])
    answer = call(app, ('find', {'area': 'Headingley'}))
    assert answer['results'][0]['rows'] == [[1], [2]]
