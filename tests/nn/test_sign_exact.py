"""``pyg_sar.nn.sign_features`` computes what
``torch_geometric.transforms.SIGN`` stores (``x1`` ... ``xK``), at world
sizes 1-4, in every mode, with and without chunking and edge weights, in
float32 and float64, on a graph with self loops, duplicate edges, isolated
nodes and a hub whose in-edges span all parts; and ``examples/sign_cora.py``'s
training on those features follows the single-process loss curve on the
transform's features (the last part holding no training node).
"""
import argparse
import copy
import importlib.util
import os.path as osp
import sys

import pytest
import torch
from torch_geometric.transforms import SIGN

import pyg_sar
from pyg_sar.nn import sign_features
from _dist import run_workers
from _graphs import (hard_graph, last_part_untrained,
                     last_rank_untrained)

# This file is in tests/<folder>/.
EXAMPLES = osp.join(osp.dirname(osp.abspath(__file__)), '..', '..',
                    'examples')
MODES = ('sar', 'sa', 'one_shot')
CHUNK = 19
K = 3
EPOCHS = 8


def example():
    """``examples/sign_cora.py`` as a module (it imports ``cora_workers``,
    its neighbour)."""
    spec = importlib.util.spec_from_file_location(
        'example_sign_cora', osp.join(EXAMPLES, 'sign_cora.py'))
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, EXAMPLES)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(EXAMPLES)
    return module


def fit_args():
    return argparse.Namespace(lr=0.01, weight_decay=5e-3, epochs=EPOCHS)


def masks_of(store, train_mask):
    return {'train': train_mask, 'val': store.val_mask,
            'test': store.test_mask}


def _worker(rank, world_size, root):
    part = pyg_sar.load_partition(root, rank)
    results = {'ids': part.orig_ids}
    for mode in MODES:
        for chunk in (None, CHUNK):
            graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk)
            for weighted in (False, True):
                for dtype in (torch.float32, torch.float64):
                    weight = part.edge_weight if weighted else None
                    with torch.no_grad():
                        xs = sign_features(part.x.to(dtype), graph, K,
                                           edge_weight=weight)
                    results[(mode, chunk, weighted, dtype)] = xs
    # The example's training, from the same initial weights everywhere.
    sign = example()
    graph = pyg_sar.DistGraph(part)
    x = sign.precompute(part.x, graph, K)
    torch.manual_seed(7)
    model = sign.mlp(x.size(1), 16, 3)
    pyg_sar.sync_params(model)
    train = last_rank_untrained(part.train_mask, rank, world_size)
    history = sign.fit(model, x, part.y, masks_of(part, train), fit_args(),
                       count=pyg_sar.global_count,
                       reduce=pyg_sar.all_reduce_grads,
                       total=lambda t: pyg_sar.comm.all_reduce(t))
    results['curve'] = [row[:3] for row in history]
    return results


def reference(data, weighted, dtype):
    data = copy.copy(data)
    data.x = data.x.to(dtype)
    if weighted:
        data.edge_weight = data.edge_weight.to(dtype)
    elif dtype == torch.float32:
        del data.edge_weight  # the transform's own unit weights
    else:  # the transform's unit weights are float32, refused with float64
        data.edge_weight = torch.ones(data.num_edges, dtype=dtype)
    data = SIGN(K)(data)
    return [data[f'x{k}'] for k in range(1, K + 1)]


@pytest.mark.parametrize('world_size', [1, 2, 3, 4])
def test_sign_features_and_training_equal_single_process(world_size,
                                                         tmp_path):
    data = hard_graph()
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, world_size, root, progress=False)
    results = run_workers(_worker, world_size, root, timeout_s=240)
    ids = torch.cat([r['ids'] for r in results])
    for weighted in (False, True):
        for dtype in (torch.float32, torch.float64):
            expected = reference(data, weighted, dtype)
            tol = 1e-5 if dtype == torch.float32 else 1e-12
            for mode in MODES:
                for chunk in (None, CHUNK):
                    key = (mode, chunk, weighted, dtype)
                    for k in range(K):
                        got = torch.cat([r[key][k] for r in results])
                        assert got.dtype == dtype
                        torch.testing.assert_close(
                            got, expected[k][ids], rtol=tol, atol=tol,
                            msg=lambda m: f'x{k + 1} {key} world='
                            f'{world_size}: {m}')

    sign = example()
    x = torch.cat([data.x] + reference(data, False, torch.float32), dim=-1)
    torch.manual_seed(7)
    model = sign.mlp(x.size(1), 16, 3)
    train = last_part_untrained(data.train_mask, root, world_size)
    single = sign.fit(model, x, data.y, masks_of(data, train), fit_args())
    expected = torch.tensor([row[:3] for row in single])
    assert expected[-1, 0] < expected[0, 0]  # it trains
    for rank, r in enumerate(results):
        torch.testing.assert_close(
            torch.tensor(r['curve']), expected, rtol=1e-5, atol=1e-6,
            msg=lambda m: f'loss/val/test curve, rank {rank}: {m}')


def test_sign_features_refuses_what_it_cannot_compute(hard_part):
    data, part = hard_part
    graph = pyg_sar.DistGraph(part)
    with pytest.raises(ValueError, match='K must be a positive int'):
        sign_features(part.x, graph, 0)
    with pytest.raises(ValueError, match='one value per edge'):
        sign_features(part.x, graph, 2, edge_weight=part.edge_weight[1:])
    with pytest.raises(ValueError, match='rows but the graph has'):
        sign_features(part.x[1:], graph, 2)
    with pytest.raises(TypeError, match='transforms.SIGN'):
        sign_features(data.x, data.edge_index, 2)
