"""``request.dbsession``'s statements: which of them write, where they
run, and what they leave in the cache, on PostgreSQL and MariaDB."""

import itertools

import psycopg
import pytest
import sqlalchemy as sa
import transaction
from pyramid.scripting import prepare

from pyramid_dbtune import WriteInReadError
from pyramid_dbtune.routing.connect import leaves_setting
from pyramid_dbtune.routing.errors import is_read_only_refusal

from conftest import Property, query_log, rent_on, run_sql

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


NAMES = {
    'name': 'names',
    'sql': 'SELECT name FROM area ORDER BY name',
    'cache_time': 60,
}
#: A setting of each server, and a SQL method that shows it.
SETTINGS = {
    'postgresql': "SET LOCAL statement_timeout = '4s'",
    'mysql': 'SET SESSION max_statement_time = 4',
}
SHOWS = {
    'postgresql': "SELECT current_setting('statement_timeout') AS v",
    'mysql': 'SELECT @@max_statement_time AS v',
}


def dialect(url):
    return 'postgresql' if url.startswith('postgresql') else 'mysql'


def test_a_view_that_reads_after_a_setting_takes_no_write_slot(
    server_url, apps
):
    def view(request):
        session = request.dbsession
        session.execute(sa.text(SETTINGS[dialect(server_url)]))
        session.scalar(sa.select(Property.rent).where(Property.id == 1))
        return request.dbtune.unit.dirty

    app = view_app(apps, server_url, view, [RENTS, NAMES])
    router = app.app.registry.dbtune.router
    cached(app), cached(app, 'names')
    assert app.get('/view').json is False
    assert router.write_transactions == 0
    assert cached(app)[1] and cached(app, 'names')[1]  # none dropped


def test_a_setting_holds_for_the_requests_sql_methods_and_writes(
    server_url, apps
):
    setting, show = SETTINGS[dialect(server_url)], SHOWS[dialect(server_url)]

    def view(request):
        session = request.dbsession
        session.execute(sa.text(setting))
        seen = [session.scalar(sa.text(show)), request.sql.setting()[0].v]
        dirty = request.dbtune.unit.dirty
        session.get(Property, 4).rent = 71
        session.flush()  # the first write, on the writer
        seen += [session.scalar(sa.text(show)), request.sql.setting()[0].v]
        return {
            'seen': [str(value) for value in seen],
            'dirty': dirty,
            'cache': {k: v for k, v in request.dbtune.cache.items() if v},
        }

    methods = [
        RENTS,
        NAMES,
        {'name': 'setting', 'sql': show, 'cache_time': 60},
    ]
    # One pooled reader connection: the next request would get the
    # session's, were it pooled.
    app = view_app(
        apps, server_url, view, methods, {'dbtune.read_pool_size': 1}
    )
    log = query_log(app)
    cached(app, 'names')
    answer = app.get('/view').json
    # The reads ran on the reader, with no write slot; SQL methods ran in
    # the session, which they saw the setting of, past the cache; the
    # write saw it too, made again on the writer.
    assert answer['dirty'] is False
    assert len(set(answer['seen'])) == 1
    assert answer['cache'] == {'uncached': 2}
    assert log.count(setting, engine='reader0') == 1
    assert log.count(setting, engine='writer') == 1
    # It held for that request alone; the write dropped no other table's
    # reads.
    assert str(cached(app, 'setting')[0][0][0]) != answer['seen'][0]
    assert cached(app, 'names')[1]


def test_a_setting_after_a_write_runs_in_the_writing_transaction(
    server_url, apps
):
    setting, show = SETTINGS[dialect(server_url)], SHOWS[dialect(server_url)]

    def view(request):
        session = request.dbsession
        session.get(Property, 4).rent = 71
        session.flush()
        session.execute(sa.text(setting))
        return str(session.scalar(sa.text(show)))

    app = view_app(apps, server_url, view, [RENTS, NAMES])
    log = query_log(app)
    cached(app, 'names')
    assert app.get('/view').json in ('4s', '4.0')
    assert log.count(setting, engine='writer') == 1
    assert cached(app, 'names')[1]  # not dropped


