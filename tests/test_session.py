"""``request.dbsession``'s statements: which of them write, where they
run, and what they leave in the cache, on PostgreSQL and MariaDB."""

import pytest
import sqlalchemy as sa
import transaction
from pyramid.scripting import prepare

from conftest import Property

RENTS = {
    'name': 'rents',
    'sql': 'SELECT id, rent FROM property ORDER BY id',
    'cache_time': 60,
}
RENTS_NOW = [[1, 90], [2, 120], [3, 80], [4, 70]]


def cached(app, name='rents'):
    """A call of SQL method ``name`` in a request of its own: its rows, and
    whether the cache answered it."""
    request = prepare(registry=app.app.registry)['request']
    try:
        rows = [list(row) for row in request.sql[name]()]
        return rows, request.dbtune.cache['hit'] == 1
    finally:
        transaction.manager.abort()


def view_app(apps, url, view, methods=(RENTS,), settings=None):
    return apps(url, methods, settings, views={'/view': view})


_DELETE = 'DELETE FROM property WHERE id = 1 RETURNING id, area, rent'
WRAPPED = {
    'text().columns()': lambda: sa.text(_DELETE).columns(
        Property.id, Property.area, Property.rent
    ),
    'from_statement(text())': lambda: sa.select(Property).from_statement(
        sa.text(_DELETE)
    ),
    'from_statement(text().columns())': lambda: sa.select(
        Property
    ).from_statement(
        sa.text(_DELETE).columns(Property.id, Property.area, Property.rent)
    ),
    'from_statement(delete())': lambda: sa.select(Property).from_statement(
        sa.delete(Property).where(Property.id == 1).returning(Property)
    ),
}


@pytest.mark.parametrize('wrapped', list(WRAPPED))
@pytest.mark.parametrize('after_a_write', [False, True])
def test_a_write_wrapped_to_return_rows_runs_on_the_writer_and_invalidates(
    server_url, apps, wrapped, after_a_write
):
    def view(request):
        session = request.dbsession
        if after_a_write:  # of another table
            session.execute(sa.text("INSERT INTO area VALUES ('Kirkstall')"))
        rows = session.execute(WRAPPED[wrapped]()).all()
        return [
            row[0] if isinstance(row[0], int) else row[0].id for row in rows
        ]

    app = view_app(apps, server_url, view)
    assert cached(app) == (RENTS_NOW, False)
    # Not refused as a write on the read-only reader, and its table's
    # cached reads are dropped as it commits.
    assert app.get('/view').json == [1]
    rows, hit = cached(app)
    assert [row[0] for row in rows] == [2, 3, 4]
    assert not hit
