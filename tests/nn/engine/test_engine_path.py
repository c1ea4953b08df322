"""The engine reads as a composition: the files one layer's forward and
backward run through, no class stacked from many bases, and no import that
exists for type checkers only (so the layout test's import graph, which
has no circle, is the whole graph)."""
import ast
import inspect
import os
import os.path as osp
import pkgutil
import importlib

import pytest
import torch

import pyg_sar
from _dist import run_workers

ROOT = osp.dirname(pyg_sar.__file__)

# What one SAGEConv forward and backward over 2 workers runs through: the
# layer, the layer base (with its linear helpers, and the check that sends a
# call without a DistGraph to the stock layer: nn/plain.py), the plan (the
# factory), the Function and its aggregator, the graph's transport and blocks, and the
# communication stage's primitives (one unit: ``pyg_sar.comm``). Leaf
# utilities (``pyg_sar.utils``: allocator trim, device capacity) are not
# counted. A new file on this path is a deliberate change of this list.
SAGE_PATH = {
    'nn/conv/sage_conv.py', 'nn/message_passing.py', 'nn/plain.py',
    'nn/engine/plan.py', 'nn/engine/function.py', 'nn/engine/sparse.py',
    'graph/transport.py', 'graph/blocks.py', 'comm',
}
# GAT adds self loops: the graph's cached self-loop view (dist_graph); its
# attention runs through the fused kernels (fused, kernels: the choice and
# the C++ extension's loader) on the online softmax it shares with the
# separate-operator path (attention, messages); the layer's FusedScore
# (spec) names the score's destination argument; its per-head scores are
# one product over the projected rows (functional: head_scores).
GAT_PATH = {
    'nn/conv/gat_conv.py', 'graph/dist_graph.py', 'nn/message_passing.py',
    'nn/plain.py', 'nn/engine/plan.py',
    'nn/engine/function.py', 'nn/engine/messages.py',
    'nn/engine/attention.py', 'nn/engine/fused.py',
    'nn/engine/kernels/__init__.py', 'nn/engine/kernels/cpu.py',
    'nn/engine/spec.py', 'nn/functional.py', 'graph/transport.py',
    'graph/blocks.py', 'comm',
}


def _files_run(rank, world_size, root, layer):
    import sys
    import threading
    part = pyg_sar.load_partition(root, rank)
    graph = pyg_sar.DistGraph(part)
    torch.manual_seed(0)
    conv = (pyg_sar.nn.SAGEConv(part.x.size(1), 8) if layer == 'sage' else
            pyg_sar.nn.GATConv(part.x.size(1), 8, heads=2))
    x = part.x.clone().requires_grad_()
    conv(x, graph).sum().backward()  # set-up work (caches) out of the way
    seen = set()

    def profile(frame, event, arg):
        if event == 'call':
            path = frame.f_code.co_filename
            if path.startswith(ROOT + os.sep):
                rel = osp.relpath(path, ROOT).replace(os.sep, '/')
                if rel.startswith('comm/'):
                    rel = 'comm'
                if not rel.startswith('utils/'):
                    seen.add(rel)

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        conv(x, graph).sum().backward()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return sorted(seen)


@pytest.mark.parametrize('layer,expected', [('sage', SAGE_PATH),
                                            ('gat', GAT_PATH)])
def test_one_layer_runs_through_few_files(layer, expected, tmp_path):
    from _graphs import hard_graph
    pyg_sar.partition_graph(hard_graph(), 2, str(tmp_path))
    for rank, files in enumerate(run_workers(_files_run, 2, str(tmp_path),
                                             layer)):
        assert set(files) == expected, (
            f'rank {rank}: {layer} runs through {sorted(files)}; expected '
            f'{sorted(expected)}')
    if layer == 'sage':  # eight, and the DistGraph check of nn/plain.py
        assert len(expected) <= 9


def _package_classes():
    for info in pkgutil.walk_packages([ROOT], 'pyg_sar.'):
        if info.name.startswith('pyg_sar.cli'):
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == info.name:
                yield cls


def test_no_class_has_more_than_three_bases():
    wide = [f'{cls.__module__}.{cls.__qualname__} '
            f'({len(cls.__bases__)} bases)' for cls in _package_classes()
            if len(cls.__bases__) > 3]
    assert not wide, wide


def test_engine_classes_compose_instead_of_mixing_in():
    # One aggregator per kind, each a single chain of bases.
    from pyg_sar.nn.engine import plan
    for kind, cls in plan.AGGREGATORS.items():
        assert all(len(c.__bases__) == 1 for c in cls.__mro__[:-1]), kind


def test_no_import_for_type_checkers_only():
    found = []
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith('.py'):
                path = osp.join(folder, name)
                tree = ast.parse(open(path).read(), path)
                for node in ast.walk(tree):
                    if isinstance(node, ast.If) and 'TYPE_CHECKING' in \
                            ast.unparse(node.test):
                        found.append(osp.relpath(path, ROOT))
    assert not found, found
