"""What the benchmarks share: timing, and a scratch PostgreSQL schema."""

import os
import time

import sqlalchemy as sa

POSTGRESQL_URL = os.environ.get(
    'DBTUNE_TEST_POSTGRESQL',
    'postgresql+psycopg://postgres@127.0.0.1:5432/test',
)


def best_per_call(function, calls, rounds):
    """The fastest round's seconds per call of ``function``."""
    best = float('inf')
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            function()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def postgresql_scratch():
    """A URL for a new schema of its own, and a function that drops it.

    Raises :class:`sqlalchemy.exc.OperationalError` without a server.
    """
    admin = sa.create_engine(POSTGRESQL_URL)
    schema = f'dbtune_bench_{os.getpid()}'
    try:
        with admin.begin() as connection:
            connection.exec_driver_sql(f'CREATE SCHEMA {schema}')
    except sa.exc.OperationalError:
        admin.dispose()
        raise
    url = sa.engine.make_url(POSTGRESQL_URL).update_query_dict(
        {'options': f'-csearch_path={schema}'}
    )

    def drop():
        with admin.begin() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA {schema} CASCADE')
        admin.dispose()

    return url.render_as_string(hide_password=False), drop
