"""The Zope side in process: the ``egg:pyramid_dbtune#zope`` filter's
forms, what it puts in front of Zope's application for the features that
are on, and the database outside a Zope request (a real Zope site is in
test_zope.py)."""

import pytest
import sqlalchemy as sa
import transaction
import webtest
from pyramid.exceptions import ConfigurationError

from pyramid_dbtune import SQLMethod, WriteInReadError
from pyramid_dbtune.fastpath import registry_of
from pyramid_dbtune.registry import DBTune
from pyramid_dbtune.settings import parse
from pyramid_dbtune.zope.connection import Database
from pyramid_dbtune.zope.ops import front
from pyramid_dbtune.zope.quoting import quote, server_dialect
from servers import free_port

from conftest import create_tables, rent_on

TOKEN = 'the-operator-of-this-zope-site'


class Zope:
    """A WSGI application standing for Zope's: it keeps the environ of
    each request it answers; ``/moved`` is a redirect, relative, as
    Zope's ``RESPONSE.redirect`` may give."""

    def __init__(self):
        self.seen = []

    def __call__(self, environ, start_response):
        self.seen.append(environ)
        if environ['PATH_INFO'] == '/moved':
            start_response('302 Found', [('Location', '/folder/')])
            return [b'']
        start_response('200 OK', [('Content-Type', 'text/plain')])
        return [b'published']


def filtered(**settings):
    zope = Zope()
    dbtune = DBTune(parse({f'dbtune.{k}': v for k, v in settings.items()}))
    return zope, front(zope, dbtune)


def test_nothing_on_is_zope_itself():
    zope, app = filtered(**{'cache.default_time': '5'})
    assert app is zope


def test_a_permission_has_no_security_policy_in_zope():
    with pytest.raises(ConfigurationError, match='give dbtune.stats.token'):
        filtered(stats='true', **{'stats.permission': 'operate'})


def test_the_fast_paths_alone_answer_before_zope():
    zope, app = filtered(fast_paths='/healthz=OK')
    app = webtest.TestApp(app)
    assert app.get('/healthz').text == 'OK'
    assert zope.seen == []
    assert app.get('/folder/page').text == 'published'
    # Straight to Zope: no Pyramid router on the way.
    assert 'bfg.routes.route' not in zope.seen[0]


def test_the_probes_alone_keep_zopes_requests_off_pyramid():
    zope, app = filtered(probes='true', **{'stats.token': TOKEN})
    app = webtest.TestApp(app)
    answer = app.get(
        '/_dbtune/probe/io?ms=0', headers={'X-Dbtune-Token': TOKEN}
    )
    assert answer.json['probe'] == 'io'
    app.get('/_dbtune/probe/io?ms=0', status=404)  # no token
    assert zope.seen == []
    assert app.get('/page').text == 'published'
    assert 'bfg.routes.route' not in zope.seen[0]
    # gunicorn's hooks find the package's objects through it.
    assert registry_of(app.app).dbtune.settings.probes


def test_the_fast_paths_callables_and_hooks_find_the_registry():
    _, app = filtered(fast_paths='/healthz=OK')
    assert registry_of(app).dbtune.settings.fast_paths


@pytest.mark.parametrize(
    'settings',
    # A ZSQL Method's id in a setting is no error: it is in the ZODB.
    [{'server_timing': 'true', 'cache_time.getrent': '0'},
     {'stats': 'true', 'stats.token': TOKEN, 'fast_paths': '/healthz=OK',
      'invalidate.getRent': 'false'}],
)  # fmt: skip
def test_timed_zope_requests_pass_pyramid_outside_its_transactions(settings):
    zope, app = filtered(**settings)
    app = webtest.TestApp(app)
    answer = app.get('/folder/page?x=1', headers={'X-Other': 'kept'})
    assert answer.text == 'published'
    (environ,) = zope.seen
    # As it came: path, query, headers; outside pyramid_tm's transaction.
    assert environ['PATH_INFO'] == '/folder/page'
    assert environ['QUERY_STRING'] == 'x=1'
    assert environ['HTTP_X_OTHER'] == 'kept'
    assert 'tm.active' not in environ
    # Its answer as it gave it, a relative Location too.
    assert app.get('/moved', status=302).headers['Location'] == '/folder/'
    # A path that is not UTF-8 is Zope's to answer too.
    assert app.get('/%FF/page').text == 'published'
    if 'server_timing' in settings:
        assert answer.headers['Server-Timing'].startswith('total;dur=')
    else:
        assert app.get('/healthz').text == 'OK'
        stats = app.get('/_dbtune/stats', headers={'X-Dbtune-Token': TOKEN})
        assert stats.json['routes']['zope']['requests'] == 2
        assert stats.json['requests'] == 3  # the last one matched no route


