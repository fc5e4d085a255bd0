"""The fast path: the WSGI wrapper, the paste filter, the include-only
form under pyramid_tm and pyramid_retry, and the deep health check."""

import functools
import sys
import threading
import uuid

import pytest
import sqlalchemy as sa
from paste.deploy import loadapp
from pyramid.config import Configurator
from pyramid.events import NewRequest
from pyramid.exceptions import ConfigurationError
from pyramid.response import Response
from pyramid_retry import RetryableException
from webtest import TestApp

from pyramid_dbtune.fastpath import (
    FastPathError,
    deep_check,
    filter_app_factory,
    parse_paths,
    wrap,
)

from conftest import echo_app, in_a_child, query_log

PATHS = '/ok.html=OK /healthz=healthy'


@pytest.fixture
def app():
    return TestApp(wrap(echo_app, PATHS))


def test_static_answer(app):
    response = app.get('/ok.html')
    assert response.status == '200 OK'
    assert response.body == b'OK'
    assert response.headers['Content-Type'] == 'text/plain; charset=utf-8'
    assert response.headers['Content-Length'] == '2'
    assert response.headers['Cache-Control'] == 'no-store'
    assert app.get('/healthz').body == b'healthy'
    # The query string does not matter: the path does.
    assert app.get('/ok.html?from=balancer').body == b'OK'


def test_head_answers_headers_without_a_body(app):
    response = app.head('/ok.html')
    assert response.status == '200 OK' and response.body == b''
    assert response.headers['Content-Length'] == '2'


@pytest.mark.parametrize(
    'method, path',
    [
        ('GET', '/'),
        ('GET', '/ok.htm'),
        ('GET', '/ok.html/'),
        ('GET', '/OK.html'),
        ('GET', '/ok.html.bak'),
        ('POST', '/ok.html'),
        ('PUT', '/healthz'),
        ('DELETE', '/ok.html'),
        ('OPTIONS', '/ok.html'),
        ('POST', '/other'),
    ],
)
def test_everything_else_passes_through_unchanged(app, method, path):
    direct = TestApp(echo_app)
    kw = {'body': b'a=1&b=2', 'status': '*'} if method != 'GET' else {}
    if method == 'GET':
        path += '?q=1'
    through = app.request(path, method=method, **kw)
    expected = direct.request(path, method=method, **kw)
    assert through.status == expected.status == '299 Echo'
    assert through.headerlist == expected.headerlist
    assert through.body == expected.body


def test_options_of_the_wrapper():
    app = TestApp(
        wrap(
            echo_app,
            {'/a': 'x', '/b': b'y'},
            content_type='text/html',
            cache_control='',
        )
    )
    response = app.get('/a')
    assert response.headers['Content-Type'] == 'text/html'
    assert 'Cache-Control' not in response.headers
    assert app.get('/b').body == b'y'


INI = """
[pipeline:main]
pipeline = fastpath echo

[filter:fastpath]
use = egg:pyramid_dbtune#fastpath
paths = /ok.html=OK /healthz=OK
content_type = text/plain
cache_control = max-age=5

[app:echo]
use = call:conftest:echo_app_factory
"""


def test_paste_filter_from_an_ini_file(tmp_path):
    ini = tmp_path / 'app.ini'
    ini.write_text(INI)
    app = TestApp(loadapp(f'config:{ini}'))
    response = app.get('/ok.html')
    assert response.body == b'OK'
    assert response.headers['Content-Type'] == 'text/plain'
    assert response.headers['Cache-Control'] == 'max-age=5'
    assert app.get('/other').status == '299 Echo'


def test_paste_filter_outside_zope(monkeypatch):
    # Not a Zope site: a callable gets the registry found, or none.
    monkeypatch.delitem(sys.modules, 'pyramid_dbtune.zope', raising=False)
    paths = f'/made=python:test_fastpath:answer {DEEP}'
    app = TestApp(filter_app_factory(echo_app, {}, paths=paths))
    assert app.get('/made').status == '201 Created'
    assert app.get('/healthz', status=500).body == b'no pyramid_dbtune app\n'


def test_paste_filter_needs_paths():
    with pytest.raises(FastPathError, match='needs paths'):
        filter_app_factory(echo_app, {}, paths=' ')


@pytest.mark.parametrize(
    'paths, message',
    [
        ('/ok', 'is not /path=answer'),
        ('ok=OK', 'must start with "/"'),
        ('/a=1 /a=2', 'given twice'),
        ({'/a': 1}, 'must be text, bytes or a callable'),
        ('/a=python:no.such.module:f', "cannot import 'no.such.module:f'"),
        ({5: 'x'}, 'must start with'),
    ],
)
def test_bad_tables(paths, message):
    with pytest.raises(FastPathError, match=message):
        parse_paths(paths)


