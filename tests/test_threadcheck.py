"""``dbtune threadcheck`` against real HTTP servers in this process.

wsgiref's server runs one request at a time and says so; waitress runs
them on 8 threads and says it is threaded; behind a lock, waitress claims
threads that cannot run waits in parallel, which threadcheck must call
far below its claims. The gunicorn servers are in test_gunicorn.py.
"""

import io
import json
import subprocess
import sys
import threading
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
import waitress.server
from pyramid.config import Configurator

from pyramid_dbtune import cli, probes, threadcheck
from pyramid_dbtune.threadcheck import Capacity, judge

TOKEN = 'a-probe-token-16-chars'
QUICK = ['--duration', '0.3', '--ms', '20', '--token', TOKEN]


class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


class OneAtATime(WSGIServer):
    # Connections wait in the backlog, not in SYN retries.
    request_queue_size = 64


def probe_app(url=None):
    settings = {'dbtune.probes': 'true', 'dbtune.stats.token': TOKEN}
    if url:
        settings['dbtune.url'] = url
    with Configurator(settings=settings) as config:
        config.include('pyramid_dbtune')
        return config.make_wsgi_app()


@pytest.fixture
def serve():
    """``serve(app, threads)``: the URL of a server for ``app``: wsgiref
    for one thread, waitress for more."""
    stops = []

    def start(app, threads=1):
        if threads == 1:
            server = make_server('127.0.0.1', 0, app, OneAtATime, Quiet)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            stops.append(lambda: (server.shutdown(), server.server_close()))
            return f'http://127.0.0.1:{server.server_port}'
        server = waitress.server.create_server(
            app, host='127.0.0.1', port=0, threads=threads
        )
        threading.Thread(target=server.run, daemon=True).start()
        stops.append(server.close)
        return f'http://127.0.0.1:{server.effective_port}'

    yield start
    for stop in stops:
        stop()


def behind_a_lock(app):
    """``app`` with one request at a time: a global lock, as a shared
    connection or a careless module-level resource would make one."""
    lock = threading.Lock()

    def locked(environ, start_response):
        with lock:
            return list(app(environ, start_response))

    return locked


