"""Real replicas: a PostgreSQL primary and its streaming standby, and a
MariaDB primary and its replica by GTID, started by the test on free
loopback ports, their replay held back 2 s to make lag real;
``dbtune.max_replica_lag`` passes over a replica that far behind, and
gives it its reads again once it catches up."""

import threading
import time

import pytest
import sqlalchemy as sa
from pyramid.exceptions import ConfigurationError
from webtest import TestApp

from pyramid_dbtune.ops.metrics import database_figures
from pyramid_dbtune.routing.lag import EVERY, Position
from pyramid_dbtune.routing.work import PIN_COOKIE
from pyramid_dbtune.settings import parse

from conftest import GET, SET_RENT, Property, call, until

#: Every replica applies a commit 2 s after it: behind by that, at least.
STANDBY_DELAY = 2
REPLICA_DELAY = 2


def set_rent(url, rent, id=1):
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.begin() as connection:
        connection.execute(
            sa.text('UPDATE property SET rent = :rent WHERE id = :id'),
            {'rent': rent, 'id': id},
        )
    engine.dispose()


def uncached(app, id=1):
    """The rent of property ``id`` as a read of the app finds it now (its
    method caches nothing)."""
    return call(app, ('get', {'id': id}))['results'][0]['rows'][0][2]


NOW = {**GET, 'name': 'get', 'cache_time': 0}


def test_a_standby_behind_is_passed_over_until_it_catches_up(
    replicated, apps, caplog
):
    primary, standby = replicated
    settings = {
        'dbtune.read_urls': standby.url,
        'dbtune.max_replica_lag': '0.5',
    }
    app = apps(primary.url, [NOW], settings, tables=False)
    router = app.app.registry.dbtune.router
    (reader,) = router.readers
    until(lambda: reader.lag == 0)
    assert uncached(app) == 90 and reader.reads == 1
    set_rent(primary.url, 91)
    # Behind by more than 0.5 s: passed over, and the read is fresh.
    until(lambda: reader.lag is not None and reader.lag > 0.5)
    assert uncached(app) == 91
    assert reader.reads == 1 and router.behind == 1
    # Once it has replayed the write, it reads again.
    until(lambda: reader.lag == 0)
    assert uncached(app) == 91 and reader.reads == 2
    figures = database_figures(router)
    assert figures['roles']['reader0']['lag'] == 0
    assert figures['behind'] == 1
    # Stopped: its lag is not known (said once), and its reads go to the
    # writer.
    standby.stop()
    until(lambda: reader.lag is None)
    time.sleep(3 * EVERY)  # more looks
    assert caplog.text.count('cannot read the lag of') == 1
    assert database_figures(router)['roles']['reader0']['lag'] is None
    assert uncached(app) == 91
    # Started again: once it is up and near, its reads come back.
    standby.start()

    def on_the_reader():
        reads, failovers = reader.reads, router.failovers
        assert uncached(app) == 91
        return reader.reads > reads and router.failovers == failovers

    until(on_the_reader)


@pytest.mark.parametrize('replicated', ['postgresql'], indirect=True)
def test_a_standby_whose_streaming_stopped_gets_no_reads(replicated, apps):
    # Its WAL receiver gone, a standby has replayed all it received, for
    # good: it does not know how far behind it is.
    primary, standby = replicated
    settings = {
        'dbtune.read_urls': standby.url,
        'dbtune.max_replica_lag': '1',
        'dbtune.causal_reads': 'false',  # the lag alone is looked at
    }
    app = apps(primary.url, [NOW], settings, tables=False)
    (reader,) = app.app.registry.dbtune.router.readers
    until(lambda: reader.lag == 0)
    conninfo = on_standby(standby, 'SHOW primary_conninfo')
    on_standby(standby, "ALTER SYSTEM SET primary_conninfo = ''")
    try:
        until(lambda: not receiving(standby))
        set_rent(primary.url, 93)
        time.sleep(3 * EVERY)  # looked at since
        assert uncached(app) == 93 and reader.reads == 0
    finally:
        escaped = conninfo.replace("'", "''")
        on_standby(standby, f"ALTER SYSTEM SET primary_conninfo = '{escaped}'")
        until(lambda: receiving(standby))


