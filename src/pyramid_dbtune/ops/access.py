"""Who may see the ``/_dbtune/`` views: a token, or a permission.

Every ``/_dbtune/`` view is off by default. A view that is on answers only
a request that carries ``dbtune.stats.token`` (in the ``X-Dbtune-Token``
header or the ``token`` query parameter) or that holds the Pyramid
permission named by ``dbtune.stats.permission``. Anything else gets a 404,
as if the view were not there: an operator's page is not advertised.

The views are the operator's, not the app's: the app's default permission
and its CSRF checks do not apply to them. A request that changes something
(``POST``) must carry the token in the header, where another site's page
cannot put it, or, let in by the permission, Pyramid's CSRF token.
"""

import functools
import hmac
import re

from pyramid.csrf import check_csrf_token
from pyramid.exceptions import BadCSRFToken, ConfigurationError
from pyramid.httpexceptions import HTTPNotFound
from pyramid.interfaces import ISecurityPolicy
from pyramid.security import NO_PERMISSION_REQUIRED

#: The request header that carries the token.
HEADER = 'X-Dbtune-Token'
#: Every guarded view's path starts here.
PREFIX = '/_dbtune/'
#: And its route's name here.
ROUTE_PREFIX = 'dbtune.'
#: The one route of all the guarded views (:func:`add_route`).
ROUTE = ROUTE_PREFIX + 'views'
#: Methods that change nothing (no CSRF check).
SAFE = frozenset(['GET', 'HEAD', 'OPTIONS'])
#: Headers of every answer of a guarded view, the 404 included: figures
#: are not to be kept by a cache, nor their URL (and its token) sent on.
HEADERS = (('Cache-Control', 'no-store'), ('Referrer-Policy', 'no-referrer'))


def query(request, name):
    """The query parameter ``name``, or None (also when it is not
    UTF-8)."""
    try:
        return request.GET.get(name)
    except UnicodeDecodeError:
        return None


def way_in(request):
    """How ``request`` may see the ``/_dbtune/`` views: ``'header'`` or
    ``'query'`` (the token), ``'permission'``, or None."""
    settings = request.registry.dbtune.settings
    token = settings.stats_token
    if token is not None:
        for where, given in (
            ('header', request.headers.get(HEADER)),
            ('query', query(request, 'token')),
        ):
            if given is not None and hmac.compare_digest(
                given.encode('utf-8'),
                token.encode('utf-8'),
            ):
                return where
    permission = settings.stats_permission
    # Without a security policy Pyramid allows every permission: that must
    # not open the operator's views to everyone.
    if (
        permission is not None
        and request.registry.queryUtility(ISecurityPolicy) is not None
        and request.has_permission(permission)
    ):
        return 'permission'
    return None


def allowed(request):
    """True when ``request`` may see the ``/_dbtune/`` views (and, for a
    method that changes something, was sent by the operator's page)."""
    way = way_in(request)
    if way is None or request.method in SAFE or way == 'header':
        return way is not None
    if way == 'permission':
        try:
            # Raises BadCSRFToken (400) for a request of another site.
            return check_csrf_token(request)
        except AttributeError:
            # request.session, without a session factory: no CSRF token.
            raise BadCSRFToken(
                'the app has no session, hence no CSRF token: send the '
                f'token in the {HEADER} header to change anything'
            ) from None
    return False  # a token in the query does not change anything


def _secure(request, response):
    response.headerlist.extend(HEADERS)


def guarded(view, methods=()):
    """Wrap ``view(request)`` to answer 404 unless :func:`allowed`, and
    asked by one of ``methods`` (``()``: any)."""

    @functools.wraps(view)
    def guarded_view(context, request):
        if (methods and request.method not in methods) or not allowed(request):
            # As Pyramid's router says a path that is not there: nothing
            # tells a view that is on from one that is not.
            raise HTTPNotFound(request.path_info)
        request.add_response_callback(_secure)
        return view(request)

    return guarded_view


def add_route(config):
    """Add the one route of the guarded views, :data:`ROUTE`, once they
    are all added (:func:`add_view`): it matches their paths and no other,
    and its views are told apart by the rest of the path.

    One route, not one a view: every request of the app is matched against
    the routes before its own (``pyramid_dbtune`` is included first, as
    usual), about 0.17 microseconds a route
    (``benchmarks/bench_overhead.py``), and with every feature on the views
    are ten. Any other path under :data:`PREFIX`, and a view's path with a
    ``/`` added, is still the app's to answer.
    """
    paths = '|'.join(re.escape(path) for path in config.registry.dbtune.views)
    config.add_route(ROUTE, PREFIX + '{view:%s}' % paths)  # noqa: UP031


def add_view(config, pattern, view, **view_options):
    """Add ``view`` at ``/_dbtune/<pattern>``, on :data:`ROUTE`; call
    :func:`add_route` once after the last.

    The view is guarded (:func:`guarded`); ``request_method`` is checked
    there too, not by a predicate, whose 404 would tell a view that is on;
    the other ``view_options`` go to ``config.add_view`` (``renderer``...).
    """
    config.registry.dbtune.views.append(pattern)
    method = view_options.pop('request_method', None)
    methods = {'GET': ('GET', 'HEAD'), None: ()}.get(method, (method,))
    config.add_view(
        guarded(view, methods),
        route_name=ROUTE,
        match_param=f'view={pattern}',
        permission=NO_PERMISSION_REQUIRED,
        require_csrf=False,  # allowed() checks it where it applies
        **view_options,
    )


def check(settings, feature):
    """At start-up: ``feature`` (a setting's name) needs a way in.

    A ``/_dbtune/`` view that nobody could reach is a setting mistake.
    """
    if settings.stats_token is None and settings.stats_permission is None:
        raise ConfigurationError(
            f'dbtune.{feature} = true needs dbtune.stats.token (a secret '
            'of 16 characters or more) or dbtune.stats.permission (a '
            'permission of your security policy): the /_dbtune/ views '
            'answer nobody else'
        )


def check_policy(registry):
    """After configuration: a permission needs a security policy.

    Without one, Pyramid allows every permission, which would let everyone
    in; :func:`allowed` refuses then, and this says why at start-up.
    """
    permission = registry.dbtune.settings.stats_permission
    if (
        permission is not None
        and registry.queryUtility(ISecurityPolicy) is None
    ):
        raise ConfigurationError(
            f'dbtune.stats.permission = {permission!r} needs a security '
            'policy (config.set_security_policy)'
        )
