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


def _in_api(name):
    # In a directive (.. autoclass:: pyramid_dbtune.Name) or a role.
    pattern = rf'(::\s*|`~?)pyramid_dbtune\.{re.escape(name)}\b'
    return re.search(pattern, _text('api.rst'))


def _settings_table():
    """The settings page's table, as docs/conf.py makes it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location('conf', DOCS / 'conf.py')
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    return '\n'.join(conf.settings_table())


def _on_settings_page(key):
    return (
        '.. dbtune-settings::' in _text('settings.rst')
        and f'``{key}``' in _settings_table()
    )


def test_every_setting_says_what_it_does():
    for setting in settings.TABLE:
        assert len(setting.doc.split()) >= 5, setting.name


@pytest.mark.parametrize('name', pyramid_dbtune.__all__)
def test_every_public_name_is_in_the_api_reference(name):
    assert _in_api(name), (
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
    assert _on_settings_page(key), (
        f'{key} is a setting but not in docs/settings.rst'
    )


def test_the_checks_can_fail():
    assert not _in_api('NoSuchName')
    assert not _on_settings_page('dbtune.no_such_setting')


def test_buildout_is_in_the_readme_and_the_docs():
    readme = (DOCS.parent / 'README.rst').read_text(encoding='utf-8')
    for text in (readme, _text('deployment.rst')):
        assert 'pip install zc.buildout' in text
        assert 'bin/pytest' in text


SUBPACKAGES = sorted(
    p.parent.name
    for p in Path(pyramid_dbtune.__file__).parent.glob('*/__init__.py')
)


@pytest.mark.parametrize('name', SUBPACKAGES)
def test_every_subpackage_opens_with_one_line_of_what_it_is(name):
    import importlib

    text = importlib.import_module(f'pyramid_dbtune.{name}').__doc__
    first, *rest = text.split('\n')
    assert first.endswith('.') and (not rest or not rest[0].strip()), name
