"""The timing tween and its Server-Timing header: installed only when a
feature that needs it is on, outermost, and what the header says."""

import pytest
from pyramid.config import Configurator
from pyramid.interfaces import ITweens
from pyramid.request import Request

from pyramid_dbtune.ops import access
from pyramid_dbtune.ops import tween as tweens

from conftest import SEARCH, SET_RENT, add_sleep_function, timings

TOKEN = 'a-token-of-16-chars-or-more'
AUTH = {access.HEADER: TOKEN}
TWEEN = 'pyramid_dbtune.ops.tween.timing_tween_factory'


def hello(request):
    return {'hello': 'world'}


def tween_names(app):
    return [
        name for name, _ in app.app.registry.getUtility(ITweens).implicit()
    ]


def test_everything_off_installs_no_tween_and_no_view(sqlite_url, apps):
    app = apps(sqlite_url, [SEARCH], {'dbtune.stats.token': TOKEN})
    assert TWEEN not in tween_names(app)
    assert 'pyramid_tm.tm_tween_factory' in tween_names(app)
    dbtune = app.app.registry.dbtune
    assert dbtune.stats is dbtune.profiler is dbtune.active is None
    routes = app.app.registry.introspector.get_category('routes')
    assert not [r for r in routes if r['introspectable']['pattern']
                .startswith('/_dbtune/')]  # fmt: skip
    response = app.post_json('/call', {'calls': [['search', {'area': 'x'}]]})
    assert 'Server-Timing' not in response.headers
    app.get('/_dbtune/stats', headers=AUTH, status=404)


@pytest.mark.parametrize('setting', ['server_timing', 'stats', 'profile'])
def test_each_feature_installs_the_tween(sqlite_url, apps, setting):
    settings = {'dbtune.stats.token': TOKEN, f'dbtune.{setting}': 'true'}
    app = apps(sqlite_url, [SEARCH], settings)
    assert tween_names(app)[0] == TWEEN  # outermost: under INGRESS


def test_server_timing_values(sqlite_url, apps):
    app = apps(sqlite_url, [SEARCH, SET_RENT], {'dbtune.server_timing': 'on'},
               views={'/hello': hello})  # fmt: skip
    add_sleep_function(app.app.registry.dbtune.router)
    miss = timings(
        app.post_json('/call', {'calls': [['search', {'area': 'Burley'}]]})
    )
    assert miss['cache-miss'] == 1 and miss['cache-hit'] == 0
    assert miss['db-queries'] == 1 and 'db-write' not in miss
    assert 0 < miss['db-read'] <= miss['total']
    hit = timings(
        app.post_json('/call', {'calls': [['search', {'area': 'Burley'}]]})
    )
    assert hit['cache-hit'] == 1 and hit['cache-miss'] == 0
    assert hit['db-read'] == 0 and hit['db-queries'] == 0
    wrote = timings(
        app.post_json('/call', {'calls': [['set_rent', {'id': 1, 'rent': 5}]]})
    )
    assert 0 < wrote['db-write'] <= wrote['total'] and wrote['db-read'] == 0
    assert wrote.get('write-slot', 0) < wrote['total']  # no wait: about 0
    # A request that slept 50 ms says so.
    app.app.registry.dbtune.methods.clear()
    with Configurator(registry=app.app.registry) as config:
        config.add_sql_method('nap', 'SELECT sleep(0.05) AS s')
    slow = timings(app.post_json('/call', {'calls': [['nap', {}]]}))
    assert 50 <= slow['db-read'] <= slow['total']
    # No database touched: only the total.
    assert list(timings(app.get('/hello'))) == ['total']


def test_server_timing_names_stale_and_waited_when_there_are_some():
    request = Request.blank('/')

    class Unit:
        write_wait = 0.002

    class Context:
        cache = {'hit': 1, 'miss': 2, 'stale': 3, 'waited': 0}
        write_seconds = 0.001
        db_seconds = 0.004
        queries = 2
        unit = Unit()

    request.__dict__['dbtune'] = Context()
    text = tweens.server_timing(request, 0.01)
    assert text == (
        'total;dur=10.000, db-read;dur=3.000, db-queries;desc=2, '
        'cache-hit;desc=1, cache-miss;desc=2, cache-stale;desc=3, '
        'db-write;dur=1.000, write-slot;dur=2.000'
    )
    Context.cache = {'hit': 0, 'miss': 0, 'stale': 0, 'waited': 4}
    assert tweens.server_timing(request, 0.01).endswith(
        'cache-miss;desc=0, cache-waited;desc=4, db-write;dur=1.000, '
        'write-slot;dur=2.000'
    )


def test_server_timing_keeps_a_bounded_number_of_counts(monkeypatch):
    request = Request.blank('/')

    class Unit:
        write_wait = 0.0

    class Context:
        write_seconds = 0.0
        db_seconds = 0.001
        unit = Unit()

    monkeypatch.setattr(tweens, 'MAX_COUNTS', 3)
    context = request.__dict__['dbtune'] = Context()
    for queries in range(6):
        for _ in range(2):  # the second: the same counts again
            context.queries = queries
            context.cache = {'hit': queries, 'miss': 1, 'stale': 0,
                             'waited': 0}  # fmt: skip
            assert tweens.server_timing(request, 0.01) == (
                f'total;dur=10.000, db-read;dur=1.000, db-queries;desc='
                f'{queries}, cache-hit;desc={queries}, cache-miss;desc=1'
            )
            assert len(tweens._COUNTS) <= 3
    # Full, they are forgotten: those of the requests since are kept.
    assert (5, 5, 1, 0, 0) in tweens._COUNTS
