"""Zope's .zsql files: loaded from a Zope-style layout, each method checked
against hand-written SQL on real databases; values always bound."""

import datetime
import decimal
from pathlib import Path

import pytest
import sqlalchemy as sa
from DateTime import DateTime
from pyramid.config import Configurator
from pyramid.exceptions import ConfigurationError

from pyramid_dbtune import SQLFileError, ZSQLMethod
from pyramid_dbtune.sql.analysis import ANY_TABLE
from pyramid_dbtune.sql.zsql import ABSENT, load_file, load_zsql_file

from conftest import call, create_tables, query_log

PRODUCT = Path(__file__).parent / 'zope_product'
SQL_DIR = PRODUCT / 'sql'

#: (method, arguments, the same query written by hand, its parameters)
EQUIVALENTS = [
    ('search_area', {'area': 'Headingley'},
     'SELECT id, rent FROM property WHERE area = :a ORDER BY id',
     {'a': 'Headingley'}),
    ('find_properties', {},
     'SELECT id, area, rent FROM property ORDER BY id', {}),
    ('find_properties', {'area': 'Headingley'},
     'SELECT id, area, rent FROM property WHERE area = :a ORDER BY id',
     {'a': 'Headingley'}),
    ('find_properties', {'max_rent': '100', 'area': ''},
     'SELECT id, area, rent FROM property WHERE rent <= 100 ORDER BY id',
     {}),
    ('find_properties', {'ids': [1, 3, 4], 'max_rent': 85},
     'SELECT id, area, rent FROM property '
     'WHERE rent <= 85 AND id IN (1, 3, 4) ORDER BY id', {}),
    ('find_properties', {'ids': ['2'], 'also_area': 'Hyde Park'},
     'SELECT id, area, rent FROM property '
     'WHERE id = 2 OR area = :a ORDER BY id', {'a': 'Hyde Park'}),
    ('find_properties', {'ids': [1, 2], 'also_area': 'Burley',
                         'max_rent': 100},
     'SELECT id, area, rent FROM property WHERE rent <= 100 '
     'AND (id IN (1, 2) OR area = :a) ORDER BY id', {'a': 'Burley'}),
    ('area_like', {'fragment': 'ley'},
     "SELECT id FROM property WHERE area LIKE '%ley%' ORDER BY id", {}),
    ('cheap_first', {'cheap_first': 1, 'below': 100},
     'SELECT id, rent FROM property WHERE rent < 100 ORDER BY rent, id', {}),
    ('cheap_first', {},
     'SELECT id, rent FROM property WHERE rent < 1000 '
     'ORDER BY rent DESC, id', {}),
    ('property_count', {}, 'SELECT COUNT(*) AS n FROM property', {}),
]  # fmt: skip


def test_the_product_loads_with_its_headers():
    method = load_zsql_file(SQL_DIR / 'find_properties.zsql')
    assert method.name == 'find_properties'
    assert method.params == ('area', 'max_rent', 'ids', 'also_area')
    assert method.list_params == {'ids'}
    assert (method.max_rows, method.cache_time) == (50, 20)
    assert method.connection_id == 'student_db'
    assert method.title == 'Search with optional criteria'
    assert method.tables == {'property'} and not method.writes
    assert repr(method) == '<ZSQLMethod find_properties (read)>'
    write = load_zsql_file(SQL_DIR / 'set_rent.zsql')
    assert write.writes and write.tables == {'property'}
    count = load_file(SQL_DIR / 'property_count.zsql')
    assert (count.params, count.max_rows, count.max_cache) == ((), 1, None)


def _directory_app(url):
    create_tables(url)
    with Configurator(settings={'dbtune.url': url}) as config:
        config.include('pyramid_dbtune')
        config.add_sql_methods(str(SQL_DIR))
        config.add_route('call', '/call')
        config.add_view(
            'conftest.call_view', route_name='call', renderer='json'
        )
        app = config.make_wsgi_app()
    from webtest import TestApp

    return TestApp(app)


def test_each_method_returns_the_rows_of_its_sql(db_url):
    app = _directory_app(db_url)
    engine = sa.create_engine(db_url)
    try:
        for name, args, sql, params in EQUIVALENTS:
            got = call(app, (name, args))['results'][0]['rows']
            with engine.connect() as connection:
                want = [
                    list(r) for r in connection.execute(sa.text(sql), params)
                ]
            assert want, (name, args)
            assert got == want, (name, args)
        # A write, in the request's transaction, through a sqltest.
        call(app, ('set_rent', {'id': '2', 'rent': 99}))
        with engine.connect() as connection:
            rent = connection.execute(
                sa.text('SELECT rent FROM property WHERE id = 2')
            )
            assert rent.scalar() == 99
    finally:
        engine.dispose()
        app.app.registry.dbtune.router.dispose()


INJECTION = "x' OR '1'='1'; DROP TABLE property; --"


def test_an_injection_through_sqlvar_is_bound_not_run(db_url):
    app = _directory_app(db_url)
    log = query_log(app)
    try:
        for name, args in [
            ('search_area', {'area': INJECTION}),
            ('area_like', {'fragment': INJECTION}),
            ('find_properties', {'area': INJECTION, 'ids': [INJECTION]}),
        ]:
            if name == 'find_properties':
                # type=int refuses it before any SQL is sent.
                with pytest.raises(ValueError, match='must be an integer'):
                    call(app, (name, args))
                continue
            assert call(app, (name, args))['results'][0]['rows'] == []
        assert log.statements
        assert not any('DROP' in s or "'1'" in s for s in log.statements)
        # The table is still there, with its rows.
        rows = call(app, ('property_count', {}))['results'][0]['rows']
        assert rows == [[4]]
    finally:
        app.app.registry.dbtune.router.dispose()


def test_an_unsupported_tag_names_file_line_and_tag(tmp_path):
    path = tmp_path / 'listing.zsql'
    path.write_text(
        '<dtml-comment>\narguments: ids\n</dtml-comment>\n'
        'SELECT * FROM property\n'
        '<dtml-in ids>id = <dtml-sqlvar sequence-item type=int></dtml-in>\n'
    )
    with pytest.raises(SQLFileError) as info:
        load_zsql_file(path)
    assert str(info.value).startswith(f'{path}:5: <dtml-in> is not supported')
    # Through add_sql_methods too, as a ConfigurationError.
    with Configurator(settings={'dbtune.url': 'sqlite://'}) as config:
        config.include('pyramid_dbtune')
        with pytest.raises(
            ConfigurationError, match='listing.zsql:5: <dtml-in'
        ):
            config.add_sql_methods(str(tmp_path))
        config.registry.dbtune.router.dispose()


