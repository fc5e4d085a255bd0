"""The guard on the /_dbtune/ views: a token or a permission, else 404."""

import pytest
from pyramid.authorization import ACLHelper, Allow, Everyone
from pyramid.config import Configurator
from pyramid.csrf import get_csrf_token
from pyramid.exceptions import ConfigurationError
from pyramid.httpexceptions import HTTPNotFound
from pyramid.response import Response
from pyramid.security import NO_PERMISSION_REQUIRED, Denied
from pyramid.session import SignedCookieSessionFactory
from webtest import TestApp

from pyramid_dbtune.ops import access

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


def make(policy=None, commit=False, **settings):
    settings = {f'dbtune.{k}': v for k, v in settings.items()}
    with Configurator(settings=settings) as config:
        config.include('pyramid_dbtune')
        if commit:
            config.commit()
        if policy is not None:
            config.set_security_policy(policy)
        access.add_view(config, 'secret', secret_view, renderer='json')
        access.add_route(config)
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
    # One set after a commit is there as the app is made.
    app = make(Policy(), commit=True, **{'stats.permission': 'view-stats'})
    assert app.get('/_dbtune/secret', headers={'X-User': 'ops'}).json


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


class Nobody:
    """A policy that lets nobody in, and an app that needs a permission
    for every view (``config.set_default_permission``)."""

    def identity(self, request):
        return None

    def authenticated_userid(self, request):
        return None

    def permits(self, request, context, permission):
        return Denied('log in first')


def make_strict(policy, session=True, **settings):
    """An app that hardens its views: a default permission, and CSRF
    checks on every unsafe request."""
    settings = {f'dbtune.{k}': v for k, v in settings.items()}
    with Configurator(settings=settings) as config:
        if session:
            config.set_session_factory(SignedCookieSessionFactory('s' * 20))
        config.set_security_policy(policy)
        config.set_default_permission('view')
        config.set_default_csrf_options(require_csrf=True)
        config.include('pyramid_dbtune')
        access.add_view(config, 'secret', secret_view, renderer='json')
        access.add_view(config, 'change', secret_view, renderer='json',
                        request_method='POST')  # fmt: skip
        access.add_route(config)
        return TestApp(config.make_wsgi_app())


def test_the_apps_default_permission_and_csrf_do_not_apply():
    app = make_strict(Nobody(), **{'stats.token': TOKEN})
    auth = {access.HEADER: TOKEN}
    assert app.get('/_dbtune/secret', headers=auth).json == {'figures': 42}
    app.get('/_dbtune/secret', status=404)  # not 403: not advertised
    assert app.head('/_dbtune/secret', headers=auth).status_int == 200
    app.head('/_dbtune/secret', status=404)
    # A POST with the token in the header: the operator's page sent it.
    assert app.post('/_dbtune/change', headers=auth).json
    app.post('/_dbtune/change', status=404)
    # A token in the query is not enough to change anything (a link or a
    # form of another site could carry it).
    app.post('/_dbtune/change?token=' + TOKEN, status=404)
    assert app.get('/_dbtune/secret', params={'token': TOKEN}).json


def test_a_post_let_in_by_the_permission_needs_the_csrf_token():
    app = make_strict(Policy(), **{'stats.permission': 'view-stats'})
    ops = {'X-User': 'ops'}
    assert app.get('/_dbtune/secret', headers=ops).json
    app.post('/_dbtune/change', headers=ops, status=400)  # no CSRF token
    app.post('/_dbtune/change', headers={'X-User': 'guest'}, status=404)
    # The dashboard page carries the CSRF token its POSTs send.
    with Configurator(registry=app.app.registry) as config:
        config.add_route('token', '/token')
        config.add_view(
            lambda request: {'csrf': get_csrf_token(request)},
            route_name='token', renderer='json',
            permission=NO_PERMISSION_REQUIRED,
        )  # fmt: skip
    csrf = app.get('/token').json['csrf']
    assert app.post(
        '/_dbtune/change', headers={**ops, 'X-CSRF-Token': csrf}
    ).json == {'figures': 42}
    # Without sessions there is no CSRF token: the header token is needed.
    app = make_strict(Policy(), session=False,
                      **{'stats.permission': 'view-stats'})  # fmt: skip
    response = app.post('/_dbtune/change', headers=ops, status=400)
    assert 'no session' in response.text


