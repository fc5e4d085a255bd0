"""Causal reads on real replication, PostgreSQL's streaming (the standby
replays 0.5 s late) and MariaDB's by GTID (1-2 s late): a write committed
in one process, then read by the same client in another, over HTTP, sees
the write; without pins the same run reads old rows; reads that carry no
newer pin go to the replica. A change the listener hears of, made outside
or by another process, is not cached again from a replica behind it."""

import http.cookies
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import sqlalchemy as sa
from webtest import TestApp

from pyramid_dbtune.cache import triggers
from pyramid_dbtune.routing.engines import pin_key
from pyramid_dbtune.routing.lag import (
    NO_POSITION,
    Position,
    gtids,
    position_of,
)
from pyramid_dbtune.routing.work import PIN_COOKIE, read_pin, sign_pin
from pyramid_dbtune.settings import parse

from conftest import (
    GET,
    LISTEN,
    SET_RENT,
    call,
    position_on,
    shared_settings,
    until,
)

STANDBY_DELAY = 0.5
#: MariaDB's delay is in whole seconds, counted from its events' times,
#: which are whole seconds too: a delay of 1 may hold a write back for no
#: time at all, and the tests that read before the replica has it fail.
REPLICA_DELAY = 2
SERVER = Path(__file__).parent / 'dbtune_server.py'
SECRET = 'the causal reads test secret'
TOKEN = 'the causal reads test token'
NOW = {**GET, 'cache_time': 0}
PAIRS = 500


