"""Every public name and every setting is in the docs.

The lists are read from the code (``__all__`` and ``settings.TABLE``), so
a name or a setting added later without docs fails here.
"""

import re
from pathlib import Path

import pytest

import pyramid_dbtune
from pyramid_dbtune import settings

DOCS = Path(__file__).parents[1] / 'docs'


def _text(*pages):
    paths = [DOCS / p for p in pages] if pages else DOCS.glob('*.rst')
    return '\n'.join(p.read_text(encoding='utf-8') for p in sorted(paths))


@pytest.mark.parametrize('name', pyramid_dbtune.__all__)
def test_every_public_name_is_in_the_api_reference(name):
    # In a directive (.. autoclass:: pyramid_dbtune.Name) or a role.
    pattern = rf'(::\s*|`~?)pyramid_dbtune\.{re.escape(name)}\b'
    assert re.search(pattern, _text('api.rst')), (
        f'pyramid_dbtune.{name} is public but not in docs/api.rst'
    )


@pytest.mark.parametrize(
    'key',
    [settings.PREFIX + s.name for s in settings.TABLE]
    + [
        settings.PREFIX + prefix + '<method>'
        for prefix in (settings.CACHE_TIME_PREFIX, settings.INVALIDATE_PREFIX)
    ],
)
def test_every_setting_is_on_the_settings_page(key):
    assert f'``{key}``' in _text('settings.rst'), (
        f'{key} is a setting but not in docs/settings.rst'
    )


def test_the_checks_can_fail():
    assert not re.search(r'pyramid_dbtune\.NoSuchName\b', _text())
    assert '``dbtune.no_such_setting``' not in _text('settings.rst')