#: Settings of the session, not of its transaction: kept by the
#: connection past the commit.
SESSION_SETTINGS = {
    'postgresql': "SET statement_timeout = '4s'",
    'mysql': 'SET SESSION max_statement_time = 4',
}


@pytest.mark.parametrize(
    'made',
    [
        'in a read',
        'in a flush',
        'before a write',
        'after it',
        'by a method',
        'on its connection',
    ],
)
def test_a_setting_leaves_with_its_connection(server_url, apps, made):
    setting = SESSION_SETTINGS[dialect(server_url)]
    show = SHOWS[dialect(server_url)]
    rents = itertools.count(100)

    def view(request):
        session = request.dbsession
        sets = request.params.get('set')
        if sets and made == 'by a method':
            request.sql.set()  # in the writing transaction
        elif sets and made in ('in a read', 'in a flush', 'before a write'):
            session.execute(sa.text(setting))  # on the reader
        if made == 'in a flush':  # that changes nothing: no write
            session.get(Property, 4).rent = 70
            session.flush()
        elif made != 'in a read':
            session.get(Property, 4).rent = next(rents)
            session.flush()  # the first write, on the writer
        if sets and made == 'after it':
            session.execute(sa.text(setting))  # in the writing transaction
        elif sets and made == 'on its connection':  # the session unaware
            session.connection().execute(sa.text(setting))
        return str(session.scalar(sa.text(show)))

    # One pooled reader connection: the next request would get the
    # request's, were it pooled (and the writer has one, used in turn).
    app = view_app(
        apps,
        server_url,
        view,
        [RENTS, {'name': 'set', 'sql': setting}],
        {'dbtune.read_pool_size': 1},
    )
    default = app.get('/view').json
    assert app.get('/view', {'set': '1'}).json != default
    # The requests after it run without it: its connection was closed
    # (or, a PostgreSQL reader's, reset).
    assert [app.get('/view').json for _ in range(3)] == [default] * 3


@pytest.mark.parametrize('write', [True, False])
@pytest.mark.parametrize(
    'setting, show',
    [
        (
            "SELECT set_config('statement_timeout', '4s', false)",
            "SELECT current_setting('statement_timeout')",
        ),
        (
            'SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL '
            'SERIALIZABLE',
            "SELECT current_setting('default_transaction_isolation')",
        ),
    ],
)
def test_settings_that_read_otherwise_leave_with_their_connection(
    postgresql_url, apps, setting, show, write
):
    # A set_config() reads as a read, and the transaction's defaults as a
    # write of no table: on the reader, or on the writer, neither stays.
    def view(request):
        session = request.dbsession
        row = session.get(Property, 4)
        row.rent = row.rent + 1 if write else row.rent  # a flush either way
        session.flush()
        if request.params.get('set'):
            session.execute(sa.text(setting))
        return str(session.scalar(sa.text(show)))

    app = view_app(
        apps, postgresql_url, view, settings={'dbtune.read_pool_size': 1}
    )
    default = app.get('/view').json
    assert app.get('/view', {'set': '1'}).json != default
    assert [app.get('/view').json for _ in range(3)] == [default] * 3


@pytest.mark.parametrize('how', ['in a read', 'in a write'])
def test_another_database_used_leaves_with_its_connection(
    mysql_url, apps, how
):
    # MySQL's USE changes the database of the connection, not of the
    # transaction: a request's tenant must not be the next request's.
    run_sql(mysql_url, 'CREATE DATABASE IF NOT EXISTS dbtune_other')

    def view(request):
        session = request.dbsession
        if how == 'in a write':
            session.get(Property, 4).rent += 1
            session.flush()
        if request.params.get('use'):
            session.connection().exec_driver_sql('USE dbtune_other')
        return session.scalar(sa.text('SELECT DATABASE()'))

    app = view_app(
        apps, mysql_url, view, settings={'dbtune.read_pool_size': 1}
    )
    default = app.get('/view').json
    assert app.get('/view', {'use': '1'}).json == 'dbtune_other'
    assert [app.get('/view').json for _ in range(3)] == [default] * 3


