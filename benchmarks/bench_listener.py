"""What a burst of changes made outside costs a listening process, with
memcached: each change's tags bumped in turn (``Listener.apply``, one call
a change), against the burst's tags bumped together
(``Listener.apply_all``, as the listener applies what one read of the
changes finds).

Side by side in one run, against one memcached started on loopback for
the run, for two bursts of changes to ``property``, whose reads are pinned
by ``id``:

1. one row updated again and again (a job that counts something up);
2. every row updated once (a job that rewrites a column): each row's tag
   is bumped either way, the table's once rather than once a change.

    .venv/bin/python benchmarks/bench_listener.py [--quick]
"""

import argparse
import tempfile
import time

from pyramid.config import Configurator

from common import start_memcached, stop_server
from pyramid_dbtune.cache.changes import Listener


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--quick', action='store_true')
    args = parser.parse_args(argv)
    count = 200 if args.quick else 5000
    process, port = start_memcached()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            listener = make_listener(f'sqlite:///{tmp}/bench.sqlite', port)
            try:
                print(f'A burst of {count} changes, memcached on loopback')
                print(f'{"burst":32} {"in turn":>9} {"together":>9} ratio')
                for what, ids in (
                    ('one row, again and again', [1] * count),
                    ('every row, once', range(count)),
                ):
                    changes = [change(i, n) for n, i in enumerate(ids)]
                    apart = timed(in_turn, listener, changes)
                    together = timed(listener.apply_all, changes)
                    print(
                        f'{what:32} {apart:8.3f}s {together:8.3f}s '
                        f'{apart / together:5.1f}x'
                    )
            finally:
                listener.dbtune.close()
    finally:
        stop_server(process)
    return 0


def make_listener(url, port):
    config = Configurator(
        settings={
            'dbtune.url': url,
            'dbtune.cache.backend': 'memcached',
            'dbtune.cache.servers': f'127.0.0.1:{port}',
            'dbtune.cache.secret': 'a benchmark secret of some length',
        }
    )
    config.include('pyramid_dbtune')
    get = 'SELECT id, rent FROM property WHERE id = :id'
    config.add_sql_method('get', get, cache_time=3600)
    config.commit()
    return Listener(config.registry.dbtune)  # not started: fed by hand


def change(id_, rent):
    """A change of one row of ``property``, as a trigger tells it."""
    return (
        'property',
        {
            'old': [{'id': id_, 'rent': rent}],
            'new': [{'id': id_, 'rent': rent + 1}],
        },
    )


def in_turn(listener, changes):
    for each in changes:
        listener.apply(*each)


def timed(run, *args):
    start = time.perf_counter()
    run(*args)
    return time.perf_counter() - start


if __name__ == '__main__':
    raise SystemExit(main())
