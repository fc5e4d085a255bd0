"""ZCML: an app configured in ZCML alone; the dbtune: directives' errors."""

import pytest
from pyramid.config import Configurator
from webtest import TestApp
from zope.configuration.exceptions import ConfigurationError as ZCMLError

from test_zsql import PRODUCT

from conftest import call, create_tables, query_log


def zcml_app(url, zcml=PRODUCT / 'configure.zcml', tables=True):
    if tables:
        create_tables(url)
    with Configurator(settings={'dbtune.url': url}) as config:
        config.include('pyramid_zcml')
        config.load_zcml(str(zcml))
        return TestApp(config.make_wsgi_app())


def test_an_app_in_zcml_serves_a_cached_sql_method(db_url):
    app = zcml_app(db_url)
    try:
        log = query_log(app)
        methods = app.app.registry.dbtune.methods
        assert {'search_area', 'search_briefly', 'areas'} <= set(methods)
        assert methods['search_briefly'].method.max_rows == 1
        assert methods['search_briefly'].cache_time == 1.5
        assert methods['areas'].cache_time == 30
        calls = [('search_area', {'area': 'Headingley'})] * 2
        first = call(app, *calls, ('areas', {}))
        second = call(app, *calls, ('search_briefly', {'area': 'Headingley'}))
        assert first['results'][0]['rows'] == [[1, 90], [2, 120]]
        assert first['results'][2]['rows'] == [['Burley'], ['Headingley']]
        assert second['results'][2]['rows'] == [[1, 90]]
        assert (first['cache']['hit'], second['cache']['hit']) == (1, 2)
        assert log.count('WHERE area =') == 2  # search_area, search_briefly
    finally:
        app.app.registry.dbtune.router.dispose()


def write_zcml(tmp_path, body, include=True):
    path = tmp_path / 'configure.zcml'
    (tmp_path / 'sql').mkdir(exist_ok=True)
    (tmp_path / 'sql' / 'one.sql').write_text('SELECT 1 AS one\n')
    path.write_text(
        '<configure xmlns="http://pylonshq.com/pyramid"\n'
        '           xmlns:dbtune="urn:pyramid_dbtune">\n'
        '  <include package="pyramid_zcml" />\n'
        + ('  <include package="pyramid_dbtune" />\n' if include else '')
        + f'  {body}\n</configure>\n'
    )
    return path


@pytest.mark.parametrize(
    'body, line, message',
    [
        ('<dbtune:sqlmethod name="x" sql="SELECT 1" cache_time="soon" />',
         5, 'cache_time'),
        ('<dbtune:sqlmethod name="x" sql="SELECT 1" max_rows="-2" />',
         5, 'max_rows'),
        ('<dbtune:sqlmethod name="x" sql="SELECT 1" colour="red" />',
         5, 'colour'),
        ('<dbtune:sqlmethod name="x" />', 5, 'takes either file="..." or '
         'sql="..."'),
        ('<dbtune:sqlmethod sql="SELECT 1" />', 5, 'an inline SQL method '
         'needs a name'),
        ('<dbtune:sqlmethod name="1x" sql="SELECT 1" />', 5,
         "SQL method name '1x'"),
        ('<dbtune:sqlmethod file="sql/none.sql" />', 5, 'none.sql'),
        ('<dbtune:sqlmethods directory="nowhere" />', 5, 'nowhere'),
        ('<dbtune:sqlmethod name="x" sql="SELECT 1" writes="maybe" />', 5,
         "writes='maybe' is not valid: expected true or false"),
    ],
)  # fmt: skip
def test_bad_attributes_are_zcml_errors_with_file_and_line(
    tmp_path, body, line, message
):
    path = write_zcml(tmp_path, body)
    with pytest.raises(ZCMLError) as info:
        zcml_app('sqlite://', path, tables=False)
    text = str(info.value)
    assert f'File "{path}", line {line}.' in text
    assert message in text