@pytest.fixture(autouse=True)
def nothing_declared(monkeypatch):
    monkeypatch.setattr(probes, '_declared', {})


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    args = _parse(['threadcheck', *argv])
    status = args.run(args, stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


def _parse(argv):
    parser = cli.argparse.ArgumentParser(prog='dbtune')
    threadcheck.add_parser(parser.add_subparsers(dest='command'))
    return parser.parse_args(argv)


def test_one_at_a_time_server(serve):
    status, out, err = run(serve(probe_app()), *QUICK, '--probes', 'io,cpu')
    assert status == 0, out
    assert '1 process × 1 thread judged from the WSGI flags' in out
    assert 'one request at a time: one process with one thread' in out
    assert 'threadcheck: io probe done' in err


def test_threads_behind_a_lock_are_far_below_their_claims(serve):
    url = serve(behind_a_lock(probe_app()), threads=8)
    status, out, _ = run(url, *QUICK, '--probes', 'io')
    assert status == 1, out
    assert '— far below the 8 this server claims (1 × 8)' in out
    assert (
        'Verdict: parallelism is far below what the server claims (I/O)'
        in (out)
    )


def test_threaded_server_runs_waits_in_parallel(serve, sqlite_url):
    url = serve(probe_app(sqlite_url), threads=8)
    status, out, _ = run(url, *QUICK, '--json', '--concurrency', '4')
    report = json.loads(out)
    assert status == 0, report['verdict']
    io_ = report['probes']['io']
    assert io_['parallelism'] > 2.5, report
    assert io_['throughput_ratio'] > 2.5, report
    assert len(io_['served']) == 1  # one process...
    assert len(next(iter(io_['served'].values()))) >= 4  # ...many threads
    assert report['capacity']['threads'] >= 4
    # SQLite's probe does not wait in the database: it is Python's work,
    # one at a time in one process.
    assert report['probes']['sql']['expected'] == 1
    assert any(
        line.startswith('SQL: ') and 'does not wait' in line
        for line in report['verdict']
    ), report['verdict']


def test_no_probes_there(serve):
    url = serve(probe_app())
    status, _, err = run(url, '--duration', '0.1')  # no token
    assert status == 2
    assert 'no probe at' in err and 'set dbtune.probes = true' in err


def test_an_app_without_a_database_skips_the_sql_probe(serve, capsys):
    url = serve(probe_app())
    argv = ['threadcheck', url, '-n', '2', '-d', '0.1', '--ms', '1', '--json']
    assert cli.main([*argv, '--token', TOKEN]) == 0
    assert set(json.loads(capsys.readouterr().out)['probes']) == {'io', 'cpu'}


def test_nothing_listening(serve):
    url = serve(probe_app())
    status, _, err = run(url + '1', '--duration', '0.1')
    assert status == 2 and 'could not be reached' in err


def not_a_probe(environ, start_response):
    status = '500 Oops' if 'fail' in environ['PATH_INFO'] else '200 OK'
    start_response(status, [('Content-Type', 'text/plain')])
    return [b'hello']


def test_not_a_probe_answering(serve):
    url = serve(not_a_probe)
    status, _, err = run(url, '--duration', '0.1')
    assert status == 2 and 'did not answer as a pyramid_dbtune probe' in err
    status, _, err = run(url + '/fail', '--duration', '0.1')
    assert status == 2 and 'answered 500 Oops' in err


@pytest.mark.parametrize(
    'argv, message',
    [
        (['--concurrency', '1'], "'1' is not valid: expected a number from 2"),
        (['--duration', 'x'], "'x' is not valid"),
        (['--ms', '10001'], 'from 1 to 10000'),
        (['--probes', 'io,gpu'], 'expected probes among io, cpu, sql'),
        (['--probes', ','], 'expected probes among'),
    ],
)
def test_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(['threadcheck', 'http://127.0.0.1:1', *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_console_script():
    dbtune = Path(sys.executable).parent / 'dbtune'
    done = subprocess.run(
        [str(dbtune), 'threadcheck', 'http://127.0.0.1:9', '--duration', '1'],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert 'could not be reached' in done.stderr


def claims(**kw):
    return {
        'software': None, 'multithread': False, 'multiprocess': False,
        'server': None, 'workers': None, 'threads': None,
        'worker_class': None, 'cores': 2, **kw,
    }  # fmt: skip


@pytest.mark.parametrize(
    'kw, served, expected',
    [
        # Declared counts win over what was seen.
        ({'workers': 2, 'threads': 4}, {1: [1]}, (2, 4)),
        # Flags only: what was seen, or more than one where one was seen.
        ({'multithread': True}, {1: [1, 2, 3]}, (1, 3)),
        ({'multithread': True}, {1: [1]}, (1, 8)),
        ({'multiprocess': True}, {1: [1], 2: [2]}, (2, 1)),
        ({'multiprocess': True}, {1: [1]}, (2, 1)),
        ({}, {1: [1]}, (1, 1)),
    ],
)
def test_capacity(kw, served, expected):
    capacity = Capacity.of(claims(**kw), served, 8)
    assert (capacity.processes, capacity.threads) == expected


@pytest.mark.parametrize(
    'probe, measured, kw, words, far',
    [
        ('io', 7.8, {'workers': 1, 'threads': 8}, 'I/O: 7.8 of 8 in', False),
        ('io', 1.0, {'workers': 1, 'threads': 1}, 'one request at a', False),
        ('io', 1.1, {'workers': 1, 'threads': 8}, 'far below the 8', True),
        ('cpu', 1.0, {'workers': 1, 'threads': 8}, 'by the GIL', False),
        ('cpu', 1.0, {'workers': 1, 'threads': 1}, 'one request at a', False),
        ('cpu', 1.9, {'workers': 2, 'threads': 1}, 'CPU: 1.9 of 8 in', False),
        ('cpu', 0.9, {'workers': 4, 'threads': 1}, 'CPU affinity', True),
        ('cpu', 1.0, {'workers': 4, 'cores': 1}, 'has 1 core', False),
        ('sql', 2.0, {'workers': 1, 'threads': 8}, 'read_pool_size', True),
    ],
)
def test_judge(probe, measured, kw, words, far):
    capacity = Capacity.of(claims(**kw), {1: [1]}, 8)
    sentence, is_far = judge(probe, measured, capacity, 8)
    assert words in sentence and is_far is far


def test_judge_a_busy_host():
    capacity = Capacity.of(claims(workers=2), {1: [1]}, 8)
    assert judge('cpu', 0.8, capacity, 8, share=0.8)[1] is True
    sentence, far = judge('cpu', 0.8, capacity, 8, share=0.3)
    assert not far
    assert 'the host is busy: a CPU request alone got 30% of a core' in (
        sentence
    )
    # I/O readings do not need free cores.
    assert judge('io', 0.8, capacity, 8, share=0.3)[1] is True


def test_progress_bar_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    bar = threadcheck.Progress(stream)
    bar.update('io', 0.5)
    bar.done('io')
    text = stream.getvalue()
    assert '\r  io [' + '#' * 15 + '.' * 15 + ']  50%' in text
    assert text.endswith('threadcheck: io probe done\n')
