"""gunicorn settings and hooks for a pyramid_dbtune application.

    gunicorn -c python:pyramid_dbtune.gunicorn --paste production.ini

The defaults, derived from the host (command-line flags still win, as
gunicorn applies them after the config file):

* ``workers``: one per core this process may use
  (:func:`pyramid_dbtune.ops.probes.usable_cores`: its CPU affinity, at most
  its container's CPU quota), or ``WEB_CONCURRENCY`` when set. The GIL
  lets one thread of a process run Python at a time, so CPU work scales
  with processes, up to the cores.
* ``preload_app``: on. The application loads once, in the master, and
  the workers share its memory; the hooks below make that safe (nothing
  opened before the fork is used after it). ``--no-preload`` is not a
  flag of gunicorn's: a config of your own sets ``preload_app = False``.
* ``threads``: :data:`THREADS_PER_WORKER` per worker (``worker_class =
  gthread``), so that a worker keeps its core busy while some of its
  requests wait on the database, memcached or the client. For sync
  workers give ``-k sync --threads 1``: gunicorn runs a sync worker with
  more than one thread as gthread (``post_worker_init`` warns).
* ``reuse_port``: on with two workers or more. Each worker listens on a
  socket of its own (``SO_REUSEPORT``, gunicorn 22 and later), and the
  kernel shares new connections among them. On one shared socket,
  whichever worker is free first takes every connection that comes at
  once, and keeps it for as long as its client keeps it alive: under 32
  keep-alive clients one worker at times took them all, and the site ran
  on one core. A worker's socket goes with it, though: see the
  deployment docs for restarts. With one worker it is off, and the
  master keeps the one socket while its worker restarts. A config of
  your own sets ``reuse_port`` where a second server binding the same
  address must fail rather than share it.

The hooks are what makes ``--preload`` safe, and are correct under any
config: one of your own takes them with
``from pyramid_dbtune.gunicorn import *`` (which imports the hooks alone),
or calls them from hooks of its own.
"""

import gc
import os

from .. import fastpath
from ..convert import whole_number
from ..ops import probes
from . import forks

__all__ = ['child_exit', 'post_fork', 'post_worker_init', 'when_ready']

#: Threads per worker in the default configuration.
THREADS_PER_WORKER = 4


def default_workers(environ=os.environ):
    """``WEB_CONCURRENCY`` when set, else the cores this process may use."""
    text = environ.get('WEB_CONCURRENCY', '').strip()
    if not text:
        return probes.usable_cores()
    workers = whole_number(text, 1)
    if workers is None:
        raise ValueError(
            f'WEB_CONCURRENCY = {text!r} is not valid: expected a whole '
            'number of worker processes above 0'
        )
    return workers


workers = default_workers()
preload_app = True
threads = THREADS_PER_WORKER
worker_class = 'gthread'
reuse_port = workers > 1


def threads_of(cfg):
    """Requests one worker of gunicorn config ``cfg`` serves at once."""
    kind = cfg.worker_class_str
    if kind == 'gthread' or kind.endswith('ThreadWorker'):
        return cfg.threads
    if kind == 'sync' or kind.endswith('SyncWorker'):
        return 1
    if 'tornado' in kind.lower():
        return 1  # one WSGI request at a time: WSGI blocks its loop
    return cfg.worker_connections  # gevent, eventlet: green threads


def _sync_made_gthread(cfg):
    """Whether ``-k sync`` was asked for and gunicorn runs gthread, as it
    does when ``threads`` is above 1 (this module's default is 4)."""
    asked = cfg.settings['worker_class'].get()
    sync = isinstance(asked, str) and (
        asked == 'sync' or asked.endswith('SyncWorker')
    )
    return sync and cfg.threads > 1


def post_fork(server, worker):
    """In each worker, just after the fork.

    Renews the pools, cache clients and locks the application opened in
    the master (``--preload``): ``os.fork`` has done it already through
    :func:`pyramid_dbtune.deploy.forks.renew`, which renews once per
    process, so
    this is the same guarantee said where gunicorn users look for it.
    Records the worker's configuration for the probe views. Raises when
    something could not be renewed (gunicorn then stops: a worker that
    shares its master's connections corrupts their answers).
    """
    forks.renew()
    if forks.failures:
        raise RuntimeError(
            'pyramid_dbtune: could not renew after the fork: '
            + '; '.join(f'{obj!r}: {exc!r}' for obj, exc in forks.failures)
        )
    cfg = worker.cfg
    probes.declare(
        server='gunicorn',
        workers=cfg.workers,
        threads=threads_of(cfg),
        worker_class=cfg.worker_class_str,
    )


def _dbtune_of(app):
    """The ``registry.dbtune`` of a WSGI app, through its wrappers (the
    fastpath filter's among them)."""
    return getattr(fastpath.registry_of(app), 'dbtune', None)


def post_worker_init(worker):
    """In each worker, once it has the application.

    Logs how many objects opened before the fork were renewed, and warns
    when each thread cannot keep a read connection: a read pool smaller
    than the worker's threads opens and closes connections under load.
    """
    forks.renew()
    if forks.renewed:
        worker.log.info(
            'pyramid_dbtune: worker %s renewed %d pools, caches and locks '
            'opened before the fork',
            os.getpid(),
            forks.renewed,
        )
    if _sync_made_gthread(worker.cfg):
        worker.log.warning(
            'pyramid_dbtune: worker_class is sync, but with threads = %d '
            'gunicorn runs gthread workers; for sync workers give -k sync '
            '--threads 1',
            worker.cfg.threads,
        )
    dbtune = _dbtune_of(worker.wsgi)
    count = threads_of(worker.cfg)
    if dbtune is not None and dbtune.router is not None:
        pool = dbtune.settings.read_pool_size
        if pool < count:
            worker.log.warning(
                'pyramid_dbtune: dbtune.read_pool_size = %d is below the '
                '%d threads of this worker: reads beyond %d at once open '
                'and close a connection each; set it to %d or more',
                pool,
                count,
                pool,
                count,
            )


def when_ready(server):
    """In the master, once it is ready, before it forks the workers.

    With ``--preload``, closes the connections the application opened in
    the master while loading: the workers drop their copies unclosed and
    open their own, so the master's would stay open, idle, for as long as
    it runs. Stops the master's listener (``dbtune.cache.listen``): each
    worker has its own. Without ``--preload`` the master has no
    application: nothing to do (and nothing is loaded).
    """
    if not server.cfg.preload_app:
        return
    dbtune = _dbtune_of(server.app.wsgi())
    if dbtune is not None and dbtune.router is not None:
        dbtune.router.dispose()
    if dbtune is not None and dbtune.listener is not None:
        # Each worker listens: the master's thread stops before the
        # workers fork, holding nothing of its own they would inherit.
        dbtune.listener.before_fork()
    # What the application made while loading lives as long as the
    # process: out of the collector's way, each full collection in a
    # worker walks only what the worker made, and the workers' pages of
    # it stay shared (the gc module's advice for servers that fork).
    gc.freeze()


def child_exit(server, worker):
    """In the master, once a worker has exited.

    With ``PROMETHEUS_MULTIPROC_DIR`` set, tells prometheus_client that the
    worker is gone (``mark_process_dead``): its gauges, such as the
    requests it had in flight, no longer count; its counters still do.
    """
    if os.environ.get('PROMETHEUS_MULTIPROC_DIR'):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
