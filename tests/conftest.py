"""Fixtures: real databases, and a small app whose views call SQL methods.

Under ``CI=true`` a database server that cannot be reached fails the test;
elsewhere the test is skipped with the reason.
"""

import contextlib
import functools
import os
import random
import shutil
import socket
import subprocess
import threading
import time
import uuid

import pyramid.threadlocal
import pytest
import sqlalchemy as sa
import transaction
from pyramid.config import Configurator
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from webtest import TestApp

from pyramid_dbtune.cache import triggers
from pyramid_dbtune.routing.lag import NO_POSITION, position_of
from pyramid_dbtune.routing.touched import ROWS_TOLD
from servers import MariaDB, PostgreSQL, ServerMissing

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


_SERVERS = {'postgresql': _postgresql_schema, 'mysql': _mysql_database}


@pytest.fixture(params=['sqlite', 'postgresql', 'mysql'])
def db_url(request, tmp_path):
    """An empty database of each kind, as a URL."""
    if request.param == 'sqlite':
        yield f'sqlite:///{tmp_path / "test.sqlite"}'
        return
    url, drop = _SERVERS[request.param]()
    yield url
    drop()


@pytest.fixture(params=['postgresql', 'mysql'])
def server_url(request):
    """An empty PostgreSQL schema, then an empty MariaDB database."""
    url, drop = _SERVERS[request.param]()
    yield url
    drop()


@pytest.fixture
def postgresql_url():
    url, drop = _postgresql_schema()
    yield url
    drop()


@pytest.fixture
def mysql_url():
    url, drop = _mysql_database()
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


class Base(DeclarativeBase):
    pass


class Property(Base):
    """The property table, mapped for request.dbsession."""

    __tablename__ = 'property'
    id: Mapped[int] = mapped_column(primary_key=True)
    area: Mapped[str]
    rent: Mapped[int]


class Fail(Exception):
    """Raised by the test view after its calls, to abort the transaction."""


def run_sql(url, *statements):
    """Run ``statements`` on the database of ``url``, in one transaction
    of a connection of their own."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:
            for statement in statements:
                connection.exec_driver_sql(statement)
    finally:
        engine.dispose()


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


#: SQL methods over the tables create_tables makes, and what they return.
SEARCH = {
    'name': 'search',
    'sql': 'SELECT id, rent FROM property WHERE area = :area ORDER BY id',
    'cache_time': 20,
}
GET = {
    'name': 'get',
    'sql': 'SELECT id, area, rent FROM property WHERE id = :id',
    'cache_time': 20,
}
AREAS = {
    'name': 'areas',
    'sql': 'SELECT area, count(*) AS n FROM property GROUP BY area',
    'cache_time': 20,
}
#: Reads of every kind: searches of three areas, two pages, the areas.
READS = [
    ('search', {'area': 'Headingley'}),
    ('search', {'area': 'Burley'}),
    ('search', {'area': 'Hyde Park'}),
    ('get', {'id': 1}),
    ('get', {'id': 4}),
    ('areas', {}),
]
SET_RENT = {
    'name': 'set_rent',
    'sql': 'UPDATE property SET rent = :rent WHERE id = :id',
}
HEADINGLEY = [[1, 90], [2, 120]]


def make_app(url, methods=(), settings=None, tables=True, views=None):
    """A WebTest app with ``methods`` (``SQLMethod`` or kwargs) registered,
    the /call view, and ``views`` (path: view, rendered as JSON)."""
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
        for path, view in (views or {}).items():
            config.add_route(path, path)
            config.add_view(view, route_name=path, renderer='json')
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
        app.app.registry.dbtune.close()


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
        engines = [('writer', router.writer)] + [
            (f'reader{i}', r.engine) for i, r in enumerate(router.readers)
        ]
        if router.replicas:  # the writer's database, read-only
            engines.append(('writer', router.read_only_writer))
        for name, engine in engines:
            sa.event.listen(
                engine,
                'before_cursor_execute',
                functools.partial(self._record, name),
            )

    def _record(self, name, conn, cursor, statement, *args):
        if statement.startswith(ROWS_TOLD):
            # Not a method's: counted apart, in test_invalidation_by_row.py.
            return
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
    """A test that leaves the thread's transaction open fails the next;
    requests of ``prepare()`` left current (their closer not called) are
    taken off Pyramid's stack."""
    yield
    transaction.manager.abort()
    pyramid.threadlocal.manager.clear()


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


