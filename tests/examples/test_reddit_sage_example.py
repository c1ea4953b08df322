"""``examples/reddit_sage.py`` (PyG's ``examples/reddit.py`` ported) run
whole in 2 and 3 workers on Cora, then checked piece by piece:

* every worker takes the same number of optimizer steps, one per global
  batch, and the workers' seeds are exactly the training nodes;
* all workers hold the same weights, and the full-graph inference the
  script's ``test()`` uses gives, row for row by dataset id, the logits of
  the same weights in one process on the whole graph; its accuracies are
  those of that one-process evaluation.
"""
import os.path as osp
import runpy
import shutil
import sys

import pytest
import torch

import pyg_sar
from _dist import run_workers

# This file is in tests/<folder>/.
REPO = osp.join(osp.dirname(osp.abspath(__file__)), '..', '..')
SCRIPT = osp.join(REPO, 'examples', 'reddit_sage.py')
DATA = osp.join(REPO, '..', 'shared', 'data', 'Cora')


def _worker(rank, world_size, root):
    sys.argv = [SCRIPT, '--root', root, '--dataset', 'Cora']
    g = runpy.run_path(SCRIPT, run_name='__main__')  # the whole script
    model, data, graph = g['model'], g['data'], g['graph']
    steps = []
    model_hook = g['optimizer'].register_step_post_hook(
        lambda *_: steps.append(1))
    g['train'](11)  # one more epoch, counting this worker's steps
    model_hook.remove()
    logits, ids = pyg_sar.train.inference(model, data.x, graph,
                                          return_ids=True)
    # The script's stock SAGE, the same weights, the whole graph, as one
    # process computes it.
    whole = pyg_sar.datasets.load('Cora', root)
    stock = g['SAGE'](whole.num_features, 256, 7)
    stock.load_state_dict(model.state_dict())
    stock.eval()
    with torch.no_grad():
        expected = stock(whole.x, whole.edge_index)
    loader = g['train_loader']
    return {'steps': len(steps), 'global': loader.num_global_batches,
            'seeds': data.orig_ids[data.train_mask].tolist(),
            'loader_seeds': len(loader.dataset), 'expected': expected,
            'logits': logits, 'ids': ids, 'accs': g['test'](),
            'state': {k: v.clone() for k, v in model.state_dict().items()}}


@pytest.mark.parametrize('world_size', [2, 3])
def test_reddit_port_as_one_process(world_size, tmp_path):
    if not osp.isdir(DATA):
        pytest.skip(f'Cora not found in {osp.dirname(DATA)}')
    shutil.copytree(DATA, tmp_path / 'Cora')
    data = pyg_sar.datasets.load('Cora', str(tmp_path))
    results = run_workers(_worker, world_size, str(tmp_path), timeout_s=120)

    steps = {r['steps'] for r in results}
    assert steps == {results[0]['global']} and results[0]['global'] >= 1
    seeds = sorted(s for r in results for s in r['seeds'])
    assert seeds == data.train_mask.nonzero().view(-1).tolist()
    assert sum(r['loader_seeds'] for r in results) == len(seeds)
    assert all(r['loader_seeds'] > 0 for r in results)

    state = results[0]['state']
    for r in results[1:]:
        for key, value in r['state'].items():
            assert torch.equal(value, state[key]), key
    expected = results[0]['expected']
    ids = torch.cat([r['ids'] for r in results])
    assert torch.equal(ids.sort().values, torch.arange(data.num_nodes))
    got = torch.cat([r['logits'] for r in results])
    torch.testing.assert_close(got, expected[ids], rtol=1e-4, atol=1e-5)
    correct = expected.argmax(-1) == data.y
    accs = [float(correct[m].sum()) / int(m.sum())
            for m in (data.train_mask, data.val_mask, data.test_mask)]
    for r in results:
        assert r['accs'] == pytest.approx(accs)
    assert accs[2] > 0.6  # trained: far above chance (1/7)
