"""pyramid_dbtune.gunicorn, and threadcheck against real gunicorn servers.

The servers run ``benchmarks/probe_app.py`` under ``-c
python:pyramid_dbtune.gunicorn``, with the flags each test gives (they
override the module's defaults). A CPU reading on a shared 2-core machine
is noisy, so a server's bounds may be tried three times: a correct
threadcheck meets them on one run; one that reports 1, or N, for
everything never does. Off CI, a machine too busy for CPU readings skips.
"""

import collections
import contextlib
import gc
import http.client
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sqlalchemy as sa
from gunicorn.app.wsgiapp import WSGIApplication
from gunicorn.config import KNOWN_SETTINGS, Config
from gunicorn.workers.gthread import ThreadWorker
from pyramid.config import Configurator

from pyramid_dbtune import fastpath
from pyramid_dbtune import gunicorn as name_shim
from pyramid_dbtune.deploy import cli, forks, threadcheck
from pyramid_dbtune.deploy import gunicorn as config_module
from pyramid_dbtune.ops import probes

from conftest import IN_CI, READS, call, in_a_child, listeners, listening

sys.path.insert(0, str(Path(__file__).parents[1] / 'benchmarks'))
from common import (  # noqa: E402
    free_port,
    gunicorn_command,
    start_server,
    stop_server,
)
from probe_app import TOKEN  # noqa: E402

ATTEMPTS = 3


@pytest.fixture(autouse=True)
def nothing_declared(monkeypatch):
    monkeypatch.setattr(probes, 'declared', {})


# The config module


def test_the_module_sets_only_what_it_means_to():
    names = {s.name for s in KNOWN_SETTINGS}
    assert names & set(vars(config_module)) == {
        'workers', 'threads', 'worker_class', 'preload_app', 'reuse_port',
        'post_fork', 'post_worker_init', 'when_ready', 'child_exit',
    }  # fmt: skip
    # The name gunicorn is given holds the same settings.
    assert names & set(vars(name_shim)) == names & set(vars(config_module))
    # `from pyramid_dbtune.gunicorn import *` takes the hooks alone.
    assert config_module.__all__ == [
        'child_exit', 'post_fork', 'post_worker_init', 'when_ready'
    ]  # fmt: skip


def gunicorn_config(monkeypatch, *flags):
    """The configuration gunicorn itself makes of these command-line flags."""
    monkeypatch.setattr(
        sys, 'argv',
        ['gunicorn', '-c', 'python:pyramid_dbtune.gunicorn', *flags,
         'probe_app:app_factory()'],
    )  # fmt: skip
    monkeypatch.chdir(os.getcwd())  # gunicorn changes to its --chdir
    monkeypatch.setattr(sys, 'path', list(sys.path))
    return WSGIApplication('%(prog)s [OPTIONS] [APP_MODULE]').cfg


def test_the_deployment_docs_config_file(monkeypatch, tmp_path):
    """The config file of one's own that the deployment docs show takes
    the hooks, preloads, and runs the threads it asks for, with no
    warning of a sync worker."""
    text = (Path(__file__).parents[1] / 'docs/deployment.rst').read_text()
    after = text.split('    # gunicorn.conf.py\n', 1)[1].splitlines()
    lines = []
    for line in after:
        if line and not line.startswith('    '):
            break
        lines.append(line[4:])
    path = tmp_path / 'gunicorn.conf.py'
    path.write_text('\n'.join(lines))
    cfg = gunicorn_config(monkeypatch, '-c', str(path))
    assert cfg.post_fork is config_module.post_fork
    assert cfg.child_exit is config_module.child_exit
    assert (cfg.preload_app, cfg.worker_class_str) == (True, 'gthread')
    assert (cfg.workers, cfg.threads) == (4, 8)


