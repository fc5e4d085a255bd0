"""Causal reads on real streaming replication: a write committed in one
process, then read by the same client in another, over HTTP, sees the
write though the standby replays it 0.5 s late; without pins the same
run reads old rows; reads that carry no newer pin go to the standby."""

import http.cookies
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from webtest import TestApp

from pyramid_dbtune.routing.work import PIN_COOKIE, read_pin, sign_pin
from pyramid_dbtune.settings import parse

from conftest import GET, SET_RENT, call, create_tables

STANDBY_OPTIONS = ['recovery_min_apply_delay=500ms']
SERVER = Path(__file__).parent / 'dbtune_server.py'
SECRET = 'the causal reads test secret'
TOKEN = 'the causal reads test token'
NOW = {**GET, 'cache_time': 0}
PAIRS = 500


class Server:
    """The test app in a process of its own, over HTTP."""

    def __init__(self, url, settings):
        job = {'url': url, 'settings': settings, 'methods': [NOW, SET_RENT]}
        self.process = subprocess.Popen(
            [sys.executable, str(SERVER), json.dumps(job)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            cwd=SERVER.parent,
        )  # fmt: skip
        self.base = f'http://127.0.0.1:{self.process.stdout.readline()}'

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
        self.process.stdin.close()
        self.process.wait(30)


@pytest.fixture
def servers(streaming):
    primary, standby = streaming
    create_tables(primary.url)
    made = []

    def start(**settings):
        settings = {'dbtune.read_urls': standby.url, **settings}
        pair = [Server(primary.url, settings) for _ in range(2)]
        made.extend(pair)
        return pair

    yield start
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


def test_without_pins_the_same_reads_are_stale(servers):
    writer, reader = servers()
    assert write_then_read(writer, reader, 50) > 0


def test_reads_without_a_newer_pin_go_to_the_standby(servers):
    stats = {'dbtune.stats': 'true', 'dbtune.stats.token': TOKEN}
    writer, reader = servers(**{'dbtune.pin_secret': SECRET, **stats})
    _, pin = writer.call('set_rent', {'id': 1, 'rent': 7})
    time.sleep(1)  # the standby replays it, and the watch sees it
    for _ in range(100):
        reader.call('get', {'id': 1}, pin)  # an old pin
        reader.call('get', {'id': 1})  # none
    roles = reader.stats()['database']['roles']
    on_standby = roles['reader0']['reads']
    assert on_standby / (on_standby + roles['writer']['reads']) >= 0.9


def test_a_pin_is_signed():
    settings = parse({'dbtune.url': 'sqlite://', 'dbtune.pin_secret': SECRET})
    assert read_pin(sign_pin(42, settings), settings) == 42
    assert read_pin('42.' + '0' * 32, settings) == 0
    assert read_pin('x.y', settings) == 0
    other = parse({'dbtune.url': 'sqlite://', 'dbtune.pin_secret': 'x' * 16})
    assert read_pin(sign_pin(42, other), settings) == 0


def until(check, seconds=20):
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, 'not in time'
        time.sleep(0.02)


def test_causal_reads_in_one_process(streaming, apps):
    primary, standby = streaming
    settings = {'dbtune.read_urls': standby.url, 'dbtune.pin_secret': SECRET}
    app = apps(primary.url, [NOW, SET_RENT], settings)
    router = app.app.registry.dbtune.router
    (reader,) = router.readers
    until(lambda: reader.position and router.caught_up(router.position()))
    call(app, ('set_rent', {'id': 1, 'rent': 95}))
    pin = read_pin(app.cookies[PIN_COOKIE], router.settings)
    assert pin and not router.caught_up(pin)
    # The client: fresh, on the writer, the standby 0.5 s behind.
    reads = reader.reads
    assert rent(call(app, ('get', {'id': 1}))) == 95
    assert reader.reads == reads
    # Another client of this process: its read of the table written
    # waits for a reader that has replayed the commit, too.
    other = TestApp(app.app)
    assert rent(call(other, ('get', {'id': 1}))) == 95
    # Once the standby has replayed it: reads go back to it.
    until(lambda: router.caught_up(pin))
    assert rent(call(app, ('get', {'id': 1}))) == 95
    assert rent(call(other, ('get', {'id': 1}))) == 95
    assert reader.reads == reads + 2


def rent(answer):
    return answer['results'][0]['rows'][0][2]
