"""Causal reads within one process, on real replication that replays
3 s late (PostgreSQL's streaming, MariaDB's by GTID): long enough that
the replica is still behind through every step, however slow the
machine."""

from webtest import TestApp

from pyramid_dbtune.routing.lag import read_pin
from pyramid_dbtune.routing.work import PIN_COOKIE

from conftest import GET, SET_RENT, call, until

STANDBY_OPTIONS = ['recovery_min_apply_delay=3s']
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


def covers(reader, position):
    """Whether ``reader`` has replayed ``position``, as last seen."""
    return reader.position is not None and reader.position.covers(position)


def rent(answer):
    return answer['results'][0]['rows'][0][2]