def test_defaults_from_the_host_and_flags_win(monkeypatch):
    cfg = gunicorn_config(monkeypatch)
    assert cfg.workers == config_module.default_workers()
    assert config_module.default_workers({}) == probes.usable_cores()
    assert (cfg.threads, cfg.worker_class_str) == (4, 'gthread')
    assert cfg.preload_app is True  # as the README says
    # A socket per worker, shared evenly; one socket for one worker.
    assert cfg.reuse_port is (cfg.workers > 1)
    assert cfg.post_fork is config_module.post_fork
    cfg = gunicorn_config(monkeypatch, '--workers', '3', '--threads', '1',
                          '-k', 'sync')  # fmt: skip
    assert (cfg.workers, cfg.threads, cfg.worker_class_str) == (3, 1, 'sync')
    assert config_module.threads_of(cfg) == 1


def test_web_concurrency():
    cores = probes.usable_cores()
    assert config_module.default_workers({'WEB_CONCURRENCY': '3'}) == 3
    assert config_module.default_workers({'WEB_CONCURRENCY': ' '}) == cores
    for bad in ('x', '0', '-2', '²'):
        with pytest.raises(ValueError, match=f"WEB_CONCURRENCY = '{bad}'"):
            config_module.default_workers({'WEB_CONCURRENCY': bad})


@pytest.mark.parametrize(
    'worker_class, threads, expected',
    [
        ('sync', 1, 1),
        ('sync', 6, 6),  # gunicorn runs gthread then
        ('gthread', 8, 8),
        ('gunicorn.workers.gthread.ThreadWorker', 3, 3),
        ('gunicorn.workers.sync.SyncWorker', 1, 1),
        ('gevent', 1, 1000),  # green threads: its worker_connections
        ('tornado', 1, 1),  # a WSGI app blocks tornado's loop
    ],
)
def test_threads_of(worker_class, threads, expected):
    cfg = Config()
    cfg.set('worker_class', worker_class)
    cfg.set('threads', threads)
    assert config_module.threads_of(cfg) == expected


@pytest.fixture
def worker():
    """A gunicorn worker, as the master makes it before forking."""
    cfg = Config()
    cfg.set('workers', 2)
    cfg.set('threads', 8)
    cfg.set('worker_class', 'gthread')
    made = ThreadWorker(1, os.getpid(), [], None, 30, cfg,
                        logging.getLogger('test.gunicorn'))  # fmt: skip
    yield made
    made.tmp.close()


def test_post_fork_stops_a_worker_that_could_not_renew(worker, monkeypatch):
    monkeypatch.setattr(forks, 'failures', [('pool', OSError('gone'))])
    with pytest.raises(RuntimeError, match="renew.*'pool': OSError"):
        config_module.post_fork(None, worker)


def test_post_fork_declares_the_workers_configuration(worker):
    config_module.post_fork(None, worker)
    claims = probes.server_claims({})
    assert (claims['server'], claims['workers'], claims['threads']) == (
        'gunicorn',
        2,
        8,
    )
    assert claims['worker_class'] == 'gthread'


class Wrapper:
    """A WSGI filter around an app, as paste pipelines make them."""

    def __init__(self, app):
        self.app = app


def test_post_worker_init_logs_and_warns(worker, caplog, monkeypatch,
                                         sqlite_url):  # fmt: skip
    with Configurator(
        settings={'dbtune.url': sqlite_url, 'dbtune.read_pool_size': '2'}
    ) as config:
        config.include('pyramid_dbtune')
        app = config.make_wsgi_app()
    worker.wsgi = Wrapper(Wrapper(app))
    monkeypatch.setattr(forks, 'renewed', 3)
    with caplog.at_level(logging.INFO, 'test.gunicorn'):
        config_module.post_worker_init(worker)
    assert 'renewed 3 pools, caches and locks' in caplog.text
    assert 'dbtune.read_pool_size = 2 is below the 8 threads' in caplog.text
    caplog.clear()
    monkeypatch.setattr(forks, 'renewed', 0)
    worker.cfg.set('threads', 2)
    config_module.post_worker_init(worker)
    # A WSGI app that is not Pyramid's, or has no database: nothing to say.
    for wsgi in (Wrapper(None), Wrapper(make_plain_app())):
        worker.wsgi = wsgi
        config_module.post_worker_init(worker)
    assert caplog.text == ''
    app.registry.dbtune.router.dispose()