@pytest.mark.parametrize('replicas', [False, True])
def test_a_reader_lost_before_the_first_write_does_not_fail_it(
    postgresql_url, apps, replicas
):
    # The first write lets go of the session's reader connection, rolling
    # its transaction back. One that had died meanwhile (a replica
    # restarted, a network cut) failed the write, the writer well: a 500,
    # or with pyramid_retry the whole request run again.
    def view(request):
        session = request.dbsession
        row = session.get(Property, 1)  # held: not read again
        reader = session.connection().exec_driver_sql(
            'SELECT pg_backend_pid()'
        )
        lost = f'SELECT pg_terminate_backend({reader.scalar()})'
        run_sql(postgresql_url, lost)
        row.rent = 5
        session.flush()
        return 'written'

    settings = {'dbtune.read_urls': postgresql_url} if replicas else {}
    app = view_app(apps, postgresql_url, view, settings=settings)
    assert app.get('/view').json == 'written'
    assert rent_on(postgresql_url) == 5


def test_a_pinned_clients_session_reads_read_only_on_the_writer(
    postgresql_url, apps
):
    # Pinned after its write, a client's session reads on the writer's
    # database: read-only there too until it writes, so that a write it
    # cannot tell (a function that writes) fails loudly, as on a reader.
    # It ran, and was rolled back unseen at commit: the view answered 200.
    def view(request):
        session = request.dbsession
        if request.params.get('write'):
            session.get(Property, 4).rent = 75
            session.flush()
            return 'wrote'
        return session.scalar(sa.text('SELECT bump()'))

    settings = {
        'dbtune.read_urls': postgresql_url,
        'dbtune.pin_after_write': '30',
        'dbtune.causal_reads': 'false',
    }
    app = view_app(apps, postgresql_url, view, settings=settings)
    run_sql(
        postgresql_url,
        'CREATE FUNCTION bump() RETURNS int LANGUAGE sql AS '
        "'UPDATE property SET rent = rent + 1 WHERE id = 1 RETURNING 1'",
    )
    with pytest.raises(WriteInReadError):
        app.get('/view')  # on the reader
    assert app.get('/view', {'write': '1'}).json == 'wrote'  # pinned now
    with pytest.raises(WriteInReadError):
        app.get('/view')  # on the writer, read-only
    assert rent_on(postgresql_url) == 90


def test_which_statements_leave_a_setting_on_their_connection():
    leaves = [
        'SET search_path TO tenant',
        "/* a method */ set session time_zone = '+05:00'",
        "SELECT set_config('app.tenant', 'a', false)",
        'SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY',
        'SET @x = 1',
        'USE tenant',
    ]
    stay = [
        'SELECT 1',
        "SET LOCAL statement_timeout = '4s'",
        'SET TRANSACTION ISOLATION LEVEL SERIALIZABLE',
        'SET CONSTRAINTS ALL DEFERRED',
        'UPDATE property SET rent = 1',
        "SELECT 'set search_path'",
        'SELECT * FROM users',
        'UPDATE property SET rent = 1 WHERE id IN ' + '(1)' * 2000,  # long
    ]
    assert [leaves_setting(sql) for sql in leaves] == [True] * len(leaves)
    assert [leaves_setting(sql) for sql in stay] == [False] * len(stay)