def test_a_script_outside_a_request_has_no_client_to_pin(postgresql_url):
    # As zconsole's scripts run: no Zope request, so no pin cookie to
    # read or set; causal reads on (read_urls on PostgreSQL).
    create_tables(postgresql_url)
    dbtune = DBTune(
        parse(
            {'dbtune.url': postgresql_url, 'dbtune.read_urls': postgresql_url}
        )
    )
    assert dbtune.router.positions
    dbtune.register(SQLMethod('get', GET, cache_time=60))
    dbtune.register(SQLMethod('set', SET))
    database = Database(dbtune)
    try:
        assert database.call(dbtune.methods['get'], {'id': 1})[0].rent == 90
        database.call(dbtune.methods['set'], {'id': 1, 'rent': 91})
        transaction.commit()
        assert database.call(dbtune.methods['get'], {'id': 1})[0].rent == 91
    finally:
        transaction.abort()
        dbtune.close()


#: ``(a setting of the session, what shows it)`` by database.
SETTINGS = {
    'postgresql': (
        "SET statement_timeout = '4s'",
        "SELECT current_setting('statement_timeout')",
    ),
    'mysql': (
        'SET SESSION max_statement_time = 4',
        'SELECT @@max_statement_time',
    ),
}


def test_a_zsql_methods_setting_leaves_with_its_connection(server_url):
    # Zope runs a ZSQL Method's statement on the session's connection:
    # committed there, a setting is not handed to the next transaction.
    setting, show = SETTINGS[server_url.split(':')[0].split('+')[0]]
    create_tables(server_url)
    dbtune = DBTune(parse({'dbtune.url': server_url}))
    database = Database(dbtune)
    writer = dbtune.router.writer

    def on_the_writer():
        with writer.connect() as connection:
            return str(connection.scalar(sa.text(show)))

    try:
        default = on_the_writer()
        database.query(setting)
        database.query('UPDATE property SET rent = rent + 1 WHERE id = 4')
        transaction.commit()
        assert on_the_writer() == default
    finally:
        transaction.abort()
        dbtune.close()


def test_without_causal_reads_a_commit_pins_the_fills_of_its_tables(
    sqlite_url,
):
    # dbtune.pin_after_write: for that long, this process's cache of the
    # tables written is filled from the writer, not a replica behind.
    create_tables(sqlite_url)
    dbtune = DBTune(
        parse(
            {
                'dbtune.url': sqlite_url,
                'dbtune.read_urls': sqlite_url,
                'dbtune.pin_after_write': '30',
            }
        )
    )
    dbtune.register(SQLMethod('get', GET, cache_time=60))
    dbtune.register(SQLMethod('set', SET))
    database = Database(dbtune)
    try:
        database.call(dbtune.methods['set'], {'id': 1, 'rent': 91})
        transaction.commit()
        assert database.call(dbtune.methods['get'], {'id': 1})[0].rent == 91
        assert dbtune.router.writer_reads == 1
    finally:
        transaction.abort()
        dbtune.close()


