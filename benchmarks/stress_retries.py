"""Retries under contention, with and without back-off, side by side.

50 requests at once over real HTTP (waitress), each incrementing one
counter 20 times in one transaction on PostgreSQL SERIALIZABLE, with
``retry.attempts = 30``, ``dbtune.write_concurrency`` 1 and 4 (on MariaDB
with ``--database mysql``, where InnoDB's locks serialise them): each
variant runs ``--runs`` rounds and prints, per round, the counter (1000
when nothing was lost or refused), the requests that failed, and the
attempts the most retried request took. Target: 1000 in every round, no
request failed, with back-off on (the default).

    .venv/bin/python benchmarks/stress_retries.py [--runs 20] [--quick]
        [--database mysql]
"""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / 'tests'))

import sqlalchemy as sa  # noqa: E402

from common import mysql_scratch, postgresql_scratch  # noqa: E402
from test_retry import INCREMENTS, REQUESTS, run_once, serve  # noqa: E402


def variant(url, concurrency, backoff, runs):
    """Per round: (counter, failed requests, most attempts)."""
    app, server = serve(
        url,
        {
            'dbtune.write_concurrency': str(concurrency),
            'dbtune.retry.backoff': backoff,
        },
    )
    rounds = []
    try:
        for _ in range(runs):
            total, answers = run_once(url, server.effective_port)
            tries = [a for a in answers if isinstance(a, int)]
            rounds.append(
                (total, len(answers) - len(tries), max(tries, default=0) + 1)
            )
    finally:
        server.close()
        app.registry.dbtune.router.dispose()
    return rounds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--runs', type=int, default=20)
    parser.add_argument('--quick', action='store_true')
    parser.add_argument(
        '--database', choices=('postgresql', 'mysql'), default='postgresql'
    )
    args = parser.parse_args(argv)
    runs = 1 if args.quick else args.runs  # --quick: it runs
    scratch = (
        postgresql_scratch if args.database == 'postgresql' else mysql_scratch
    )
    url, drop = scratch()
    try:
        engine = sa.create_engine(url)
        with engine.begin() as connection:
            connection.exec_driver_sql(
                'CREATE TABLE counter (id INTEGER PRIMARY KEY, '
                'n INTEGER NOT NULL)'
            )
        engine.dispose()
        print(
            f'{REQUESTS} requests x {INCREMENTS} increments, SERIALIZABLE, '
            f'{runs} rounds each, on {args.database}'
        )
        print(f'{"variant":34} {"exact":>7} {"failed":>7} {"most tries":>18}')
        met = True
        for concurrency in (1, 4):
            for backoff in ('0.01', '0'):
                rounds = variant(url, concurrency, backoff, runs)
                exact = sum(
                    total == REQUESTS * INCREMENTS for total, *_ in rounds
                )
                failed = sum(f for _, f, _ in rounds)
                most = [m for *_, m in rounds]
                name = (
                    f'write_concurrency {concurrency}, back-off '
                    f'{"on" if backoff != "0" else "off"}'
                )
                print(
                    f'{name:34} {exact:>3}/{runs:<3} {failed:>7} '
                    f'{min(most):>5} to {max(most):<3} '
                    f'(median {statistics.median(most):g})'
                )
                if backoff != '0':
                    met = met and exact == runs and failed == 0
        verdict = 'met' if met else 'NOT met'
        print(f'\nback-off on: 1000 in every round (target: {verdict})')
    finally:
        drop()
    return 0


if __name__ == '__main__':
    sys.exit(main())
