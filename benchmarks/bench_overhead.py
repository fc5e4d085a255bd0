"""What the timing tween and the profiler cost per request.

Side by side in one run, in process (no server), microseconds per request:

1. The timing tween alone, around a handler that answers at once (a
   Pyramid request and response, no view) for a request that called SQL
   methods (its ``request.dbtune`` counts a cache hit and a miss: the
   figures of a read, as most requests are; a request that wrote carries
   ``db-write`` too), with ``dbtune.server_timing``,
   with ``dbtune.stats``, with both, against the handler called directly;
   then with both in a process started with ``PROMETHEUS_MULTIPROC_DIR``
   (several processes: prometheus_client keeps its values in files, and
   reads that variable once, when it is first imported). Target: the tween
   adds at most 3 us in one process. Then what reading a thread's CPU
   clock costs (one request in ``CPU_EVERY`` does it twice).
2. The same four through the whole app, a view that answers ``OK``: the
   difference is the same, within the noise of a bigger figure, but for
   the route of the ``/_dbtune/`` views, which every request is matched
   against before the app's own: what matching ``/ok`` costs, with and
   without it, is printed.
3. A view that does about a millisecond of work (a cached SQL method hit,
   a loop in Python, a JSON answer), with the profiler off and on at its
   default rate (``dbtune.profile.sample = 100`` a second), and, for
   comparison, under cProfile for every request, as a 1-in-N cProfile
   profiler would profile the requests it picks. Target: the profiler
   adds at most 5%.

Each figure is the best of several rounds, the variants run in turn in
each round, so that other load on the machine spoils all of them alike.

    .venv/bin/python benchmarks/bench_overhead.py [--quick]
"""

import argparse
import cProfile
import os
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import sqlalchemy as sa
from pyramid.config import Configurator
from pyramid.request import Request, apply_request_extensions
from pyramid.response import Response

import bench_fastpath
from common import best_of_rounds, best_per_call
from pyramid_dbtune.ops.stats import CPU_EVERY
from pyramid_dbtune.ops.tween import timing_tween_factory

TOKEN = 'a-benchmark-token-of-some-length'
TWEEN = {
    'off': {},
    'server_timing': {'dbtune.server_timing': 'true'},
    'stats': {'dbtune.stats': 'true'},
    'stats + server_timing': {
        'dbtune.stats': 'true',
        'dbtune.server_timing': 'true',
    },
}
#: The last one, in a process with PROMETHEUS_MULTIPROC_DIR set.
MULTI = 'stats + server_timing, multi-process'
PROFILE = {
    'profiler off': {},
    'profiler on (100/s)': {'dbtune.profile': 'true'},
}
#: Loop turns that take about a millisecond on the development machine.
WORK = 20000


def ok_view(request):
    return Response('OK')


def work_view(request):
    rows = request.sql.search(area='Headingley')
    total = 0
    for i in range(WORK):
        total += i * i % 7
    return {'rows': [list(r) for r in rows], 'total': total}


def make(url, settings):
    settings = {'dbtune.url': url, 'dbtune.stats.token': TOKEN, **settings}
    with Configurator(settings=settings) as config:
        config.include('pyramid_dbtune')
        config.add_sql_method(
            'search',
            'SELECT id, rent FROM property WHERE area = :area',
            cache_time=3600,
        )
        config.add_route('ok', '/ok')
        config.add_view(ok_view, route_name='ok')
        config.add_route('work', '/work')
        config.add_view(work_view, route_name='work', renderer='json')
        return config.make_wsgi_app()


def per_request(app, path, calls):
    statuses = []

    def start_response(status, headers, exc_info=None):
        statuses.append(status)

    seconds = bench_fastpath.per_request(app, calls, path, start_response)
    assert set(statuses) == {'200 OK'}, set(statuses)
    return seconds


def side_by_side(apps, path, calls, rounds):
    return best_of_rounds(
        {name: partial(per_request, app, path, calls)
         for name, app in apps.items()},
        rounds,
    )  # fmt: skip


def tween_alone(apps, calls, rounds):
    """Seconds per call of each app's timing tween around a handler that
    returns a new response; ``off``: the handler alone."""

    timed = {}
    for name, app in apps.items():
        request = Request.blank('/work')
        request.registry = app.registry
        apply_request_extensions(request)
        request.matched_route = app.routes_mapper.get_route('work')
        request.sql.search(area='Headingley')  # a miss, then a hit
        request.sql.search(area='Headingley')
        context = request.dbtune

        def handler(request, context=context):
            # What a view that called SQL methods leaves on its request.
            request.__dict__['dbtune'] = context
            return Response()

        tween = timing_tween_factory(handler, app.registry)
        function = tween if name != 'off' else handler
        timed[name] = partial(calling, function, request, calls)
    return best_of_rounds(timed, rounds)


def calling(function, request, calls):
    """Seconds per call of ``function(request)``, ``calls`` times."""
    start = time.perf_counter()
    for _ in range(calls):
        function(request)
    return (time.perf_counter() - start) / calls


