"""``examples/appnp_cora.py``: PyG's APPNP model converted with
``to_distributed`` trains as it does in one process (losses, accuracies and
the final logits, at world sizes 1-3, on a graph with self loops, duplicate
edges, isolated nodes, a hub whose in-edges span all parts and a part
without training nodes; the trained model's logits in every mode, chunked
or not). Its script gives the stock
model to ``sync_params`` before converting a copy: the copy's layers must
not inherit the refusal that ``sync_params`` gives stock layers.
"""
import argparse
import copy
import importlib.util
import os.path as osp
import sys

import pytest
import torch
from torch_geometric.nn import APPNP, GCNConv

import pyg_sar
from _dist import run_workers
from _graphs import (hard_graph, last_part_untrained,
                     last_rank_untrained)

# This file is in tests/<folder>/.
EXAMPLES = osp.join(osp.dirname(osp.abspath(__file__)), '..', '..',
                    'examples')
MODES = ('sar', 'sa', 'one_shot')
CHUNK = 19
EPOCHS = 8


def example():
    """``examples/appnp_cora.py`` as a module (it imports ``cora_workers``,
    its neighbour)."""
    spec = importlib.util.spec_from_file_location(
        'example_appnp_cora', osp.join(EXAMPLES, 'appnp_cora.py'))
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


def make_net(module, num_features):
    torch.manual_seed(5)
    return module.Net(num_features, 16, 3, K=10, alpha=0.1)


def _worker(rank, world_size, root):
    appnp = example()
    part = pyg_sar.load_partition(root, rank)
    stock = make_net(appnp, part.x.size(1))
    pyg_sar.sync_params(stock)  # as the example: synced, then converted
    model = pyg_sar.nn.to_distributed(copy.deepcopy(stock))
    graph = pyg_sar.DistGraph(part)
    train = last_rank_untrained(part.train_mask, rank, world_size)
    history = appnp.fit(model, part.x, graph, part.y, masks_of(part, train),
                        fit_args(), count=pyg_sar.global_count,
                        reduce=pyg_sar.all_reduce_grads,
                        total=lambda t: pyg_sar.comm.all_reduce(t))
    results = {'ids': part.orig_ids, 'curve': [r[:3] for r in history],
               'state': {k: v.clone() for k, v in model.state_dict().items()}}
    model.eval()
    with torch.no_grad():
        for mode in MODES:
            for chunk in (None, CHUNK):
                g = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk)
                results[(mode, chunk)] = model(part.x, g)
    return results


@pytest.mark.parametrize('world_size', [1, 2, 3])
def test_appnp_example_trains_as_one_process(world_size, tmp_path):
    data = hard_graph()
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, world_size, root, progress=False)
    results = run_workers(_worker, world_size, root, timeout_s=240)
    ids = torch.cat([r['ids'] for r in results])

    appnp = example()
    stock = make_net(appnp, data.num_features)
    train = last_part_untrained(data.train_mask, root, world_size)
    single = appnp.fit(stock, data.x, data.edge_index, data.y,
                       masks_of(data, train), fit_args())
    expected = torch.tensor([r[:3] for r in single])
    assert expected[-1, 0] < expected[0, 0]  # it trains
    for rank, r in enumerate(results):
        torch.testing.assert_close(
            torch.tensor(r['curve']), expected, rtol=1e-5, atol=1e-6,
            msg=lambda m: f'loss/val/test curve, rank {rank}: {m}')
        for key, value in stock.state_dict().items():  # the same weights
            torch.testing.assert_close(r['state'][key], value, rtol=1e-4,
                                       atol=1e-6)
    stock.eval()
    with torch.no_grad():
        logits = stock(data.x, data.edge_index)[ids]
    for mode in MODES:
        for chunk in (None, CHUNK):
            got = torch.cat([r[(mode, chunk)] for r in results])
            torch.testing.assert_close(
                got, logits, rtol=1e-4, atol=1e-5,
                msg=lambda m: f'logits mode={mode} chunk={chunk} '
                f'world={world_size}: {m}')
            assert torch.equal(got.argmax(-1), logits.argmax(-1))


@pytest.mark.parametrize('layer', [lambda: APPNP(3, 0.1),
                                   lambda: GCNConv(6, 4)],
                         ids=['APPNP', 'GCNConv'])
def test_synced_then_converted_layers_run_on_a_dist_graph(hard_part, layer):
    """``sync_params`` guards the stock model; a converted copy runs, and
    the stock model still refuses the graph, naming the fix."""
    data, part = hard_part
    graph = pyg_sar.DistGraph(part)
    stock = torch.nn.ModuleList([layer()])
    pyg_sar.sync_params(stock)
    converted = pyg_sar.nn.to_distributed(copy.deepcopy(stock))
    with torch.no_grad():
        out = converted[0](part.x, graph)
        expected = stock[0](data.x, data.edge_index)[part.orig_ids]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match='to_distributed'):
        stock[0](part.x, graph)
