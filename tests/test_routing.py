"""Read/write splitting with real threads on real servers: reads in
parallel, writes serialised, read-your-writes, failover, retries, pins."""

import contextlib
import gc
import logging
import signal
import threading
import time
import uuid
import weakref

import pytest
import sqlalchemy as sa
import transaction
from pyramid.config import Configurator
from pyramid.exceptions import ConfigurationError
from pyramid.request import Request
from pyramid.response import Response
from pyramid.scripting import prepare
from pyramid_retry import IRetryableError
from transaction.interfaces import NoTransaction
from webtest import TestApp

from pyramid_dbtune import WriteInReadError, WriteSlotTimeout
from pyramid_dbtune.routing.errors import is_retryable
from pyramid_dbtune.routing.lag import EVERY, sign_pin
from pyramid_dbtune.routing.work import PIN_COOKIE

from conftest import (
    POSTGRESQL_URL,
    Property,
    Proxy,
    call,
    create_tables,
    make_app,
    query_log,
)


def sleep_sql(url, seconds, marker):
    function = 'pg_sleep' if url.startswith('postgresql') else 'SLEEP'
    return f'SELECT {function}({seconds}) AS z, :n AS n /* {marker} */'


def active_with(url, marker):
    """How many statements holding ``marker`` the server runs right now.
    The marker is split in this query so that it does not count itself."""
    half = len(marker) // 2
    if url.startswith('postgresql'):
        sql = (
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
            "AND query LIKE '%%' || :a || :b || '%%'"
        )
    else:
        sql = (
            'SELECT count(*) FROM information_schema.processlist '
            "WHERE command = 'Query' AND info LIKE CONCAT('%', :a, :b, '%')"
        )
    return sa.text(sql), {'a': marker[:half], 'b': marker[half:]}


def run_threads(count, target):
    errors = []
    barrier = threading.Barrier(count)

    def run(i):
        barrier.wait()
        try:
            target(i)
        except Exception as exc:  # pragma: no cover (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_eight_reads_run_at_once(server_url, apps):
    marker = f'm{uuid.uuid4().hex}'
    # Long enough that eight threads started on a busy machine overlap.
    slow = {'name': 'slow', 'sql': sleep_sql(server_url, 1.5, marker)}
    app = apps(server_url, [slow], {'dbtune.read_pool_size': '8'})
    # Autocommit: PostgreSQL keeps one pg_stat_activity snapshot for the
    # whole of a transaction.
    watcher = sa.create_engine(server_url, isolation_level='AUTOCOMMIT')
    statement, params = active_with(server_url, marker)
    seen = []
    done = threading.Event()

    def watch():
        with watcher.connect() as connection:
            while not done.is_set():
                seen.append(connection.execute(statement, params).scalar())

    spy = threading.Thread(target=watch)
    spy.start()
    try:
        run_threads(8, lambda i: call(app, ('slow', {'n': i})))
    finally:
        done.set()
        spy.join()
        watcher.dispose()
    # The server itself saw all eight reads running together.
    assert max(seen) == 8


def write_app(url, settings=None, hold=None):
    """An app whose /write view writes, then stays in its write section a
    while; the test records how many requests are in it at once."""
    state = {'inside': 0, 'most': 0, 'lock': threading.Lock()}
    bump = {
        'name': 'bump',
        'sql': 'UPDATE property SET rent = rent + 1 WHERE id = 1',
    }
    create_tables(url)

    def write(request):
        request.sql.bump()
        with state['lock']:
            state['inside'] += 1
            state['most'] = max(state['most'], state['inside'])
        if hold is not None:
            hold.wait(10)
        else:
            threading.Event().wait(0.02)
        with state['lock']:
            state['inside'] -= 1
        return Response('written')

    with Configurator(
        settings={'dbtune.url': url, **(settings or {})}
    ) as config:
        config.include('pyramid_dbtune')
        config.add_sql_method(**bump)
        config.add_route('write', '/write')
        config.add_view(write, route_name='write')
        app = config.make_wsgi_app()
    return TestApp(app), state


def test_eight_writes_never_overlap(db_url):
    app, state = write_app(db_url)
    try:
        run_threads(8, lambda i: app.post('/write'))
        assert state['most'] == 1
        with app.app.registry.dbtune.router.writer.connect() as connection:
            rent = connection.exec_driver_sql(
                'SELECT rent FROM property WHERE id = 1'
            )
            assert rent.scalar() == 90 + 8
    finally:
        app.app.registry.dbtune.router.dispose()


def test_write_concurrency_allows_that_many(sqlite_url, apps):
    settings = {
        'dbtune.write_concurrency': '3',
        'dbtune.write_timeout': '0.05',
    }
    router = apps(sqlite_url, [], settings).app.registry.dbtune.router
    for _ in range(3):
        assert router.acquire_write_slot() == 0.0
    with pytest.raises(
        WriteSlotTimeout, match='in 0.05 s \\(3 per process\\)'
    ):
        router.acquire_write_slot()
    for _ in range(3):
        router.write_slots.release()


COUNTER = [
    {
        'name': 'current',
        'sql': 'SELECT n FROM counter WHERE id = 1 FOR UPDATE',
    },
    {'name': 'store', 'sql': 'UPDATE counter SET n = :n WHERE id = 1'},
]


def increment(request):
    # Read, add one, write back: without serialised writes (or the row
    # lock) two requests would read the same n and one increment be lost.
    n = request.sql.current()[0].n
    request.sql.store(n=n + 1)
    return Response(str(n + 1))


def test_fifty_threads_of_twenty_increments_end_at_1000(server_url):
    engine = sa.create_engine(server_url)
    with engine.begin() as connection:
        connection.exec_driver_sql(
            'CREATE TABLE counter (id INTEGER PRIMARY KEY, n INTEGER)'
        )
        connection.exec_driver_sql('INSERT INTO counter VALUES (1, 0)')
    # What is tested is that no increment is lost, not how long the
    # queue for the one write slot is on a busy machine.
    settings = {'dbtune.url': server_url, 'dbtune.write_timeout': '300'}
    with Configurator(settings=settings) as config:
        config.include('pyramid_dbtune')
        for method in COUNTER:
            config.add_sql_method(**method)
        config.add_route('increment', '/increment')
        config.add_view(increment, route_name='increment')
        app = TestApp(config.make_wsgi_app())

    def twenty(i):
        for _ in range(20):
            app.post('/increment')

    try:
        run_threads(50, twenty)
        with engine.connect() as connection:
            total = connection.exec_driver_sql('SELECT n FROM counter')
            assert total.scalar() == 1000
    finally:
        app.app.registry.dbtune.router.dispose()
        engine.dispose()


def test_no_write_slot_in_time_is_a_503_and_writes_nothing(sqlite_url):
    hold = threading.Event()
    app, state = write_app(
        sqlite_url, {'dbtune.write_timeout': '0.2'}, hold=hold
    )
    first = threading.Thread(target=app.post, args=('/write',))
    first.start()
    try:
        while not state['inside']:
            threading.Event().wait(0.005)
        answer = app.post('/write', status=503)
        assert 'no write slot came free in 0.2 s' in answer.text
        assert 'nothing was written' in answer.text
    finally:
        hold.set()
        first.join()
    router = app.app.registry.dbtune.router
    with router.writer.connect() as connection:
        rent = connection.exec_driver_sql(
            'SELECT rent FROM property WHERE id = 1'
        )
        assert rent.scalar() == 91  # the first request's write alone
    assert router.write_waits == 1 and router.write_wait_seconds >= 0.2
    router.dispose()


