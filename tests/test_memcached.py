"""The shared cache in memcached: real servers on loopback, real OS
processes sharing them, servers killed and restarted mid-load."""

import datetime
import decimal
import functools
import json
import logging
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from pymemcache.client.base import Client
from pyramid.config import Configurator
from pyramid.exceptions import ConfigurationError
from pyramid.scripting import prepare

from pyramid_dbtune import Rows
from pyramid_dbtune.cache import memcached as memcached_module
from pyramid_dbtune.cache import servers
from pyramid_dbtune.cache.codec import sign
from pyramid_dbtune.cache.memcached import decode, encode
from pyramid_dbtune.cache.memory import estimate_size
from pyramid_dbtune.cache.verified import Kept

from conftest import (
    HEADINGLEY,
    SEARCH,
    SECRET,
    SET_RENT,
    Proxy,
    call,
    make_app,
    query_log,
    shared_settings,
)

WORKER = Path(__file__).parent / 'dbtune_worker.py'


def in_another_process(url, settings, *calls, methods=(SEARCH, SET_RENT)):
    job = {
        'url': url,
        'settings': settings,
        'methods': list(methods),
        'calls': [list(c) for c in calls],
    }
    done = subprocess.run(
        [sys.executable, str(WORKER), json.dumps(job)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=WORKER.parent,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def rows_of(answer, index=0):
    return answer['results'][index]['rows']


def test_two_processes_share_hits_and_invalidations(
    postgresql_url, memcached, apps
):
    settings = shared_settings(memcached)
    app = apps(postgresql_url, [SEARCH, SET_RENT], settings)
    first = in_another_process(
        postgresql_url, settings, ('search', {'area': 'Headingley'})
    )
    assert rows_of(first) == HEADINGLEY and first['queries'] == 1
    # This process hits what the other filled, without a query.
    log = query_log(app)
    answer = call(app, ('search', {'area': 'Headingley'}))
    assert rows_of(answer) == HEADINGLEY and answer['cache']['hit'] == 1
    assert log.statements == []
    # A write committed here: the other process's next read is fresh.
    call(app, ('set_rent', {'id': 1, 'rent': 99}))
    after = in_another_process(
        postgresql_url, settings, ('search', {'area': 'Headingley'})
    )
    assert rows_of(after) == [[1, 99], [2, 120]]
    assert after['cache']['miss'] == 1


def test_a_hit_in_process_after_one_fill(sqlite_url, memcached, apps):
    app = apps(sqlite_url, [SEARCH], shared_settings(memcached))
    log = query_log(app)
    for _ in range(3):
        answer = call(app, ('search', {'area': 'Headingley'}))
        assert rows_of(answer) == HEADINGLEY
    assert log.count('FROM property') == 1
    cache = app.app.registry.dbtune.cache
    assert (cache.hits, cache.misses) == (2, 1)


def test_a_hit_of_rows_verified_asks_for_their_generations_alone(
    postgresql_url, memcached, apps
):
    # Rows this process has verified are not read again while no write
    # bumps their generations: a hit asks memcached for those alone.
    settings = shared_settings(memcached)
    app = apps(postgresql_url, [SEARCH, SET_RENT], settings)
    cache = app.app.registry.dbtune.cache
    registered = app.app.registry.dbtune.methods['search']
    params = {'area': 'Headingley'}
    key = (registered.key, ('Headingley',), (str,))
    keys = cache.hit_keys(key, registered.tags(params))
    call(app, ('search', params))  # filled
    call(app, ('search', params))  # a hit, and so verified
    client = Client(('127.0.0.1', memcached.port))
    before = client.stats()
    answer = call(app, ('search', params))
    after = client.stats()
    assert rows_of(answer) == HEADINGLEY and answer['cache']['hit'] == 1
    assert after[b'cmd_get'] - before[b'cmd_get'] == len(keys) - 1
    assert after[b'get_hits'] - before[b'get_hits'] == len(keys) - 1
    # A write by another app (a process of its own, as far as the cache
    # goes) bumps them: the next read here is fresh.
    other = apps(postgresql_url, [SEARCH, SET_RENT], settings, tables=False)
    call(other, ('set_rent', {'id': 1, 'rent': 99}))
    answer = call(app, ('search', params))
    assert rows_of(answer) == [[1, 99], [2, 120]]
    assert answer['cache']['miss'] == 1
    # Asked for the generations, then for the entry with them; the rows
    # filled then are read whole once, then told by their generations.
    for _ in range(2):
        assert call(app, ('search', params))['cache']['hit'] == 1
    assert client.stats()[b'cmd_get'] - after[b'cmd_get'] == 3 * len(keys) + 2
    client.close()


def test_what_a_kept_entry_is_told_by_counts_in_max_bytes():
    # Its rows, and the generations' keys and values a hit compares.
    rows = one_row('x')
    entry, answer = (rows, {'t': 1}, 9e99), {'dbtune:1:g:' + 'a' * 24: b'1'}
    for room, kept_entries in ((0, 0), (1000, 1)):
        kept = Kept(10, estimate_size((), rows) + room)
        kept.keep('e', b'signature', entry, answer, kept.emptied)
        assert len(kept) == kept_entries


def test_a_read_after_a_write_does_not_decode_the_rows_it_drops(
    postgresql_url, memcached, apps, monkeypatch
):
    # The rows kept here are known by their signature: found dropped by
    # a write, they are not checked and decoded again only to be dropped.
    settings = shared_settings(memcached)
    app = apps(postgresql_url, [SEARCH, SET_RENT], settings)
    cache = app.app.registry.dbtune.cache
    params = {'area': 'Headingley'}
    for _ in range(2):  # filled, then verified
        call(app, ('search', params))
    decoded = []
    monkeypatch.setattr(
        memcached_module,
        'decode',
        lambda payload: decoded.append(payload) or decode(payload),
    )
    other = apps(postgresql_url, [SEARCH, SET_RENT], settings, tables=False)
    call(other, ('set_rent', {'id': 1, 'rent': 99}))
    answer = call(app, ('search', params))
    assert answer['cache']['miss'] == 1 and decoded == []
    assert cache.dropped == {app.app.registry.dbtune.methods['search'].key: 1}


def test_a_generation_memcached_padded_is_started_again(
    sqlite_url, memcached, apps
):
    # memcached pads a counter that a foreign write made shorter with
    # spaces: read as a number, it would never be the same bytes as what
    # a hit compares it with. It is started again instead.
    cache = shared_cache(sqlite_url, memcached, apps)
    key, tables = ('k', (4,), (int,)), frozenset(['t'])

    def read():
        return cache.get_or_fill(key, 60, tables, lambda: one_row(4))[1]

    assert [read(), read()] == ['miss', 'hit']
    client = Client(('127.0.0.1', memcached.port), default_noreply=False)
    generation = cache.hit_keys(key, tables)[1]
    client.set(generation, b'1000')
    client.set(generation, b'999 ')  # as incr leaves 1000 - 1, say
    assert read() == 'miss' and cache.rejected == 1
    assert [read(), read()] == ['miss', 'hit']
    before = client.stats()[b'cmd_get']
    assert read() == 'hit'
    after = client.stats()[b'cmd_get']
    assert after - before == len(cache.hit_keys(key, tables)) - 1
    client.close()


def test_a_read_between_an_unknown_writes_steps_keeps_nothing(
    sqlite_url, memcached, apps
):
    # A read of rows no write invalidates runs while an unknown write
    # empties this process's copies and bumps the epoch: whichever it
    # meets first, nothing it found is served after the write returns.
    lagging = {**SEARCH, 'name': 'lagging', 'invalidate': False}
    ddl = {'name': 'touch', 'sql': 'CREATE TABLE other (x INTEGER)'}
    app = apps(sqlite_url, [lagging, ddl], shared_settings(memcached))
    cache = app.app.registry.dbtune.cache
    params = {'area': 'Headingley'}
    call(app, ('lagging', params))  # filled
    clear = cache.kept.clear

    def read_while_clearing():
        clear()
        # In another request's thread, as the write's invalidation runs.
        reading = threading.Thread(
            target=call, args=(app, ('lagging', params))
        )
        reading.start()
        reading.join(10)

    cache.kept.clear = read_while_clearing
    call(app, ('touch', {}))
    cache.kept.clear = clear
    assert len(cache.kept) == 0
    # What the read in between found is not served from here.
    call(app, ('lagging', params))
    assert cache.near_hits == 0


def test_memcached_killed_mid_load_then_back(sqlite_url, memcached, apps):
    app = apps(sqlite_url, [SEARCH], shared_settings(memcached))
    cache = app.app.registry.dbtune.cache
    areas = ['Headingley', 'Burley', 'Hyde Park']
    expected = {
        'Headingley': HEADINGLEY,
        'Burley': [[4, 70]],
        'Hyde Park': [[3, 80]],
    }
    wrong = []

    def load(count):
        for i in range(count):
            area = areas[i % 3]
            answer = call(app, ('search', {'area': area}))
            if rows_of(answer) != expected[area]:  # pragma: no cover
                wrong.append(answer)

    load(100)
    assert cache.hits > 90
    worker = threading.Thread(target=load, args=(400,))
    worker.start()
    memcached.stop()  # in the middle of the 500
    worker.join()
    assert wrong == []
    assert cache.errors >= 1
    hits = cache.hits
    memcached.start()  # an empty memcached, on the same port
    time.sleep(0.3)  # its dead_retry (0.2 s) runs out
    load(30)
    assert wrong == [] and cache.hits > hits


def test_a_forged_entry_is_rejected_and_never_decoded(
    sqlite_url, memcached, apps, monkeypatch
):
    app = apps(sqlite_url, [SEARCH], shared_settings(memcached))
    cache = app.app.registry.dbtune.cache
    call(app, ('search', {'area': 'Headingley'}))
    # Replies awaited: each forgery is in place before the next read.
    client = Client(('127.0.0.1', memcached.port), default_noreply=False)
    prefix = app.app.registry.dbtune.methods['search'].key
    name = cache.entry_key((prefix, ('Headingley',), (str,)))
    genuine = client.get(name)
    decoded = []
    monkeypatch.setattr(
        memcached_module,
        'decode',
        lambda payload: decoded.append(payload) or decode(payload),
    )
    payload = genuine[32:].replace(b'90', b'1')
    for forged in (
        b'\0' * 32 + payload,  # a signature that does not match
        genuine[:-5],  # truncated
        genuine[:32],  # nothing but a signature
        b'garbage',
        b'',
    ):
        # What another process reads: rows it has not verified.
        cache.kept.clear()
        client.set(name, forged)
        answer = call(app, ('search', {'area': 'Headingley'}))
        assert rows_of(answer) == HEADINGLEY
    assert cache.rejected == 5
    assert decoded == [] or all(d != payload for d in decoded)
    client.close()


def test_values_over_the_item_limit_are_not_stored(
    sqlite_url, memcached, apps
):
    settings = shared_settings(memcached, **{'dbtune.cache.item_limit': '64'})
    app = apps(sqlite_url, [SEARCH], settings)
    log = query_log(app)
    call(app, ('search', {'area': 'Headingley'}))
    call(app, ('search', {'area': 'Headingley'}))
    assert log.count('FROM property') == 2
    assert app.app.registry.dbtune.cache.too_big == 2


def test_an_entry_memcached_would_refuse_is_too_big_not_an_outage(
    sqlite_url, memcached, apps, caplog
):
    # memcached's 1 MiB counts the key and its item header too: an entry
    # of a little under 1 MiB is not sent, to be refused as an error.
    cache = shared_cache(sqlite_url, memcached, apps)
    key, tables = ('k', (9,), (int,)), frozenset(['t'])
    empty = len(encode(Rows(['x'], [('',)]), {'t': 2**47, 'e': 2**47}, 1e9))
    rows = Rows(['x'], [('a' * (2**20 - 32 - empty - 40),)])
    for _ in range(2):
        assert cache.get_or_fill(key, 60, tables, lambda: rows)[1] == 'miss'
    assert (cache.too_big, cache.errors) == (2, 0)
    assert 'failed' not in caplog.text


def test_two_servers_share_the_keys_and_losing_one_loses_its_share(
    sqlite_url, memcached, memcached2, apps
):
    one = {'name': 'one', 'sql': 'SELECT :n AS n', 'cache_time': 60}
    app = apps(sqlite_url, [one], shared_settings(memcached, memcached2))
    request = prepare(registry=app.app.registry)['request']
    for n in range(40):
        request.sql.one(n=n)
    assert memcached.items() > 10 and memcached2.items() > 10
    memcached2.stop()
    request = prepare(registry=app.app.registry)['request']
    for n in range(40):
        assert request.sql.one(n=n)[0].n == n
    counts = request.dbtune.cache
    # The keys on the server still up are still hits; the rest miss.
    assert counts['hit'] > 10 and counts['miss'] > 10


@pytest.mark.parametrize(
    'settings, message',
    [
        (
            {'dbtune.cache.servers': '127.0.0.1:11211'},
            'needs dbtune.cache.secret: a shared cache must be signed',
        ),
        ({'dbtune.cache.secret': SECRET}, 'needs dbtune.cache.servers'),
        (
            {
                'dbtune.cache.servers': 'localhost',
                'dbtune.cache.secret': SECRET,
            },
            'host:port items',
        ),
        (
            {
                'dbtune.cache.servers': '127.0.0.1:11211',
                'dbtune.cache.secret': 'short',
            },
            '16 characters or more',
        ),
    ],
)
def test_bad_memcached_settings_stop_start_up(settings, message):
    config = Configurator(
        settings={'dbtune.cache.backend': 'memcached', **settings}
    )
    with pytest.raises(ConfigurationError, match=message):
        config.include('pyramid_dbtune')


def test_cache_times_over_thirty_days_are_refused(sqlite_url, memcached):
    long = {**SEARCH, 'cache_time': 31 * 24 * 3600}
    with pytest.raises(ConfigurationError, match='more than memcached keeps'):
        make_app(sqlite_url, [long], shared_settings(memcached))


def test_the_row_codec_keeps_every_sql_value():
    values = (
        None,
        True,
        3,
        1.5,
        'text',
        b'\x00bytes',
        decimal.Decimal('1.10'),
        datetime.date(2026, 9, 1),
        datetime.datetime(2026, 9, 1, 12, 30),
        datetime.time(12, 30),
        datetime.timedelta(days=1, seconds=5),
        uuid.UUID(int=7),
        {'json': [1, 2]},
        [1, 2],
        (3, 'a'),  # a PostgreSQL record
        # psycopg's timestamptz: in the session's zone, summer time and all
        datetime.datetime(2024, 3, 1, 9, tzinfo=ZoneInfo('Europe/London')),
        datetime.datetime(2024, 3, 1, 9, tzinfo=datetime.timezone.utc),
    )
    rows = Rows([f'c{i}' for i in range(len(values))], [values])
    back, generations, expires = decode(encode(rows, {'t': 5}, 9.5))
    assert back.tuples()[0] == values
    assert [type(v) for v in back[0]] == [type(v) for v in values]
    assert [getattr(v, 'tzinfo', None) for v in back[0]] == [
        getattr(v, 'tzinfo', None) for v in values
    ]
    later = back[0][-2] + datetime.timedelta(days=60)
    assert later.isoformat() == '2024-04-30T09:00:00+01:00'
    assert (generations, expires) == ({'t': 5}, 9.5)


def test_rows_the_codec_cannot_share_are_not_stored(
    sqlite_url, memcached, apps
):
    app = apps(sqlite_url, [], shared_settings(memcached))
    cache = app.app.registry.dbtune.cache
    odd = Rows(['x'], [(object(),)])
    key = ('k', (1,), (int,))
    for _ in range(2):
        assert (
            cache.get_or_fill(key, 60, frozenset(), lambda: odd)[1] == 'miss'
        )
    assert cache.unencodable == 2


def slow_fill_elsewhere(sqlite_url, memcached, apps, key, ttl, rows):
    """Another cache on ``memcached`` (as another process's) filling
    ``key``: it holds the fill lock until the returned event is set, then
    stores ``rows``."""
    other = apps(sqlite_url, [], shared_settings(memcached), tables=False)
    started, release = threading.Event(), threading.Event()

    def slow():
        started.set()
        release.wait(10)
        return rows

    filling = threading.Thread(
        target=other.app.registry.dbtune.cache.get_or_fill,
        args=(key, ttl, frozenset(['t']), slow),
    )
    filling.start()
    assert started.wait(10)
    return release, filling


def test_waiting_for_another_process_fill(sqlite_url, memcached, apps):
    app = apps(sqlite_url, [], shared_settings(memcached))
    cache = app.app.registry.dbtune.cache
    key, rows = ('k', (1,), (int,)), Rows(['x'], [(1,)])
    # Another process holds the fill lock, and stores its rows soon.
    release, filling = slow_fill_elsewhere(
        sqlite_url, memcached, apps, key, 60, rows
    )
    threading.Timer(0.1, release.set).start()
    got = cache.get_or_fill(key, 60, frozenset(['t']), lambda: 1 / 0)
    assert got == (rows, 'waited')
    filling.join(10)


def test_stale_while_another_process_refreshes(sqlite_url, memcached, apps):
    app = apps(sqlite_url, [], shared_settings(memcached))
    cache = app.app.registry.dbtune.cache
    key = ('k', (1,), (int,))
    old = Rows(['x'], [(1,)])
    cache.get_or_fill(key, 0.01, frozenset(['t']), lambda: old)
    time.sleep(0.05)  # expired: kept in memcached past its time
    release, filling = slow_fill_elsewhere(
        sqlite_url, memcached, apps, key, 60, Rows(['x'], [(2,)])
    )
    try:
        got = cache.get_or_fill(key, 60, frozenset(['t']), lambda: 1 / 0)
        assert got == (old, 'stale')
    finally:
        release.set()
        filling.join(10)


def test_an_old_entry_put_back_is_not_served_past_its_keeping(
    sqlite_url, memcached, apps
):
    # Whoever reaches memcached can put back an entry and the generations
    # it was read with, as they were before a write: its signature holds.
    # While another process holds the fill lock (another unsigned key), it
    # is not served, stale or waited for, past the time memcached would
    # have kept it (kept_for: one second for a fifth of a second).
    app = apps(sqlite_url, [], shared_settings(memcached))
    cache = app.app.registry.dbtune.cache
    key, tables = ('k', (3,), (int,)), frozenset(['t'])
    cache.get_or_fill(key, 0.2, tables, lambda: one_row('old'))
    attacker = Client(('127.0.0.1', memcached.port), default_noreply=False)
    try:
        saved = attacker.get_many(cache.hit_keys(key, tables))
        assert len(saved) == 3
        cache.invalidate(tables)  # a write
        time.sleep(1.1)  # memcached has dropped the entry
        attacker.set_many(saved, expire=60)
    finally:
        attacker.close()
    release, filling = slow_fill_elsewhere(
        sqlite_url, memcached, apps, key, 0.2, one_row('elsewhere')
    )
    try:
        got = cache.get_or_fill(key, 0.2, tables, lambda: one_row('new'))
        assert got == (one_row('new'), 'miss')
    finally:
        release.set()
        filling.join(10)


def test_an_entry_is_kept_as_long_again_past_its_time():
    # So that one process refreshes it while the others are served it;
    # never past memcached's 30 days, which it would read as a date.
    assert memcached_module.kept_for(10) == 21
    assert memcached_module.kept_for(0.01) == 1
    assert memcached_module.kept_for(20 * 24 * 3600) == 30 * 24 * 3600


def test_a_lock_held_with_no_fill_coming_fills_itself(
    sqlite_url, memcached, apps
):
    app = apps(sqlite_url, [], shared_settings(memcached))
    cache = app.app.registry.dbtune.cache
    key, rows = ('k', (2,), (int,)), Rows(['x'], [(2,)])
    # Another process holds the fill lock, and stores nothing for longer
    # than a read waits (half a second).
    release, filling = slow_fill_elsewhere(
        sqlite_url, memcached, apps, key, 60, Rows(['x'], [(3,)])
    )
    try:
        got = cache.get_or_fill(key, 60, frozenset(['t']), lambda: rows)
        assert got == (rows, 'miss')
    finally:
        release.set()
        filling.join(10)


def test_a_fill_that_failed_lets_the_next_read_fill_at_once(
    sqlite_url, memcached, apps
):
    # Another process's fill failed (its database went away, say): the
    # next read, there or here, does not wait for the lock it took.
    cache = shared_cache(sqlite_url, memcached, apps)
    other = apps(sqlite_url, [], shared_settings(memcached), tables=False)
    other = other.app.registry.dbtune.cache
    key, tables = ('k', (4,), (int,)), frozenset(['t'])
    with pytest.raises(ZeroDivisionError):
        other.get_or_fill(key, 60, tables, lambda: 1 / 0)
    client = Client(('127.0.0.1', memcached.port))
    before = client.stats()[b'cmd_get']
    got = cache.get_or_fill(key, 60, tables, lambda: one_row('x'))
    assert got == (one_row('x'), 'miss')
    # The keys of its read, once; no asking again for another's rows.
    gets = client.stats()[b'cmd_get'] - before
    assert gets == len(cache.hit_keys(key, tables))
    client.close()


def test_rows_that_cannot_be_stored_keep_nobody_waiting(
    sqlite_url, memcached, apps
):
    # Another process fills rows the codec cannot share: once it has,
    # a read waiting for them fills at once, not half a second later.
    cache = shared_cache(sqlite_url, memcached, apps)
    key, tables = ('k', (5,), (int,)), frozenset(['t'])
    release, filling = slow_fill_elsewhere(
        sqlite_url, memcached, apps, key, 60, Rows(['x'], [(object(),)])
    )
    client = Client(('127.0.0.1', memcached.port))
    before = client.stats()[b'cmd_get']
    got = []
    reading = threading.Thread(
        target=lambda: got.append(
            cache.get_or_fill(key, 60, tables, lambda: one_row('mine'))
        )
    )
    reading.start()
    read = len(cache.hit_keys(key, tables))
    deadline = time.monotonic() + 10
    while client.stats()[b'cmd_get'] - before <= read:  # it waits
        assert time.monotonic() < deadline
    release.set()
    filling.join(10)
    reading.join(10)
    assert got == [(one_row('mine'), 'miss')]
    # A few asks of its entry and the lock (two keys each), where half a
    # second's wait asks 24 times.
    asked = client.stats()[b'cmd_get'] - before - read
    assert 2 <= asked < 16, asked
    client.close()


def test_threads_of_one_process_share_one_fill(sqlite_url, memcached, apps):
    app = apps(sqlite_url, [], shared_settings(memcached))
    cache = app.app.registry.dbtune.cache
    started, release = threading.Event(), threading.Event()
    rows = Rows(['x'], [(3,)])

    def slow():
        started.set()
        release.wait(10)
        return rows

    key = ('k', (3,), (int,))
    results = []
    leader = threading.Thread(
        target=lambda: results.append(
            cache.get_or_fill(key, 60, frozenset(), slow)
        )
    )
    leader.start()
    started.wait(10)
    follower = threading.Thread(
        target=lambda: results.append(
            cache.get_or_fill(key, 60, frozenset(), lambda: 1 / 0)
        )
    )
    follower.start()
    while not cache.waited:
        time.sleep(0.005)
    release.set()
    leader.join()
    follower.join()
    assert sorted(status for _, status in results) == ['miss', 'waited']


def test_invalidate_all_and_after_fork(sqlite_url, memcached, apps):
    app = apps(sqlite_url, [SEARCH], shared_settings(memcached))
    cache = app.app.registry.dbtune.cache
    log = query_log(app)
    call(app, ('search', {'area': 'Headingley'}))
    cache.invalidate(None)
    call(app, ('search', {'area': 'Headingley'}))
    assert log.count('FROM property') == 2
    servers = cache.by_address
    cache.after_fork()
    assert cache.by_address is not servers and len(cache.kept) == 0
    call(app, ('search', {'area': 'Headingley'}))
    assert log.count('FROM property') == 2


def test_deep_check_reports_memcached_down(sqlite_url, memcached):
    from webtest import TestApp

    from pyramid_dbtune.fastpath import deep_check, wrap

    config = Configurator(
        settings={'dbtune.url': sqlite_url, **shared_settings(memcached)}
    )
    config.include('pyramid_dbtune')
    pyramid_app = config.make_wsgi_app()
    check = wrap(pyramid_app, {'/h': lambda e: deep_check(e, reuse=0)})
    app = TestApp(check)
    assert app.get('/h').body == b'OK\n'
    memcached.stop()
    assert app.get('/h', status=503).body.startswith(b'cache unavailable')
    pyramid_app.registry.dbtune.router.dispose()


def test_deep_check_names_memcached_when_it_hangs(sqlite_url, silent_server):
    from webtest import TestApp

    from pyramid_dbtune.fastpath import deep_check, wrap

    config = Configurator(
        settings={
            'dbtune.url': sqlite_url,
            'dbtune.cache.backend': 'memcached',
            'dbtune.cache.servers': f'127.0.0.1:{silent_server}',
            'dbtune.cache.secret': SECRET,
            'dbtune.cache.timeout': '5',
        }
    )
    config.include('pyramid_dbtune')
    pyramid_app = config.make_wsgi_app()
    quick = functools.partial(deep_check, timeout=0.2, reuse=0)
    app = TestApp(wrap(pyramid_app, {'/h': quick}))
    # The database answers; memcached takes the connection and says nothing.
    assert app.get('/h', status=503).body == (
        b'cache did not answer within 0.2 s\n'
    )
    pyramid_app.registry.dbtune.router.dispose()


@pytest.mark.parametrize('read_first', [False, True])
def test_a_server_that_missed_an_invalidation_drops_its_entries(
    sqlite_url, memcached, apps, read_first
):
    proxy = Proxy(memcached.port)
    settings = {
        **shared_settings(memcached),
        'dbtune.cache.servers': proxy.address,
    }
    app = apps(sqlite_url, [SEARCH, SET_RENT], settings)
    call(app, ('search', {'area': 'Headingley'}))
    proxy.cut()  # memcached keeps its entries, but cannot be reached
    try:
        if read_first:  # the failed read sets the server aside
            call(app, ('search', {'area': 'Headingley'}))
        call(app, ('set_rent', {'id': 1, 'rent': 99}))
        # Still cut: answered from the database, and correctly.
        answer = call(app, ('search', {'area': 'Headingley'}))
        assert rows_of(answer) == [[1, 99], [2, 120]]
    finally:
        proxy.mend()
    time.sleep(0.3)  # the client's dead_retry (0.2 s) runs out
    answer = call(app, ('search', {'area': 'Headingley'}))
    assert rows_of(answer) == [[1, 99], [2, 120]]
    proxy.cut()


def test_generations_cannot_be_told_without_a_server(
    sqlite_url, memcached, apps
):
    app = apps(sqlite_url, [], shared_settings(memcached))
    cache = app.app.registry.dbtune.cache
    assert cache._generations(None, cache._tables(['t'])[0], {}) is None


def test_the_memo_is_bounded(sqlite_url, memcached, apps):
    # dbtune.cache.max_entries bounds the entries each process keeps.
    settings = shared_settings(memcached, **{'dbtune.cache.max_entries': 1})
    app = apps(sqlite_url, [SEARCH], settings)
    cache = app.app.registry.dbtune.cache
    for area in ('Headingley', 'Burley', 'Headingley', 'Burley'):
        call(app, ('search', {'area': area}))
    assert len(cache.kept) == 1 and cache.hits == 2


def test_in_process_waiters_get_stale_rows_or_the_fill_error(
    sqlite_url, memcached, apps
):
    app = apps(sqlite_url, [], shared_settings(memcached))
    cache = app.app.registry.dbtune.cache
    key = ('k', (9,), (int,))
    old = Rows(['x'], [(9,)])
    cache.get_or_fill(key, 0.01, frozenset(), lambda: old)
    time.sleep(0.05)
    started, release = threading.Event(), threading.Event()

    def failing():
        started.set()
        release.wait(10)
        raise RuntimeError('database down')

    errors = []

    def lead():
        try:
            cache.get_or_fill(key, 60, frozenset(), failing)
        except RuntimeError as exc:
            errors.append(exc)

    leader = threading.Thread(target=lead)
    leader.start()
    started.wait(10)
    assert cache.get_or_fill(key, 60, frozenset(), lambda: 1 / 0) == (
        old,
        'stale',
    )
    release.set()
    leader.join()
    assert [str(e) for e in errors] == ['database down']


def test_arrays_of_values_json_cannot_carry_are_not_shared():
    from pyramid_dbtune.cache.memcached import Unencodable

    with pytest.raises(Unencodable):
        encode(Rows(['a'], [([datetime.date(2026, 1, 1)],)]), {}, 0)


def test_a_missed_server_that_cannot_take_its_epoch_bump_is_a_miss(
    sqlite_url, memcached, apps
):
    app = apps(sqlite_url, [], shared_settings(memcached))
    cache = app.app.registry.dbtune.cache
    server = cache._server('x')
    cache._missed[server.address] = 1
    memcached.stop()
    assert cache._on(server, 'default', 'get', 'x') == 'default'
    assert server.address in cache._missed


def test_with_every_server_taken_out_reads_are_misses(
    sqlite_url, memcached, apps
):
    settings = shared_settings(memcached, **{'dbtune.cache.dead_retry': '30'})
    app = apps(sqlite_url, [SEARCH], settings)
    cache = app.app.registry.dbtune.cache
    memcached.stop()
    answer = call(app, ('search', {'area': 'Headingley'}))  # it fails
    assert rows_of(answer) == HEADINGLEY
    # The failed server is set aside for dead_retry (30 s): none is left.
    assert cache._server('anything') is None
    answer = call(app, ('search', {'area': 'Headingley'}))
    assert rows_of(answer) == HEADINGLEY


def test_key_and_route_memos_are_bounded(
    sqlite_url, memcached, apps, monkeypatch
):
    monkeypatch.setattr(memcached_module, 'MEMO_SIZE', 0)
    app = apps(sqlite_url, [SEARCH], shared_settings(memcached))
    cache = app.app.registry.dbtune.cache
    for area in ('Headingley', 'Burley', 'Headingley'):
        call(app, ('search', {'area': area}))
    assert len(cache._names) <= 1 and len(cache._routes) <= 1
    assert cache.hits == 1


# Damaged or failing servers, through a proxy between the cache and
# memcached.


def test_a_server_error_is_a_miss_not_an_outage(sqlite_url, memcached, apps):
    proxy = Proxy(memcached.port)
    app = apps(sqlite_url, [SEARCH], shared_settings(proxy))
    cache = app.app.registry.dbtune.cache
    for _ in range(2):  # filled, then verified
        call(app, ('search', {'area': 'Headingley'}))
    proxy.mangle = lambda data: [b'SERVER_ERROR out of memory\r\n']
    for _ in range(3):
        answer = call(app, ('search', {'area': 'Headingley'}))
        assert rows_of(answer) == HEADINGLEY
    # Its generations are asked for once a read, not again with the
    # entry; then its fill's lock is taken and let go (three calls).
    assert cache.errors == 3 * 3
    # The server answered: it is not set aside as unreachable.
    assert [s.down_until for s in cache.by_address.values()] == [0.0]
    proxy.cut()


def test_a_damaged_reply_on_the_hit_path_is_a_miss(
    sqlite_url, memcached, apps
):
    proxy = Proxy(memcached.port)
    app = apps(sqlite_url, [SEARCH], shared_settings(proxy))
    cache = app.app.registry.dbtune.cache
    assert rows_of(call(app, ('search', {'area': 'Headingley'}))) == (
        HEADINGLEY
    )
    proxy.mangle = lambda data: [data.replace(b'VALUE', b'VALUX')]
    assert rows_of(call(app, ('search', {'area': 'Headingley'}))) == (
        HEADINGLEY
    )
    assert cache.errors == 1
    proxy.cut()


def test_a_read_that_does_not_invalidate_is_kept_in_every_process(
    sqlite_url, memcached, apps
):
    lagging = {**SEARCH, 'name': 'lagging', 'invalidate': False}
    settings = shared_settings(memcached)
    app = apps(sqlite_url, [SEARCH, lagging, SET_RENT], settings)
    headingley = {'area': 'Headingley'}
    call(app, ('search', headingley), ('lagging', headingley))
    in_another_process(
        sqlite_url,
        settings,
        ['set_rent', {'id': 1, 'rent': 95}],
        methods=(SEARCH, lagging, SET_RENT),
    )
    answer = call(app, ('search', headingley), ('lagging', headingley))
    assert rows_of(answer, 0) == [[1, 95], [2, 120]]
    assert rows_of(answer, 1) == HEADINGLEY


def test_tables_may_be_any_iterable(sqlite_url, memcached, apps):
    app = apps(sqlite_url, [], shared_settings(memcached))
    cache = app.app.registry.dbtune.cache
    key = ('prefix', (1,), (int,))
    rows = Rows(['a'], [(1,)])
    assert cache.get_or_fill(key, 10, ['t'], lambda: rows)[1] == 'miss'
    assert cache.get_or_fill(key, 10, ('t',), lambda: rows)[1] == 'hit'


def test_a_read_no_write_invalidates_is_served_from_the_process(
    sqlite_url, memcached, apps, monkeypatch
):
    lagging = {**SEARCH, 'name': 'lagging', 'invalidate': False}
    settings = shared_settings(memcached)
    app = apps(sqlite_url, [SEARCH, lagging, SET_RENT], settings)
    cache = app.app.registry.dbtune.cache
    headingley = {'area': 'Headingley'}
    call(app, ('lagging', headingley))  # a miss: filled, stored
    call(app, ('lagging', headingley))  # a hit in memcached, verified
    memcached.stop()  # no round trip can be made from here on
    answer = call(app, ('lagging', headingley), ('search', headingley))
    assert rows_of(answer, 0) == HEADINGLEY and cache.near_hits == 1
    assert answer['cache']['hit'] == 1  # the search missed: no memcached
    # Until the rows' time runs out (20 s), then they are asked for again.
    now = time.time()
    monkeypatch.setattr(memcached_module.time, 'time', lambda: now + 21)
    answer = call(app, ('lagging', headingley))
    assert answer['cache']['miss'] == 1 and cache.near_hits == 1


def test_an_unknown_write_drops_the_process_copies(
    sqlite_url, memcached, apps
):
    lagging = {**SEARCH, 'name': 'lagging', 'invalidate': False}
    ddl = {'name': 'touch', 'sql': 'CREATE TABLE other (x INTEGER)'}
    app = apps(sqlite_url, [lagging, ddl], shared_settings(memcached))
    cache = app.app.registry.dbtune.cache
    for _ in range(2):
        call(app, ('lagging', {'area': 'Headingley'}))
    assert len(cache.kept) == 1
    call(app, ('touch', {}))
    assert len(cache.kept) == 0
    answer = call(app, ('lagging', {'area': 'Headingley'}))
    assert answer['cache']['miss'] == 1 and cache.near_hits == 0


def _entry_of(cell):
    """A payload the codec's reader takes for an entry, ``cell`` its one
    value: signed with the right secret, as another version could write."""
    return (
        '{"c":["x"],"r":[[' + cell + ']],"t":false,"g":[],"e":9e99}'
    ).encode()


@pytest.mark.parametrize(
    'payload',
    [
        _entry_of('{"$d":"not a number"}'),  # decimal.InvalidOperation
        _entry_of('{"$i":[1e10,0,0]}'),  # OverflowError
        _entry_of('{"$D":"2026-13-45"}'),
        _entry_of('{"$z":1}'),
        _entry_of('{"$t":5}'),
        _entry_of('{"$u":"xyz"}'),
        b'{"c":5,"r":[],"t":false,"g":[],"e":0}',
        b'[' * 100_000 + b']' * 100_000,  # RecursionError
        b'\xff\xfe',
        b'{"not": "rows"',
    ],
)
def test_a_signed_entry_that_does_not_decode_is_a_miss(
    sqlite_url, memcached, apps, caplog, payload
):
    app = apps(sqlite_url, [SEARCH], shared_settings(memcached))
    cache = app.app.registry.dbtune.cache
    call(app, ('search', {'area': 'Headingley'}))
    prefix = app.app.registry.dbtune.methods['search'].key
    name = cache.entry_key((prefix, ('Headingley',), (str,)))
    client = Client(('127.0.0.1', memcached.port), default_noreply=False)
    cache.kept.clear()
    for _ in range(2):
        client.set(name, sign(SECRET.encode(), name, payload))
        # From the database, every time: 200, not a 500.
        answer = call(app, ('search', {'area': 'Headingley'}))
        assert rows_of(answer) == HEADINGLEY
    assert cache.rejected == 2
    said = [r for r in caplog.records if 'did not decode' in r.getMessage()]
    assert len(said) == 1  # once, not once a read
    client.close()


def test_large_arguments_are_not_kept_by_the_key_memo(
    sqlite_url, memcached, apps
):
    """150 cached reads whose argument is 1 MB each: the memcached backend
    keeps at most 4 MB more than before them (its memo of keys would
    keep every argument)."""
    from conftest import kept_by_large_calls

    settings = shared_settings(memcached, **{'dbtune.cache.max_bytes': '1MiB'})
    kept = kept_by_large_calls(apps(sqlite_url, [SEARCH], settings))
    assert kept <= 4 * 2**20, f'{kept / 2**20:.1f} MiB kept'


def test_entries_kept_decoded_are_bounded_by_max_bytes(
    sqlite_url, memcached, apps
):
    """40 entries of 300 KB each, read twice (the second read keeps it
    decoded): a process bound to 1 MiB keeps at most about that."""
    import gc
    import tracemalloc

    settings = shared_settings(memcached, **{'dbtune.cache.max_bytes': '1MiB'})
    cache = apps(sqlite_url, [], settings).app.registry.dbtune.cache
    tables = frozenset(['t'])

    def read(n):
        return cache.get_or_fill(
            ('k', (n,), (int,)), 60, tables, lambda: one_row(f'{n}' * 300_000)
        )

    read(-1), read(-1)  # warm
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(40):
            read(n)
            assert read(n)[1] == 'hit'
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept <= 2 * 2**20, f'{kept / 2**20:.1f} MiB kept'


def test_an_entry_larger_than_max_bytes_is_not_kept_decoded(
    sqlite_url, memcached, apps
):
    settings = shared_settings(memcached, **{'dbtune.cache.max_bytes': '4KB'})
    cache = apps(sqlite_url, [], settings).app.registry.dbtune.cache

    def read(n, size):  # a read no write drops: served from the process
        rows = one_row('x' * size)
        return cache.get_or_fill(
            ('k', (n,), (int,)), 60, frozenset(), lambda: rows
        )

    read(1, 10), read(1, 10)  # filled, then kept
    for _ in range(3):
        read(2, 10_000)
    # The large one, not kept, did not push the small one out.
    assert cache.near_hits == 0
    read(1, 10)
    assert cache.near_hits == 1


def writer_through_a_proxy(url, memcached, apps):
    """A proxy to memcached, an app that writes through it, and one that
    reads memcached directly: two processes, as far as caches go."""
    proxy = Proxy(memcached.port)
    through = shared_settings(
        memcached, **{'dbtune.cache.servers': proxy.address}
    )
    writer = apps(url, [SEARCH, SET_RENT], through)
    reader = apps(url, [SEARCH], shared_settings(memcached), tables=False)
    return proxy, writer, reader


def test_a_missed_invalidation_is_made_good_while_its_process_idles(
    sqlite_url, memcached, apps
):
    # The writer reaches memcached through a proxy, cut while it commits:
    # the reader (another process, as far as caches go) serves the old
    # rows while it is cut. Once memcached answers again, the writer's
    # own thread bumps the epoch, though the writer serves no request.
    proxy, writer, reader = writer_through_a_proxy(sqlite_url, memcached, apps)
    search = ('search', {'area': 'Headingley'})
    assert rows_of(call(reader, search)) == [[1, 90], [2, 120]]
    proxy.cut()
    try:
        call(writer, ('set_rent', {'id': 1, 'rent': 99}))
        assert rows_of(call(reader, search)) == [[1, 90], [2, 120]]
    finally:
        proxy.mend()
    mended = time.monotonic()
    while rows_of(call(reader, search)) != [[1, 99], [2, 120]]:
        # A hang, not a slow answer, fails here: the entry lives 20 s.
        assert time.monotonic() - mended < 15, 'the reader stayed stale'
        time.sleep(0.02)
    print(f'fresh {time.monotonic() - mended:.2f} s after memcached answered')
    proxy.cut()


def test_a_missed_invalidation_given_up_waits_for_the_next_use(
    sqlite_url, memcached, apps, monkeypatch, caplog
):
    monkeypatch.setattr(servers, 'MEND_EVERY', 0.02)
    monkeypatch.setattr(servers, 'MEND_FOR', 0.1)
    proxy, writer, reader = writer_through_a_proxy(sqlite_url, memcached, apps)
    search = ('search', {'area': 'Headingley'})
    call(reader, search)
    proxy.cut()
    call(writer, ('set_rent', {'id': 1, 'rent': 98}))
    call(writer, ('set_rent', {'id': 1, 'rent': 99}))  # one thread mends
    deadline = time.monotonic() + 15
    while 'not made good in' not in caplog.text:
        assert time.monotonic() < deadline, caplog.text
        time.sleep(0.02)
    said = f'memcached {proxy.address}: missed invalidation not made good'
    assert said in caplog.text
    proxy.mend()
    time.sleep(0.3)  # the client's dead_retry (0.2 s) runs out
    assert rows_of(call(reader, search)) == [[1, 90], [2, 120]]  # stale
    call(writer, search)  # its next use of the server bumps the epoch
    assert rows_of(call(reader, search)) == [[1, 99], [2, 120]]
    proxy.cut()


def write_cut_off(proxy, cache, tables):
    """A write whose invalidation ``proxy`` cuts off: missed."""
    proxy.cut()
    cache.invalidate(tables)
    proxy.mend()


def test_a_write_missed_while_another_is_made_good_is_not_lost(
    sqlite_url, memcached, apps, monkeypatch
):
    # The writer's epoch bump for its first missed write is under way in
    # one thread when another thread's write misses: the second is made
    # good by a bump of its own, at the writer's next use of the server.
    monkeypatch.setattr(servers, 'MEND_FOR', 0)  # no mender: next use
    proxy, writer, reader = writer_through_a_proxy(sqlite_url, memcached, apps)
    writer = writer.app.registry.dbtune.cache
    reader = reader.app.registry.dbtune.cache
    (server,) = writer.by_address.values()
    key, tables = ('k', (7,), (int,)), frozenset(['t'])
    write_cut_off(proxy, writer, tables)
    time.sleep(0.3)  # the client's dead_retry (0.2 s) runs out
    bumped, go = threading.Event(), threading.Event()

    def bump_then_wait():
        client = server.client()  # this thread's
        incr = client.incr

        def held(*args, **kw):
            result = incr(*args, **kw)
            bumped.set()
            go.wait(10)
            return result

        client.incr = held
        writer.get_or_fill(('other', (), ()), 60, tables, lambda: one_row(0))

    making_good = threading.Thread(target=bump_then_wait)
    making_good.start()
    try:
        assert bumped.wait(10)
        assert reader.get_or_fill(key, 60, tables, lambda: one_row('old'))
        write_cut_off(proxy, writer, tables)  # missed, while it bumps
    finally:
        go.set()
        making_good.join(10)
    time.sleep(0.3)
    writer.get_or_fill(('other', (), ()), 60, tables, lambda: one_row(0))
    got = reader.get_or_fill(key, 60, tables, lambda: one_row('new'))
    assert got == (one_row('new'), 'miss')
    proxy.cut()


def test_a_write_missed_as_the_mender_ends_is_made_good(
    sqlite_url, memcached, apps, monkeypatch
):
    # The writer's mender has made a missed write good and is ending as
    # another write misses: a mender makes that one good too, though the
    # writer serves no request.
    monkeypatch.setattr(servers, 'MEND_EVERY', 0.02)
    proxy, writer, reader = writer_through_a_proxy(sqlite_url, memcached, apps)
    writer = writer.app.registry.dbtune.cache
    reader = reader.app.registry.dbtune.cache
    key, tables = ('k', (8,), (int,)), frozenset(['t'])
    ending, go = threading.Event(), threading.Event()

    class Held(logging.Handler):
        def emit(self, record):
            if 'made good' in record.getMessage() and not go.is_set():
                ending.set()
                go.wait(10)

    logger = logging.getLogger('pyramid_dbtune.cache.memcached')
    held = Held()
    logger.addHandler(held)
    try:
        write_cut_off(proxy, writer, tables)
        assert ending.wait(10)  # made good, and the mender ends
        assert reader.get_or_fill(key, 60, tables, lambda: one_row('old'))
        write_cut_off(proxy, writer, tables)
    finally:
        go.set()
        logger.removeHandler(held)
    deadline = time.monotonic() + 5
    while reader.get_or_fill(key, 60, tables, lambda: one_row('new'))[0] != (
        one_row('new')
    ):
        assert time.monotonic() < deadline, 'the reader stayed stale'
        time.sleep(0.02)
    proxy.cut()


def test_a_server_restarted_after_a_missed_invalidation_is_used_again(
    sqlite_url, memcached, apps
):
    # memcached lost everything, the epoch with it: nothing is left to
    # make good, and the server is used again (it was a miss for good).
    app = apps(sqlite_url, [SEARCH, SET_RENT], shared_settings(memcached))
    search = ('search', {'area': 'Headingley'})
    memcached.stop()
    call(app, ('set_rent', {'id': 1, 'rent': 99}))
    memcached.start()
    time.sleep(0.3)  # the client's dead_retry (0.2 s) runs out
    call(app, search)
    assert call(app, search)['cache']['hit'] == 1


def test_counters_shared_by_threads_are_exact(sqlite_url, memcached, apps):
    app = apps(sqlite_url, [], shared_settings(memcached))
    cache = app.app.registry.dbtune.cache
    key = ('k', (), ())
    cache.get_or_fill(key, 60, frozenset(), lambda: Rows(['x'], [(1,)]))

    def hit():
        for _ in range(5000):
            cache.get_or_fill(key, 60, frozenset(), lambda: 1 / 0)

    threads = [threading.Thread(target=hit) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (cache.hits, cache.misses) == (40000, 1)
    assert 0 < cache.near_hits <= 40000


def one_row(value):
    return Rows(['x'], [(value,)])


def shared_cache(url, server, apps):
    """The memcached cache of an app on ``server``."""
    return apps(url, [], shared_settings(server)).app.registry.dbtune.cache


def read_of(cache, database):
    """A read that no write invalidates, of ``database['value']``."""
    return lambda: cache.get_or_fill(
        ('k', (), ()), 60, frozenset(), lambda: one_row(database['value'])
    )


def held_fill(cache, key, tables, results):
    """A read of ``key`` whose fill, of ``one_row('old')``, is begun in a
    thread of its own and held until the returned event is set; what the
    read gives is appended to ``results``."""
    started, release = threading.Event(), threading.Event()

    def fill():
        started.set()
        release.wait(10)
        return one_row('old')

    filling = threading.Thread(
        target=lambda: results.append(cache.get_or_fill(key, 60, tables, fill))
    )
    filling.start()
    started.wait(10)
    return release, filling


def test_a_read_after_a_write_does_not_wait_for_a_fill_begun_before(
    sqlite_url, memcached, apps
):
    cache = shared_cache(sqlite_url, memcached, apps)
    client = Client(('127.0.0.1', memcached.port))
    gets = []

    def after_the_write():
        gets.append(client.stats()[b'cmd_get'])
        return one_row('new')

    key, tables = ('k', (3,), (int,)), frozenset(['t'])
    results = []
    release, filling = held_fill(cache, key, tables, results)
    cache.invalidate(tables)  # a write, committed while the fill runs
    gets.append(client.stats()[b'cmd_get'])
    # Were it to wait for the fill begun before the write (in this
    # process), it would be given the old rows once this lets it end.
    timer = threading.Timer(5, release.set)
    timer.start()
    try:
        assert cache.get_or_fill(key, 60, tables, after_the_write) == (
            one_row('new'),
            'miss',
        )
    finally:
        release.set()
        timer.cancel()
        filling.join(10)
    # Nor did it wait for that fill's lock, which is for the generations
    # before the write: it asked memcached for the keys of its read, once,
    # and then filled.
    assert gets[1] - gets[0] == len(cache.hit_keys(key, tables))
    client.close()
    assert results == [(one_row('old'), 'miss')]
    # What the first fill stored, last, is not served: it is of the old
    # generations.
    rows, _ = cache.get_or_fill(key, 60, tables, lambda: one_row('new'))
    assert rows == one_row('new')


def test_with_memcached_down_a_read_after_a_write_fills_anew(
    sqlite_url, memcached, apps
):
    # memcached cannot tell the generations: a read that begins after
    # this process's write is not given the rows of a fill begun before.
    cache = shared_cache(sqlite_url, memcached, apps)
    memcached.stop()
    key, tables = ('k', (6,), (int,)), frozenset(['t'])
    results = []
    release, filling = held_fill(cache, key, tables, results)
    cache.invalidate(tables)  # a write, committed while the fill runs
    timer = threading.Timer(5, release.set)  # were it to wait for it
    timer.start()
    try:
        got = cache.get_or_fill(key, 60, tables, lambda: one_row('new'))
    finally:
        release.set()
        timer.cancel()
        filling.join(10)
    assert got == (one_row('new'), 'miss')
    assert results == [(one_row('old'), 'miss')]
    # Reads that begin together, with no write between, still share one.
    release, filling = held_fill(cache, key, tables, results)
    threading.Timer(0.2, release.set).start()
    assert cache.get_or_fill(key, 60, tables, lambda: 1 / 0) == (
        one_row('old'),
        'waited',
    )
    filling.join(10)


def test_a_write_of_rows_nobody_read_leaves_nothing_in_memcached(
    sqlite_url, memcached, apps
):
    cache = shared_cache(sqlite_url, memcached, apps)
    client = Client(('127.0.0.1', memcached.port))
    before = client.stats()[b'curr_items']
    cache.invalidate([f't:id:{n}' for n in range(50)])
    assert client.stats()[b'curr_items'] == before
    client.close()


def test_an_unknown_write_leaves_no_copy_of_what_it_dropped(
    sqlite_url, memcached, apps
):
    cache = shared_cache(sqlite_url, memcached, apps)
    database = {'value': 'old'}
    read = read_of(cache, database)
    assert [read()[1] for _ in range(2)] == ['miss', 'hit']
    database['value'] = 'new'
    cache.invalidate(None)
    # The old entry, found dropped, is not kept to be served again.
    assert [read() for _ in range(3)] == [
        (one_row('new'), 'miss'),
        (one_row('new'), 'hit'),
        (one_row('new'), 'hit'),
    ]


def test_a_read_that_an_unknown_write_overtakes_keeps_no_copy(
    sqlite_url, memcached, apps
):
    proxy = Proxy(memcached.port)
    cache = shared_cache(sqlite_url, proxy, apps)
    database = {'value': 'old'}
    read = read_of(cache, database)
    assert read() == (one_row('old'), 'miss')
    written = []

    def write_while_the_entry_comes(data):
        if b'VALUE' in data and not written:
            written.append(data)
            database['value'] = 'new'
            cache.invalidate(None)  # from another thread, meanwhile
        return [data]

    proxy.mangle = write_while_the_entry_comes
    # Read before the write ended: the old rows, not kept.
    assert read() == (one_row('old'), 'hit') and written
    assert read() == (one_row('new'), 'miss') and cache.near_hits == 0
    proxy.cut()


def test_a_generation_that_is_not_a_number_is_a_miss(
    sqlite_url, memcached, apps
):
    cache = shared_cache(sqlite_url, memcached, apps)
    key, tables = ('k', (4,), (int,)), frozenset(['t', 'u'])

    def read():
        return cache.get_or_fill(key, 60, tables, lambda: one_row(4))[1]

    assert [read(), read()] == ['miss', 'hit']
    client = Client(('127.0.0.1', memcached.port), default_noreply=False)
    generations = cache.hit_keys(key, tables)[1:]
    for name in generations:
        client.set(name, b'not a number')
    client.close()
    assert read() == 'miss' and cache.rejected == len(generations) == 3
    # Started again at the next read, and then kept.
    assert [read(), read()] == ['miss', 'hit']


def test_a_server_down_is_said_once_while_another_answers(
    sqlite_url, memcached, memcached2, apps, caplog
):
    app = apps(sqlite_url, [SEARCH], shared_settings(memcached, memcached2))
    request = prepare(registry=app.app.registry)['request']

    def read_on_both():
        # Twenty areas: keys on both servers, each read a round trip.
        for n in range(20):
            assert len(request.sql.search(area=f'area {n}')) == 0

    def said(text):
        return [
            r.getMessage() for r in caplog.records if text in r.getMessage()
        ]

    read_on_both()
    memcached2.stop()
    # For longer than it is set aside (0.2 s): asked again, several times,
    # while the other server answers every read of its keys.
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:
        read_on_both()
    assert app.app.registry.dbtune.cache.errors > 2
    assert said('failed') == [
        f'memcached {memcached2.address} failed, serving from the database: '
        'ConnectionRefusedError: [Errno 111] Connection refused'
    ]
    assert said('answers again') == []
    memcached2.start()
    deadline = time.monotonic() + 10
    while not said('answers again'):
        assert time.monotonic() < deadline, caplog.text
        read_on_both()
        time.sleep(0.05)
    assert said('answers again') == [
        f'memcached {memcached2.address} answers again'
    ]
