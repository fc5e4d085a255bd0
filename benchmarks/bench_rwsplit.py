"""Reads in parallel, writes one at a time: wall times on PostgreSQL.

Side by side in one run, requests through a Pyramid app with
pyramid_dbtune, on real threads:

* one read that spends ``--seconds`` (0.2) in the database (``pg_sleep``);
* 8 such reads at once, through the read/write router;
* 8 such reads at once, through one shared connection (what an app that
  keeps a single connection, or a pool of one, does);
* 8 writes at once, each holding its transaction ``--seconds``.

It prints each wall time and its ratio to the single read. The project's
aims: parallel reads take at most 1.3x one read; the shared connection
about 8x; writes, serialised by the write slot, about 8x.

Then **a real standby**: a PostgreSQL primary and its streaming standby,
started for the run on free loopback ports (``tests/servers.py``), behind
an app with ``dbtune.read_urls`` and causal reads (the default). 8
clients, each with its own cookies, read for ``--standby-seconds`` (3);
one read in ten follows a write of the client's own, which its next read
must show; the standby replays at once, then 100 ms late. It prints the
share of reads each server served, the standby's lag as the app saw it,
and the reads that did not show their client's write (the aim: 0).

    .venv/bin/python benchmarks/bench_rwsplit.py [--quick]
"""

import argparse
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import sqlalchemy as sa
from pyramid.config import Configurator
from pyramid.response import Response
from webtest import TestApp

from common import POSTGRESQL_URL, postgresql_scratch

sys.path.insert(0, str(Path(__file__).parents[1] / 'tests'))
from servers import PostgreSQL  # noqa: E402

CONCURRENCY = 8


def scratch_schema():
    url, drop = postgresql_scratch()
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.exec_driver_sql(
            'CREATE TABLE counter (id INTEGER PRIMARY KEY, n INTEGER)'
        )
        connection.exec_driver_sql('INSERT INTO counter VALUES (1, 0)')
    engine.dispose()
    return url, drop


def make_app(url, seconds):
    shared = sa.create_engine(url, pool_size=1, max_overflow=0)
    shared_lock = threading.Lock()
    sleep = f'SELECT pg_sleep({seconds}) AS z, :n AS n'

    def read(request):
        request.sql.slow(n=int(request.params['n']))
        return Response('read')

    def shared_read(request):
        # One connection for everyone: each read waits for the last.
        with shared_lock, shared.connect() as connection:
            connection.execute(sa.text(sleep), {'n': request.params['n']})
        return Response('shared')

    def write(request):
        request.sql.bump()
        request.sql.slow(n=0)  # in the writing transaction, holding a slot
        return Response('written')

    config = Configurator(
        settings={
            'dbtune.url': url,
            'dbtune.read_pool_size': str(CONCURRENCY),
        }
    )
    config.include('pyramid_dbtune')
    config.add_sql_method('slow', sleep)
    config.add_sql_method('bump', 'UPDATE counter SET n = n + 1 WHERE id = 1')
    for name, view in (
        ('read', read),
        ('shared', shared_read),
        ('write', write),
    ):
        config.add_route(name, f'/{name}')
        config.add_view(view, route_name=name)
    app = TestApp(config.make_wsgi_app())
    return app, shared


def wall(app, method, path, count):
    """Seconds for ``count`` requests sent at once on their own threads."""
    barrier = threading.Barrier(count + 1)
    errors = []

    def one(i):
        barrier.wait()
        try:
            app.request(f'{path}?n={i}', method=method)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--seconds', type=float, default=0.2)
    parser.add_argument(
        '--quick', action='store_true', help='0.02 s statements, one round'
    )
    parser.add_argument('--standby-seconds', type=float, default=3.0)
    args = parser.parse_args(argv)
    seconds, rounds = (0.02, 1) if args.quick else (args.seconds, 3)
    try:
        url, drop = scratch_schema()
    except sa.exc.OperationalError as exc:
        print(f'PostgreSQL at {POSTGRESQL_URL} is not reachable: {exc}')
        return 1
    app, shared = make_app(url, seconds)
    try:
        wall(app, 'GET', '/read', CONCURRENCY)  # fill the pools
        results = {
            'one read': min(
                wall(app, 'GET', '/read', 1) for _ in range(rounds)
            ),
            f'{CONCURRENCY} reads, split router': min(
                wall(app, 'GET', '/read', CONCURRENCY) for _ in range(rounds)
            ),
            f'{CONCURRENCY} reads, one shared connection': min(
                wall(app, 'GET', '/shared', CONCURRENCY) for _ in range(rounds)
            ),
            f'{CONCURRENCY} writes': min(
                wall(app, 'POST', '/write', CONCURRENCY) for _ in range(rounds)
            ),
        }
    finally:
        app.app.registry.dbtune.router.dispose()
        shared.dispose()
        drop()
    report(results, seconds)
    print()
    report_standby(on_a_standby(0.5 if args.quick else args.standby_seconds))
    return 0


#: The standby's replay delays of the run: none, and a late one.
DELAYS = ('0', '100ms')


