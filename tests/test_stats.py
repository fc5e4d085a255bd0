"""The figures of /_dbtune/stats and /_dbtune/metrics, driven through
WebTest and real threads (the tween that counts them: test_tween.py)."""

import contextlib
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import sqlalchemy as sa
from gunicorn.config import KNOWN_SETTINGS
from prometheus_client import CollectorRegistry, multiprocess, values
from prometheus_client.parser import text_string_to_metric_families
from pyramid.config import Configurator
from pyramid.exceptions import ConfigurationError
from pyramid.request import Request
from webtest import TestApp

from pyramid_dbtune.ops import access, carrier, stats
from pyramid_dbtune.ops import tween as tweens

from conftest import (
    SEARCH,
    SET_RENT,
    Property,
    add_sleep_function,
    call,
    in_a_child,
    make_app,
    timings,
    until,
)

TOKEN = 'a-token-of-16-chars-or-more'
AUTH = {access.HEADER: TOKEN}
ON = {'dbtune.stats': 'true', 'dbtune.stats.token': TOKEN}
#: The name of the thread that carries a process's figures (several
#: processes).
CARRIER = 'dbtune-stats-carry'


def hello(request):
    return {'hello': 'world'}


def boom(request):
    raise RuntimeError('boom')


def unavailable(request):
    request.response.status = 503
    return {}


def stats_of(app):
    return app.get('/_dbtune/stats', headers=AUTH).json


def metrics_of(app):
    text = app.get('/_dbtune/metrics', headers=AUTH).text
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            found[key] = sample.value
    return found


def test_counters_move_with_hits_misses_and_writes(sqlite_url, apps):
    settings = {**ON, 'dbtune.server_timing': 'true'}
    views = {'/boom': boom, '/unavailable': unavailable}
    app = apps(sqlite_url, [SEARCH, SET_RENT], settings, views=views)
    before = stats_of(app)
    assert before['requests'] == 0 and before['routes'] == {}
    call(app, ('search', {'area': 'Headingley'}))  # miss
    call(app, ('search', {'area': 'Headingley'}))  # hit
    response = app.post_json(
        '/call', {'calls': [['search', {'area': 'Headingley'}]]}
    )
    assert timings(response)['cache-hit'] == 1  # stats and the header
    call(app, ('set_rent', {'id': 1, 'rent': 100}))  # invalidates
    call(app, ('search', {'area': 'Headingley'}))  # miss
    with pytest.raises(RuntimeError):
        app.get('/boom')
    app.get('/nowhere', status=404)
    app.get('/unavailable', status=503)
    figures = stats_of(app)
    assert figures['requests'] == 8
    assert figures['routes']['/unavailable']['errors'] == 1
    assert figures['routes'][stats.NO_ROUTE]['errors'] == 0
    route = figures['routes']['call']
    assert route['requests'] == 5 and route['errors'] == 0
    assert route['queries'] == 3 and route['db_ms'] > 0
    assert 0 < route['p50_ms'] <= route['p90_ms'] <= route['max_ms']
    assert figures['routes']['/boom']['errors'] == 1
    assert figures['routes'][stats.NO_ROUTE]['requests'] == 1
    cache = figures['cache']
    assert (cache['hits'], cache['misses']) == (2, 2)
    assert cache['hit_ratio'] == 0.5 and cache['invalidations'] == 1
    assert cache['backend'] == 'memory' and cache['entries'] == 1
    database = figures['database']
    assert database['roles']['reader0']['reads'] == 2
    assert database['roles']['writer']['writes'] == 1
    assert database['write_transactions'] == 1
    assert database['failovers'] == database['write_waits'] == 0
    assert database['roles']['reader0']['in_use'] == 0
    assert figures['parallelism']['in_flight'] == 0  # its own view: not
    assert figures['parallelism']['peak_in_flight'] == 1

    metrics = metrics_of(app)
    assert metrics[('dbtune_request_duration_seconds_count',
                   (('route', 'call'),))] == 5  # fmt: skip
    assert metrics[('dbtune_request_errors_total', (('route', '/boom'),))]
    assert metrics[('dbtune_cache_events_total', (('event', 'hits'),))] == 2
    assert metrics[('dbtune_db_reads_total', (('role', 'reader0'),))] == 2
    assert metrics[('dbtune_db_writes_total', ())] == 1
    assert metrics[('dbtune_db_write_transactions_total', ())] == 1
    inf = (('le', '+Inf'), ('route', 'call'))
    assert metrics[('dbtune_request_duration_seconds_bucket', inf)] == 5
    assert ('dbtune_process_cpu_seconds_total', ()) in metrics
    # prometheus_client's own figures of the process come along.
    assert any(name.startswith('python_') for name, _ in metrics)
    # The operator's own views are not counted.
    assert stats_of(app)['requests'] == 8


