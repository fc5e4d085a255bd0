"""The deep health check, ``python:pyramid_dbtune.fastpath:deep_check``:
it pings the database (and memcached) from a fast path, one ping in flight at
a time, its answer reused a short while."""

import logging
import os
import threading
import weakref
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from time import monotonic

from sqlalchemy import literal_column, select

from ..deploy import forks

log = logging.getLogger(__name__)

#: Where the fast path puts the Pyramid registry in the environ.
REGISTRY_KEY = 'pyramid_dbtune.registry'
#: A fixed answer's headers, unless it says otherwise.
DEFAULT_CONTENT_TYPE = 'text/plain; charset=utf-8'
DEFAULT_CACHE_CONTROL = 'no-store'


class _Health:
    """One deep check in flight at a time; its answer reused a while."""

    def __init__(self):
        self.after_fork()
        forks.renew_after_fork(self)

    def after_fork(self):
        """Start afresh: a ping in flight, and its lock, are the parent's."""
        self.lock = threading.Lock()
        self.answer = None
        self.expires = 0.0
        self.running = None
        self.started = 0.0
        self.stranded = 0


_healths = weakref.WeakKeyDictionary()
_healths_lock = threading.Lock()


def _new_healths_lock():
    global _healths_lock
    _healths_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_healths_lock)
#: A ping still running this many timeouts on is given up for a new one;
#: at most this many given-up pings may hang at once.
ABANDON_AFTER = 10
MAX_STRANDED = 3


def _health_of(dbtune):
    with _healths_lock:
        health = _healths.get(dbtune)
        if health is None:
            health = _healths[dbtune] = _Health()
        return health


def _ping(dbtune, health, future):
    result = ('503 Service Unavailable', 'database check was interrupted')
    what = 'database'
    try:
        if dbtune.router is not None:
            _select_one(dbtune.router.writer)
        # A shared cache is pinged too; the in-process one cannot be down.
        what = future.pinging = 'cache'
        ping = getattr(dbtune.cache, 'ping', None)
        if ping is not None:
            ping()
        result = ('200 OK', 'OK')
    except Exception as exc:
        # The answer names the error's kind only: a health check is often
        # public, and error texts name hosts.
        log.warning('deep check: the %s failed: %s', what, exc)
        result = (
            '503 Service Unavailable',
            f'{what} unavailable: {exc.__class__.__name__}',
        )
    finally:
        with health.lock:
            if health.running is future:
                health.running = None
            else:
                health.stranded -= 1  # given up on, and now back
        future.set_result(result)


def _select_one(engine):
    """``SELECT 1`` on ``engine``, the writer, whose pool tries a
    connection as it is taken (``pool_pre_ping``): one found dropped (a
    database restarted, a proxy that closes idle connections) is
    replaced, not reported as the database being down."""
    with engine.connect() as connection:
        connection.execute(select(literal_column('1')))


def _start_ping(dbtune, health, now):
    """Start a ping; the caller holds ``health.lock``."""
    future = Future()
    # What is being pinged: a check that gives up waiting names the server
    # that hangs.
    future.pinging = 'database'
    threading.Thread(
        target=_ping,
        args=(dbtune, health, future),
        daemon=True,
        name='pyramid_dbtune deep check',
    ).start()
    health.running = future
    health.started = now
    return future


def deep_check(environ, timeout=1.0, reuse=1.0):
    """A health check that pings the database, and memcached if it is the
    cache.

    Answers ``200 OK`` when they answered within ``timeout`` seconds, else
    ``503`` with the reason. One check runs at a time per application and
    its answer is reused for ``reuse`` seconds, so a storm of health checks
    is never a storm of queries. A ping that hangs is given up after ten
    timeouts and a new one started (at most three hang at once). Map a path
    to it with ``/healthz=python:pyramid_dbtune.fastpath:deep_check``.
    """
    registry = environ.get(REGISTRY_KEY)
    dbtune = getattr(registry, 'dbtune', None)
    if dbtune is None:
        return _text('500 Internal Server Error', 'no pyramid_dbtune app')
    health = _health_of(dbtune)
    now = monotonic()
    with health.lock:
        if health.answer is not None and now < health.expires:
            return health.answer
        future = health.running
        if future is None:
            future = _start_ping(dbtune, health, now)
        elif (
            now - health.started > ABANDON_AFTER * timeout
            and health.stranded < MAX_STRANDED
        ):
            health.stranded += 1
            future = _start_ping(dbtune, health, now)
    try:
        status, reason = future.result(timeout)
    except FutureTimeout:
        status, reason = (
            '503 Service Unavailable',
            f'{future.pinging} did not answer within {timeout:g} s',
        )
    answer = _text(status, reason)
    with health.lock:
        health.answer = answer
        health.expires = monotonic() + reuse
    return answer


def _text(status, text):
    body = (text + '\n').encode('utf-8')
    return (
        status,
        [
            ('Content-Type', DEFAULT_CONTENT_TYPE),
            ('Cache-Control', DEFAULT_CACHE_CONTROL),
        ],
        body,
    )