def test_directives_before_the_include_say_so(tmp_path):
    path = write_zcml(
        tmp_path,
        '<include package="pyramid_dbtune" file="meta.zcml" />\n'
        '  <dbtune:sqlmethods directory="sql" />',
        include=False,
    )
    with pytest.raises(ZCMLError) as info:
        zcml_app('sqlite://', path, tables=False)
    assert f'File "{path}", line 5.' in str(info.value)
    assert 'put <include package="pyramid_dbtune" /> first' in str(info.value)


def test_a_file_and_a_directory_from_zcml(tmp_path):
    path = write_zcml(
        tmp_path,
        '<dbtune:sqlmethods directory="sql" />\n'
        '  <dbtune:sqlmethod file="sql/one.sql" name="uno" tables="t" '
        'writes="no" cache_time="2" />',
    )
    app = zcml_app('sqlite://', path, tables=False)
    methods = app.app.registry.dbtune.methods
    assert set(methods) == {'one', 'uno'}
    assert (
        methods['uno'].method.tables == {'t'}
        and methods['uno'].cache_time == 2
    )
    # cache_time="2" is the int 2, as in a file's header, not ZCML's 2.0.
    assert type(methods['uno'].method.cache_time) is int
    app.app.registry.dbtune.router.dispose()


@pytest.mark.parametrize('tables', ['', ' , '])
def test_tables_naming_no_table_is_refused(tmp_path, tables):
    path = write_zcml(
        tmp_path,
        f'<dbtune:sqlmethod name="x" sql="SELECT 1" tables="{tables}" />',
    )
    with pytest.raises(ZCMLError) as info:
        zcml_app('sqlite://', path, tables=False)
    assert f'File "{path}", line 5.' in str(info.value)
    assert f'tables={tables!r} names no table' in str(info.value)


def test_invalidate_and_a_zsql_header_that_says_it(tmp_path):
    (tmp_path / 'sql').mkdir()
    (tmp_path / 'sql' / 'Rents.ZSQL').write_text(
        '<dtml-comment>\ninvalidate: no\ncache_time: 9\n</dtml-comment>\n'
        'SELECT rent FROM property\n'
    )
    path = write_zcml(
        tmp_path,
        '<dbtune:sqlmethods directory="sql" />\n'
        '  <dbtune:sqlmethod name="fresh" sql="SELECT rent FROM property" '
        'invalidate="true" />\n'
        '  <dbtune:sqlmethod name="fast" sql="SELECT rent FROM property" '
        'invalidate="false" />',
    )
    app = zcml_app('sqlite://', path, tables=False)
    methods = app.app.registry.dbtune.methods
    assert set(methods) == {'one', 'Rents', 'fresh', 'fast'}
    assert methods['Rents'].method.invalidate is False
    assert (
        methods['Rents'].invalidated_by
        == frozenset()
        == methods['fast'].invalidated_by
    )
    assert methods['fresh'].invalidated_by == {'property'}
    app.app.registry.dbtune.router.dispose()


def test_the_zcml_include_after_the_python_include(tmp_path):
    path = write_zcml(tmp_path, '<dbtune:sqlmethods directory="sql" />')
    with Configurator(settings={'dbtune.url': 'sqlite://'}) as config:
        config.include('pyramid_dbtune')
        dbtune = config.registry.dbtune
        config.include('pyramid_zcml')
        config.load_zcml(str(path))
        app = config.make_wsgi_app()
    # Set up once: the dbtune is the first one, the method is on it.
    assert app.registry.dbtune is dbtune and set(dbtune.methods) == {'one'}
    dbtune.router.dispose()


def test_the_python_include_after_the_zcml_include(tmp_path):
    path = write_zcml(tmp_path, '<dbtune:sqlmethods directory="sql" />')
    with Configurator(settings={'dbtune.url': 'sqlite://'}) as config:
        config.include('pyramid_zcml')
        config.load_zcml(str(path))
        dbtune = config.registry.dbtune
        config.include('pyramid_dbtune')  # not a conflict
        app = config.make_wsgi_app()
    assert app.registry.dbtune is dbtune and set(dbtune.methods) == {'one'}
    dbtune.router.dispose()