def test_a_zope_write_drops_the_reads_its_foreign_keys_change(
    postgresql_url,
):
    create_tables(postgresql_url)
    dbtune = DBTune(parse({'dbtune.url': postgresql_url}))
    dbtune.register(SQLMethod('photos', 'SELECT id FROM photo', cache_time=60))
    dbtune.register(SQLMethod('set', SET))
    database = Database(dbtune)
    try:
        database.query(
            'CREATE TABLE photo (id INTEGER, property_id INTEGER '
            'REFERENCES property (id) ON DELETE CASCADE)'
        )
        database.query('INSERT INTO photo VALUES (10, 1)')
        transaction.commit()
        assert database.call(dbtune.methods['photos'], {}).tuples() == ((10,),)
        # A rent, which no key refers to, changes no photo.
        database.call(dbtune.methods['set'], {'id': 1, 'rent': 91})
        database.query("INSERT INTO property VALUES (9, 'Burley', 1)")
        transaction.commit()
        database.call(dbtune.methods['photos'], {})
        assert dbtune.cache.hits == 1
        database.query('DELETE FROM property WHERE id = 1')
        transaction.commit()
        assert database.call(dbtune.methods['photos'], {}).tuples() == ()
    finally:
        transaction.abort()
        database.query('DROP TABLE IF EXISTS photo')
        transaction.commit()
        dbtune.close()


def test_a_zsql_read_is_told_by_its_own_databases_reading(sqlite_url):
    # A backslash escapes a quote in MySQL alone: on SQLite this read's
    # "FROM photo" is in a comment, and a write of photo drops nothing.
    create_tables(sqlite_url)
    dbtune = DBTune(parse({'dbtune.url': sqlite_url}))
    database = Database(dbtune)
    reads = "SELECT rent FROM property WHERE area <> 'a\\' -- ' FROM photo"
    try:
        database.query('CREATE TABLE photo (id INTEGER)')
        transaction.commit()
        assert database.cached_query(reads, 0, 60, 'rents')[1][0] == [90]
        database.query('INSERT INTO photo VALUES (10)')
        transaction.commit()
        assert database.cached_query(reads, 0, 60, 'rents')[1][0] == [90]
        assert (dbtune.cache.hits, dbtune.cache.misses) == (1, 1)
    finally:
        transaction.abort()
        dbtune.close()


GET = 'SELECT rent FROM property WHERE id = :id'
SET = 'UPDATE property SET rent = :rent WHERE id = :id'


#: Strings that end a literal quoted by doubling quotes alone, where a
#: backslash escapes (MySQL, MariaDB), and others that must come back.
ODD_STRINGS = ["\\' OR 1=1 -- ", "\\'", "it's", 'back\\slash', '\\', '50%']


def test_zsqls_strings_are_one_literal_in_every_database(server_url):
    # The quoting of <dtml-sqlvar type="string">: each string comes back
    # as it was given, from the writer (a write's transaction), and from
    # the read pool; none matches a row it does not hold.
    create_tables(server_url)
    dbtune = DBTune(parse({'dbtune.url': server_url}))
    database = Database(dbtune)
    dialect = dbtune.router.writer.dialect
    try:
        for value in ODD_STRINGS:
            literal = quote(value, dialect)
            _, rows = database.query(f'SELECT {literal} AS text')
            assert rows == [[value]]
            _, rows = database.query(
                f'SELECT id FROM property WHERE area = {literal}'
            )
            assert rows == []
        database.query("UPDATE property SET area = 'x' WHERE id = 0")
        _, rows = database.query(f'SELECT {quote(ODD_STRINGS[0], dialect)}')
        assert rows == [[ODD_STRINGS[0]]]
    finally:
        transaction.abort()
        dbtune.close()


#: Strings a visitor may type that, were a backslash read as an escape
#: where the server does not take it so, end the literal early.
ESCAPING = ["\\' INTO x -- ", "\\' OR id IN (DELETE FROM x) -- "]


