"""pyramid_dbtune inside a real Zope site: a Zope 6 instance the test
makes (``mkwsgiinstance``, a ZODB of its own), served by ``runwsgi`` in a
process of its own, whose ZSQL Methods, added through Zope's own API,
use the package's connection by ``connection_id``.

The database is a PostgreSQL server of the test's own, with
``pg_stat_statements``: its own count of the statements run, by role,
tells what was served from the cache and what ran on the reader (a role
of its own) or the writer."""

import base64
import http.cookies
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import coverage
import pytest
import sqlalchemy as sa

from pyramid_dbtune.deploy import cli
from pyramid_dbtune.routing.work import PIN_COOKIE
from servers import PostgreSQL, free_port

from conftest import create_tables, own, rent_on, shared_settings, until

BIN = Path(sys.executable).parent
ROOT = Path(__file__).parents[1]
SETUP = Path(__file__).parent / 'zope_setup.py'
#: Where the tests' own Zope product, ``zope_app``, is found.
PRODUCTS = Path(__file__).parent / 'zope_app'
AUTH = 'Basic ' + base64.b64encode(b'admin:admin').decode()
#: The ZODB that SETUP made, by what the site was made with.
SETUPS = {}


@pytest.fixture(scope='module', autouse=True)
def setups():
    yield
    for data in SETUPS.values():
        shutil.rmtree(data.parent, ignore_errors=True)
    SETUPS.clear()


def command(script, *args):
    """Run one of the environment's scripts: under coverage where the
    test is measured, so that what runs in Zope counts too."""
    if coverage.Coverage.current() is None:
        return [str(BIN / script), *args]
    rcfile = f'--rcfile={ROOT / "pyproject.toml"}'
    return [sys.executable, '-m', 'coverage', 'run', '-p', rcfile,
            str(BIN / script), *args]  # fmt: skip


