"""``dbtune threadcheck`` against real HTTP servers in this process.

wsgiref's server runs one request at a time and says so; waitress runs
them on 8 threads and says it is threaded; behind a lock, waitress claims
threads that cannot run waits in parallel, which threadcheck must call
far below its claims. The gunicorn servers are in test_gunicorn.py.
"""

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
import waitress.server
from pyramid.config import Configurator

from pyramid_dbtune.deploy import cli, threadcheck
from pyramid_dbtune.deploy.threadcheck import Capacity, judge
from pyramid_dbtune.ops import probes
from servers import free_port

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
    with contextlib.ExitStack() as stops:

        def start(app, threads=1):
            if threads == 1:
                server = make_server('127.0.0.1', 0, app, OneAtATime, Quiet)
                threading.Thread(
                    target=server.serve_forever, daemon=True
                ).start()
                stops.callback(server.server_close)
                stops.callback(server.shutdown)
                return f'http://127.0.0.1:{server.server_port}'
            # poll, not select: closing the server from this thread while
            # its loop waits is then a closed channel, not an EBADF error
            # in the loop's thread.
            server = waitress.server.create_server(
                app, host='127.0.0.1', port=0, threads=threads,
                asyncore_use_poll=True,
            )  # fmt: skip
            loop = threading.Thread(target=server.run, daemon=True)
            loop.start()
            stops.callback(loop.join, 10)
            stops.callback(server.close)
            return f'http://127.0.0.1:{server.effective_port}'

        yield start


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
    monkeypatch.setattr(probes, 'declared', {})


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
    # Other load on the machine lengthens each request's own work: waits
    # of 50 ms keep it small beside them, and the best of three is taken.
    waits = ['--duration', '0.6', '--ms', '50', '--token', TOKEN]
    for _ in range(3):
        status, out, _ = run(url, *waits, '--json', '--concurrency', '4')
        report = json.loads(out)
        io_ = report['probes']['io']
        if io_['parallelism'] > 2.5 and io_['throughput_ratio'] > 2.5:
            break
    assert status == 0, report['verdict']
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
    argv = ['threadcheck', url, '-n', '2', '-d', '0.1', '--ms', '10', '--json']
    assert cli.main([*argv, '--token', TOKEN]) == 0
    assert set(json.loads(capsys.readouterr().out)['probes']) == {'io', 'cpu'}