class Server:
    """The test app in a process of its own, over HTTP."""

    def __init__(self, url, settings, methods=(NOW, SET_RENT)):
        job = {'url': url, 'settings': settings, 'methods': list(methods)}
        self.process = subprocess.Popen(
            [sys.executable, str(SERVER), json.dumps(job)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            cwd=SERVER.parent,
        )  # fmt: skip
        self._base = None

    @property
    def base(self):
        """Its URL, once it listens (servers made together start so)."""
        if self._base is None:
            port = self.process.stdout.readline()
            self._base = f'http://127.0.0.1:{port}'
        return self._base

    def call(self, name, params, cookie=None):
        """The answer of one call, and the pin the response set."""
        body = json.dumps({'calls': [[name, params]]}).encode()
        headers = {'Content-Type': 'application/json'}
        if cookie:
            headers['Cookie'] = f'{PIN_COOKIE}={cookie}'
        request = urllib.request.Request(
            self.base.strip() + '/call', body, headers
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            jar = http.cookies.SimpleCookie(response.headers['Set-Cookie'])
            pin = jar[PIN_COOKIE].value if PIN_COOKIE in jar else None
            return json.loads(response.read()), pin

    def stats(self):
        request = urllib.request.Request(
            self.base.strip() + '/_dbtune/stats',
            headers={'X-Dbtune-Token': TOKEN},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def stop(self):
        if not self.process.stdin.closed:
            self.process.stdin.close()
        self.process.wait(30)


@pytest.fixture
def servers(replicated):
    primary, standby = replicated
    made = []

    def start(methods=(NOW, SET_RENT), **settings):
        settings = {'dbtune.read_urls': standby.url, **settings}
        pair = [Server(primary.url, settings, methods) for _ in range(2)]
        made.extend(pair)
        for server in pair:
            assert server.base  # both up
        return pair

    yield start
    for server in made:  # all at once
        server.process.stdin.close()
    for server in made:
        server.stop()


def write_then_read(writer, reader, pairs):
    """Stale reads of ``pairs`` write-then-read pairs of one client."""
    stale, cookie = 0, None
    for rent in range(1000, 1000 + pairs):
        _, pin = writer.call('set_rent', {'id': 1, 'rent': rent}, cookie)
        cookie = pin or cookie
        answer, _ = reader.call('get', {'id': 1}, cookie)
        stale += answer['results'][0]['rows'][0][2] != rent
    return stale


def test_a_clients_reads_see_its_writes_in_another_process(servers):
    writer, reader = servers(**{'dbtune.pin_secret': SECRET})
    assert write_then_read(writer, reader, PAIRS) == 0


def test_causal_reads_are_the_default(servers):
    writer, reader = servers()
    assert write_then_read(writer, reader, 50) == 0


def test_without_pins_the_same_reads_are_stale(servers):
    writer, reader = servers(**{'dbtune.causal_reads': 'false'})
    assert write_then_read(writer, reader, 50) > 0


def test_reads_without_a_newer_pin_go_to_the_standby(servers):
    stats = {'dbtune.stats': 'true', 'dbtune.stats.token': TOKEN}
    writer, reader = servers(**stats)
    _, pin = writer.call('set_rent', {'id': 1, 'rent': 7})
    # The replica replays it, and the watch sees it.
    time.sleep(REPLICA_DELAY + 1)
    for _ in range(100):
        reader.call('get', {'id': 1}, pin)  # an old pin
        reader.call('get', {'id': 1})  # none
    roles = reader.stats()['database']['roles']
    on_standby = roles['reader0']['reads']
    assert on_standby / (on_standby + roles['writer']['reads']) >= 0.9


def test_a_pin_is_not_served_rows_read_before_it(servers, memcached):
    # Two processes share memcached; the write is in the first. The
    # second, which has not heard of it, fills the cache from the replica
    # before it replays the write: rows read at a position before the pin.
    writer, filler = servers((GET, SET_RENT), **shared_settings(memcached))
    _, pin = writer.call('set_rent', {'id': 1, 'rent': 95})
    answer, _ = filler.call('get', {'id': 1})
    assert answer['results'][0]['rows'][0][2] == 90
    time.sleep(REPLICA_DELAY + 1)  # every replica has replayed it now
    # The entry is there for a client without a pin; the client that
    # wrote does not get it.
    answer, _ = filler.call('get', {'id': 1})
    assert answer['results'][0]['rows'][0][2] == 90
    assert answer['cache']['hit'] == 1
    answer, _ = filler.call('get', {'id': 1}, pin)
    assert answer['results'][0]['rows'][0][2] == 95


def test_a_replica_behind_at_the_last_look_is_asked_on_the_read(
    replicated, apps
):
    primary, standby = replicated
    settings = {'dbtune.read_urls': standby.url}
    app = apps(primary.url, [NOW, SET_RENT], settings, tables=False)
    router = app.app.registry.dbtune.router
    (reader,) = router.readers
    until(lambda: covers(reader, router.position()))
    router.lag_watch.stop()  # no more looks: only the read asks
    call(app, ('set_rent', {'id': 1, 'rent': 97}))
    pin = read_pin(app.cookies[PIN_COOKIE], router.pin_key)
    until(lambda: replayed(standby.url, pin))
    reads = reader.reads
    assert rent(call(app, ('get', {'id': 1}))) == 97
    assert reader.reads == reads + 1 and covers(reader, pin)


def test_a_read_that_waits_for_a_replay_is_no_failover(replicated, apps):
    # The replica is up and near; it has not replayed the client's write
    # yet, so the writer serves the read. No reader is down or behind.
    primary, standby = replicated
    settings = {'dbtune.read_urls': standby.url}
    app = apps(primary.url, [NOW, SET_RENT], settings, tables=False)
    router = app.app.registry.dbtune.router
    (reader,) = router.readers
    until(lambda: covers(reader, router.position()))
    on_writer = router.writer_reads
    for value in range(600, 610):
        call(app, ('set_rent', {'id': 1, 'rent': value}))
        assert rent(call(app, ('get', {'id': 1}))) == value
    assert router.writer_reads > on_writer
    assert (router.failovers, router.behind) == (0, 0)


def test_a_pinned_client_is_not_served_rows_read_before_its_pin(
    replicated, apps
):
    primary, standby = replicated
    settings = {'dbtune.read_urls': standby.url}
    app = apps(primary.url, [GET, SET_RENT], settings, tables=False)
    router = app.app.registry.dbtune.router
    (reader,) = router.readers
    until(lambda: covers(reader, router.position()))
    # Cached for everyone, read at the replica's position now.
    other = TestApp(app.app)
    assert call(other, ('get', {'id': 2}))['cache']['miss'] == 1
    # A write of another row keeps it; the writer's pin is later.
    call(app, ('set_rent', {'id': 1, 'rent': 98}))
    assert call(other, ('get', {'id': 2}))['cache']['hit'] == 1
    answer = call(app, ('get', {'id': 2}))
    assert answer['cache']['hit'] == 0 and answer['cache']['uncached'] == 1
    assert answer['results'][0]['rows'][0][2] == 120


@pytest.mark.parametrize('replicated', ['postgresql'], indirect=True)
def test_a_write_committed_asynchronously_is_read_back(replicated, apps):
    # synchronous_commit = off: the commit returns before its record is
    # written out. The client's pin is past that record all the same, and
    # its reads wait for a standby that has replayed it.
    primary, standby = replicated
    url = f'{primary.url}?options=-csynchronous_commit%3Doff'
    settings = {'dbtune.read_urls': standby.url}
    app = apps(url, [NOW, SET_RENT], settings, tables=False)
    router = app.app.registry.dbtune.router
    (reader,) = router.readers
    stale = 0
    for value in range(500, 510):
        until(lambda: covers(reader, router.position()))
        call(app, ('set_rent', {'id': 1, 'rent': value}))
        stale += rent(call(app, ('get', {'id': 1}))) != value
    assert stale == 0


def replayed(url, position):
    """Whether the database of ``url`` has replayed ``position`` now."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as connection:
            return position_of(connection).covers(position)
    finally:
        engine.dispose()


def covers(reader, position):
    """Whether ``reader`` has replayed ``position``, as last seen."""
    return reader.position is not None and reader.position.covers(position)


def test_a_pin_is_signed():
    key = pin_key(
        parse({'dbtune.url': 'sqlite://', 'dbtune.pin_secret': SECRET})
    )
    at = Position({0: 42, 3: 7})
    assert read_pin(sign_pin(at, key), key) == at
    assert read_pin('0-42.' + '0' * 32, key) == NO_POSITION
    assert read_pin('x.y', key) == NO_POSITION
    assert read_pin('0-x.y', key) == NO_POSITION
    assert read_pin('', key) == NO_POSITION
    assert read_pin('0-1.\u00e9', key) == NO_POSITION  # forged, not ASCII
    for other in (
        {'dbtune.url': 'sqlite://', 'dbtune.pin_secret': 'x' * 16},
        {'dbtune.url': 'sqlite://'},  # drawn from the URL
        {'dbtune.url': 'sqlite:///other'},
    ):
        assert (
            read_pin(sign_pin(at, pin_key(parse(other))), key) == NO_POSITION
        )


def test_positions_in_every_domain():
    old, new = gtids('0-1-5,1-2-9'), gtids('0-1-6,1-2-9')
    assert new.covers(old) and not old.covers(new)
    assert not gtids('0-1-7').covers(old)  # domain 1 not replayed
    assert gtids('').covers(NO_POSITION) and not gtids('')
    assert (gtids('0-1-7') | old) == gtids('0-1-7,1-2-9')
    assert str(old) == '0-5_1-9' and Position.parse(str(old)) == old
    assert repr(NO_POSITION) == 'Position()' and old != '0-5_1-9'


def rent(answer):
    return answer['results'][0]['rows'][0][2]


def set_rent_outside(url, rent):
    """Set the rent of property 1 on the writer of ``url``, outside the
    app (as ``psql`` would); return the writer's position since."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.begin() as connection:
        connection.exec_driver_sql(
            f'UPDATE property SET rent = {rent} WHERE id = 1'
        )
    engine.dispose()
    return position_on(url)


def heard_outside(app, url, rent):
    """:func:`set_rent_outside`, and wait until the app's listener has
    applied the change."""
    listener = app.app.registry.dbtune.listener
    notices = listener.notices
    set_rent_outside(url, rent)
    until(lambda: listener.notices > notices)


def install_triggers(url):
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    triggers.install(engine, {'property': (('area', 'id'), ('rent',))})
    engine.dispose()


def listening_with_replica(primary, standby, apps, methods=(GET,), **settings):
    """An app on ``primary`` that reads from ``standby``, listening; with
    causal reads, once its replica has replayed where the writer was as
    it connected (a listener pins its process's fills there: it did not
    hear what changed before)."""
    install_triggers(primary.url)
    settings = {**LISTEN, 'dbtune.read_urls': standby.url, **settings}
    app = apps(primary.url, list(methods), settings, tables=False)
    dbtune = app.app.registry.dbtune
    assert dbtune.listener.listening.wait(10)
    (reader,) = dbtune.router.readers
    if dbtune.router.positions:  # else the positions are not looked at
        until(lambda: covers(reader, dbtune.router.position()))
    return app


def test_a_change_heard_is_not_filled_from_a_replica_behind(replicated, apps):
    # A change made outside the app, heard of: the cache's next fill of
    # the table comes from a replica that has replayed it, or from the
    # writer, not from the replica that shows the rows before it.
    primary, standby = replicated
    app = listening_with_replica(primary, standby, apps)
    router = app.app.registry.dbtune.router
    (reader,) = router.readers
    heard_outside(app, primary.url, 91)
    assert rent(call(app, ('get', {'id': 1}))) == 91
    assert call(app, ('get', {'id': 1}))['cache']['hit'] == 1
    # Once the replica has replayed it, it fills the cache again.
    until(lambda: covers(reader, router.position()))
    reads = reader.reads
    assert rent(call(app, ('get', {'id': 2}))) == 120
    assert reader.reads == reads + 1


def test_another_processs_commit_heard_is_not_filled_from_behind(
    replicated, apps, memcached
):
    # Two processes share memcached. The first's commit drops the entries
    # it changed. The second may fill them before it hears of the commit
    # (on MySQL, within its listen_every), from the replica behind: as it
    # hears of it (as one of the app's), it drops them again, and fills
    # from a replica that has replayed it, or from the writer.
    primary, standby = replicated
    shared = shared_settings(memcached)
    writer = listening_with_replica(
        primary, standby, apps, (GET, SET_RENT), **shared
    )
    slow = {**shared, 'dbtune.cache.listen_every': '1'}
    filler = listening_with_replica(primary, standby, apps, **slow)
    listener = filler.app.registry.dbtune.listener
    applied = listener.notices  # counted once dropped
    call(writer, ('set_rent', {'id': 1, 'rent': 93}))
    call(filler, ('get', {'id': 1}))  # heard of, or not yet
    until(lambda: listener.notices > applied)
    assert rent(call(filler, ('get', {'id': 1}))) == 93
    assert rent(call(writer, ('get', {'id': 1}))) == 93


@pytest.mark.parametrize('replicated', ['mariadb'], indirect=True)
def test_a_process_started_after_a_change_does_not_fill_from_behind(
    replicated, apps, memcached
):
    # A process that starts while another listens keeps the cache they
    # share; a change made just before, which the other heard of, may not
    # be replayed yet: the new process's fills wait for a replica that has.
    primary, standby = replicated
    shared = shared_settings(memcached)
    first = listening_with_replica(primary, standby, apps, **shared)
    heard_outside(first, primary.url, 95)
    second = apps(
        primary.url, [GET], {**LISTEN, **shared,
                             'dbtune.read_urls': standby.url}, tables=False,
    )  # fmt: skip
    assert second.app.registry.dbtune.listener.listening.wait(10)
    assert rent(call(second, ('get', {'id': 1}))) == 95
    assert rent(call(first, ('get', {'id': 1}))) == 95


@pytest.mark.parametrize('replicated', ['postgresql'], indirect=True)
def test_a_change_heard_pins_fills_by_time_without_causal_reads(
    replicated, apps
):
    # For pin_after_write seconds, the fills alone: a read that is not
    # cached still goes to the replica.
    primary, standby = replicated
    pinned = {'dbtune.causal_reads': 'false', 'dbtune.pin_after_write': '1'}
    app = listening_with_replica(primary, standby, apps, **pinned)
    pins = app.app.registry.dbtune.router.pins
    until(lambda: not pins.by_time({'property'}, fill=True))  # connected
    heard_outside(app, primary.url, 92)
    assert pins.by_time({'property'}, fill=True)
    assert not pins.by_time({'property'})
    assert rent(call(app, ('get', {'id': 1}))) == 92


@pytest.mark.parametrize('replicated', ['mariadb'], indirect=True)
def test_what_changed_before_the_listener_connected_is_not_filled_from_behind(
    replicated, apps
):
    # A listener that connects does not know what changed before: it
    # drops every cached result, and the fills that follow come from a
    # replica that has replayed the writer's position then. (MariaDB's
    # replica is 2 s late: long enough for the app to start.)
    primary, standby = replicated
    install_triggers(primary.url)
    set_rent_outside(primary.url, 94)
    app = apps(
        primary.url, [GET], {**LISTEN, 'dbtune.read_urls': standby.url},
        tables=False,
    )  # fmt: skip
    assert app.app.registry.dbtune.listener.listening.wait(10)
    # On a machine slow enough that the replica has replayed the change
    # by now, this shows nothing, and passes.
    assert rent(call(app, ('get', {'id': 1}))) == 94