def test_reads_go_to_a_reader_writes_and_later_reads_to_the_writer(
    db_url, apps
):
    methods = [
        {'name': 'rents', 'sql': 'SELECT rent FROM property ORDER BY id'},
        {
            'name': 'set_rent',
            'sql': 'UPDATE property SET rent = :rent WHERE id = :id',
        },
    ]
    app = apps(db_url, methods)
    log = query_log(app)
    answer = call(
        app,
        ('rents', {}),
        ('set_rent', {'id': 1, 'rent': 5}),
        ('rents', {}),
    )
    assert answer['results'][2]['rows'][0] == [5]
    assert log.count('SELECT rent', engine='reader0') == 1
    assert log.count('UPDATE property', engine='writer') == 1
    assert log.count('SELECT rent', engine='writer') == 1


def test_several_readers_share_the_reads(postgresql_url, apps):
    marker = f'm{uuid.uuid4().hex}'
    slow = {'name': 'slow', 'sql': sleep_sql(postgresql_url, 0.3, marker)}
    two = f'{postgresql_url} {postgresql_url}'
    app = apps(postgresql_url, [slow], {'dbtune.read_urls': two})
    log = query_log(app)
    run_threads(4, lambda i: call(app, ('slow', {'n': i})))
    # Four reads in flight at once: each went to the reader with fewer.
    assert log.count(marker, engine='reader0') == 2
    assert log.count(marker, engine='reader1') == 2
    assert log.count(marker, engine='writer') == 0


def test_dbsession_is_not_two_phase(sqlite_url, apps):
    app = apps(sqlite_url, [])
    request = prepare(registry=app.app.registry)['request']
    assert request.dbsession.twophase is False


DEAD = 'postgresql+psycopg://nobody@127.0.0.1:1/none'


def test_dead_reader_fails_over_and_every_request_is_answered(
    postgresql_url, apps, caplog
):
    methods = [{'name': 'rents', 'sql': 'SELECT rent FROM property'}]
    app = apps(postgresql_url, methods, {'dbtune.read_urls': DEAD})
    router = app.app.registry.dbtune.router
    with caplog.at_level(logging.WARNING, 'pyramid_dbtune'):
        for _ in range(20):
            answer = call(app, ('rents', {}))
            assert len(answer['results'][0]['rows']) == 4
    assert router.failovers == 20
    downs = [r for r in caplog.records if 'is down' in r.getMessage()]
    assert len(downs) == 1
    assert '127.0.0.1:1' in downs[0].getMessage()


def test_a_reader_back_from_the_dead_is_used_again(
    postgresql_url, apps, caplog, monkeypatch
):
    methods = [{'name': 'rents', 'sql': 'SELECT rent FROM property'}]
    app = apps(postgresql_url, methods, {'dbtune.read_urls': DEAD})
    router = app.app.registry.dbtune.router
    call(app, ('rents', {}))
    reader = router.readers[0]
    assert reader.backoff == 1.0
    # The back-off doubles while it stays down.
    reader.down_until = 0
    call(app, ('rents', {}))
    assert reader.backoff == 2.0
    # It comes back: the reader's engine now reaches the server.
    reader.engine = router.writer
    reader.down_until = 0
    with caplog.at_level(logging.WARNING, 'pyramid_dbtune'):
        call(app, ('rents', {}))
    assert reader.backoff == 0 and 'is back' in caplog.text
    assert router.failovers == 2


def test_a_reader_lost_mid_read_fails_over(postgresql_url, apps):
    marker = f'm{uuid.uuid4().hex}'
    slow = {'name': 'slow', 'sql': sleep_sql(postgresql_url, 0.5, marker)}
    app = apps(postgresql_url, [slow])
    router = app.app.registry.dbtune.router
    admin = sa.create_engine(POSTGRESQL_URL, isolation_level='AUTOCOMMIT')
    statement, params = active_with(postgresql_url, marker)
    answers = []
    reader = threading.Thread(
        target=lambda: answers.append(call(app, ('slow', {'n': 1})))
    )
    reader.start()
    try:
        with admin.connect() as connection:
            while connection.execute(statement, params).scalar() < 1:
                pass
            half = len(marker) // 2
            connection.execute(
                sa.text(
                    'SELECT pg_terminate_backend(pid) FROM pg_stat_activity '
                    "WHERE query LIKE '%%' || :a || :b || '%%' "
                    'AND pid <> pg_backend_pid()'
                ),
                {'a': marker[:half], 'b': marker[half:]},
            )
    finally:
        reader.join()
        admin.dispose()
    assert answers[0]['results'][0]['rows'] == [['', 1]] or (
        answers[0]['results'][0]['rows'][0][1] == 1
    )
    assert router.failovers == 1


def test_the_first_read_after_the_database_restarted_is_answered(
    own_postgresql, apps, caplog
):
    # Every connection pooled, the read pool's and the writer's, died with
    # the server. The read that finds its connection gone runs again on
    # another, and the log does not say the database is down: it is up.
    rents = {'name': 'rents', 'sql': 'SELECT rent FROM property WHERE id = 1'}
    app = apps(own_postgresql.url, [rents, SET_RENT])
    assert call(app, ('rents', {}))['results'][0]['rows'] == [[90]]
    call(app, ('set_rent', {'id': 1, 'rent': 91}))  # pools a writer's
    own_postgresql.stop()  # a fast shutdown: every connection is cut
    own_postgresql.start()
    with caplog.at_level(logging.WARNING, 'pyramid_dbtune'):
        for _ in range(2):
            assert call(app, ('rents', {}))['results'][0]['rows'] == [[91]]
    said = [r.getMessage() for r in caplog.records]
    assert not any('did not answer' in m for m in said), said
    assert any(m.startswith('a read lost its connection') for m in said)


def test_the_first_write_after_the_database_restarted_is_made(
    own_postgresql, apps
):
    # The writer's pooled connection died with the server: the write's
    # transaction takes another before it begins, and the write is made.
    rents = {'name': 'rents', 'sql': 'SELECT rent FROM property WHERE id = 1'}
    app = apps(own_postgresql.url, [rents, SET_RENT])
    call(app, ('set_rent', {'id': 1, 'rent': 91}))  # pools a writer's
    own_postgresql.stop()  # a fast shutdown: every connection is cut
    own_postgresql.start()
    call(app, ('set_rent', {'id': 1, 'rent': 92}))
    assert call(app, ('rents', {}))['results'][0]['rows'] == [[92]]


def test_a_statement_error_on_a_reader_is_not_a_failover(sqlite_url, apps):
    bad = {'name': 'bad', 'sql': 'SELECT * FROM no_such_table'}
    app = apps(sqlite_url, [bad])
    with pytest.raises(sa.exc.OperationalError):
        call(app, ('bad', {}))
    assert app.app.registry.dbtune.router.failovers == 0


def session_app(url, view, methods=(), settings=None):
    return make_app(url, methods, settings, views={'/view': view})


CACHED_RENTS = {
    'name': 'rents',
    'sql': 'SELECT rent FROM property ORDER BY id',
    'cache_time': 60,
}


def test_dbsession_reads_from_a_reader_until_it_flushes(db_url):
    def view(request):
        session = request.dbsession
        first = session.get(Property, 1)
        before = first.rent
        first.rent = 100
        session.add(Property(id=9, area='Kirkstall', rent=55))
        session.flush()
        after = int(session.scalar(sa.select(sa.func.sum(Property.rent))))
        return [before, after]

    app = session_app(db_url, view)
    log = query_log(app)
    assert app.get('/view').json == [90, 100 + 120 + 80 + 70 + 55]
    assert log.count('FROM property', engine='reader0') == 1
    assert log.count('UPDATE property', engine='writer') == 1
    assert log.count('INSERT INTO property', engine='writer') == 1
    assert log.count('sum(property.rent)', engine='writer') == 1
    with app.app.registry.dbtune.router.writer.connect() as connection:
        total = connection.exec_driver_sql('SELECT count(*) FROM property')
        assert total.scalar() == 5
    app.app.registry.dbtune.router.dispose()


