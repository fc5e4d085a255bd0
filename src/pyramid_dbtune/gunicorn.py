"""``gunicorn -c python:pyramid_dbtune.gunicorn``: the settings and hooks of
:mod:`pyramid_dbtune.deploy.gunicorn`, under the name gunicorn is given.

``from pyramid_dbtune.gunicorn import *`` imports the hooks alone.
"""

from .deploy.gunicorn import (  # noqa: F401 (gunicorn reads these names)
    child_exit,
    post_fork,
    post_worker_init,
    preload_app,
    reuse_port,
    threads,
    when_ready,
    worker_class,
    workers,
)

__all__ = ['child_exit', 'post_fork', 'post_worker_init', 'when_ready']
