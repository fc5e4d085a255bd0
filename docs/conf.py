"""Sphinx configuration for pyramid_dbtune's documentation."""

project = 'pyramid_dbtune'
copyright = '2026, the pyramid_dbtune developers'
extensions = [
    'sphinx.ext.autodoc',
    'sphinx.ext.intersphinx',
    'sphinx.ext.viewcode',
]
intersphinx_mapping = {}
exclude_patterns = ['_build']
autodoc_member_order = 'bysource'
html_theme = 'alabaster'
nitpicky = False


def settings_table():
    """The settings page's table, as reStructuredText, from the one table
    of settings in the code (``pyramid_dbtune.settings.TABLE``)."""
    from pyramid_dbtune.settings import PER_METHOD_DOCS, PREFIX, TABLE

    rows = [
        (f'``{PREFIX}{s.name}``', s.default_text, s.doc) for s in TABLE
    ] + [(f'``{PREFIX}{name}``', '—', doc) for name, doc in PER_METHOD_DOCS]
    lines = [
        '.. list-table::',
        '   :header-rows: 1',
        '   :widths: 30 15 55',
        '',
        '   * - setting',
        '     - default',
        '     - meaning',
    ]
    for name, default, doc in rows:
        lines += [f'   * - {name}', f'     - {default}', f'     - {doc}']
    return lines


def setup(app):
    from docutils import nodes
    from docutils.parsers.rst import Directive
    from docutils.statemachine import StringList

    class SettingsTable(Directive):
        """``.. dbtune-settings::``: the table of every setting."""

        def run(self):
            container = nodes.container()
            self.state.nested_parse(
                StringList(settings_table(), source='settings.TABLE'),
                self.content_offset,
                container,
            )
            return container.children

    app.add_directive('dbtune-settings', SettingsTable)