@pytest.mark.parametrize(
    'header, body, message',
    [
        ('', 'SELECT <dtml-var x sql_quote>', ":1: <dtml-var> names 'x', "
         "which is not in the header's arguments (declared: none)"),
        ('arguments: are', 'SELECT <dtml-var area sql_quote>',
         ":4: <dtml-var> names 'area', which is not in the header's "
         "arguments (did you mean 'are'?)"),
        ('arguments: a', 'SELECT <dtml-var a>', ':4: <dtml-var> without '
         'sql_quote formats a value into the SQL text'),
        ('', 'SELECT 1<dtml-var sql_delimiter>SELECT 2',
         ':1: <dtml-var sql_delimiter>: write one statement per method'),
        ('arguments: a', 'SELECT "<dtml-var a sql_quote>"',
         ':4: <dtml-var> inside double quotes (a name in standard SQL, a '
         'string in MySQL), where a value would not be a bound parameter; '
         'quote it with single quotes'),
        ('arguments: a', "SELECT '<dtml-sqlvar a type=int>'",
         ":4: <dtml-sqlvar> inside a quoted literal is not supported"),
        ('arguments: a', "SELECT 'x</dtml-if>'",
         ":4: <dtml-if> inside a quoted literal"),
        ('arguments: a', "SELECT 'open", ':4: a quoted literal is not closed'),
        ('arguments: a', "SELECT 1 WHERE x = '<dtml-var a\" sql_quote>'",
         ':4: a DTML tag with an unbalanced quote'),
        ('arguments: a', 'SELECT <dtml-sqlvar a>',
         ':4: <dtml-sqlvar> needs a type: one of string, nb, int, float'),
        ('arguments: a', 'SELECT <dtml-sqlvar a type=date>',
         ":4: <dtml-sqlvar>: type='date' is not one of"),
        ('arguments: a', 'SELECT <dtml-sqlvar a type=int fmt=x>',
         ":4: <dtml-sqlvar>: attribute 'fmt' is not supported (accepted: "
         'name, type, optional)'),
        ('arguments: a', 'SELECT <dtml-sqlvar a type=int type=int>',
         ':4: <dtml-sqlvar>: type is given twice'),
        ('arguments: a', 'SELECT <dtml-sqlvar "a + 1" type=int>',
         ':4: <dtml-sqlvar>: expressions ("a + 1") are not supported'),
        ('arguments: a', 'SELECT <dtml-sqlvar type=int>',
         ':4: <dtml-sqlvar> names no argument'),
        ('arguments: a', 'WHERE <dtml-sqltest a type=int column="a;b">',
         ":4: <dtml-sqltest>: column='a;b' is not a column name"),
        ('arguments: a', 'WHERE <dtml-sqltest a type=int op=between>',
         ":4: <dtml-sqltest>: op='between' is not one of eq, ne"),
        ('arguments: a', 'SELECT 1\n<dtml-and>',
         ':5: <dtml-and> outside a <dtml-sqlgroup>'),
        ('arguments: a', '<dtml-sqlgroup>SELECT 1<dtml-else>',
         ':4: <dtml-else> outside a <dtml-if>'),
        ('arguments: a', '<dtml-if a>1<dtml-else>2<dtml-elif a>',
         ':4: <dtml-elif> after <dtml-else>'),
        ('arguments: a', '<dtml-if a>SELECT 1</dtml-sqlgroup>',
         ':4: </dtml-sqlgroup> closes no <dtml-sqlgroup> (<dtml-if> is '
         'open)'),
        ('arguments: a', 'SELECT 1</dtml-if>', ':4: </dtml-if> closes no '
         '<dtml-if>'),
        ('arguments: a', 'SELECT 1\n<dtml-if a>SELECT 2',
         ':5: <dtml-if> is not closed (no </dtml-if>)'),
        ('arguments: a', 'SELECT 1 <dtml-comment> never closed',
         ':4: <dtml-comment> is not closed'),
        # A tag with no > is not a tag: its text would go to the database.
        ('arguments: a', 'SELECT 1 WHERE id = <dtml-sqlvar a type=int',
         ':4: <dtml-sqlvar: a DTML tag not closed with >'),
        ('arguments: a', 'SELECT 1\nWHERE id = <dtml-sqlvar a type=int\n'
         '  AND x = 2', ':5: <dtml-sqlvar: a DTML tag not closed with >'),
        ('arguments: a', '<dtml-if a>SELECT 1</dtml-if',
         ':4: </dtml-if: a DTML tag not closed with >'),
        ('arguments: a', "SELECT 1 WHERE x = '<DTML-var a sql_quote'",
         ':4: <DTML-var: a DTML tag not closed with >'),
        ('arguments: a', 'SELECT &dtml-a; x', ':4: &dtml-a; is not supported: '
         'write DTML as <dtml-...> tags'),
        ('arguments: a', 'SELECT <!--#var a-->', ':4: <!--#var is not '
         'supported'),
        # Inside quotes too: Zope put the value there; here it was text.
        ('arguments: a', "WHERE x = '&dtml.sql_quote-a;'", ':4: '
         "&dtml.sql_quote-a; inside a quoted literal is not supported: "
         "write '<dtml-var name sql_quote>'"),
        ('arguments: a', "WHERE x = 'it''s\n<!--#var a sql_quote-->'",
         ":5: <!--#var inside a quoted literal is not supported"),
        ('arguments: a', 'SELECT "&dtml-a;"', ':4: &dtml-a; is not '
         'supported: write DTML as <dtml-...> tags, not inside double '
         'quotes'),
        ('arguments: a', 'SELECT `<!--#var a-->`', ':4: <!--#var is not '
         'supported: write DTML as <dtml-...> tags, not inside backquotes'),
        ('arguments: a', 'SELECT $q$ &dtml-a; $q$', ':4: &dtml-a; is not '
         'supported: write DTML as <dtml-...> tags, not inside a '
         'dollar-quoted string'),
        ('arguments: a', 'SELECT 1 -- &dtml-a; here', ':4: &dtml-a; is not '
         'supported: write DTML as <dtml-...> tags, not inside a -- '
         'comment'),
        ('arguments: 1a', 'SELECT 1', ":2: arguments = '1a' is not "
         "arguments (argument '1a' is not a Python identifier"),
        ('arguments: a a', 'SELECT 1', "argument 'a' is declared twice"),
        ('max_rows: -1', 'SELECT 1', ":2: max_rows = '-1' is not a whole "
         'number, 0 or more'),
        ('max_cache: \u0665', 'SELECT 1', ":2: max_cache = '\u0665' is not "
         'a whole number, 0 or more'),
        ('cache_time: soon', 'SELECT 1', ":2: cache_time = 'soon' is not a "
         'number of seconds'),
        ('cache_time: -1', 'SELECT 1', ':2: cache_time'),
        ('tables: ,', 'SELECT 1', ":2: tables = ',' is not table names"),
        ('writes: maybe', 'SELECT 1', ':2: writes'),
        ('max_rowz: 3', 'SELECT 1', ":2: unknown header key 'max_rowz' (did "
         "you mean 'max_rows'?"),
        ('class_name: Brain', 'SELECT 1', ':2: class_name: result classes '
         '("brains") are not supported'),
        ('connection_hook: pick', 'SELECT 1', ':2: connection_hook: the '
         'database is chosen by dbtune.url'),
        ('', 'SELECT 1; SELECT 2', 'more than one statement'),
    ],
)  # fmt: skip
def test_load_errors_name_the_file_and_line(tmp_path, header, body, message):
    path = tmp_path / 'm.zsql'
    source = f'<dtml-comment>\n{header}\n</dtml-comment>\n{body}\n'
    path.write_text(source if header else body + '\n')
    with pytest.raises(SQLFileError) as info:
        load_zsql_file(path)
    assert str(info.value).startswith(str(path))
    assert message in str(info.value)


