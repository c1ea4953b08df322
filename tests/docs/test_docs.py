"""The documentation site: it builds with warnings as errors, documents every
public name, every internal link resolves, and a headless browser renders
it (furo's JavaScript included).

Needs ``pip install -r docs/requirements.txt`` (skipped without Sphinx or
furo); the browser check needs a Chromium binary (skipped without one).
"""
import importlib
import inspect
import os
import os.path as osp
import re
import shutil
import subprocess
import sys
import time
from html import unescape
from html.parser import HTMLParser
from typing import Dict, List, Set, Tuple
from urllib.parse import unquote, urlsplit

import pytest

pytest.importorskip('sphinx', reason='Sphinx is not installed (pip install '
                    '-r docs/requirements.txt)')
pytest.importorskip('furo', reason='the furo theme is not installed (pip '
                    'install -r docs/requirements.txt)')

# This file is in tests/docs/.
ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
DOCS = osp.join(ROOT, 'docs')

# The pages the site is made of (index.rst's toctree and the reference).
PAGES = ['index', 'install', 'get_started', 'tutorials/index', 'cheatsheet',
         'trust', 'cli', 'benchmarks', 'reference/index',
         'reference/internals']
STAGES = ['utils', 'partition', 'comm', 'graph', 'nn', 'loader', 'train',
          'datasets', 'cli']
# Every module whose ``__all__`` the reference documents.
REFERENCE_MODULES = [
    'pyg_sar', 'pyg_sar.partition', 'pyg_sar.comm', 'pyg_sar.graph',
    'pyg_sar.graph.link', 'pyg_sar.nn', 'pyg_sar.nn.conv', 'pyg_sar.nn.norm',
    'pyg_sar.loader', 'pyg_sar.train', 'pyg_sar.train.checkpoint',
    'pyg_sar.datasets', 'pyg_sar.cli', 'pyg_sar.utils.compat',
]
BROWSERS = ('chromium', 'chromium-browser', 'google-chrome',
            'google-chrome-stable')