def test_post_worker_init_finds_the_app_behind_the_fastpath_filter(
    worker, caplog, sqlite_url
):
    with Configurator(
        settings={'dbtune.url': sqlite_url, 'dbtune.read_pool_size': '2'}
    ) as config:
        config.include('pyramid_dbtune')
        app = config.make_wsgi_app()
    worker.wsgi = fastpath.filter_app_factory(app, {}, paths='/ok=OK')
    with caplog.at_level(logging.INFO, 'test.gunicorn'):
        config_module.post_worker_init(worker)
    assert 'dbtune.read_pool_size = 2 is below the 8 threads' in caplog.text
    app.registry.dbtune.router.dispose()


def test_sync_asked_for_but_gthread_run(monkeypatch, caplog):
    # The module's threads = 4 turn -k sync into gthread.
    cfg = gunicorn_config(monkeypatch, '-k', 'sync')
    assert cfg.worker_class_str == 'gthread'
    made = ThreadWorker(1, os.getpid(), [], None, 30, cfg,
                        logging.getLogger('test.gunicorn'))  # fmt: skip
    made.wsgi = None
    with caplog.at_level(logging.INFO, 'test.gunicorn'):
        config_module.post_worker_init(made)
    made.tmp.close()
    assert 'worker_class is sync, but with threads = 4' in caplog.text
    assert 'give -k sync --threads 1' in caplog.text
    caplog.clear()
    for flags in (['-k', 'sync', '--threads', '1'], []):
        made.cfg = gunicorn_config(monkeypatch, *flags)
        config_module.post_worker_init(made)
    assert caplog.text == ''


class Arbiter:
    """What when_ready uses of gunicorn's arbiter: its configuration, and
    its application, which loads the WSGI app when asked."""

    def __init__(self, cfg, wsgi):
        self.cfg = cfg
        self.app = self
        self.wsgi = wsgi


def test_when_ready_closes_the_masters_connections(monkeypatch, db_url):
    with Configurator(settings={'dbtune.url': db_url}) as config:
        config.include('pyramid_dbtune')
        app = config.make_wsgi_app()
    router = app.registry.dbtune.router
    router.read(sa.text('SELECT 1'), {}, 0)  # as the app may, loading
    pool = router.readers[0].engine.pool
    assert pool.checkedin() == 1
    loaded = []

    def wsgi():
        loaded.append(True)
        return Wrapper(app)

    # Without preloading the master has no application: none is loaded.
    cfg = gunicorn_config(monkeypatch)
    cfg.set('preload_app', False)
    config_module.when_ready(Arbiter(cfg, wsgi))
    assert loaded == [] and pool.checkedin() == 1
    assert gc.get_freeze_count() == 0
    cfg = gunicorn_config(monkeypatch)  # preloads, by this module's default
    try:
        config_module.when_ready(Arbiter(cfg, wsgi))
        assert router.readers[0].engine.pool.checkedin() == 0
        # What the master loaded is out of the collector's way: each
        # worker's full collections walk only what the worker made.
        assert gc.get_freeze_count() > 0
        # An application without a database, or not Pyramid's: nothing
        # to close.
        for other in (make_plain_app(), None):
            config_module.when_ready(Arbiter(cfg, lambda a=other: a))
    finally:
        gc.unfreeze()  # this process is not a master about to fork
    router.dispose()


def test_when_ready_leaves_listening_to_the_workers(
    monkeypatch, postgresql_url, apps
):
    """The master's listener stops before the workers fork: none of its
    locks is held as they do, and each worker listens on its own."""
    app = listening(postgresql_url, apps)
    call(app, *READS)  # as the app may, loading
    listener = app.app.registry.dbtune.listener
    assert len(app.app.registry.dbtune.cache) > 0
    before = listeners()
    cfg = gunicorn_config(monkeypatch)  # preloads
    try:
        config_module.when_ready(Arbiter(cfg, lambda: Wrapper(app.app)))
    finally:
        gc.unfreeze()  # this process is not a master about to fork
    assert not listener.listening.is_set()
    assert listeners() == before - 1
    # What the master cached, no one keeps fresh: a worker forked later
    # (in place of one that ended) does not inherit it.
    assert len(app.app.registry.dbtune.cache) == 0
    assert in_a_child(lambda: listener.listening.wait(10))