def on_standby(standby, sql):
    """Run ``sql`` on the standby, outside a transaction, and reload its
    configuration; the first value it answered, if any."""
    engine = sa.create_engine(
        standby.url, poolclass=sa.pool.NullPool, isolation_level='AUTOCOMMIT'
    )
    try:
        with engine.connect() as connection:
            result = connection.exec_driver_sql(sql)
            value = result.scalar() if result.returns_rows else None
            connection.exec_driver_sql('SELECT pg_reload_conf()')
            return value
    finally:
        engine.dispose()


def receiving(standby):
    """Whether the standby's WAL receiver runs."""
    return on_standby(standby, 'SELECT count(*) FROM pg_stat_wal_receiver')


def test_a_replica_stopped_and_started_under_load_fails_no_read(
    replicated, apps
):
    primary, standby = replicated
    settings = {'dbtune.read_urls': standby.url, 'dbtune.max_replica_lag': '1'}
    app = apps(primary.url, [NOW], settings, tables=False)
    router = app.app.registry.dbtune.router
    (reader,) = router.readers
    until(lambda: reader.lag == 0)
    failures, stopping = [], threading.Event()

    def load():
        client = TestApp(app.app)
        while not stopping.is_set():
            try:
                assert uncached(client) == 90
            except Exception as exc:  # noqa: BLE001 (counted, then shown)
                failures.append(exc)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        until(lambda: reader.reads > 20)
        standby.stop()
        until(lambda: router.failovers > 20)
        standby.start()
        # A standby that restarted tells its lag once it has replayed a
        # transaction (PostgreSQL's pg_last_xact_replay_timestamp()): a
        # write that changes nothing, as a live site's would come.
        set_rent(primary.url, 90)
        # Back and near: its reads return to it, once its back-off (which
        # doubled with each failure while it was down) has run out.
        until(lambda: reader.lag == 0 and not reader.backoff, 60)
        reads, failovers = reader.reads, router.failovers
        until(lambda: reader.reads > reads + 20)
    finally:
        stopping.set()
        for thread in threads:
            thread.join(30)
    assert failures == [] and router.failovers == failovers


def test_without_a_bound_a_standby_behind_serves_old_rows(replicated, apps):
    # The lag is real: the same reads, unbounded, are stale.
    primary, standby = replicated
    app = apps(primary.url, [NOW], {
        'dbtune.read_urls': standby.url, 'dbtune.causal_reads': 'false',
    }, tables=False)  # fmt: skip
    set_rent(primary.url, 92)
    assert uncached(app) == 90
    assert app.app.registry.dbtune.router.lag_watch is None


def test_a_replica_that_is_the_writer_is_not_behind(server_url, apps):
    app = apps(server_url, [NOW], {
        'dbtune.read_urls': server_url, 'dbtune.max_replica_lag': '1',
        'dbtune.causal_reads': 'false',  # the lag alone is looked at
    })  # fmt: skip
    (reader,) = app.app.registry.dbtune.router.readers
    until(lambda: reader.lag == 0)
    assert uncached(app) == 90 and reader.reads == 1


def test_a_bound_on_lag_needs_replicas():
    with pytest.raises(ConfigurationError, match='max_replica_lag is set'):
        parse({'dbtune.url': 'sqlite://', 'dbtune.max_replica_lag': '1'})


def test_a_mariadb_url_reads_lag_and_positions(mysql_url, apps):
    # SQLAlchemy names the dialect of a mariadb:// URL "mariadb": the
    # same server, told the same way.
    url = mysql_url.replace('mysql+', 'mariadb+', 1)
    app = apps(url, [NOW], {
        'dbtune.read_urls': url, 'dbtune.max_replica_lag': '1',
    })  # fmt: skip
    router = app.app.registry.dbtune.router
    assert router.dialect == 'mariadb' and router.positions
    (reader,) = router.readers
    until(lambda: reader.lag == 0 and reader.position is not None)
    assert uncached(app) == 90 and reader.reads == 1


