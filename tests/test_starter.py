"""An application laid out as Pyramid's cookiecutter starter (its
SQLAlchemy backend, ``tests/starter_app``), with pyramid_dbtune included by
ini lines only: its own ``request.dbsession`` is adopted and routed."""

from pathlib import Path

import pytest
import sqlalchemy as sa
import transaction
import zope.sqlalchemy
from pyramid.config import Configurator
from pyramid.exceptions import ConfigurationExecutionError
from pyramid.paster import get_app
from pyramid.request import Request
from webtest import TestApp

from conftest import GET, Property, create_tables, query_log

STARTER = Path(__file__).parent / 'starter_app'

INI = """\
[app:main]
use = call:starter:main
sqlalchemy.url = {url}
pyramid.includes = pyramid_dbtune
"""


@pytest.fixture
def starter(postgresql_url, tmp_path, monkeypatch):
    """Make the starter app from an ini file, as ``pserve`` would, with
    its table made and one row in it."""
    monkeypatch.syspath_prepend(str(STARTER))
    from starter.models import MyModel
    from starter.models.meta import Base

    engine = sa.create_engine(postgresql_url)
    Base.metadata.create_all(engine)
    with engine.begin() as connection:
        connection.execute(sa.insert(MyModel).values(name='one', value=1))
    engine.dispose()

    def make(*lines):
        ini = tmp_path / 'development.ini'
        url = postgresql_url.replace('%', '%%')  # ini files interpolate %
        ini.write_text(INI.format(url=url) + ''.join(f'{x}\n' for x in lines))
        app = TestApp(get_app(str(ini)))
        return app, query_log(app)

    return make


def test_reads_before_a_write_run_on_a_reader(starter):
    app, log = starter()
    assert app.get('/').json == {'name': 'one', 'value': 1}
    assert log.count('FROM models', 'reader0') == 1
    assert log.count('FROM models', 'writer') == 0


def test_an_orm_write_invalidates_a_cached_sql_method(starter):
    app, log = starter()
    assert app.get('/price').json == {'value': 1}
    assert app.get('/price').json == {'value': 1}
    assert log.count('SELECT value FROM models') == 1  # cached

    assert app.get('/rename', {'value': 5}).json == {'value': 5}
    # The ORM read before the write ran on a reader, the UPDATE on the
    # writer, and the commit dropped the method's cached rows.
    assert log.count('FROM models', 'reader0') == 2
    assert log.count('UPDATE models', 'writer') == 1
    assert app.get('/price').json == {'value': 5}
    assert log.count('SELECT value FROM models') == 2


def test_an_aborted_orm_write_invalidates_nothing(starter):
    app, log = starter()
    assert app.get('/price').json == {'value': 1}
    assert app.get('/rename', {'value': 7, 'abort': 1}).json == {'value': 7}
    assert log.count('UPDATE models', 'writer') == 1
    assert app.get('/price').json == {'value': 1}
    assert log.count('SELECT value FROM models') == 1
    assert app.get('/').json['value'] == 1


def test_sql_methods_write_in_the_apps_session(starter):
    app, log = starter()
    assert app.get('/price').json == {'value': 1}
    # The ORM read after the method's write sees it: one transaction, on
    # the writer.
    assert app.get('/bump', {'value': 9}).json == {'value': 9}
    assert log.count('UPDATE models', 'writer') == 1
    assert log.count('FROM models', 'writer') == 1
    assert app.get('/price').json == {'value': 9}


def test_dbsession_false_leaves_the_apps_session_alone(starter):
    app, log = starter('dbtune.dbsession = false')
    assert app.get('/price').json == {'value': 1}
    assert app.get('/rename', {'value': 5}).json == {'value': 5}
    # The app's session ran on its own engine, unrouted, and invalidated
    # nothing: the method's rows are those it cached.
    assert log.count('FROM models') == 1
    assert app.get('/price').json == {'value': 1}


