"""The probe views: off by default, guarded, and each does its work."""

import os
import sys
import types

import pytest
from pyramid.config import Configurator
from pyramid.exceptions import ConfigurationError
from webtest import TestApp

from pyramid_dbtune.ops import access, probes

from conftest import query_log

TOKEN = 'a-probe-token-16-chars'
ON = {'dbtune.probes': 'true', 'dbtune.stats.token': TOKEN}


def make(url=None, **settings):
    if url:
        settings['dbtune.url'] = url
    with Configurator(settings=settings) as config:
        config.include('pyramid_dbtune')
        app = config.make_wsgi_app()
    return TestApp(app)


def get(app, probe, status=200, **params):
    return app.get(
        f'/_dbtune/probe/{probe}',
        params=params,
        headers={access.HEADER: TOKEN},
        status=status,
    )


@pytest.fixture(autouse=True)
def nothing_declared(monkeypatch):
    monkeypatch.setattr(probes, 'declared', {})


def test_off_by_default_installs_nothing(sqlite_url):
    app = make(sqlite_url, **{'dbtune.stats.token': TOKEN})
    for probe in ('io', 'cpu', 'sql'):
        get(app, probe, status=404)
    assert app.app.routes_mapper is None  # no route at all
    assert probes.METHOD not in app.app.registry.dbtune.methods
    get(make(sqlite_url, **ON), 'io', ms='0')


def test_on_needs_a_way_in():
    with pytest.raises(ConfigurationError, match='dbtune.probes = true needs'):
        make(**{'dbtune.probes': 'true'})


def test_a_bad_value_is_named():
    with pytest.raises(ConfigurationError) as info:
        make(**{'dbtune.probes': 'maybe', 'dbtune.stats.token': TOKEN})
    assert "dbtune.probes = 'maybe' is not valid: expected true or" in str(
        info.value
    )


def test_io_probe_says_who_served():
    app = make(**ON)
    answer = get(app, 'io', ms='5').json
    assert answer['probe'] == 'io' and answer['ms'] == 5
    assert answer['pid'] > 0 and answer['thread'] > 0
    claims = answer['claims']
    assert claims['multithread'] is False  # WebTest's environ
    assert claims['workers'] is None and claims['server'] is None
    assert claims['cores'] >= 1
    # Without the token there is nothing there.
    app.get('/_dbtune/probe/io', status=404)


def test_cpu_probe_uses_the_cpu_it_was_asked_for():
    answer = get(make(**ON), 'cpu', ms='30').json
    assert answer['cpu_seconds'] >= 0.03
    assert answer['seconds'] >= answer['cpu_seconds'] * 0.9


@pytest.mark.parametrize(
    'ms', ['abc', '-1', '10001', '1.5', '٣', '9' * 5000, '0' * 5000 + '5']
)
def test_bad_milliseconds_are_a_400(ms):
    response = get(make(**ON), 'io', status=400, ms=ms)
    assert 'ms must be a whole number of milliseconds from 0 to 10000' in (
        response.text
    )
    assert len(response.text) < 1000  # the text is not echoed whole


@pytest.mark.parametrize('query', ['ms=%FF', 'ms=5&other=%FF'])
def test_a_query_string_that_is_not_utf8_is_a_400(query):
    response = make(**ON).get(
        f'/_dbtune/probe/io?{query}',
        headers={access.HEADER: TOKEN},
        status=400,
    )
    assert 'the query string is not UTF-8' in response.text


def test_default_milliseconds():
    assert get(make(**ON), 'io').json['ms'] == probes.DEFAULT_MS


def test_sql_probe_reads_through_a_reader_uncached(db_url):
    app = make(db_url, **ON)
    log = query_log(app)
    for _ in range(2):
        answer = get(app, 'sql', ms='10').json
        assert answer['rows'] == 1
    dialect = app.app.registry.dbtune.router.dialect
    waits = dialect in ('postgresql', 'mysql')
    assert answer['db_wait'] is waits
    # Never cached: both calls ran, on a reader.
    word = {'postgresql': 'pg_sleep', 'mysql': 'SLEEP'}.get(dialect, '1')
    assert log.count(word, 'reader0') == 2
    assert log.count(word, 'writer') == 0
    app.app.registry.dbtune.router.dispose()


def test_no_database_no_sql_probe():
    app = make(**ON)
    get(app, 'sql', status=404)
    get(app, 'io', ms='0')


