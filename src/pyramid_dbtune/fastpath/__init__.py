"""The fast path: fixed answers at the cost of a bare WSGI callable.

A health check's ``OK`` need not pay for a request object, traversal and a
transaction. The fast path answers a few exact paths itself, for GET and
HEAD, and passes everything else on untouched. It comes in two forms:

* a WSGI wrapper, :func:`wrap`, also the paste filter
  ``egg:pyramid_dbtune#fastpath``;
* the setting ``dbtune.fast_paths``, which wraps Pyramid's execution
  policy, so that the answer is given before Pyramid builds a request
  (and outside pyramid_retry's and pyramid_tm's work).

A path maps to a body (``/healthz=OK``) or to a callable named with a
``python:`` prefix (``/healthz=python:pyramid_dbtune.fastpath:deep_check``)
that takes the WSGI environ and returns ``(status, headers, body)``.
"""

import logging
import os
import threading
import weakref
from collections.abc import Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from time import monotonic

from pyramid.events import ApplicationCreated
from pyramid.path import DottedNameResolver
from sqlalchemy import literal_column, select

from ..deploy import forks

log = logging.getLogger(__name__)

CALLABLE_PREFIX = 'python:'
DEFAULT_CONTENT_TYPE = 'text/plain; charset=utf-8'
DEFAULT_CACHE_CONTROL = 'no-store'
#: The environ key under which a callable finds the Pyramid registry.
REGISTRY_KEY = 'pyramid_dbtune.registry'


class FastPathError(ValueError):
    """A fast-path table that cannot be read; the text says what is wrong."""


class _Static:
    """A fixed answer, headers and body made once."""

    __slots__ = ('get_headers', 'body')

    def __init__(self, body, content_type, cache_control):
        self.body = [body]
        self.get_headers = [
            ('Content-Type', content_type),
            ('Content-Length', str(len(body))),
        ]
        if cache_control:
            self.get_headers.append(('Cache-Control', cache_control))

    def __call__(self, environ, start_response, head):
        start_response('200 OK', list(self.get_headers))
        return [] if head else self.body


class _Dynamic:
    """An answer computed by ``function(environ)`` at each request."""

    __slots__ = ('function', 'registry')

    def __init__(self, function, registry):
        self.function = function
        self.registry = registry

    def __call__(self, environ, start_response, head):
        if self.registry is not None:
            environ[REGISTRY_KEY] = self.registry
        try:
            status, headers, body = _checked(*self.function(environ))
        except Exception:
            log.exception('fast path %s failed', environ.get('PATH_INFO'))
            status, headers, body = (
                '500 Internal Server Error',
                [('Content-Type', DEFAULT_CONTENT_TYPE)],
                b'fast path failed\n',
            )
        if not any(k.lower() == 'content-length' for k, _ in headers):
            headers.append(('Content-Length', str(len(body))))
        start_response(status, headers)
        return [] if head else [body]


def _checked(status, headers, body):
    """A callable's answer in WSGI's types, or a TypeError saying why."""
    if isinstance(body, str):
        body = body.encode('utf-8')
    headers = list(headers)
    if not (
        isinstance(status, str)
        and isinstance(body, bytes)
        and all(
            isinstance(h, tuple)
            and len(h) == 2
            and all(isinstance(v, str) for v in h)
            for h in headers
        )
    ):
        raise TypeError(
            'a fast-path callable must return (status str, [(name, value) '
            f'str pairs], body bytes or str), not {status!r}, {headers!r}, '
            f'{type(body).__name__}'
        )
    return status, headers, body


def parse_paths(paths):
    """Read a fast-path table into ``{path: body or callable}``.

    ``paths`` is a mapping, or a string of whitespace-separated
    ``/path=answer`` items, where the answer is a body or ``python:`` and a
    dotted name. Paths are written decoded (``/santé``, not ``/sant%C3%A9``)
    and are kept in WSGI's form, as ``PATH_INFO`` holds them.
    """
    if isinstance(paths, str):
        items = []
        for item in paths.split():
            path, sep, answer = item.partition('=')
            if not sep:
                raise FastPathError(
                    f'fast path {item!r} is not /path=answer (such as '
                    '/healthz=OK)'
                )
            items.append((path, answer))
    elif isinstance(paths, Mapping):
        items = list(paths.items())
    else:
        raise FastPathError(
            'fast paths are a string of /path=answer items or a mapping, '
            f'not {type(paths).__name__}'
        )
    table = {}
    for path, answer in items:
        if not isinstance(path, str) or not path.startswith('/'):
            raise FastPathError(f'fast path {path!r} must start with "/"')
        if '%' in path or '?' in path:
            raise FastPathError(
                f'fast path {path!r}: write the path decoded, without a '
                'query string (it is matched against PATH_INFO)'
            )
        wsgi_path = path.encode('utf-8').decode('latin-1')
        if wsgi_path in table:
            raise FastPathError(f'fast path {path!r} is given twice')
        if isinstance(answer, str) and answer.startswith(CALLABLE_PREFIX):
            answer = _resolve(path, answer[len(CALLABLE_PREFIX) :])
        if isinstance(answer, str):
            answer = answer.encode('utf-8')
        if not (isinstance(answer, bytes) or callable(answer)):
            raise FastPathError(
                f'fast path {path}: the answer must be text, bytes or a '
                f'callable, not {answer!r}'
            )
        table[wsgi_path] = answer
    return table