def matching(app, calls, rounds):
    """Seconds to match ``/ok`` against the app's routes."""
    request = Request.blank('/ok')
    request.registry = app.registry
    return best_per_call(partial(app.routes_mapper, request), calls, rounds)


def under_cprofile(app, path, calls):
    """Seconds per request with a cProfile of each request of its own."""

    def profiled(environ, start_response):
        profile = cProfile.Profile()
        profile.enable()
        try:
            return list(app(environ, start_response))
        finally:
            profile.disable()

    return per_request(profiled, path, calls)


def multi_process(directory, quick):
    """Microseconds the tween adds, all on, in a child process started
    with ``PROMETHEUS_MULTIPROC_DIR``."""
    done = subprocess.run(
        [sys.executable, __file__, '--tween-only', *(['--quick'] * quick)],
        env={**os.environ, 'PROMETHEUS_MULTIPROC_DIR': directory},
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--quick', action='store_true',
                        help='a few rounds only (for the tests)')  # fmt: skip
    parser.add_argument('--tween-only', action='store_true',
                        help='the tween alone, all on (for a child '
                        'process with PROMETHEUS_MULTIPROC_DIR)')  # fmt: skip
    args = parser.parse_args(argv)
    ok_calls, ok_rounds = (500, 3) if args.quick else (2000, 40)
    work_calls, work_rounds = (20, 2) if args.quick else (1000, 9)

    with tempfile.TemporaryDirectory() as tmp:
        url = f'sqlite:///{Path(tmp) / "bench.sqlite"}'
        engine = sa.create_engine(url)
        with engine.begin() as connection:
            connection.exec_driver_sql(
                'CREATE TABLE property (id INTEGER PRIMARY KEY, '
                'area TEXT, rent INTEGER)'
            )
            connection.exec_driver_sql(
                "INSERT INTO property VALUES (1, 'Headingley', 90), "
                "(2, 'Headingley', 120)"
            )
        engine.dispose()

        if args.tween_only:
            all_on = 'stats + server_timing'
            apps = {n: make(url, TWEEN[n]) for n in ('off', all_on)}
            alone = tween_alone(apps, ok_calls * 5, ok_rounds)
            print((alone[all_on] - alone['off']) * 1e6)
            return 0
        apps = {name: make(url, s) for name, s in TWEEN.items()}
        alone = tween_alone(apps, ok_calls * 5, ok_rounds)
        alone[MULTI] = alone['off'] + multi_process(tmp, args.quick) / 1e6
        clock = best_per_call(time.thread_time, 1000, ok_rounds)
        tween = side_by_side(apps, '/ok', ok_calls, ok_rounds)
        routes = {
            name: (apps[name].routes_mapper.get_routes(),
                   matching(apps[name], ok_calls, ok_rounds))
            for name in ('off', 'stats')
        }  # fmt: skip
        apps = {name: make(url, s) for name, s in PROFILE.items()}
        profile = side_by_side(apps, '/work', work_calls, work_rounds)
        profile['cProfile, every request'] = min(
            under_cprofile(apps['profiler off'], '/work', work_calls)
            for _ in range(max(1, work_rounds // 3))
        )
        samples = apps['profiler on (100/s)'].registry.dbtune.profiler.samples
    for title, figures in (
        ('The timing tween alone (off: the handler alone)', alone),
        ('The whole app, a view that answers OK', tween),
    ):
        base = figures['off']
        print(title)
        print(f'{"what":40} {"us/request":>11} {"added us":>9}')
        for name, seconds in figures.items():
            added = (seconds - base) * 1e6
            print(f'{name:40} {seconds * 1e6:11.2f} {added:9.2f}')
        print()
    (plain, off), (more, on) = routes['off'], routes['stats']
    print(
        f'matching /ok against the routes: {off * 1e6:.2f} us '
        f'({len(plain)} routes), {on * 1e6:.2f} us with stats '
        f'({len(more)}: {more[0].pattern} first): the route adds '
        f'{(on - off) * 1e6:.2f} us\n'
    )
    added = (alone['stats + server_timing'] - alone['off']) * 1e6
    verdict = 'met' if added <= 3 else 'NOT met'
    print(f'tween adds {added:.2f} us, all on (target <= 3 us: {verdict})')
    added = (alone[MULTI] - alone['off']) * 1e6
    print(
        f'tween adds {added:.2f} us, all on, several processes (values '
        "in prometheus_client's files; no target)"
    )
    print(
        f"reading a thread's CPU clock: {clock * 1e6:.2f} us, twice in one "
        f'request in {CPU_EVERY}'
    )

    base = profile['profiler off']
    print('\nThe profiler, on a view that works about 1 ms')
    print(f'{"what":40} {"us/request":>11} {"x off":>9}')
    for name, seconds in profile.items():
        print(f'{name:40} {seconds * 1e6:11.2f} {seconds / base:9.3f}')
    added = (profile['profiler on (100/s)'] / base - 1) * 100
    verdict = 'met' if added <= 5 else 'NOT met'
    print(
        f'\nprofiler adds {added:.1f}% at its default rate, {samples} '
        f'samples taken (target <= 5%: {verdict})'
    )
    return 0


if __name__ == '__main__':
    sys.exit(main())
