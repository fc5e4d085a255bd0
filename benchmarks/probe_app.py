"""A Pyramid app that serves pyramid_dbtune's probe views, for servers
started by threads_vs_processes.py and by the tests.

    gunicorn 'probe_app:app_factory()'

From the environment: ``DBTUNE_PROBE_URL``, a database for the ``sql``
probe (none: no ``sql`` probe); ``DBTUNE_PROBE_OPEN_POOL=1`` reads once
at start-up, so that the pools hold connections before a ``--preload``
server forks; ``DBTUNE_PROBE_LOCK``, a file that every request locks
(``flock``) while the application serves it, so that all the workers
together serve one request at a time.
"""

import fcntl
import os

import sqlalchemy as sa
from pyramid.config import Configurator

#: The probes' token (dbtune.stats.token).
TOKEN = 'probe-token-16-chars-or-more'


def app_factory():
    settings = {'dbtune.probes': 'true', 'dbtune.stats.token': TOKEN}
    if os.environ.get('DBTUNE_PROBE_URL'):
        settings['dbtune.url'] = os.environ['DBTUNE_PROBE_URL']
    with Configurator(settings=settings) as config:
        config.include('pyramid_dbtune')
        app = config.make_wsgi_app()
    if os.environ.get('DBTUNE_PROBE_OPEN_POOL'):
        router = app.registry.dbtune.router
        router.read(sa.text('SELECT 1'), {}, 0)
        with router.writer.connect() as connection:
            connection.exec_driver_sql('SELECT 1')
    if os.environ.get('DBTUNE_PROBE_LOCK'):
        return _one_at_a_time(app, os.environ['DBTUNE_PROBE_LOCK'])
    return app


def _one_at_a_time(app, path):
    def locked(environ, start_response):
        fd = os.open(path, os.O_CREAT | os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return list(app(environ, start_response))
        finally:
            os.close(fd)

    return locked