class Memcached:
    """A memcached server of the test's own, on a free loopback port."""

    def __init__(self):
        binary = shutil.which('memcached') or '/usr/bin/memcached'
        if not os.path.exists(binary):
            server_missing(
                'memcached', 'not installed (.ci/memcached.sh installs it)'
            )
        self.binary = binary
        self.process = None
        # Below Linux's ephemeral range (32768 on), so that no socket of
        # an earlier test's client can hold the port; another on a clash.
        for _ in range(20):
            self.port = random.randrange(20000, 32000)
            self.address = f'127.0.0.1:{self.port}'
            if self._free() and self.start(required=False):
                return
        server_missing('memcached', 'no port could be had for it')

    def _free(self):
        with socket.socket() as s:
            try:
                s.bind(('127.0.0.1', self.port))
            except OSError:
                return False
            return True

    def start(self, required=True):
        command = [
            self.binary, '-l', '127.0.0.1', '-p', str(self.port),
            '-U', '0', '-m', '64', '-t', '2',
        ]  # fmt: skip
        if os.geteuid() == 0:
            command += ['-u', 'root']  # it will not run as root unasked
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                socket.create_connection(('127.0.0.1', self.port), 1).close()
            except OSError:
                time.sleep(0.02)
                continue
            time.sleep(0.05)
            if self.process.poll() is None:  # it, not another, answered
                return True
        self.stop()
        if required:
            server_missing(f'memcached on {self.address}', 'did not start')
        return False

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def items(self):
        """How many items the server holds."""
        from pymemcache.client.base import Client

        client = Client(('127.0.0.1', self.port), timeout=2)
        try:
            return int(client.stats()[b'curr_items'])
        finally:
            client.close()


@pytest.fixture
def memcached():
    server = Memcached()
    yield server
    server.stop()


@pytest.fixture
def memcached2():
    server = Memcached()
    yield server
    server.stop()


SECRET = 'a test secret, long enough'


def shared_settings(*servers, **more):
    """Settings for the memcached backend on ``servers``."""
    return {
        'dbtune.cache.backend': 'memcached',
        'dbtune.cache.servers': ' '.join(s.address for s in servers),
        'dbtune.cache.secret': SECRET,
        'dbtune.cache.dead_retry': '0.2',
        **more,
    }


