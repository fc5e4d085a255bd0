"""Reads and writes told apart safely: a write taken for a read fails
loudly, every write invalidates what it could change, a cache key keeps
arguments of other types apart, and no fill outlives an invalidation.
Each of these once let a write go unseen, a stale row be served, or a
caller hang (found in review)."""

import threading

import pytest
import sqlalchemy as sa
from pyramid.scripting import prepare

from pyramid_dbtune import SQLMethod, WriteInReadError
from pyramid_dbtune.cache import MISS, MemoryCache
from pyramid_dbtune.sql.method import load_sql_file

from conftest import call


def test_a_write_taken_for_a_read_fails_loudly(db_url, apps):
    sneaky = {
        'name': 'sneaky',
        'sql': 'UPDATE property SET rent = 1',
        'writes': False,
    }
    search = {'name': 'rents', 'sql': 'SELECT rent FROM property'}
    app = apps(db_url, [sneaky, search])
    with pytest.raises(WriteInReadError) as info:
        call(app, ('sneaky', {}))
    assert 'sneaky() tried to change the database' in str(info.value)
    assert 'writes=True' in str(info.value)
    answer = call(app, ('rents', {}))
    assert 1 not in [row[0] for row in answer['results'][0]['rows']]


FUNCTION = """
CREATE FUNCTION add_area(name text) RETURNS integer AS $$
BEGIN
    INSERT INTO area VALUES (name);
    RETURN 1;
END $$ LANGUAGE plpgsql
"""


@pytest.fixture
def with_function(postgresql_url, apps):
    def make(methods):
        app = apps(postgresql_url, methods)
        engine = app.app.registry.dbtune.router.writer
        with engine.begin() as connection:
            connection.exec_driver_sql(FUNCTION)
        return app

    return make


def test_select_of_a_writing_function_is_refused_not_lost(with_function):
    app = with_function(
        [
            {'name': 'add', 'sql': 'SELECT add_area(:name) AS ok'},
            {
                'name': 'areas',
                'sql': 'SELECT name FROM area',
                'cache_time': 60,
            },
        ]
    )
    with pytest.raises(WriteInReadError, match='add\\(\\) tried to change'):
        call(app, ('add', {'name': 'Kirkstall'}))
    answer = call(app, ('areas', {}))
    assert ['Kirkstall'] not in answer['results'][0]['rows']


def test_select_of_a_writing_function_declared_writes(with_function):
    app = with_function(
        [
            {
                'name': 'add',
                'sql': 'SELECT add_area(:name) AS ok',
                'writes': True,
            },
            {
                'name': 'areas',
                'sql': 'SELECT name FROM area',
                'cache_time': 60,
            },
        ]
    )
    call(app, ('areas', {}))
    answer = call(app, ('add', {'name': 'Kirkstall'}))
    assert answer['results'][0]['rows'] == [[1]]
    # Its tables cannot be told: its commit invalidated everything.
    answer = call(app, ('areas', {}))
    assert ['Kirkstall'] in answer['results'][0]['rows']
    assert answer['cache']['miss'] == 1


def test_subquery_in_from_is_invalidated_by_its_inner_table(db_url, apps):
    nested = {
        'name': 'nested',
        'sql': 'SELECT p.id FROM (SELECT name FROM area) a, property p '
        'WHERE p.area = a.name ORDER BY p.id',
        'cache_time': 300,
    }
    drop = {'name': 'drop', 'sql': "DELETE FROM area WHERE name = 'Burley'"}
    app = apps(db_url, [nested, drop])
    assert call(app, ('nested', {}))['results'][0]['rows'] == [[1], [2], [4]]
    call(app, ('drop', {}))
    assert call(app, ('nested', {}))['results'][0]['rows'] == [[1], [2]]


def test_read_of_untold_tables_is_invalidated_by_any_write(
    postgresql_url, apps
):
    series = {
        'name': 'series',
        'sql': 'SELECT count(*) AS n FROM generate_series(1, 2) g, property',
        'cache_time': 300,
    }
    add = {'name': 'add', 'sql': "INSERT INTO property VALUES (9, 'X', 1)"}
    app = apps(postgresql_url, [series, add])
    assert call(app, ('series', {}))['results'][0]['rows'] == [[8]]
    call(app, ('add', {}))
    assert call(app, ('series', {}))['results'][0]['rows'] == [[10]]


def test_equal_arguments_of_other_types_are_other_entries(sqlite_url, apps):
    half = {'name': 'half', 'sql': 'SELECT :n / 2 AS h', 'cache_time': 60}
    app = apps(sqlite_url, [half])
    request = prepare(registry=app.app.registry)['request']
    assert request.sql.half(n=3)[0].h == 1
    assert request.sql.half(n=3.0)[0].h == 1.5
    assert request.sql.half(n=True)[0].h == 0
    assert request.sql.half(n=3)[0].h == 1
    assert request.dbtune.cache['hit'] == 1