def _app_with_dbsession(url, add):
    config = Configurator(settings={'dbtune.url': url})
    config.include('pyramid_dbtune')
    add(config)
    config.add_route('home', '/')
    config.add_view(
        lambda request: {'bind': str(request.dbsession.bind.url)},
        route_name='home',
        renderer='json',
    )
    return config


def test_a_dbsession_method_is_a_start_up_error(sqlite_url):
    config = _app_with_dbsession(
        sqlite_url,
        lambda config: config.add_request_method(
            lambda request: None, 'dbsession'
        ),
    )
    with pytest.raises(ConfigurationExecutionError) as caught:
        config.commit()
    assert 'request.dbsession as a method' in str(caught.value)
    assert 'dbtune.dbsession = false' in str(caught.value)


def test_a_session_of_another_database_is_not_adopted(sqlite_url, tmp_path):
    other = sa.create_engine(f'sqlite:///{tmp_path / "other.sqlite"}')

    def add(config):
        config.add_request_method(
            lambda request: sa.orm.Session(bind=other), 'dbsession', reify=True
        )

    config = _app_with_dbsession(sqlite_url, add)
    config.add_sql_method('make', 'CREATE TABLE made (id INTEGER)')
    config.add_route('write', '/write')
    config.add_view(lambda request: request.sql.make(), route_name='write')
    app = TestApp(config.make_wsgi_app())
    with pytest.raises(RuntimeError, match='dbtune.dbsession = false'):
        app.get('/')
    # A SQL method's write needs the session: the same error, and the
    # write slot it took is free again.
    for _ in range(2):
        with pytest.raises(RuntimeError, match='dbtune.dbsession = false'):
            app.get('/write')
    assert app.app.registry.dbtune.router.write_slots.acquire(timeout=0)
    other.dispose()


def test_without_a_database_the_apps_session_is_left_alone(tmp_path):
    # pyramid_dbtune included for what needs no database (a fast path,
    # Server-Timing): the app's request.dbsession is its own, unrouted.
    engine = sa.create_engine(f'sqlite:///{tmp_path / "own.sqlite"}')
    config = Configurator(settings={'dbtune.server_timing': 'true'})
    config.include('pyramid_dbtune')
    config.add_request_method(
        lambda request: sa.orm.Session(bind=engine), 'dbsession', reify=True
    )
    config.add_route('home', '/')
    config.add_view(
        lambda request: request.dbsession.scalar(sa.text('SELECT 7')),
        route_name='home',
        renderer='json',
    )
    app = TestApp(config.make_wsgi_app())
    assert app.get('/').json == 7
    assert not app.app.registry.dbtune.adopts
    engine.dispose()


def test_a_session_added_after_a_commit_is_adopted(sqlite_url):
    # The app commits between the include and its request.dbsession: the
    # session is adopted as the app is made. It replaced the package's,
    # unrouted, and its writes left cached rows stale.
    create_tables(sqlite_url)
    engine = sa.create_engine(sqlite_url)
    config = Configurator(settings={'dbtune.url': sqlite_url})
    config.include('pyramid_dbtune')
    config.commit()

    def dbsession(request):
        session = sa.orm.Session(bind=engine)
        zope.sqlalchemy.register(session, transaction_manager=request.tm)
        return session

    config.add_request_method(dbsession, 'dbsession', reify=True)
    config.add_sql_method(**GET)

    def view(request):
        if 'rent' in request.params:
            request.dbsession.get(Property, 1).rent = int(
                request.params['rent']
            )
        return request.sql.get(id=1)[0].rent

    config.add_route('home', '/')
    config.add_view(view, route_name='home', renderer='json')
    app = TestApp(config.make_wsgi_app())
    assert app.get('/').json == 90  # cached
    assert app.get('/', {'rent': '95'}).json == 95
    assert app.get('/').json == 95
    assert app.app.registry.dbtune.adopts
    app.app.registry.dbtune.close()
    engine.dispose()


