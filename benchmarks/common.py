"""What the benchmarks share: timing, a scratch PostgreSQL schema, and
servers started on loopback (the tests start theirs with these too)."""

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import sqlalchemy as sa

from accommodation.seed import SCHEMA, properties

POSTGRESQL_URL = os.environ.get(
    'DBTUNE_TEST_POSTGRESQL',
    'postgresql+psycopg://postgres@127.0.0.1:5432/test',
)
MYSQL_URL = os.environ.get(
    'DBTUNE_TEST_MYSQL', 'mysql+pymysql://root@127.0.0.1:3306/test'
)


def best_per_call(function, calls, rounds):
    """The fastest round's seconds per call of ``function``."""
    best = float('inf')
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            function()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def best_of_rounds(measures, rounds):
    """``{name: seconds}``: the least of ``rounds`` rounds of each of
    ``measures`` (name -> a function that times one round), run in turn in
    each round, so that other load on the machine spoils them alike."""
    best = dict.fromkeys(measures, float('inf'))
    for _ in range(rounds):
        for name, measure in measures.items():
            best[name] = min(best[name], measure())
    return best


def postgresql_scratch(name=''):
    """A URL for a new schema of its own (``name`` tells apart several of
    one process), and a function that drops it.

    Raises :class:`sqlalchemy.exc.OperationalError` without a server.
    """
    admin = sa.create_engine(POSTGRESQL_URL)
    schema = f'dbtune_bench_{os.getpid()}{name}'
    try:
        with admin.begin() as connection:
            connection.exec_driver_sql(f'CREATE SCHEMA {schema}')
    except sa.exc.OperationalError:
        admin.dispose()
        raise
    url = sa.engine.make_url(POSTGRESQL_URL).update_query_dict(
        {'options': f'-csearch_path={schema}'}
    )

    def drop():
        with admin.begin() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA {schema} CASCADE')
        admin.dispose()

    return url.render_as_string(hide_password=False), drop


def mysql_scratch():
    """A URL for a new MariaDB (or MySQL) database of its own, and a
    function that drops it."""
    admin = sa.create_engine(MYSQL_URL)
    name = f'dbtune_bench_{os.getpid()}'
    with admin.begin() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE {name}')

    def drop():
        with admin.begin() as connection:
            connection.exec_driver_sql(f'DROP DATABASE {name}')
        admin.dispose()

    url = sa.engine.make_url(MYSQL_URL).set(database=name)
    return url.render_as_string(hide_password=False), drop


HERE = Path(__file__).parent


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def start_server(command, port, env=None, timeout=30):
    """Run ``command`` with this folder on ``PYTHONPATH`` (so that servers
    find the apps here); return the process once ``port`` accepts."""
    env = {**os.environ, **(env or {})}
    env['PYTHONPATH'] = os.pathsep.join(
        filter(None, [str(HERE), env.get('PYTHONPATH')])
    )
    # A file, not a pipe: a server that logs under load fills a pipe that
    # nobody reads, and stalls.
    log = tempfile.TemporaryFile()  # noqa: SIM115 (lives with the server)
    # A session of its own: stop_server ends its whole process group,
    # workers included.
    process = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
    )
    process.log = log
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(('127.0.0.1', port), timeout=1):
                return process
        except OSError:
            if process.poll() is not None:
                log.seek(0)
                raise RuntimeError(log.read().decode()) from None
            time.sleep(0.1)
    stop_server(process)
    raise RuntimeError(f'{command[0]} did not start on port {port}')


def stop_server(process, timeout=10):
    """Stop a server of :func:`start_server`: SIGTERM to it, and after it
    has gone or ``timeout`` seconds, SIGKILL to whatever of its process
    group is left (gunicorn's workers, when the master did not stop
    them)."""
    process.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout)
    with contextlib.suppress(ProcessLookupError):  # nothing was left
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout)