def test_list_arguments_of_other_item_types_are_other_entries(
    sqlite_url, apps
):
    some = {
        'name': 'some',
        'sql': 'SELECT :n IN (1) AS found',
        'cache_time': 60,
    }
    listed = {
        'name': 'listed',
        'sql': 'SELECT 1 AS x WHERE 1 IN :ns',
        'cache_time': 60,
    }
    app = apps(sqlite_url, [some, listed])
    request = prepare(registry=app.app.registry)['request']
    assert len(request.sql.listed(ns=[1])) == 1
    assert len(request.sql.listed(ns=[1.0])) == 1
    assert request.dbtune.cache['miss'] == 2


def test_in_parameter_needs_a_list(db_url, apps):
    some = {'name': 'some', 'sql': 'SELECT id FROM property WHERE id IN :ids'}
    app = apps(db_url, [some])
    request = prepare(registry=app.app.registry)['request']
    with pytest.raises(TypeError) as info:
        request.sql.some(ids=3)
    assert str(info.value) == (
        "SQL method some(): argument 'ids' is used as IN :ids and needs a "
        'list, tuple or set, not int'
    )
    assert request.sql.some(ids=()).tuples() == ()


def test_lists_elsewhere_are_arrays(postgresql_url, apps):
    anyof = {
        'name': 'anyof',
        'sql': 'SELECT id FROM property WHERE id = ANY(:ids) ORDER BY id',
        'cache_time': 60,
    }
    app = apps(postgresql_url, [anyof])
    request = prepare(registry=app.app.registry)['request']
    assert request.sql.anyof(ids=[3, 1]).tuples() == ((1,), (3,))
    assert request.sql.anyof(ids=[3, 1]).tuples() == ((1,), (3,))
    assert request.dbtune.cache['hit'] == 1


class Slow:
    def __init__(self, value):
        self.value = value
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self):
        self.started.set()
        assert self.release.wait(10)
        return self.value


def test_a_caller_after_the_commit_does_not_wait_on_an_older_fill():
    cache = MemoryCache()
    tables = frozenset(['t'])
    old = Slow('read before the commit')
    got = {}
    leader = threading.Thread(
        target=lambda: got.update(old=cache.get_or_fill('k', 60, tables, old))
    )
    leader.start()
    assert old.started.wait(10)
    cache.invalidate({'t'})  # the write commits
    # Asked after the commit: a fill of its own, not the older one's rows.
    assert cache.get_or_fill('k', 60, tables, lambda: 'fresh') == (
        'fresh',
        MISS,
    )
    old.release.set()
    leader.join()
    assert got['old'] == ('read before the commit', MISS)
    assert cache.get_or_fill('k', 60, tables, lambda: 'x') == ('fresh', 'hit')
    assert cache._inflight == {}


def test_invalidate_all_detaches_every_fill():
    cache = MemoryCache()
    old = Slow('old')
    leader = threading.Thread(
        target=cache.get_or_fill, args=('k', 60, frozenset(['t']), old)
    )
    leader.start()
    assert old.started.wait(10)
    cache.invalidate(None)
    assert cache.get_or_fill('k', 60, frozenset(['t']), lambda: 'new')[1] == (
        MISS
    )
    old.release.set()
    leader.join()


def test_a_failure_after_the_fill_leaves_nothing_in_flight():
    cache = MemoryCache()
    # Rows are what the cache sizes; an int cannot be sized.
    with pytest.raises(TypeError):
        cache.get_or_fill('k', 60, frozenset(), lambda: 5)
    assert cache._inflight == {}
    assert cache.get_or_fill('k', 60, frozenset(), lambda: ())[1] == MISS


@pytest.mark.parametrize(
    'header',
    ['-- cache-time: 30', '-- Cache time: 30', '--  CACHE_TIME : 30'],
)
def test_header_keys_with_hyphens_or_spaces(tmp_path, header):
    path = tmp_path / 'm.sql'
    path.write_text(f'{header}\nSELECT 1')
    assert load_sql_file(path).cache_time == 30


def test_writes_header(tmp_path):
    path = tmp_path / 'add.sql'
    path.write_text('-- writes: yes\nSELECT add_area(:name)')
    method = load_sql_file(path)
    assert method.writes and method.tables is None
    path.write_text('-- writes: no\nUPDATE t SET a = 1')
    method = load_sql_file(path)
    assert not method.writes and method.tables == {'*'}
    path.write_text('-- writes: maybe\nSELECT 1')
    with pytest.raises(ValueError, match="writes = 'maybe' is not true or"):
        load_sql_file(path)


def test_writes_must_be_a_boolean():
    with pytest.raises(ValueError, match='writes must be True, False or'):
        SQLMethod('m', 'SELECT 1', writes='yes')
    assert SQLMethod('m', 'UPDATE t SET a = 1', writes=True).tables == {'t'}


def test_database_errors_other_than_read_only_pass_unchanged(sqlite_url, apps):
    bad = {'name': 'bad', 'sql': 'SELECT * FROM no_such_table'}
    rents = {'name': 'rents', 'sql': 'SELECT rent FROM property'}
    touch = {'name': 'touch', 'sql': 'UPDATE property SET rent = 1'}
    app = apps(sqlite_url, [bad, rents, touch])
    with pytest.raises(sa.exc.OperationalError, match='no_such_table'):
        call(app, ('bad', {}))
    # The reader still reads, and the writer still writes.
    assert len(call(app, ('rents', {}))['results'][0]['rows']) == 4
    assert call(app, ('touch', {}))['results'][0]['rowcount'] == 4
