"""Who may see the ``/_dbtune/`` views: a token, or a permission.

Every ``/_dbtune/`` view is off by default. A view that is on answers only
a request that carries ``dbtune.stats.token`` (in the ``X-Dbtune-Token``
header or the ``token`` query parameter) or that holds the Pyramid
permission named by ``dbtune.stats.permission``. Anything else gets a 404,
as if the view were not there: an operator's page is not advertised.
"""

import hmac

from pyramid.exceptions import ConfigurationError
from pyramid.httpexceptions import HTTPNotFound
from pyramid.interfaces import ISecurityPolicy

#: The request header that carries the token.
HEADER = 'X-Dbtune-Token'
#: Every guarded view's path starts here.
PREFIX = '/_dbtune/'


def allowed(request):
    """True when ``request`` may see the ``/_dbtune/`` views."""
    settings = request.registry.dbtune.settings
    token = settings.stats_token
    if token is not None:
        given = request.headers.get(HEADER) or request.GET.get('token')
        if given is not None and hmac.compare_digest(
            given.encode('utf-8'), token.encode('utf-8')
        ):
            return True
    permission = settings.stats_permission
    # Without a security policy Pyramid allows every permission: that must
    # not open the operator's views to everyone.
    return bool(
        permission is not None
        and request.registry.queryUtility(ISecurityPolicy) is not None
        and request.has_permission(permission)
    )


def guarded(view):
    """Wrap ``view(request)`` to answer 404 unless :func:`allowed`."""

    def guarded_view(context, request):
        if not allowed(request):
            raise HTTPNotFound()
        return view(request)

    guarded_view.__wrapped__ = view
    guarded_view.__doc__ = view.__doc__
    return guarded_view


def add_view(config, name, pattern, view, **view_options):
    """Add ``view`` at ``/_dbtune/<pattern>`` as route ``dbtune.<name>``.

    The view is guarded (:func:`guarded`); ``view_options`` go to
    ``config.add_view`` (``renderer``, ``request_method``...).
    """
    route = f'dbtune.{name}'
    config.add_route(route, PREFIX + pattern)
    config.add_view(guarded(view), route_name=route, **view_options)


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
