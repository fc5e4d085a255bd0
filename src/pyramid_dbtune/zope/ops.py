"""The paste filter ``egg:pyramid_dbtune#zope``, first in ``zope.ini``'s
pipeline: the package's settings given there rather than in
``zope.conf``, and the operator's side of a Zope site (the fast path,
Server-Timing, the stats, the profiler and the probes of ``dbtune
threadcheck``, behind the same token as in Pyramid).

With any of those on, the filter is a small Pyramid application on the
Zope process's own :class:`~pyramid_dbtune.registry.DBTune`: it answers
``/_dbtune/`` and the fast paths itself, and hands every other request,
as it came, to Zope, timed and counted under the route name ``zope``.
With only the fast paths or the probes on, Zope's requests go straight
to Zope; with none, the filter is Zope's application itself.
"""

from pyramid.config import Configurator
from pyramid.exceptions import ConfigurationError, URLDecodeError
from pyramid.interfaces import IResponse
from zope.interface import implementer

from .. import fastpath, install
from ..ops.access import PREFIX
from ..settings import PREFIX as SETTING
from .connection import configure, database

#: The route, and so the stats' name, of the requests Zope answers.
ROUTE = 'zope'


def filter_app_factory(app, global_conf, **settings):
    """The filter: ``dbtune.*`` settings, or none (then ``zope.conf``'s
    ``<product-config pyramid_dbtune>`` holds them)."""
    other = sorted(name for name in settings if not name.startswith(SETTING))
    if other:
        raise ConfigurationError(
            f'the dbtune filter takes dbtune.* settings, not {other[0]}'
        )
    return front(app, (configure(settings) if settings else database()).dbtune)


def front(app, dbtune):
    """``app`` (Zope's application) behind what ``dbtune``'s settings turn
    on: the operator's application, the fast paths, or nothing at all."""
    parsed = dbtune.settings
    if parsed.stats_permission is not None:
        raise ConfigurationError(
            'dbtune.stats.permission names a permission of a Pyramid '
            'security policy, which a Zope site has not: give '
            'dbtune.stats.token'
        )
    if not (
        parsed.server_timing
        or parsed.stats
        or parsed.profile
        or parsed.probes
        or parsed.fast_paths
    ):
        return app
    ops = operator_app(app, dbtune)
    if parsed.server_timing or parsed.stats or parsed.profile:
        return ops  # every request is timed
    # Nothing to time: Zope's requests need not pass Pyramid's router.
    if parsed.fast_paths:  # their callables find the registry of ``ops``
        app = fastpath.wrap(app, parsed.fast_paths, registry=ops.registry)
    if parsed.probes:
        app = _split(app, ops)
    return app


def operator_app(app, dbtune):
    """The Pyramid application of ``dbtune``'s operator's views, which
    hands every other request to ``app`` unchanged."""
    config = Configurator(
        settings={
            # Its own transactions, never Zope's (the thread's), and only
            # for its own views: Zope's requests run theirs.
            'tm.manager_hook': 'pyramid_tm.explicit_manager',
            'tm.activate_hook': _own,
        }
    )
    install(config, dbtune, check_names=False)
    zope = _published_by(app)
    config.add_route(ROUTE, '/*path')
    config.add_view(zope, route_name=ROUTE)
    # A path that is not UTF-8 fails Pyramid's routing: Zope answers it,
    # as it would without the filter.
    config.add_exception_view(zope, context=URLDecodeError)
    return config.make_wsgi_app()


def _published_by(app):
    def zope(request):
        return _ZopeAnswer(*request.call_application(app))

    return zope


@implementer(IResponse)
class _ZopeAnswer:
    """Zope's answer as Zope gave it, headers and body: the timing tween
    adds its header. (WebOb's Response, which ``pyramid.wsgi.wsgiapp``
    gives, makes a relative ``Location`` absolute from the request's
    scheme and host, which a proxy in front may not have passed on.)"""

    def __init__(self, status, headerlist, app_iter):
        self.status = status
        self.headerlist = headerlist
        self.app_iter = app_iter

    def __call__(self, environ, start_response):
        start_response(self.status, self.headerlist)
        return self.app_iter


def _own(request):
    # The raw path: request.path_info fails on one that is not UTF-8.
    return request.environ['PATH_INFO'].startswith(PREFIX)


def _split(app, ops):
    """``/_dbtune/`` to ``ops``, the rest straight to ``app``."""

    def dbtune_filter(environ, start_response):
        if environ.get('PATH_INFO', '').startswith(PREFIX):
            return ops(environ, start_response)
        return app(environ, start_response)

    # What gunicorn's hooks find the package's objects by (registry_of).
    dbtune_filter.wrapped = app
    dbtune_filter.registry = ops.registry
    return dbtune_filter
