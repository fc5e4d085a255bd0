"""Including the package and registering SQL methods: what a user sees at
start-up, and the errors for what is wrong."""

import pytest
import transaction
from pyramid.config import Configurator
from pyramid.exceptions import ConfigurationConflictError, ConfigurationError
from pyramid.interfaces import ITweens
from pyramid.scripting import prepare

from pyramid_dbtune import DBTune, SQLMethod

from conftest import call


def configure(url=None, settings=None, include=True):
    config = Configurator(
        settings={**({'dbtune.url': url} if url else {}), **(settings or {})}
    )
    if include:
        config.include('pyramid_dbtune')
    return config


@pytest.fixture
def dbtunes():
    made = []
    yield made
    for dbtune in made:
        if dbtune.router is not None:
            dbtune.router.dispose()


def commit(config, dbtunes):
    dbtunes.append(config.registry.dbtune)
    config.commit()
    return config.registry.dbtune


def test_include_sets_up_directives_request_methods_and_pyramid_tm(
    sqlite_url, dbtunes
):
    config = configure(sqlite_url)
    config.include('pyramid_dbtune')  # twice is harmless
    config.add_sql_method('one', 'SELECT 1 AS x', cache_time=5)
    dbtune = commit(config, dbtunes)
    assert isinstance(dbtune, DBTune)
    registered = dbtune.methods['one']
    method, cache_time, key = (
        registered.method,
        registered.cache_time,
        registered.key,
    )
    assert cache_time == 5 and sqlite_url in key
    tweens = config.registry.queryUtility(ITweens)
    assert 'pyramid_tm.tm_tween_factory' in tweens.implicit()[0]
    introspector = config.registry.introspector
    intr = introspector.get('dbtune sql methods', 'one')
    assert intr['sql'] == 'SELECT 1 AS x' and intr['method'] is method


def test_pyramid_includes_setting(sqlite_url, dbtunes):
    config = Configurator(
        settings={
            'pyramid.includes': 'pyramid_dbtune',
            'sqlalchemy.url': sqlite_url,
        }
    )
    config.add_sql_method('one', 'SELECT 1 AS x')
    dbtune = commit(config, dbtunes)
    assert 'one' in dbtune.methods


def test_bad_setting_stops_start_up():
    with pytest.raises(ConfigurationError, match='dbtune.cache.backend'):
        configure(settings={'dbtune.cache.backend': 'disk'})


def test_method_without_a_database_is_a_clear_error():
    config = configure()
    config.add_sql_method('one', 'SELECT 1')
    with pytest.raises(ConfigurationError) as info:
        config.commit()
    assert "SQL method 'one' needs a database: set dbtune.url" in str(
        info.value
    )


def test_include_without_methods_needs_no_database():
    config = configure()
    config.commit()
    assert config.registry.dbtune.router is None


def test_cache_time_override_must_name_a_method(sqlite_url, dbtunes):
    config = configure(sqlite_url, {'dbtune.cache_time.serach': '5'})
    config.add_sql_method('search', 'SELECT 1')
    dbtunes.append(config.registry.dbtune)
    with pytest.raises(ConfigurationError) as info:
        config.make_wsgi_app()
    assert str(info.value) == (
        'dbtune.cache_time.serach names no SQL method (registered: search)'
    )


def test_settings_are_checked_once_the_app_is_made(sqlite_url, dbtunes):
    # An app may commit before it registers its methods: an override of
    # one registered later is no error, and applies.
    config = configure(sqlite_url, {'dbtune.cache_time.search': '5'})
    dbtunes.append(config.registry.dbtune)
    config.commit()
    config.add_sql_method('search', 'SELECT 1')
    config.make_wsgi_app()
    assert config.registry.dbtune.methods['search'].cache_time == 5
    # A setting changed after that first commit is an error still.
    config = configure(sqlite_url)
    dbtunes.append(config.registry.dbtune)
    config.commit()
    config.add_settings({'dbtune.stats': 'true'})
    with pytest.raises(ConfigurationError, match='dbtune.stats changed'):
        config.make_wsgi_app()


def test_two_methods_of_one_name_conflict(sqlite_url, dbtunes):
    config = configure(sqlite_url)
    config.add_sql_method('one', 'SELECT 1')
    config.add_sql_method('one', 'SELECT 2')
    dbtunes.append(config.registry.dbtune)
    with pytest.raises(ConfigurationConflictError):
        config.commit()


def test_a_ready_method_may_be_registered(sqlite_url, dbtunes):
    config = configure(sqlite_url)
    method = SQLMethod('ready', 'SELECT 1', cache_time=3)
    assert config.add_sql_method(method) is method
    ready = commit(config, dbtunes).methods['ready']
    assert (ready.method, ready.cache_time) == (method, 3)


def test_bad_method_fails_at_the_call_site():
    config = configure()
    with pytest.raises(ValueError, match="SQL method name 'no good'"):
        config.add_sql_method('no good', 'SELECT 1')


def test_sql_directory(tmp_path, sqlite_url, dbtunes):
    (tmp_path / 'a.sql').write_text('-- cache_time: 7\nSELECT 1 AS x')
    (tmp_path / 'b.sql').write_text('-- name: bee\nSELECT 2 AS x')
    (tmp_path / 'notes.txt').write_text('not SQL')
    config = configure(sqlite_url)
    methods = config.add_sql_methods(str(tmp_path))
    assert [m.name for m in methods] == ['a', 'bee']
    dbtune = commit(config, dbtunes)
    assert dbtune.methods['a'].cache_time == 7 and 'bee' in dbtune.methods


