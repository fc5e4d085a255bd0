"""Timed row caching through the whole stack: WebTest, pyramid_tm, a real
database (SQLite and PostgreSQL)."""

import datetime
import decimal
import threading

import pytest
import sqlalchemy as sa
from pyramid.config import Configurator
from pyramid.scripting import prepare

import pyramid_dbtune.cache.memory

from conftest import (
    HEADINGLEY,
    SEARCH,
    SET_RENT,
    add_sleep_function,
    call,
    query_log,
    shared_settings,
)

AREAS = {
    'name': 'areas',
    'sql': 'SELECT name FROM area ORDER BY name',
    'cache_time': 20,
}


class Clock:
    """Stands in for time.monotonic in the cache: tests move it by hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(pyramid_dbtune.cache.memory, 'monotonic', clock)
    return clock


def rows_of(answer, index=0):
    return answer['results'][index]['rows']


def test_cached_read_hits_database_once_within_timeout(db_url, apps, clock):
    app = apps(db_url, [SEARCH])
    log = query_log(app)
    for _ in range(3):
        answer = call(app, ('search', {'area': 'Headingley'}))
        assert rows_of(answer) == HEADINGLEY
    assert log.count('FROM property') == 1

    clock.now += 19.9
    call(app, ('search', {'area': 'Headingley'}))
    assert log.count('FROM property') == 1

    clock.now += 0.2
    answer = call(app, ('search', {'area': 'Headingley'}))
    assert answer['cache'] == {**answer['cache'], 'miss': 1, 'hit': 0}
    assert log.count('FROM property') == 2


def test_each_argument_value_is_cached_apart(db_url, apps, clock):
    app = apps(db_url, [SEARCH])
    log = query_log(app)
    call(app, ('search', {'area': 'Headingley'}))
    answer = call(app, ('search', {'area': 'Burley'}))
    assert rows_of(answer) == [[4, 70]]
    call(app, ('search', {'area': 'Burley'}))
    assert log.count('FROM property') == 2


def test_cache_time_setting_overrides_the_code(sqlite_url, apps, clock):
    app = apps(sqlite_url, [SEARCH], {'dbtune.cache_time.search': '2'})
    log = query_log(app)
    call(app, ('search', {'area': 'Headingley'}))
    clock.now += 1.9
    call(app, ('search', {'area': 'Headingley'}))
    assert log.count('FROM property') == 1
    clock.now += 0.2
    call(app, ('search', {'area': 'Headingley'}))
    assert log.count('FROM property') == 2


def test_cache_time_setting_zero_turns_caching_off(sqlite_url, apps):
    app = apps(sqlite_url, [SEARCH], {'dbtune.cache_time.search': '0'})
    log = query_log(app)
    call(app, ('search', {'area': 'Headingley'}))
    answer = call(app, ('search', {'area': 'Headingley'}))
    assert answer['cache']['uncached'] == 1
    assert log.count('FROM property') == 2


def test_default_time_applies_to_methods_that_name_none(sqlite_url, apps):
    method = {'name': 'plain', 'sql': 'SELECT rent FROM property'}
    app = apps(sqlite_url, [method], {'dbtune.cache.default_time': '5'})
    log = query_log(app)
    call(app, ('plain', {}))
    call(app, ('plain', {}))
    assert log.count('FROM property') == 1


def test_method_without_cache_time_is_not_cached(sqlite_url, apps):
    method = {'name': 'plain', 'sql': 'SELECT rent FROM property'}
    app = apps(sqlite_url, [method])
    log = query_log(app)
    call(app, ('plain', {}))
    call(app, ('plain', {}))
    assert log.count('FROM property') == 2


@pytest.mark.parametrize('threads', [16])
def test_threads_missing_one_key_run_one_query(db_url, apps, threads):
    sleep = 'pg_sleep' if db_url.startswith('postgresql') else 'sleep'
    slow = {
        'name': 'slow',
        'sql': f'SELECT id, {sleep}(0.3) AS z FROM property WHERE id = :id',
        'cache_time': 60,
        'tables': 'property',
    }
    app = apps(db_url, [slow])
    if db_url.startswith('sqlite'):
        add_sleep_function(app.app.registry.dbtune.router)
    log = query_log(app)
    barrier = threading.Barrier(threads)
    answers, errors = [], []

    def request():
        barrier.wait()
        try:
            answers.append(call(app, ('slow', {'id': 3})))
        except Exception as exc:  # pragma: no cover (reported below)
            errors.append(exc)

    workers = [threading.Thread(target=request) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()

    assert errors == []
    assert log.count('FROM property') == 1
    assert len(answers) == threads
    assert all(rows_of(a)[0][0] == 3 for a in answers)
    outcomes = [k for a in answers for k, v in a['cache'].items() if v]
    assert outcomes.count('miss') == 1


def test_write_then_commit_invalidates_the_tables_written(db_url, apps):
    app = apps(db_url, [SEARCH, AREAS, SET_RENT])
    log = query_log(app)
    call(app, ('search', {'area': 'Headingley'}), ('areas', {}))

    answer = call(app, ('set_rent', {'id': 1, 'rent': 95}))
    assert answer['results'][0]['rowcount'] == 1

    answer = call(app, ('search', {'area': 'Headingley'}), ('areas', {}))
    assert rows_of(answer) == [[1, 95], [2, 120]]
    assert log.count('FROM property') == 2
    # The area table was not written: its entry is still served.
    assert log.count('FROM area') == 1
    assert answer['cache']['hit'] == 1


def test_write_then_abort_invalidates_nothing_stores_nothing(db_url, apps):
    app = apps(db_url, [SEARCH, SET_RENT])
    log = query_log(app)
    call(app, ('search', {'area': 'Headingley'}))

    answer = call(
        app,
        ('set_rent', {'id': 1, 'rent': 95}),
        ('search', {'area': 'Headingley'}),
        fail=True,
    )
    assert answer == {'error': 'abort, please'}

    answer = call(app, ('search', {'area': 'Headingley'}))
    assert rows_of(answer) == HEADINGLEY
    assert answer['cache']['hit'] == 1
    # The read inside the aborted transaction saw 95 and was not stored:
    # one query to fill, one inside the aborted transaction, no more.
    assert log.count('FROM property') == 2
    cache = app.app.registry.dbtune.cache
    assert len(cache) == 1 and cache.invalidations == 0


def test_read_after_write_sees_it_and_is_not_cached(db_url, apps):
    app = apps(db_url, [SEARCH, SET_RENT])
    log = query_log(app)
    call(app, ('search', {'area': 'Headingley'}))

    answer = call(
        app,
        ('search', {'area': 'Headingley'}),
        ('set_rent', {'id': 2, 'rent': 99}),
        ('search', {'area': 'Headingley'}),
        ('set_rent', {'id': 1, 'rent': 89}),
        ('search', {'area': 'Headingley'}),
    )
    assert rows_of(answer, 0) == HEADINGLEY
    assert rows_of(answer, 2) == [[1, 90], [2, 99]]
    assert rows_of(answer, 4) == [[1, 89], [2, 99]]
    assert answer['cache']['hit'] == 1
    assert answer['cache']['uncached'] == 4
    assert log.count('FROM property') == 3
    answer = call(app, ('search', {'area': 'Headingley'}))
    assert rows_of(answer) == [[1, 89], [2, 99]]


def test_commit_that_fails_invalidates_nothing(postgresql_url, apps):
    book = {'name': 'book', 'sql': 'INSERT INTO booking VALUES (:id)'}
    app = apps(postgresql_url, [SEARCH, SET_RENT, book])
    with app.app.registry.dbtune.router.writer.begin() as connection:
        connection.exec_driver_sql(
            'CREATE TABLE booking (property_id INTEGER REFERENCES '
            'property (id) DEFERRABLE INITIALLY DEFERRED)'
        )
    call(app, ('search', {'area': 'Headingley'}))
    # The foreign key is checked at COMMIT, after both writes succeeded.
    with pytest.raises(sa.exc.IntegrityError):
        call(app, ('set_rent', {'id': 1, 'rent': 95}), ('book', {'id': 999}))
    answer = call(app, ('search', {'area': 'Headingley'}))
    assert rows_of(answer) == HEADINGLEY and answer['cache']['hit'] == 1
    assert app.app.registry.dbtune.cache.invalidations == 0


def test_write_of_unknown_tables_invalidates_everything(sqlite_url, apps):
    ddl = {'name': 'touch', 'sql': 'CREATE TABLE other (x INTEGER)'}
    app = apps(sqlite_url, [SEARCH, AREAS, ddl])
    log = query_log(app)
    call(app, ('search', {'area': 'Headingley'}), ('areas', {}))
    call(app, ('touch', {}))
    call(app, ('search', {'area': 'Headingley'}), ('areas', {}))
    assert log.count('FROM property') == 2
    assert log.count('FROM area') == 2


def test_a_second_transaction_in_one_request_starts_clean(
    sqlite_url, apps, clock
):
    app = apps(sqlite_url, [SEARCH, SET_RENT])
    dirty_after_commit = []

    def view(request):
        request.sql.set_rent(id=1, rent=91)
        request.tm.commit()
        request.tm.begin()
        dirty_after_commit.append(request.dbtune.unit.dirty)
        request.sql.search(area='Headingley')
        return request.dbtune.cache

    config = Configurator(registry=app.app.registry)
    config.add_route('two', '/two')
    config.add_view(view, route_name='two', renderer='json')
    config.commit()
    log = query_log(app)
    assert app.get('/two').json['miss'] == 1
    assert dirty_after_commit == [False]
    answer = call(app, ('search', {'area': 'Headingley'}))
    assert rows_of(answer) == [[1, 91], [2, 120]]
    assert log.count('FROM property') == 1


def test_list_arguments_expand_and_are_cached(db_url, apps):
    method = {
        'name': 'some',
        'sql': 'SELECT id FROM property WHERE id IN :ids ORDER BY id',
        'cache_time': 10,
    }
    app = apps(db_url, [method])
    log = query_log(app)
    assert rows_of(call(app, ('some', {'ids': [3, 1]}))) == [[1], [3]]
    assert rows_of(call(app, ('some', {'ids': [3, 1]}))) == [[1], [3]]
    assert rows_of(call(app, ('some', {'ids': [4]}))) == [[4]]
    assert log.count('FROM property') == 2
    request = prepare(registry=app.app.registry)['request']
    assert request.sql.some(ids={1, 3}).tuples() == ((1,), (3,))
    assert request.sql.some(ids={3, 1}).tuples() == ((1,), (3,))
    assert request.dbtune.cache == {
        **request.dbtune.cache,
        'miss': 1,
        'hit': 1,
    }


def test_max_rows_truncates_like_zsql(db_url, apps):
    two = {
        'name': 'two',
        'sql': 'SELECT id FROM property ORDER BY id',
        'max_rows': 2,
    }
    every = {'name': 'every', 'sql': 'SELECT id FROM property', 'max_rows': 0}
    app = apps(db_url, [two, every])
    answer = call(app, ('two', {}), ('every', {}))
    assert answer['results'][0] == {
        'rows': [[1], [2]],
        'rowcount': -1,
        'truncated': True,
    }
    assert len(rows_of(answer, 1)) == 4
    assert answer['results'][1]['truncated'] is False


def test_backend_none_never_caches(sqlite_url, apps):
    app = apps(sqlite_url, [SEARCH], {'dbtune.cache.backend': 'none'})
    log = query_log(app)
    call(app, ('search', {'area': 'Headingley'}))
    call(app, ('search', {'area': 'Headingley'}))
    assert log.count('FROM property') == 2


LAGGING_SEARCH = {**SEARCH, 'name': 'lagging', 'invalidate': False}


def test_a_read_that_does_not_invalidate_keeps_its_rows_their_time(
    db_url, apps, clock
):
    app = apps(db_url, [SEARCH, LAGGING_SEARCH, SET_RENT])
    log = query_log(app)
    headingley = {'area': 'Headingley'}
    call(app, ('search', headingley), ('lagging', headingley))
    answer = call(
        app,
        ('set_rent', {'id': 1, 'rent': 95}),
        ('lagging', headingley),  # the writer reads its own write
    )
    assert rows_of(answer, 1) == [[1, 95], [2, 120]]
    answer = call(app, ('search', headingley), ('lagging', headingley))
    assert rows_of(answer, 0) == [[1, 95], [2, 120]]  # invalidated
    assert rows_of(answer, 1) == HEADINGLEY  # kept: up to 20 s old
    assert answer['cache'] == {'hit': 1, 'miss': 1, 'uncached': 0,
                               'stale': 0, 'waited': 0}  # fmt: skip
    clock.now += 21
    answer = call(app, ('lagging', headingley))
    assert rows_of(answer) == [[1, 95], [2, 120]]
    assert log.count('FROM property') == 5


def test_a_write_of_unknown_tables_drops_even_those(sqlite_url, apps):
    ddl = {'name': 'touch', 'sql': 'CREATE TABLE other (x INTEGER)'}
    app = apps(sqlite_url, [LAGGING_SEARCH, ddl])
    log = query_log(app)
    call(app, ('lagging', {'area': 'Headingley'}))
    call(app, ('touch', {}))
    call(app, ('lagging', {'area': 'Headingley'}))
    assert log.count('FROM property') == 2


def test_the_invalidate_setting_overrides_the_code(sqlite_url, apps):
    settings = {
        'dbtune.invalidate.search': 'false',
        'dbtune.invalidate.lagging': 'true',
    }
    app = apps(sqlite_url, [SEARCH, LAGGING_SEARCH, SET_RENT], settings)
    headingley = {'area': 'Headingley'}
    call(app, ('search', headingley), ('lagging', headingley))
    call(app, ('set_rent', {'id': 1, 'rent': 95}))
    answer = call(app, ('search', headingley), ('lagging', headingley))
    assert rows_of(answer, 0) == HEADINGLEY
    assert rows_of(answer, 1) == [[1, 95], [2, 120]]


@pytest.mark.parametrize(
    'key, message',
    [
        ('dbtune.invalidate.nothing', 'dbtune.invalidate.nothing names no '
         'SQL method (registered: lagging, search, set_rent)'),
        ('dbtune.invalidate.set_rent', 'dbtune.invalidate.set_rent names a '
         'write'),
    ],
)  # fmt: skip
def test_bad_invalidate_settings(sqlite_url, apps, key, message):
    from pyramid.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError) as info:
        apps(sqlite_url, [SEARCH, LAGGING_SEARCH, SET_RENT], {key: 'false'})
    assert message in str(info.value)


@pytest.mark.parametrize('backend', ['memory', 'memcached'])
def test_a_callers_change_of_a_json_value_is_its_own(
    postgresql_url, apps, backend, request
):
    # A JSON column is a dict, an array a list: a view that changes the
    # value it got does not change the next caller's rows.
    settings = {}
    if backend == 'memcached':
        settings = shared_settings(request.getfixturevalue('memcached'))
    prefs = {
        'name': 'prefs',
        'sql': """SELECT '{"theme": "light"}'::jsonb AS prefs, """
        "ARRAY['a'] AS tags, 1 AS n",
        'cache_time': 20,
    }
    app = apps(postgresql_url, [prefs], settings, tables=False)
    context = prepare(registry=app.app.registry)
    try:
        sql = context['request'].sql
        for _ in range(3):  # a miss, then hits
            (row,) = sql.prefs()
            assert (row.prefs, row.tags) == ({'theme': 'light'}, ['a'])
            row.prefs['theme'] = 'dark'
            row.tags.append('b')
        assert context['request'].dbtune.cache['hit'] == 2
    finally:
        context['closer']()


def test_equal_arguments_that_bind_otherwise_are_not_one_call(mysql_url, apps):
    # The same instant at two offsets: PyMySQL sends the wall clock, and
    # the two are two queries (1.0 and 1.00 too, as text).
    after = {
        'name': 'after',
        'sql': 'SELECT count(*) AS n FROM stay WHERE starts >= :since',
        'cache_time': 20,
    }
    echo = {'name': 'echo', 'sql': 'SELECT :x AS x', 'cache_time': 20}
    among = {
        'name': 'among',
        'sql': 'SELECT count(*) AS n FROM stay WHERE starts IN :times',
        'cache_time': 20,
    }
    app = apps(mysql_url, [after, echo, among], tables=False)
    engine = sa.create_engine(mysql_url)
    with engine.begin() as connection:
        connection.exec_driver_sql('CREATE TABLE stay (starts DATETIME)')
        connection.exec_driver_sql(
            "INSERT INTO stay VALUES ('2024-06-01 12:30')"
        )
    engine.dispose()
    utc = datetime.datetime(2024, 6, 1, 12, tzinfo=datetime.timezone.utc)
    paris = utc.astimezone(datetime.timezone(datetime.timedelta(hours=2)))
    context = prepare(registry=app.app.registry)
    try:
        sql = context['request'].sql
        assert sql.after(since=utc)[0].n == 1
        assert sql.after(since=paris)[0].n == 0  # 14:00, as MariaDB sees it
        at = utc + datetime.timedelta(minutes=30)
        for times in ([at], (at,), {at}):
            assert sql.among(times=times)[0].n == 1
            shifted = type(times)(t.astimezone(paris.tzinfo) for t in times)
            assert sql.among(times=shifted)[0].n == 0, times
        assert str(sql.echo(x=decimal.Decimal('1.0'))[0].x) == '1.0'
        assert str(sql.echo(x=decimal.Decimal('1.00'))[0].x) == '1.00'
    finally:
        context['closer']()
