"""What a cache hit costs, side by side with what it saves.

Measured in one run, in one process, on the accommodation demo's search
(20,000 properties, the cheapest 50 of an area kept):

1. a cache hit through ``request.sql.search_properties(...)``;
2. a dogpile.cache memory-region ``get_or_create`` hit on the same
   arguments (the key formatted from them, as a user would);
3. the same SQL method uncached, on SQLite (the demo's embedded database);
4. the same SQL method uncached, on PostgreSQL (skipped with a note when the
   server cannot be reached).

It prints microseconds per call and the ratios the project aims at: a hit
costs at most half of dogpile's hit, and at least 10x less than the
uncached SQLite query. Each figure is the best of several rounds, so other
load on the machine makes the figures worse, not better.

    .venv/bin/python benchmarks/bench_cache.py [--quick]
"""

import argparse
import sys
import tempfile
from pathlib import Path

import sqlalchemy as sa
import transaction
from dogpile.cache import make_region
from pyramid.config import Configurator
from pyramid.scripting import prepare

from common import best_per_call, load_properties, postgresql_scratch

SEARCH = Path(__file__).parents[1] / (
    'examples/accommodation/accommodation/sql/search_properties.sql'
)
PARAMS = {
    'area': 'Headingley',
    'max_rent': 150,
    'min_rooms': 2,
    'available': '2026-09-01',
}
COUNT = 20000


def request_for(url):
    """A request of an app with the search cached and uncached."""
    sql = SEARCH.read_text()
    config = Configurator(settings={'dbtune.url': url})
    config.include('pyramid_dbtune')
    config.add_sql_method('cached', sql, cache_time=3600, max_rows=50)
    config.add_sql_method('uncached', sql, cache_time=0, max_rows=50)
    config.commit()
    return prepare(registry=config.registry)['request'], config.registry.dbtune


def postgresql_url():
    """A URL for a fresh schema, and its cleanup; ``None`` if no server."""
    try:
        return postgresql_scratch()
    except sa.exc.OperationalError as exc:
        return None, str(exc).splitlines()[0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        '--quick', action='store_true', help='few calls: checks it runs'
    )
    args = parser.parse_args(argv)
    hits, queries, rounds = (200, 5, 2) if args.quick else (100000, 300, 7)

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        url = f'sqlite:///{tmp}/bench.sqlite'
        load_properties(url, COUNT)
        request, runtime = request_for(url)
        cached = request.sql.cached
        uncached = request.sql.uncached
        expected = uncached(**PARAMS)
        assert cached(**PARAMS) == expected and len(expected) == 50

        region = make_region().configure(
            'dogpile.cache.memory', expiration_time=3600
        )

        def dogpile_hit():
            key = 'search:{area}:{max_rent}:{min_rooms}:{available}'.format(
                **PARAMS
            )
            return region.get_or_create(key, creator)

        def creator():
            return uncached(**PARAMS)

        assert dogpile_hit() == expected

        results['hit'] = best_per_call(lambda: cached(**PARAMS), hits, rounds)
        results['dogpile'] = best_per_call(dogpile_hit, hits, rounds)
        results['sqlite'] = best_per_call(
            lambda: uncached(**PARAMS), queries, rounds
        )
        runtime.router.dispose()

    url, drop = postgresql_url()
    if url is None:
        results['postgresql'] = None
        note = drop
    else:
        try:
            load_properties(url, COUNT)
            request, runtime = request_for(url)
            uncached = request.sql.uncached
            assert uncached(**PARAMS) == expected
            results['postgresql'] = best_per_call(
                lambda: uncached(**PARAMS), queries, rounds
            )
            runtime.router.dispose()
        finally:
            transaction.manager.abort()
            drop()

    report(results, note if url is None else None)
    return 0


def report(results, note):
    hit = results['hit']
    rows = [
        ('cache hit, request.sql', results['hit']),
        ('dogpile.cache memory get_or_create hit', results['dogpile']),
        ('uncached query, SQLite', results['sqlite']),
        ('uncached query, PostgreSQL', results['postgresql']),
    ]
    print(f'{"what":42} {"us/call":>10} {"x hit":>8}')
    for name, seconds in rows:
        if seconds is None:
            print(f'{name:42} {"skipped":>10}   ({note})')
            continue
        print(f'{name:42} {seconds * 1e6:10.2f} {seconds / hit:8.1f}')
    print()
    dogpile = results['dogpile'] / hit
    sqlite = results['sqlite'] / hit
    print(
        f'dogpile hit / our hit = {dogpile:.1f} (target >= 2.0: '
        f'{"met" if dogpile >= 2 else "NOT met"})'
    )
    print(
        f'SQLite query / our hit = {sqlite:.0f} (target >= 10: '
        f'{"met" if sqlite >= 10 else "NOT met"})'
    )


if __name__ == '__main__':
    sys.exit(main())