def test_a_semicolon_in_a_quoted_name_or_string_is_one_statement(tmp_path):
    path = tmp_path / 'alias.zsql'
    path.write_text('SELECT id AS "a;b", \'c;d\' FROM property;\n')
    method = load_zsql_file(path)
    statement, _ = method.bind({})
    assert str(statement) == 'SELECT id AS "a;b", \'c;d\' FROM property'


def test_header_odds_and_ends(tmp_path):
    path = tmp_path / 'odd.zsql'
    path.write_text(
        '\n<dtml-comment>\nTitle: odd\nclass_name:\nsome prose\n'
        'author: me\narguments: a b="two words"\n   c:int=3\n'
        'tables: property\nwrites: no\n</dtml-comment>\n\n'
        'SELECT <dtml-sqlvar a type=string>, <dtml-sqlvar b type=string>,'
        ' <dtml-sqlvar c type=int>;\n'
    )
    method = load_zsql_file(path)
    assert method.title == 'odd'
    assert method.arguments == {'a': ABSENT, 'b': 'two words', 'c': '3'}
    assert method.tables == {'property'} and method.writes is False
    statement, binds = method.bind({'a': 'x'})
    assert binds == {'a': 'x', 'b': 'two words', 'c': 3}
    assert str(statement) == 'SELECT :a, :b, :c'
    # Lines are counted from the file's first, blank lines before the
    # header included: in the header, and in the statement after it.
    lines = tmp_path / 'lines.zsql'
    for header, body, line in [('max_rowz: 1', 'SELECT 1', 4),
                               ('', 'SELECT\n<dtml-in a>', 7)]:  # fmt: skip
        lines.write_text(
            f'\n\n<dtml-comment>\n{header}\n</dtml-comment>\n{body}\n'
        )
        with pytest.raises(SQLFileError) as info:
            load_zsql_file(lines)
        assert str(info.value).startswith(f'{lines}:{line}: ')
    (tmp_path / 'bad.zsql').write_bytes(b'\xff\xfe')
    with pytest.raises(SQLFileError, match='not UTF-8'):
        load_zsql_file(tmp_path / 'bad.zsql')
    with pytest.raises(SQLFileError, match=r'ends in \.sql or \.zsql'):
        load_file(tmp_path / 'x.txt')
    renamed = load_zsql_file(path, name='other', cache_time=5)
    assert (renamed.name, renamed.cache_time) == ('other', 5)
    with pytest.raises(SQLFileError, match="SQL method name '1x'"):
        load_zsql_file(path, name='1x')


def test_a_header_after_comments_is_read(tmp_path, sqlite_url, apps):
    path = tmp_path / 'by_area.zsql'
    path.write_text(
        '-- Properties of an area, cheapest first\n\n'
        '/* for the menu:\n   one row is enough */\n'
        '<dtml-comment>\narguments: area\nmax_rows: 1\n</dtml-comment>\n'
        'SELECT id FROM property WHERE <dtml-sqltest area type=string>\n'
        'ORDER BY rent <dtml-in area>\n'
    )
    with pytest.raises(SQLFileError, match=r'by_area\.zsql:10: <dtml-in>'):
        load_zsql_file(path)
    path.write_text(path.read_text().replace(' <dtml-in area>', ''))
    app = apps(sqlite_url, [load_zsql_file(path)])
    got = call(app, ('by_area', {'area': 'Headingley'}))['results'][0]
    assert (got['rows'], got['truncated']) == ([[1]], True)


@pytest.mark.parametrize(
    'source, line',
    [
        ('SELECT 1\n<dtml-comment>\nmax_rows: 0\n</dtml-comment>\n', 3),
        ('<dtml-comment>\ntitle: t\n</dtml-comment>\nSELECT 1\n'
         '<dtml-comment>\n  Cache-Time: 60\n\n</dtml-comment>', 6),
    ],
)  # fmt: skip
def test_header_keys_after_the_statement_begins_are_refused(
    tmp_path, source, line
):
    path = tmp_path / 'late.zsql'
    path.write_text(source)
    with pytest.raises(SQLFileError) as info:
        load_zsql_file(path)
    assert str(info.value).startswith(f'{path}:{line}: ')
    assert 'the header must come first' in str(info.value)
    # A comment of prose, or a key the header does not know, is a comment,
    # though a line of it reads as a key.
    for prose in ('note: old', 'Why so:\nTables: property only; see docs.'):
        path.write_text(
            f'SELECT 1\n<dtml-comment>\n{prose}\n</dtml-comment>\n'
        )
        assert load_zsql_file(path).bind({})[0].text.strip() == 'SELECT 1'