def test_bad_setting_stops_start_up():
    config = Configurator(settings={'dbtune.fast_paths': '/ok'})
    with pytest.raises(ConfigurationError) as info:
        config.include('pyramid_dbtune')
    assert "dbtune.fast_paths = '/ok' is not valid" in str(info.value)
    assert 'is not /path=answer' in str(info.value)


class Flaky:
    """A view that fails with a retryable error on its first attempt."""

    def __init__(self):
        self.attempts = 0
        self.transactions = []

    def __call__(self, request):
        self.attempts += 1
        # pyramid_tm began a transaction for this attempt.
        self.transactions.append(request.tm.get())
        if self.attempts == 1:
            raise RetryableException()
        return Response(f'attempt {self.attempts}')


def include_only_app(paths, **settings):
    requests = []
    flaky = Flaky()
    config = Configurator(settings={'dbtune.fast_paths': paths, **settings})
    config.include('pyramid_retry')
    config.include('pyramid_dbtune')
    config.add_subscriber(lambda e: requests.append(e.request), NewRequest)
    config.add_route('flaky', '/flaky')
    config.add_view(flaky, route_name='flaky')
    config.add_route('healthz', '/healthz')
    config.add_view(lambda r: Response('slow'), route_name='healthz')
    return TestApp(config.make_wsgi_app()), requests, flaky


def test_include_only_answers_before_a_request_is_built():
    app, requests, _ = include_only_app(PATHS)
    assert app.get('/healthz').body == b'healthy'
    assert app.head('/ok.html').body == b''
    assert requests == []
    # Other methods reach the view.
    assert app.post('/healthz').body == b'slow'
    assert len(requests) == 1


def test_include_only_keeps_pyramid_retry_and_pyramid_tm_working():
    app, requests, flaky = include_only_app(PATHS, **{'retry.attempts': 2})
    assert app.get('/flaky').body == b'attempt 2'
    assert flaky.attempts == 2 and len(requests) == 2
    first, second = flaky.transactions
    # The failed attempt's transaction was aborted (it never committed),
    # the retry's committed: pyramid_tm ran inside pyramid_retry.
    assert first is not second
    assert (first.status, second.status) == ('Active', 'Committed')
    assert app.get('/ok.html').body == b'OK' and len(requests) == 2


def test_include_without_fast_paths_installs_nothing():
    from pyramid.router import default_execution_policy

    config = Configurator()
    config.include('pyramid_dbtune')
    app = config.make_wsgi_app()
    assert app.execution_policy is default_execution_policy


def answer(environ):
    return '201 Created', [('X-Made', environ['PATH_INFO'])], 'made'


def sized(environ):
    return (
        '200 OK',
        [('content-type', 'text/x'), ('content-length', '3')],
        b'abc',
    )


def broken(environ):
    raise RuntimeError('oops')


def test_callable_answers(caplog):
    app = TestApp(
        wrap(
            echo_app,
            {
                '/made': answer,
                '/broken': broken,
                '/named': 'python:test_fastpath:answer',
                '/sized': sized,
            },
        )
    )
    response = app.get('/made')
    assert response.status == '201 Created' and response.body == b'made'
    assert response.headers['Content-Length'] == '4'
    assert app.get('/named').headers['X-Made'] == '/named'
    assert app.head('/made').body == b''
    assert app.get('/sized').headerlist == [
        ('content-type', 'text/x'),
        ('content-length', '3'),
    ]
    assert app.get('/broken', status=500).body == b'fast path failed\n'
    assert 'fast path /broken failed' in caplog.text


def deep_app(url, paths, **settings):
    config = Configurator(
        settings={'dbtune.url': url, 'dbtune.fast_paths': paths, **settings}
    )
    config.include('pyramid_dbtune')
    return TestApp(config.make_wsgi_app())


DEEP = '/healthz=python:pyramid_dbtune.fastpath:deep_check'


def test_deep_check_pings_the_database_and_reuses_its_answer(sqlite_url):
    app = deep_app(sqlite_url, DEEP)
    log = query_log(app)
    response = app.get('/healthz')
    assert response.status == '200 OK' and response.body == b'OK\n'
    for _ in range(20):
        app.get('/healthz')
    assert log.count('SELECT 1') == 1
    app.app.registry.dbtune.router.dispose()


def test_deep_check_reports_a_refusing_database_as_503():
    # Nothing listens on port 1 of the loopback: connections are refused.
    app = deep_app('postgresql+psycopg://nobody@127.0.0.1:1/none', DEEP)
    response = app.get('/healthz', status=503)
    assert response.body == b'database unavailable: OperationalError\n'


