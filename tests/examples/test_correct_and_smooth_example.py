"""``examples/correct_and_smooth_cora.py``: the base MLP trained with the
distributed loss, then PyG's ``CorrectAndSmooth`` converted with
``to_distributed``, give what one process gives, at world sizes 1-3 on a
synthetic homophilous graph: the base model's losses and accuracies per
epoch, its soft predictions, the corrected and the smoothed predictions
(with autoscale, whose average error spans the training nodes of all
workers, the last holding none, and with a fixed scale) and their accuracies counted over all
workers.
"""
import argparse
import importlib.util
import os.path as osp
import sys

import pytest
import torch

import pyg_sar
from _dist import run_workers
from _graphs import last_part_untrained, last_rank_untrained

# This file is in tests/<folder>/.
EXAMPLES = osp.join(osp.dirname(osp.abspath(__file__)), '..', '..',
                    'examples')
EPOCHS = 8
SCALES = (None, 5.0)  # autoscale, a fixed scale


def example():
    """``examples/correct_and_smooth_cora.py`` as a module (it imports
    ``cora_workers``, its neighbour)."""
    spec = importlib.util.spec_from_file_location(
        'example_correct_and_smooth_cora',
        osp.join(EXAMPLES, 'correct_and_smooth_cora.py'))
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, EXAMPLES)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(EXAMPLES)
    return module


def graph():
    return pyg_sar.datasets.synthetic_graph(
        num_nodes=400, avg_degree=6, num_features=12, num_classes=4, seed=3,
        feature_margin=1.0, train_ratio=0.2, val_ratio=0.2)


def args_for(scale):
    return argparse.Namespace(lr=0.01, weight_decay=5e-3, epochs=EPOCHS,
                              correction_layers=4, correction_alpha=1.0,
                              smoothing_layers=5, smoothing_alpha=0.8,
                              scale=scale)


def masks_of(store, train_mask):
    return {'train': train_mask, 'val': store.val_mask,
            'test': store.test_mask}


def make_mlp(module, num_features):
    torch.manual_seed(5)
    return module.mlp(num_features, 16, 4)


def run(module, x, y, masks, edge_index, model, **dist):
    """The example's steps: the base model's curve and ``y_soft``, then per
    scale the corrected and smoothed predictions and all accuracies."""
    count = dist.get('count', lambda n: n)
    total = dist.get('total', lambda t: t)
    history, y_soft = module.fit(model, x, y, masks, args_for(None), **dist)
    results = {'curve': [r[:3] for r in history], 'y_soft': y_soft,
               'base_acc': module.accuracy(y_soft, y, masks, count, total)}
    for scale in SCALES:
        post = module.post_processor(args_for(scale))
        if dist:
            post = pyg_sar.nn.to_distributed(post)
        outs = module.correct_and_smooth(post, y_soft, y, masks['train'],
                                         edge_index)
        results[scale] = (outs, [module.accuracy(o, y, masks, count, total)
                                 for o in outs])
    return results


def _worker(rank, world_size, root):
    module = example()
    part = pyg_sar.load_partition(root, rank)
    model = make_mlp(module, part.x.size(1))
    pyg_sar.sync_params(model)
    train = last_rank_untrained(part.train_mask, rank, world_size)
    results = run(module, part.x, part.y, masks_of(part, train),
                  pyg_sar.DistGraph(part), model,
                  count=pyg_sar.global_count,
                  reduce=pyg_sar.all_reduce_grads,
                  total=lambda t: pyg_sar.comm.all_reduce(t))
    results['ids'] = part.orig_ids
    return results


@pytest.mark.parametrize('world_size', [1, 2, 3])
def test_correct_and_smooth_example_matches_one_process(world_size,
                                                        tmp_path):
    data = graph()
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, world_size, root, progress=False)
    results = run_workers(_worker, world_size, root, timeout_s=240)
    ids = torch.cat([r['ids'] for r in results])

    module = example()
    train = last_part_untrained(data.train_mask, root, world_size)
    single = run(module, data.x, data.y, masks_of(data, train),
                 data.edge_index, make_mlp(module, data.num_features))
    curve = torch.tensor(single['curve'])
    assert curve[-1, 0] < curve[0, 0]  # it trains
    for rank, r in enumerate(results):
        torch.testing.assert_close(
            torch.tensor(r['curve']), curve, rtol=1e-5, atol=1e-6,
            msg=lambda m: f'loss/val/test curve, rank {rank}: {m}')
        assert r['base_acc'] == single['base_acc'], rank
        for scale in SCALES:  # accuracies over all workers: the same counts
            assert r[scale][1] == single[scale][1], (rank, scale)

    def gathered(key):
        return torch.cat([key(r) for r in results])

    torch.testing.assert_close(gathered(lambda r: r['y_soft']),
                               single['y_soft'][ids], rtol=1e-5, atol=1e-6)
    for scale in SCALES:
        for i, what in enumerate(('corrected', 'smoothed')):
            got = gathered(lambda r: r[scale][0][i])
            want = single[scale][0][i][ids]
            torch.testing.assert_close(
                got, want, rtol=1e-5, atol=1e-6,
                msg=lambda m: f'{what}, scale={scale}, world={world_size}: '
                f'{m}')
            assert torch.equal(got.argmax(-1), want.argmax(-1))
    # C&S does what it is for on a homophilous graph.
    base_test = single['base_acc'][1]
    assert single[None][1][1][1] > base_test, (base_test, single[None][1])