def make_plain_app():
    with Configurator() as config:
        config.include('pyramid_dbtune')
        return config.make_wsgi_app()


# Real servers


@pytest.fixture
def gunicorn():
    """``gunicorn(*flags, env=..., workers=...)``: the URL of a probe app
    under it, once each of its ``workers`` has answered."""
    with contextlib.ExitStack() as running:

        def start(*flags, env=None, workers=1):
            port = free_port()
            process = start_server(gunicorn_command(port, *flags), port, env)
            running.callback(stop_server, process)
            url = f'http://127.0.0.1:{port}'
            wait_for_workers(url, workers)
            return url

        yield start


def wait_for_workers(url, count, timeout=60):
    """Until ``count`` worker processes have answered at ``url``."""
    probe = f'{url}/_dbtune/probe/io?ms=0'
    pids = set()
    deadline = time.monotonic() + timeout
    with ThreadPoolExecutor(8) as pool:
        while len(pids) < count:
            assert time.monotonic() < deadline, f'{pids} of {count} answered'
            answers = pool.map(
                lambda _: threadcheck.fetch(probe, TOKEN, 30)[0], range(8)
            )
            pids.update(a['pid'] for a in answers)


def test_stop_server_ends_the_whole_process_group(tmp_path):
    # A server whose master stops at SIGTERM, and whose worker does not.
    port = free_port()
    (tmp_path / 'worker.py').write_text(
        'import signal, sys, time\n'
        'signal.signal(signal.SIGTERM, signal.SIG_IGN)\n'
        'open(sys.argv[1], "w").close()\n'
        'time.sleep(120)\n'
    )
    (tmp_path / 'master.py').write_text(
        'import socket, subprocess, sys, time\n'
        'worker = subprocess.Popen([sys.executable, *sys.argv[1:3]])\n'
        'open(sys.argv[3], "w").write(str(worker.pid))\n'
        'listener = socket.create_server(("127.0.0.1", int(sys.argv[4])))\n'
        'time.sleep(120)\n'
    )
    process = start_server(
        [sys.executable, str(tmp_path / 'master.py'),
         str(tmp_path / 'worker.py'), str(tmp_path / 'ready'),
         str(tmp_path / 'pid'), str(port)],
        port,
    )  # fmt: skip
    while not (tmp_path / 'ready').exists():
        time.sleep(0.05)
    worker = int((tmp_path / 'pid').read_text())
    stop_server(process, timeout=5)
    assert process.returncode == -signal.SIGTERM
    deadline = time.monotonic() + 10
    while alive(worker):
        assert time.monotonic() < deadline, 'the worker outlived its server'
        time.sleep(0.05)


def alive(pid):
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        state = Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1]
    except FileNotFoundError:
        return False
    return state.split()[0] != 'Z'


def check_until_within(url, bounds):
    """threadcheck ``url`` until ``bounds(report)`` lists no miss.

    CPU readings need cores that nobody else is using: where every miss is
    of the CPU probe, a developer's busy machine skips, and CI fails.
    """
    for _ in range(ATTEMPTS):
        report = threadcheck.check(
            url, concurrency=8, duration=1, ms=40, token=TOKEN,
            probes=('io', 'cpu'),
        )  # fmt: skip
        misses = bounds(report)
        if any('the host is busy' in line for line in report['verdict']):
            misses.append('cpu: the host was too busy to judge')
        if not misses:
            return report
    text = (
        f'{misses} in each of {ATTEMPTS} runs; the last:\n'
        + threadcheck.format_report(report)
    )
    if not IN_CI and all(m.startswith('cpu') for m in misses):
        pytest.skip(f'CPU too busy here (load {os.getloadavg()}): {text}')
    pytest.fail(text)


