"""``examples/reddit_sage.py`` (PyG's ``examples/reddit.py`` ported) run
whole in 3 workers on Coauthor CS, then checked piece by piece:

* every worker takes the same number of optimizer steps, one per global
  batch, and the workers' seeds are exactly the training nodes of the split
  one process draws with the script's seed;
* the loss ``train()`` returns is the global mean over the epoch's seeds
  (the same on every worker);
* all workers hold the same weights, and the full-graph inference the
  script's ``test()`` uses gives, row for row by dataset id, the logits of
  the same weights in one process on the whole graph; its accuracies are
  those of that one-process evaluation.

The script runs one epoch here instead of ten (the one line the test
changes, checked to be there).
"""
import os.path as osp
import runpy

import pytest
import torch

import pyg_sar
from _dist import run_workers
from _ports import one_epoch_copy

# This file is in tests/<folder>/.
REPO = osp.join(osp.dirname(osp.abspath(__file__)), '..', '..')
SCRIPT = osp.join(REPO, 'examples', 'reddit_sage.py')
DATA = osp.join(REPO, '..', 'shared', 'data', 'CS')
EPOCHS = 'for epoch in range(1, 11):'


def _whole_graph(root):
    """The whole graph and split, as one process draws them with the
    script's seed."""
    from torch_geometric.datasets import Coauthor
    import torch_geometric.transforms as T
    torch.manual_seed(0)
    split = T.RandomNodeSplit('test_rest', num_train_per_class=20,
                              num_val=450)
    return Coauthor(osp.join(root, 'data'), 'CS', transform=split)[0]


def _worker(rank, world_size, script):
    g = runpy.run_path(script, run_name='__main__')  # the whole script
    model, data = g['model'], g['data']
    steps = []
    model_hook = g['optimizer'].register_step_post_hook(
        lambda *_: steps.append(1))
    loss, _ = g['train'](2)  # one more epoch, counting this worker's steps
    model_hook.remove()
    logits, ids = pyg_sar.train.inference(model, data.x, data,
                                          return_ids=True)
    loader = g['train_loader']
    expected = None
    if rank == 0:  # the script's SAGE, the same weights, the whole graph
        whole = _whole_graph(osp.dirname(osp.dirname(script)))
        stock = g['SAGE'](whole.num_features, 256, 15)
        stock.load_state_dict(model.state_dict())
        stock.eval()
        with torch.no_grad():
            expected = stock(whole.x, whole.edge_index)
    return {'expected': expected, 'steps': len(steps), 'global': loader.num_global_batches,
            'seeds': data.orig_ids[data.train_mask].tolist(),
            'loader_seeds': len(loader.dataset), 'loss': loss,
            'logits': logits, 'ids': ids, 'accs': g['test'](),
            'state': {k: v.clone() for k, v in model.state_dict().items()}}


# World size 3 (uneven parts); the loaders' own tests cover 1-3.
@pytest.mark.parametrize('world_size', [3])
def test_reddit_port_as_one_process(world_size, tmp_path):
    script = one_epoch_copy(tmp_path, SCRIPT, DATA, 'data/CS', EPOCHS)
    results = run_workers(_worker, world_size, script, timeout_s=180)

    data = _whole_graph(str(tmp_path))

    steps = {r['steps'] for r in results}
    assert steps == {results[0]['global']} and results[0]['global'] >= 1
    seeds = sorted(s for r in results for s in r['seeds'])
    assert seeds == data.train_mask.nonzero().view(-1).tolist()
    assert sum(r['loader_seeds'] for r in results) == len(seeds)
    assert all(r['loader_seeds'] > 0 for r in results)
    assert len({r['loss'] for r in results}) == 1

    state = results[0]['state']
    for r in results[1:]:
        for key, value in r['state'].items():
            assert torch.equal(value, state[key]), key
    expected = results[0]['expected']
    ids = torch.cat([r['ids'] for r in results])
    assert torch.equal(ids.sort().values, torch.arange(data.num_nodes))
    got = torch.cat([r['logits'] for r in results])
    torch.testing.assert_close(got, expected[ids], rtol=1e-4, atol=1e-4)
    correct = expected.argmax(-1) == data.y
    accs = [float(correct[m].sum()) / int(m.sum())
            for m in (data.train_mask, data.val_mask, data.test_mask)]
    for r in results:
        assert r['accs'] == pytest.approx(accs)
    assert accs[2] > 0.5  # trained: far above chance (1/15)