def test_dbsession_and_sql_methods_share_the_transaction(db_url):
    def view(request):
        request.dbsession.add(Property(id=9, area='Burley', rent=1))
        request.dbsession.flush()
        rows = request.sql.rents()
        request.sql.set_rent(id=9, rent=2)
        return [rows[-1].rent, request.dbsession.get(Property, 9).rent]

    set_rent = {
        'name': 'set_rent',
        'sql': 'UPDATE property SET rent = :rent WHERE id = :id',
    }
    app = session_app(db_url, view, [CACHED_RENTS, set_rent])
    # Each side sees the other's uncommitted write.
    assert app.get('/view').json == [1, 2]
    rents = call_rents(app)
    assert rents[-1] == 2
    app.app.registry.dbtune.router.dispose()


def call_rents(app):
    request = prepare(registry=app.app.registry)['request']
    try:
        return [r.rent for r in request.sql.rents()]
    finally:
        transaction.manager.abort()


def test_dbsession_text_dml_commits_and_invalidates(db_url):
    def view(request):
        request.dbsession.execute(
            sa.text('UPDATE property SET rent = 7 WHERE id = 1')
        )
        return 'ok'

    app = session_app(db_url, view, [CACHED_RENTS])
    assert call_rents(app)[0] == 90
    app.get('/view')
    # Committed (not rolled back silently), and the cached rows dropped.
    assert call_rents(app)[0] == 7
    app.app.registry.dbtune.router.dispose()


def test_dbsession_core_dml_and_locking_reads_go_to_the_writer(db_url):
    def view(request):
        session = request.dbsession
        session.execute(
            sa.select(Property).where(Property.id == 2).with_for_update()
        )
        session.execute(
            sa.update(Property).where(Property.id == 2).values(rent=3)
        )
        return 'ok'

    app = session_app(db_url, view, [CACHED_RENTS])
    log = query_log(app)
    assert call_rents(app)[1] == 120
    app.get('/view')
    # (SQLite leaves FOR UPDATE out of the statement it sends.)
    assert log.count('SELECT property.id', engine='writer') == 1
    assert call_rents(app)[1] == 3
    app.app.registry.dbtune.router.dispose()


def test_dbsession_reads_only_never_take_a_write_slot(sqlite_url):
    def view(request):
        request.dbsession.execute(sa.text('SELECT count(*) FROM property'))
        request.dbsession.scalar(sa.select(Property.rent))
        return request.dbtune.unit.dirty

    app = session_app(sqlite_url, view)
    assert app.get('/view').json is False
    app.app.registry.dbtune.router.dispose()


def test_a_view_that_writes_then_raises_leaves_nothing(db_url):
    def view(request):
        first = request.dbsession.get(Property, 1)
        first.rent = 1
        request.dbsession.flush()
        raise RuntimeError('after the write')

    app = session_app(db_url, view, [CACHED_RENTS])
    with pytest.raises(RuntimeError, match='after the write'):
        app.get('/view')
    assert call_rents(app)[0] == 90
    assert app.app.registry.dbtune.router.write_slots.acquire(blocking=False)
    app.app.registry.dbtune.router.dispose()


SERIALIZE = """
CREATE FUNCTION serialize() RETURNS integer AS $$
BEGIN
    RAISE EXCEPTION 'could not serialize' USING ERRCODE = '40001';
END $$ LANGUAGE plpgsql
"""


def test_retryable_errors_are_retried_by_pyramid_retry(server_url):
    # Cases zope.sqlalchemy does not tag, so only pyramid_dbtune's hook can
    # make them retryable: on PostgreSQL a read on a reader, outside the
    # transaction; on MariaDB a lock wait timeout (1205) in the session.
    postgresql = server_url.startswith('postgresql')
    attempts = []

    def view(request):
        attempts.append(request)
        if len(attempts) == 1:
            if postgresql:
                request.sql.serialize()
            else:
                request.dbsession.execute(
                    sa.text("SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1205")
                )
        return len(attempts)

    methods = [{'name': 'serialize', 'sql': 'SELECT serialize() AS x'}]
    app = session_app(
        server_url,
        view,
        methods if postgresql else [],
        settings={'retry.attempts': '3'},
    )
    if postgresql:
        with app.app.registry.dbtune.router.writer.begin() as connection:
            connection.exec_driver_sql(SERIALIZE)
    config = Configurator(registry=app.app.registry)
    config.include('pyramid_retry')
    config.commit()
    app = TestApp(config.make_wsgi_app())
    assert app.get('/view').json == 2
    app.app.registry.dbtune.router.dispose()


def test_other_errors_are_not_retryable(postgresql_url, apps):
    bad = {'name': 'bad', 'sql': 'SELECT 1/0 AS x'}
    app = apps(postgresql_url, [bad])
    with pytest.raises(sa.exc.DataError) as info:
        call(app, ('bad', {}))
    assert not IRetryableError.providedBy(info.value)


def test_pin_after_write_sends_the_client_to_the_writer(postgresql_url, apps):
    methods = [
        {
            'name': 'rents',
            'sql': 'SELECT rent FROM property ORDER BY id',
            'cache_time': 60,
        },
        {'name': 'areas', 'sql': 'SELECT name FROM area', 'cache_time': 60},
        {
            'name': 'set_rent',
            'sql': 'UPDATE property SET rent = :rent WHERE id = :id',
        },
    ]
    settings = {
        'dbtune.read_urls': postgresql_url,
        'dbtune.pin_after_write': '30',
        'dbtune.causal_reads': 'false',  # the time pin
    }
    app = apps(postgresql_url, methods, settings)
    log = query_log(app)
    answer = app.post_json(
        '/call', {'calls': [['set_rent', {'id': 1, 'rent': 4}]]}
    )
    cookie = answer.headers['Set-Cookie']
    assert cookie.startswith('dbtune_pin=') and 'Max-Age=30' in cookie
    assert 'HttpOnly' in cookie
    # The pinned client reads from the writer, and not from the cache.
    call(app, ('areas', {}))
    assert log.count('FROM area', engine='writer') == 1
    # Another client: a fill of the table just written comes from the
    # writer during the lag window; other tables from the reader.
    other = TestApp(app.app)
    other.post_json('/call', {'calls': [['rents', {}], ['areas', {}]]})
    assert log.count('FROM property', engine='writer') == 1
    assert log.count('FROM area', engine='reader0') == 1


def test_no_pin_without_replicas(sqlite_url, apps):
    set_rent = {'name': 'set_rent', 'sql': 'UPDATE property SET rent = 1'}
    app = apps(sqlite_url, [set_rent], {'dbtune.pin_after_write': '30'})
    answer = app.post_json('/call', {'calls': [['set_rent', {}]]})
    assert 'Set-Cookie' not in answer.headers


ORACLE_LIKE = type(
    'DatabaseError', (Exception,), {'__module__': 'oracledb.exceptions'}
)
CX_ORACLE_LIKE = type(
    'DatabaseError', (Exception,), {'__module__': 'cx_Oracle'}
)


class OracleError:
    """What python-oracledb and cx_Oracle put in ``args[0]``."""

    def __init__(self, code):
        self.code = code


def test_a_transaction_left_open_keeps_its_unit(sqlite_url, apps):
    app = apps(sqlite_url, [CACHED_RENTS])
    request = prepare(registry=app.app.registry)['request']
    request.tm = transaction.TransactionManager(explicit=True)
    request.tm.begin()
    unit = request.dbtune.unit
    assert [r.rent for r in request.sql.rents()] == [90, 120, 80, 70]
    request._process_finished_callbacks()
    assert unit.request is None  # let go of
    after = prepare(registry=app.app.registry)['request']
    after.tm = request.tm
    # What comes next in the transaction goes on in its unit.
    assert after.dbtune.unit is unit and unit.request is after
    request.tm.abort()