class _Page(HTMLParser):
    """The ids (anchors) and the links of one HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: Set[str] = set()
        self.links: List[str] = []

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, str]]):
        attrs = dict(attrs)
        for key in ('id', 'name') if tag == 'a' else ('id', ):
            if attrs.get(key):
                self.ids.add(attrs[key])
        for key in ('href', 'src'):
            if attrs.get(key) is not None:
                self.links.append(attrs[key])


@pytest.fixture(scope='module')
def site(tmp_path_factory) -> Tuple[str, float]:
    """The HTML site, built from docs/ with warnings as errors, and the
    seconds the build took."""
    out = tmp_path_factory.mktemp('docs')
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, '-m', 'sphinx', '-W', '--keep-going', '-q',
         '-b', 'html', '-d', str(out / 'doctrees'), DOCS, str(out / 'html')],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, (
        f'the docs build failed (warnings are errors):\n{proc.stdout}\n'
        f'{proc.stderr}')
    return str(out / 'html'), seconds


def _parse(path: str) -> _Page:
    page = _Page()
    with open(path, encoding='utf-8') as f:
        page.feed(f.read())
    return page


def _html_files(html: str) -> Dict[str, _Page]:
    pages = {}
    for folder, _, files in os.walk(html):
        for name in files:
            if name.endswith('.html'):
                path = osp.join(folder, name)
                pages[osp.normpath(path)] = _parse(path)
    return pages


def test_build_has_every_page(site):
    html, seconds = site
    for page in PAGES + [f'reference/{stage}' for stage in STAGES]:
        assert osp.isfile(osp.join(html, f'{page}.html')), page
    print(f'docs built in {seconds:.1f} s')


def _public_names(module) -> List[str]:
    """``__all__``, else the classes and functions the module defines."""
    if hasattr(module, '__all__'):
        return list(module.__all__)
    return [name for name, obj in vars(module).items()
            if not name.startswith('_')
            and (inspect.isclass(obj) or inspect.isfunction(obj))
            and obj.__module__ == module.__name__]


def test_reference_documents_every_public_name(site):
    """Every name of every stage's ``__all__`` has an entry, under its own
    path or another public path of the same object."""
    html, _ = site
    ids: Set[str] = set()
    for page in _html_files(html).values():
        ids |= page.ids
    modules = {name: importlib.import_module(name)
               for name in REFERENCE_MODULES}
    missing = []
    for module_name, module in modules.items():
        for name in _public_names(module):
            obj = getattr(module, name)
            if inspect.ismodule(obj):
                found = f'module-{obj.__name__}' in ids
            else:
                found = any(f'{other}.{name}' in ids
                            for other, m in modules.items()
                            if getattr(m, name, None) is obj)
            if not found:
                missing.append(f'{module_name}.{name}')
    assert not missing, f'not in the package reference: {missing}'


def test_dist_graph_page_shows_the_user_api_only(site):
    """The DistGraph entry documents what users call; the methods the
    package uses internally (``DistGraph._doc_internal``) are only named."""
    from pyg_sar.graph import DistGraph
    html, _ = site
    ids = _parse(osp.join(html, 'reference', 'graph.html')).ids
    for name in ('to', 'fetch_nodes', 'reverse', 'layer_wise'):
        assert f'pyg_sar.graph.DistGraph.{name}' in ids, name
    for name in DistGraph._doc_internal:
        assert f'pyg_sar.graph.DistGraph.{name}' not in ids, name


def test_internals_are_on_their_own_page(site):
    """The communication plumbing is not on the stage's page but on the
    internals page, under the path the package reaches it by."""
    from pyg_sar.comm import PLUMBING
    html, _ = site
    stage = _parse(osp.join(html, 'reference', 'comm.html')).ids
    internals = _parse(osp.join(html, 'reference', 'internals.html')).ids
    for name, module in PLUMBING.items():
        assert f'pyg_sar.comm.{name}' not in stage, name
        if not module.endswith(f'.{name}'):  # (a module: not an entry)
            assert f'pyg_sar.comm.{name}' in internals, name


def test_cheatsheet_lists_every_conv_and_norm(site):
    import torch_geometric.nn.conv as conv
    import torch_geometric.nn.norm as norm
    from pyg_sar.nn.convert import REFUSAL_REASONS
    html, _ = site
    with open(osp.join(html, 'cheatsheet.html'), encoding='utf-8') as f:
        text = unescape(f.read()).replace('\u2019', "'")
    for name in conv.__all__:
        assert f'torch_geometric.nn.conv.{name}.html' in text, name
    for name in norm.__all__:
        assert f'torch_geometric.nn.norm.{name}.html' in text, name
    import torch_geometric.nn.models as models
    for name in models.__all__:
        if inspect.isclass(getattr(models, name)):
            assert f'torch_geometric.nn.models.{name}.html' in text, name
    for reason in set(REFUSAL_REASONS.values()):
        assert reason in text, reason
    from pyg_sar.nn import model_paths
    for reason in set(model_paths.MODEL_REFUSALS.values()):
        assert reason in text, reason
    for test in {**model_paths.MODELS_WITH_LAYERS_CONVERTED,
                 **model_paths.MODELS_PER_NODE}.values():
        assert test in text, test


# The README's layer bullets, by their opening words: the cheatsheet key
# (docs/_ext/pyg_sar_cheatsheet.py) each stands for, and whether it names
# every class on that path or a few.
README_BULLETS = {
    'on the SAR engine': ('engine', 'every'),
    'over whole neighborhoods': ('neighborhoods', 'some'),
    'distributed layers of their own': ('dedicated', 'every'),
    'containers whose inner layers convert': ('containers', 'every'),
    'plus the normalizations over all nodes': ('statistics', 'every'),
}


def _cheatsheet():
    sys.path.insert(0, osp.join(DOCS, '_ext'))
    try:
        return importlib.import_module('pyg_sar_cheatsheet')
    finally:
        sys.path.remove(osp.join(DOCS, '_ext'))


def test_readme_layers_agree_with_the_conversion_code():
    """The README is Markdown, outside the docs build: its counts and layer
    lists are checked against the classification the cheatsheet and the
    tutorials are generated from."""
    sheet = _cheatsheet()
    with open(osp.join(ROOT, 'README.md'), encoding='utf-8') as f:
        section = f.read().split('\n## Layers\n')[1].split('\n## ')[0]
    section = ' '.join(section.split())  # one line: bullets wrap
    converted, total = map(int, re.search(r'\*\*(\d+) of the (\d+)',
                                          section).groups())
    assert converted == len(sheet.layers('converted'))
    assert total == len(sheet.layers('convolutions'))
    refused = int(re.search(r'The other (\d+)', section).group(1))
    assert refused == len(sheet.layers('refused'))
    known = {name for key in sheet.KEYS for name in sheet.layers(key)}
    bullets = section.split(' - ')[1:]
    bullets[-1] = bullets[-1].split(' The other ')[0]
    assert len(bullets) == len(README_BULLETS), bullets
    for bullet in bullets:
        opening = next((o for o in README_BULLETS if bullet.startswith(o)),
                       None)
        assert opening, f'README bullet of no known path: {bullet[:60]}'
        key, how = README_BULLETS[opening]
        named = [n for n in re.findall(r'`([\w.]+)`', bullet) if n in known]
        path = sheet.layers(key)
        assert set(named) <= set(path), \
            f'README lists {set(named) - set(path)} under {opening!r}'
        if how == 'every':
            assert set(named) == set(path), \
                f'README leaves {set(path) - set(named)} out of {opening!r}'


def test_cli_page_lists_every_option(site):
    import argparse
    from pyg_sar.cli import build_parser
    html, _ = site
    with open(osp.join(html, 'cli.html'), encoding='utf-8') as f:
        text = f.read()
    parser = build_parser()
    subparsers = next(a for a in parser._actions
                      if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        assert f'id="pyg-sar-{name}"' in text, name
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ('-h', '--help'):
                    assert option in text, f'{name} {option}'


def test_internal_links_resolve(site):
    """Every link without a scheme (and every ``#anchor``) of every page
    points at a file of the site and an id in it."""
    html, _ = site
    pages = _html_files(html)
    broken = []
    for path, page in pages.items():
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith('//'):
                continue
            target = (osp.normpath(osp.join(osp.dirname(path),
                                            unquote(parts.path)))
                      if parts.path else path)
            if osp.isdir(target):
                target = osp.join(target, 'index.html')
            where = f'{osp.relpath(path, html)}: {link}'
            if not osp.exists(target):
                broken.append(f'{where} (no file)')
            elif parts.fragment and target.endswith('.html'):
                ids = (pages[target] if target in pages
                       else _parse(target)).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f'{where} (no anchor)')
    assert not broken, 'broken internal links:\n' + '\n'.join(broken)


def _browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip('no Chromium binary found (apt-get install chromium); the '
                'headless rendering check needs one')


def _rendered_dom(browser: str, page: str, tmp_path) -> str:
    """The DOM of ``page`` after Chromium ran its scripts."""
    profile = tmp_path / f'profile-{osp.basename(page)}'
    profile.mkdir()
    proc = subprocess.run(
        [browser, '--headless', '--no-sandbox', '--disable-gpu',
         '--disable-quic', '--no-first-run',
         '--disable-background-networking', '--disable-component-update',
         '--disable-sync', f'--user-data-dir={profile}',
         '--virtual-time-budget=2000', '--dump-dom', f'file://{page}'],
        capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.parametrize('page, heading, title', [
    ('index.html', 'pyg_sar', 'pyg_sar {version}'),
    ('reference/train.html', 'Training', 'Training - pyg_sar {version}'),
])
def test_browser_renders_page(site, page, heading, title, tmp_path):
    from pyg_sar import __version__
    browser = _browser()
    html, _ = site
    dom = _rendered_dom(browser, osp.join(html, page), tmp_path)
    # The page: its title and its heading.
    assert f'<title>{title.format(version=__version__)}</title>' in dom
    assert f'<h1>{heading}<' in dom
    # furo's navigation sidebar, with the site's sections.
    assert 'class="sidebar-tree"' in dom
    for section in ('Installation', 'Cheatsheet', 'Package reference',
                    'Command line'):
        assert f'>{section}</a>' in dom, section
    # A highlighted code block.
    assert '<div class="highlight"><pre>' in dom
    # furo's scripts ran: the page is no longer ``no-js`` and the theme
    # switcher gave the body its theme.
    assert 'class="no-js"' not in dom
    assert '<body data-theme="auto">' in dom
