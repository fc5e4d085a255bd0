"""What ``pip install`` builds: every data file, and no warning of ours."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def build(project, into):
    done = subprocess.run(
        [sys.executable, '-m', 'pip', 'wheel', '--no-deps',
         '--wheel-dir', str(into), str(project)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr, next(into.glob('*.whl'))


@pytest.mark.parametrize(
    'project, data',
    [
        (ROOT, ['pyramid_dbtune/ops/templates/dashboard.html',
                'pyramid_dbtune/configure.zcml',
                'pyramid_dbtune/meta.zcml',
                'pyramid_dbtune/zope/configure.zcml',
                'pyramid_dbtune/zope/meta.zcml']),
        (ROOT / 'examples/accommodation',
         ['accommodation/sql/search_properties.sql']),
    ],
)  # fmt: skip
def test_a_wheel_holds_its_data_and_builds_without_a_warning(
    project, data, tmp_path
):
    output, wheel = build(project, tmp_path)
    assert 'Warning' not in output, output
    names = zipfile.ZipFile(wheel).namelist()
    assert [name for name in data if name not in names] == []
