"""Causal reads within one process, on real replication that replays
3 s late (PostgreSQL's streaming, MariaDB's by GTID): long enough that
the replica is still behind through every step, however slow the
machine."""

import threading

import sqlalchemy as sa
import transaction
from webtest import TestApp

from pyramid_dbtune import SQLMethod
from pyramid_dbtune.registry import DBTune
from pyramid_dbtune.routing.lag import read_pin
from pyramid_dbtune.routing.work import PIN_COOKIE
from pyramid_dbtune.settings import parse
from pyramid_dbtune.zope.connection import Database

from conftest import GET, SET_RENT, call, until

STANDBY_DELAY = 3
REPLICA_DELAY = 3
NOW = {**GET, 'cache_time': 0}


def test_causal_reads_in_one_process(replicated, apps):
    primary, standby = replicated
    settings = {'dbtune.read_urls': standby.url}
    cached = {**GET, 'name': 'cached'}
    app = apps(primary.url, [NOW, cached, SET_RENT], settings, tables=False)
    router = app.app.registry.dbtune.router
    (reader,) = router.readers
    until(lambda: covers(reader, router.position()))
    call(app, ('set_rent', {'id': 1, 'rent': 95}))
    pin = read_pin(app.cookies[PIN_COOKIE], router.pin_key)
    assert pin and not covers(reader, pin)
    # The client: fresh, on the writer, the replica behind (asked again
    # on the read).
    reads = reader.reads
    assert rent(call(app, ('get', {'id': 1}))) == 95
    assert reader.reads == reads
    # Another client of this process: a fill of the cache (everyone's)
    # waits for a reader that has replayed the commit; its own read that
    # the cache does not keep need not.
    other = TestApp(app.app)
    assert rent(call(other, ('cached', {'id': 1}))) == 95
    assert reader.reads == reads
    assert rent(call(other, ('get', {'id': 1}))) == 90
    assert reader.reads == reads + 1
    # Once the standby has replayed it: reads go back to it.
    until(lambda: covers(reader, pin))
    assert rent(call(app, ('get', {'id': 1}))) == 95
    assert rent(call(other, ('get', {'id': 1}))) == 95
    assert reader.reads == reads + 3
    # A client's read while the replica it would be asked of is down: on
    # the writer, and fresh.
    call(app, ('set_rent', {'id': 1, 'rent': 96}))
    standby.stop()
    assert rent(call(app, ('get', {'id': 1}))) == 96


def asks_position(statement):
    """Whether ``statement`` asks a database's log position."""
    return (
        'pg_is_in_recovery()' in statement or '@@gtid_current_pos' in statement
    )


def covers(reader, position):
    """Whether ``reader`` has replayed ``position``, as last seen."""
    return reader.position is not None and reader.position.covers(position)


def rent(answer):
    return answer['results'][0]['rows'][0][2]


def test_a_read_as_a_write_commits_fills_no_old_rows(replicated, apps):
    # Another client reads while the commit asks the writer where it
    # ended: it must not fill the cache, everyone's, from the replica
    # that has yet to replay the commit.
    primary, standby = replicated
    settings = {'dbtune.read_urls': standby.url}
    cached = {**GET, 'name': 'cached'}
    app = apps(primary.url, [cached, SET_RENT], settings, tables=False)
    router = app.app.registry.dbtune.router
    (reader,) = router.readers
    until(lambda: covers(reader, router.position()))
    assert rent(call(app, ('cached', {'id': 1}))) == 90
    meanwhile = []

    def read_elsewhere(conn, cursor, statement, *args):
        if asks_position(statement) and not meanwhile:
            other = TestApp(app.app)
            read = ('cached', {'id': 1})
            thread = threading.Thread(
                target=lambda: meanwhile.append(call(other, read))
            )
            thread.start()
            thread.join(30)

    sa.event.listen(router.writer, 'before_cursor_execute', read_elsewhere)
    try:
        call(app, ('set_rent', {'id': 1, 'rent': 95}))
    finally:
        sa.event.remove(router.writer, 'before_cursor_execute', read_elsewhere)
    assert len(meanwhile) == 1
    # A client with no pin, after the commit: fresh rows.
    assert rent(call(TestApp(app.app), ('cached', {'id': 1}))) == 95


def test_a_read_as_zope_commits_fills_no_old_rows(replicated):
    # As above, through the Zope side's database (a zconsole script: no
    # request, no pin).
    primary, standby = replicated
    dbtune = DBTune(
        parse({'dbtune.url': primary.url, 'dbtune.read_urls': standby.url})
    )
    dbtune.register(SQLMethod('get', GET['sql'], cache_time=60))
    dbtune.register(SQLMethod('set', SET_RENT['sql']))
    database = Database(dbtune)
    router = dbtune.router
    (reader,) = router.readers
    meanwhile = []

    def rent_now():
        rows = []
        thread = threading.Thread(
            target=lambda: rows.extend(
                database.call(dbtune.methods['get'], {'id': 1})
            )
        )
        thread.start()
        thread.join(30)
        return rows[0].rent

    def read_elsewhere(conn, cursor, statement, *args):
        if asks_position(statement) and not meanwhile:
            meanwhile.append(rent_now())

    try:
        until(lambda: covers(reader, router.position()))
        assert rent_now() == 90
        sa.event.listen(router.writer, 'before_cursor_execute', read_elsewhere)
        database.call(dbtune.methods['set'], {'id': 1, 'rent': 95})
        transaction.commit()
        sa.event.remove(router.writer, 'before_cursor_execute', read_elsewhere)
        assert len(meanwhile) == 1
        assert rent_now() == 95
    finally:
        transaction.abort()
        dbtune.close()