def test_a_request_current_twice_ends_once(sqlite_url, apps):
    # prepare(request=...) of a request current already: on the stack
    # twice, it is no parent of its own.
    app = apps(sqlite_url, [CACHED_RENTS])
    env = prepare(registry=app.app.registry)
    request = env['request']
    prepare(request=request, registry=app.app.registry)
    request.tm = transaction.TransactionManager(explicit=True)
    request.tm.begin()
    unit = request.dbtune.unit
    assert [r.rent for r in request.sql.rents()] == [90, 120, 80, 70]
    signal.signal(signal.SIGALRM, lambda *args: pytest.fail('for ever'))
    signal.alarm(10)
    try:
        request._process_finished_callbacks()
    finally:
        signal.alarm(0)
        request.tm.abort()
    assert unit.request is None


@pytest.mark.parametrize('kind', [ORACLE_LIKE, CX_ORACLE_LIKE])
@pytest.mark.parametrize(
    'code, retryable', [(8177, True), (60, True), (1, False), (1213, False)]
)
def test_oracle_errors_by_their_code(kind, code, retryable):
    assert is_retryable(kind(OracleError(code))) is retryable


def test_error_classification_reads_codes_not_texts():
    assert not is_retryable(Exception('deadlock detected'))
    assert not is_retryable(Exception(True))
    assert is_retryable(type('E', (Exception,), {'pgcode': '40P01'})())


def test_oracle_urls_compile_sql_methods():
    from sqlalchemy.dialects import oracle

    from pyramid_dbtune import SQLMethod

    method = SQLMethod('some', 'SELECT * FROM t WHERE id IN :ids AND a = :a')
    statement, params = method.bind({'ids': [1, 2], 'a': 3})
    compiled = statement.compile(dialect=oracle.dialect())
    assert ':a' in str(compiled) and params == {'ids': [1, 2], 'a': 3}
    ping = sa.select(sa.literal_column('1')).compile(dialect=oracle.dialect())
    assert str(ping) == 'SELECT 1 FROM DUAL'
    for url in ('oracle+oracledb://u:p@h/s', 'oracle+cx_oracle://u:p@h/s'):
        assert sa.engine.make_url(url).get_dialect().name == 'oracle'


def test_pins_signed_with_a_url_without_a_password_are_said_to_be(
    postgresql_url, apps, caplog
):
    # Pins are signed with dbtune.pin_secret, else with a key drawn from
    # the URL: one without a password is no secret.
    replicas = {'dbtune.read_urls': postgresql_url}
    apps(postgresql_url, [], replicas)
    assert 'dbtune.pin_secret is not set' in caplog.text
    caplog.clear()
    secret = {'dbtune.pin_secret': 'a-secret-of-16-chars-or-more'}
    apps(postgresql_url, [], {**replicas, **secret}, tables=False)
    url = sa.make_url(postgresql_url).set(password='secret')
    url = url.render_as_string(hide_password=False)
    apps(url, [], replicas, tables=False)
    apps(postgresql_url, [], tables=False)  # no replicas: no pins
    assert 'pin_secret' not in caplog.text


def test_pin_window_ends(sqlite_url, apps, monkeypatch):
    import pyramid_dbtune.routing.pins as pins

    now = [100.0]
    monkeypatch.setattr(pins, 'monotonic', lambda: now[0])
    settings = {'dbtune.read_urls': sqlite_url, 'dbtune.pin_after_write': '5'}
    app = apps(sqlite_url, [], settings)
    router = app.app.registry.dbtune.router
    router.pins.wrote({'property'})
    assert router.pins.by_time({'property'})
    assert not router.pins.by_time({'area'})
    now[0] += 5
    assert not router.pins.by_time({'property'})
    router.pins.wrote({'area'})
    assert not router.pins.by_time({'property'})


def test_the_time_pin_meets_tables_that_cannot_be_told(sqlite_url, apps):
    # For pin_after_write seconds after a commit, the process fills from
    # the writer: every read after a write of tables it cannot tell, and
    # a read of tables it cannot tell after any write.
    settings = {'dbtune.read_urls': sqlite_url, 'dbtune.pin_after_write': '5'}
    untold = {'name': 'untold', 'sql': 'SELECT 1 AS one', 'writes': True}
    lock = {  # as SELECT ... FOR UPDATE: a write of no table
        'name': 'lock', 'sql': 'SELECT 1 AS one', 'writes': True,
        'tables': [],
    }  # fmt: skip
    get = {'name': 'get', 'sql': 'SELECT rent FROM property WHERE id = :id'}
    rent = {'name': 'rent', 'sql': 'UPDATE property SET rent = 1 WHERE id = 1'}
    count = {
        'name': 'count',
        'sql': "SELECT count(*) AS n FROM json_each('[1]')",
        'cache_time': 20,
    }
    create_tables(sqlite_url)
    for write, read in (
        ('untold', ('get', {'id': 1})),
        ('rent', ('count', {})),
    ):
        app = apps(
            sqlite_url, [untold, get, rent, count, lock], settings,
            tables=False,
        )  # fmt: skip
        router = app.app.registry.dbtune.router
        call(app, (write, {}))
        app.reset()  # the client's pin cookie: not this test's
        call(app, read)
        assert router.writer_reads == 1, (write, read)
    # A locking read alone wrote no table: nothing is pinned.
    app = apps(sqlite_url, [get, lock], settings, tables=False)
    call(app, ('lock', {}))
    app.reset()
    call(app, ('get', {'id': 1}))
    assert app.app.registry.dbtune.router.writer_reads == 0


def test_a_pin_cookie_that_is_no_time_is_no_pin(sqlite_url, apps):
    settings = {'dbtune.read_urls': sqlite_url, 'dbtune.pin_after_write': '5'}
    search = {'name': 'search', 'sql': 'SELECT 1 AS one', 'cache_time': 0}
    app = apps(sqlite_url, [search], settings)
    router = app.app.registry.dbtune.router
    # '²' is a digit to str.isdigit, not to int(); and int() takes at most
    # 4300 digits.
    for pin in ('"\\302\\262"', '9' * 5000, '12ab'):
        app.set_cookie('dbtune_pin', pin)
        answer = call(app, ('search', {}))  # 200, not a ValueError's 500
        assert answer['results'][0]['rows'] == [[1]]
    assert router.writer_reads == 0  # not pinned: read on the reader
    app.reset()


def test_two_commits_in_one_request_pin_once(sqlite_url, apps):
    settings = {'dbtune.read_urls': sqlite_url, 'dbtune.pin_after_write': '5'}
    set_rent = {'name': 'set_rent', 'sql': 'UPDATE property SET rent = 1'}
    app = apps(sqlite_url, [set_rent], settings)

    def view(request):
        request.sql.set_rent()
        request.tm.commit()
        request.tm.begin()
        request.sql.set_rent()
        return Response('ok')

    config = Configurator(registry=app.app.registry)
    config.add_route('twice', '/twice')
    config.add_view(view, route_name='twice')
    config.commit()
    answer = app.get('/twice')
    assert len(answer.headers.getall('Set-Cookie')) == 1


def test_a_slot_left_held_is_released_when_the_request_ends(
    sqlite_url, apps, caplog
):
    set_rent = {'name': 'set_rent', 'sql': 'UPDATE property SET rent = 1'}
    app = apps(sqlite_url, [set_rent])
    router = app.app.registry.dbtune.router
    request = prepare(registry=app.app.registry)['request']
    request.tm = transaction.TransactionManager(explicit=True)
    request.tm.begin()
    request.sql.set_rent()
    assert not router.write_slots.acquire(blocking=False)
    request._process_finished_callbacks()
    assert 'outlived its request' in caplog.text
    assert router.write_slots.acquire(blocking=False)