def test_an_undecodable_token_is_no_token():
    app = make(**{'stats.token': TOKEN})
    app.get('/_dbtune/secret?token=%ff', status=404)
    app.get('/_dbtune/secret?token=%ff', headers={access.HEADER: TOKEN})


def test_answers_are_not_kept_nor_referred():
    app = make(**{'stats.token': TOKEN})
    response = app.get('/_dbtune/secret', headers={access.HEADER: TOKEN})
    assert response.headers['Cache-Control'] == 'no-store'
    assert response.headers['Referrer-Policy'] == 'no-referrer'


def test_a_refused_view_is_a_path_that_is_not_there():
    # Without the token, a view that is on answers as one that is off: a
    # scanner cannot tell which are.
    app = make(**{'stats.token': TOKEN})
    refused = app.get('/_dbtune/secret', status=404)
    absent = app.get('/_dbtune/sekret', status=404)
    assert sorted(refused.headers.items()) == sorted(absent.headers.items())
    assert refused.text == absent.text.replace('sekret', 'secret')
    # Nor by asking with another method than the view's, with the token
    # or without: the profiler's reset and the probes are on here, and
    # answer as they do where they are off.
    on = make(**{'stats.token': TOKEN, 'profile': 'true', 'probes': 'true'})
    off = make(**{'stats.token': TOKEN})
    for method, path in (('get', 'profile/reset'), ('post', 'probe/io')):
        for headers in ({}, {access.HEADER: TOKEN}):
            answers = [
                getattr(app, method)(f'/_dbtune/{path}', headers=headers,
                                     status=404)
                for app in (on, off)
            ]  # fmt: skip
            assert answers[0].text == answers[1].text, (method, path)
    auth = {access.HEADER: TOKEN}
    assert on.head('/_dbtune/probe/io', headers=auth).status_int == 200


def test_every_view_shares_one_route():
    # Each route costs every request of the app a match: the operator's
    # views, however many are on, add one.
    on = {'stats': 'true', 'profile': 'true', 'probes': 'true'}
    app = make(**{'stats.token': TOKEN, **on})
    routes = app.app.routes_mapper.get_routes()
    assert [r.name for r in routes] == [access.ROUTE]
    auth = {access.HEADER: TOKEN}
    for path in ('', 'stats', 'profile', 'probe/io', 'secret'):
        app.get(f'/_dbtune/{path}', headers=auth, status=200)
    app.get('/_dbtune/nothing-here', headers=auth, status=404)
    app.get('/_dbtune/stats/', headers=auth, status=404)


def test_the_route_matches_the_views_paths_and_no_other():
    on = {
        'dbtune.stats.token': TOKEN,
        'dbtune.stats': 'true',
        'dbtune.profile': 'true',
        'dbtune.probes': 'true',
    }
    paths = ['', 'stats', 'metrics', 'profile', 'profile.prof',
             'profile.folded', 'profile/reset', 'probe/io',
             'probe/cpu']  # fmt: skip
    # An app that adds a slash to a path it does not know: without the
    # token, a view's path is a 404, not a redirect to the path with a
    # slash (that would tell the view is there).
    with Configurator(settings=on) as config:
        config.include('pyramid_dbtune')
        config.add_notfound_view(
            lambda request: HTTPNotFound(), append_slash=True
        )
        slashing = TestApp(config.make_wsgi_app())
    assert sorted(slashing.app.registry.dbtune.views) == sorted(paths)
    for path in paths:
        slashing.get(f'/_dbtune/{path}', status=404)
        allowed = 404 if path == 'profile/reset' else 200  # a POST
        slashing.get(f'/_dbtune/{path}', headers={access.HEADER: TOKEN},
                     status=allowed)  # fmt: skip
    # Any other path under /_dbtune/ is still the app's.
    with Configurator(settings=on) as config:
        config.include('pyramid_dbtune')
        config.add_route('page', '/{path:.*}')
        config.add_view(lambda request: Response('page'), route_name='page')
        pages = TestApp(config.make_wsgi_app())
    for path in ('nothing-here', 'stats/', 'probe/sql', 'profile.prof.x'):
        assert pages.get(f'/_dbtune/{path}').text == 'page'
    # Its catch-all route, added after the include, comes after the
    # package's (docs/settings.rst says why the settings are read then).
    stats = pages.get('/_dbtune/stats', headers={access.HEADER: TOKEN})
    assert 'routes' in stats.json