@pytest.mark.parametrize(
    'count, fraction, rank',
    [(0, 0.5, None), (1, 0.01, 1), (2, 0.5, 1), (10, 0.5, 5), (10, 0.9, 9),
     (10, 0.99, 10), (100, 0.07, 7), (100, 0.99, 99), (100, 1, 100),
     (20, 0.95, 19)],
)  # fmt: skip
def test_percentiles_are_of_the_nearest_rank(count, fraction, rank):
    ordered = [n / 1000 for n in range(1, count + 1)]
    expected = 0.0 if rank is None else rank / 1000
    assert stats.percentile(ordered, fraction) == expected


def test_an_orm_flush_alone_is_database_time(sqlite_url, apps):
    def write(request):
        request.dbsession.get(Property, 1).rent += 1
        request.dbsession.flush()
        return 'written'

    app = apps(sqlite_url, [], ON, views={'/write': write})
    app.get('/write')
    route = stats_of(app)['routes']['/write']
    assert route['queries'] == 0 and route['db_ms'] > 0


def test_failovers_and_write_waits_are_counted(sqlite_url, apps):
    app = apps(sqlite_url, [SEARCH, SET_RENT],
               {**ON, 'dbtune.write_timeout': '5'})  # fmt: skip
    router = app.app.registry.dbtune.router
    router.readers[0].down_until = time.monotonic() + 60
    call(app, ('search', {'area': 'Burley'}))
    router.readers[0].down_until = 0
    # A write that waits for the slot another thread holds.
    router.write_slots.acquire()
    threading.Timer(0.1, router.write_slots.release).start()
    call(app, ('set_rent', {'id': 1, 'rent': 1}))
    database = stats_of(app)['database']
    assert database['failovers'] == 1
    assert database['roles']['writer']['reads'] == 1
    assert database['write_waits'] == 1
    assert database['write_wait_seconds'] >= 0.05


def test_a_pinned_sessions_reads_on_the_writer_have_a_role(sqlite_url, apps):
    # With replicas, a pinned client's session reads on the writer's
    # database through a read-only pool of its own: its connections count
    # against the database's limit, and are shown.
    def view(request):
        session = request.dbsession
        if request.params.get('write'):
            session.get(Property, 1).rent += 1
            session.flush()
        return session.scalar(sa.text('SELECT count(*) FROM property'))

    settings = {
        **ON,
        'dbtune.read_urls': sqlite_url,
        'dbtune.pin_after_write': '30',
        'dbtune.pin_secret': 'a pin secret for this test',
    }
    app = apps(sqlite_url, [], settings, views={'/view': view})
    app.get('/view', {'write': '1'})
    app.get('/view')  # pinned: on the writer's database, read-only
    role = stats_of(app)['database']['roles']['writer_read_only']
    assert role['reads'] == 1 and role['in_use'] == 0
    metrics = metrics_of(app)
    reads = ('dbtune_db_reads_total', (('role', 'writer_read_only'),))
    assert metrics[reads] == 1


def test_the_write_slot_wait_is_not_database_time(sqlite_url, apps):
    settings = {**ON, 'dbtune.server_timing': 'true',
                'dbtune.write_timeout': '5'}  # fmt: skip
    app = apps(sqlite_url, [SEARCH, SET_RENT], settings)
    router = app.app.registry.dbtune.router
    router.write_slots.acquire()
    threading.Timer(0.3, router.write_slots.release).start()
    response = app.post_json(
        '/call', {'calls': [['set_rent', {'id': 1, 'rent': 5}]]}
    )
    took = timings(response)
    assert took['write-slot'] >= 250
    assert took['db-write'] < 250
    assert (
        took['db-read'] + took['db-write'] + took['write-slot']
        <= (took['total'])
    )
    assert stats_of(app)['routes']['call']['db_ms'] < 250