def on_a_standby(seconds):
    """Clients reading, and now and then writing, through an app whose
    reads go to a real streaming standby, replaying at once and then
    late: the figures of each."""
    primary = PostgreSQL()
    standby = None
    try:
        engine = sa.create_engine(primary.url)
        with engine.begin() as connection:
            connection.exec_driver_sql(
                'CREATE TABLE counter (id INTEGER PRIMARY KEY, n INTEGER)'
            )
            connection.exec_driver_sql(
                'INSERT INTO counter SELECT i, 0 FROM generate_series(1, '
                f'{CONCURRENCY}) i'
            )
        engine.dispose()
        standby = PostgreSQL(standby_of=primary)
        figures = {}
        for delay in DELAYS:
            standby.stop()
            standby.options = [f'recovery_min_apply_delay={delay}']
            standby.start()
            figures[delay] = _run(primary, standby, seconds)
        return figures
    finally:
        if standby is not None:
            standby.remove()
        primary.remove()


def _run(primary, standby, seconds):
    config = Configurator(
        settings={
            'dbtune.url': primary.url,
            'dbtune.read_urls': standby.url,
            'dbtune.max_replica_lag': '1',
        }
    )
    config.include('pyramid_dbtune')
    config.add_sql_method('n', 'SELECT n FROM counter WHERE id = :id')
    config.add_sql_method(
        'bump', 'UPDATE counter SET n = n + 1 WHERE id = :id'
    )

    def read(request):
        (row,) = request.sql.n(id=int(request.params['id']))
        return Response(str(row.n))

    def write(request):
        request.sql.bump(id=int(request.params['id']))
        return Response('written')

    for name, view in (('read', read), ('write', write)):
        config.add_route(name, f'/{name}')
        config.add_view(view, route_name=name)
    wsgi = config.make_wsgi_app()
    router = wsgi.registry.dbtune.router
    (reader,) = router.readers
    deadline = time.monotonic() + 30
    while reader.position is None or reader.lag is None:
        if time.monotonic() > deadline:
            raise RuntimeError('the standby did not come up')
        time.sleep(0.05)
    try:
        return _load(wsgi, router, reader, seconds)
    finally:
        router.dispose()


def _load(wsgi, router, reader, seconds):
    stopping = threading.Event()
    counts = {'reads': 0, 'after_write': 0, 'stale': 0}
    lags = []
    errors = []
    lock = threading.Lock()

    def client(id):
        app = TestApp(wsgi)  # its own cookies: its own pin
        rng = random.Random(id)
        written = 0
        try:
            while not stopping.is_set():
                wrote = rng.random() < 0.1
                if wrote:
                    app.post(f'/write?id={id}')
                    written += 1
                seen = int(app.get(f'/read?id={id}').text)
                with lock:
                    counts['reads'] += 1
                    counts['after_write'] += wrote
                    counts['stale'] += seen < written
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=client, args=(i + 1,))
        for i in range(CONCURRENCY)
    ]
    before = (reader.reads, router.writer_reads)
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if reader.lag is not None:
            lags.append(reader.lag)
        time.sleep(0.01)
    stopping.set()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    on_standby = reader.reads - before[0]
    on_writer = router.writer_reads - before[1]
    return {
        **counts,
        'on_standby': on_standby,
        'on_writer': on_writer,
        'lag_median': statistics.median(lags),
        'lag_max': max(lags),
    }


def report_standby(figures):
    print(
        f'A real standby: {CONCURRENCY} clients read; one read in ten '
        'follows a write of its own client, which it must show'
    )
    print(
        f'{"standby replays":16} {"reads":>6} {"after a write":>14} '
        f'{"on standby":>11} {"on writer":>10} {"lag median":>11} '
        f'{"lag max":>8} {"stale":>6}'
    )
    stale = 0
    for delay, run in figures.items():
        served = run['on_standby'] + run['on_writer']
        late = 'at once' if delay == '0' else f'{delay} late'
        print(
            f'{late:16} {run["reads"]:6} {run["after_write"]:14} '
            f'{run["on_standby"] / served:11.0%} '
            f'{run["on_writer"] / served:10.0%} '
            f'{run["lag_median"] * 1000:9.1f}ms '
            f'{run["lag_max"] * 1000:6.1f}ms {run["stale"]:6}'
        )
        stale += run['stale']
    print(
        f"\nreads that did not show their client's write: {stale} (target "
        f'0: {"met" if stale == 0 else "NOT met"})'
    )


def report(results, seconds):
    one = results['one read']
    print(f'Each statement spends {seconds:g} s in PostgreSQL; best of rounds')
    print(f'{"what":38} {"wall s":>8} {"x one read":>11}')
    for name, took in results.items():
        print(f'{name:38} {took:8.3f} {took / one:11.2f}')
    split = results[f'{CONCURRENCY} reads, split router'] / one
    shared = results[f'{CONCURRENCY} reads, one shared connection'] / one
    writes = results[f'{CONCURRENCY} writes'] / one
    print(
        f'\nparallel reads = {split:.2f}x one read (target <= 1.3: '
        f'{"met" if split <= 1.3 else "NOT met"}); shared connection = '
        f'{shared:.1f}x (about {CONCURRENCY} expected); writes = '
        f'{writes:.1f}x (serialised: about {CONCURRENCY} expected)'
    )


if __name__ == '__main__':
    sys.exit(main())