def test_an_indented_header_line_of_its_own_is_not_an_argument(
    tmp_path, sqlite_url, apps
):
    path = tmp_path / 'by_area.zsql'
    path.write_text(
        '<dtml-comment>\n    title: Area search\n    arguments: area\n'
        '      below:int\n    invalidate: no\n    cache_time: 60\n'
        '    by rent, cheapest first\n</dtml-comment>\n'
        'SELECT id FROM property WHERE <dtml-sqltest area type=string>\n'
        '<dtml-if below>AND rent < <dtml-sqlvar below type=int></dtml-if>\n'
        'ORDER BY rent\n'
    )
    method = load_zsql_file(path)
    assert list(method.arguments) == ['area', 'below']
    write = {
        'name': 'set_rent',
        'sql': 'UPDATE property SET rent = :rent WHERE id = :id',
    }
    app = apps(sqlite_url, [method, write])
    area = ('by_area', {'area': 'Headingley', 'below': 100})
    assert call(app, area)['results'][0]['rows'] == [[1]]
    call(app, ('set_rent', {'id': 2, 'rent': 50}))
    # invalidate: no keeps the rows for their cache_time, as Zope did.
    again = call(app, area)
    assert again['results'][0]['rows'] == [[1]] and again['cache']['hit']
    # A key indented under an unindented arguments line is a key too.
    path.write_text(
        '<dtml-comment>\narguments: area\n  writes: yes\n</dtml-comment>\n'
        'SELECT 1 WHERE <dtml-sqltest area type=string>\n'
    )
    method = load_zsql_file(path)
    assert (list(method.arguments), method.writes) == (['area'], True)


def test_zopes_params_source_form_is_read(tmp_path, sqlite_url, apps):
    # What Zope's document_src() writes: <params>, then the template.
    path = tmp_path / 'by_area.zsql'
    path.write_text(
        '<params>area\nbelow:int=1000</params>\n'
        'SELECT id FROM property WHERE <dtml-sqltest area type=string>\n'
        'AND rent < <dtml-sqlvar below type=int> ORDER BY id\n'
    )
    method = load_zsql_file(path)
    assert method.tables == {'property'} and not method.writes
    app = apps(sqlite_url, [method])
    got = call(
        app,
        ('by_area', {'area': 'Headingley'}),
        ('by_area', {'area': 'Headingley', 'below': 100}),
    )
    assert [r['rows'] for r in got['results']] == [[[1], [2]], [[1]]]
    # The same arguments may be in a header after it too (the source of
    # a method read from a file); its other keys are read.
    header = (
        '<dtml-comment>\narguments: area below:int=1000\nmax_rows: 1\n'
        '</dtml-comment>\n'
    )
    path.write_text(path.read_text().replace('>\n', f'>\n{header}', 1))
    assert load_zsql_file(path).max_rows == 1
    for source, message in [
        ('\n<params>1a</params>\nSELECT 1', ":2: arguments = '1a' is not"),
        ('<params>a</params>\nSELECT\n<dtml-in a>', ':3: <dtml-in>'),
        (f'<params>area</params>{header}SELECT 1',
         ': arguments are given by <params> and by the header'),
    ]:  # fmt: skip
        path.write_text(source)
        with pytest.raises(SQLFileError, match=message):
            load_zsql_file(path)


def zsql(template, arguments='a b', **kw):
    return ZSQLMethod('m', template, arguments=arguments, **kw)


def render(method, **args):
    statement, binds = method.bind(args)
    return ' '.join(str(statement).split()), binds


def test_sqlvar_binds_typed_values_and_null():
    method = zsql(
        'SELECT <dtml-sqlvar a type=int>, <dtml-sqlvar b type=nb optional>'
    )
    assert render(method, a=' 7 ') == ('SELECT :a, :b', {'a': 7, 'b': None})
    assert render(method, a=7.9, b='')[1] == {'a': 7, 'b': None}
    assert render(method, a='1', b=b'y')[1] == {'a': 1, 'b': 'y'}
    assert render(method, a=None, b=3)[1] == {'a': None, 'b': '3'}
    floats = zsql('SELECT <dtml-sqlvar a type=float>', 'a')
    assert render(floats, a='2.5')[1] == {'a': 2.5}
    assert render(floats, a=2)[1] == {'a': 2.0}
    for value, message in [
        ('x', "argument 'a' must be an integer, not 'x'"),
        (True, 'must be an integer, not True'),
        ('', "argument 'a' must not be empty"),
    ]:
        with pytest.raises(ValueError, match=message):
            method.bind({'a': value})
    with pytest.raises(ValueError, match="'a' must be a number, not 'x'"):
        floats.bind({'a': 'x'})
    with pytest.raises(ValueError, match="'a' must be a number, not True"):
        floats.bind({'a': True})
    with pytest.raises(TypeError, match=r"ZSQL method m\(\): argument 'a' is"):
        method.bind({})
    with pytest.raises(TypeError, match="unexpected argument 'c'"):
        method.bind({'a': 1, 'c': 2})
    strings = zsql('SELECT <dtml-sqlvar a type=string>', 'a')
    assert render(strings, a='')[1] == {'a': ''}
    with pytest.raises(ValueError, match=r"'a' cannot be bound: \[1\]"):
        strings.bind({'a': [1]})
    # Anything else is bound as its text, as Zope wrote it.
    when = DateTime('2024/01/02 03:04:05 UTC')
    assert render(strings, a=when)[1] == {'a': '2024/01/02 03:04:05 UTC'}


def test_sqltest_one_many_none():
    method = zsql(
        'SELECT 1 WHERE <dtml-sqltest a type=int column=t.x op=ne multiple>'
    )
    assert render(method, a=[1]) == ('SELECT 1 WHERE t.x <> :a', {'a': 1})
    text, binds = render(method, a=(1, '2'))
    assert 'NOT IN' in text and binds == {'a': [1, 2]}
    with pytest.raises(ValueError, match="'a' was given no value"):
        method.bind({'a': ['', ' ']})
    with pytest.raises(TypeError, match="'a' is missing"):
        method.bind({})
    single = zsql('SELECT 1 WHERE <dtml-sqltest a type=string>', 'a')
    with pytest.raises(ValueError, match="'a' takes one value, not a list"):
        single.bind({'a': ['x', 'y']})
    assert render(single, a='')[1] == {'a': ''}
    # None is refused: neither the text 'None' nor a test left out.
    optional = zsql('SELECT 1 WHERE <dtml-sqltest a type=string optional>')
    for method in (single, optional):
        with pytest.raises(ValueError, match="'a' is None: to test for NULL"):
            method.bind({'a': None})
    # Bytes that are not UTF-8: the argument named.
    with pytest.raises(ValueError, match="'a' is not UTF-8 text"):
        single.bind({'a': b'\xff'})