def test_nothing_listening():
    # A port bound and not listening: connections to it are refused.
    with socket.socket() as bound:
        bound.bind(('127.0.0.1', 0))
        url = f'http://127.0.0.1:{bound.getsockname()[1]}'
        status, _, err = run(url, '--duration', '0.1')
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
        (['--concurrency', '100000000'], 'from 2 to 256'),
        (['--duration', 'x'], "'x' is not valid"),
        (['--ms', '10001'], 'from 10 to 10000'),
        (['--ms', '5'], 'from 10 to 10000'),
        (['--duration', 'nan'], "'nan' is not valid"),
        (['--duration', 'inf'], "'inf' is not valid"),
        (['--probes', 'io,gpu'], 'expected probes among io, cpu, sql'),
        (['--probes', ','], 'expected probes among'),
    ],
)
def test_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(['threadcheck', 'http://127.0.0.1:1', *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


#: The ``dbtune`` console script, run as its entry point says: the same
#: under pip (a script beside the interpreter) and buildout (in bin/).
CONSOLE_SCRIPT = (
    'import sys; from importlib.metadata import entry_points; '
    "(script,) = entry_points(group='console_scripts', name='dbtune'); "
    'sys.exit(script.load()())'
)


def test_console_script():
    done = subprocess.run(
        [
            sys.executable,
            '-c',
            CONSOLE_SCRIPT,
            'threadcheck',
            'http://127.0.0.1:9',
            '--duration',
            '1',
        ],  # fmt: skip
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
        'worker_class': None, 'cores': CORES, **kw,
    }  # fmt: skip


CORES = len(os.sched_getaffinity(0))


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
        # Never fewer than served: several servers behind a balancer.
        ({'workers': 1, 'threads': 1}, {1: [1], 2: [2], 3: [3]}, (3, 1)),
        ({'workers': 1, 'threads': 2}, {1: [1, 2, 3]}, (1, 3)),
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
        # Two processes that run one request at a time are far below.
        ('cpu', 1.0, {'workers': 2, 'cores': 2}, 'far below the 2', True),
        ('io', 1.4, {'workers': 2}, 'far below the 2', True),
        ('io', 1.6, {'workers': 2}, 'I/O: 1.6 of 8 in parallel', False),
        # One at a time claimed: queueing outside, never far below.
        ('io', 0.39, {'workers': 1, 'threads': 1}, 'queued before', False),
        ('cpu', 0.5, {'workers': 1, 'threads': 8}, 'queued before', False),
        # Well above the claim: said, not far.
        ('io', 7.6, {'workers': 1, 'threads': 1}, 'well above the 1', False),
        ('io', 5.0, {'workers': 2, 'threads': 1}, 'well above the 2', False),
        ('io', 3.4, {'workers': 2, 'threads': 1}, 'in parallel', False),
        # Green threads: one OS thread, so no GIL to blame.
        ('cpu', 1.0, {'workers': 1, 'threads': 1000, 'cores': 2,
                      'worker_class': 'gevent'},
         'green threads take turns in one thread of one process; run 2 pro',
         False),
        ('cpu', 1.0, {'workers': 1, 'threads': 8, 'cores': 2},
         'serialised by the GIL inside one process; run 2 pro', False),
    ],
)  # fmt: skip
def test_judge(probe, measured, kw, words, far):
    capacity = Capacity.of(claims(**kw), {1: [1]}, 8)
    sentence, is_far = judge(probe, measured, capacity, 8)
    assert words in sentence and is_far is far