@pytest.mark.parametrize('kind', [ORACLE_LIKE, CX_ORACLE_LIKE])
def test_oracle_read_only_refusal_by_its_code(kind):
    from pyramid_dbtune.routing.errors import is_read_only_refusal

    assert is_read_only_refusal(kind(OracleError(1456)))
    assert not is_read_only_refusal(kind(OracleError(942)))


def test_dbsession_reads_from_the_writer_while_readers_are_down(
    postgresql_url,
):
    def view(request):
        return request.dbsession.get(Property, 1).rent

    app = session_app(
        postgresql_url, view, settings={'dbtune.read_urls': DEAD}
    )
    router = app.app.registry.dbtune.router
    router.readers[0].down_until = float('inf')  # as after a failed read
    log = query_log(app)
    assert app.get('/view').json == 90
    assert log.count('FROM property', engine='writer') == 1
    router.dispose()


def test_dbsession_reads_bring_a_reader_back(postgresql_url, caplog):
    # An app that reads through request.dbsession alone: a reader that
    # failed is said to be back once it connects again, and its back-off
    # starts over.
    def view(request):
        return request.dbsession.get(Property, 1).rent

    url = sa.engine.make_url(postgresql_url)
    proxy = Proxy(url.port or 5432)
    proxied = url.set(port=proxy.port).render_as_string(hide_password=False)
    app = session_app(
        postgresql_url, view, settings={'dbtune.read_urls': proxied}
    )
    router = app.app.registry.dbtune.router
    (reader,) = router.readers
    try:
        for outage in range(2):
            proxy.mangle = lambda data: []  # every answer: hung up
            with contextlib.suppress(sa.exc.OperationalError):
                app.get('/view')  # fails on the reader (or is retried)
            assert reader.backoff == 1.0, outage
            proxy.mangle = None
            # The lag watch's looks succeed again: they tell nothing of
            # reads.
            time.sleep(3 * EVERY)
            assert reader.position is not None  # a look that succeeded
            assert reader.backoff == 1.0, outage
            reader.down_until = 0  # its back-off over
            with caplog.at_level(logging.WARNING, 'pyramid_dbtune'):
                assert app.get('/view').json == 90
            assert reader.backoff == 0
        assert caplog.text.count('is back') == 2
    finally:
        router.dispose()
        proxy.cut()


# What a review of the routing found; each was once broken.


SET_RENT = {
    'name': 'set_rent',
    'sql': 'UPDATE property SET rent = :rent WHERE id = :id',
}


def parent_and_child(db_url, parent, child, **settings):
    """An app of views ``parent`` (``/parent``) and ``child``
    (``/child``), with the rents and set_rent SQL methods."""
    create_tables(db_url)
    with Configurator(settings={'dbtune.url': db_url, **settings}) as config:
        config.include('pyramid_dbtune')
        config.add_sql_method(**CACHED_RENTS)
        config.add_sql_method(**SET_RENT)
        config.add_route('parent', '/parent')
        config.add_view(parent, route_name='parent', renderer='json')
        config.add_route('child', '/child')
        config.add_view(child, route_name='child', renderer='json')
        return TestApp(config.make_wsgi_app())


def test_a_subrequest_shares_the_transaction_and_its_writes(db_url):
    def parent(request):
        request.sql.set_rent(id=1, rent=111)
        sub = Request.blank('/child')
        answer = request.invoke_subrequest(sub, use_tweens=False)
        request.sql.set_rent(id=3, rent=333)
        return answer.json

    def child(request):
        request.sql.set_rent(id=2, rent=222)
        return [r.rent for r in request.sql.rents()]

    app = parent_and_child(
        db_url, parent, child, **{'dbtune.write_timeout': '1'}
    )
    # The child saw the parent's write, and did not wait for its slot.
    assert app.get('/parent').json == [111, 222, 80, 70]
    assert call_rents(app) == [111, 222, 333, 70]
    app.app.registry.dbtune.router.dispose()


def test_a_subrequest_makes_the_unit_its_parent_writes_in(db_url):
    # The child's read makes the transaction's unit; the parent, holding
    # the child's request still, writes in it after the child has ended.
    def parent(request):
        sub = Request.blank('/child')
        answer = request.invoke_subrequest(sub, use_tweens=False)
        request.sql.set_rent(id=3, rent=333)
        return [answer.json, sub.path]

    def child(request):
        return [r.rent for r in request.sql.rents()]

    app = parent_and_child(db_url, parent, child)
    assert app.get('/parent').json == [[90, 120, 80, 70], '/child']
    assert call_rents(app) == [90, 120, 333, 70]
    app.app.registry.dbtune.router.dispose()


def test_a_subrequest_that_makes_the_unit_and_writes_commits(db_url, caplog):
    # The child's write opens the transaction's writing side; the child
    # ends with it open, and the parent's end commits it.
    def parent(request):
        sub = Request.blank('/child')
        return request.invoke_subrequest(sub, use_tweens=False).json

    def child(request):
        request.sql.set_rent(id=2, rent=222)
        return 'written'

    app = parent_and_child(db_url, parent, child)
    assert app.get('/parent').json == 'written'
    assert 'outlived its request' not in caplog.text
    assert call_rents(app) == [90, 222, 80, 70]
    app.app.registry.dbtune.router.dispose()


def blank(request):
    return Request.blank('/child')


def copy(request):
    # Its environ names the parent's transaction manager (pyramid_tm's).
    sub = request.copy()
    sub.path_info = '/child'
    return sub


@pytest.mark.parametrize('parent_writes', [True, False])
@pytest.mark.parametrize('subrequest', [blank, copy])
def test_the_pin_of_a_subrequests_unit_is_its_parents(
    sqlite_url, parent_writes, subrequest
):
    # The client gets the pin, whichever request of the transaction made
    # the unit and wrote: the parent's response is the one it sees.
    def parent(request):
        sub = subrequest(request)
        answer = request.invoke_subrequest(sub, use_tweens=False)
        if parent_writes:
            request.sql.set_rent(id=3, rent=333)
        return answer.json

    def child(request):
        if not parent_writes:
            request.sql.set_rent(id=2, rent=222)
        return [r.rent for r in request.sql.rents()]

    settings = {'dbtune.read_urls': sqlite_url, 'dbtune.pin_after_write': '5'}
    app = parent_and_child(sqlite_url, parent, child, **settings)
    answer = app.get('/parent')
    assert PIN_COOKIE in answer.headers.get('Set-Cookie', '')
    app.app.registry.dbtune.router.dispose()


def test_nested_subrequests_write_in_the_outermost_transaction(sqlite_url):
    # The innermost writes first; the pin is on the outermost response.
    def parent(request):
        sub = Request.blank('/child')
        return request.invoke_subrequest(sub, use_tweens=False).json

    def child(request):
        if 'inner' in request.environ:
            request.sql.set_rent(id=2, rent=222)
            return 'written'
        sub = Request.blank('/child', environ={'inner': True})
        return request.invoke_subrequest(sub, use_tweens=False).json

    settings = {'dbtune.read_urls': sqlite_url, 'dbtune.pin_after_write': '5'}
    app = parent_and_child(sqlite_url, parent, child, **settings)
    answer = app.get('/parent')
    assert answer.json == 'written'
    assert PIN_COOKIE in answer.headers['Set-Cookie']
    assert call_rents(app) == [90, 222, 80, 70]
    app.app.registry.dbtune.router.dispose()


def time_pinned(app, seconds):
    """The cookie of a time pin of ``seconds`` from now, as ``app``
    signs it."""
    key = app.app.registry.dbtune.router.pin_key
    return sign_pin(int(time.time() + seconds), key)