def test_sqlgroup_joins_what_is_given():
    method = zsql(
        'UPDATE t <dtml-sqlgroup set noparens>'
        '<dtml-if a>a = <dtml-sqlvar a type=int></dtml-if><dtml-comma>'
        '<dtml-unless b>b = 0</dtml-unless>'
        '</dtml-sqlgroup> <dtml-sqlgroup where required>'
        '<dtml-sqltest a type=int optional><dtml-or>'
        '<dtml-sqltest b type=int optional></dtml-sqlgroup>',
    )
    assert method.writes and method.tables == {'t'}
    assert render(method, a=1) == (
        'UPDATE t SET a = :a , b = 0 WHERE t.a = :a_2'.replace('t.a', 'a'),
        {'a': 1, 'a_2': 1},
    )
    assert render(method, b=2)[0] == 'UPDATE t WHERE b = :b'
    with pytest.raises(ValueError, match='the <dtml-sqlgroup required> of '
                       'line 1 needs at least one of its tests'):  # fmt: skip
        method.bind({})


def test_if_elif_else():
    method = zsql(
        'SELECT <dtml-if a>1<dtml-elif b>2<dtml-else>3</dtml-if>'
        '<dtml-if b> + 10</dtml-if>'
    )
    assert render(method, a='x')[0] == 'SELECT 1'
    assert render(method, a='', b=True)[0] == 'SELECT 2 + 10'
    assert render(method)[0] == 'SELECT 3'


def test_literals_and_colons():
    method = zsql(
        "SELECT 'it''s <dtml-var a sql_quote>!' AS x, '10:30' AS t, "
        "'<dtml-var a sql_quote><dtml-var b sql_quote>' AS y "
        "-- don't, :b"
    )
    text, binds = render(method, a="o'k", b=2)
    assert binds == {'a': "it's o'k!", 'a_2': "o'k2"}
    assert ":a AS x, '10:30' AS t, :a_2 AS y" in text
    with pytest.raises(TypeError, match="'b' is missing"):
        method.bind({'a': 1})
    with pytest.raises(TypeError, match="'a' is missing"):
        zsql("SELECT '<dtml-var a sql_quote>'").bind({})
    with pytest.raises(ValueError, match="'a' cannot be bound"):
        zsql("SELECT '<dtml-var a sql_quote>'").bind({'a': [1]})
    plain = zsql("SELECT 'no tags', :b", arguments=['b'])
    assert plain.params == ('b',) and str(plain.bind({})[0]).endswith(':b')


def test_statements_are_kept_per_shape():
    method = zsql('SELECT 1 <dtml-sqlgroup where><dtml-sqltest a type=int '
                  'optional multiple></dtml-sqlgroup>')  # fmt: skip
    first = method.bind({'a': [1, 2]})[0]
    assert method.bind({'a': [3, 4, 5]})[0] is first
    assert method.bind({})[0] is not first
    # The key: the text rendered, and the values bound.
    assert method.values({}) == ('SELECT 1',)
    assert method.values({'b': 1}) == ('SELECT 1',)
    assert method.values({'a': ['1', 2.0]}) == (
        'SELECT 1 WHERE\na IN \0a\0',
        [1, 2],
    )
    with pytest.raises(TypeError, match="unexpected argument 'c'"):
        method.values({'c': 1})
    # As in Zope (and the docs' warning): an empty list drops the test.
    for empty in ([], set(), ()):
        assert render(method, a=empty) == ('SELECT 1', {})
        assert method.values({'a': empty}) == method.values({})


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="'m': template must be text"):
        ZSQLMethod('m', None)
    # Names given as a list or a dict are checked as a string's are.
    for arguments in (['a-b'], {'a b': 1}, [1]):
        with pytest.raises(ValueError, match='is not a Python identifier'):
            ZSQLMethod('m', 'SELECT <dtml-sqlvar a type=int>',
                       arguments=arguments)  # fmt: skip
    with pytest.raises(SQLFileError, match=r'^<ZSQL method m>:4: <dtml-in>'):
        ZSQLMethod('m', '\n\nSELECT\n<dtml-in x>')


def test_absent_is_one_value_that_survives_pickling():
    import pickle

    assert pickle.loads(pickle.dumps(ABSENT)) is ABSENT
    assert repr(ABSENT) == '<absent>'


def test_cached_calls_of_different_shapes_do_not_share_rows(sqlite_url, apps):
    method = load_zsql_file(SQL_DIR / 'find_properties.zsql')
    app = apps(sqlite_url, [method])
    log = query_log(app)
    everything = call(app, ('find_properties', {}))
    some = call(app, ('find_properties', {'area': 'Burley'}))
    again = call(
        app, ('find_properties', {}), ('find_properties', {'area': 'Burley'})
    )
    assert len(everything['results'][0]['rows']) == 4
    assert some['results'][0]['rows'] == [[4, 'Burley', 70]]
    assert [r['rows'] for r in again['results']] == [
        everything['results'][0]['rows'],
        some['results'][0]['rows'],
    ]
    assert again['cache']['hit'] == 2 and log.count('FROM property') == 2


def test_check_names_allows_any_subset():
    method = zsql('SELECT <dtml-sqlvar a type=int optional>')
    # Each subset of the arguments passes (None; an error would raise).
    assert method.check_names({}) is None
    assert method.check_names({'a': 1, 'b': 2}) is None
    with pytest.raises(TypeError, match="unexpected argument 'c'; it takes"):
        method.check_names({'c': 1})