def test_judge_a_busy_host():
    capacity = Capacity.of(claims(workers=2), {1: [1]}, 8)
    assert judge('cpu', 0.8, capacity, 8, share=0.8)[1] is True
    sentence, far = judge('cpu', 0.8, capacity, 8, share=0.3)
    assert not far
    assert 'the host is busy: CPU requests got 30% of a core while' in (
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
    bar.update('io', 1.7)  # the last round runs past the duration
    bar.done('io')
    text = stream.getvalue()
    assert '\r  io [' + '#' * 15 + '.' * 15 + ']  50%' in text
    assert '\r  io [' + '#' * 30 + '] 100%' in text
    assert text.endswith('threadcheck: io probe done\n')


def answers(probe, count, **fields):
    """``count`` answers of ``probe``, in their views together."""
    seconds = fields.get('seconds', 0.01)
    return [
        {'probe': probe, 'ms': 10, 'seconds': seconds, 'cpu_seconds': 0.01,
         'began': 100, 'ended': 100 + seconds, 'pid': 1, 'thread': i,
         'claims': claims(), **fields}
        for i in range(count)
    ]  # fmt: skip


def test_parallelism_is_read_on_the_servers_clocks():
    # 8 waits of 10 ms at once, in views together: however long the round
    # took on the client's clock (HTTP, Pyramid, the client's threads).
    # Their time in the views beyond the wait (the GIL after it) counts
    # against them.
    result = threadcheck.Measurement('io', 8, 'seconds')
    for _ in range(3):
        result.single.append(0.015)
        result.alone += answers('io', 1)
        result.rounds.append(0.050)
        result.answers += answers('io', 8, seconds=0.0125)
    assert result.parallelism == pytest.approx(8 * 0.8)
    assert result.as_dict()['work_ms'] == 80  # the waits asked for
    # 8 CPU bursts of 10 ms in one process's views together, taking
    # turns for the GIL: whichever ended first.
    result = threadcheck.Measurement('cpu', 8, 'cpu_seconds')
    for _ in range(3):
        result.single.append(0.015)
        result.alone += answers('cpu', 1)
        result.rounds.append(0.120)
        result.answers += [
            {**a, 'seconds': i * 0.01, 'ended': 100 + i * 0.01}
            for i, a in enumerate(answers('cpu', 8), start=1)
        ]
    assert result.parallelism == pytest.approx(1)
    assert result.raw_parallelism == pytest.approx(1)


def test_each_process_is_judged_on_its_own():
    # Two processes of 4 threads sent 8 waits each: one runs them 4 at a
    # time, the other one at a time (a lock of its own). Together they
    # read 5 of 8, which is not far below; the second process is.
    result = threadcheck.Measurement('io', 8, 'seconds', sent=16)
    for _ in range(3):
        result.answers += [
            {
                **a,
                'pid': 1,
                'began': i // 4 * 0.05,
                'ended': i // 4 * 0.05 + 0.05,
            }
            for i, a in enumerate(answers('io', 8, ms=50, seconds=0.05))
        ] + [
            {**a, 'pid': 2, 'began': i * 0.05, 'ended': i * 0.05 + 0.05}
            for i, a in enumerate(answers('io', 8, ms=50, seconds=0.05))
        ]
    assert result.parallelism == pytest.approx(5)
    assert result.processes == {1: (4, 8), 2: (1, 8)}
    capacity = Capacity(2, 4, 2, claims())
    assert not judge('io', result.parallelism, capacity, 8)[1]
    assert threadcheck.judge_processes(result.processes, capacity, 8) == [
        'I/O in process 2: 1.0 of the 4 it had threads and requests for — '
        'something in that process serialises requests that only wait (a '
        'lock)'
    ]
    # A process sent fewer requests than it has threads is judged on them.
    assert threadcheck.judge_processes({1: (1.9, 2)}, capacity, 8) == []


def test_parallelism_is_at_most_the_requests_seen_at_once():
    # A one-at-a-time server whose listen backlog overflowed: the round
    # of work and the round of no work both wait a second for the
    # client's retries, and their difference says little. The probes'
    # clocks show that no two requests were in a view at once.
    result = threadcheck.Measurement('io', 8, 'seconds')
    for _ in range(3):
        result.rounds.append(1.5)
        result.answers += [
            {**a, 'began': 100 + i * 0.1, 'ended': 100 + i * 0.1 + 0.05}
            for i, a in enumerate(answers('io', 8, ms=50))
        ]
        result.alone += answers('io', 1)
    assert result.parallelism == 1
    # Two at a time, ends and beginnings at the same instant included.
    result.answers = [
        {
            **a,
            'began': 100 + i // 2 * 0.05,
            'ended': 100 + i // 2 * 0.05 + 0.05,
        }
        for i, a in enumerate(answers('io', 24, ms=50))
    ]
    assert result.parallelism == 2


#: The probe app on waitress with 8 threads, in a process of its own.
SERVE_APART = """
import sys, waitress
from pyramid.config import Configurator
settings = {'dbtune.probes': 'true', 'dbtune.stats.token': sys.argv[2]}
with Configurator(settings=settings) as config:
    config.include('pyramid_dbtune')
    app = config.make_wsgi_app()
waitress.serve(app, listen='127.0.0.1:' + sys.argv[1], threads=8,
               _quiet=True)
"""


@pytest.fixture
def served_apart():
    """The URL of the probe app served by another process: the threads of
    this one (the client's, and those earlier tests left) do not take
    the server's GIL from its requests."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, '-c', SERVE_APART, str(port), TOKEN],
        stderr=subprocess.DEVNULL,
    )
    url = f'http://127.0.0.1:{port}'
    try:
        for _ in range(300):
            try:
                socket.create_connection(('127.0.0.1', port), 0.1).close()
                break
            except OSError:
                assert server.poll() is None, 'the server did not start'
                time.sleep(0.05)
        yield url
    finally:
        server.terminate()
        server.wait(10)


def test_small_ms_on_a_threaded_server(served_apart):
    # At 10 ms a request, the fixed cost of a request is a good part of a
    # round's time: counted as work, it read as far below (about 4 of 8).
    # Other load on the machine still lengthens the waits: the best of
    # three tries.
    for _ in range(3):
        report = threadcheck.check(
            served_apart, concurrency=8, duration=0.5, ms=10, token=TOKEN,
            probes=('io',),
        )  # fmt: skip
        if report['probes']['io']['parallelism'] >= 6:
            break
    assert report['probes']['io']['parallelism'] >= 6, report
    assert not report['far_below']


@pytest.fixture
def other_host():
    """A server on another loopback address that notes the token."""
    seen = []

    def app(environ, start_response):
        seen.append(environ.get('HTTP_X_DBTUNE_TOKEN'))
        start_response('404 Not Found', [('Content-Type', 'text/plain')])
        return [b'no']

    server = make_server('127.0.0.2', 0, app, OneAtATime, Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f'http://127.0.0.2:{server.server_port}', seen
    server.shutdown()
    server.server_close()


def test_a_redirect_is_refused_and_the_token_stays_home(serve, other_host):
    there, seen = other_host

    def redirecting(environ, start_response):
        start_response('302 Found', [('Location', there + '/elsewhere')])
        return [b'']

    status, _, err = run(serve(redirecting), *QUICK)
    assert status == 2, err
    assert f'redirected to {there}/elsewhere; give that URL' in err
    assert seen == []


@pytest.fixture
def not_http():
    """A server that answers every connection with a line that is not
    HTTP, as an SSH server does."""
    listener = socket.socket()
    listener.bind(('127.0.0.1', 0))
    listener.listen()

    def answer():
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return  # closed
            with connection:
                connection.recv(1000)
                connection.sendall(b'SSH-2.0-OpenSSH_9\r\n')

    threading.Thread(target=answer, daemon=True).start()
    yield f'http://127.0.0.1:{listener.getsockname()[1]}'
    listener.close()


def test_an_answer_that_is_not_http(not_http):
    status, _, err = run(not_http, *QUICK)
    assert status == 2
    assert 'did not answer in HTTP: BadStatusLine' in err


@pytest.mark.parametrize(
    'url',
    [
        '127.0.0.1:8000',
        'ftp://127.0.0.1:8000',
        'http://',
        'http://[::1',
        'http://host:abc',
        'http://host:99999',
        'http://a b',
        'http://host:8000\n',
        'http://host:8000/?x=1',
        'http://host:8000/#top',
    ],
)
def test_not_a_url(url):
    status, _, err = run(url, *QUICK)
    assert status == 2
    assert err == (
        f'threadcheck: {url!r} is not a URL: give one such as '
        'http://host:8000\n'
    )


@pytest.mark.parametrize('token', ['a-token\n', 'a-token-€'])
def test_a_token_that_cannot_be_a_header(token):
    status, _, err = run('http://127.0.0.1:9', '--token', token)
    assert status == 2
    assert err == (
        'threadcheck: the token (--token or DBTUNE_TOKEN) must be printable '
        'ASCII, to go in the X-Dbtune-Token header\n'
    )


def test_an_unexpected_error_is_exit_2_not_far_below(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise KeyError('surprise')

    monkeypatch.setattr(threadcheck, 'check', broken)
    assert cli.main(['threadcheck', 'http://127.0.0.1:9']) == 2
    assert (
        "dbtune threadcheck: unexpected error: KeyError: 'surprise'"
        in capsys.readouterr().err
    )


def test_ctrl_c_is_a_line_not_a_traceback(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(threadcheck, 'check', interrupted)
    assert cli.main(['threadcheck', 'http://127.0.0.1:9']) == 130
    assert capsys.readouterr().err == 'dbtune threadcheck: interrupted\n'


def test_the_sql_probe_alone_of_an_app_without_a_database(serve):
    url = serve(probe_app())
    for asked in ('sql', 'sql,sql'):  # named twice: the same probe
        status, _, err = run(url, *QUICK, '--probes', asked)
        assert status == 2
        assert 'no sql probe at' in err
        assert 'has no database (dbtune.url)' in err
    # Without the token, no probe answers: the usual message.
    status, _, err = run(url, '--duration', '0.1', '--probes', 'sql')
    assert status == 2 and 'set dbtune.probes = true' in err
    # With others, it is left out, whichever comes first.
    for asked in ('sql,io', 'io,sql'):
        status, out, _ = run(url, *QUICK, '--probes', asked, '--json')
        assert status == 0 and list(json.loads(out)['probes']) == ['io']


def test_a_proxy_in_the_environment_is_not_used(serve):
    # A proxy would be measured too: threadcheck goes straight to the
    # server, whatever http_proxy says (here, a port nobody listens on).
    url = serve(probe_app())
    done = subprocess.run(
        [sys.executable, '-c', CONSOLE_SCRIPT, 'threadcheck', url, *QUICK,
         '--probes', 'io'],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, 'http_proxy': 'http://127.0.0.1:9',
             'HTTP_PROXY': 'http://127.0.0.1:9', 'no_proxy': ''},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def timed(pid, began, seconds, cpu):
    return {
        'probe': 'cpu', 'ms': 40, 'pid': pid, 'thread': 1,
        'began': began, 'ended': began + seconds, 'seconds': seconds,
        'cpu_seconds': cpu, 'claims': claims(),
    }  # fmt: skip


def test_cpu_readings_are_of_the_cores_the_processes_got():
    # Two processes, two requests each, one after the other: another
    # program had half of each core, so each request took twice its CPU
    # time, and the round as long as one process doing all of it.
    result = threadcheck.Measurement('cpu', 4, 'cpu_seconds')
    for _ in range(3):
        result.alone += [timed(1, 0, 0.04, 0.04)]  # alone, a whole core
        result.answers += [
            timed(1, 0, 0.08, 0.04), timed(1, 0.08, 0.08, 0.04),
            timed(2, 0, 0.08, 0.04), timed(2, 0.08, 0.08, 0.04),
        ]  # fmt: skip
        result.rounds.append(0.17)
    assert result.raw_parallelism == pytest.approx(1)
    assert result.round_core_share == pytest.approx(0.5)
    assert result.parallelism == pytest.approx(2)
    # One process whose 4 threads take turns for the GIL: it used its
    # whole core; the reading stays 1.
    result.answers = [
        timed(1, 0, 0.16, 0.04) for _ in range(4)
    ] * 3  # fmt: skip
    result.rounds = [0.17] * 3
    assert result.round_core_share == pytest.approx(1)
    assert result.parallelism == pytest.approx(1)


def test_cpu_readings_last_until_a_process_runs_out_of_requests():
    # Three requests went to one process, one to the other: both worked
    # until the second had none left, then one did alone.
    result = threadcheck.Measurement('cpu', 4, 'cpu_seconds')
    for _ in range(3):
        result.alone += [timed(1, 0, 0.04, 0.04)]
        result.answers += [
            timed(1, 0, 0.04, 0.04), timed(1, 0.04, 0.04, 0.04),
            timed(1, 0.08, 0.04, 0.04), timed(2, 0, 0.04, 0.04),
        ]  # fmt: skip
        result.rounds.append(0.13)
    assert result.parallelism == pytest.approx(2)
    assert result.raw_parallelism == pytest.approx(0.16 / 0.12)
    assert result.processes == {1: (1, 3), 2: (1, 1)}