def test_deep_check_answers_503_while_the_database_hangs(silent_server):
    url = f'postgresql+psycopg://nobody@127.0.0.1:{silent_server}/none'
    quick = functools.partial(deep_check, timeout=0.2, reuse=0)
    app = TestApp(wrap(echo_app, {'/healthz': quick}))
    config = Configurator(settings={'dbtune.url': url})
    config.include('pyramid_dbtune')
    config.commit()
    app = TestApp(wrap(config.make_wsgi_app(), {'/healthz': quick}))
    first = app.get('/healthz', status=503)
    assert first.body == b'database did not answer within 0.2 s\n'
    # The hung ping is still running: a second check waits for it rather
    # than starting another.
    threads = [t for t in threading.enumerate() if 'deep check' in t.name]
    app.get('/healthz', status=503)
    assert threads == [
        t for t in threading.enumerate() if 'deep check' in t.name
    ]
    assert len(threads) == 1


def test_deep_check_needs_a_pyramid_dbtune_app():
    app = TestApp(wrap(echo_app, {'/healthz': deep_check}))
    assert app.get('/healthz', status=500).body == b'no pyramid_dbtune app\n'


def test_deep_check_without_a_database():
    config = Configurator()
    config.include('pyramid_dbtune')
    app = TestApp(wrap(config.make_wsgi_app(), {'/healthz': deep_check}))
    assert app.get('/healthz').body == b'OK\n'


def test_non_ascii_paths_match_as_servers_decode_them():
    app = TestApp(wrap(echo_app, {'/santé': 'bien'}))
    assert app.get('/sant%C3%A9').body == b'bien'
    assert app.get('/sant%C3%A9/').status == '299 Echo'
    # The setting, read once as settings are, then installed.
    app, requests, _ = include_only_app('/santé=bien')
    assert app.get('/sant%C3%A9').body == b'bien'
    assert requests == []


class Logging:
    """Middleware that keeps what it wraps as ``app``."""

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        return self.app(environ, start_response)


def test_callables_find_the_registry_through_middleware(sqlite_url):
    config = Configurator(settings={'dbtune.url': sqlite_url})
    config.include('pyramid_dbtune')
    pyramid_app = config.make_wsgi_app()
    app = TestApp(wrap(Logging(Logging(pyramid_app)), {'/h': deep_check}))
    assert app.get('/h').body == b'OK\n'
    lost = TestApp(wrap(lambda e, s: pyramid_app(e, s), {'/h': deep_check}))
    assert lost.get('/h', status=500).body == b'no pyramid_dbtune app\n'
    given = wrap(
        lambda e, s: None, {'/h': deep_check}, registry=config.registry
    )
    assert TestApp(given).get('/h').body == b'OK\n'
    pyramid_app.registry.dbtune.router.dispose()


def test_policies_set_later_still_get_the_fast_path():
    seen = []

    def policy(environ, router):
        seen.append(environ['PATH_INFO'])
        return Response('policy')

    config = Configurator(
        autocommit=True, settings={'dbtune.fast_paths': '/ok=OK'}
    )
    config.include('pyramid_dbtune')
    config.include('pyramid_retry')  # after, and committed at once
    config.set_execution_policy(policy)
    app = TestApp(config.make_wsgi_app())
    assert app.get('/ok').body == b'OK'
    assert app.get('/other').body == b'policy' and seen == ['/other']


@pytest.mark.parametrize(
    'answer',
    [
        ('200 OK', [], None),
        (200, [], b'x'),
        ('200 OK', [('X-Number', 5)], b'x'),
        ('200 OK', ['X-Bad'], b'x'),
    ],
)
def test_a_callable_answering_badly_gets_a_500(answer, caplog):
    app = TestApp(wrap(echo_app, {'/bad': lambda environ: answer}))
    assert app.get('/bad', status=500).body == b'fast path failed\n'
    assert 'must return (status str' in caplog.text


def test_paste_filter_names_unknown_options():
    with pytest.raises(FastPathError) as info:
        filter_app_factory(echo_app, {}, path='/ok=OK')
    assert 'has no option path; its options are paths' in str(info.value)


def test_deep_check_survives_a_thread_that_cannot_start(
    sqlite_url, monkeypatch
):
    config = Configurator(settings={'dbtune.url': sqlite_url})
    config.include('pyramid_dbtune')
    app = TestApp(wrap(config.make_wsgi_app(), {'/h': deep_check}))
    start = threading.Thread.start

    def refuse(thread):
        monkeypatch.setattr(threading.Thread, 'start', start)
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, 'start', refuse)
    app.get('/h', status=500)
    assert app.get('/h').body == b'OK\n'
    app.app.wrapped.registry.dbtune.router.dispose()


