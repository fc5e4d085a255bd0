"""Fixtures: real databases, and a small app whose views call SQL methods.

Under ``CI=true`` a database server that cannot be reached fails the test;
elsewhere the test is skipped with the reason.
"""

import functools
import os
import threading
import time
import uuid

import pytest
import sqlalchemy as sa
import transaction
from pyramid.config import Configurator
from webtest import TestApp

POSTGRESQL_URL = os.environ.get(
    'DBTUNE_TEST_POSTGRESQL',
    'postgresql+psycopg://postgres@127.0.0.1:5432/test',
)
MYSQL_URL = os.environ.get(
    'DBTUNE_TEST_MYSQL', 'mysql+pymysql://root@127.0.0.1:3306/test'
)
IN_CI = os.environ.get('CI', '').lower() in ('1', 'true', 'yes')


def server_missing(what, exc):
    message = f'the database server {what} is not reachable: {exc}'
    if IN_CI:
        pytest.fail(f'{message} (CI=true: a missing server fails the run)')
    pytest.skip(message)


def _scratch(server_url, create, drop, url_for):
    """Create a uniquely named schema or database on a server.

    Returns its URL and a function that drops it. ``create`` and ``drop``
    are SQL with ``{}`` for the name; ``url_for(url, name)`` makes the URL.
    """
    name = f'dbtune_{uuid.uuid4().hex[:12]}'
    admin = sa.create_engine(server_url)
    try:
        with admin.begin() as connection:
            connection.execute(sa.text(create.format(name)))
    except sa.exc.OperationalError as exc:
        admin.dispose()
        server_missing(server_url, exc)

    def cleanup():
        with admin.begin() as connection:
            connection.execute(sa.text(drop.format(name)))
        admin.dispose()

    url = url_for(sa.engine.make_url(server_url), name)
    return url.render_as_string(hide_password=False), cleanup


def _postgresql_schema():
    return _scratch(
        POSTGRESQL_URL,
        'CREATE SCHEMA {}',
        'DROP SCHEMA {} CASCADE',
        lambda url, name: url.update_query_dict(
            {'options': f'-csearch_path={name}'}
        ),
    )


def _mysql_database():
    return _scratch(
        MYSQL_URL,
        'CREATE DATABASE {}',
        'DROP DATABASE {}',
        lambda url, name: url.set(database=name),
    )


@pytest.fixture(params=['sqlite', 'postgresql', 'mysql'])
def db_url(request, tmp_path):
    """An empty database of each kind, as a URL."""
    if request.param == 'sqlite':
        yield f'sqlite:///{tmp_path / "test.sqlite"}'
        return
    make = (
        _postgresql_schema
        if request.param == 'postgresql'
        else (_mysql_database)
    )
    url, drop = make()
    yield url
    drop()


@pytest.fixture
def postgresql_url():
    url, drop = _postgresql_schema()
    yield url
    drop()


@pytest.fixture
def sqlite_url(tmp_path):
    return f'sqlite:///{tmp_path / "test.sqlite"}'


PROPERTIES = [
    (1, 'Headingley', 90),
    (2, 'Headingley', 120),
    (3, 'Hyde Park', 80),
    (4, 'Burley', 70),
]


def create_tables(url):
    """The property and area tables with a few rows."""
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                'CREATE TABLE property (id INTEGER PRIMARY KEY, '
                'area VARCHAR(40) NOT NULL, rent INTEGER NOT NULL)'
            )
        )
        connection.execute(
            sa.text('INSERT INTO property VALUES (:id, :area, :rent)'),
            [{'id': i, 'area': a, 'rent': r} for i, a, r in PROPERTIES],
        )
        connection.execute(
            sa.text('CREATE TABLE area (name VARCHAR(40) PRIMARY KEY)')
        )
        connection.execute(
            sa.text('INSERT INTO area VALUES (:name)'),
            [{'name': 'Headingley'}, {'name': 'Burley'}],
        )
    engine.dispose()


class Fail(Exception):
    """Raised by the test view after its calls, to abort the transaction."""


