"""What a shared-cache hit costs, against the round trip it cannot avoid.

Side by side in one run, against one memcached started on loopback for
the run, on the demo's search (50 rows):

1. a raw pymemcache ``get`` of the very bytes pyramid_dbtune stores (the
   floor: one round trip and nothing else);
2. a raw pymemcache ``get_many`` of the keys a first hit in a process
   reads: the entry and the generations that keep it fresh; and of the
   generations alone, all a later hit of rows the process has verified
   reads (the floors: what pymemcache and memcached take for the keys,
   with none of pyramid_dbtune's work);
3. a dogpile.cache region on its pymemcache backend, ``get_or_create`` hit
   (pickled rows);
4. a pyramid_dbtune hit through ``request.sql``, as a process serves it
   again and again: its generations in one round trip, compared with
   those of the rows it verified (signature checked) at its first hit.

Targets: at most 1.5x the raw get, and faster than the dogpile hit. Each
figure is the best of several rounds, run in turn.

Where the machine lets it, the run is made twice, with memcached and this
process placed on CPUs: *apart*, memcached on a CPU of its own, as on a
core or a machine of its own; and *together*, both on one CPU, the
cheapest round trip the machine has, where the hit's own work weighs
most. Left to the scheduler, a connection's round trip on a virtual
machine is fast or slow by where its memcached thread happens to run (10
or 70 us here), and the figures compared were of that, not of the hit.

    .venv/bin/python benchmarks/bench_memcached.py [--quick]
"""

import argparse
import os
import sys
import tempfile
from functools import partial
from pathlib import Path

from dogpile.cache import make_region
from pymemcache.client.base import Client
from pyramid.config import Configurator
from pyramid.scripting import prepare

from common import (
    best_of_rounds,
    best_per_call,
    load_properties,
    start_memcached,
    stop_server,
)

HERE = Path(__file__).parent
SEARCH = (
    HERE.parent / 'examples/accommodation/accommodation/sql/'
    'search_properties.sql'
).read_text()
PARAMS = {
    'area': 'Headingley',
    'max_rent': 200,
    'min_rooms': 1,
    'available': '2026-12-01',
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--quick', action='store_true')
    args = parser.parse_args(argv)
    calls, rounds = (100, 2) if args.quick else (5000, 7)
    with tempfile.TemporaryDirectory() as tmp:
        url = f'sqlite:///{tmp}/bench.sqlite'
        load_properties(url)
        for placement, mine, its in placements():
            process, port = start_memcached()
            own = os.sched_getaffinity(0) if mine else None
            try:
                if mine:
                    place(process.pid, its)
                    os.sched_setaffinity(0, mine)
                results, size, count = measure(url, port, calls, rounds)
            finally:
                if own:
                    os.sched_setaffinity(0, own)
                stop_server(process)
            report(placement, results, size, count)
    return 0


def placements():
    """``(what, this process's CPUs, memcached's)`` of each run: apart and
    together where there are two CPUs to place them on, else one run
    where the scheduler puts them."""
    cpus = sorted(getattr(os, 'sched_getaffinity', lambda _: ())(0))
    if len(cpus) < 2:
        return [('placed by the scheduler', None, None)]
    first, second = {cpus[0]}, {cpus[1]}
    return [
        ('apart: memcached on a CPU of its own', first, second),
        ('together: memcached and the client on one CPU', first, first),
    ]


def place(pid, cpus):
    """Run every thread of process ``pid`` on ``cpus`` (those it starts
    later follow theirs)."""
    for thread in os.listdir(f'/proc/{pid}/task'):
        os.sched_setaffinity(int(thread), cpus)


def measure(url, port, calls, rounds):
    config = Configurator(
        settings={
            'dbtune.url': url,
            'dbtune.cache.backend': 'memcached',
            'dbtune.cache.servers': f'127.0.0.1:{port}',
            'dbtune.cache.secret': 'a benchmark secret of some length',
        }
    )
    config.include('pyramid_dbtune')
    config.add_sql_method('search', SEARCH, cache_time=3600, max_rows=50)
    config.commit()
    request = prepare(registry=config.registry)['request']
    search = request.sql.search
    rows = search(**PARAMS)
    assert search(**PARAMS) == rows and len(rows) == 50
    runtime = config.registry.dbtune
    key = (
        runtime.methods['search'].key,
        tuple(PARAMS.values()),
        tuple(type(v) for v in PARAMS.values()),
    )
    name, *generations = runtime.cache.hit_keys(
        key, runtime.methods['search'].tags(PARAMS)
    )
    keys = [name, *generations]

    raw = Client(('127.0.0.1', port), no_delay=True)
    stored = raw.get(name)
    assert stored is not None
    assert len(raw.get_many(keys)) == len(keys)

    region = make_region().configure(
        'dogpile.cache.pymemcache',
        expiration_time=3600,
        arguments={'url': [f'127.0.0.1:{port}']},
    )

    def dogpile_hit():
        key = 'search:{area}:{max_rent}:{min_rooms}:{available}'.format(
            **PARAMS
        )
        return region.get_or_create(key, creator)

    def creator():
        return rows

    assert dogpile_hit() == rows
    results = best_of_rounds(
        {
            'raw': partial(best_per_call, lambda: raw.get(name), calls, 1),
            'keys': partial(
                best_per_call, lambda: raw.get_many(keys), calls, 1
            ),
            'generations': partial(
                best_per_call, lambda: raw.get_many(generations), calls, 1
            ),
            'dogpile': partial(best_per_call, dogpile_hit, calls, 1),
            'ours': partial(best_per_call, lambda: search(**PARAMS), calls, 1),
        },
        rounds,
    )
    assert runtime.cache.misses == 1
    raw.close()
    runtime.router.dispose()
    return results, len(stored), len(keys)


def report(placement, results, size, count):
    raw = results['raw']
    rows = [
        ('raw pymemcache get of the same bytes', results['raw']),
        (f'raw get_many, {count} keys of a first hit', results['keys']),
        (
            f'raw get_many, {count - 1} generations alone',
            results['generations'],
        ),
        ('dogpile.cache pymemcache hit', results['dogpile']),
        ('pyramid_dbtune memcached hit', results['ours']),
    ]
    print(f'\n{placement}')
    print(f'A 50-row entry of {size} bytes (signature included), loopback')
    print(f'{"what":40} {"us/call":>9} {"x raw get":>10}')
    for name, seconds in rows:
        print(f'{name:40} {seconds * 1e6:9.1f} {seconds / raw:10.2f}')
    ours = results['ours'] / raw
    print(
        f'\nours / raw get = {ours:.2f} (target <= 1.5: '
        f'{"met" if ours <= 1.5 else "NOT met"}); ours / dogpile = '
        f'{results["ours"] / results["dogpile"]:.2f} (target < 1: '
        f'{"met" if results["ours"] < results["dogpile"] else "NOT met"})'
    )
    extra = (results['ours'] - raw) * 1e6
    print(f'a hit costs {extra:.1f} us more than the raw get')


if __name__ == '__main__':
    sys.exit(main())
