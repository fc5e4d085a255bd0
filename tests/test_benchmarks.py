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
