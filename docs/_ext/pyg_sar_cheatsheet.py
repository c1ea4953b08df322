"""The conversion cheatsheet, generated from the conversion code.

``.. pyg-sar-cheatsheet:: convolutions`` (or ``norms``, ``torch``, or
``models``) renders one table row per class of
``torch_geometric.nn.conv.__all__`` (of ``torch_geometric.nn.norm.__all__``;
of the ``torch.nn`` modules that :func:`pyg_sar.nn.to_distributed` knows; of
the classes of ``torch_geometric.nn.models.__all__``) with the path it takes
in pyg_sar. The classification reads the same registries, in the same order,
as ``pyg_sar.nn.convert._convert_one`` (the private ``_TWINS`` and
``_COMPOSITE`` included: they have no public view), and for models the
tables of :mod:`pyg_sar.nn.model_paths`, so the table cannot drift from what
``to_distributed`` does; a class it cannot place stops the build.

Prose takes its counts and lists of layers from the same classification,
so no page states a number the code does not: ``:pyg-sar-count:`KEY```
renders how many classes take a path and ``:pyg-sar-layers:`KEY``` names
them all, or ``:pyg-sar-layers:`KEY: A, B``` names a few and stops the
build if one of them takes another path. The keys are in :data:`KEYS`.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch_geometric.nn as pyg_nn
import torch_geometric.nn.conv as pyg_conv
import torch_geometric.nn.models as pyg_models
import torch_geometric.nn.norm as pyg_norm
from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.util.docutils import SphinxDirective
from sphinx.util.parsing import nested_parse_to_nodes

import pyg_sar.nn.conv as sar_conv
import pyg_sar.nn.models as sar_models
import pyg_sar.nn.norm as sar_norm
from pyg_sar.nn import convert, model_paths
from pyg_sar.nn.gcn_norm import NORMALIZED

# The paths, in the order the tables sum them up.
ENGINE = 'SAR engine'
NEIGHBORHOODS = 'whole neighborhoods'
INNER = 'inner layers converted'
DEDICATED = 'a distributed layer of its own'
STATISTICS = 'whole-graph statistics'
AS_IS = 'unchanged'
REFUSED = 'refused'
PATHS = (ENGINE, NEIGHBORHOODS, DEDICATED, INNER, STATISTICS, AS_IS,
         REFUSED)
# Containers: the layers inside are converted, each on its own path. Every
# other registered composite is a distributed layer written for its class
# (global attention, semantic attention, color tables, ...).
CONTAINERS = (pyg_nn.HeteroConv, pyg_nn.DirGNNConv)
BASE = 'base class'  # MessagePassing itself: not a layer, not counted
GCN_NORM = "GCN normalization with the halo's degrees"

EMPTY = '\u2014'  # an em dash, in a cell with nothing to say

CONV_CLASSES = {getattr(pyg_conv, name) for name in pyg_conv.__all__}
MODEL_CLASSES = [getattr(pyg_models, name) for name in pyg_models.__all__
                 if inspect.isclass(getattr(pyg_models, name))]

PYG_DOCS = 'https://pytorch-geometric.readthedocs.io/en/latest/generated'
TORCH_DOCS = 'https://docs.pytorch.org/docs/stable/generated'


@dataclasses.dataclass
class Row:
    stock: type
    path: str
    target: Optional[str] = None  # the pyg_sar class it becomes
    note: str = ''


def _public_subclass(module, stock: type) -> Optional[str]:
    """The dotted name of the public class of ``module`` (a pyg_sar
    package) that ``stock`` becomes: the one of the same name, else a
    subclass of ``stock``."""
    classes = {name: getattr(module, name) for name in module.__all__
               if inspect.isclass(getattr(module, name))}
    if stock.__name__ in classes:
        return f'{module.__name__}.{stock.__name__}'
    for name, cls in classes.items():
        if issubclass(cls, stock):
            return f'{module.__name__}.{name}'
    return None


def twin_class(row: Row) -> type:
    module, _, name = row.target.rpartition('.')
    return getattr(importlib.import_module(module), name)


def engine_kind(row: Row) -> str:
    """How the engine aggregates a twin's messages, from the twin's own
    declarations (``attention``, ``linear_message``: the attributes the
    engine reads to pick its path)."""
    twin = twin_class(row)
    if twin.attention:
        return 'attention path: an online softmax over every in-edge'
    if twin.linear_message:
        kind = 'linear path: sparse products'
        if 'aggr' in inspect.signature(row.stock.__init__).parameters:
            kind += ' for sum and mean, per-edge messages for max and min'
        return kind
    return 'per-edge messages'


def _required_target(module, stock: type, path: str) -> str:
    target = _public_subclass(module, stock)
    if target is None:
        raise ExtensionError(
            f'pyg-sar-cheatsheet: {stock.__name__} takes the path '
            f'{path!r} but {module.__name__} exports no class for it')
    return target


def classify(stock: type) -> Row:
    """The path ``to_distributed`` takes for an instance of ``stock``, in
    the order of ``pyg_sar.nn.convert._convert_one``."""
    name = stock.__name__
    if stock in convert._TWINS:
        row = Row(stock, ENGINE, _required_target(sar_conv, stock, ENGINE))
        row.note = '; '.join([engine_kind(row)] + (
            [GCN_NORM] if stock in NORMALIZED else []))
        return row
    if stock in sar_norm.NORM_CONVERTERS:
        return Row(stock, STATISTICS,
                   _required_target(sar_norm, stock, STATISTICS))
    if stock in NORMALIZED or stock in convert.ADAPTED:
        return Row(stock, NEIGHBORHOODS, _public_subclass(sar_conv, stock),
                   GCN_NORM if stock in NORMALIZED else '')
    if stock in CONTAINERS:
        return Row(stock, INNER, _required_target(sar_conv, stock, INNER))
    if stock in convert._COMPOSITE:
        return Row(stock, DEDICATED,
                   _required_target(sar_conv, stock, DEDICATED))
    if stock in convert.convertible():
        raise ExtensionError(
            f'pyg-sar-cheatsheet: to_distributed converts {name}, but the '
            f'cheatsheet does not know how (see pyg_sar.nn.convert)')
    if stock is pyg_nn.MessagePassing:
        return Row(stock, BASE, 'pyg_sar.nn.DistMessagePassing',
                   'a layer of your own subclasses it instead')
    mixing = tuple(sar_norm.NODE_MIXING_WITHOUT_DIST_VERSION)
    if issubclass(stock, (pyg_nn.MessagePassing,) + convert.REFUSED
                  + mixing) or stock in CONV_CLASSES:
        reason = convert.REFUSAL_REASONS.get(name)
        if reason is None:
            reason = ('mixes node rows, no distributed version'
                      if issubclass(stock, mixing)
                      else 'no distributed version yet')
        return Row(stock, REFUSED, None, reason)
    return Row(stock, AS_IS)


def classify_model(stock: type) -> Row:
    """The path ``to_distributed`` takes for a model of
    ``torch_geometric.nn.models``: a distributed class of its own, a
    refusal, its layers converted, or unchanged (per node), from the
    registries of :mod:`pyg_sar.nn.convert` and :mod:`pyg_sar.nn.model_paths`.
    """
    if stock in convert._COMPOSITE:
        return Row(stock, DEDICATED,
                   _required_target(sar_models, stock, DEDICATED))
    if stock in model_paths.MODEL_REFUSALS:
        return Row(stock, REFUSED, None, model_paths.MODEL_REFUSALS[stock])
    if stock in model_paths.MODELS_WITH_LAYERS_CONVERTED:
        test = model_paths.MODELS_WITH_LAYERS_CONVERTED[stock]
        return Row(stock, INNER, None, f'exact: checked by ``{test}``')
    if stock in model_paths.MODELS_PER_NODE:
        test = model_paths.MODELS_PER_NODE[stock]
        return Row(stock, AS_IS, None,
                   f'reads no graph: per node; exact: checked by ``{test}``')
    raise ExtensionError(
        f'pyg-sar-cheatsheet: the model {stock.__name__} has no place in '
        f'pyg_sar.nn.model_paths (converted, per node or refused)')


def _rows(kind: str) -> Tuple[List[Row], str]:
    if kind == 'models':
        return ([classify_model(c) for c in MODEL_CLASSES],
                'classes of ``torch_geometric.nn.models``')
    if kind == 'convolutions':
        classes = [getattr(pyg_conv, n) for n in pyg_conv.__all__]
        what = 'layers of ``torch_geometric.nn.conv``'
    elif kind == 'norms':
        classes = [getattr(pyg_norm, n) for n in pyg_norm.__all__]
        what = 'classes of ``torch_geometric.nn.norm``'
    elif kind == 'torch':
        known = (list(sar_norm.NORM_CONVERTERS)
                 + list(sar_norm.NODE_MIXING_WITHOUT_DIST_VERSION))
        classes = [c for c in known
                   if not c.__module__.startswith('torch_geometric.')]
        what = '``torch.nn`` modules ``to_distributed`` knows'
    else:
        raise ExtensionError(f'pyg-sar-cheatsheet: unknown table {kind!r} '
                             "(convolutions, norms, torch or models)")
    return [classify(c) for c in classes], what


@functools.lru_cache(maxsize=None)
def _all_rows(kind: str) -> Tuple[Row, ...]:
    return tuple(_rows(kind)[0])


def _on(path: str, kinds=('convolutions', )) -> Callable[[], List[Row]]:
    return lambda: [r for k in kinds for r in _all_rows(k) if r.path == path]


def _engine(word: str) -> Callable[[], List[Row]]:
    return lambda: [r for r in _on(ENGINE)()
                    if engine_kind(r).startswith(word)]


# The keys of :pyg-sar-count: and :pyg-sar-layers:, each the rows (stock
# classes) it stands for.
KEYS: Dict[str, Callable[[], List[Row]]] = {
    'engine': _on(ENGINE),
    'engine-linear': _engine('linear'),
    'engine-attention': _engine('attention'),
    'neighborhoods': _on(NEIGHBORHOODS),
    'dedicated': _on(DEDICATED),
    'containers': _on(INNER),
    'statistics': _on(STATISTICS, ('norms', 'torch')),
    'refused': _on(REFUSED),
    'converted': lambda: [r for r in _all_rows('convolutions')
                          if r.path in (ENGINE, NEIGHBORHOODS, DEDICATED,
                                        INNER)],
    'convolutions': lambda: [r for r in _all_rows('convolutions')
                             if r.path != BASE],
}


def display_name(stock: type) -> str:
    """``GCNConv``; a ``torch.nn`` module with its package."""
    if stock.__module__.startswith('torch_geometric.'):
        return stock.__name__
    return f'torch.nn.{stock.__name__}'


def layers(key: str) -> List[str]:
    """The names of the classes on ``key`` (see :data:`KEYS`), in table
    order."""
    if key not in KEYS:
        raise KeyError(f'unknown key {key!r} (one of {sorted(KEYS)})')
    return [display_name(r.stock) for r in KEYS[key]()]


def _count_role(name, rawtext, text, lineno, inliner, options=None,
                content=None):
    key = text.strip()
    if key not in KEYS:
        msg = inliner.reporter.error(
            f'pyg-sar-count: unknown key {key!r} (one of {sorted(KEYS)})',
            line=lineno)
        return [inliner.problematic(rawtext, rawtext, msg)], [msg]
    return [nodes.Text(str(len(KEYS[key]())))], []


def _layers_role(name, rawtext, text, lineno, inliner, options=None,
                 content=None):
    key, _, wanted = text.partition(':')
    key = key.strip()
    if key not in KEYS:
        msg = inliner.reporter.error(
            f'pyg-sar-layers: unknown key {key!r} (one of {sorted(KEYS)})',
            line=lineno)
        return [inliner.problematic(rawtext, rawtext, msg)], [msg]
    names = layers(key)
    if wanted.strip():
        chosen = [w.strip() for w in wanted.split(',') if w.strip()]
        stray = [w for w in chosen if w not in names]
        if stray:
            msg = inliner.reporter.error(
                f'pyg-sar-layers: {", ".join(stray)} not on the path '
                f'{key!r} (it has {", ".join(names)})', line=lineno)
            return [inliner.problematic(rawtext, rawtext, msg)], [msg]
        names = chosen
    out: List[nodes.Node] = []
    for k, n in enumerate(names):
        if k:
            out.append(nodes.Text(' and ' if k == len(names) - 1 and
                                  not wanted.strip() else ', '))
        out.append(nodes.literal(n, n))
    return out, []


def _stock_link(stock: type) -> str:
    """The stock class, linked to its page in PyG's (torch's) docs."""
    if stock.__module__.startswith('torch_geometric.'):
        package = ('torch_geometric.nn.conv' if stock in CONV_CLASSES
                   else 'torch_geometric.nn.models' if stock in MODEL_CLASSES
                   else 'torch_geometric.nn.norm')
        url = f'{PYG_DOCS}/{package}.{stock.__name__}.html'
    else:
        url = f'{TORCH_DOCS}/torch.nn.{stock.__name__}.html'
    return f'`{stock.__name__} <{url}>`__'


class CheatsheetDirective(SphinxDirective):
    """``.. pyg-sar-cheatsheet:: convolutions|norms|torch|models``"""

    required_arguments = 1

    def run(self) -> List[nodes.Node]:
        rows, what = _rows(self.arguments[0])
        counts = {path: sum(r.path == path for r in rows) for path in PATHS}
        summary = ', '.join(f'{n} {path}' for path, n in counts.items() if n)
        lines = [f'{sum(counts.values())} {what}: {summary}.', '',
                 '.. list-table::', '   :header-rows: 1',
                 '   :widths: 22 22 56',
                 '   :class: pyg-sar-cheatsheet', '',
                 '   * - Stock class', '     - Path', '     - In pyg_sar']
        for row in rows:
            cell = []
            if row.target:
                cell.append(f':class:`~{row.target}`')
            if row.note:
                cell.append(row.note)
            lines += [f'   * - {_stock_link(row.stock)}',
                      f'     - {row.path}',
                      f'     - {": ".join(cell) or EMPTY}']
        source = f'<pyg-sar-cheatsheet {self.arguments[0]}>'
        return nested_parse_to_nodes(self.state,
                                     StringList(lines, source=source))


def setup(app: Sphinx) -> Dict[str, Any]:
    app.add_directive('pyg-sar-cheatsheet', CheatsheetDirective)
    app.add_role('pyg-sar-count', _count_role)
    app.add_role('pyg-sar-layers', _layers_role)
    return {'version': '1.0', 'parallel_read_safe': True,
            'parallel_write_safe': True}
