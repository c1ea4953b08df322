"""Sphinx configuration of the pyg_sar documentation.

Build with ``python -m sphinx -W --keep-going -b html docs docs/_build/html``
(``make -C docs html``). Everything is generated from the installed package:
the API reference from its docstrings, the conversion cheatsheet from
:mod:`pyg_sar.nn.convert` and the command-line reference from
:func:`pyg_sar.cli.build_parser` (the extensions in ``docs/_ext``); the
examples' output comes from ``docs/_generated``, written by running them.
"""
import datetime
import os
import sys

DOCS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(DOCS, '_ext'))
# The package itself, when it is not installed.
sys.path.insert(0, os.path.dirname(DOCS))

import pyg_sar  # noqa: E402

# -- Project -----------------------------------------------------------------

project = 'pyg_sar'
author = 'pyg_sar contributors'
copyright = f'{datetime.date.today().year}, {author}'
version = pyg_sar.__version__
release = pyg_sar.__version__

# -- General -----------------------------------------------------------------

extensions = [
    'sphinx.ext.autodoc',
    'sphinx.ext.autosummary',
    'sphinx.ext.napoleon',
    'sphinx.ext.viewcode',
    'sphinx.ext.mathjax',
    # docs/_ext
    'pyg_sar_api',
    'pyg_sar_cheatsheet',
    'pyg_sar_cli',
    'pyg_sar_results',
    'pyg_sar_runs',
]

exclude_patterns = ['_build', 'Thumbs.db', '.DS_Store']
templates_path = []
nitpicky = False
# The docs build offline: nothing is fetched (no intersphinx mapping) and
# ``linkcheck`` leaves external links alone; tests/docs/test_docs.py checks
# every internal link of the built HTML instead.
linkcheck_ignore = [r'https?://.*']

# -- autodoc / autosummary / napoleon ----------------------------------------

autodoc_member_order = 'bysource'
autodoc_typehints = 'signature'
# Most classes subclass PyG or torch modules: their own docstrings only,
# not the inherited ones of ``forward``, ``reset_parameters``, ...
autodoc_inherit_docstrings = False
autodoc_preserve_defaults = True
autosummary_generate = False
add_module_names = False

napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# PyG's ``Shapes:`` section (input and output shapes of a layer).
napoleon_custom_sections = ['Shapes']

# -- HTML --------------------------------------------------------------------

html_theme = 'furo'
html_title = f'pyg_sar {release}'
html_short_title = 'pyg_sar'
html_static_path = []
html_theme_options = {
    'navigation_with_keys': True,
}
