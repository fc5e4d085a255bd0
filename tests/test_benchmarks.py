"""The benchmarks still run. They assert nothing about time: figures come
from running them, and are printed, never tested."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import IN_CI

BENCHMARKS = Path(__file__).parents[1] / 'benchmarks'


def run(script, *args):
    """Run a benchmark with ``--quick``; its output, or a failure."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), '--quick', *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_bench_cache():
    out = run('bench_cache.py')
    assert 'dogpile hit / our hit = ' in out
    assert 'SQLite query / our hit = ' in out
    if IN_CI:
        assert 'skipped' not in out


def test_bench_fastpath_in_process():
    out = run('bench_fastpath.py')
    for name in (
        'bare WSGI callable',
        'fastpath filter',
        'dbtune.fast_paths',
        'URL-dispatch view',
        'full stack',
    ):
        assert name in out
    assert 'filter adds' in out and 'include-only costs' in out


def test_bench_fastpath_over_http():
    # Installs wrk when missing, starts waitress and gunicorn on loopback.
    out = run('bench_fastpath.py', '--http')
    assert 'Over HTTP' in out
    assert 'waitress: filter within' in out
    assert 'gunicorn: filter within' in out


def test_bench_rwsplit():
    out = run('bench_rwsplit.py')
    assert 'parallel reads = ' in out
    assert '8 reads, one shared connection' in out
    # A real standby: no read misses its client's write (not a time).
    assert "reads that did not show their client's write: 0 " in out


def test_bench_memcached():
    assert 'ours / raw get = ' in run('bench_memcached.py')


def test_bench_listener():
    out = run('bench_listener.py')
    assert 'one row, again and again' in out and 'every row, once' in out


def test_bench_overhead():
    out = run('bench_overhead.py')
    for name in ('server_timing', 'stats + server_timing', 'profiler on'):
        assert name in out
    assert 'tween adds' in out and 'profiler adds' in out
    # The operator's views add one route for every request to match.
    assert '(2 routes)' in out
    assert 'with stats (3: /_dbtune/{view:stats|metrics|} first)' in out
    assert ': the route adds ' in out
    assert "reading a thread's CPU clock" in out


def test_bench_zope_filter():
    out = run('bench_zope_filter.py')
    for name in ('Zope alone', 'nothing on', 'probes', 'server_timing'):
        assert name in out


def test_threads_vs_processes(tmp_path):
    # Starts four gunicorn servers; installs wrk when missing.
    png = tmp_path / 'chart.png'
    out = run('threads_vs_processes.py', '--png', str(png))
    for config in ('1×1', '1×8', '2×1', '2×4'):
        assert f'\n{config} ' in out
    assert 'CPU-bound: 2×1 / 1×8 = ' in out
    assert 'I/O-bound: 1×8 / 1×1 = ' in out
    assert png.read_bytes().startswith(b'\x89PNG\r\n\x1a\n')


def test_headline(tmp_path, postgresql_url):
    # PostgreSQL (the fixture skips, or under CI fails, without it),
    # memcached, waitress, gunicorn and wrk, one second a run; exits 1 if
    # any request failed or a search was staler than its (cut) cache time.
    png = tmp_path / 'headline.png'
    out = run('headline.py', '--chart', str(png))
    forms = ('baseline', 'baseline-gunicorn', 'dogpile', 'tuned', 'ceiling')
    for form in forms:
        for concurrency in (1, 8, 32):
            assert re.search(rf'^{form} +{concurrency} ', out, re.M)
        if form != 'ceiling':
            assert re.search(
                rf'^{form} checks: .* 0 stale, 0 missing .* 0 failed '
                'requests$',
                out,
                re.M,
            )
    # Tuned: fresh within 0.1 s of the app's writes, 1 s of the others.
    assert re.search(r'^tuned checks: .*0 staler than 0.1 s / 1 s', out, re.M)
    assert 'ceiling: not checked' in out
    for other in forms[:3] + forms[4:]:
        assert f'tuned / {other}:' in out
    assert 'At concurrency 32' in out and 'every check passed' in out
    assert png.read_bytes().startswith(b'\x89PNG\r\n\x1a\n')


def test_headline_checker_catches_a_stale_cache(postgresql_url):
    # The tuned searches cached for an hour, checked against one second:
    # the checker must see stale reads, and the run must fail (the other
    # forms, clean, are test_headline's).
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / 'headline.py'), '--quick',
         '--stale-cache', '--chart', '', '--forms', 'tuned'],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    stale = re.search(r'^tuned checks: .* (\d+) of them able to fail .*: '
                      r'(\d+) stale', done.stdout, re.M)  # fmt: skip
    assert stale and int(stale[2]) > 0, done.stdout


def test_headline_counts_a_cache_time_on_its_forms_clock(monkeypatch):
    """A dogpile region serves an entry that expired while the other
    forms had their turns once more: its lag is counted in the seconds
    its form was asked for. The others' is counted on the wall clock."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import headline

    checker = headline.Checker(0, [1], headline.Days(), 'unused')
    checker.turns = [(0.0, 10.0), (100.0, 110.0)]
    assert [checker.asked_for(t) for t in (0, 5, 50, 105, 200)] == [
        0, 5, 10, 15, 20,
    ]  # fmt: skip
    checker.updates = [(5.0, 1, 2, False)]
    checker.searches = [(105.0, {1: 1})]
    assert checker.verdict(32)[0] == [(105.0, 1, 1, 2)]
    assert checker.verdict(32, turns_only=True) == ([], [], 0)
    assert checker.verdict(8, turns_only=True)[0] == [(105.0, 1, 1, 2)]


def test_headline_takes_a_row_missing_after_an_update_for_stale(monkeypatch):
    """Every update puts its property among the searched rows: a search
    that leaves it out after the update shows an older state, not a
    search the checker cannot judge."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import headline

    checker = headline.Checker(0, [1, 2], headline.Days(), 'unused')
    checker.updates = [(5.0, 1, 2, False)]
    checker.searches = [(3.0, {}), (10.0, {2: 0})]
    stale, missing, checks = checker.verdict(1)
    assert stale == [(10.0, 1, None, 2)]
    assert missing == [(3.0, 1), (3.0, 2)]
    assert checks == 1


def test_headline_refuses_rounds_it_cannot_run(monkeypatch, capsys):
    # Before wrk, the database and the servers: a line, not a traceback.
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import headline

    for option in ('--repeat', '--seconds'):
        for value in ('0', '-1', 'x'):
            with pytest.raises(SystemExit) as exited:
                headline.main([option, value])
            assert exited.value.code == 2
            said = capsys.readouterr().err
            assert 'a whole number, 1 or more' in said


def test_stress_retries():
    out = run('stress_retries.py', '--database', 'mysql')
    assert 'on mysql' in out and '(target: met)' in out
    out = run('stress_retries.py')
    assert 'write_concurrency 4, back-off off' in out
    assert '(target: met)' in out


def test_stress_silent_replica():
    for database in ('postgresql', 'mysql'):
        out = run('stress_silent_replica.py', '--database', database)
        assert 'failed: 0\n' in out, out