def test_a_lag_that_cannot_be_read_is_said_and_its_position_read(
    mysql_url, apps, caplog
):
    # A reader's user that may not see replication's status (MariaDB's
    # SLAVE MONITOR): the first look says so, once; its position is read
    # all the same, for causal reads.
    user = f'rv_lagless_{threading.get_ident() % 10**6}'
    admin = sa.create_engine(mysql_url, poolclass=sa.pool.NullPool)
    database = sa.engine.make_url(mysql_url).database
    with admin.begin() as connection:
        connection.exec_driver_sql(f"CREATE USER '{user}'@'127.0.0.1'")
        connection.exec_driver_sql(
            f"GRANT SELECT ON `{database}`.* TO '{user}'@'127.0.0.1'"
        )
    try:
        reader_url = mysql_url.replace('root@', f'{user}@', 1)
        app = apps(mysql_url, [NOW], {'dbtune.read_urls': reader_url})
        router = app.app.registry.dbtune.router
        (reader,) = router.readers
        until(lambda: reader.position is not None)
        time.sleep(EVERY * 3)  # three more looks, none said
        assert reader.lag is None
        said = caplog.text.count('cannot read the lag of')
        assert said == 1, caplog.text
        assert 'SLAVE MONITOR' in caplog.text
        assert uncached(app) == 90 and reader.reads == 1
    finally:
        with admin.begin() as connection:
            connection.exec_driver_sql(f"DROP USER '{user}'@'127.0.0.1'")
        admin.dispose()


def test_a_fill_of_tables_not_told_waits_for_every_write(mysql_url, apps):
    # Causal reads: after this process committed a write (at a position
    # no replica has replayed), a cache fill of a read whose tables cannot
    # be told goes to the writer, as one of the table written does.
    app = apps(mysql_url, [NOW], {'dbtune.read_urls': mysql_url})
    router = app.app.registry.dbtune.router
    (reader,) = router.readers
    until(lambda: reader.position is not None)
    router.pins.wrote({'property'}, Position({0: 10**15}))
    select = sa.text('SELECT 1 AS one')
    for tables, writer_reads in ((['area'], 0), (['property'], 1), (['*'], 2)):
        router.read(select, {}, 0, frozenset(tables), fill=True)
        assert router.writer_reads == writer_reads, tables


def test_rows_filled_from_the_writer_are_not_served_to_a_later_pin(
    replicated, apps
):
    # Two processes' apps, their readers down: the first fills its cache
    # from the writer; a write through the second pins its client, whose
    # read through the first must not be given the rows read before.
    primary, _ = replicated
    get = {**GET, 'name': 'get', 'cache_time': 60}
    settings = {'dbtune.read_urls': primary.url}
    filler, writer = (
        apps(primary.url, [get, SET_RENT], settings, tables=False)
        for _ in range(2)
    )
    for app in (filler, writer):
        (reader,) = app.app.registry.dbtune.router.readers
        reader.down_until = float('inf')  # as after a failed read
    assert rent_of(call(filler, ('get', {'id': 1}))) == 90
    call(writer, ('set_rent', {'id': 1, 'rent': 95}))
    filler.set_cookie(PIN_COOKIE, writer.cookies[PIN_COOKIE])
    answer = call(filler, ('get', {'id': 1}))
    assert rent_of(answer) == 95 and answer['cache']['hit'] == 0
    filler.reset()  # a client without the pin: the cached rows
    assert rent_of(call(filler, ('get', {'id': 1}))) == 90


def rent_of(answer):
    return answer['results'][0]['rows'][0][2]


def test_a_sessions_reads_after_a_commit_in_the_request_see_it(
    replicated, apps
):
    # A view that commits its write and goes on reading through the
    # session: those reads see the write, though the replica has yet to.
    primary, _ = replicated

    def view(request):
        request.dbsession.get(Property, 1).rent = 96
        request.tm.commit()
        request.tm.begin()
        return request.dbsession.get(Property, 1).rent

    standby = replicated[1]
    app = apps(
        primary.url, [], {'dbtune.read_urls': standby.url},
        tables=False, views={'/view': view},
    )  # fmt: skip
    (reader,) = app.app.registry.dbtune.router.readers
    until(lambda: reader.position is not None)
    assert app.get('/view').json == 96