def test_a_unit_a_subrequest_makes_keeps_the_clients_pin(sqlite_url):
    pinned = []

    def parent(request):
        request.invoke_subrequest(Request.blank('/child'), use_tweens=False)
        pinned.append(request.dbtune.unit.pinned)
        return 'read'

    def child(request):
        return [r.rent for r in request.sql.rents()]

    settings = {'dbtune.read_urls': sqlite_url, 'dbtune.pin_after_write': '5'}
    app = parent_and_child(sqlite_url, parent, child, **settings)
    app.set_cookie(PIN_COOKIE, time_pinned(app, 60))
    app.get('/parent')
    assert pinned == [True]
    app.app.registry.dbtune.router.dispose()


def test_the_next_request_in_a_transaction_left_open_has_its_own_pin(
    sqlite_url,
):
    # pyramid_tm is off (tm.activate_hook), and the view leaves the
    # thread's transaction open: the next request on the thread, another
    # client's, goes on in it, with its client's pin, and the request
    # before it is let go of.
    seen = []

    def parent(request):
        session = request.dbsession
        router = request.dbtune.unit.router  # the writer's database:
        on_writer = session.bind in (router.writer, router.read_only_writer)
        seen.append((weakref.ref(request), request.dbtune.unit.pinned))
        seen.append(on_writer)
        count = sa.text('SELECT count(*) FROM property')
        return session.execute(count).scalar()

    settings = {
        'dbtune.read_urls': sqlite_url,
        'dbtune.pin_after_write': '5',
        'tm.activate_hook': lambda request: False,
    }
    app = parent_and_child(sqlite_url, parent, blank, **settings)
    router = app.app.registry.dbtune.router
    app.set_cookie(PIN_COOKIE, time_pinned(app, 60))
    assert app.get('/parent').json == 4
    app.reset()  # another client: no pin
    assert app.get('/parent').json == 4
    gc.collect()
    (first, pinned), on_writer = seen[:2]
    assert (first(), pinned, on_writer) == (None, True, True)
    (_, pinned), on_writer = seen[2:]
    assert (pinned, on_writer) == (False, False)
    transaction.abort()
    router.dispose()


def test_a_subrequests_own_transaction_left_open_is_aborted(
    sqlite_url, caplog
):
    # A manager a request (pyramid_tm.explicit_manager): the child begins
    # a transaction of its own, writes, and leaves it open.
    def parent(request):
        sub = Request.blank('/child')
        return request.invoke_subrequest(sub, use_tweens=False).json

    def child(request):
        request.tm.begin()
        request.sql.set_rent(id=2, rent=222)
        return 'written'

    settings = {'tm.manager_hook': 'pyramid_tm.explicit_manager'}
    app = parent_and_child(sqlite_url, parent, child, **settings)
    assert app.get('/parent').json == 'written'
    assert 'outlived its request' in caplog.text
    router = app.app.registry.dbtune.router
    assert router.write_slots.acquire(blocking=False)
    router.dispose()


def test_an_app_served_inside_another_commits_in_its_transaction(
    sqlite_url,
):
    # The outer app's pyramid_tm runs the transaction the inner app's
    # request writes in (a copy of the outer request's environ).
    def child(request):
        request.sql.set_rent(id=2, rent=222)
        return 'written'

    inner = parent_and_child(sqlite_url, lambda request: None, child)

    def outer_view(request):
        sub = request.copy()
        sub.path_info = '/child'
        return sub.get_response(inner.app)

    with Configurator() as config:
        config.include('pyramid_tm')
        config.add_route('outer', '/outer')
        config.add_view(outer_view, route_name='outer')
        outer = TestApp(config.make_wsgi_app())
    assert outer.get('/outer').json == 'written'
    assert call_rents(inner) == [90, 222, 80, 70]
    inner.app.registry.dbtune.router.dispose()


def test_a_subrequest_in_a_transaction_the_view_runs_commits(
    sqlite_url, caplog
):
    # pyramid_tm is off for the parent, which runs the transaction itself.
    def parent(request):
        with request.tm:
            sub = Request.blank('/child')
            return request.invoke_subrequest(sub, use_tweens=False).json

    def child(request):
        request.sql.set_rent(id=2, rent=222)
        return 'written'

    settings = {'tm.activate_hook': lambda request: False}
    app = parent_and_child(sqlite_url, parent, child, **settings)
    assert app.get('/parent').json == 'written'
    assert 'outlived its request' not in caplog.text
    assert call_rents(app) == [90, 222, 80, 70]
    app.app.registry.dbtune.router.dispose()


class Stop(BaseException):
    """What a greenlet's timeout raises, say: not an Exception."""


def test_a_base_exception_through_pyramid_tm_frees_the_slot(sqlite_url):
    def parent(request):
        request.sql.set_rent(id=2, rent=222)
        raise Stop()

    settings = {'tm.manager_hook': 'pyramid_tm.explicit_manager'}
    app = parent_and_child(sqlite_url, parent, blank, **settings)
    with pytest.raises(Stop):
        app.get('/parent')
    router = app.app.registry.dbtune.router
    assert router.write_slots.acquire(blocking=False)
    assert call_rents(app) == [90, 120, 80, 70]
    router.dispose()


def test_the_unit_lets_go_beside_a_callback_that_also_waits(sqlite_url):
    # A finished callback of the app's that, like the unit's, waits for
    # the others: each waits once, and neither for ever.
    waited, units = [], []

    def polite(request):
        if request.finished_callbacks and len(waited) < 20:
            waited.append(request)
            request.add_finished_callback(polite)

    def parent(request):
        units.append(request.dbtune.unit)
        request.add_finished_callback(polite)
        return [r.rent for r in request.sql.rents()]

    app = parent_and_child(sqlite_url, parent, lambda request: None)
    assert app.get('/parent').json == [90, 120, 80, 70]
    assert len(waited) == 1 and units[0].request is None
    app.app.registry.dbtune.router.dispose()


def test_a_request_is_freed_as_it_ends(db_url):
    # Reference counting frees it, with no garbage collection: nothing of
    # pyramid_dbtune holds it in a cycle once it has ended.
    seen, callbacks = [], []

    def parent(request):
        seen.append(weakref.ref(request))
        request.add_finished_callback(
            lambda request: callbacks.append(request.dbtune.unit.request)
        )
        if 'write' in request.params:
            request.sql.set_rent(id=4, rent=44)
        return [r.rent for r in request.sql.rents()]

    app = parent_and_child(db_url, parent, parent)
    gc.disable()
    try:
        for path in ('/parent', '/parent?write=1'):
            app.get(path)
            # The finished callbacks of the app ran before it let go.
            assert callbacks.pop() is not None
            assert seen.pop()() is None
            # Letting go began no transaction (the app's manager is
            # transaction.manager, which begins one when asked for it).
            transaction.manager.explicit = True
            try:
                with pytest.raises(NoTransaction):
                    transaction.manager.get()
            finally:
                transaction.manager.explicit = False
    finally:
        gc.enable()
    assert call_rents(app) == [90, 120, 80, 44]
    app.app.registry.dbtune.router.dispose()


def test_the_reader_connection_is_let_go_at_the_first_write(postgresql_url):
    def view(request):
        first = request.dbsession.get(Property, 1)
        reader = request.dbtune.unit.router.readers[0].engine.pool
        held = reader.checkedout()
        first.rent = 5
        request.dbsession.flush()
        return [held, reader.checkedout()]

    app = session_app(postgresql_url, view)
    assert app.get('/view').json == [1, 0]
    assert call_rents_orm(app) == 5
    app.app.registry.dbtune.router.dispose()