def test_a_write_slot_timeout_is_slot_time_too(sqlite_url, apps):
    settings = {**ON, 'dbtune.server_timing': 'true',
                'dbtune.write_timeout': '0.2'}  # fmt: skip
    app = apps(sqlite_url, [SEARCH, SET_RENT], settings)
    router = app.app.registry.dbtune.router
    router.write_slots.acquire()
    try:
        response = app.post_json(
            '/call', {'calls': [['set_rent', {'id': 1, 'rent': 5}]]},
            status=503,
        )  # fmt: skip
    finally:
        router.write_slots.release()
    took = timings(response)
    # The write never ran: almost no db-write time.
    assert took['write-slot'] >= 150 and took.get('db-write', 0) < 150


def test_in_flight_and_gil_wait_with_real_threads(
    sqlite_url, apps, monkeypatch
):
    monkeypatch.setattr(tweens, 'CPU_EVERY', 1)  # measure every request
    inside = threading.Barrier(4, timeout=30)

    def wait(request):
        inside.wait()  # four requests at once, or a BrokenBarrierError
        inside.wait()
        return {}

    def spin(request):
        deadline = time.thread_time() + 0.05
        while time.thread_time() < deadline:
            pass
        return {}

    app = apps(sqlite_url, [], ON, views={'/wait': wait, '/spin': spin})
    dbtune = app.app.registry.dbtune
    threads = [
        threading.Thread(target=app.get, args=('/wait',)) for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    inside.wait()
    assert dbtune.stats.snapshot()['parallelism']['in_flight'] == 3
    inside.wait()
    for thread in threads:
        thread.join()
    parallelism = stats_of(app)['parallelism']
    assert parallelism['peak_in_flight'] == 3
    assert parallelism['in_flight'] == 0

    # Two threads spinning in Python: each runs about half the time.
    dbtune.stats.reset()
    threads = [
        threading.Thread(target=lambda: [app.get('/spin') for _ in range(4)])
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    parallelism = stats_of(app)['parallelism']
    assert parallelism['measured_requests'] == 8
    assert parallelism['runnable_ratio'] > 0.25
    assert 0 < parallelism['cpu_ratio'] <= os.cpu_count() + 0.5


def test_the_peak_counts_what_in_flight_counts(sqlite_url, apps):
    inside, leave = threading.Event(), threading.Event()

    def wait(request):
        inside.set()
        assert leave.wait(30)
        return {}

    app = apps(sqlite_url, [], ON, views={'/wait': wait})
    thread = threading.Thread(target=app.get, args=('/wait',))
    thread.start()
    try:
        assert inside.wait(30)
        # The operator's request runs beside the user's: not counted.
        parallelism = stats_of(app)['parallelism']
        assert parallelism['in_flight'] == 1
        assert parallelism['peak_in_flight'] == 1
    finally:
        leave.set()
        thread.join()


def test_database_waits_are_not_runnable_time(sqlite_url, apps, monkeypatch):
    monkeypatch.setattr(tweens, 'CPU_EVERY', 1)
    app = apps(
        sqlite_url,
        [{'name': 'nap', 'sql': 'SELECT sleep(0.1) AS s'}],
        ON,
    )
    add_sleep_function(app.app.registry.dbtune.router)
    for _ in range(3):
        call(app, ('nap', {}))
    parallelism = stats_of(app)['parallelism']
    assert parallelism['measured_requests'] == 3
    assert parallelism['runnable_ratio'] < 0.5
    assert parallelism['request_cpu_ratio'] < 0.5


def test_a_subrequest_keeps_its_parents_place(sqlite_url, apps):
    def outer(request):
        sub = Request.blank('/hello')
        request.invoke_subrequest(sub, use_tweens=True)
        active = request.registry.dbtune.active
        return {'mine': active[threading.get_ident()] is request}

    app = apps(sqlite_url, [], {**ON, 'dbtune.profile': 'true'},
               views={'/outer': outer, '/hello': hello})  # fmt: skip
    assert app.get('/outer').json == {'mine': True}
    routes = stats_of(app)['routes']
    assert routes['/outer']['requests'] == routes['/hello']['requests'] == 1


def test_a_failing_request_leaves_nothing_behind_with_the_profiler_alone(
    sqlite_url, apps
):
    app = apps(sqlite_url, [], {'dbtune.profile': 'true',
                                'dbtune.stats.token': TOKEN},
               views={'/boom': boom})  # fmt: skip
    with pytest.raises(RuntimeError):
        app.get('/boom')
    assert app.app.registry.dbtune.active == {}


def test_a_retried_request_is_counted_once(sqlite_url):
    from pyramid_retry import mark_error_retryable

    class Conflict(Exception):
        pass

    mark_error_retryable(Conflict)
    attempts = []

    def flaky(request):
        attempts.append(request.environ['retry.attempt'])
        if len(attempts) < 3:
            raise Conflict()
        return {}

    def handled(exc, request):
        request.response.status = 409
        return {}

    settings = {**ON, 'retry.attempts': '4'}
    with Configurator(settings=settings) as config:
        config.include('pyramid_dbtune')
        config.include('pyramid_retry')
        config.add_route('flaky', '/flaky')
        config.add_view(flaky, route_name='flaky', renderer='json')
        app = TestApp(config.make_wsgi_app())
    app.get('/flaky')
    assert attempts == [0, 1, 2]
    route = stats_of(app)['routes']['flaky']
    assert route['requests'] == 1 and route['errors'] == 0
    # An exception view that renders the error: retried the same way.
    attempts.clear()
    with Configurator(settings=settings) as config:
        config.include('pyramid_dbtune')
        config.include('pyramid_retry')
        config.add_route('flaky', '/flaky')
        config.add_view(flaky, route_name='flaky', renderer='json')
        config.add_view(handled, context=Conflict, renderer='json')
        app = TestApp(config.make_wsgi_app())
    app.get('/flaky')
    assert attempts == [0, 1, 2]
    assert stats_of(app)['routes']['flaky']['requests'] == 1


def test_routes_share_their_latencies_and_are_bounded(
    sqlite_url, apps, monkeypatch
):
    monkeypatch.setattr(stats, 'MAX_ROUTES', 2)
    views = {f'/r{i}': hello for i in range(4)}
    app = apps(sqlite_url, [], ON, views=views)
    dbtune = app.app.registry.dbtune

    def drive():
        for i in range(4):
            for _ in range(3):
                app.get(f'/r{i}')
        stats_of(app)  # not counted

    # A thread per connection, as some servers do: the threads end.
    for _ in range(3):
        threads = [threading.Thread(target=drive) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    figures = stats_of(app)
    routes = figures['routes']
    assert sorted(routes) == [stats.OTHER_ROUTES, '/r0', '/r1']
    assert routes['/r0']['requests'] == 18
    assert routes[stats.OTHER_ROUTES]['requests'] == 36
    assert figures['requests'] == 72
    # One window of latencies per route, whatever the threads.
    kept = [name for name, r in dbtune.stats.routes.items() if r]
    assert sorted(kept) == [stats.OTHER_ROUTES, '/r0', '/r1']
    assert len(dbtune.stats.routes['/r0'].recent) == 18
    app.get('/r0')
    assert stats_of(app)['routes']['/r0']['requests'] == 19
    metrics = metrics_of(app)
    assert metrics[('dbtune_request_duration_seconds_count',
                    (('route', '/r1'),))] == 18  # fmt: skip


def test_a_tick_counts_the_requests_of_every_thread(
    sqlite_url, apps, monkeypatch
):
    monkeypatch.setattr(stats, 'TICK', 3600.0)
    app = apps(sqlite_url, [SEARCH], ON)
    dbtune = app.app.registry.dbtune
    dbtune.stats.reset()
    call(app, ('search', {'area': 'Burley'}))  # the first point starts
    # A thread per connection, as some servers do: it ends.
    worker = threading.Thread(
        target=call, args=(app, ('search', {'area': 'Burley'}))
    )
    worker.start()
    worker.join()
    dbtune.stats.tick(time.perf_counter() + 7200)
    assert [p['requests'] for p in dbtune.stats.history] == [2]


def test_a_route_whose_first_request_is_being_counted_is_not_shown(
    sqlite_url, apps
):
    app = apps(sqlite_url, [SEARCH], ON)
    figures = app.app.registry.dbtune.stats
    figures._new_route('fresh')  # as a thread does before it observes
    assert 'fresh' not in stats_of(app)['routes']


def test_the_recent_cpu_ratio_is_the_mean_of_the_last_points(
    sqlite_url, apps, monkeypatch
):
    monkeypatch.setattr(stats, 'RECENT_CPU', 2)
    app = apps(sqlite_url, [SEARCH], ON)
    figures = app.app.registry.dbtune.stats
    figures.reset()
    assert stats_of(app)['parallelism']['recent_cpu_ratio'] is None
    figures.history.extend({'cpu_ratio': r} for r in (0.5, 1.0, 1.5, 2.25))
    assert stats_of(app)['parallelism']['recent_cpu_ratio'] == 1.875


def test_history_points_for_the_chart(sqlite_url, apps, monkeypatch):
    monkeypatch.setattr(stats, 'TICK', 0.0)
    app = apps(sqlite_url, [SEARCH], ON)
    dbtune = app.app.registry.dbtune
    dbtune.stats.reset()
    call(app, ('search', {'area': 'Burley'}))
    call(app, ('search', {'area': 'Burley'}))
    history = stats_of(app)['history']
    assert sum(p['requests'] for p in history) == 2
    assert {p['hit_ratio'] for p in history} <= {None, 0.0, 1.0, 0.5}
    assert all(p['p50_ms'] <= p['p95_ms'] for p in history)
    # A point counts every request of its interval, not only the latencies
    # it keeps for its percentiles.
    monkeypatch.setattr(stats, 'RECENT', 1)
    dbtune.stats.reset()
    for _ in range(4):
        call(app, ('search', {'area': 'Burley'}))
    assert sum(p['requests'] for p in stats_of(app)['history']) == 4
    # A tick another thread is taking is not taken twice.
    before = len(dbtune.stats.history)
    with dbtune.stats._lock:
        dbtune.stats.tick(time.perf_counter() + 100)
    assert len(dbtune.stats.history) == before
    dbtune.stats.tick(time.perf_counter() + 100)
    assert len(dbtune.stats.history) == before + 1


def test_no_database_and_other_caches(tmp_path, memcached):
    from conftest import shared_settings

    with Configurator(settings={**ON, **shared_settings(memcached)}) as config:
        config.include('pyramid_dbtune')
        config.add_route('hello', '/hello')
        config.add_view(hello, route_name='hello', renderer='json')
        app = TestApp(config.make_wsgi_app())
    app.get('/hello')
    figures = stats_of(app)
    assert figures['database'] == {}
    assert figures['cache']['backend'] == 'memcached'
    assert 'entries' not in figures['cache'] and 'errors' in figures['cache']
    assert ('dbtune_db_reads_total', (('role', 'writer'),)) not in (
        metrics_of(app)
    )
    with Configurator(settings={**ON, 'dbtune.cache.backend': 'none'}) as c:
        c.include('pyramid_dbtune')
        app = TestApp(c.make_wsgi_app())
    assert stats_of(app)['cache']['hit_ratio'] is None


def test_pools_without_counts_are_left_out(apps):
    app = apps('sqlite://', [], ON, tables=False)
    assert 'in_use' not in stats_of(app)['database']['roles']['writer']


@pytest.mark.parametrize(
    'settings, message',
    [
        ({'dbtune.stats': 'true'}, 'dbtune.stats = true needs'),
        ({'dbtune.profile': 'yes'}, 'dbtune.profile = true needs'),
        ({'dbtune.stats': 'maybe'}, "dbtune.stats = 'maybe' is not valid"),
        ({'dbtune.server_timing': '2'}, 'expected true or false'),
        ({'dbtune.profile.sample': '0'}, 'from 1 to 1000'),
        ({'dbtune.profile.sample': '1001'}, 'from 1 to 1000'),
        ({'dbtune.profile.sample': 'often'}, 'from 1 to 1000'),
        ({'dbtune.profile.sample': True}, 'from 1 to 1000'),
    ],
)
def test_bad_settings_stop_start_up(settings, message):
    with (
        pytest.raises(ConfigurationError, match=message),
        Configurator(settings=settings) as config,
    ):
        config.include('pyramid_dbtune')


def test_stats_need_prometheus_client(monkeypatch):
    monkeypatch.setitem(sys.modules, 'prometheus_client', None)
    with (
        pytest.raises(ConfigurationError, match=r'pyramid_dbtune\[stats\]'),
        Configurator(settings=ON) as config,
    ):
        config.include('pyramid_dbtune')


def test_after_fork_starts_afresh(sqlite_url, apps):
    app = apps(sqlite_url, [SEARCH], {**ON, 'dbtune.profile': 'true'})
    call(app, ('search', {'area': 'Burley'}))
    dbtune = app.app.registry.dbtune
    dbtune.stats.after_fork()
    dbtune.profiler.after_fork()
    assert dbtune.profiler.samples == 0 and not dbtune.profiler.running
    assert stats_of(app)['requests'] == 0


def test_a_request_does_not_fail_for_its_figures(
    sqlite_url, monkeypatch, caplog
):
    app = make_app(sqlite_url, [SEARCH], ON)
    dbtune = app.app.registry.dbtune

    def out_of_space(*args):
        raise OSError(28, 'No space left on device')

    monkeypatch.setattr(dbtune.stats, 'count', out_of_space)
    for _ in range(2):
        call(app, ('search', {'area': 'Burley'}))
    said = [r for r in caplog.records if 'could not be counted' in r.message]
    assert len(said) == 1 and said[0].exc_info  # once
    # Nothing is left running.
    assert dbtune.stats.in_flight() == 0 and not dbtune.active
    dbtune.close()


@pytest.fixture
def multiprocess_mode(monkeypatch, tmp_path):
    """This process in prometheus_client's multiprocess mode, as if
    PROMETHEUS_MULTIPROC_DIR had been set when it was imported: in
    ``tmp_path``. (prometheus_client's own tests set ValueClass so.)"""
    monkeypatch.setenv('PROMETHEUS_MULTIPROC_DIR', str(tmp_path))
    monkeypatch.setattr(values, 'ValueClass', values.MultiProcessValue())
    return tmp_path


def test_a_process_carries_from_its_start_serving_or_not(
    sqlite_url, multiprocess_mode
):
    # With PROMETHEUS_MULTIPROC_DIR, a process carries what it counts
    # whether or not it has served a request: from its set-up, and in a
    # child forked from it (gunicorn --preload) from the fork. No request
    # nor scrape here: only the process's own thread carries.
    app = make_app(sqlite_url, [SEARCH], ON)
    dbtune = app.app.registry.dbtune
    cache = dbtune.cache

    def misses():
        return dbtune.stats.registry.get_sample_value(
            'dbtune_cache_events_total', {'event': 'misses'}
        )

    def in_a_worker():
        cache.get_or_fill('child', 60, (), lambda: [(1,)])
        until(lambda: misses() == 1)  # its own, not the parent's
        return True

    cache.get_or_fill('parent', 60, (), lambda: [(1,)])
    until(lambda: misses() == 1)
    assert in_a_child(in_a_worker)
    # What is left when the process exits is carried then (atexit).
    cache.get_or_fill('last', 60, (), lambda: [(1,)])
    carrier.carry_at_exit()
    assert misses() == 2
    dbtune.close()


def test_a_fork_while_requests_are_counted_returns(
    sqlite_url, multiprocess_mode
):
    # In multiprocess mode prometheus_client guards every value of the
    # process with one lock. A child forked while a request's thread held
    # it (multiprocessing, from a view of a busy worker) made its metrics
    # anew in os.fork, on that lock held for good: it never started.
    app = make_app(sqlite_url, [SEARCH], ON)
    stop = threading.Event()

    def serve():  # as busy as a worker's threads may be
        request = Request.blank('/').environ
        while not stop.is_set():
            b''.join(app.app(dict(request), lambda *a: None))

    servers = [threading.Thread(target=serve) for _ in range(3)]
    for server in servers:
        server.start()
    hung = 0
    try:
        for _ in range(20):
            pid = os.fork()
            if pid == 0:
                os._exit(0)  # as soon as os.fork returns here
            deadline = time.monotonic() + 5
            while not os.waitpid(pid, os.WNOHANG)[0]:
                if time.monotonic() > deadline:
                    hung += 1
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    break
                time.sleep(0.001)
            if hung:
                break
    finally:
        stop.set()
        for server in servers:
            server.join()
        app.app.registry.dbtune.close()
    assert hung == 0


def test_a_forked_process_counts_only_what_it_did(sqlite_url, apps):
    # gunicorn --preload: the app's cache and router counted in the
    # master before the fork; a worker's metrics are its own, so that
    # several workers' add up to what was done.
    app = apps(sqlite_url, [SEARCH], ON)
    for _ in range(3):
        call(app, ('search', {'area': 'Burley'}))
    cache = app.app.registry.dbtune.cache
    assert (cache.hits, cache.misses) == (2, 1)

    def counted():
        metrics = metrics_of(app)
        return [
            metrics.get(('dbtune_cache_events_total', (('event', e),)), 0)
            for e in ('hits', 'misses')
        ]

    def only_its_own():
        hits, misses = cache.hits, cache.misses
        call(app, ('search', {'area': 'Burley'}))
        return counted() == [cache.hits - hits, cache.misses - misses]

    assert in_a_child(only_its_own)
    assert counted() == [2, 1]  # the parent's, as they were


# Several processes


GUNICORN_APP = """
import os, time
from pyramid.config import Configurator

def hello(request):
    time.sleep(0.05)
    request.sql.one()
    return {'pid': os.getpid()}

with Configurator(settings=%r) as config:
    config.include('pyramid_dbtune')
    config.add_sql_method('one', 'SELECT 1 AS one')
    config.add_route('hello', '/hello')
    config.add_view(hello, route_name='hello', renderer='json')
    application = config.make_wsgi_app()
"""


@contextlib.contextmanager
def stats_gunicorn(tmp_path, *flags):
    """gunicorn (``flags``) serving an app with stats on, in
    prometheus_client's multiprocess mode, once it has answered: ``(get,
    queries, first)``, ``get(path, headers)`` its answer's text,
    ``queries()`` the route queries its files add up to, ``first`` the
    text of its first ``/hello``."""
    url = f'sqlite:///{tmp_path / "app.sqlite"}'
    (tmp_path / 'statsapp.py').write_text(
        GUNICORN_APP % {**ON, 'dbtune.url': url}
    )
    metrics_dir = tmp_path / 'metrics'
    metrics_dir.mkdir()
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    # No control socket: gunicorn's one socket would be shared with any
    # other gunicorn running at the same time.
    quiet = [
        '--no-control-socket'
        for s in KNOWN_SETTINGS
        if s.name == 'control_socket_disable'
    ]
    server = subprocess.Popen(
        [sys.executable, '-m', 'gunicorn', *flags,
         '--bind', f'127.0.0.1:{port}', *quiet,
         '--chdir', str(tmp_path), 'statsapp:application'],
        env={**os.environ, 'PROMETHEUS_MULTIPROC_DIR': str(metrics_dir)},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip

    def get(path, headers=None):
        request = urllib.request.Request(
            f'http://127.0.0.1:{port}{path}', headers=headers or {}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.read().decode()

    def queries():
        every = CollectorRegistry()
        multiprocess.MultiProcessCollector(every, path=metrics_dir)
        return sum(
            sample.value
            for family in every.collect()
            for sample in family.samples
            if sample.name == 'dbtune_route_queries_total'
        )

    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                first = get('/hello')
                break
            except OSError:
                assert time.monotonic() < deadline, server.stderr.read()
                time.sleep(0.1)
        yield get, queries, first
    finally:
        server.terminate()
        server.wait(20)


def test_metrics_add_up_gunicorn_workers(tmp_path):
    with stats_gunicorn(tmp_path, '--workers', '2') as (get, queries, _):
        pids, served = set(), [1]

        def drive():
            for _ in range(10):
                pids.add(json.loads(get('/hello'))['pid'])
                served.append(1)

        # Until both workers answered (which one does is the kernel's
        # choice), or the deadline.
        deadline = time.monotonic() + 60
        while len(pids) < 2 and time.monotonic() < deadline:
            threads = [threading.Thread(target=drive) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        assert len(pids) == 2  # both workers served

        # Each worker carries its figures into prometheus_client's files
        # on its own, idle or not: no request nor scrape reaches it now.
        deadline = time.monotonic() + 20
        while queries() != len(served) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert queries() == len(served)

        total, text = 0, ''
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (
            total == len(served) and 'dbtune_requests_in_flight 0.0' in text
        ):
            time.sleep(0.3)
            text = get('/_dbtune/metrics', AUTH)
            total = sum(
                sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.name == 'dbtune_request_duration_seconds_count'
            )
        # Every worker's requests, whoever answers.
        assert total == len(served)
        assert 'dbtune_requests_in_flight 0.0' in text
        # prometheus_client's files, a set per process; none of ours.
        files = sorted(p.name for p in (tmp_path / 'metrics').iterdir())
        assert not [f for f in files if f.startswith('dbtune_')], files
        histograms = [f for f in files if f.startswith('histogram_')]
        assert len(histograms) >= 2, files


def test_a_worker_that_exits_carries_what_it_counted(tmp_path):
    # gunicorn recycles a worker after --max-requests (as on a reload):
    # what it counted since its thread last carried is carried as it
    # exits, not lost.
    recycled = ('--workers', '1', '--max-requests', '10',
                '--max-requests-jitter', '0')  # fmt: skip
    with stats_gunicorn(tmp_path, *recycled) as (get, queries, first):

        def hello():
            return json.loads(get('/hello'))['pid']

        first = json.loads(first)['pid']
        # Its 10th request is its last: the next is the next worker's,
        # once the first has exited.
        assert {hello() for _ in range(9)} == {first}
        assert hello() != first
        # The next worker's one query is carried by its thread; the first
        # worker's ten were carried by then, or never.
        deadline = time.monotonic() + 20
        while queries() != 11 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert queries() == 11


CHILD = """
from pyramid.config import Configurator
from webtest import TestApp

with Configurator(settings=%r) as config:
    config.include('pyramid_dbtune')
    config.add_route('hello', '/hello')
    config.add_view(lambda request: {}, route_name='hello', renderer='json')
    app = TestApp(config.make_wsgi_app())
for _ in range(3):
    app.get('/hello')
import os
print(os.getpid())
"""


def test_every_process_is_added_up_and_a_dead_one_leaves_gauges(
    tmp_path, monkeypatch, multiprocess_mode
):
    """With PROMETHEUS_MULTIPROC_DIR, a process's requests are counted in
    prometheus_client's files there, and the metrics view of any process
    adds them up; gunicorn's child_exit hook takes a dead worker's gauges
    out."""
    from types import SimpleNamespace

    from pyramid_dbtune.deploy.gunicorn import child_exit

    monkeypatch.setattr(stats, 'TICK', 0.05)
    # The carriers of earlier tests' apps end when those are collected.
    earlier = [t for t in threading.enumerate() if t.name == CARRIER]
    done = subprocess.run(
        [sys.executable, '-c', CHILD % ON],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    child = int(done.stdout)
    with Configurator(settings=ON) as config:
        config.include('pyramid_dbtune')
        app = TestApp(config.make_wsgi_app())
    metrics = metrics_of(app)
    assert metrics[('dbtune_request_duration_seconds_count',
                    (('route', 'hello'),))] == 3  # fmt: skip
    # Only the processes' own: prometheus_client's figures of this one are
    # not added to every process's.
    assert not any(name.startswith('python_') for name, _ in metrics)
    files = {p.name for p in tmp_path.iterdir()}
    assert f'gauge_livesum_{child}.db' in files
    child_exit(None, SimpleNamespace(pid=child))
    files = {p.name for p in tmp_path.iterdir()}
    assert f'gauge_livesum_{child}.db' not in files
    assert f'histogram_{child}.db' in files  # its requests still count

    # Its first request started this process's carrier thread, which ends
    # with its app.
    def carriers():
        return [
            t
            for t in threading.enumerate()
            if t.name == CARRIER and t not in earlier
        ]

    assert len(carriers()) == 1
    del app, config
    gc.collect()
    deadline = time.monotonic() + 10
    while carriers():
        assert time.monotonic() < deadline
        time.sleep(0.05)


IMPORTED_FIRST = """
import os, sys
import prometheus_client  # as another library, imported first, would

os.environ['PROMETHEUS_MULTIPROC_DIR'] = sys.argv[1]
from pyramid.config import Configurator

with Configurator(settings=%r) as config:
    config.include('pyramid_dbtune')
"""


def test_the_variable_set_after_prometheus_client_stops_start_up(tmp_path):
    """prometheus_client chose its mode when it was imported: set after,
    the variable would have ``/_dbtune/metrics`` read a directory where
    this process writes nothing (an empty scrape)."""
    done = subprocess.run(
        [sys.executable, '-c', IMPORTED_FIRST % ON, str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert (
        'ConfigurationError: PROMETHEUS_MULTIPROC_DIR is set, but '
        'prometheus_client was imported before it was' in done.stderr
    )
    assert 'environment before the process starts' in done.stderr


def test_multiprocess_mode_and_the_variable_must_agree(monkeypatch, tmp_path):
    # This process imported prometheus_client without the variable.
    assert values.ValueClass is values.MutexValue
    monkeypatch.setenv('PROMETHEUS_MULTIPROC_DIR', str(tmp_path))
    with (
        pytest.raises(ConfigurationError, match='imported before it was'),
        Configurator(settings=ON) as config,
    ):
        config.include('pyramid_dbtune')
    # The other way round: the variable gone after the import.
    monkeypatch.setattr(values, 'ValueClass', values.MultiProcessValue())
    monkeypatch.delenv('PROMETHEUS_MULTIPROC_DIR')
    with (
        pytest.raises(ConfigurationError, match='is not set now'),
        Configurator(settings=ON) as config,
    ):
        config.include('pyramid_dbtune')