def _resolve(path, name):
    if not name:
        raise FastPathError(
            f'fast path {path}: python: needs a dotted name, such as '
            'python:pyramid_dbtune.fastpath:deep_check'
        )
    try:
        return DottedNameResolver().resolve(name)
    except Exception as exc:
        raise FastPathError(
            f'fast path {path}: cannot import {name!r}: '
            f'{exc.__class__.__name__}: {exc}'
        ) from None


def _responders(
    paths,
    content_type=DEFAULT_CONTENT_TYPE,
    cache_control=None,
    registry=None,
):
    if cache_control is None:
        cache_control = DEFAULT_CACHE_CONTROL
    return {
        path: _Dynamic(answer, registry)
        if callable(answer)
        else _Static(answer, content_type, cache_control)
        for path, answer in parse_paths(paths).items()
    }


def _registry_of(app):
    """The Pyramid registry of ``app``, looked for through middleware that
    keeps what it wraps as ``app``, ``application`` or ``wrapped``."""
    for _ in range(10):
        registry = getattr(app, 'registry', None)
        if registry is not None:
            return registry
        app = next(
            (
                getattr(app, name)
                for name in ('app', 'application', 'wrapped')
                if getattr(app, name, None) is not None
            ),
            None,
        )
    return None


def wrap(
    app,
    paths,
    *,
    content_type=DEFAULT_CONTENT_TYPE,
    cache_control=None,
    registry=None,
):
    """Answer ``paths`` before ``app``; pass everything else to ``app``.

    A request is answered here when its ``PATH_INFO`` is exactly one of
    ``paths`` and its method is GET or HEAD (HEAD: the same headers, no
    body). ``content_type`` and ``cache_control`` (default ``no-store``;
    ``''`` for none) are sent with text answers. Callables find the
    Pyramid registry in the environ: ``registry``, or the one of the
    Pyramid app that ``app`` is or wraps.
    """
    responders = _responders(
        paths,
        content_type,
        cache_control,
        registry if registry is not None else _registry_of(app),
    )
    get = responders.get

    def fastpath(environ, start_response):
        responder = get(environ.get('PATH_INFO'))
        if responder is not None:
            method = environ.get('REQUEST_METHOD')
            if method == 'GET' or method == 'HEAD':
                return responder(environ, start_response, method == 'HEAD')
        return app(environ, start_response)

    fastpath.wrapped = app
    return fastpath


def filter_app_factory(
    app,
    global_conf,
    paths='',
    content_type=None,
    cache_control=None,
    **unknown,
):
    """The paste filter ``egg:pyramid_dbtune#fastpath``.

    Options: ``paths`` (``/ok.html=OK /healthz=OK``), ``content_type`` and
    ``cache_control``.
    """
    if unknown:
        raise FastPathError(
            f'the fastpath filter has no option {", ".join(sorted(unknown))}'
            '; its options are paths, content_type and cache_control'
        )
    if not paths.strip():
        raise FastPathError('the fastpath filter needs paths = /path=answer')
    return wrap(
        app,
        paths,
        content_type=content_type or DEFAULT_CONTENT_TYPE,
        cache_control=cache_control,
    )


class FastPathPolicy:
    """An execution policy that answers fast paths, then defers to the one
    it wraps (Pyramid's default, or pyramid_retry's)."""

    def __init__(self, responders, policy):
        self.responders = responders
        self.policy = policy

    def __call__(self, environ, router):
        responder = self.responders.get(environ.get('PATH_INFO'))
        if responder is not None:
            method = environ.get('REQUEST_METHOD')
            if method == 'GET' or method == 'HEAD':
                return _Answer(responder, method == 'HEAD')
        return self.policy(environ, router)


class _Answer:
    """What the router calls as the response: the responder, as WSGI."""

    __slots__ = ('responder', 'head')

    def __init__(self, responder, head):
        self.responder = responder
        self.head = head

    def __call__(self, environ, start_response):
        return self.responder(environ, start_response, self.head)


def install(config, paths):
    """Answer ``paths`` in every router this configuration makes.

    The policy of each new router (Pyramid's, pyramid_retry's, or one set
    by :meth:`~pyramid.config.Configurator.set_execution_policy`, whenever
    it was set) is wrapped when the router is made, so nothing set later
    can leave the fast path out.
    """
    responders = _responders(paths, registry=config.registry)

    def wrap_policy(event):
        router = event.app
        router.execution_policy = FastPathPolicy(
            responders, router.execution_policy
        )

    config.add_subscriber(wrap_policy, ApplicationCreated)


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
            with dbtune.router.writer.connect() as connection:
                connection.execute(select(literal_column('1')))
        # A shared cache is pinged too; the in-process one cannot be down.
        what = 'cache'
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


def _start_ping(dbtune, health, now):
    """Start a ping; the caller holds ``health.lock``."""
    future = Future()
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
            f'database did not answer within {timeout:g} s',
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