# Templates where a value would land inside what a database reads as a
# comment, a string or a name: PyMySQL fills parameters in itself, so the
# value's text would become SQL. Each is refused when it loads.
REFUSED = [
    ("SELECT 1 /* AND a = <dtml-sqlvar a type=nb> */",
     ':1: <dtml-sqlvar> inside a /* */ comment'),
    ('SELECT 1\n-- AND a = <dtml-sqlvar a type=nb>',
     ':2: <dtml-sqlvar> inside a -- comment'),
    ('SELECT 1 # AND a = <dtml-sqlvar a type=nb>',
     ':1: <dtml-sqlvar> inside a # comment'),
    ("SELECT 1 # the user's rows\nWHERE a = '<dtml-var a sql_quote>'",
     ":1: ' after # on a line: MySQL reads # as a comment"),
    ('SELECT 1 WHERE a LIKE "%<dtml-var a sql_quote>%"',
     ':1: <dtml-var> inside double quotes'),
    ('SELECT `<dtml-sqlvar a type=nb>`', ':1: <dtml-sqlvar> inside '
     'backquotes'),
    ('SELECT $$<dtml-sqlvar a type=nb>$$', ':1: <dtml-sqlvar> inside a '
     'dollar-quoted string'),
    ('SELECT $q$ x <dtml-var a sql_quote> $q$', ':1: <dtml-var> inside a '
     'dollar-quoted string'),
    ("SELECT 1 WHERE b <> 'it\\'s' AND a = '<dtml-var a sql_quote>'",
     ':1: a backslash before a quote inside a quoted literal'),
    ("SELECT 'x\\' AND a = <dtml-sqlvar a type=nb> -- '",
     ':1: a backslash before a quote'),
    ("SELECT E'it\\'s' /* don't */, '<dtml-var a sql_quote>'",
     ':1: a backslash before a quote'),
    ('SELECT "a\\"", <dtml-sqlvar a type=nb>', ':1: a backslash before a " '
     'inside double quotes'),
    ('SELECT 1 /* a /* b */ <dtml-sqlvar a type=nb> */', ':1: /* inside '
     'a /* */ comment: PostgreSQL nests comments'),
    ('SELECT 1 /*! , <dtml-sqlvar a type=nb> */', ":1: MySQL's executable "
     'comments'),
    ('SELECT 1 /* open', ':1: /* ... is not closed'),
    ('SELECT "open', ':1: " ... is not closed'),
    ('SELECT $$ open', ':1: $$ ... is not closed'),
    ("SELECT N'<dtml-var a sql_quote>'", ":1: a prefixed literal (N'...')"),
    ("SELECT E'%<dtml-var a sql_quote>'", ":1: a prefixed literal (E'...')"),
    # Found in the rendered text: glued to a name; or a string as MySQL
    # reads it (-- needs a space after it there; $$ is not a quote).
    ('SELECT t_<dtml-sqlvar a type=int>', ':1: <dtml-sqlvar a type=int>: '
     'the value would not be a bound parameter, glued to the text before '
     'it'),
    ("SELECT 1 --'\n, <dtml-sqlvar a type=nb> --'", ':2: <dtml-sqlvar a '
     'type=nb>: the value would not be a bound parameter, inside a string, '
     'a quoted name or a comment as MySQL reads the statement'),
    ("SELECT $$ ' $$, <dtml-sqlvar a type=nb>, $$ ' $$", ':1: '
     '<dtml-sqlvar a type=nb>: the value would not be a bound parameter, '
     'inside a string, a quoted name or a comment as MySQL reads'),
    ('<dtml-if a>SELECT 1<dtml-else>SELECT 2 --\'\n</dtml-if>, '
     '<dtml-sqlvar a type=nb> --\'', ':2: <dtml-sqlvar a type=nb>: the '
     'value would not be a bound parameter, inside a string'),
    # Zope formatted it in as text: bound, it is a string.
    ('SELECT 1 ORDER BY <dtml-var a sql_quote>', ':1: <dtml-var a '
     'sql_quote> outside quotes is not supported'),
    ('SELECT <dtml-sqlvar a type=int><dtml-var b sql_quote>', ':1: '
     '<dtml-var b sql_quote> outside quotes'),
]  # fmt: skip


@pytest.mark.parametrize('template, message', REFUSED)
def test_a_value_that_would_not_be_bound_is_refused(template, message):
    with pytest.raises(SQLFileError) as info:
        zsql(template)
    assert str(info.value).startswith(f'<ZSQL method m>{message}')


def test_a_text_rendered_first_on_a_call_is_checked_then():
    # Seven <dtml-if>s render 128 texts, more than are read at load: the
    # one that hides the value, from MySQL, is refused on its first call.
    ifs = ''.join(f'<dtml-if b> {n}</dtml-if>' for n in range(6))
    method = zsql(
        f"SELECT <dtml-if a>1<dtml-else>2 --'\n</dtml-if>{ifs}, "
        "<dtml-sqlvar b type=nb> --'"
    )
    assert method.tables == {ANY_TABLE} and not method.writes
    assert render(method, a=1, b='x')[1] == {'b': 'x'}
    with pytest.raises(ValueError) as info:
        method.bind({'b': 'x'})
    assert str(info.value).startswith(
        '<ZSQL method m>:2: <dtml-sqlvar b type=nb>: the value would not be '
        'a bound parameter, inside a string, a quoted name or a comment as '
        'MySQL reads the statement'
    )
    assert not isinstance(info.value, SQLFileError)
    write = zsql(f'UPDATE t SET x = 1 {ifs}<dtml-if a>, y = 2</dtml-if>')
    assert write.writes and write.tables is None


def test_the_scanner_reads_comments_names_and_dollar_quotes():
    method = zsql(
        "SELECT 1 AS \"it's\", `b`, $$ don't $$, $t$ ' $t$ -- it's\n"
        "/* that's */ # it is\n"
        "WHERE a = '<dtml-var a sql_quote>' AND x = '\\\\n'"
    )
    text, binds = render(method, a="o'k")
    assert binds == {'a': "o'k"}
    assert text.endswith("WHERE a = :a AND x = '\\\\n'")


def test_a_value_glued_to_text_is_put_in_parentheses():
    method = zsql(
        'SELECT <dtml-sqlvar a type=string>::date, '
        "'<dtml-var a sql_quote>'::date, x[<dtml-sqlvar b type=int>:"
        '<dtml-sqlvar b type=int>], <dtml-sqlvar a type=nb>x, '
        'CAST(<dtml-sqlvar a type=string> AS date) '
        'LIMIT <dtml-sqlvar b type=int>'
    )
    text, binds = render(method, a='2024-01-02', b=2)
    assert text == (
        'SELECT (:a)::date, (:a_2)::date, x[(:b):(:b_2)], (:a_3)x, '
        'CAST(:a_4 AS date) LIMIT :b_3'
    )
    assert sa.text(text).compile().params.keys() == binds.keys()


