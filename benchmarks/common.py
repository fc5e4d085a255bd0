"""What the benchmarks share: timing, and a scratch PostgreSQL schema."""

import os
import time

import sqlalchemy as sa

from accommodation.seed import SCHEMA, properties

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


def load_properties(url, count=20000):
    """Create the demo's table at ``url`` and seed ``count`` properties."""
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        for statement in filter(str.strip, SCHEMA.split(';')):
            connection.exec_driver_sql(statement)
        connection.execute(
            sa.text(
                'INSERT INTO property VALUES '
                '(:id, :title, :area, :rent, :rooms, :available, :d)'
            ),
            [
                dict(zip(('id', 'title', 'area', 'rent', 'rooms',
                          'available', 'd'), row, strict=True))
                for row in properties(count)
            ],
        )  # fmt: skip
    engine.dispose()