def call_view(request):
    """Run the SQL method calls in the JSON body, in one request.

    Body: ``{"calls": [[name, {params}], ...], "fail": false}``. Returns
    each call's rows, and this request's cache counts.
    """
    body = request.json_body
    results = []
    for name, params in body['calls']:
        rows = request.sql[name](**params)
        results.append(
            {
                'rows': [list(r) for r in rows],
                'rowcount': rows.rowcount,
                'truncated': rows.truncated,
            }
        )
    if body.get('fail'):
        raise Fail('abort, please')
    return {'results': results, 'cache': request.dbtune.cache}


def fail_view(exc, request):
    request.response.status = 500
    return {'error': str(exc)}


def make_app(url, methods=(), settings=None, tables=True):
    """A WebTest app with ``methods`` (``SQLMethod`` or kwargs) registered."""
    if tables:
        create_tables(url)
    with Configurator(
        settings={'dbtune.url': url, **(settings or {})}
    ) as config:
        config.include('pyramid_dbtune')
        for method in methods:
            if isinstance(method, dict):
                config.add_sql_method(**method)
            else:
                config.add_sql_method(method)
        config.add_route('call', '/call')
        config.add_view(call_view, route_name='call', renderer='json')
        config.add_view(fail_view, context=Fail, renderer='json')
        app = config.make_wsgi_app()
    return TestApp(app)


@pytest.fixture
def apps():
    """``apps(url, methods, settings)``: make apps, dispose their engines."""
    made = []

    def factory(*args, **kw):
        app = make_app(*args, **kw)
        made.append(app)
        return app

    yield factory
    for app in made:
        app.app.registry.dbtune.router.dispose()


def call(app, *calls, fail=False, status=200):
    """POST calls to the app's /call view; return the JSON answer."""
    body = {'calls': [[name, params] for name, params in calls]}
    if fail:
        body['fail'] = True
        status = 500
    return app.post_json('/call', body, status=status).json


class QueryLog:
    """The statements a router's engines ran, from SQLAlchemy's cursor
    events: ``(engine name, statement)``."""

    def __init__(self, router):
        self.statements = []
        self.engines = []
        self._lock = threading.Lock()
        for name, engine in [('writer', router.writer)] + [
            (f'reader{i}', r.engine) for i, r in enumerate(router.readers)
        ]:
            sa.event.listen(
                engine,
                'before_cursor_execute',
                functools.partial(self._record, name),
            )

    def _record(self, name, conn, cursor, statement, *args):
        with self._lock:
            self.statements.append(statement)
            self.engines.append(name)

    def count(self, fragment, engine=None):
        return sum(
            fragment in s and engine in (None, e)
            for e, s in zip(self.engines, self.statements, strict=True)
        )


def query_log(app):
    return QueryLog(app.app.registry.dbtune.router)


def add_sleep_function(router):
    """Give SQLite a ``sleep(seconds)`` SQL function, as pg_sleep is."""

    def sleep(seconds):
        time.sleep(seconds)
        return 0

    for engine in router.engines():
        sa.event.listen(
            engine,
            'connect',
            lambda dbapi_connection, record: dbapi_connection.create_function(
                'sleep', 1, sleep
            ),
        )


@pytest.fixture(autouse=True)
def no_leftover_transaction():
    """A test that leaves the thread's transaction open fails the next."""
    yield
    transaction.manager.abort()


def echo_app(environ, start_response):
    """A WSGI app that answers with what it was asked, to see that a
    request passed through untouched."""
    length = int(environ.get('CONTENT_LENGTH') or 0)
    body = environ['wsgi.input'].read(length) if length else b''
    text = '{} {} ?{} {!r}'.format(
        environ['REQUEST_METHOD'],
        environ.get('PATH_INFO'),
        environ.get('QUERY_STRING', ''),
        body,
    ).encode()
    start_response(
        '299 Echo',
        [('Content-Type', 'application/x-echo'), ('X-Echo', 'yes'),
         ('Content-Length', str(len(text)))],
    )  # fmt: skip
    return [text]


def echo_app_factory(global_conf, **settings):
    return echo_app