def test_pg_casts_and_slices_of_bound_values(postgresql_url):
    method = zsql(
        'SELECT <dtml-sqlvar a type=string>::date AS d, '
        "'<dtml-var a sql_quote>'::date AS e, "
        '(ARRAY[1, 2, 3, 4])[<dtml-sqlvar b type=int>:'
        '<dtml-sqlvar b type=int> + 1] AS s, '
        'CAST(<dtml-sqlvar a type=string> AS date) AS c'
    )
    engine = sa.create_engine(postgresql_url)
    try:
        with engine.connect() as connection:
            row = connection.execute(*method.bind({'a': '2024-01-02', 'b': 2}))
            day = datetime.date(2024, 1, 2)
            assert list(row.one()) == [day, day, [2, 3], day]
    finally:
        engine.dispose()


def test_numbers_are_bound_as_zopes_literals_were_typed(db_url):
    # On PostgreSQL: a NULL test of an int has a type; two small ints
    # multiply past a smallint; a float's text keeps all its digits.
    method = zsql(
        'SELECT <dtml-sqlvar a type=int optional> IS NULL AS absent, '
        '<dtml-sqlvar b type=int> * <dtml-sqlvar b type=int> AS product, '
        '<dtml-sqlvar c type=float> AS exact, '
        'CAST(<dtml-sqlvar d type=float optional> AS DECIMAL) IS NULL AS none',
        'a b c d',
    )
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as connection:
            row = connection.execute(
                *method.bind({'b': 300, 'c': '1234567890.123456789'})
            ).one()
    finally:
        engine.dispose()
    assert (row.absent, row.product, row.none) == (1, 90000, 1)
    if not db_url.startswith('sqlite'):  # whose numbers are floats
        assert row.exact == decimal.Decimal('1234567890.123456789')


def mysql_modes(url):
    """Engines on ``url``: as it is, and, for MySQL, each sql_mode that
    changes how strings are read."""
    yield sa.create_engine(url)
    if url.startswith('mysql'):
        for mode in ('NO_BACKSLASH_ESCAPES', 'ANSI_QUOTES'):
            engine = sa.create_engine(url)

            @sa.event.listens_for(engine, 'connect')
            def _mode(dbapi, record, mode=mode):
                cursor = dbapi.cursor()
                cursor.execute(f"SET SESSION sql_mode = '{mode}'")
                cursor.close()

            yield engine


#: (safe template, hostile arguments): the value is data, and finds no row.
HOSTILE = [
    ('SELECT name FROM users WHERE name = <dtml-sqlvar n type=nb> '
     '/* the name */', {'n': '*/ OR 1=1 /*'}),
    ("SELECT name FROM users WHERE name LIKE '%<dtml-var n sql_quote>%'",
     {'n': 'zzz" OR 1=1 OR "'}),
    ("SELECT name FROM users WHERE name LIKE '%<dtml-var n sql_quote>%'",
     {'n': "zzz' OR 1=1 OR '"}),
    ("SELECT name FROM users -- the user's rows\n"
     "WHERE name = '<dtml-var n sql_quote>' /* that's it */",
     {'n': ' OR 1=1 OR '}),
    ("SELECT name FROM users WHERE note <> 'it''s' AND "
     "name = '<dtml-var n sql_quote>'", {'n': "\\' OR 1=1 -- "}),
    ('SELECT name FROM users <dtml-sqlgroup where>'
     '<dtml-sqltest n column=name type=nb optional> -- why\n<dtml-or>'
     '<dtml-sqltest m column=name type=nb multiple optional>'
     '</dtml-sqlgroup>', {'n': "x' OR 1=1 -- ", 'm': ['y', '*/']}),
]  # fmt: skip


def test_hostile_values_are_data_on_each_server(server_url):
    """Each vector's refused template, written as it should be: on
    PostgreSQL and MariaDB (each string mode), the value finds no row."""
    for engine in mysql_modes(server_url):
        try:
            with engine.begin() as connection:
                connection.execute(
                    sa.text(
                        'CREATE TABLE IF NOT EXISTS users '
                        '(name VARCHAR(40), note VARCHAR(40))'
                    )
                )
                connection.execute(sa.text('DELETE FROM users'))
                connection.execute(
                    sa.text("INSERT INTO users VALUES ('alice', 'x')")
                )
            for template, args in HOSTILE:
                method = ZSQLMethod('m', template, arguments='n m')
                with engine.connect() as connection:
                    rows = connection.execute(*method.bind(args)).all()
                assert rows == [], (template, args)
        finally:
            engine.dispose()


def test_a_comment_in_a_group_part_ends_with_its_line(server_url):
    method = ZSQLMethod(
        'm',
        'SELECT id FROM doc\n'
        '<dtml-sqlgroup where>\n'
        '  <dtml-sqltest area type=nb optional>   -- the area searched\n'
        '<dtml-and>\n'
        "  <dtml-sqltest owner type=int>          -- the caller's rows\n"
        '</dtml-sqlgroup> ORDER BY id',
        arguments='owner area',
    )
    engine = sa.create_engine(server_url)
    try:
        with engine.begin() as connection:
            connection.execute(
                sa.text('CREATE TABLE doc (id INT, owner INT, area CHAR(9))')
            )
            connection.execute(
                sa.text(
                    "INSERT INTO doc VALUES (1, 1, 'Leeds'), (2, 2, 'Leeds'),"
                    " (3, 2, 'York')"
                )
            )
        with engine.connect() as connection:
            for args, want in [
                ({'owner': 1, 'area': 'Leeds'}, [1]),
                ({'owner': 2}, [2, 3]),
                ({'owner': 2, 'area': 'York'}, [3]),
            ]:
                rows = connection.execute(*method.bind(args))
                assert [r.id for r in rows] == want
    finally:
        engine.dispose()


def test_each_if_branch_is_read_for_tables(sqlite_url, apps):
    engine = sa.create_engine(sqlite_url)
    with engine.begin() as connection:
        for table in ('orders', 'orders_archive'):
            connection.execute(
                sa.text(f'CREATE TABLE {table} (id INT, total INT)')
            )
        connection.execute(sa.text('INSERT INTO orders VALUES (1, 10)'))
    engine.dispose()
    read = zsql(
        'SELECT id, total FROM <dtml-if a>orders_archive<dtml-else>orders'
        '</dtml-if> <dtml-if b>WHERE id > 0</dtml-if> ORDER BY id',
        cache_time=300,
    )
    assert read.tables == {'orders', 'orders_archive'}
    write = {
        'name': 'set_total',
        'sql': 'UPDATE orders SET total = :total WHERE id = :id',
    }
    app = apps(sqlite_url, [read, write], tables=False)
    assert call(app, ('m', {}))['results'][0]['rows'] == [[1, 10]]
    call(app, ('set_total', {'id': 1, 'total': 99}))
    again = call(app, ('m', {}))
    assert again['results'][0]['rows'] == [[1, 99]]
    assert again['cache']['miss'] == 1