def test_without_a_database_a_dbsession_method_is_the_apps():
    config = Configurator(settings={'dbtune.server_timing': 'true'})
    config.include('pyramid_dbtune')
    config.add_request_method(lambda request: 'own', 'dbsession')
    config.add_route('home', '/')
    config.add_view(
        lambda request: request.dbsession(), route_name='home', renderer='json'
    )
    assert TestApp(config.make_wsgi_app()).get('/').json == 'own'


def test_a_thread_local_session_is_its_own_again_after_its_request(
    postgresql_url,
):
    # An app's request.dbsession from a scoped_session: one session for
    # every request of a thread, adopted for each (and again by a
    # subrequest in its transaction). Once a request has ended, it is the
    # app's again: used outside any request (a script, a job), it writes
    # through its own engine, unrouted.
    engine = sa.create_engine(postgresql_url)
    with engine.begin() as connection:
        connection.exec_driver_sql('CREATE TABLE note (id INTEGER)')
    note = sa.table('note', sa.column('id'))
    scoped = sa.orm.scoped_session(sa.orm.sessionmaker(bind=engine))
    zope.sqlalchemy.register(scoped)

    def read(request):
        routed = request.dbsession.bind is not engine
        return [routed, *request.dbsession.scalars(sa.select(note.c.id))]

    def parent(request):
        child = request.invoke_subrequest(
            Request.blank('/child'), use_tweens=False
        )
        return [*read(request), child.json]

    config = _app_with_dbsession(
        postgresql_url,
        lambda config: config.add_request_method(
            lambda request: scoped(), 'dbsession', True
        ),
    )
    for name, view in (('parent', parent), ('child', read)):
        config.add_route(name, f'/{name}')
        config.add_view(view, route_name=name, renderer='json')
    app = TestApp(config.make_wsgi_app())
    assert app.get('/parent').json == [True, [True]]
    with transaction.manager:
        scoped.execute(sa.insert(note).values(id=1))
        zope.sqlalchemy.mark_changed(scoped())
    assert scoped.bind is engine
    with engine.connect() as connection:
        assert connection.execute(sa.select(note.c.id)).all() == [(1,)]
    assert app.get('/parent').json == [True, 1, [True, 1]]
    scoped.remove()
    app.app.registry.dbtune.router.dispose()
    engine.dispose()


@pytest.mark.parametrize('parent_first', [True, False])
def test_a_subrequest_is_given_its_parents_session(server_url, parent_first):
    # Pyramid's starter makes a session for each request. A subrequest in
    # its parent's transaction is given the parent's, as a scoped session
    # would give it, or the parent the subrequest's, whichever made one
    # first: each sees the other's changes, and the one session that
    # writes is routed to the writer.
    create_tables(server_url)
    engine = sa.create_engine(server_url)
    factory = sa.orm.sessionmaker(bind=engine)

    def dbsession(request):
        session = factory()
        zope.sqlalchemy.register(session, transaction_manager=request.tm)
        return session

    def child(request):
        request.dbsession.get(Property, 2).rent = 222
        request.dbsession.flush()
        return 'ok'

    def parent(request):
        if not parent_first:
            request.invoke_subrequest(
                Request.blank('/child'), use_tweens=False
            )
        session = request.dbsession
        session.get(Property, 1).rent = 5  # pending
        if parent_first:
            request.invoke_subrequest(
                Request.blank('/child'), use_tweens=False
            )
        session.get(Property, 2).rent += 1  # the same row: no lock wait
        return {
            'own': request.sql.get(id=1)[0].rent,  # flushed before it
            'child': session.scalar(
                sa.select(Property.rent).where(Property.id == 2)
            ),
        }

    config = Configurator(
        settings={'dbtune.url': server_url, 'dbtune.statement_timeout': '5'}
    )
    config.include('pyramid_tm')
    config.add_request_method(dbsession, 'dbsession', reify=True)
    config.include('pyramid_dbtune')
    config.add_sql_method(**GET)
    for name, view in (('parent', parent), ('child', child)):
        config.add_route(name, f'/{name}')
        config.add_view(view, route_name=name, renderer='json')
    app = TestApp(config.make_wsgi_app())
    assert app.get('/parent').json == {'own': 5, 'child': 223}
    with engine.connect() as connection:
        rents = connection.execute(
            sa.text('SELECT id, rent FROM property WHERE id IN (1, 2)')
        )
        assert dict(rents.all()) == {1: 5, 2: 223}  # committed, both
    app.app.registry.dbtune.router.dispose()
    engine.dispose()


