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
import threading
import weakref
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from time import monotonic

from pyramid.interfaces import IExecutionPolicy
from pyramid.path import DottedNameResolver
from pyramid.router import default_execution_policy
from sqlalchemy import literal_column, select

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
            status, headers, body = self.function(environ)
        except Exception:
            log.exception('fast path %s failed', environ.get('PATH_INFO'))
            status, headers, body = (
                '500 Internal Server Error',
                [('Content-Type', DEFAULT_CONTENT_TYPE)],
                b'fast path failed\n',
            )
        if isinstance(body, str):
            body = body.encode('utf-8')
        headers = list(headers)
        if not any(k.lower() == 'content-length' for k, _ in headers):
            headers.append(('Content-Length', str(len(body))))
        start_response(status, headers)
        return [] if head else [body]


def parse_paths(paths):
    """Read a fast-path table into ``{path: body or callable}``.

    ``paths`` is a mapping, or a string of whitespace-separated
    ``/path=answer`` items, where the answer is a body or ``python:`` and a
    dotted name.
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
    else:
        items = list(dict(paths).items())
    table = {}
    for path, answer in items:
        if not isinstance(path, str) or not path.startswith('/'):
            raise FastPathError(f'fast path {path!r} must start with "/"')
        if path in table:
            raise FastPathError(f'fast path {path!r} is given twice')
        if isinstance(answer, str) and answer.startswith(CALLABLE_PREFIX):
            name = answer[len(CALLABLE_PREFIX) :]
            try:
                answer = DottedNameResolver().resolve(name)
            except (ImportError, ValueError) as exc:
                raise FastPathError(
                    f'fast path {path}: cannot import {name!r}: {exc}'
                ) from None
        if isinstance(answer, str):
            answer = answer.encode('utf-8')
        if not (isinstance(answer, bytes) or callable(answer)):
            raise FastPathError(
                f'fast path {path}: the answer must be text, bytes or a '
                f'callable, not {answer!r}'
            )
        table[path] = answer
    return table


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


def wrap(app, paths, *, content_type=DEFAULT_CONTENT_TYPE, cache_control=None):
    """Answer ``paths`` before ``app``; pass everything else to ``app``.

    A request is answered here when its ``PATH_INFO`` is exactly one of
    ``paths`` and its method is GET or HEAD (HEAD: the same headers, no
    body). ``content_type`` and ``cache_control`` (default ``no-store``;
    ``''`` for none) are sent with text answers.
    """
    responders = _responders(
        paths, content_type, cache_control, getattr(app, 'registry', None)
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
    app, global_conf, paths='', content_type=None, cache_control=None
):
    """The paste filter ``egg:pyramid_dbtune#fastpath``.

    Options: ``paths`` (``/ok.html=OK /healthz=OK``), ``content_type`` and
    ``cache_control``.
    """
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
    """Wrap the execution policy in effect with the fast paths.

    Run as a late action, after pyramid_retry (or anyone) has set theirs.
    """
    registry = config.registry
    responders = _responders(paths, registry=registry)

    def register():
        policy = registry.queryUtility(
            IExecutionPolicy, default=default_execution_policy
        )
        registry.registerUtility(
            FastPathPolicy(responders, policy), IExecutionPolicy
        )

    config.action(None, register, order=10)


class _Health:
    """One deep check in flight at a time; its answer reused a while."""

    def __init__(self):
        self.lock = threading.Lock()
        self.answer = None
        self.expires = 0.0
        self.running = None


_healths = weakref.WeakKeyDictionary()
_healths_lock = threading.Lock()


def _health_of(runtime):
    with _healths_lock:
        health = _healths.get(runtime)
        if health is None:
            health = _healths[runtime] = _Health()
        return health


def _ping(runtime, health, future):
    # The in-process cache cannot be down; a shared cache will be pinged
    # here too when there is one.
    try:
        if runtime.router is not None:
            with runtime.router.writer.connect() as connection:
                connection.execute(select(literal_column('1')))
        result = ('200 OK', 'OK')
    except Exception as exc:
        # The answer names the error's kind only: a health check is often
        # public, and error texts name hosts.
        log.warning('deep check: the database failed: %s', exc)
        result = (
            '503 Service Unavailable',
            f'database unavailable: {exc.__class__.__name__}',
        )
    with health.lock:
        health.running = None
    future.set_result(result)


def deep_check(environ, timeout=1.0, reuse=1.0):
    """A health check that pings the database.

    Answers ``200 OK`` when it answered within ``timeout`` seconds, else
    ``503`` with the reason. One check runs at a time per application and
    its answer is reused for ``reuse`` seconds, so a storm of health checks
    is never a storm of queries. Map a path to it with
    ``/healthz=python:pyramid_dbtune.fastpath:deep_check``.
    """
    registry = environ.get(REGISTRY_KEY)
    runtime = getattr(registry, 'dbtune', None)
    if runtime is None:
        return _text('500 Internal Server Error', 'no pyramid_dbtune app')
    health = _health_of(runtime)
    with health.lock:
        if health.answer is not None and monotonic() < health.expires:
            return health.answer
        future = health.running
        if future is None:
            future = health.running = Future()
            threading.Thread(
                target=_ping,
                args=(runtime, health, future),
                daemon=True,
                name='pyramid_dbtune deep check',
            ).start()
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