def test_sql_directory_from_an_asset_spec(sqlite_url, dbtunes):
    config = configure(sqlite_url)
    config.add_sql_methods('accommodation:sql/')
    assert 'search_properties' in commit(config, dbtunes).methods


def test_sql_directory_errors(tmp_path, sqlite_url):
    config = configure(sqlite_url)
    with pytest.raises(
        ConfigurationError, match=r'holds \*.sql or \*.zsql files'
    ):
        config.add_sql_methods(str(tmp_path / 'missing'))
    with pytest.raises(
        ConfigurationError, match=r'holds \*.sql or \*.zsql files'
    ):
        config.add_sql_methods(str(tmp_path))
    (tmp_path / 'bad.sql').write_text('-- max_rows: x\nSELECT 1')
    with pytest.raises(ConfigurationError, match='bad.sql:1: max_rows'):
        config.add_sql_methods(str(tmp_path))
    config.registry.dbtune.router.dispose()


def test_a_parameter_may_be_named_self(sqlite_url, apps):
    app = apps(sqlite_url, [{'name': 'me', 'sql': 'SELECT :self AS x'}])
    request = prepare(registry=app.app.registry)['request']
    assert request.sql.me(self=5).tuples() == ((5,),)


def test_request_sql_errors(sqlite_url, apps):
    app = apps(sqlite_url, [{'name': 'one', 'sql': 'SELECT :x AS x'}])
    request = prepare(registry=app.app.registry)['request']
    try:
        sql = request.sql
        assert 'one' in sql and 'two' not in sql
        assert list(sql) == ['one'] and dir(sql) == ['one']
        assert sql.one is sql['one']
        assert repr(sql.one) == '<bound <SQLMethod one (read)>>'
        with pytest.raises(AttributeError, match="no SQL method named 'two'"):
            sql.two
        with pytest.raises(KeyError, match='registered: one'):
            sql['two']
        with pytest.raises(AttributeError):
            sql._private
        with pytest.raises(TypeError, match='takes keyword arguments only'):
            sql.one(1)
        with pytest.raises(TypeError, match="missing argument 'x'"):
            sql.one()
        with pytest.raises(TypeError, match="unexpected argument 'y'"):
            sql.one(x=1, y=2)
        with pytest.raises(ValueError, match="argument 'x' cannot be bound"):
            sql.one(x=object())
        assert sql.one(x=5)[0].x == 5
    finally:
        transaction.manager.abort()


def test_bad_arguments_to_a_cached_method(sqlite_url, apps):
    method = {'name': 'one', 'sql': 'SELECT :x AS x', 'cache_time': 9}
    two = {'name': 'two', 'sql': 'SELECT :x, :y', 'cache_time': 9}
    app = apps(sqlite_url, [method, two])
    request = prepare(registry=app.app.registry)['request']
    with pytest.raises(TypeError, match="missing argument 'x'"):
        request.sql.one()
    with pytest.raises(TypeError, match="missing argument 'x'"):
        request.sql.one(y=1)
    with pytest.raises(TypeError, match="unexpected argument 'y'"):
        request.sql.one(x=1, y=2)
    with pytest.raises(ValueError, match="argument 'x' cannot be bound"):
        request.sql.one(x={'a': 1})
    with pytest.raises(ValueError, match="argument 'x' cannot be bound"):
        request.sql.one(x=[[1]])
    assert request.sql.one(x=2)[0].x == 2
    assert request.sql.one(x=2)[0].x == 2
    assert request.dbtune.cache['hit'] == 1
    with pytest.raises(TypeError, match="missing argument 'y'"):
        request.sql.two(x=1, z=2)
    assert request.sql.two(x=1, y=2)[0] == (1, 2)


def test_no_registered_methods(sqlite_url, apps):
    app = apps(sqlite_url, [])
    request = prepare(registry=app.app.registry)['request']
    with pytest.raises(AttributeError, match='registered: none'):
        request.sql.anything


def test_write_outside_a_transaction_is_a_clear_error(sqlite_url, apps):
    method = {'name': 'up', 'sql': 'UPDATE property SET rent = 1'}
    app = apps(sqlite_url, [method])
    request = prepare(registry=app.app.registry)['request']
    request.tm = transaction.TransactionManager(explicit=True)
    with pytest.raises(
        RuntimeError, match='up\\(\\) writes, but request.tm has no'
    ):
        request.sql.up()


def test_database_errors_reach_the_caller_and_abort(sqlite_url, apps):
    method = {'name': 'bad', 'sql': 'SELECT * FROM no_such_table'}
    app = apps(sqlite_url, [method])
    with pytest.raises(Exception, match='no_such_table'):
        call(app, ('bad', {}))


def test_two_files_of_one_name_name_both_files(tmp_path, sqlite_url):
    (tmp_path / 'a.sql').write_text('-- name: same\nSELECT 1')
    (tmp_path / 'b.sql').write_text('-- name: same\nSELECT 2')
    config = configure(sqlite_url)
    with pytest.raises(ConfigurationError) as info:
        config.add_sql_methods(str(tmp_path))
    assert 'b.sql and ' in str(info.value) and 'a.sql both name' in str(
        info.value
    )
    config.registry.dbtune.router.dispose()