def parallelism(report, probe):
    return report['probes'][probe]['parallelism']


def outside(report, probe, low, high):
    value = parallelism(report, probe)
    return (
        []
        if low <= value <= high
        else [f'{probe} {value} not in ({low}, {high})']
    )


def test_sync_one_worker_runs_one_at_a_time(gunicorn):
    url = gunicorn('--workers', '1', '--threads', '1', '-k', 'sync')
    report = check_until_within(
        url,
        lambda r: outside(r, 'io', 0.6, 1.4) + outside(r, 'cpu', 0.6, 1.4),
    )
    assert report['capacity'] == {
        'processes': 1, 'threads': 1, 'cores': probes.usable_cores()
    }  # fmt: skip
    assert report['claims']['worker_class'] == 'sync'
    assert not report['far_below']
    assert 'one request at a time' in report['verdict'][0]


def test_gthread_eight_threads_wait_together_but_hold_the_gil(gunicorn):
    url = gunicorn('--workers', '1', '--threads', '8')
    report = check_until_within(
        url,
        lambda r: outside(r, 'io', 5.0, 9.0) + outside(r, 'cpu', 0.6, 1.45),
    )
    assert report['capacity']['threads'] == 8
    served = report['probes']['io']['served']
    assert len(served) == 1 and len(next(iter(served.values()))) >= 5
    assert not report['far_below']
    assert (
        'serialised by the GIL inside one process; run '
        f'{probes.usable_cores()} processes' in report['verdict'][1]
    )


def test_two_workers_run_cpu_work_in_parallel(gunicorn):
    url = gunicorn('--workers', '2', '--threads', '1', '-k', 'sync',
                   workers=2)  # fmt: skip
    # Two processes run CPU work in parallel where there are two cores.
    cpu = (1.5, 2.6) if probes.usable_cores() >= 2 else (0.6, 1.4)
    report = check_until_within(
        url,
        lambda r: outside(r, 'io', 1.5, 2.6) + outside(r, 'cpu', *cpu),
    )
    assert len(report['probes']['cpu']['served']) == 2
    assert report['capacity']['processes'] == 2
    assert not report['far_below']


@pytest.mark.parametrize('flags', [(), ('--workers', '1', '--threads', '8')])
def test_waits_run_as_the_server_claims(gunicorn, flags, capsys):
    # With the package's own settings (a worker a core, 4 threads each),
    # the 8 requests of a round fell unevenly between the workers, and
    # the busier one queued them: "4.1 of 8 ... something serialises".
    # Twice as many probes, judged on the server's clocks, read 8.
    workers = 1 if flags else config_module.default_workers()
    url = gunicorn(*flags, workers=workers)
    for _ in range(ATTEMPTS):
        status = cli.main(['threadcheck', url, '--probes', 'io', '--duration',
                           '1', '--ms', '40', '--token', TOKEN])  # fmt: skip
        out = capsys.readouterr().out
        if status == 0 and re.search(
            r'^I/O: (7\.[5-9]|8\.0) of 8 in parallel', out, re.M
        ):
            break
    assert status == 0, out
    assert re.search(r'^I/O: (7\.[5-9]|8\.0) of 8 in parallel', out, re.M), out
    assert out.count(' at once)') == workers, out


def test_two_workers_that_take_turns_are_far_below(gunicorn, tmp_path):
    # Both workers lock one file around every request: together they
    # serve one request at a time, which reads about 1, far below 2.
    url = gunicorn('--workers', '2', '--threads', '1', '-k', 'sync',
                   env={'DBTUNE_PROBE_LOCK': str(tmp_path / 'lock')},
                   workers=2)  # fmt: skip
    report = threadcheck.check(
        url, concurrency=8, duration=1, ms=40, token=TOKEN, probes=('io',)
    )
    assert parallelism(report, 'io') < 1.4, report
    assert report['far_below'] == ['io']
    assert (
        'far below the 2 this server claims (2 × 1)' in (report['verdict'][0])
    )