def together(starts, stop):
    """Call ``starts`` (each starts a server, and waits for it) at once:
    what they return, in order. Where one fails, those that started are
    given to ``stop``, and its error is raised."""
    with ThreadPoolExecutor(len(starts)) as pool:
        futures = [pool.submit(start) for start in starts]
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        for future in futures:
            if future.exception() is None:
                stop(future.result())
        raise failed[0]
    return [future.result() for future in futures]


def gunicorn_command(port, *args, app='probe_app:app_factory()'):
    """gunicorn with pyramid_dbtune's config module, then ``args``."""
    from gunicorn.config import KNOWN_SETTINGS

    # `python -m`, not the console script: under buildout it is not
    # beside the interpreter.
    command = [
        sys.executable, '-m', 'gunicorn',
        '-c', 'python:pyramid_dbtune.gunicorn',
        '--bind', f'127.0.0.1:{port}',
        '--log-level', 'warning',
        # Workers get 5 s to finish their requests when stopped, not 30.
        '--graceful-timeout', '5',
    ]  # fmt: skip
    # Servers run side by side: none may take the one control socket.
    if any(s.name == 'control_socket_disable' for s in KNOWN_SETTINGS):
        command.append('--no-control-socket')
    return [*command, *args, app]


def ensure_wrk():
    """The ``wrk`` HTTP load generator, installed with apt-get if missing."""
    if not shutil.which('wrk'):
        done = subprocess.run(
            ['bash', str(HERE.parent / '.ci/apt-package.sh'), 'wrk', 'wrk'],
            stdout=subprocess.DEVNULL,
        )
        if done.returncode not in (0, 10):
            raise RuntimeError('wrk could not be installed')
    return shutil.which('wrk')


def start_memcached():
    """A memcached of the run's own on a free loopback port, installed
    with apt-get if missing: the process (stop it with
    :func:`stop_server`) and its port."""
    binary = shutil.which('memcached') or '/usr/bin/memcached'
    if not os.path.exists(binary):
        subprocess.run(
            ['bash', str(HERE.parent / '.ci/memcached.sh')], check=True
        )
    port = free_port()
    command = [binary, '-l', '127.0.0.1', '-p', str(port), '-U', '0']
    if os.geteuid() == 0:
        command += ['-u', 'root']  # it will not run as root unasked
    return start_server(command, port), port


def requests_per_second(
    wrk, url, seconds, threads=2, connections=16, headers=()
):
    """What ``wrk`` measures on ``url``; every answer must be a 2xx."""
    extra = [arg for header in headers for arg in ('-H', header)]
    done = subprocess.run(
        [
            wrk,
            f'-t{threads}',
            f'-c{connections}',
            f'-d{seconds}s',
            *extra,
            url,
        ],  # fmt: skip
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 30,
    )
    if 'Non-2xx' in done.stdout:
        raise AssertionError(done.stdout)
    return float(re.search(r'Requests/sec:\s+([\d.]+)', done.stdout)[1])


def print_rates(title, rows, columns, base, width):
    """A table of requests per second: ``rows`` maps each row's key to
    its label; ``columns`` maps a heading to {row key: rate}; each cell
    also gives the rate's ratio to the ``base`` row's."""
    print(title)
    print(f'{"what":{width}} ' + ' '.join(f'{c:>18}' for c in columns))
    for key, label in rows.items():
        cells = ' '.join(
            f'{r[key]:10.0f} ({r[key] / r[base]:5.2f})'
            for r in columns.values()
        )
        print(f'{label:{width}} {cells}')


def load_properties(url, count=20000):
    """Create the demo's table at ``url`` and seed ``count`` properties."""
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        for statement in filter(str.strip, SCHEMA.split(';')):
            connection.exec_driver_sql(statement)
        connection.execute(
            sa.text(
                'INSERT INTO property VALUES '
                '(:id, :title, :area, :rent, :rooms, :available, :d)'
            ),
            [
                dict(zip(('id', 'title', 'area', 'rent', 'rooms',
                          'available', 'd'), row, strict=True))
                for row in properties(count)
            ],
        )  # fmt: skip
    engine.dispose()
