"""The benchmarks still run. They assert nothing about time: figures come
from running them, and are printed, never tested."""

import subprocess
import sys
from pathlib import Path

from conftest import IN_CI

BENCHMARKS = Path(__file__).parents[1] / 'benchmarks'


def test_bench_cache_runs_and_prints_its_ratios():
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / 'bench_cache.py'), '--quick'],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert 'dogpile hit / our hit = ' in done.stdout
    assert 'SQLite query / our hit = ' in done.stdout
    if IN_CI:
        assert 'skipped' not in done.stdout


def run_benchmark(*args):
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / 'bench_fastpath.py'), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_bench_fastpath_runs_in_process():
    out = run_benchmark('--quick')
    for name in (
        'bare WSGI callable',
        'fastpath filter',
        'dbtune.fast_paths',
        'URL-dispatch view',
        'full stack',
    ):
        assert name in out
    assert 'filter adds' in out and 'include-only costs' in out


def test_bench_fastpath_runs_over_http():
    # Installs wrk when missing, starts waitress and gunicorn on loopback.
    out = run_benchmark('--quick', '--http')
    assert 'Over HTTP' in out
    assert 'waitress: filter within' in out
    assert 'gunicorn: filter within' in out


def test_bench_rwsplit_runs():
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / 'bench_rwsplit.py'), '--quick'],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'parallel reads = ' in done.stdout
    assert '8 reads, one shared connection' in done.stdout


def test_bench_memcached_runs():
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / 'bench_memcached.py'), '--quick'],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'ours / raw get = ' in done.stdout