@pytest.mark.parametrize('when_ready', [True, False])
def test_preload_with_a_pool_opened_before_the_fork(
    gunicorn, server_url, tmp_path, when_ready
):
    # The app reads at start-up, so the master's pools hold connections
    # when it forks; each worker must use connections of its own. The
    # when_ready hook closes them before the fork; without it, the
    # post_fork hook's renewal must do.
    flags = []
    if not when_ready:
        config = tmp_path / 'no_when_ready.py'
        config.write_text(
            'from pyramid_dbtune.gunicorn import (post_fork, '
            'post_worker_init, threads, worker_class, workers)\n'
        )
        flags = ['-c', str(config)]  # the last -c is the one
    url = gunicorn(*flags, '--preload', '--workers', '2',
                   env={'DBTUNE_PROBE_URL': server_url,
                        'DBTUNE_PROBE_OPEN_POOL': '1'},
                   workers=2)  # fmt: skip
    probe = f'{url}/_dbtune/probe/sql?ms=0'

    def one(_):
        try:
            return threadcheck.fetch(probe, TOKEN, 30)[0]
        except threadcheck.ProbeError as exc:
            return exc

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(200)))
    errors = [a for a in answers if isinstance(a, Exception)]
    assert errors == []
    assert all(a['rows'] == 1 for a in answers)
    assert len({a['pid'] for a in answers}) == 2


def listening_sockets(port):
    """How many sockets listen on loopback ``port`` (``/proc/net/tcp``)."""
    lines = Path('/proc/net/tcp').read_text().splitlines()[1:]
    local = f'0100007F:{port:04X}'
    return sum(
        1 for line in lines if line.split()[1:4:2] == [local, '0A']
    )  # 0A: LISTEN


def test_each_worker_takes_its_share_of_keep_alive_clients(gunicorn):
    """Each worker listens on a socket of its own (reuse_port), and the
    kernel shares new connections among them: clients that connect at
    once and keep their connections reach both workers, whichever was
    free first. The kernel picks a socket by a hash of the connection's
    ports: of 32 clients, fewer than 4 reach one worker once in 400,000
    runs (16 clients and 3, once in 240)."""
    url = gunicorn('--workers', '2', workers=2)
    port = int(url.rsplit(':', 1)[1])
    assert listening_sockets(port) == 2
    together = threading.Barrier(32)

    def client(_):
        connection = http.client.HTTPConnection('127.0.0.1', port, timeout=30)
        together.wait()
        try:
            pids = set()
            for _ in range(2):  # kept alive: the same worker answers
                connection.request(
                    'GET', '/_dbtune/probe/io?ms=0',
                    headers={'X-Dbtune-Token': TOKEN},
                )  # fmt: skip
                pids.add(json.loads(connection.getresponse().read())['pid'])
            return pids
        finally:
            connection.close()

    with ThreadPoolExecutor(32) as pool:
        answered = list(pool.map(client, range(32)))
    assert all(len(pids) == 1 for pids in answered)
    workers = collections.Counter(next(iter(p)) for p in answered)
    assert len(workers) == 2 and min(workers.values()) >= 4, workers


def test_child_exit_without_several_processes_does_nothing(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.delenv('PROMETHEUS_MULTIPROC_DIR', raising=False)
    config_module.child_exit(None, SimpleNamespace(pid=1))  # no error


def test_one_worker_restarting_refuses_no_connection(gunicorn):
    """With one worker, the master keeps the one socket (no reuse_port):
    a connection made while the worker restarts waits for the next."""
    url = gunicorn('--max-requests', '5', env={'WEB_CONCURRENCY': '1'})
    port = int(url.rsplit(':', 1)[1])
    pids = set()
    for _ in range(30):  # six workers, one after the other
        connection = http.client.HTTPConnection('127.0.0.1', port, timeout=30)
        try:
            connection.request(
                'GET', '/_dbtune/probe/io?ms=0',
                headers={'X-Dbtune-Token': TOKEN},
            )  # fmt: skip
            pids.add(json.loads(connection.getresponse().read())['pid'])
        finally:
            connection.close()
    assert len(pids) >= 5