def test_the_starters_own_functional_tests_see_their_session(starter):
    """The starter's tests hand the request their own session, rows
    flushed in a transaction they keep open and abort (``tm.active``,
    ``tm.manager``, ``app.dbsession``): the request reads and writes in
    it, and its SQL methods too; nothing it does is committed, or
    aborted before the test ends it."""
    app, log = starter()
    router = app.app.registry.dbtune.router
    tm = transaction.TransactionManager(explicit=True)
    tm.begin()
    tm.doom()
    from starter.models import MyModel, get_tm_session

    dbsession = get_tm_session(app.app.registry['dbsession_factory'], tm)
    one = dbsession.query(MyModel).filter_by(name='one').one()
    one.value = 55
    dbsession.flush()
    try:
        environ = {
            'tm.active': True,
            'tm.manager': tm,
            'app.dbsession': dbsession,
        }
        assert app.get('/', extra_environ=environ).json['value'] == 55
        assert app.get('/price', extra_environ=environ).json == {'value': 55}
        assert app.get(
            '/rename', {'value': 7}, extra_environ=environ
        ).json == {'value': 7}
        assert app.get('/price', extra_environ=environ).json == {'value': 7}
        assert log.count('FROM models', 'reader0') == 0
        assert tm.get().isDoomed()  # not aborted by the request
        # Its write slot is held until the test ends the transaction.
        assert not router.write_slots.acquire(blocking=False)
        dbsession.refresh(one)
        assert one.value == 7
    finally:
        tm.abort()
    assert router.write_slots.acquire(blocking=False)
    router.write_slots.release()
    # Nothing committed, nothing cached.
    assert app.get('/price').json == {'value': 1}
    assert app.get('/').json['value'] == 1


@pytest.mark.parametrize('pinned', [False, True])
def test_a_transaction_given_at_work_commits_when_its_caller_says(
    starter, postgresql_url, pinned
):
    """The caller, not the request, ends a transaction it handed over: its
    commit, after the requests have ended, drops what it changed (and
    pins no client: no request is left to answer with a cookie)."""
    url = postgresql_url.replace('%', '%%')
    pin = [f'dbtune.read_urls = {url}', 'dbtune.pin_after_write = 3']
    app, log = starter(*(pin if pinned else ()))
    router = app.app.registry.dbtune.router
    assert app.get('/price').json == {'value': 1}  # cached
    tm = transaction.TransactionManager(explicit=True)
    tm.begin()
    from starter.models import MyModel, get_tm_session

    dbsession = get_tm_session(app.app.registry['dbsession_factory'], tm)
    dbsession.query(MyModel).filter_by(name='one').one()
    environ = {'tm.active': True, 'tm.manager': tm, 'app.dbsession': dbsession}
    assert app.get('/bump', {'value': 8}, extra_environ=environ).json == {
        'value': 8
    }
    try:
        tm.commit()
    except BaseException:
        tm.abort()  # its locks go, whatever failed
        raise
    assert router.write_slots.acquire(blocking=False)
    router.write_slots.release()
    assert app.get('/price').json == {'value': 8}
    assert app.get('/').json['value'] == 8