class Proxy:
    """A TCP proxy on loopback in front of a server. ``cut()`` drops its
    connections and refuses new ones, as a network partition would, while
    the server behind keeps what it holds; ``mend()`` lets them through.
    ``freeze()`` holds every byte either way and closes nothing, as a cut
    that nobody hears of (or a frozen host) would; ``thaw()`` lets them
    through."""

    def __init__(self, target_port):
        self.target = target_port
        self.port = None
        #: ``mangle(data)``: the server's bytes as the client gets them, a
        #: list of pieces sent one by one; an empty list, or an empty
        #: piece, hangs up there.
        self.mangle = None
        self._sockets = []
        self._lock = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()
        self.mend()

    def freeze(self):
        self._flowing.clear()

    def thaw(self):
        self._flowing.set()

    def mend(self):
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self.port is None:
            # Below Linux's ephemeral range, as for Memcached; another on
            # a clash with a server of another test.
            for _ in range(20):
                self.port = random.randrange(20000, 32000)
                try:
                    listener.bind(('127.0.0.1', self.port))
                    break
                except OSError:
                    continue
            else:
                raise OSError('no free port for the proxy')
            self.address = f'127.0.0.1:{self.port}'
        else:
            listener.bind(('127.0.0.1', self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(
            target=self._accept, args=(listener,), daemon=True
        ).start()

    def _accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            if listener is not self._listener:
                # Cut while this thread waited in accept(), which a close
                # from another thread does not end: refused all the same.
                client.close()
                return
            server = socket.create_connection(('127.0.0.1', self.target))
            with self._lock:
                self._sockets += [client, server]
            for a, b, reply in (
                (client, server, False),
                (server, client, True),
            ):
                threading.Thread(
                    target=self._pump, args=(a, b, reply), daemon=True
                ).start()

    def _pump(self, source, sink, reply):
        try:
            while data := source.recv(65536):
                pieces = [data]
                if reply and self.mangle is not None:
                    pieces = self.mangle(data)
                    if not pieces:
                        break
                for piece in pieces:
                    if not piece:  # an empty piece: hang up here
                        raise OSError('hung up')
                    self._flowing.wait()
                    sink.sendall(piece)
                    time.sleep(0.001 * (len(pieces) > 1))
        except OSError:
            pass
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def cut(self):
        # Shut down first: on Linux that ends an accept() under way, which
        # would keep the port bound after close(); mend() binds it again.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._listener = None
        self._flowing.set()  # what was held goes nowhere: its pumps end
        with self._lock:
            for end in self._sockets:
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()
            self._sockets = []


@pytest.fixture
def silent_server():
    """A TCP port that accepts connections and never says a word: a
    database that hangs."""
    listener = socket.socket()
    listener.bind(('127.0.0.1', 0))
    listener.listen(16)
    accepted = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                accepted.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for connection in accepted:
        connection.close()
    listener.close()


def kept_by_large_calls(app, calls=150):
    """Bytes the process keeps after ``calls`` cached reads of the app's
    ``search`` whose argument is 1 MB each (tracemalloc, after a warm-up
    call and a collection)."""
    import gc
    import tracemalloc

    call(app, ('search', {'area': 'x' * 10**6}))  # warm: compile, pools
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(calls):
            call(app, ('search', {'area': f'{i:03}' + 'x' * 10**6}))
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def own(server, *args, **options):
    """``server(*args, **options)``, a server of the test's own: one that
    cannot be had skips the test, or fails it under ``CI=true``."""
    try:
        return server(*args, **options)
    except ServerMissing as exc:
        server_missing(*exc.args)


@pytest.fixture
def own_postgresql():
    server = own(PostgreSQL)
    yield server
    server.remove()


@pytest.fixture(scope='module')
def streaming(request):
    """A PostgreSQL primary of the test module's own and its streaming
    standby, which replays the primary's WAL the module's
    ``STANDBY_DELAY`` seconds late; its tests share them
    (:func:`replicated` gives each fresh tables)."""
    primary = own(PostgreSQL)
    delay = getattr(request.module, 'STANDBY_DELAY', 0)
    standby = own(PostgreSQL, standby_of=primary, delay=delay)
    yield primary, standby
    standby.remove()
    primary.remove()


@pytest.fixture(scope='module')
def gtid_replication(request):
    """A MariaDB primary of the test module's own and its replica by GTID,
    which applies the primary's events the module's ``REPLICA_DELAY``
    seconds late; its tests share them."""
    primary = own(MariaDB)
    delay = getattr(request.module, 'REPLICA_DELAY', 0)
    replica = own(MariaDB, server_id=2, replica_of=primary, delay=delay)
    yield primary, replica
    replica.remove()
    primary.remove()


@pytest.fixture(params=['postgresql', 'mariadb'])
def replicated(request):
    """A primary with the test's tables, and a replica that has them: a
    PostgreSQL standby (:func:`streaming`) or a MariaDB replica by GTID
    (:func:`gtid_replication`)."""
    kind = {'postgresql': 'streaming', 'mariadb': 'gtid_replication'}
    primary, standby = request.getfixturevalue(kind[request.param])
    if standby.process is None:  # stopped by a test that failed
        standby.start()
    # The replica's delay is lifted: the fresh tables need not wait for it.
    name = 'REPLICA_DELAY' if request.param == 'mariadb' else 'STANDBY_DELAY'
    lifted = delay = getattr(request.module, name, 0)
    if lifted:
        standby.delay(0)
    try:
        engine = sa.create_engine(primary.url, poolclass=sa.pool.NullPool)
        with engine.begin() as connection:
            connection.exec_driver_sql('DROP TABLE IF EXISTS property, area')
        engine.dispose()
        create_tables(primary.url)
        written = position_on(primary.url)
        until(
            lambda: (position_on(standby.url) or NO_POSITION).covers(written)
        )
    finally:
        if lifted:  # the module's tests count on it
            standby.delay(delay)
    return primary, standby


def position_on(url):
    """The log position the database of ``url`` has written (a primary)
    or replayed (a standby) now; None while it cannot tell (a replica
    that has yet to make the database)."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as connection:
            return position_of(connection)
    except sa.exc.OperationalError:
        return None
    finally:
        engine.dispose()


def until(check, seconds=20):
    """Wait for ``check()`` to be true; fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, 'not in time'
        time.sleep(0.02)


def rent_on(url, id=1):
    """The rent of property ``id`` in the database of ``url`` now; None
    while the database or the table is not there."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as connection:
            return connection.execute(
                sa.text('SELECT rent FROM property WHERE id = :id'), {'id': id}
            ).scalar()
    except (sa.exc.ProgrammingError, sa.exc.OperationalError):
        return None
    finally:
        engine.dispose()


#: The methods of the tests of the listener: reads, and a write.
METHODS = [SEARCH, GET, AREAS, SET_RENT]
#: The listener on, looking for changes every 0.05 s.
LISTEN = {'dbtune.cache.listen': 'true', 'dbtune.cache.listen_every': '0.05'}


def watched(url):
    """The tables that triggers at ``url`` tell of changes to."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as connection:
            return triggers.watched(connection)
    finally:
        engine.dispose()


def listening(url, apps, settings=LISTEN, methods=METHODS):
    """An app with the listener on, the triggers installed, listening."""
    create_tables(url)
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    triggers.install(engine, {'property': (('area', 'id'), ('rent',))})
    engine.dispose()
    app = apps(url, methods, settings, tables=False)
    assert app.app.registry.dbtune.listener.listening.wait(10)
    return app


def in_a_child(check):
    """``check()``'s truth in a child forked now (false if it raises)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write, b'1' if check() else b'0')
        finally:
            os._exit(0)  # never the rest of the session, twice
    os.close(write)
    answer = os.read(read, 1)  # b'' if the child wrote nothing
    os.waitpid(pid, 0)
    os.close(read)
    return answer == b'1'


def listeners():
    return sum(
        t.name == 'pyramid_dbtune listener' for t in threading.enumerate()
    )


def timings(response):
    """The Server-Timing header as {name: duration or description}."""
    found = {}
    for item in response.headers['Server-Timing'].split(', '):
        name, *params = item.split(';')
        for param in params:
            key, value = param.split('=')
            found[name] = float(value) if key == 'dur' else int(value)
    return found