def test_a_sql_methods_setting_on_the_reader_leaves_with_it(mysql_url, apps):
    # Declared a read, it runs on MariaDB's reader, which keeps a setting
    # past any transaction: that connection is not pooled either.
    setting, show = SESSION_SETTINGS['mysql'], SHOWS['mysql']

    def view(request):
        if request.params.get('set'):
            request.sql.set()
        return str(request.sql.show()[0].v)

    methods = [
        RENTS,
        {'name': 'set', 'sql': setting, 'writes': False},
        {'name': 'show', 'sql': show},
    ]
    app = view_app(
        apps, mysql_url, view, methods, {'dbtune.read_pool_size': 1}
    )
    default = app.get('/view').json
    app.get('/view', {'set': '1'})
    assert [app.get('/view').json for _ in range(3)] == [default] * 3


def test_a_readers_setting_is_undone_and_its_connection_kept(
    postgresql_url, apps
):
    # A PostgreSQL reader's connection is reset as it returns to its pool
    # (a new connection for every request that sets a search_path, say,
    # would cost it more than its reads).
    def view(request):
        session = request.dbsession
        if request.params.get('set'):
            session.execute(sa.text(SESSION_SETTINGS['postgresql']))
        pid = session.scalar(sa.text('SELECT pg_backend_pid()'))
        return [pid, str(session.scalar(sa.text(SHOWS['postgresql'])))]

    app = view_app(
        apps, postgresql_url, view, settings={'dbtune.read_pool_size': 1}
    )
    pid, default = app.get('/view').json
    assert app.get('/view', {'set': '1'}).json == [pid, '4s']
    assert app.get('/view').json == [pid, default]


def test_a_search_path_set_in_the_session_is_its_requests_alone(
    postgresql_url, apps
):
    schema = sa.engine.make_url(postgresql_url).query['options'].split('=')[1]
    tenant = f'{schema}_tenant'
    run_sql(
        postgresql_url,
        f'CREATE SCHEMA {tenant}',
        f'CREATE TABLE {tenant}.property (id INTEGER PRIMARY KEY, '
        'area VARCHAR(40) NOT NULL, rent INTEGER NOT NULL)',
        f"INSERT INTO {tenant}.property VALUES (1, 'Leeds', 5)",
    )

    def view(request):
        request.dbsession.execute(sa.text(f'SET search_path TO {tenant}'))
        rows = [list(row) for row in request.sql.rents()]
        rents = request.dbsession.scalars(sa.select(Property.rent)).all()
        return [rows, rents, request.dbtune.unit.dirty]

    try:
        app = view_app(apps, postgresql_url, view)
        assert cached(app) == (RENTS_NOW, False)
        # The tenant's rows, not the cached ones of the schema of the URL;
        # and no write slot.
        assert app.get('/view').json == [[[1, 5]], [5], False]
        # Neither stored in the cache, nor dropping what it holds.
        assert cached(app) == (RENTS_NOW, True)
    finally:
        run_sql(postgresql_url, f'DROP SCHEMA {tenant} CASCADE')


@pytest.mark.parametrize(
    'statement',
    [
        "NOTIFY dbtune_test, 'x'",
        'LISTEN dbtune_test',
        'LOCK TABLE property IN SHARE MODE',
        'SET TRANSACTION ISOLATION LEVEL SERIALIZABLE',
        'SET TRANSACTION READ WRITE',
    ],
)
def test_a_statement_for_the_writing_transaction_runs_there_and_drops_no_read(
    postgresql_url, apps, statement
):
    def view(request):
        request.dbsession.execute(sa.text(statement))
        dirty = request.dbtune.unit.dirty
        request.dbsession.get(Property, 4).rent = 71
        return dirty

    app = view_app(apps, postgresql_url, view, [RENTS, NAMES])
    log = query_log(app)
    cached(app, 'names')
    assert app.get('/view').json is True
    assert log.count(statement, engine='writer') == 1
    assert cached(app)[0][3] == [4, 71]
    assert cached(app, 'names')[1]


