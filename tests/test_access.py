"""The guard on the /_dbtune/ views: a token or a permission, else 404."""

import pytest
from pyramid.authorization import ACLHelper, Allow, Everyone
from pyramid.config import Configurator
from pyramid.exceptions import ConfigurationError
from webtest import TestApp

from pyramid_dbtune import access

TOKEN = 'a-token-of-16-chars-or-more'


def secret_view(request):
    """The operator's figures."""
    return {'figures': 42}


class Policy:
    """Lets in the user named in the X-User header; 'ops' may see stats."""

    def identity(self, request):
        return request.headers.get('X-User')

    def authenticated_userid(self, request):
        return self.identity(request)

    def permits(self, request, context, permission):
        principals = [Everyone]
        if self.identity(request):
            principals.append(self.identity(request))
        return ACLHelper().permits(self, principals, permission)

    __acl__ = [(Allow, 'ops', 'view-stats')]


def make(policy=None, **settings):
    settings = {f'dbtune.{k}': v for k, v in settings.items()}
    with Configurator(settings=settings) as config:
        config.include('pyramid_dbtune')
        if policy is not None:
            config.set_security_policy(policy)
        access.add_view(config, 'secret', 'secret', secret_view,
                        renderer='json')  # fmt: skip
        app = config.make_wsgi_app()
    return TestApp(app)


def test_token_in_header_or_query_lets_in():
    app = make(**{'stats.token': TOKEN})
    assert app.get('/_dbtune/secret', headers={access.HEADER: TOKEN}).json
    assert app.get('/_dbtune/secret', params={'token': TOKEN}).json == {
        'figures': 42
    }


@pytest.mark.parametrize(
    'kw',
    [
        {},
        {'headers': {access.HEADER: TOKEN[:-1]}},
        {'headers': {access.HEADER: TOKEN + 'x'}},
        {'params': {'token': ''}},
        {'params': {'token': 'é' * 20}},
    ],
)
def test_anything_else_is_not_found(kw):
    app = make(**{'stats.token': TOKEN})
    app.get('/_dbtune/secret', status=404, **kw)
    # Other /_dbtune/ paths are not there either.
    app.get('/_dbtune/other', status=404, headers={access.HEADER: TOKEN})


def test_permission_of_the_security_policy():
    app = make(Policy(), **{'stats.permission': 'view-stats'})
    assert app.get('/_dbtune/secret', headers={'X-User': 'ops'}).json
    app.get('/_dbtune/secret', headers={'X-User': 'guest'}, status=404)
    app.get('/_dbtune/secret', status=404)
    # A token, when set too, is another way in.
    app = make(Policy(), **{'stats.permission': 'view-stats',
                            'stats.token': TOKEN})  # fmt: skip
    assert app.get('/_dbtune/secret', headers={access.HEADER: TOKEN}).json
    assert app.get('/_dbtune/secret', headers={'X-User': 'ops'}).json


def test_a_permission_needs_a_security_policy():
    # Without a policy Pyramid grants every permission.
    with pytest.raises(ConfigurationError, match='needs a security policy'):
        make(**{'stats.permission': 'view-stats'})


def test_no_token_and_no_permission_lets_nobody_in():
    app = make()
    app.get('/_dbtune/secret', status=404)
    app.get('/_dbtune/secret', status=404, params={'token': 'None'})


def test_a_feature_needs_a_way_in():
    app = make()
    settings = app.app.registry.dbtune.settings
    with pytest.raises(ConfigurationError, match='dbtune.stats = true needs'):
        access.check(settings, 'stats')
    access.check(make(**{'stats.token': TOKEN}).app.registry.dbtune.settings,
                 'stats')  # fmt: skip


def test_a_request_without_a_registry_policy_is_refused(monkeypatch):
    # Even if start-up were bypassed, no policy means no way in.
    app = make(Policy(), **{'stats.permission': 'view-stats'})
    registry = app.app.registry
    from pyramid.interfaces import ISecurityPolicy

    registry.unregisterUtility(provided=ISecurityPolicy)
    app.get('/_dbtune/secret', headers={'X-User': 'ops'}, status=404)


def test_guarded_keeps_the_views_docstring():
    assert access.guarded(secret_view).__doc__ == secret_view.__doc__
    assert access.guarded(secret_view).__wrapped__ is secret_view