class ZopeSite:
    """A Zope instance in ``directory``, with pyramid_dbtune's ``settings``
    in its ``zope.conf``, and :data:`SETUP`'s content."""

    def __init__(
        self, directory, settings, fast_paths=None, zcml=(), ini=None
    ):
        self.dir = directory
        self.url = (ini or settings).get('dbtune.url', '')
        #: What SETUP's run depends on: the same, the same Data.fs.
        self.key = repr((settings, fast_paths, zcml, ini))
        subprocess.run(
            [str(BIN / 'mkwsgiinstance'), '-d', str(directory),
             '-u', 'admin:admin'],
            check=True, capture_output=True,
        )  # fmt: skip
        etc = directory / 'etc'
        (etc / 'package-includes').mkdir()
        includes = etc / 'package-includes'
        (includes / 'pyramid_dbtune-configure.zcml').write_text(
            '<include package="pyramid_dbtune.zope" />\n'
        )
        # ZCML of the site's own, loaded after the package's.
        for i, text in enumerate(zcml):
            (includes / f'site{i}-configure.zcml').write_text(text)
        if settings is not None:
            lines = ''.join(f'  {k} {v}\n' for k, v in settings.items())
            with open(etc / 'zope.conf', 'a') as conf:
                conf.write(f'\n<product-config pyramid_dbtune>\n{lines}'
                           '</product-config>\n')  # fmt: skip
        self.port = free_port()
        path = etc / 'zope.ini'
        text = path.read_text().replace('port = 8080', f'port = {self.port}')
        head = 'pipeline =\n    egg:Zope#httpexceptions\n'
        assert head in text
        if fast_paths:  # the filter first in Zope's own pipeline
            text = text.replace(head, head + '    fastpath\n') + (
                '\n[filter:fastpath]\nuse = egg:pyramid_dbtune#fastpath\n'
                f'paths = {fast_paths}\n'
            )
        if ini is not None:  # the dbtune filter, with these settings
            lines = ''.join(f'{k} = {v}\n' for k, v in ini.items())
            text = text.replace('pipeline =\n', 'pipeline =\n    dbtune\n')
            text += (
                f'\n[filter:dbtune]\nuse = egg:pyramid_dbtune#zope\n{lines}'
            )
        path.write_text(text)
        self.process = None

    def setup(self):
        """Run :data:`SETUP` in the site; how it ended. Once for a site
        made alike: after that, the ZODB it made is copied."""
        etc, data = self.dir / 'etc', self.dir / 'var' / 'Data.fs'
        made = SETUPS.get(self.key)
        if made is not None:
            shutil.copyfile(made, data)
            return subprocess.CompletedProcess([], 0, '', '')
        done = subprocess.run(
            command('zconsole', 'run', str(etc / 'zope.conf'), str(SETUP)),
            cwd=ROOT, capture_output=True, text=True,
            env={**self.env, 'DBTUNE_ZOPE_OTHER_URL': self.url},
        )  # fmt: skip
        if done.returncode == 0:
            SETUPS[self.key] = Path(tempfile.mkdtemp()) / 'Data.fs'
            shutil.copyfile(data, SETUPS[self.key])
        return done

    @property
    def env(self):
        # The test's own PYTHONPATH kept: Zope runs the code under test.
        path = [str(PRODUCTS), os.environ.get('PYTHONPATH', '')]
        return {
            **os.environ,
            'PYTHONPATH': os.pathsep.join(filter(None, path)),
        }

    def start(self):
        self.launch()
        until(self.up, 60)

    def launch(self):
        """Start Zope's process; :meth:`start` waits for it too."""
        with open(self.dir / 'stderr.log', 'w') as said:
            self.process = subprocess.Popen(
                command('runwsgi', str(self.dir / 'etc' / 'zope.ini')),
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=said,
                env=self.env,
            )  # fmt: skip

    def said(self):
        """What Zope wrote to its standard error."""
        return (self.dir / 'stderr.log').read_text()

    def up(self):
        assert self.process.poll() is None, 'Zope did not start'
        try:
            self.get('/')
        except OSError:
            return False
        return True

    def get(self, path, form=None, headers=None, cookie=None):
        """``(status, body)`` of a GET of ``path`` (a POST of ``form``), as
        the site's manager, sending ``cookie``; the answer's ``headers`` in
        that dict."""
        request = urllib.request.Request(
            f'http://127.0.0.1:{self.port}{path}',
            None if form is None else urllib.parse.urlencode(form).encode(),
            headers={
                'Authorization': AUTH,
                **({'Cookie': cookie} if cookie else {}),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                if headers is not None:
                    headers.update(answer.headers)
                return answer.status, answer.read().decode().strip()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            self.process.wait(30)


@pytest.fixture(scope='module')
def server():
    """A PostgreSQL server of the module's own that counts its statements,
    with a role ``reader``."""
    made = own(
        PostgreSQL, options=['shared_preload_libraries=pg_stat_statements']
    )
    engine = sa.create_engine(made.url, poolclass=sa.pool.NullPool)
    with engine.begin() as connection:
        connection.exec_driver_sql('CREATE EXTENSION pg_stat_statements')
        connection.exec_driver_sql('CREATE ROLE reader LOGIN')
    engine.dispose()
    yield made
    made.remove()


@pytest.fixture
def database(server):
    """The module's server, with the test's tables, which ``reader`` may
    read, and no statement counted yet."""
    engine = sa.create_engine(server.url, poolclass=sa.pool.NullPool)
    with engine.begin() as connection:
        connection.exec_driver_sql(
            'DROP TABLE IF EXISTS property, area, once CASCADE'
        )
    create_tables(server.url)
    with engine.begin() as connection:
        for statement in (
            # A second row of a value fails at commit, not at the insert.
            'CREATE TABLE once (x INTEGER UNIQUE DEFERRABLE INITIALLY '
            'DEFERRED)',
            'GRANT SELECT ON ALL TABLES IN SCHEMA public TO reader',
            'SELECT pg_stat_statements_reset()',
        ):
            connection.exec_driver_sql(statement)
    engine.dispose()
    return server


def run_by(server, beginning):
    """Role: how many statements beginning with ``beginning`` it ran."""
    engine = sa.create_engine(server.url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as connection:
            found = connection.execute(
                sa.text(
                    'SELECT r.rolname, sum(s.calls) FROM pg_stat_statements s '
                    'JOIN pg_roles r ON r.oid = s.userid '
                    'WHERE s.query LIKE :beginning GROUP BY r.rolname'
                ),
                {'beginning': beginning + '%'},
            )
            return {role: int(calls) for role, calls in found}
    finally:
        engine.dispose()


def stored_rent(server):
    engine = sa.create_engine(server.url, poolclass=sa.pool.NullPool)
    with engine.connect() as connection:
        value = connection.exec_driver_sql(
            'SELECT rent AS stored FROM property WHERE id = 1'
        ).scalar()
    engine.dispose()
    return value


@pytest.fixture
def site(database, tmp_path, request):
    """The test's site, its reads as ``reader``; the test's parameter adds
    settings."""
    reader = database.url.replace('postgres@', 'reader@', 1)
    made = ZopeSite(
        tmp_path / 'instance',
        {
            'dbtune.url': database.url,
            'dbtune.read_urls': reader,
            **getattr(request, 'param', {}),
        },
    )
    done = made.setup()
    assert done.returncode == 0, done.stderr
    made.start()
    yield made
    made.stop()


def test_zsql_methods_read_through_the_cache_on_the_reader(site, database):
    reads = 'SELECT rent FROM property'
    assert site.get('/show_rent') == (200, '90')
    assert run_by(database, reads) == {'reader': 1}
    # The second call: from the cache, not the database.
    assert site.get('/show_rent') == (200, '90')
    assert run_by(database, reads) == {'reader': 1}
    # A write, on the writer, in Zope's transaction: its commit drops the
    # rows of the table it wrote.
    assert site.get('/update?rent=95') == (200, 'done')
    assert run_by(database, 'UPDATE property') == {'postgres': 1}
    assert site.get('/show_rent') == (200, '95')
    assert run_by(database, reads) == {'reader': 2}
    # A write whose transaction aborts: nothing stored, nothing dropped.
    status, _ = site.get('/update_and_fail?rent=99')
    assert status == 500
    assert run_by(database, 'UPDATE property') == {'postgres': 2}
    assert stored_rent(database) == 95
    assert site.get('/show_rent') == (200, '95')
    assert run_by(database, reads) == {'reader': 2}


def test_a_transaction_that_wrote_reads_its_writes_on_the_writer(
    site, database
):
    reads = 'SELECT rent FROM property'
    assert site.get('/show_rent_now') == (200, '90')
    assert site.get('/show_rent_now') == (200, '90')  # uncached: again
    assert run_by(database, reads) == {'reader': 2}
    # After its write, the transaction's reads, cached or not, run in it.
    assert site.get('/update_then_read?rent=96') == (200, '96 96')
    assert run_by(database, reads) == {'reader': 2, 'postgres': 2}
    assert site.get('/show_rent_now') == (200, '96')


def test_two_statements_a_cached_write_and_an_untold_one(site, database):
    # Several statements in one method: run each time (the last one's
    # rows are the answer), never cached.
    assert site.get('/show_two') == (200, '120')
    assert site.get('/show_two') == (200, '120')
    assert run_by(database, 'SELECT $1 AS one') == {'reader': 2}
    assert site.get('/show_rent') == (200, '90')
    # A write with a cache time is a write: run, and its table dropped.
    assert site.get('/write_cached?rent=121') == (200, 'done')
    assert site.get('/show_two') == (200, '121')
    assert site.get('/show_rent') == (200, '90')  # still cached ...
    assert run_by(database, 'SELECT rent FROM property') == {'reader': 2}
    # ... until a write whose tables cannot be told drops everything.
    assert site.get('/write_untold') == (200, 'done')
    assert site.get('/show_rent') == (200, '90')
    assert run_by(database, 'SELECT rent FROM property') == {'reader': 3}


def test_a_commit_that_fails_drops_nothing_and_frees_its_slot(site, database):
    assert site.get('/show_rent') == (200, '90')
    status, _ = site.get('/fail_at_commit')
    assert status == 500
    assert site.get('/show_rent') == (200, '90')
    assert run_by(database, 'SELECT rent FROM property') == {'reader': 1}
    # The only write slot is free: the next write goes through.
    assert site.get('/update?rent=97') == (200, 'done')
    assert site.get('/show_rent') == (200, '97')


@pytest.mark.parametrize(
    'site', [{'dbtune.causal_reads': 'false'}], indirect=True
)
def test_another_adapters_methods_keep_their_own_cache(site):
    assert site.get('/show_other') == (200, '90')
    assert site.get('/update?rent=98') == (200, 'done')
    assert site.get('/show_rent') == (200, '98')
    # ZSQL's own cache, per thread, which no write drops: what the
    # package's connection replaces.
    assert site.get('/show_other') == (200, '90')


def test_the_connection_in_the_zmi(site):
    status, page = site.get('/dbtune/manage_main')
    assert status == 200 and 'The database connection is open' in page
    assert site.get('/dbtune/manage_open_connection')[0] == 200
    add = '/manage_addProduct/pyramid_dbtune.zope'
    status, page = site.get(f'{add}/add_form')
    assert status == 200 and 'manage_addDBTuneConnection' in page
    status, _ = site.get(
        f'{add}/manage_addDBTuneConnection', {'id': 'second', 'title': ''}
    )
    assert status == 200
    assert site.get('/second/manage_main')[0] == 200
    # A ZSQL Method's forms offer it; its edit form, saved as it came,
    # keeps the method on it.
    status, page = site.get('/manage_addProduct/ZSQLMethods/add')
    assert status == 200 and '<option value="dbtune"' in page
    status, page = site.get('/get_rent_now/manage_main')
    assert status == 200
    form = {
        'title': '',
        'connection_id': selected(page, 'connection_id'),
        'arguments': 'id',
        'template': 'SELECT rent FROM property '
        'WHERE id = <dtml-sqlvar id type="int">',
    }
    assert site.get('/get_rent_now/manage_edit', form)[0] == 200
    assert site.get('/show_rent_now') == (200, '90')
    # Its quoting of strings (test_zope_in_process has MySQL's).
    for area, count in (('Headingley', '2'), ("\\' OR 1=1 -- ", '0')):
        query = urllib.parse.urlencode({'area': area})
        assert site.get(f'/count_in_area?{query}') == (200, count)


def selected(page, name):
    """The value a browser sends for the ``<select>`` ``name`` of
    ``page``: its selected option's, else its first's."""
    select = re.search(f'<select[^>]*name="{name}".*?</select>', page, re.S)
    options = re.findall(
        r'<option value="([^"]*)"(\s*selected)?', select.group()
    )
    return next((v for v, chosen in options if chosen), options[0][0])


def test_a_read_quotes_its_strings_while_the_writer_is_down(
    database, tmp_path
):
    # The primary unreachable from the start: a read that puts a string
    # into its SQL runs on the replica, as one with a number does.
    down = f'postgresql+psycopg://postgres@127.0.0.1:{free_port()}/down'
    reader = database.url.replace('postgres@', 'reader@', 1)
    settings = {'dbtune.url': down, 'dbtune.read_urls': reader}
    made = ZopeSite(tmp_path / 'instance', settings)
    done = made.setup()
    assert done.returncode == 0, done.stderr
    made.start()
    try:
        assert made.get('/show_rent_now') == (200, '90')
        assert made.get('/count_in_area?area=Headingley') == (200, '2')
    finally:
        made.stop()


@pytest.mark.parametrize(
    'settings, error',
    [
        ({'dbtune.read_pool_size': 'none'},
         "dbtune.read_pool_size = 'none' is not valid"),
        ({}, 'pyramid_dbtune.zope needs a database: set dbtune.url'),
    ],
)  # fmt: skip
def test_a_bad_setting_stops_zope_as_it_starts(
    settings, error, database, tmp_path
):
    if settings:
        settings['dbtune.url'] = database.url
    done = ZopeSite(tmp_path / 'instance', settings).setup()
    assert done.returncode != 0
    assert error in done.stderr


def test_the_fast_path_answers_in_zopes_pipeline(database, tmp_path):
    made = ZopeSite(
        tmp_path / 'instance', {'dbtune.url': database.url}, '/healthz=OK'
    )
    made.start()
    try:
        assert made.get('/healthz') == (200, 'OK')
        assert made.get('/manage_main')[0] == 200
    finally:
        made.stop()
    # Zope's access log, written by a filter behind the fast path, saw
    # the page Zope published, and never the fast path's (an instance
    # has no /healthz: Zope would have answered 404).
    log = (made.dir / 'var' / 'log' / 'Z4.log').read_text()
    assert '"GET /manage_main ' in log and '/healthz' not in log


DEEP = '/healthz=python:pyramid_dbtune.fastpath:deep_check'


def test_the_deep_check_in_zopes_pipeline_pings_zopes_database(
    database, tmp_path
):
    made = ZopeSite(tmp_path / 'instance', {'dbtune.url': database.url}, DEEP)
    # The settings in a dbtune filter made after the fast path's (before
    # it in the pipeline): as the fast path's is made, there is no
    # database for its check.
    early = ZopeSite(
        tmp_path / 'early', None, DEEP, ini={'dbtune.url': database.url}
    )
    early.launch()
    made.start()
    try:
        assert made.get('/healthz') == (200, 'OK')
        assert run_by(database, 'SELECT $1') == {'postgres': 1}
    finally:
        made.stop()
    assert early.process.wait(60) != 0
    said = early.said()
    assert 'FastPathError' in said and 'dbtune.fast_paths' in said


def test_two_zope_processes_share_memcached(database, memcached, tmp_path):
    settings = {'dbtune.url': database.url, **shared_settings(memcached)}
    one, two = (ZopeSite(tmp_path / n, settings) for n in ('one', 'two'))
    try:
        for made in (one, two):
            done = made.setup()
            assert done.returncode == 0, done.stderr
            made.launch()  # the two start together
        for made in (one, two):
            until(made.up, 60)
        reads = 'SELECT rent FROM property'
        assert two.get('/show_rent') == (200, '90')
        # The other process's read: from memcached.
        assert one.get('/show_rent') == (200, '90')
        assert run_by(database, reads) == {'postgres': 1}
        # A write in one drops the rows for both.
        assert one.get('/update?rent=95') == (200, 'done')
        assert two.get('/show_rent') == (200, '95')
        assert run_by(database, reads) == {'postgres': 2}
    finally:
        one.stop()
        two.stop()


APP = '<include package="zope_app" />'


def test_a_view_calls_the_packages_sql_methods(database, tmp_path):
    reader = database.url.replace('postgres@', 'reader@', 1)
    settings = {'dbtune.url': database.url, 'dbtune.read_urls': reader}
    made = ZopeSite(tmp_path / 'instance', settings, zcml=[APP])
    made.start()
    try:
        reads = 'SELECT id, rent FROM property'
        assert made.get('/@@code_rent') == (200, '90')
        assert made.get('/@@code_rent') == (200, '90')  # cached
        assert run_by(database, reads) == {'reader': 1}
        # A write, then a read in its transaction: on the writer.
        assert made.get('/@@code_rent?rent=93') == (200, '93')
        assert run_by(database, reads) == {'reader': 1, 'postgres': 1}
        # Committed: the cached rows of property 1 are gone.
        assert made.get('/@@code_rent') == (200, '93')
        assert run_by(database, reads) == {'reader': 2, 'postgres': 1}
        # A method with no cache time reads each time, on the reader.
        assert made.get('/@@code_rent?now=1') == (200, '93')
        assert made.get('/@@code_rent?now=1') == (200, '93')
        assert run_by(database, 'SELECT rent, id') == {'reader': 2}
        status, said = made.get('/@@code_rent?method=nothing')
        assert "no SQL method named 'nothing'" in said
        assert 'registered: get_rent, get_rent_now, set_rent' in said
        status, said = made.get('/@@code_rent?method=_private')
        assert said == '_private'
    finally:
        made.stop()


def test_a_bad_sql_methods_directive_stops_zope(database, tmp_path):
    bad = tmp_path / 'bad'
    bad.mkdir()
    (bad / 'late.sql').write_text('-- cache_time: soon\nSELECT 1\n')
    for directory, error in (
        (tmp_path / 'none', 'not a directory that holds *.sql'),
        (bad, 'cache_time'),
    ):
        zcml = (
            '<configure xmlns:dbtune="urn:pyramid_dbtune">'
            f'<dbtune:sqlmethods directory="{directory}" /></configure>'
        )
        made = ZopeSite(
            tmp_path / directory.name / 'instance',
            {'dbtune.url': database.url},
            zcml=[zcml],
        )
        done = made.setup()
        assert done.returncode != 0 and error in done.stderr


def test_a_write_made_outside_zope_reaches_its_cache(database, tmp_path):
    from pyramid_dbtune.cache import triggers

    engine = sa.create_engine(database.url)
    triggers.install(engine, {'property': []})
    settings = {'dbtune.url': database.url, 'dbtune.cache.listen': 'true'}
    made = ZopeSite(tmp_path / 'instance', settings)
    assert made.setup().returncode == 0
    made.start()
    try:
        assert made.get('/show_rent') == (200, '90')
        assert made.get('/show_rent') == (200, '90')  # cached
        with engine.begin() as connection:  # as psql would
            connection.exec_driver_sql(
                'UPDATE property SET rent = 94 WHERE id = 1'
            )
        # Heard, and dropped: fresh within the listener's bound.
        until(lambda: made.get('/show_rent') == (200, '94'), 1)
    finally:
        made.stop()
        engine.dispose()


TOKEN = 'the-operator-of-this-zope-site'


def test_the_wsgi_pipelines_settings_and_the_operators_side(
    database, tmp_path, capsys
):
    reader = database.url.replace('postgres@', 'reader@', 1)
    made = ZopeSite(
        tmp_path / 'instance',
        None,  # nothing in zope.conf
        ini={
            'dbtune.url': database.url,
            'dbtune.read_urls': reader,
            'dbtune.stats': 'true',
            'dbtune.stats.token': TOKEN,
            'dbtune.probes': 'true',
            'dbtune.server_timing': 'true',
            'dbtune.fast_paths': '/healthz=OK',
        },
        zcml=[APP],  # its SQL methods, registered once the filter is made
    )
    # zconsole reads zope.conf alone: adding the content needs no database.
    done = made.setup()
    assert done.returncode == 0, done.stderr
    made.start()
    try:
        reads = 'SELECT rent FROM property'
        headers = {}
        assert made.get('/show_rent', headers=headers) == (200, '90')
        assert made.get('/show_rent') == (200, '90')
        assert run_by(database, reads) == {'reader': 1}
        assert made.get('/@@code_rent') == (200, '90')
        assert 'total;dur=' in headers['Server-Timing']
        assert made.get('/healthz') == (200, 'OK')
        # The operator's views, behind the token, as in Pyramid.
        assert made.get('/_dbtune/stats')[0] == 404
        status, body = made.get(f'/_dbtune/stats?token={TOKEN}')
        assert status == 200
        stats = json.loads(body)
        assert stats['routes']['zope']['requests'] >= 2
        # show_rent's miss and hit, and code_rent's miss.
        assert stats['cache']['hits'] == 1 and stats['cache']['misses'] == 2
        # "Am I threading, and how well?", asked of Zope's server. Other
        # load on the machine lengthens the waits: the best of five (three
        # all fell short once, in a CI run on a machine slowed by half).
        for _ in range(5):
            status = cli.main(
                ['threadcheck', f'http://127.0.0.1:{made.port}', '--json',
                 '--duration', '0.3', '--ms', '20', '--concurrency', '4',
                 '--token', TOKEN]
            )  # fmt: skip
            out, err = capsys.readouterr()
            assert status in (0, 1), err  # 1: far below; 2: an error
            report = json.loads(out)
            # Zope's server runs waits in parallel, in the database too.
            parallel = [
                report['probes'][p]['parallelism'] for p in ('io', 'sql')
            ]
            if status == 0 and min(parallel) > 2:
                break
        assert status == 0, err
        assert min(parallel) > 2, report
    finally:
        made.stop()
    log = (made.dir / 'var' / 'log' / 'Z4.log').read_text()
    assert '"GET /show_rent ' in log and '/healthz' not in log


#: ``(zope.conf's settings, the filter's, the error)`` of filters that
#: stop Zope as it starts.
BAD_FILTERS = [
    (None, {'dbtune.read_pool_size': 'none'},
     "dbtune.read_pool_size = 'none' is not valid"),
    (None, {'dbtune.stats': 'true'},
     'pyramid_dbtune.zope needs a database: set dbtune.url'),
    ({}, {'dbtune.stats': 'true'}, 'give them in one place'),
    (None, {'paths': '/healthz=OK'},
     'the dbtune filter takes dbtune.* settings, not paths'),
]  # fmt: skip


def test_a_bad_filter_stops_zope(database, tmp_path):
    made = []
    for n, (conf, ini, error) in enumerate(BAD_FILTERS):
        if conf is not None:
            conf = {**conf, 'dbtune.url': database.url}
        site = ZopeSite(tmp_path / str(n), conf, ini=ini)
        site.launch()  # all of them together
        made.append((site, error))
    for site, error in made:
        assert site.process.wait(60) != 0, error
        assert error in site.said()


#: The standby of the causal reads' test replays 2 s late.
STANDBY_DELAY = 2


def test_a_client_reads_its_own_writes_from_a_late_standby(
    streaming, tmp_path
):
    primary, standby = streaming
    standby.delay(0)  # the tables need not wait for it
    try:
        create_tables(primary.url)
        until(lambda: rent_on(standby.url) == 90)
    finally:  # the module's other tests count on the delay
        standby.delay(STANDBY_DELAY)
    settings = {'dbtune.url': primary.url, 'dbtune.read_urls': standby.url}
    one, two = (
        ZopeSite(tmp_path / name, settings, zcml=[APP])
        for name in ('one', 'two')
    )
    try:
        for made in (one, two):
            assert made.setup().returncode == 0
            made.launch()  # the two start together
        for made in (one, two):
            until(made.up, 60)
        assert one.get('/show_rent_now') == (200, '90')
        headers = {}
        assert one.get('/update?rent=95', headers=headers) == (200, 'done')
        jar = http.cookies.SimpleCookie(headers['Set-Cookie'])
        cookie = f'{PIN_COOKIE}={jar[PIN_COOKIE].value}'
        # The writer's client sees its write; another client reads the
        # standby, which has yet to replay it.
        assert one.get('/show_rent_now', cookie=cookie) == (200, '95')
        assert one.get('/show_rent_now') == (200, '90')
        # In the other process too, past the rows it cached from the
        # standby for the other client: ZSQL Methods' and code-first.
        for path in ('/show_rent', '/@@code_rent'):
            assert two.get(path) == (200, '90')
            assert two.get(path, cookie=cookie) == (200, '95')
            assert two.get(path) == (200, '90')  # still cached
        assert rent_on(standby.url) == 90  # all before the replay
    finally:
        one.stop()
        two.stop()
