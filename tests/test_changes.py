"""Writes made anywhere: changes committed outside the application (a
plain connection, as ``psql`` or a cron job would make them) drop the
cached reads they could have changed, by row, in every process.

On PostgreSQL (NOTIFY) and MariaDB (a change table read on an interval),
over real HTTP to a second process, and across a restart of a PostgreSQL
server the test starts for itself.
"""

import json
import logging
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import sqlalchemy as sa
from pyramid.config import Configurator
from pyramid.exceptions import ConfigurationError

from pyramid_dbtune.cache import changelog, changes, triggers
from pyramid_dbtune.cache.triggers import PROBE
from pyramid_dbtune.deploy.cli import main
from pyramid_dbtune.settings import parse

from conftest import (
    LISTEN,
    METHODS,
    READS,
    Proxy,
    _postgresql_schema,
    call,
    create_tables,
    in_a_child,
    listeners,
    listening,
    run_sql,
    shared_settings,
    until,
    watched,
)

#: Seconds a change made outside the app may take to reach a process.
LIMIT = 1.0
SERVER = Path(__file__).parent / 'dbtune_server.py'


def outside(url, *statements):
    """Commit ``statements`` on a plain connection of the test's own."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as connection:
            for statement in statements:
                connection.execute(sa.text(statement))
    finally:
        engine.dispose()


def heard(app, count=1):
    """Wait until the app's listener has applied ``count`` more notices
    than it had (10 s at the most)."""
    listener = app.app.registry.dbtune.listener
    target = listener.notices + count

    def wait():
        deadline = time.monotonic() + 10
        while listener.notices < target:
            assert time.monotonic() < deadline, 'no notice came'
            time.sleep(0.005)

    return wait


def dropped(app, *statements):
    """Which of READS a change made outside dropped (their indexes)."""
    call(app, *READS)
    wait = heard(app)
    outside(app.app.registry.dbtune.settings.url, *statements)
    wait()
    return [i for i, read in enumerate(READS)
            if call(app, read)['cache']['hit'] == 0]  # fmt: skip


def test_a_change_made_outside_drops_the_reads_of_its_rows(server_url, apps):
    app = listening(server_url, apps)
    # PostgreSQL tells the change's transaction: it is applied to the rows
    # read before it. MySQL's change cannot be placed: it drops them.
    postgresql = server_url.startswith('postgresql')
    assert dropped(app, 'UPDATE property SET rent = 95 WHERE id = 1') == (
        [] if postgresql else [0, 3, 5]
    )
    assert call(app, ('get', {'id': 1}))['results'][0]['rows'] == [
        [1, 'Headingley', 95]
    ]
    # A row that moves: both areas. Inserts and deletes: their rows.
    # (On PostgreSQL, patched: but for Burley's search, which held no row
    # by then, and so no type of its columns' values.)
    move = "UPDATE property SET area = 'Hyde Park' WHERE id = 4"
    assert dropped(app, move) == ([] if postgresql else [1, 2, 4, 5])
    add = "INSERT INTO property (id, area, rent) VALUES (5, 'Burley', 1)"
    assert dropped(app, add) == ([1] if postgresql else [1, 5])
    remove = 'DELETE FROM property WHERE id = 3'
    assert dropped(app, remove) == ([] if postgresql else [2, 5])
    search = call(app, ('search', {'area': 'Hyde Park'}))['results'][0]
    assert search['rows'] == [[4, 70]]
    # Two statements of one transaction, on MariaDB two notices.
    both = ['UPDATE property SET rent = 1 WHERE id = 1',
            'UPDATE property SET rent = 1 WHERE id = 2']  # fmt: skip
    call(app, *READS)
    wait = heard(app, 2)
    outside(server_url, *both)
    wait()
    assert call(app, ('search', {'area': 'Burley'}))['cache']['hit'] == 1


def test_a_change_by_a_replica_session_is_heard(postgresql_url, apps):
    # Logical replication's apply, or a bulk loader, writes with
    # session_replication_role = replica, where only ALWAYS triggers fire.
    app = listening(postgresql_url, apps)
    call(app, ('get', {'id': 1}))
    wait = heard(app)
    outside(
        postgresql_url,
        'SET LOCAL session_replication_role = replica',
        'UPDATE property SET rent = 96 WHERE id = 1',
    )
    wait()
    assert call(app, ('get', {'id': 1}))['results'][0]['rows'] == [
        [1, 'Headingley', 96]
    ]


def test_another_schemas_table_of_that_name_is_not_this_apps(
    postgresql_url, apps
):
    # A schema a tenant: the same tables, each with the triggers, in one
    # database, whose notices all go on one channel.
    app = listening(postgresql_url, apps)
    other, drop = _postgresql_schema()
    try:
        listening(other, apps)
        call(app, ('search', {'area': 'Burley'}))
        wait = heard(app)
        outside(other, "INSERT INTO property VALUES (9, 'Burley', 1)")
        outside(postgresql_url, 'UPDATE property SET rent = 71 WHERE id = 4')
        wait()  # its own schema's notice: the other's came before it
        assert call(app, ('search', {'area': 'Burley'}))['results'][0][
            'rows'
        ] == [[4, 71]]
    finally:
        drop()


def test_a_mariadb_url_listens(mysql_url, apps):
    # A mariadb:// URL (SQLAlchemy's "mariadb" dialect) installs the
    # triggers and hears a change as a mysql:// one does.
    url = mysql_url.replace('mysql+', 'mariadb+', 1)
    app = listening(url, apps)
    assert app.app.registry.dbtune.router.dialect == 'mariadb'
    assert dropped(app, 'UPDATE property SET rent = 95 WHERE id = 1') == [
        0, 3, 5,
    ]  # fmt: skip


def test_a_change_of_many_rows_drops_the_table(postgresql_url, apps):
    app = listening(postgresql_url, apps)
    wait = heard(app, 5)
    for offset in (100, 1000, 10000, 100000, 1000000):  # 8, 16, ... 128
        outside(
            postgresql_url,
            f'INSERT INTO property (id, area, rent) SELECT id + {offset}, '
            "'Far', 1 FROM property",
        )
    wait()
    assert dropped(app, "UPDATE property SET rent = 2 WHERE area = 'Far'") == [
        0, 1, 2, 3, 4, 5
    ]  # fmt: skip


def test_the_apps_own_change_of_many_rows_drops_its_reads(
    postgresql_url, apps
):
    # Its commit leaves the reads with a shape to the listener, and the
    # notice of more rows than a notice tells carries no row, nor any
    # transaction: what it changed is dropped all the same.
    bulk = {'name': 'bulk', 'sql': 'UPDATE property SET rent = :rent '
            'WHERE area = :area'}  # fmt: skip
    app = listening(postgresql_url, apps, methods=[*METHODS, bulk])
    outside(postgresql_url, "INSERT INTO property (id, area, rent) SELECT "
            "g, 'Big', 10 FROM generate_series(100, 250) AS g")  # fmt: skip
    search = ('search', {'area': 'Big'})
    call(app, search)
    call(app, ('bulk', {'rent': 77, 'area': 'Big'}))
    rows = call(app, search)['results'][0]['rows']
    assert len(rows) == 151 and {rent for _, rent in rows} == {77}


def test_a_truncate_drops_the_table_on_postgresql(postgresql_url, apps):
    app = listening(postgresql_url, apps)
    assert dropped(app, 'TRUNCATE property') == [0, 1, 2, 3, 4, 5]


def test_a_change_outside_reaches_another_process(server_url, apps):
    """Over HTTP to a process of its own (its cache in its memory): the
    change is seen there within LIMIT, and only its rows were dropped."""
    app = listening(server_url, apps)  # installs the triggers
    job = {'url': server_url, 'settings': LISTEN, 'methods': METHODS}
    other = subprocess.Popen(
        [sys.executable, str(SERVER), json.dumps(job)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        cwd=SERVER.parent,
    )  # fmt: skip
    try:
        base = f'http://127.0.0.1:{other.stdout.readline().strip()}'

        def post(*calls):
            body = json.dumps({'calls': [list(c) for c in calls]}).encode()
            request = urllib.request.Request(
                base + '/call', body, {'Content-Type': 'application/json'}
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read())

        # Its listener connects after it serves: until then, no fill may
        # stay (a change before it listened would be lost). Then cached.
        deadline = time.monotonic() + 10
        while post(*READS)['cache']['hit'] < len(READS):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        here = heard(app)
        outside(server_url, 'UPDATE property SET rent = 96 WHERE id = 1')
        committed = time.monotonic()
        while True:
            answer = post(('get', {'id': 1}))
            seconds = time.monotonic() - committed
            if answer['results'][0]['rows'] == [[1, 'Headingley', 96]]:
                break
            assert seconds < LIMIT, f'still stale {seconds:.2f} s on'
            time.sleep(0.01)
        hits = [post(read)['cache']['hit'] for read in READS]
        # The page, filled again above (MySQL) or patched (PostgreSQL).
        patched = server_url.startswith('postgresql')
        assert hits == [int(patched), 1, 1, 1, 1, int(patched)]
        here()  # this process heard it too
    finally:
        other.stdin.close()
        other.wait(30)


def test_the_listener_survives_its_database_restarting(own_postgresql, apps):
    url = own_postgresql.url
    app = listening(url, apps)
    listener = app.app.registry.dbtune.listener
    call(app, *READS)
    own_postgresql.stop()
    deadline = time.monotonic() + 10
    while listener.failures < 2:  # lost, and not made again
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not listener.listening.is_set()
    own_postgresql.start()
    assert listener.listening.wait(20)
    assert listener.connects == 2
    # Changes while it was away are not known: it dropped everything.
    assert call(app, *READS)['cache']['hit'] == 0
    # And it hears again.
    assert dropped(app, 'UPDATE property SET rent = 97 WHERE id = 4') == []
    answer = call(app, ('get', {'id': 4}))
    assert answer['results'][0]['rows'] == [[4, 'Burley', 97]]
    assert answer['cache']['hit'] == 1  # patched, not read again


def test_a_listener_whose_connection_goes_silent_connects_again(
    mysql_url, apps
):
    """A path that answers nothing and closes nothing: the listener's
    check has no answer, so it gives its connection up, within
    ``dbtune.statement_timeout`` here (PyMySQL's ``read_timeout``), and
    connects again once the path is back; it then drops what it holds,
    and hears. (On PostgreSQL, the kernel's bounds of the next test give
    up a path whose other end no longer acknowledges: loopback cannot
    show one.)"""
    server_url = mysql_url
    create_tables(server_url)
    engine = sa.create_engine(server_url, poolclass=sa.pool.NullPool)
    triggers.install(engine, {'property': (('area', 'id'), ('rent',))})
    engine.dispose()
    url = sa.engine.make_url(server_url)
    proxy = Proxy(url.port)
    settings = {
        **LISTEN,
        'dbtune.statement_timeout': '1',
        'dbtune.connect_timeout': '2',
    }
    get = ('get', {'id': 1})
    try:
        proxied = url.set(host='127.0.0.1', port=proxy.port)
        app = apps(
            proxied.render_as_string(hide_password=False),
            METHODS,
            settings,
            tables=False,
        )
        listener = app.app.registry.dbtune.listener
        assert listener.listening.wait(10)
        call(app, get)
        proxy.freeze()
        outside(server_url, 'UPDATE property SET rent = 91 WHERE id = 1')
        until(lambda: not listener.listening.is_set())
        proxy.thaw()
        until(listener.listening.is_set)
        # What changed while it heard nothing is not known: all dropped.
        answer = call(app, get)
        assert answer['results'][0]['rows'] == [[1, 'Headingley', 91]]
        assert answer['cache']['hit'] == 0
        wait = heard(app)
        outside(server_url, 'UPDATE property SET rent = 92 WHERE id = 1')
        wait()
        answer = call(app, get)
        assert answer['results'][0]['rows'] == [[1, 'Headingley', 92]]
    finally:
        proxy.cut()


def test_a_listeners_connection_has_tcp_bounds_on_postgresql(
    postgresql_url, apps
):
    """libpq's keepalives and tcp_user_timeout, within the listener's
    bound on an answer: a cut the kernel sees fails what waits on it.
    Only on the listener's connection; a bound the URL names wins."""
    url = sa.engine.make_url(postgresql_url).update_query_dict(
        {'keepalives_idle': '7'}
    )
    settings = {**LISTEN, 'dbtune.statement_timeout': '3'}
    app = listening(url.render_as_string(hide_password=False), apps, settings)
    dbtune = app.app.registry.dbtune

    def parameters(engine):
        with engine.connect() as connection:
            info = connection.connection.driver_connection.info
            return info.get_parameters()

    assert {
        name: value
        for name, value in parameters(dbtune.listener.engine).items()
        if name.startswith(('keepalives', 'tcp_user_timeout'))
    } == {
        'keepalives': '1',
        'keepalives_idle': '7',
        'keepalives_interval': '1',
        'keepalives_count': '2',
        'tcp_user_timeout': '3000',
    }
    assert 'tcp_user_timeout' not in parameters(dbtune.router.writer)


def test_a_libpq_before_12_is_not_given_tcp_user_timeout(
    postgresql_url, apps, monkeypatch
):
    # libpq 11 refuses the parameter: the listener would never connect.
    import psycopg

    monkeypatch.setattr(psycopg.pq, 'version', lambda: 110022)
    app = listening(postgresql_url, apps)
    engine = app.app.registry.dbtune.listener.engine
    with engine.connect() as connection:
        info = connection.connection.driver_connection.info
        assert 'tcp_user_timeout' not in info.get_parameters()
        assert info.get_parameters()['keepalives'] == '1'


def test_a_change_committed_late_is_not_missed_on_mariadb(mysql_url, apps):
    """MariaDB numbers the changes as they are made, not as they commit:
    a change whose transaction commits after a later one's is read all
    the same, and one rolled back is not waited for."""
    app = listening(mysql_url, apps)
    engine = sa.create_engine(mysql_url)
    late, undone = engine.connect(), engine.connect()
    try:
        late.execute(sa.text('UPDATE property SET rent = 98 WHERE id = 1'))
        undone.execute(sa.text('UPDATE property SET rent = 1 WHERE id = 3'))
        call(app, *READS)
        wait = heard(app)
        outside(mysql_url, 'UPDATE property SET rent = 71 WHERE id = 4')
        wait()
        undone.rollback()
        wait = heard(app)
        outside(mysql_url, 'UPDATE property SET rent = 72 WHERE id = 4')
        wait()
        search = ('search', {'area': 'Headingley'})
        assert call(app, search)['cache']['hit'] == 1
        wait = heard(app)
        late.commit()
        late.close()
        wait()
        answer = call(app, ('get', {'id': 1}), search)
        assert answer['results'][0]['rows'] == [[1, 'Headingley', 98]]
        assert answer['cache']['hit'] == 0
        # Nothing open: the change rolled back is waited for no longer.
        changes_read = app.app.registry.dbtune.listener.changes
        deadline = time.monotonic() + 10
        while changes_read.waiting:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        late.close()
        undone.close()
        engine.dispose()


def test_a_change_log_read_on_a_lost_connection_keeps_what_it_waits_for(
    mysql_url, apps
):
    """The read of a change still open fails on a connection the server
    has cut: the error reaches the listener (which connects again) and
    the change is still waited for, then read once committed."""
    listener = listening(mysql_url, apps).app.registry.dbtune.listener
    engine = sa.create_engine(mysql_url, poolclass=sa.pool.NullPool)
    reads = engine.execution_options(isolation_level='AUTOCOMMIT')
    late, reader, admin = engine.connect(), reads.connect(), engine.connect()
    try:
        (floor,) = reader.execute(
            sa.text(f'SELECT COALESCE(MAX(id), 0) FROM {changes.CHANNEL}')
        ).one()
        log = changes.ChangeLog(floor, listener)
        late.execute(sa.text('UPDATE property SET rent = 98 WHERE id = 1'))
        outside(mysql_url, 'UPDATE property SET rent = 71 WHERE id = 4')
        read = []
        log.read(reader, lambda table, told, origin: read.append(told))
        assert [told['new'][0]['id'] for told in read] == [4]
        assert log.waiting == 1  # the update of 1, open still
        thread_id = reader.connection.dbapi_connection.thread_id()
        admin.execute(sa.text(f'KILL CONNECTION {thread_id}'))
        with pytest.raises(sa.exc.OperationalError) as raised:
            log.read(reader, None)
        assert raised.value.orig.args[0] in (2006, 2013)  # gone, or lost
        assert log.waiting == 1
        late.commit()
        reader.close()
        reader = reads.connect()
        log.read(reader, lambda table, told, origin: read.append(told))
        assert [told['new'][0]['id'] for told in read] == [4, 1]
        assert log.waiting == 0
    finally:
        for connection in (late, reader, admin):
            connection.close()
        engine.dispose()


def test_a_listener_cut_off_misses_no_change_on_mariadb(mysql_url, apps):
    """Its connection killed while a change is open: it connects again,
    drops what it holds, and still reads that change once committed."""
    app = listening(mysql_url, apps)
    dbtune = app.app.registry.dbtune
    engine = sa.create_engine(mysql_url)
    late = engine.connect()
    try:
        late.execute(sa.text('UPDATE property SET rent = 98 WHERE id = 1'))
        wait = heard(app)
        outside(mysql_url, 'UPDATE property SET rent = 71 WHERE id = 4')
        wait()
        with engine.connect() as admin:
            mine = {admin.connection.dbapi_connection.thread_id(),
                    late.connection.dbapi_connection.thread_id()}  # fmt: skip
            for (id_,) in admin.execute(sa.text(
                'SELECT id FROM information_schema.processlist '
                'WHERE db = DATABASE()'
            )):  # fmt: skip
                if id_ not in mine:
                    admin.execute(sa.text(f'KILL CONNECTION {id_}'))
        dbtune.router.dispose()  # the app's connections were killed too
        deadline = time.monotonic() + 10
        while (
            dbtune.listener.connects < 2
            or not dbtune.listener.listening.is_set()
        ):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        search = ('search', {'area': 'Headingley'})
        assert call(app, search)['cache']['hit'] == 0  # all was dropped
        assert call(app, search)['cache']['hit'] == 1
        wait = heard(app)
        late.commit()
        wait()
        answer = call(app, ('get', {'id': 1}), search)
        assert answer['results'][0]['rows'] == [[1, 'Headingley', 98]]
        assert answer['cache']['hit'] == 0
    finally:
        late.close()
        engine.dispose()


#: What anyone who may notify the channel (PostgreSQL: any role) or
#: write to the table of changes (MySQL) may send: (table, text), each;
#: the table a change names ('': a MySQL mark, which names none).
NOT_THE_TRIGGERS = {
    'postgresql': [
        (None, 'not json'),
        (None, '[1]'),
        (None, '{"s": 5}'),
        (None, '{"p": [1]}'),
        (None, '{"t": 5}'),
        ('nothing', '{"t": "nothing", "old": [1], "new": []}'),
        ('nothing', '{"t": "nothing", "x": Infinity}'),
        # A number that would take minutes to make whole, in every thread.
        ('nothing', '{"t": "nothing", "x": 1e1000000}'),
        ('nothing', '{"t": "nothing", "x": 5}'),
        ('nothing', '{"t": "nothing", "old": [{"id": 1e1000000}], "new": []}'),
        (
            'nothing',
            '{"t": "nothing", "old": [{"id": 1%s}], "new": []}' % ('0' * 1000),
        ),
        (None, '[' * 5000),  # nested past Python's recursion limit
    ],
    'mysql': [
        ('nothing', 'not json'),
        ('nothing', '[1]'),
        ('nothing', '{"old": 5}'),
        ('', 'junk'),
        ('', '[1]'),
        ('nothing', '{"old": [{"id": 1e1000000}]}'),
        ('nothing', '{"old": [{"id": NaN}]}'),
        ('nothing', '[' * 5000),
    ],
}


def tell(url, table, text, origin=None):
    """Tell the listeners a change, as the triggers would not."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as connection:
            if url.startswith('postgresql'):
                statement = "SELECT pg_notify('dbtune_changes', :text)"
            else:
                statement = (
                    'INSERT INTO dbtune_changes (tbl, cols, origin) '
                    'VALUES (:table, :text, :origin)'
                )
            connection.execute(
                sa.text(statement),
                {'table': table, 'text': text, 'origin': origin},
            )
    finally:
        engine.dispose()


def test_a_change_not_the_triggers_drops_its_table_alone(
    server_url, apps, caplog
):
    """A change told otherwise than the triggers tell one is logged, and
    drops the reads of the table it names, if any: the listener keeps its
    connection, and the rest of the cache (connecting again would drop
    every cached result, and anyone could make it do so at will)."""
    app = listening(server_url, apps)
    listener = app.app.registry.dbtune.listener
    kind = 'postgresql' if server_url.startswith('postgresql') else 'mysql'
    junk = NOT_THE_TRIGGERS[kind]
    call(app, *READS)
    wait = heard(app, 1 + sum(bool(table) for table, _ in junk))
    for table, text in junk:
        tell(server_url, table, text)
    if kind == 'mysql':  # a question of who listens, from a connection
        tell(server_url, PROBE, '5', origin='memcached 1234 5678')
    tell(server_url, 'nothing', '{"t": "nothing"}' if kind == 'postgresql'
         else None)  # fmt: skip
    wait()
    assert [call(app, read)['cache']['hit'] for read in READS] == [1] * 6
    said = [r for r in caplog.records if 'cannot read' in r.getMessage()]
    assert len(said) == len(junk)
    wait = heard(app)
    if kind == 'postgresql':
        tell(server_url, None, '{"t": "property", "x": "junk"}')
    else:
        tell(server_url, 'property', '{"new": [5]}')
    wait()
    assert [call(app, read)['cache']['hit'] for read in READS] == [0] * 6
    assert (listener.connects, listener.failures) == (1, 0)


def test_tags_of_a_change():
    pinned = {'property': {'area', 'id'}}
    whole = {'property', 'property?'}
    assert triggers.tags_of('property', None, pinned) == whole
    assert triggers.tags_of('property', [{'id': 1}], pinned) == whole
    assert triggers.tags_of('property', [{'id': 1, 'area': None}], pinned) == {
        'property',
        'property.id=1',
    }
    assert (
        triggers.tags_of('property', [{'id': 1.5, 'area': 'x'}], pinned)
        == whole
    )
    assert triggers.tags_of('other', [{'a': 1}], pinned) == {'other'}


@pytest.mark.parametrize(
    'url, message',
    [
        (None, 'needs a database'),
        ('sqlite://', 'sqlite cannot tell'),
        ('postgresql+pg8000://u@h/d', 'needs psycopg \\(version 3\\)'),
    ],
)
def test_listening_needs_a_database_that_tells(url, message):
    settings = {'dbtune.cache.listen': 'true'}
    if url:
        settings['dbtune.url'] = url
    with pytest.raises(ConfigurationError, match=message):
        parse(settings)


def ini(tmp_path, url, **more):
    lines = ['[app:main]', 'use = call:dbtune_server:app_factory',
             f'dbtune.url = {url.replace("%", "%%")}']  # fmt: skip
    lines += [f'{k} = {v}' for k, v in more.items()]
    path = tmp_path / 'app.ini'
    path.write_text('\n'.join(lines) + '\n')
    return str(path)


def test_the_triggers_command(server_url, tmp_path, capsys):
    create_tables(server_url)
    path = ini(tmp_path, server_url)
    assert main(['triggers', path, '--sql']) == 0
    assert 'CREATE TRIGGER' in capsys.readouterr().out
    assert watched(server_url) == set()  # printed, not run
    assert main(['triggers', path]) == 0
    assert capsys.readouterr().out == (
        'dbtune triggers: installed on property (rows told by area, id, '
        'rent)\n'
    )
    assert main(['triggers', path]) == 0  # again: replaced
    assert watched(server_url) == {'property'}
    assert main(['triggers', path, '--drop']) == 0
    assert 'dropped the triggers of property' in capsys.readouterr().out
    assert watched(server_url) == set()


def test_the_triggers_command_of_an_app_that_listens(
    server_url, tmp_path, apps, caplog, capsys, monkeypatch
):
    """The command loads the application without its listener, which
    would look for the triggers before they are made, and say in the log
    that none tell of changes, or fail to find MySQL's table of
    changes."""
    create_tables(server_url)
    path = ini(tmp_path, server_url, **LISTEN)
    started = []
    start = changes.Listener.start
    monkeypatch.setattr(
        changes.Listener, 'start',
        lambda self: started.append(self) or start(self),
    )  # fmt: skip
    assert main(['triggers', path]) == 0
    assert 'installed on property' in capsys.readouterr().out
    assert started == []
    assert 'pyramid_dbtune' not in caplog.text
    # As it was, for the applications after it.
    apps(server_url, METHODS, LISTEN, tables=False)
    assert len(started) == 1


def test_the_triggers_command_for_named_tables(server_url, tmp_path, capsys):
    # A Zope site's ZSQL Methods name their tables in their SQL alone.
    create_tables(server_url)
    command = ['triggers', '--url', server_url, '--tables', 'area,property']
    assert main(command) == 0
    assert capsys.readouterr().out == (
        'dbtune triggers: installed on area\n'
        'dbtune triggers: installed on property\n'
    )
    assert watched(server_url) == {'area', 'property'}
    assert main([*command, '--drop']) == 0
    assert watched(server_url) == set()
    # With an ini file: besides the application's own.
    path = ini(tmp_path, server_url)
    assert main(['triggers', path, '--tables', 'area']) == 0
    assert watched(server_url) == {'area', 'property'}
    assert main(['triggers', path, '--tables', 'area', '--drop']) == 0
    assert watched(server_url) == set()


def test_tables_whose_long_names_begin_alike_keep_their_triggers(
    server_url, apps, capsys
):
    # MySQL takes names of 64 characters at most, and a trigger's name is
    # unique in its database: cut, the two tables' names would be one,
    # and the second table's triggers would replace the first's.
    # PostgreSQL names a trigger within its table.
    first, second = (
        f'property_history_by_neighbourhood_and_month_archive_{end}'
        for end in 'ab'
    )
    run_sql(
        server_url,
        f'CREATE TABLE {first} (id INTEGER PRIMARY KEY)',
        f'CREATE TABLE {second} (id INTEGER PRIMARY KEY)',
        f'INSERT INTO {first} VALUES (1)',
    )
    tables = f'{first},{second}'
    command = ['triggers', '--url', server_url, '--tables', tables]
    assert main(command) == 0
    assert watched(server_url) == {first, second}
    method = {
        'name': 'first',
        'sql': f'SELECT count(*) FROM {first}',
        'cache_time': 20,
    }
    app = apps(server_url, [method], LISTEN, tables=False)
    assert app.app.registry.dbtune.listener.listening.wait(10)
    assert call(app, ('first', {}))['results'][0]['rows'] == [[1]]
    assert call(app, ('first', {}))['cache']['hit'] == 1
    wait = heard(app)
    outside(server_url, f'INSERT INTO {first} VALUES (2)')
    wait()
    # Dropped, or patched on PostgreSQL: the row written is counted.
    assert call(app, ('first', {}))['results'][0]['rows'] == [[2]]
    assert main([*command, '--drop']) == 0
    assert watched(server_url) == set()
    assert 'dropped the triggers of' in capsys.readouterr().out


@pytest.mark.parametrize(
    'arguments, error',
    [
        (['--url', 'sqlite://'], '--url needs --tables'),
        ([], 'give an ini file or --url, one of them'),
        (['app.ini', '--url', 'sqlite://'], 'one of them'),
        (['--url', 'sqlite://', '--tables', 'Property'],
         "'Property' is not a plain table name"),
        (['--url', 'sqlite://', '--tables', 'property'], 'sqlite cannot tell'),
        (['--url', 'sqlite://', '--tables', 'property', '--sql'],
         'sqlite cannot tell'),
    ],
)  # fmt: skip
def test_the_triggers_command_refuses(arguments, error, capsys):
    assert main(['triggers', *arguments]) == 2
    said = capsys.readouterr()
    assert error in said.err
    assert said.out == ''


def test_the_triggers_command_needs_the_package_and_a_database(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / 'plain_app.py').write_text(
        'from pyramid.config import Configurator\n'
        'def main(global_config, **settings):\n'
        '    config = Configurator(settings=settings)\n'
        "    if settings.get('include') == 'yes':\n"
        "        config.include('pyramid_dbtune')\n"
        '    return config.make_wsgi_app()\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for include, error in (
        ('no', 'does not include pyramid_dbtune'),
        ('yes', 'has no database: set dbtune.url (or sqlalchemy.url)'),
    ):
        path = tmp_path / f'{include}.ini'
        path.write_text(
            f'[app:main]\nuse = call:plain_app:main\ninclude = {include}\n'
        )
        assert main(['triggers', str(path), '--tables', 'property']) == 2
        assert f'of {path} {error}' in capsys.readouterr().err


def test_the_triggers_command_needs_a_database_that_tells(tmp_path, capsys):
    url = f'sqlite:///{tmp_path / "app.sqlite"}'
    create_tables(url)
    assert main(['triggers', ini(tmp_path, url)]) == 2
    assert 'sqlite cannot tell' in capsys.readouterr().err


def test_the_triggers_command_needs_cached_reads(tmp_path, capsys):
    url = f'sqlite:///{tmp_path / "app.sqlite"}'
    create_tables(url)
    path = ini(tmp_path, url, **{'dbtune.cache_time.search': '0',
                                 'dbtune.cache_time.get': '0'})  # fmt: skip
    assert main(['triggers', path]) == 2
    assert 'nothing to watch' in capsys.readouterr().err


def test_a_listener_says_which_tables_have_no_triggers(
    postgresql_url, apps, caplog
):
    app = apps(postgresql_url, METHODS, LISTEN)
    assert app.app.registry.dbtune.listener.listening.wait(10)
    assert 'no triggers tell of changes to property' in caplog.text


def test_a_listener_starts_again_in_a_forked_child(postgresql_url, apps):
    app = listening(postgresql_url, apps)
    listener = app.app.registry.dbtune.listener
    # The parent's thread did not come along: one of its own, that hears,
    # and connects for the first time in its process (not "again").
    assert listener.connects == 1
    assert in_a_child(
        lambda: listener.listening.wait(10) and listener.connects == 1
    )
    listener.stop()
    assert not in_a_child(lambda: listener.listening.wait(0.5))


def test_a_child_forked_while_its_parent_connects_listens(
    postgresql_url, apps, caplog
):
    """A gunicorn master may fork its workers while its listener makes
    its first connection, in which SQLAlchemy holds a lock of the engine:
    the child's listener connects all the same, and hears."""
    create_tables(postgresql_url)
    url = sa.engine.make_url(postgresql_url)
    proxy = Proxy(url.port or 5432)
    stalling, withheld, let_go = (threading.Event() for _ in range(3))
    # Of each connection, by the thread that pumps its replies: whether
    # it is the one held, and whether it has logged in.
    pump, claimed = threading.local(), []

    def mangle(data):
        # The first connection made once stalling: it logs in, and the
        # answer to its first statement is withheld.
        if not hasattr(pump, 'held'):
            pump.held = stalling.is_set() and not claimed
            pump.ready = False
            if pump.held:
                claimed.append(True)
        if pump.held and pump.ready:
            withheld.set()
            let_go.wait(30)
            return []  # hung up
        pump.ready = b'Z\x00\x00\x00\x05I' in data  # ReadyForQuery
        return [data]

    proxy.mangle = mangle
    try:
        proxied = url.set(host='127.0.0.1', port=proxy.port)
        dbtune = apps(
            proxied.render_as_string(hide_password=False),
            METHODS,
            tables=False,
        ).app.registry.dbtune
        assert dbtune.listener is None
        stalling.set()
        changes.start(dbtune)
        listener = dbtune.listener
        assert withheld.wait(10)  # the parent's first connect waits
        assert not listener.listening.is_set()
        assert in_a_child(lambda: listener.listening.wait(10))
        # As a gunicorn master's when_ready stops it: it cannot, and says
        # so; its children listen all the same.
        with caplog.at_level(logging.WARNING, 'pyramid_dbtune.cache.changes'):
            listener.before_fork(timeout=0.1)
        assert 'did not stop within 0.1 s before the fork' in caplog.text
        assert in_a_child(lambda: listener.listening.wait(10))
    finally:
        let_go.set()  # the parent's connection fails, and it stops
        proxy.cut()


def test_a_dbtune_has_one_listener(postgresql_url, apps):
    dbtune = listening(postgresql_url, apps).app.registry.dbtune
    listener = dbtune.listener
    before = listeners()
    changes.start(dbtune)  # as the Zope side's operator's views do
    assert dbtune.listener is listener
    assert listeners() == before


def test_a_shared_cache_is_kept_when_a_process_starts_listening(
    postgresql_url, memcached, apps
):
    settings = {**shared_settings(memcached), **LISTEN}
    first = listening(postgresql_url, apps, settings)
    call(first, *READS)
    # A process of the app's own cache listening too, which a question
    # of the shared one's does not concern.
    own = apps(postgresql_url, METHODS, LISTEN, tables=False)
    assert own.app.registry.dbtune.listener.listening.wait(10)
    second = apps(postgresql_url, METHODS, settings, tables=False)
    listener = second.app.registry.dbtune.listener
    assert listener.listening.wait(10) and listener.drops == 0
    mine = own.app.registry.dbtune.listener  # heard the question, and
    assert (mine.failures, mine.drops) == (0, 1)  # went on listening
    # What others cached stays: their listeners heard what it did not.
    assert call(second, *READS)['cache']['hit'] == len(READS)
    # Nor does a master that hands listening to its workers drop it.
    other = apps(postgresql_url, METHODS, settings, tables=False)
    other.app.registry.dbtune.listener.before_fork()
    assert call(second, *READS)['cache']['hit'] == len(READS)
    # A question that no process asked (a token of another shape, which
    # memcached would refuse as a key) is not answered.
    errors = second.app.registry.dbtune.cache.errors
    outside(
        postgresql_url,
        """SELECT pg_notify('dbtune_changes', '{"p": "a b"}')""",
    )
    assert dropped(second, 'UPDATE property SET rent = 97 WHERE id = 4') == [
        1, 4, 5
    ]  # fmt: skip
    assert second.app.registry.dbtune.cache.errors == errors
    # Its own writes dropped their rows for every process at commit.
    call(second, ('set_rent', {'id': 4, 'rent': 98}))
    deadline = time.monotonic() + 10
    while listener.own < 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert call(first, ('get', {'id': 4}))['results'][0]['rows'] == [
        [4, 'Burley', 98]
    ]


#: An outside job's burst of writes, a statement per change.
BURST = 5000
BURSTS = {
    'postgresql': f'DO $$ BEGIN FOR i IN 1..{BURST} LOOP '
    'UPDATE property SET rent = i WHERE id = 4; END LOOP; END $$',
    'mysql': f'BEGIN NOT ATOMIC FOR i IN 1..{BURST} DO '
    'UPDATE property SET rent = i WHERE id = 4; END FOR; END',
}


def test_a_burst_of_writes_is_dropped_from_a_shared_cache_at_once(
    server_url, memcached, apps
):
    # Each change bumped memcached's generations of its tags in turn: a
    # burst held the listening processes up for seconds, and a process
    # that started then, not answered within its wait, dropped the cache
    # of every process. What one read of the changes finds is bumped
    # together (on PostgreSQL, up to READ_AHEAD notices).
    settings = {**shared_settings(memcached), **LISTEN}
    app = listening(server_url, apps, settings)
    assert call(app, ('get', {'id': 4}))['cache']['hit'] == 0
    listener = app.app.registry.dbtune.listener
    cache = app.app.registry.dbtune.cache
    notices, bumps = listener.notices, cache.invalidations
    outside(server_url, BURSTS[server_url.split('+')[0].split(':')[0]])
    until(lambda: listener.notices == notices + BURST)
    assert cache.invalidations - bumps <= BURST / 10
    assert rows_of_get(app, 4) == [[4, 'Burley', BURST]]


def test_a_site_started_anew_drops_what_changed_while_none_listened(
    server_url, memcached, apps, caplog
):
    # Every process of the site stops; a change is made; the site starts
    # again on the memcached cache it had: nobody heard the change.
    settings = {**shared_settings(memcached), **LISTEN}
    before = listening(server_url, apps, settings)
    assert rows_of_get(before, 4) == [[4, 'Burley', 70]]
    before.app.registry.dbtune.close()
    outside(server_url, 'UPDATE property SET rent = 97 WHERE id = 4')
    after = apps(server_url, METHODS, settings, tables=False)
    listener = after.app.registry.dbtune.listener
    assert listener.listening.wait(10) and listener.drops == 1
    assert rows_of_get(after, 4) == [[4, 'Burley', 97]]
    assert 'no other process listens; every cached result was dropped' in (
        caplog.text
    )
    # A process that starts now is told that one listens: it keeps all.
    more = apps(server_url, METHODS, settings, tables=False)
    listener = more.app.registry.dbtune.listener
    assert listener.listening.wait(10) and listener.drops == 0
    assert call(more, ('get', {'id': 4}))['cache']['hit'] == 1


def test_a_listener_stopped_while_it_asks_neither_drops_nor_listens(
    mysql_url, memcached, apps
):
    # Others read every 2 s: it would wait 8 s for an answer.
    settings = {**shared_settings(memcached), **LISTEN,
                'dbtune.cache.listen_every': '2'}  # fmt: skip
    create_tables(mysql_url)
    engine = sa.create_engine(mysql_url, poolclass=sa.pool.NullPool)
    triggers.install(engine, {'property': (('area', 'id'), ('rent',))})
    engine.dispose()
    before = set(threading.enumerate())
    app = apps(mysql_url, METHODS, settings, tables=False)
    listener = app.app.registry.dbtune.listener
    (thread,) = set(threading.enumerate()) - before

    def asked():
        engine = sa.create_engine(mysql_url, poolclass=sa.pool.NullPool)
        with engine.connect() as connection:
            count = connection.exec_driver_sql(
                f"SELECT COUNT(*) FROM dbtune_changes WHERE tbl = '{PROBE}'"
            ).scalar()
        engine.dispose()
        return count == 1

    until(asked)
    listener.before_fork()  # as a gunicorn master does, before its fork
    assert not thread.is_alive()
    assert (listener.drops, listener.listening.is_set()) == (0, False)


def rows_of_get(app, id_):
    return call(app, ('get', {'id': id_}))['results'][0]['rows']


def test_a_read_of_tables_not_told_is_not_watched(sqlite_url, apps):
    unknown = {'name': 'unknown', 'sql': 'SELECT * FROM f()',
               'cache_time': 20}  # fmt: skip
    app = apps(sqlite_url, [*METHODS, unknown])
    dbtune = app.app.registry.dbtune
    assert dbtune.methods['unknown'].invalidated_by == {'*'}
    assert triggers.tables_to_watch(dbtune) == {
        'property': (('area', 'id'), ('rent',))
    }


def test_mariadbs_changes_are_kept_an_hour(mysql_url, apps):
    create_tables(mysql_url)
    engine = sa.create_engine(mysql_url, poolclass=sa.pool.NullPool)
    triggers.install(engine, {'property': ['area', 'id']})
    outside(
        mysql_url,
        "INSERT INTO dbtune_changes (tbl, at) VALUES ('property', "
        "NOW(6) - INTERVAL 2 HOUR), ('property', NOW(6))",
    )
    app = apps(mysql_url, METHODS, LISTEN, tables=False)
    assert app.app.registry.dbtune.listener.listening.wait(10)
    deadline = time.monotonic() + 10
    with engine.connect() as connection:
        while (
            connection.exec_driver_sql(
                'SELECT count(*) FROM dbtune_changes'
            ).scalar()
            > 1
        ):
            assert time.monotonic() < deadline
            time.sleep(0.05)
            connection.rollback()
    engine.dispose()


def test_an_app_without_a_database_closes():
    config = Configurator()
    config.include('pyramid_dbtune')
    config.commit()
    config.registry.dbtune.close()  # no listener, no engines: nothing
    assert config.registry.dbtune.router is None


def test_the_apps_own_writes_reach_every_process(server_url, apps):
    """On PostgreSQL, the listener applies the app's own writes to its
    cache as it applies anyone's: the write's commit waits until it has,
    so that the request's next read is fresh, and a hit. On MariaDB, the
    commit dropped their rows: its listener passes over the change.
    Another process, whose cache is its own, hears it too. The stats
    count both."""
    app = listening(server_url, apps)
    stats = {'dbtune.stats': 'true', 'dbtune.stats.token': 'x' * 16}
    other = apps(server_url, METHODS, {**LISTEN, **stats}, tables=False)
    assert other.app.registry.dbtune.listener.listening.wait(10)
    mine = app.app.registry.dbtune.listener
    call(app, *READS)
    call(other, *READS)
    wait = heard(other)
    call(app, ('set_rent', {'id': 1, 'rent': 93}))
    postgresql = server_url.startswith('postgresql')  # else dropped
    # No wait: the commit returned once its change was applied here.
    mine_hits = [call(app, read)['cache']['hit'] for read in READS]
    assert mine_hits == ([1] * 6 if postgresql else [0, 1, 1, 0, 1, 0])
    found = call(app, ('get', {'id': 1}))['results'][0]['rows']
    assert found == [[1, 'Headingley', 93]]
    wait()
    hits = [call(other, read)['cache']['hit'] for read in READS]
    assert hits == ([1] * 6 if postgresql else [0, 1, 1, 0, 1, 0])
    until(lambda: mine.own + mine.notices >= 1, 10)
    # On MariaDB the in-process cache matched the commit's own rows with
    # its reads: the listener applies the change again, as anyone's (it
    # could be a trigger's of the user's, of other rows).
    assert (mine.own, mine.notices, mine.late) == (
        (1, 1, 0) if postgresql else (0, 1, 0)
    )
    figures = other.app.registry.dbtune.stats.snapshot()['cache']
    assert figures['changes_heard'] == 1 and figures['changes_own'] == 0
    metrics = other.app.registry.dbtune.stats.exposition()[0].decode()
    assert 'dbtune_changes_total{event="changes_heard"} 1.0' in metrics


#: A trigger of the user's: an order takes from the stock.
TAKE = {
    'postgresql': [
        'CREATE FUNCTION take() RETURNS trigger LANGUAGE plpgsql AS $$ '
        'BEGIN UPDATE stock SET n = n - NEW.qty WHERE item = NEW.item; '
        'RETURN NULL; END $$',
        'CREATE TRIGGER take AFTER INSERT ON orders FOR EACH ROW '
        'EXECUTE FUNCTION take()',
    ],
    'mysql': [
        'CREATE TRIGGER take AFTER INSERT ON orders FOR EACH ROW '
        'UPDATE stock SET n = n - NEW.qty WHERE item = NEW.item'
    ],
}
ORDERS = [
    {'name': 'stock', 'sql': 'SELECT item, n FROM stock WHERE item = :item',
     'cache_time': 300},
    {'name': 'orders', 'cache_time': 300,
     'sql': 'SELECT item, qty FROM orders WHERE item = :item'},
    {'name': 'order',
     'sql': 'INSERT INTO orders (item, qty) VALUES (:item, :qty)'},
]  # fmt: skip


def stock_and_orders(url, stock, watch_stock=('item',)):
    """The tables of the stock (rows ``stock``) and of its orders, the
    trigger of the user's that takes an order from the stock (TAKE), and
    the package's triggers on both."""
    kind = 'postgresql' if url.startswith('postgresql') else 'mysql'
    outside(
        url,
        'CREATE TABLE stock (item INTEGER PRIMARY KEY, n INTEGER)',
        'CREATE TABLE orders (item INTEGER, qty INTEGER)',
        f'INSERT INTO stock VALUES {stock}',
        *TAKE[kind],
    )
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    triggers.install(engine, {'orders': ['item'], 'stock': list(watch_stock)})
    engine.dispose()
    return kind


@pytest.mark.parametrize('shared', [False, True])
def test_a_users_trigger_that_changes_another_table_is_heard(
    server_url, shared, apps, request
):
    """The app's write of one table fires a trigger of the user's that
    changes another in the same transaction. The app's commit drops the
    reads of the table it wrote; the other's change, though made on the
    app's connection, is applied as anyone's: its cached reads are fresh
    at once, not when their cache_time runs out."""
    kind = stock_and_orders(server_url, '(1, 100)')
    settings = (
        shared_settings(request.getfixturevalue('memcached')) if shared else {}
    )
    app = apps(server_url, ORDERS, {**settings, **LISTEN}, tables=False)
    listener = app.app.registry.dbtune.listener
    assert listener.listening.wait(10)

    def rows(name):
        return call(app, (name, {'item': 1}))['results'][0]['rows']

    assert (rows('stock'), rows('orders')) == ([[1, 100]], [])
    call(app, ('order', {'item': 1, 'qty': 5}))
    until(lambda: rows('stock') == [[1, 95]], 10)
    # The change of the table the app wrote is its own all the same (but
    # where MariaDB's in-process cache matched the commit's own rows with
    # its reads); the trigger's is not.
    own = 0 if kind == 'mysql' and not shared else 1
    until(lambda: listener.own >= own, 10)
    assert listener.own == own
    assert rows('orders') == [[1, 5]]


@pytest.mark.parametrize('shared', [False, True])
def test_a_users_trigger_heard_where_the_app_writes_its_table_too(
    server_url, shared, apps, request
):
    """A transaction of the app writes a row of the table a trigger of
    the user's changes another row of: its commit drops the reads of the
    row it wrote; the trigger's change is applied as anyone's all the
    same (MySQL's mark tells the rows the commit dropped, not the whole
    tables)."""
    kind = stock_and_orders(server_url, '(1, 100), (2, 100)')
    settings = (
        shared_settings(request.getfixturevalue('memcached')) if shared else {}
    )
    restock = {
        'name': 'restock',
        'sql': 'UPDATE stock SET n = :n WHERE item = :item',
    }
    bump = {'name': 'bump', 'sql': 'UPDATE stock SET n = n + 1'}
    app = apps(server_url, [*ORDERS, restock, bump],
               {**settings, **LISTEN}, tables=False)  # fmt: skip
    assert app.app.registry.dbtune.listener.listening.wait(10)

    def stock(item):
        found = call(app, ('stock', {'item': item}))['results'][0]['rows']
        return found[0][1]

    assert (stock(1), stock(2)) == (100, 100)
    call(app, ('order', {'item': 1, 'qty': 5}),
         ('restock', {'item': 2, 'n': 110}))  # fmt: skip
    assert stock(2) == 110
    until(lambda: stock(1) == 95, 10)
    # A write whose rows are not told: its commit drops every read of the
    # table, and the listener passes over its changes (MySQL's mark).
    listener = app.app.registry.dbtune.listener
    own = listener.own
    call(app, ('bump', {}))
    assert (stock(1), stock(2)) == (96, 111)
    if kind == 'mysql' and shared:
        until(lambda: listener.own == own + 2, 10)


def test_a_mark_names_so_many_tags_at_the_most(
    mysql_url, memcached, apps, monkeypatch
):
    """A MySQL commit that writes many rows marks some of its tags: its
    changes beyond them are applied as anyone's, and nothing is missed."""
    monkeypatch.setattr(changelog, 'MAX_MARKED', 2)
    settings = {**shared_settings(memcached), **LISTEN}
    app = listening(mysql_url, apps, settings)
    listener = app.app.registry.dbtune.listener
    call(app, *READS)
    writes = [('set_rent', {'id': i, 'rent': 50 + i}) for i in (1, 2, 3)]
    wait = heard(app, 1)  # the changes its mark does not name, applied
    call(app, *writes)
    wait()
    engine = sa.create_engine(mysql_url, poolclass=sa.pool.NullPool)
    with engine.connect() as connection:
        (marked,) = connection.execute(
            sa.text("SELECT cols FROM dbtune_changes WHERE tbl = ''")
        ).one()
    engine.dispose()
    assert len(json.loads(marked)) == 2
    until(lambda: listener.own + listener.notices == 3, 10)
    assert [rows_of_get(app, i)[0][2] for i in (1, 2, 3)] == [51, 52, 53]


def test_a_users_trigger_heard_where_a_range_of_its_table_is_read(
    mysql_url, apps
):
    """As above, where the table's reads are of a range, which the
    in-process cache matches with the rows a commit wrote, not by tags:
    the change a trigger of the user's made to other rows is applied."""
    stock_and_orders(mysql_url, '(1, 100), (2, 100)', watch_stock=['n'])
    methods = [
        {'name': 'low', 'cache_time': 300,
         'sql': 'SELECT item, n FROM stock WHERE n < :n ORDER BY item'},
        {'name': 'restock',
         'sql': 'UPDATE stock SET n = :n WHERE item = :item'},
        ORDERS[2],
    ]  # fmt: skip
    app = apps(mysql_url, methods, LISTEN, tables=False)
    assert app.app.registry.dbtune.listener.listening.wait(10)

    def below(n):
        return call(app, ('low', {'n': n}))['results'][0]['rows']

    assert below(96) == []
    call(app, ('order', {'item': 1, 'qty': 5}),
         ('restock', {'item': 2, 'n': 110}))  # fmt: skip
    until(lambda: below(96) == [[1, 95]], 10)


#: Reads pinned by columns whose values a trigger tells otherwise than an
#: argument equal to them may be written: (type, value, argument), each.
WRITTEN_OTHERWISE = {
    'postgresql': [
        ('bytea', 'bytea', "'abc'", 'abc'),  # told as \\x616263
        ('mac', 'macaddr', "'aa:bb:cc:dd:ee:ff'", 'AA-BB-CC-DD-EE-FF'),
        ('uuid', 'uuid', "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
         '{A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11}'),
    ],
    'mysql': [
        ('uuid', 'uuid', "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
         'A0E-EBC999C0B4EF8BB6D6BB9BD380A11'),  # MariaDB's own type
        ('enum', "enum('a', 'b', 'c')", "'b'", 2),  # told as 'b'
        ('sets', "set('a', 'b', 'c')", "'a,b'", 3),  # told as 'a,b'
    ],
}  # fmt: skip


@pytest.mark.parametrize('shared', [False, True])
def test_a_change_drops_reads_pinned_by_values_written_otherwise(
    server_url, shared, apps, request
):
    """A change made outside drops the reads pinned by bytes, an address,
    a uuid or MySQL's ENUM and SET, whatever form their arguments take: a
    uuid is tagged by its standard form, as the trigger tells it; the
    others cannot be matched with the values the trigger tells, so every
    read of the table goes."""
    kind = 'postgresql' if server_url.startswith('postgresql') else 'mysql'
    cases = WRITTEN_OTHERWISE[kind]
    statements = []
    for name, type_, value, _ in cases:
        statements += [
            f'CREATE TABLE t_{name} (v {type_} PRIMARY KEY, n int)',
            f'INSERT INTO t_{name} VALUES ({value}, 1)',
        ]
    outside(server_url, *statements)
    engine = sa.create_engine(server_url, poolclass=sa.pool.NullPool)
    triggers.install(engine, {f't_{name}': ['v'] for name, *_ in cases})
    engine.dispose()
    settings = (
        shared_settings(request.getfixturevalue('memcached')) if shared else {}
    )
    methods = [
        {'name': name, 'cache_time': 300,
         'sql': f'SELECT n FROM t_{name} WHERE v = :value'}
        for name, *_ in cases
    ]  # fmt: skip
    app = apps(server_url, methods, {**settings, **LISTEN}, tables=False)
    assert app.app.registry.dbtune.listener.listening.wait(10)
    reads = [(name, {'value': arg}) for name, *_, arg in cases]

    def found():
        return [call(app, read)['results'][0]['rows'][0][0] for read in reads]

    assert found() == [1] * len(reads)
    wait = heard(app, len(reads))
    outside(
        server_url,
        *[f'UPDATE t_{name} SET n = 2' for name, *_ in cases],
    )
    wait()
    assert found() == [2] * len(reads)


#: A read of t_uuid by its uuid, and a write.
UUID_METHODS = [
    {'name': 'get', 'cache_time': 300,
     'sql': 'SELECT n FROM t_uuid WHERE v = :v'},
    {'name': 'set', 'sql': 'UPDATE t_uuid SET n = :n WHERE v = :v'},
]  # fmt: skip


def uuid_table(url, *uuids):
    """The table t_uuid, a row of n = 1 for each of ``uuids``, and the
    package's triggers on it."""
    rows = ', '.join(f"('{u}', 1)" for u in uuids)
    outside(
        url,
        'CREATE TABLE t_uuid (v uuid PRIMARY KEY, n int)',
        f'INSERT INTO t_uuid VALUES {rows}',
    )
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    triggers.install(engine, {'t_uuid': ['v']})
    engine.dispose()


def test_a_read_pinned_by_a_uuid_is_kept_by_another_rows_change(
    server_url, memcached, apps
):
    """A read pinned by a uuid, in any form the column reads, is dropped
    by a change of its row alone, in or outside the application. (The
    in-process cache, which patches changes into reads with a shape,
    cannot compare uuids written two ways, and drops more.)"""
    # (One that begins with a digit has no tag: MySQL compares a string
    # with a number by the number it begins with.)
    u1, u2 = (
        'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
        'b1ffcd88-0000-4000-8000-000000000000',
    )
    uuid_table(server_url, u1, u2)
    settings = {**shared_settings(memcached), **LISTEN}
    app = apps(server_url, UUID_METHODS, settings, tables=False)
    assert app.app.registry.dbtune.listener.listening.wait(10)
    read = ('get', {'v': u1.upper().replace('-', '')})
    assert call(app, read)['results'][0]['rows'] == [[1]]
    wait = heard(app)
    outside(server_url, f"UPDATE t_uuid SET n = 2 WHERE v = '{u2}'")
    wait()
    assert call(app, read)['cache']['hit'] == 1
    call(app, ('set', {'v': u2.replace('-', ''), 'n': 3}))
    assert call(app, read)['cache']['hit'] == 1
    wait = heard(app)
    outside(server_url, f"UPDATE t_uuid SET n = 4 WHERE v = '{u1}'")
    wait()
    assert call(app, read)['results'][0]['rows'] == [[4]]
    call(app, ('set', {'v': u1, 'n': 5}))
    assert call(app, read)['results'][0]['rows'] == [[5]]


def test_a_uuid_of_letters_alone_is_compared_as_a_uuid(server_url, apps):
    """The in-process cache, which matches changes with its reads, does
    not take a uuid written two ways for two values, though neither has
    a digit (the Max UUID): a change of its row, made in or outside the
    application, drops the read."""
    top = 'ffffffff-ffff-ffff-ffff-ffffffffffff'
    uuid_table(server_url, top)
    app = apps(server_url, UUID_METHODS, LISTEN, tables=False)
    assert app.app.registry.dbtune.listener.listening.wait(10)
    read = ('get', {'v': top.replace('-', '')})

    def found():
        return call(app, read)['results'][0]['rows']

    assert found() == [[1]]
    outside(server_url, f"UPDATE t_uuid SET n = 2 WHERE v = '{top}'")
    until(lambda: found() == [[2]], 10)
    call(app, ('set', {'v': top, 'n': 3}))
    until(lambda: found() == [[3]], 10)


def test_an_own_commit_not_heard_of_in_time_drops_its_rows(
    postgresql_url, apps, monkeypatch
):
    """Where the listener does not hear of the app's commit in time, the
    commit drops the reads it may have changed itself, as it would
    without a listener: its next read is fresh all the same."""
    app = listening(postgresql_url, apps)
    listener = app.app.registry.dbtune.listener
    monkeypatch.setattr(changes, 'SETTLE_WITHIN', 0)
    call(app, *READS)
    # A listener that is slow to apply a change: the commit's own notice,
    # after it, is not heard before the commit stops waiting (else, with
    # no time to wait, a quick listener could still win the race).
    apply_all = listener.apply_all

    def slow_apply_all(changes):
        time.sleep(0.3)
        apply_all(changes)

    monkeypatch.setattr(listener, 'apply_all', slow_apply_all)
    call(app, ('set_rent', {'id': 1, 'rent': 93}))
    assert listener.late == 1
    hits = [call(app, read)['cache']['hit'] for read in READS]
    assert hits == [0, 1, 1, 0, 1, 0]
    found = call(app, ('get', {'id': 1}))['results'][0]['rows']
    assert found == [[1, 'Headingley', 93]]


def test_an_own_commit_that_fails_waits_for_nothing(postgresql_url, apps):
    """A commit that fails after its token went: nothing is dropped, and
    nothing waited for."""
    book = {'name': 'book', 'sql': 'INSERT INTO booking VALUES (:id)'}
    app = listening(postgresql_url, apps, methods=[*METHODS, book])
    listener = app.app.registry.dbtune.listener
    outside(
        postgresql_url,
        'CREATE TABLE booking (property_id INTEGER REFERENCES property (id) '
        'DEFERRABLE INITIALLY DEFERRED)',
    )
    call(app, *READS)
    # The foreign key is checked at COMMIT, after both writes succeeded.
    with pytest.raises(sa.exc.IntegrityError):
        call(app, ('set_rent', {'id': 1, 'rent': 95}), ('book', {'id': 999}))
    hits = [call(app, read)['cache']['hit'] for read in READS]
    assert hits == [1] * 6 and listener.late == 0
    assert app.app.registry.dbtune.cache.invalidations == 0


def test_a_row_leaving_a_full_page_brings_up_the_next(postgresql_url, apps):
    """A cache fill of a read cut at max_rows holds a few rows more in
    reserve: a change that takes a row off the page brings up the next
    one, where it would have dropped the page. Once they are spent, the
    page goes."""
    cheapest = {
        'name': 'cheapest',
        'sql': 'SELECT id, rent FROM property WHERE area = :area '
        'ORDER BY rent, id',
        'cache_time': 20,
        'max_rows': 2,
    }
    app = listening(postgresql_url, apps, methods=[*METHODS, cheapest])
    wait = heard(app)
    outside(
        postgresql_url,
        "INSERT INTO property VALUES (5, 'Headingley', 100), "
        "(6, 'Headingley', 110)",
    )
    wait()
    page = ('cheapest', {'area': 'Headingley'})
    first = call(app, page)['results'][0]
    assert first['rows'] == [[1, 90], [5, 100]] and first['truncated']
    for taken, rows, hit in (
        (1, [[5, 100], [6, 110]], 1),  # the one in reserve comes up
        (5, [[6, 110], [2, 120]], 0),  # none left: a new fill
    ):
        wait = heard(app)
        outside(
            postgresql_url,
            f'UPDATE property SET rent = 200 WHERE id = {taken}',
        )
        wait()
        answer = call(app, page)
        assert answer['results'][0]['rows'] == rows
        assert answer['cache']['hit'] == hit


def test_a_change_told_by_a_trigger_made_before_images_drops_by_row(
    postgresql_url, apps
):
    """A MySQL trigger installed by an earlier version tells a list of
    rows, not old and new: what they tell is dropped, nothing patched."""
    app = listening(postgresql_url, apps)
    call(app, *READS)
    listener = app.app.registry.dbtune.listener
    listener.apply('property', [{'area': 'Burley', 'id': 4}])
    hits = [call(app, read)['cache']['hit'] for read in READS]
    assert hits == [1, 0, 1, 1, 0, 0]


@pytest.mark.parametrize('listen', [False, True])
def test_a_single_precision_float_compared_drops_its_reads(
    server_url, apps, listen
):
    """A REAL (PostgreSQL) or FLOAT (MariaDB) column holds 0.1 as the
    float nearest it, read as 0.1 but compared with an argument as
    0.100000001490116...: more than 0.1. A change of its rows is not
    matched with, nor patched into, the reads that compare it: they are
    dropped, with the listener or without."""
    outside(
        server_url,
        'CREATE TABLE reading (id INTEGER PRIMARY KEY, x FLOAT(20))',
        'INSERT INTO reading VALUES (1, 0.1), (2, 0.5)',
    )
    above = {
        'name': 'above',
        'sql': 'SELECT id, x FROM reading WHERE x > :p ORDER BY id',
        'cache_time': 300,
    }
    counted = {
        'name': 'counted',
        'sql': 'SELECT count(*) FROM reading WHERE x > :p',
        'cache_time': 300,
    }
    gone = {'name': 'gone', 'sql': 'DELETE FROM reading WHERE id = :id'}
    methods = [above, counted, gone]
    app = apps(server_url, methods, tables=False)
    if listen:
        engine = sa.create_engine(server_url, poolclass=sa.pool.NullPool)
        triggers.install(
            engine, triggers.tables_to_watch(app.app.registry.dbtune)
        )
        engine.dispose()
        app = apps(server_url, methods, LISTEN, tables=False)
        assert app.app.registry.dbtune.listener.listening.wait(10)
    reads = [('above', {'p': 0.1}), ('counted', {'p': 0.1})]
    found = [r['rows'] for r in call(app, *reads)['results']]
    assert found == [[[1, 0.1], [2, 0.5]], [[2]]]
    call(app, ('gone', {'id': 1}))
    found = [r['rows'] for r in call(app, *reads)['results']]
    assert found == [[[2, 0.5]], [[1]]]