def test_a_savepoint_that_reads_then_writes_commits(db_url):
    # Get or create, in a savepoint: its read is on the reader, its
    # insert takes the writer; the savepoint then commits on the writer.
    def view(request):
        session = request.dbsession
        with session.begin_nested():
            found = session.scalar(
                sa.select(Property).where(Property.area == 'Kirkstall')
            )
            if found is None:
                session.add(Property(id=9, area='Kirkstall', rent=1))
        return [p.id for p in session.scalars(sa.select(Property))]

    app = session_app(db_url, view)
    assert app.get('/view').json[-1] == 9
    assert app.app.registry.dbtune.router.write_slots.acquire(blocking=False)
    with app.app.registry.dbtune.router.writer.connect() as connection:
        area = connection.exec_driver_sql(
            'SELECT area FROM property WHERE id = 9'
        )
        assert area.scalar() == 'Kirkstall'
    app.app.registry.dbtune.router.dispose()


def call_rents_orm(app):
    request = prepare(registry=app.app.registry)['request']
    try:
        return request.dbsession.get(Property, 1).rent
    finally:
        transaction.manager.abort()


def test_dbsession_fails_over_through_pyramid_retry(postgresql_url):
    def view(request):
        return request.dbsession.get(Property, 1).rent

    app = session_app(
        postgresql_url,
        view,
        settings={'dbtune.read_urls': DEAD, 'retry.attempts': '2'},
    )
    config = Configurator(registry=app.app.registry)
    config.include('pyramid_retry')
    app = TestApp(config.make_wsgi_app())
    router = app.app.registry.dbtune.router
    assert app.get('/view').json == 90
    assert router.readers[0].down_until > 0
    router.dispose()


def test_writes_that_bypass_routing_fail_on_a_reader(postgresql_url):
    def view(request):
        connection = request.dbsession.connection()
        connection.execute(sa.text('UPDATE property SET rent = 1'))
        return 'written?'

    app = session_app(postgresql_url, view)
    with pytest.raises(sa.exc.InternalError, match='read-only transaction'):
        app.get('/view')
    assert call_rents_orm(app) == 90
    app.app.registry.dbtune.router.dispose()


def test_a_burst_of_failures_backs_off_once(postgresql_url, apps):
    app = apps(postgresql_url, [], {'dbtune.read_urls': DEAD})
    router = app.app.registry.dbtune.router
    reader = router.readers[0]
    for _ in range(8):
        router._down(reader, Exception('refused'))
    assert reader.backoff == 1.0


def test_sessions_take_turns_among_readers(postgresql_url, apps):
    two = f'{postgresql_url} {postgresql_url}'
    app = apps(postgresql_url, [], {'dbtune.read_urls': two})
    router = app.app.registry.dbtune.router
    engines = [router.reader_engine() for _ in range(4)]
    first, second = (r.engine for r in router.readers)
    assert engines.count(first) == 2 and engines.count(second) == 2


def test_a_client_pinned_mid_request_reads_from_the_writer(postgresql_url):
    def view(request):
        request.sql.set_rent(id=1, rent=4)
        request.tm.commit()
        request.tm.begin()
        return request.dbsession.get(Property, 1).rent

    set_rent = {
        'name': 'set_rent',
        'sql': 'UPDATE property SET rent = :rent WHERE id = :id',
    }
    settings = {
        'dbtune.read_urls': postgresql_url,
        'dbtune.pin_after_write': '30',
        'dbtune.causal_reads': 'false',  # the time pin
    }
    app = session_app(postgresql_url, view, [set_rent], settings)
    log = query_log(app)
    assert app.get('/view').json == 4
    assert log.count('FROM property', engine='writer') == 1
    assert log.count('FROM property', engine='reader0') == 0
    app.app.registry.dbtune.router.dispose()


def test_sql_methods_see_the_sessions_pending_changes(db_url):
    def view(request):
        session = request.dbsession
        session.add(Property(id=8, area='Burley', rent=2))
        with session.no_autoflush:  # as the ORM's own queries would not
            unflushed = [r.rent for r in request.sql.rents()]
        session.add(Property(id=9, area='Burley', rent=1))
        return [unflushed, [r.rent for r in request.sql.rents()]]

    app = session_app(db_url, view, [CACHED_RENTS])
    assert app.get('/view').json == [
        [90, 120, 80, 70],
        [90, 120, 80, 70, 2, 1],
    ]
    app.app.registry.dbtune.router.dispose()


def test_request_dbtune_needs_a_database():
    config = Configurator()
    config.include('pyramid_dbtune')
    config.commit()
    request = prepare(registry=config.registry)['request']
    with pytest.raises(RuntimeError, match='has no database: set dbtune.url'):
        request.dbsession


def test_a_pinned_client_reads_read_only_from_the_writer(db_url):
    sneaky = {
        'name': 'sneaky',
        'sql': 'UPDATE property SET rent = 1',
        'writes': False,
    }
    methods = [CACHED_RENTS, sneaky]
    settings = {
        'dbtune.read_urls': db_url,
        'dbtune.pin_after_write': '30',
        'dbtune.causal_reads': 'false',  # the time pin
    }

    def view(request):
        request.dbtune.unit.pinned = True
        rents = [r.rent for r in request.sql.rents()]
        try:
            request.sql.sneaky()
        except WriteInReadError:
            return rents
        return 'written'  # pragma: no cover (the failure this test is for)

    app = session_app(db_url, view, methods, settings)
    log = query_log(app)
    assert app.get('/view').json == [90, 120, 80, 70]
    assert log.count('SELECT rent', engine='writer') == 1
    # The writer's connection was made writable again after the read.
    set_rent = {'name': 'set', 'sql': 'UPDATE property SET rent = 2'}
    config = Configurator(registry=app.app.registry)
    config.add_sql_method(**set_rent)
    config.commit()
    request = prepare(registry=app.app.registry)['request']
    request.tm = transaction.TransactionManager(explicit=True)
    request.tm.begin()
    assert request.sql.set().rowcount == 4
    request.tm.commit()
    app.app.registry.dbtune.router.dispose()


def test_without_replicas_a_database_down_is_not_said_to_be_a_reader(
    apps, caplog
):
    # The read pool is the writer's database: the log must not send the
    # operator looking for a replica, nor promise the writer takes over.
    search = {'name': 'one', 'sql': 'SELECT 1 AS one', 'cache_time': 0}
    app = apps(DEAD, [search], tables=False)
    caplog.set_level('WARNING', logger='pyramid_dbtune.routing.engines')
    with pytest.raises(sa.exc.OperationalError):
        call(app, ('one', {}))
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith('the database ') for m in said), said
    assert not any('reads go to the writer' in m for m in said), said


def test_an_orm_flush_that_changes_nothing_is_no_write(postgresql_url, apps):
    # Setting an attribute to the value it has sends no UPDATE: no write
    # slot, no pin cookie, and the read stays on the reader.
    def view(request):
        session = request.dbsession
        first = session.get(Property, 1)
        first.rent = first.rent
        session.flush()
        return session.scalar(sa.select(sa.func.count(Property.id)))

    settings = {
        'dbtune.read_urls': postgresql_url,
        'dbtune.pin_after_write': '30',
        'dbtune.causal_reads': 'false',  # the time pin
        'dbtune.server_timing': 'true',
    }
    app = session_app(postgresql_url, view, settings=settings)
    log = query_log(app)
    answer = app.get('/view')
    assert answer.json == 4 and 'Set-Cookie' not in answer.headers
    assert log.count('count(property.id)', engine='reader0') == 1
    assert app.app.registry.dbtune.router.write_transactions == 0
    assert 'db-write' not in answer.headers['Server-Timing']
    app.app.registry.dbtune.router.dispose()


def test_an_orm_write_counts_in_server_timing(sqlite_url):
    def view(request):
        request.dbsession.add(Property(id=9, area='Burley', rent=1))
        request.dbsession.flush()
        return 'ok'

    settings = {'dbtune.server_timing': 'true'}
    app = session_app(sqlite_url, view, settings=settings)
    timing = app.get('/view').headers['Server-Timing']
    assert 'db-write;dur=' in timing, timing
    app.app.registry.dbtune.router.dispose()


