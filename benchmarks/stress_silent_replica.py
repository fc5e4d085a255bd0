"""Reads while a replica accepts connections and never answers.

``--reads`` reads (400) over real HTTP (waitress, 8 threads, 8 clients at
once) of an application whose ``dbtune.read_urls`` names a server that
accepts TCP connections and says nothing, as a frozen database does, with
``dbtune.connect_timeout = 2``. Prints the reads that failed, the slowest
read, and how many connections the silent server was sent. Target: none
failed, none slower than the limit plus 1 s.

    .venv/bin/python benchmarks/stress_silent_replica.py [--database mysql]
"""

import argparse
import contextlib
import socket
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / 'tests'))

import sqlalchemy as sa  # noqa: E402
from pyramid.config import Configurator  # noqa: E402
from waitress.server import create_server  # noqa: E402

from conftest import MYSQL_URL, POSTGRESQL_URL  # noqa: E402

LIMIT = 2  # dbtune.connect_timeout, seconds (libpq takes no less)
CLIENTS = 8


class SilentServer:
    """A port that accepts connections and never says a word."""

    def __init__(self):
        self.listener = socket.create_server(('127.0.0.1', 0), backlog=64)
        self.port = self.listener.getsockname()[1]
        self.accepted = []
        self.listener.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self):
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                self.accepted.append(self.listener.accept()[0])

    def close(self):
        self._stop.set()
        self._thread.join()
        for connection in self.accepted:
            connection.close()
        self.listener.close()


def serve(url, silent_port):
    silent = sa.engine.make_url(url).set(
        host='127.0.0.1', port=silent_port, database='none'
    )
    settings = {
        'dbtune.url': url,
        'dbtune.read_urls': silent.render_as_string(hide_password=False),
        'dbtune.connect_timeout': str(LIMIT),
        # PyMySQL waits for the server's greeting under its read timeout.
        'dbtune.statement_timeout': str(LIMIT),
    }
    with Configurator(settings=settings) as config:
        config.include('pyramid_dbtune')
        config.add_sql_method('one', 'SELECT 1 AS one', cache_time=0)
        config.add_route('read', '/read')
        config.add_view(
            lambda request: {'one': request.sql.one()[0].one},
            route_name='read',
            renderer='json',
        )
        app = config.make_wsgi_app()
    server = create_server(app, host='127.0.0.1', port=0, threads=CLIENTS)
    threading.Thread(target=server.run, daemon=True).start()
    return app, server


def read(port):
    """Seconds one read took, or the error it failed with."""
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(
            f'http://127.0.0.1:{port}/read', timeout=60
        ) as response:
            response.read()
    except Exception as exc:  # noqa: BLE001 (every failure is counted)
        return f'{exc.__class__.__name__}: {exc}'
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--reads', type=int, default=400)
    parser.add_argument(
        '--database', choices=('postgresql', 'mysql'), default='postgresql'
    )
    parser.add_argument('--quick', action='store_true')
    args = parser.parse_args(argv)
    reads = 40 if args.quick else args.reads
    url = POSTGRESQL_URL if args.database == 'postgresql' else MYSQL_URL
    silent = SilentServer()
    app, server = serve(url, silent.port)
    try:
        with ThreadPoolExecutor(CLIENTS) as clients:
            results = list(clients.map(read, [server.effective_port] * reads))
    finally:
        server.close()
        app.registry.dbtune.router.dispose()
        silent.close()
    failed = [r for r in results if isinstance(r, str)]
    times = [r for r in results if not isinstance(r, str)]
    slowest = max(times, default=0.0)
    print(
        f'{reads} reads over HTTP on {args.database}, {CLIENTS} at once, '
        f'the replica silent, dbtune.connect_timeout = {LIMIT} s'
    )
    print(
        f'failed: {len(failed)}' + (f' (first: {failed[0]})' if failed else '')
    )
    print(f'slowest: {slowest:.2f} s (limit + 1 s: {LIMIT + 1} s)')
    print(f'connections the silent replica was sent: {len(silent.accepted)}')
    met = not failed and slowest <= LIMIT + 1
    print(f'target: {"met" if met else "NOT met"}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