@pytest.mark.filterwarnings(
    # The SystemExit ends the ping's thread, as it should.
    'ignore::pytest.PytestUnhandledThreadExceptionWarning'
)
def test_deep_check_survives_a_ping_ended_by_a_base_exception(sqlite_url):
    before = set(threading.enumerate())
    config = Configurator(settings={'dbtune.url': sqlite_url})
    config.include('pyramid_dbtune')
    pyramid_app = config.make_wsgi_app()
    writer = pyramid_app.registry.dbtune.router.writer
    quick = functools.partial(deep_check, timeout=5, reuse=0)
    app = TestApp(wrap(pyramid_app, {'/h': quick}))

    def interrupt(*args):
        raise SystemExit('a greenlet killed, say')

    sa.event.listen(writer, 'do_connect', interrupt)
    answer = app.get('/h', status=503)
    assert answer.body == b'database check was interrupted\n'
    for thread in set(threading.enumerate()) - before:
        thread.join(10)
    sa.event.remove(writer, 'do_connect', interrupt)
    assert app.get('/h').body == b'OK\n'
    writer.dispose()


def test_a_hung_ping_is_given_up_for_a_new_one(silent_server, monkeypatch):
    from pyramid_dbtune.fastpath import health as health_module

    monkeypatch.setattr(health_module, 'ABANDON_AFTER', 0)
    url = f'postgresql+psycopg://nobody@127.0.0.1:{silent_server}/none'
    config = Configurator(settings={'dbtune.url': url})
    config.include('pyramid_dbtune')
    quick = functools.partial(deep_check, timeout=0.05, reuse=0)
    pyramid_app = config.make_wsgi_app()
    app = TestApp(wrap(pyramid_app, {'/h': quick}))
    for _ in range(6):
        app.get('/h', status=503)
    # The first ping, then three more each given up on in turn, no more.
    health = health_module._health_of(pyramid_app.registry.dbtune)
    assert health.stranded == 3 and health.running is not None
    # In a child forked now, the pings in flight and the locks are the
    # parent's: the deep check starts afresh.
    # Other threads of the parent may hold its locks as it forks.
    with health.lock, health_module._healths_lock:
        assert in_a_child(
            lambda: (
                health.stranded == 0
                and health.running is None
                and not health.lock.locked()
                and not health_module._healths_lock.locked()
            )
        )
    assert health.stranded == 3


@pytest.mark.parametrize(
    'paths, message',
    [
        (['/ok=OK'], 'a string of /path=answer items or a mapping, not list'),
        (5, 'a string of /path=answer items or a mapping, not int'),
        ('/a=python:', 'python: needs a dotted name'),
        ('/a%20b=OK', 'write the path decoded'),
        ('/a?b=OK', 'write the path decoded'),
        ('/a=python:test_fastpath:nothing_here', 'has no attribute'),
    ],
)
def test_bad_tables_say_what_is_wrong(paths, message):
    with pytest.raises(FastPathError, match=message):
        parse_paths(paths)


@pytest.mark.parametrize(
    'name', ['os.sep', 'pyramid_dbtune.fastpath:DEFAULT_CONTENT_TYPE']
)
def test_python_must_name_a_callable(name):
    # A string it names would otherwise be served as the body.
    with pytest.raises(FastPathError) as info:
        parse_paths(f'/x=python:{name}')
    assert str(info.value) == (
        f'fast path /x: python: must name a callable, and {name} is a str'
    )


def test_deep_check_reconnects_after_its_connection_was_dropped(
    postgresql_url,
):
    # Its own name, so that only the check's connections are dropped.
    name = f'deep_check_{uuid.uuid4().hex[:8]}'
    url = sa.engine.make_url(postgresql_url).update_query_dict(
        {'application_name': name}
    )
    config = Configurator(
        settings={'dbtune.url': url.render_as_string(hide_password=False)}
    )
    config.include('pyramid_dbtune')
    pyramid_app = config.make_wsgi_app()
    check = functools.partial(deep_check, reuse=0)
    app = TestApp(wrap(pyramid_app, {'/h': check}))
    assert app.get('/h').body == b'OK\n'
    # As a database restart, or a proxy closing idle connections, would.
    admin = sa.create_engine(postgresql_url, poolclass=sa.pool.NullPool)
    with admin.begin() as connection:
        dropped = connection.execute(
            sa.text(
                'SELECT count(pg_terminate_backend(pid)) '
                'FROM pg_stat_activity WHERE application_name = :name'
            ),
            {'name': name},
        ).scalar()
    admin.dispose()
    assert dropped >= 1
    assert app.get('/h').body == b'OK\n'
    pyramid_app.registry.dbtune.router.dispose()
