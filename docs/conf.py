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