@pytest.mark.parametrize('backslashes', [True, False])
def test_a_zsql_reads_strings_are_read_as_its_server_reads_them(
    server_url, backslashes
):
    # PostgreSQL with standard_conforming_strings, MySQL and MariaDB with
    # NO_BACKSLASH_ESCAPES take a backslash as itself. A read whose string
    # was read as if it escaped there became a write of tables unknown:
    # it took the writer, and its commit dropped every cached result.
    postgresql = server_url.startswith('postgresql')
    setting = {}  # each server's own default
    if backslashes and postgresql:
        setting = {'options': '-c standard_conforming_strings=off'}
    elif not backslashes and not postgresql:
        setting = {'init_command': "SET sql_mode = 'NO_BACKSLASH_ESCAPES'"}
    url = sa.make_url(server_url)
    if 'options' in setting:
        setting['options'] += ' ' + url.query['options']
    url = url.update_query_dict(setting).render_as_string(False)
    create_tables(url)
    dbtune = DBTune(parse({'dbtune.url': url}))
    database = Database(dbtune)
    rents = 'SELECT rent FROM property WHERE id = 1'
    try:
        dialect = server_dialect(dbtune.router)
        assert quote('\\', dialect) == ("'\\\\'" if backslashes else "'\\'")
        assert database.cached_query(rents, 0, 60, 'rents')[1] == [[90]]
        for value in [*ODD_STRINGS, *ESCAPING]:
            literal = quote(value, dialect)
            found = f'SELECT id FROM property WHERE area = {literal}'
            assert database.cached_query(found, 0, 60, 'find')[1] == []
            transaction.commit()
        assert database.cached_query(rents, 0, 60, 'rents')[1] == [[90]]
        assert (dbtune.cache.hits, dbtune.cache.misses) == (
            1,
            1 + len(ESCAPING) + len(ODD_STRINGS),
        )
    finally:
        transaction.abort()
        dbtune.close()


def test_zope_confs_names_are_lower_cased_and_still_name_methods(sqlite_url):
    # ZConfig gives zope.conf's keys lower-cased: an override names a
    # method of the Zope side whatever its case, and Pyramid's exactly.
    settings = parse(
        {
            'dbtune.url': sqlite_url,
            'dbtune.cache_time.getrent': '7',
            'dbtune.invalidate.getrent': 'false',
        }
    )
    for folded, cache_time in ((True, 7), (False, 0)):
        dbtune = DBTune(settings)
        dbtune.folded = folded
        dbtune.register(SQLMethod('getRent', GET, cache_time=0))
        registered = dbtune.methods['getRent']
        assert registered.cache_time == cache_time
        assert (registered.invalidated_by == frozenset()) is folded
        dbtune.close()


def test_the_zsql_forms_list_the_connection_as_connected():
    # What a ZSQL Method's add and edit forms offer as its connection.
    from OFS.Folder import Folder
    from Products.ZSQLMethods.SQL import SQLConnectionIDs

    from pyramid_dbtune.zope import manage_addDBTuneConnection

    site = Folder('site')
    manage_addDBTuneConnection(site, 'dbtune', 'The database')
    assert SQLConnectionIDs(site) == [
        ('The database (dbtune), which is connected', 'dbtune')
    ]
    assert site.dbtune.title_or_id() == 'The database (connected)'


class FailsAtVote:
    """A resource of Zope's transaction that votes after the package's
    SQL session has committed, and fails there, as a second database
    may."""

    transaction_manager = transaction.manager

    def sortKey(self):
        return '~~after the SQL sessions'

    def tpc_vote(self, txn):
        raise ValueError('this resource cannot commit')

    def abort(self, txn):
        pass

    tpc_begin = commit = tpc_finish = tpc_abort = abort


def test_a_commit_that_fails_after_the_sql_committed_drops_its_reads(
    postgresql_url,
):
    create_tables(postgresql_url)
    dbtune = DBTune(parse({'dbtune.url': postgresql_url}))
    dbtune.register(SQLMethod('get', GET, cache_time=60))
    database = Database(dbtune)
    reads = 'SELECT rent FROM property WHERE id = 1'
    try:
        assert database.cached_query(reads, 0, 60, 'get_rent')[1] == [[90]]
        assert database.call(dbtune.methods['get'], {'id': 1})[0].rent == 90
        database.query('UPDATE property SET rent = 91 WHERE id = 1')
        transaction.get().join(FailsAtVote())
        with pytest.raises(ValueError, match='cannot commit'):
            transaction.commit()
        transaction.abort()
        # The SQL was committed: the reads cached before it are gone.
        assert rent_on(postgresql_url) == 91
        assert database.cached_query(reads, 0, 60, 'get_rent')[1] == [[91]]
        assert database.call(dbtune.methods['get'], {'id': 1})[0].rent == 91
        # The write slot is free.
        database.query('UPDATE property SET rent = 92 WHERE id = 1')
        transaction.commit()
        assert database.call(dbtune.methods['get'], {'id': 1})[0].rent == 92
    finally:
        transaction.abort()
        dbtune.close()