def test_a_replica_that_accepts_and_never_answers_is_down(
    server_url, silent_server, apps
):
    # libpq and PyMySQL wait for good without a connect timeout: the
    # request, and its thread, would hang. dbtune.connect_timeout bounds it,
    # and the reads go to the writer.
    url = sa.engine.make_url(server_url)
    silent = url.set(host='127.0.0.1', port=silent_server, database='none')
    settings = {
        'dbtune.read_urls': silent.render_as_string(hide_password=False),
        'dbtune.connect_timeout': '1',
        # PyMySQL waits for the server's greeting under its read timeout.
        'dbtune.statement_timeout': '1',
    }
    search = {
        'name': 'search',
        'sql': 'SELECT rent FROM property WHERE id = :id',
        'cache_time': 0,
    }
    app = apps(server_url, [search], settings)
    answers = []
    reading = threading.Thread(
        target=lambda: answers.extend(
            call(app, ('search', {'id': 1})) for _ in range(5)
        )
    )
    reading.start()
    reading.join(120)  # a hang, not a slow answer, is what fails here
    assert not reading.is_alive(), 'reads hung on the silent replica'
    assert [a['results'][0]['rows'] for a in answers] == [[[90]]] * 5
    assert app.app.registry.dbtune.router.failovers >= 1


def test_a_statement_past_its_time_limit_is_stopped(server_url, apps):
    sleep = 'pg_sleep' if server_url.startswith('postgresql') else 'SLEEP'
    slow = {'name': 'slow', 'sql': f'SELECT {sleep}(3) AS x'}
    app = apps(server_url, [slow], {'dbtune.statement_timeout': '0.5'})
    with pytest.raises(sa.exc.OperationalError):
        call(app, ('slow', {}))


def test_a_read_past_its_time_limit_on_a_replica_reaches_the_caller(
    mysql_url, apps, caplog
):
    # PyMySQL stops waiting for the answer (its read_timeout) and drops
    # the connection, which had answered: the replica is up. The error
    # reaches the caller once, as PostgreSQL's own limit's does; the read
    # is not run again on the writer, nor the replica taken out.
    slow = {'name': 'slow', 'sql': 'SELECT SLEEP(3) AS x'}
    app = apps(mysql_url, [slow], {
        'dbtune.read_urls': mysql_url, 'dbtune.statement_timeout': '1',
    })  # fmt: skip
    router = app.app.registry.dbtune.router
    with (
        caplog.at_level(logging.WARNING, 'pyramid_dbtune'),
        pytest.raises(sa.exc.OperationalError) as raised,
    ):
        call(app, ('slow', {}))
    assert not IRetryableError.providedBy(raised.value)
    assert router.failovers == 0 and router.writer_reads == 0
    assert 'is down' not in caplog.text
    assert router.readers[0].backoff == 0


def test_a_time_limit_the_url_names_wins():
    from pyramid_dbtune.routing.connect import connect_args

    assert connect_args('sqlite://', 5, 30) == {}
    assert connect_args('postgresql+psycopg://u@h/d', 0, 0) == {}
    assert connect_args('postgresql+psycopg://u@h/d', 0.5, 0) == {
        'connect_timeout': 2  # libpq's least
    }
    named = 'postgresql+psycopg://u@h/d?connect_timeout=9'
    assert connect_args(named, 5, 0) == {}
    options = 'postgresql+psycopg://u@h/d?options=-cstatement_timeout%3D9'
    assert connect_args(options, 0, 30) == {}
    assert connect_args('mysql+pymysql://u@h/d?read_timeout=9', 0, 30) == {
        'write_timeout': 30.0,
        'init_command': 'SET SESSION innodb_lock_wait_timeout = '
        'LEAST(@@GLOBAL.innodb_lock_wait_timeout, 8)',
    }
    commanded = 'mysql+pymysql://u@h/d?init_command=SET%20a%3D1'
    assert 'init_command' not in connect_args(commanded, 0, 30)


def test_a_time_limit_the_url_names_is_a_number():
    from pyramid_dbtune.routing.connect import connect_args

    url = 'mysql+pymysql://u:pw@h/d?read_timeout=soon'
    with pytest.raises(ConfigurationError) as raised:
        connect_args(url, 0, 30)
    assert str(raised.value) == (
        "read_timeout='soon' in the database URL "
        'mysql+pymysql://u:***@h/d?read_timeout=soon is not a number of '
        'seconds'
    )


def test_a_driver_given_no_time_limit_is_named_at_start_up(caplog):
    # pg8000 is told of neither bound; psycopg, the reader's, of both.
    url = sa.engine.make_url(POSTGRESQL_URL).set(
        drivername='postgresql+pg8000'
    )
    settings = {
        'dbtune.url': url.render_as_string(hide_password=False),
        'dbtune.read_urls': POSTGRESQL_URL,
        'dbtune.pin_secret': 'a pin secret for this test',
    }
    with caplog.at_level(logging.WARNING, 'pyramid_dbtune'):
        config = Configurator(settings=settings)
        config.include('pyramid_dbtune')
        config.commit()
    router = config.registry.dbtune.router
    try:
        with router.writer.connect() as connection:
            assert connection.exec_driver_sql('SELECT 1').scalar() == 1
    finally:
        config.registry.dbtune.close()
    shown = url.render_as_string(hide_password=True)
    assert [r.getMessage() for r in caplog.records] == [
        f'pyramid_dbtune: the driver of {shown} is not given '
        'dbtune.connect_timeout and dbtune.statement_timeout; a server '
        'that hangs holds a request until it answers: set the '
        "driver's own bound in the URL"
    ]


def test_a_write_waiting_for_a_lock_gives_up_retryably(mysql_url, apps):
    # dbtune.statement_timeout bounds how long PyMySQL waits for an
    # answer; InnoDB's wait for a row lock ends first, with its error 1205,
    # which pyramid_retry runs again (a read timeout's 2013 is not).
    app = apps(mysql_url, [SET_RENT], {'dbtune.statement_timeout': '3'})
    engine = sa.create_engine(mysql_url, poolclass=sa.pool.NullPool)
    writer = app.app.registry.dbtune.router.writer
    with engine.connect() as holder:
        holder.exec_driver_sql('SELECT rent FROM property FOR UPDATE')
        with (
            writer.connect() as connection,
            pytest.raises(sa.exc.OperationalError) as raised,
        ):
            connection.exec_driver_sql('UPDATE property SET rent = 1')
        assert raised.value.orig.args[0] == 1205
        assert IRetryableError.providedBy(raised.value)
        holder.rollback()
    engine.dispose()


def test_a_time_pin_lasts_its_whole_time_and_is_signed(sqlite_url, apps):
    settings = {
        'dbtune.read_urls': sqlite_url,
        'dbtune.pin_after_write': '0.5',
    }
    areas = {'name': 'areas', 'sql': 'SELECT name FROM area'}
    app = apps(sqlite_url, [SET_RENT, areas], settings)
    log = query_log(app)
    before = time.time()
    answer = app.post_json(
        '/call', {'calls': [['set_rent', {'id': 1, 'rent': 4}]]}
    )
    assert 'Max-Age=1' in answer.headers['Set-Cookie']
    value = app.cookies[PIN_COOKIE]
    # Until the end of its second: a 0.5 s pin rounded down is none.
    assert int(value.partition('.')[0]) >= before + 0.5
    # A client that made up a pin of its own reads on the replica.
    forged = TestApp(app.app)
    forged.set_cookie(PIN_COOKIE, str(int(time.time()) + 3600))
    call(forged, ('areas', {}))
    assert log.count('FROM area', engine='writer') == 0
    assert log.count('FROM area', engine='reader0') == 1
