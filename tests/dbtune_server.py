"""Another OS process that serves the test app over HTTP.

    python dbtune_server.py '{"url": ..., "settings": {...},
                              "methods": [...]}'

Builds the app of :func:`conftest.make_app` on the test's database (its
tables are the test's), serves it on a free loopback port with the
standard library's threaded WSGI server, and prints the port once it
listens. It stops when its standard input closes.

``app_factory`` is the same app for an ini file (``use =
call:dbtune_server:app_factory``), with conftest's ``SEARCH``, ``GET`` and
``SET_RENT``.
"""

import functools
import json
import socketserver
import sys
import threading
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from conftest import GET, SEARCH, SET_RENT, make_app


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


class _Threaded(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


def app_factory(global_conf, **settings):
    return make_app(
        settings['dbtune.url'], [SEARCH, GET, SET_RENT], settings, tables=False
    ).app


def main(argv):
    job = json.loads(argv[1])
    app = make_app(job['url'], job['methods'], job['settings'], tables=False)
    server = make_server(
        '127.0.0.1', 0, app.app, server_class=_Threaded, handler_class=_Quiet
    )
    # Polled every 0.05 s, not 0.5: the tests wait for each to stop.
    serve = functools.partial(server.serve_forever, poll_interval=0.05)
    threading.Thread(target=serve, daemon=True).start()
    print(server.server_port, flush=True)
    sys.stdin.read()  # until the test is done with it
    server.shutdown()
    app.app.registry.dbtune.close()


if __name__ == '__main__':
    main(sys.argv)