def test_calls_that_bind_different_values_do_not_share_rows(sqlite_url, apps):
    method = zsql(
        "SELECT <dtml-sqlvar a type=string> AS a, 'x<dtml-var a sql_quote>'"
        ' AS b, <dtml-sqlvar b type=int optional> AS c',
        cache_time=60,
    )
    utc = datetime.datetime(2024, 1, 1, 12, tzinfo=datetime.timezone.utc)
    cet = utc.astimezone(datetime.timezone(datetime.timedelta(hours=1)))
    args = [
        {'a': decimal.Decimal('1.0')}, {'a': decimal.Decimal('1')},
        {'a': 0.0}, {'a': -0.0}, {'a': utc}, {'a': cet},
    ]  # fmt: skip

    def view(request):
        rows = [list(request.sql.m(**a)[0]) for a in args]
        return {'rows': rows, 'cache': request.dbtune.cache}

    app = apps(sqlite_url, [method], tables=False, views={'/v': view})
    got = app.get('/v').json
    want = [str(a['a']) for a in args]
    assert [r[:2] for r in got['rows']] == [[w, f'x{w}'] for w in want]
    assert got['cache']['hit'] == 0
    # Values bound the same share: 1, ' 1', 1.0, Decimal('1.0') for int.
    args = [{'a': 'z', 'b': b} for b in (1, ' 1', 1.0, args[0]['a'], None)]
    same = app.get('/v').json
    assert [r[2] for r in same['rows']] == [1, 1, 1, 1, None]
    assert same['cache']['hit'] == 3


def test_arguments_only_tested_need_not_be_bindable(sqlite_url, apps):
    method = zsql(
        'SELECT 1 AS one <dtml-if a>, 2 AS two</dtml-if>', cache_time=60
    )
    app = apps(sqlite_url, [method], tables=False)
    got = call(app, ('m', {'a': {'x': 1}}), ('m', {'a': {'y': 2}}))
    assert [r['rows'] for r in got['results']] == [[[1, 2]], [[1, 2]]]
    assert got['cache']['hit'] == 1
    bound = zsql("SELECT '<dtml-var a sql_quote>'", cache_time=60)
    app = apps(sqlite_url, [bound], tables=False)
    with pytest.raises(ValueError, match="'a' cannot be bound: {'x': 1}"):
        call(app, ('m', {'a': {'x': 1}}))


def test_numbers_decimals_and_sets():
    ints = zsql('SELECT <dtml-sqlvar a type=int>', 'a')
    floats = zsql('SELECT <dtml-sqlvar a type=float>', 'a')
    assert ints.bind({'a': decimal.Decimal('3.0')})[1] == {'a': 3}
    assert floats.bind({'a': decimal.Decimal('0.5')})[1] == {'a': 0.5}
    assert str(floats.bind({'a': -0.0})[1]['a']) == '0.0'
    for value in (float('inf'), decimal.Decimal('1.5'),
                  decimal.Decimal('NaN'), '1.5', object()):  # fmt: skip
        with pytest.raises(ValueError, match='must be an integer, not'):
            ints.bind({'a': value})
    tests = zsql('SELECT 1 WHERE <dtml-sqltest a type=int multiple>', 'a')
    assert tests.bind({'a': {3, 1, '2'} - {'2'} | {2}})[1] == {'a': [1, 2, 3]}
    with pytest.raises(ValueError, match='must be an integer'):
        tests.bind({'a': {1, 'x'}})
    # No column holds NaN and the infinities in every database.
    for value in ('nan', float('inf'), '-inf', decimal.Decimal('NaN')):
        with pytest.raises(ValueError, match='must be a number, not'):
            floats.bind({'a': value})
    assert ints.bind({'a': 10**400})[1] == {'a': 10**400}  # no float


def test_a_multiple_test_glued_to_the_next_word(sqlite_url):
    # As Zope rendered it: id in (1, 2)AND ..., one value or a list.
    method = zsql(
        'SELECT id FROM item WHERE <dtml-sqltest ids column=id type=int '
        'multiple>AND <dtml-sqltest not_ids column=id op=ne type=int '
        'multiple>AND id > 0 ORDER BY id',
        'ids not_ids',
    )
    engine = sa.create_engine(sqlite_url)
    try:
        with engine.begin() as connection:
            connection.execute(sa.text('CREATE TABLE item (id INT)'))
            connection.execute(
                sa.text('INSERT INTO item VALUES (1), (2), (3)')
            )
        with engine.connect() as connection:
            for args, want in [
                ({'ids': [1], 'not_ids': 2}, [1]),
                ({'ids': [1, 2, 3], 'not_ids': 2}, [1, 3]),
                ({'ids': (3, 2), 'not_ids': [1, 3]}, [2]),
            ]:
                rows = connection.execute(*method.bind(args))
                assert [r.id for r in rows] == want, args
    finally:
        engine.dispose()


def test_a_group_part_that_is_only_a_hash_comment_is_dropped(mysql_url):
    method = zsql(
        'SELECT id FROM item\n<dtml-sqlgroup where>\n'
        '  <dtml-sqltest a column=id type=int optional> # by id\n'
        '<dtml-and>\n'
        '  <dtml-sqltest b column=name type=string optional>\n'
        '</dtml-sqlgroup> ORDER BY id'
    )
    assert render(method, b='x')[0] == (
        'SELECT id FROM item WHERE name = :b ORDER BY id'
    )
    engine = sa.create_engine(mysql_url)
    try:
        with engine.begin() as connection:
            connection.execute(
                sa.text('CREATE TABLE item (id INT, name VARCHAR(9))')
            )
            connection.execute(
                sa.text("INSERT INTO item VALUES (1, 'apple'), (2, 'pear')")
            )
        with engine.connect() as connection:
            for args, want in [
                ({'b': 'pear'}, [2]),
                ({'a': 1}, [1]),
                ({'a': 2, 'b': 'pear'}, [2]),
                ({}, [1, 2]),
            ]:
                rows = connection.execute(*method.bind(args))
                assert [r.id for r in rows] == want, args
    finally:
        engine.dispose()
