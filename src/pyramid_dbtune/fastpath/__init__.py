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
import sys
from collections.abc import Mapping

from pyramid.events import ApplicationCreated
from pyramid.exceptions import ConfigurationError
from pyramid.path import DottedNameResolver
from pyramid.registry import Registry

from .health import (  # noqa: F401 (deep_check: its documented name)
    DEFAULT_CACHE_CONTROL,
    DEFAULT_CONTENT_TYPE,
    REGISTRY_KEY,
    deep_check,
)

log = logging.getLogger(__name__)

CALLABLE_PREFIX = 'python:'
#: The environ key under which a callable finds the Pyramid registry.


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
    and kept so: a table read again is the same table.
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
        if path in table:
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
        table[path] = answer
    return table


def _resolve(path, name):
    if not name:
        raise FastPathError(
            f'fast path {path}: python: needs a dotted name, such as '
            'python:pyramid_dbtune.fastpath:deep_check'
        )
    try:
        answer = DottedNameResolver().resolve(name)
    except Exception as exc:
        raise FastPathError(
            f'fast path {path}: cannot import {name!r}: '
            f'{exc.__class__.__name__}: {exc}'
        ) from None
    if not callable(answer):
        # Else a string it names would be served as the body.
        raise FastPathError(
            f'fast path {path}: python: must name a callable, and {name} '
            f'is a {type(answer).__name__}'
        )
    return answer


def _responders(
    paths,
    content_type=DEFAULT_CONTENT_TYPE,
    cache_control=None,
    registry=None,
):
    if cache_control is None:
        cache_control = DEFAULT_CACHE_CONTROL
    # Matched against PATH_INFO, which holds the path in WSGI's form.
    return {
        path.encode('utf-8').decode('latin-1'): _Dynamic(answer, registry)
        if callable(answer)
        else _Static(answer, content_type, cache_control)
        for path, answer in parse_paths(paths).items()
    }


def registry_of(app):
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
        registry if registry is not None else registry_of(app),
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
    if registry is not None:  # for registry_of, as gunicorn's hooks ask
        fastpath.registry = registry
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
    table = parse_paths(paths)
    registry = registry_of(app)
    if registry is None and any(map(callable, table.values())):
        registry = _zope_registry()
    return wrap(
        app,
        table,
        content_type=content_type or DEFAULT_CONTENT_TYPE,
        cache_control=cache_control,
        registry=registry,
    )


def _zope_registry():
    """In a Zope site on pyramid_dbtune (the site's ZCML loaded its Zope
    side), a registry holding the dbtune of Zope's database; else None.

    That database is made from zope.conf's settings as Zope starts, or by
    a dbtune filter nearer Zope in the pipeline, made before this one.
    """
    zope = sys.modules.get('pyramid_dbtune.zope')
    if zope is None:
        return None
    try:
        dbtune = zope.database().dbtune
    except ConfigurationError as exc:
        raise FastPathError(
            "the fastpath filter's python: callables need pyramid_dbtune's "
            'database, and Zope has none yet: give its settings in '
            'zope.conf, or give the dbtune filter dbtune.fast_paths '
            f'instead of this filter ({exc})'
        ) from None
    registry = Registry(zope.__name__)
    registry.dbtune = dbtune
    return registry


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
                return _FixedAnswer(responder, method == 'HEAD')
        return self.policy(environ, router)


class _FixedAnswer:
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