def test_strings_are_quoted_as_a_server_that_answers_takes_them(
    postgresql_url,
):
    # The writer down: quoting asks the reader, where a read runs.
    down = f'postgresql+psycopg://postgres@127.0.0.1:{free_port()}/down'
    settings = {'dbtune.url': down, 'dbtune.causal_reads': 'false'}
    dbtune = DBTune(parse({**settings, 'dbtune.read_urls': postgresql_url}))
    try:
        dialect = server_dialect(dbtune.router)
        assert dialect.server_version_info is not None
        assert dialect is not dbtune.router.writer.dialect
        assert server_dialect(dbtune.router) is dialect  # no connect again
    finally:
        dbtune.close()
    # Nothing answers: the error of the last tried, the writer.
    dbtune = DBTune(parse({**settings, 'dbtune.read_urls': down}))
    try:
        with pytest.raises(sa.exc.OperationalError):
            server_dialect(dbtune.router)
    finally:
        dbtune.close()


def test_zope_confs_overrides_name_zsql_methods_by_id(postgresql_url):
    # What a ZSQL Method with a cache time (its Advanced tab) asks of its
    # connection, with zope.conf's names, lower-cased by ZConfig.
    create_tables(postgresql_url)
    settings = {
        'dbtune.url': postgresql_url,
        'dbtune.cache_time.getrentnow': '0',
        'dbtune.invalidate.getrent': 'false',
    }
    dbtune = DBTune(parse(settings))
    dbtune.folded = True
    database = Database(dbtune)
    reads = 'SELECT rent FROM property WHERE id = 1'
    try:
        for name in ('getRent', 'getRentNow', 'other'):
            assert database.cached_query(reads, 0, 60, name)[1] == [[90]]
        database.query('UPDATE property SET rent = 91 WHERE id = 1')
        transaction.commit()
        # Never dropped by a write; never cached; as its own cache time.
        assert database.cached_query(reads, 0, 60, 'getRent')[1] == [[90]]
        assert database.cached_query(reads, 0, 60, 'getRentNow')[1] == [[91]]
        assert database.cached_query(reads, 0, 60, 'other')[1] == [[91]]
        assert dbtune.cache.hits == 1
    finally:
        transaction.abort()
        dbtune.close()


def test_a_zope_read_that_writes_is_told_what_to_do(postgresql_url):
    # SELECT nextval(...) reads as a read, and reads run read-only: a ZSQL
    # Method (uncached, cached) and a code-first method alike.
    create_tables(postgresql_url)
    dbtune = DBTune(parse({'dbtune.url': postgresql_url}))
    nextval = "SELECT nextval('zope_seq') AS n"
    dbtune.register(SQLMethod('next_id', nextval))
    database = Database(dbtune)
    try:
        database.query('CREATE SEQUENCE IF NOT EXISTS zope_seq')
        transaction.commit()
        with pytest.raises(WriteInReadError, match='writes: true'):
            database.query(nextval)
        with pytest.raises(WriteInReadError, match='writes: true'):
            database.cached_query(nextval, 0, 60, 'next_id')
        with pytest.raises(WriteInReadError, match=r'next_id\(\).*writes='):
            database.call(dbtune.methods['next_id'], {})
        # Another error is the database's, as it came.
        with pytest.raises(sa.exc.ProgrammingError):
            database.query('SELECT x FROM no_such_table')
    finally:
        transaction.abort()
        database.query('DROP SEQUENCE IF EXISTS zope_seq')
        transaction.commit()
        dbtune.close()