def test_probe_statements_by_dialect():
    assert 'pg_sleep' in probes.probe_method('postgresql').sql
    assert 'SLEEP' in probes.probe_method('mariadb').sql
    assert probes.probe_method('oracle').sql.endswith('FROM dual')
    assert probes.probe_method('sqlite').sql == 'SELECT 1 AS one'


def test_declared_claims_and_mod_wsgi(monkeypatch):
    environ = {'SERVER_SOFTWARE': 'x/1', 'wsgi.multiprocess': True}
    probes.declare(server='gunicorn', workers=3, threads=4)
    claims = probes.server_claims(environ)
    assert claims['server'] == 'gunicorn'
    assert (claims['workers'], claims['threads']) == (3, 4)
    assert claims['multiprocess'] and not claims['multithread']
    # Inside Apache, mod_wsgi's module says its daemon's counts.
    module = types.ModuleType('mod_wsgi')
    module.maximum_processes, module.threads_per_process = 5, 15
    monkeypatch.setitem(sys.modules, 'mod_wsgi', module)
    claims = probes.server_claims(environ)
    assert (claims['server'], claims['workers'], claims['threads']) == (
        'mod_wsgi',
        5,
        15,
    )


def cgroup(tmp_path, own, files):
    """A cgroup tree under ``tmp_path``: ``own``, the text of
    /proc/self/cgroup; ``files``, path: text."""
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    (tmp_path / 'own').write_text(own)
    return str(tmp_path / 'fs'), str(tmp_path / 'own')


@pytest.mark.parametrize(
    'own, files, cpus',
    [
        # cgroup v2: the quota of the process's cgroup, or one above it.
        ('0::/\n', {'fs/cpu.max': '150000 100000\n'}, 2),
        ('0::/\n', {'fs/cpu.max': 'max 100000\n'}, None),
        ('0::/a/b\n', {'fs/a/b/cpu.max': 'max 100000\n',
                       'fs/a/cpu.max': '100000 100000\n'}, 1),
        ('0::/a\n', {'fs/a/cpu.max': '400000 100000\n',
                     'fs/cpu.max': '300000 100000\n'}, 3),
        ('0::/\n', {'fs/cpu.max': '20000 100000\n'}, 1),  # a fifth: 1
        # cgroup v1, the cpu controller alone or with cpuacct.
        ('1:cpu:/\n', {'fs/cpu/cpu.cfs_quota_us': '250000\n',
                       'fs/cpu/cpu.cfs_period_us': '100000\n'}, 3),
        ('4:cpu,cpuacct:/docker/x\n',
         {'fs/cpu,cpuacct/docker/x/cpu.cfs_quota_us': '-1\n',
          'fs/cpu,cpuacct/docker/x/cpu.cfs_period_us': '100000\n',
          'fs/cpu,cpuacct/cpu.cfs_quota_us': '100000\n',
          'fs/cpu,cpuacct/cpu.cfs_period_us': '100000\n'}, 1),
        ('1:cpu:/\n', {'fs/cpu/cpu.cfs_quota_us': '-1\n',
                       'fs/cpu/cpu.cfs_period_us': '100000\n'}, None),
        # A quota without its period, nonsense, no cgroup at all.
        ('1:cpu:/\n', {'fs/cpu/cpu.cfs_quota_us': '100000\n'}, None),
        ('0::/\n', {'fs/cpu.max': 'nonsense\n'}, None),
        ('garbage\n', {}, None),
    ],
)  # fmt: skip
def test_cgroup_cpus(tmp_path, own, files, cpus):
    root, own_file = cgroup(tmp_path, own, files)
    assert probes.cgroup_cpus(root, own_file) == cpus


def test_no_proc_self_cgroup(tmp_path):
    root, _ = cgroup(tmp_path, '', {'fs/cpu.max': '100000 100000\n'})
    assert probes.cgroup_cpus(root, str(tmp_path / 'none')) == 1


def test_usable_cores_take_the_quota(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    assert probes.usable_cores(str(tmp_path)) == affinity
    (tmp_path / 'cpu.max').write_text('100000 100000\n')
    assert probes.usable_cores(str(tmp_path)) == min(1, affinity)
    (tmp_path / 'cpu.max').write_text(f'{affinity + 3}00000 100000\n')
    assert probes.usable_cores(str(tmp_path)) == affinity
