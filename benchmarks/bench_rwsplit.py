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

    .venv/bin/python benchmarks/bench_rwsplit.py [--quick]
"""

import argparse
import sys
import threading
import time

import sqlalchemy as sa
from pyramid.config import Configurator
from pyramid.response import Response
from webtest import TestApp

from common import POSTGRESQL_URL, postgresql_scratch

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
    return 0


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