def test_a_notify_is_sent_as_the_request_commits(postgresql_url, apps):
    def view(request):
        request.dbsession.execute(sa.text("NOTIFY dbtune_test, 'sent'"))
        return 'ok'

    app = view_app(apps, postgresql_url, view)
    url = sa.engine.make_url(postgresql_url)
    with psycopg.connect(
        host=url.host, port=url.port, user=url.username, dbname=url.database,
        autocommit=True,
    ) as listener:  # fmt: skip
        listener.execute('LISTEN dbtune_test')
        app.get('/view')
        sent = listener.notifies(timeout=5, stop_after=1)
        assert [notify.payload for notify in sent] == ['sent']


#: A sequence of each server, and a read of its next value: a write that
#: reads as a read.
SEQUENCES = {
    'postgresql': "SELECT nextval('seq')",
    'mysql': 'SELECT nextval(seq)',
}


def test_a_write_that_reads_as_a_read_fails_saying_what_to_do(
    server_url, apps
):
    def view(request):
        nextval = sa.text(SEQUENCES[dialect(server_url)])
        try:
            request.dbsession.scalar(nextval)
        except WriteInReadError as exc:  # the driver's error its cause
            return [str(exc), is_read_only_refusal(exc.__cause__.orig)]

    app = view_app(apps, server_url, view)
    run_sql(server_url, 'CREATE SEQUENCE seq')
    message, refused = app.get('/view').json
    assert 'execution_options(dbtune_writes=True)' in message
    assert refused


def test_a_sql_method_that_writes_as_a_read_in_the_session_says_so(
    server_url, apps
):
    def view(request):
        request.dbsession.execute(sa.text(SETTINGS[dialect(server_url)]))
        return request.sql.next()[0][0]

    nextval = SEQUENCES[dialect(server_url)]
    app = view_app(apps, server_url, view, [{'name': 'next', 'sql': nextval}])
    run_sql(server_url, 'CREATE SEQUENCE seq')
    with pytest.raises(WriteInReadError, match=r'next\(\).*writes=True'):
        app.get('/view')


STATEMENTS = {
    'update': 'UPDATE property SET rent = 5 WHERE id = 1',
    'DDL': 'CREATE TEMPORARY TABLE scratch (i INTEGER)',  # untold tables
}
BOTH = {'rents', 'names'}


@pytest.mark.parametrize(
    'statement, declared, dropped',
    [
        ('nextval', [], set()),
        ('nextval', 'property', {'rents'}),
        ('nextval', ['Property', 'area'], BOTH),
        ('nextval', True, BOTH),  # its tables untold: every table
        ('update', True, {'rents'}),
        ('update', 'area', BOTH),  # and its own
        ('DDL', 'area', BOTH),
    ],
)
def test_dbtune_writes_sends_a_statement_to_the_writer_with_its_tables(
    server_url, apps, statement, declared, dropped
):
    sql = STATEMENTS.get(statement) or SEQUENCES[dialect(server_url)]

    def view(request):
        request.dbsession.execute(
            sa.text(sql), execution_options={'dbtune_writes': declared}
        )
        return request.dbtune.unit.dirty

    app = view_app(apps, server_url, view, [RENTS, NAMES])
    run_sql(server_url, 'CREATE SEQUENCE seq')
    cached(app), cached(app, 'names')
    assert app.get('/view').json is True
    assert {name for name in BOTH if not cached(app, name)[1]} == dropped


@pytest.mark.parametrize('declared', [False, 1, [None]])
def test_dbtune_writes_is_true_or_table_names(sqlite_url, apps, declared):
    def view(request):
        statement = sa.select(Property).execution_options(
            dbtune_writes=declared
        )
        return request.dbsession.execute(statement).all()

    app = view_app(apps, sqlite_url, view)
    with pytest.raises(ValueError, match='dbtune_writes must be True or'):
        app.get('/view')
