"""``examples/to_hetero_dblp.py`` (PyG's ``examples/hetero/to_hetero_mag.py``
ported, on DBLP) run whole in 3 workers (2 with the HGT loader), then
checked piece by piece:

* the lazy parameters are materialized before :func:`pyg_sar.sync_params`,
  and every worker starts from rank 0's initial weights;
* with PyG's NeighborLoader or, ``--use_hgt_loader``, its HGTLoader:
  every worker takes the same number of optimizer steps, one per global
  batch, and the workers' training seeds together are exactly DBLP's
  training authors; the loss ``train()`` returns is the same everywhere;
* all workers end with the same weights;
* the accuracy ``test(val_loader)`` returns is the same on every worker and
  is the global correct / total over the batches the workers drew, whose
  seeds are exactly the validation authors;
* with every neighbor (``num_neighbors=[-1] * 2``) each validation author's
  logits are those of the same model on the whole graph in one process.

The script runs one epoch here instead of twenty (the one line the test
changes, checked to be there). PyG's ``Sequential`` imports the module named
after the calling script (``from to_hetero_dblp import *`` in its generated
``forward``), which with ``python examples/to_hetero_dblp.py`` runs the
script a second time inside the first (stock PyG does the same); here an
empty module of that name stands in, so that no copy of the script runs
twice (the generated ``forward`` needs nothing from it).
"""
import os.path as osp
import runpy
import sys
import types

import pytest
import torch

import pyg_sar
from _dist import run_workers
from _ports import one_epoch_copy

# This file is in tests/<folder>/.
REPO = osp.join(osp.dirname(osp.abspath(__file__)), '..', '..')
SCRIPT = osp.join(REPO, 'examples', 'to_hetero_dblp.py')
DATA = osp.join(REPO, '..', 'shared', 'data', 'DBLP')
EPOCHS = 'for epoch in range(1, 21):'


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class _Recorder:
    """Stands in for the script's ``tqdm``: yields the loader's batches and
    keeps them."""

    def __init__(self):
        self.batches = []

    def __call__(self, loader):
        for batch in loader:
            self.batches.append(batch)
            yield batch


def _seeds(batches):
    return [b['author'].n_id[:b['author'].batch_size] for b in batches]


@torch.no_grad()
def _logits(model, batches):
    model.eval()
    return [model(b.x_dict, b.edge_index_dict)['author'][
        :b['author'].batch_size] for b in batches]


def _worker(rank, world_size, script, options):
    sync = {}
    sync_params = pyg_sar.sync_params

    def recording_sync(model, *args, **kwargs):
        sync['before'] = _state(model)
        sync_params(model, *args, **kwargs)
        sync['after'] = _state(model)
        return model

    pyg_sar.sync_params = recording_sync
    # See the module docstring.
    sys.modules['to_hetero_dblp'] = types.ModuleType('to_hetero_dblp')
    sys.argv = [script, *options]
    try:
        g = runpy.run_path(script, run_name='__main__')  # the whole script
    finally:
        pyg_sar.sync_params = sync_params
        del sys.modules['to_hetero_dblp']
    model, data = g['model'], g['data']
    script_globals = g['train'].__globals__

    # One more epoch, counting this worker's steps and keeping its batches.
    steps = []
    hook = g['optimizer'].register_step_post_hook(lambda *_: steps.append(1))
    script_globals['tqdm'] = train_batches = _Recorder()
    loss = g['train']()
    hook.remove()

    script_globals['tqdm'] = val_batches = _Recorder()
    val_acc = g['test'](g['val_loader'])
    val_correct = sum(int((out.argmax(-1) == b['author'].y[:len(out)]).sum())
                      for out, b in zip(_logits(model, val_batches.batches),
                                        val_batches.batches))

    # Every neighbor: each validation author's prediction is the whole
    # graph's.
    full_loader = g['NeighborLoader'](data, num_neighbors=[-1] * 2,
                                      input_nodes=g['val_input_nodes'],
                                      batch_size=1024)
    script_globals['tqdm'] = full_batches = _Recorder()
    full_acc = g['test'](full_loader)
    full_logits = torch.cat(_logits(model, full_batches.batches)) \
        if full_batches.batches else torch.empty(0, 4)
    expected = None
    if rank == 0:  # the same model, one process, the whole graph
        from torch_geometric.datasets import DBLP
        whole = DBLP(g['path'], transform=g['transform'])[0]
        with torch.no_grad():
            expected = model(whole.x_dict, whole.edge_index_dict)['author']
    return {'sync': sync, 'steps': len(steps),
            'global': g['train_loader'].num_global_batches, 'loss': loss,
            'train_seeds': torch.cat(_seeds(train_batches.batches)),
            'val_seeds': torch.cat(_seeds(val_batches.batches)),
            'val_acc': val_acc, 'val_correct': val_correct,
            'full_acc': full_acc,
            'full_seeds': torch.cat(_seeds(full_batches.batches)),
            'full_logits': full_logits, 'expected': expected,
            'state': _state(model)}


@pytest.fixture(scope='module')
def root(tmp_path_factory):
    """``examples/to_hetero_dblp.py`` (one epoch) and a copy of DBLP next to
    it, shared by the world sizes (PyG processes DBLP once; the partitions
    of each world size have folders of their own)."""
    root = tmp_path_factory.mktemp('to_hetero_dblp')
    one_epoch_copy(root, SCRIPT, DATA, 'data/DBLP', EPOCHS)
    return root


# World size 3 (uneven parts) and the HGT loader at 2; the loaders' own
# tests cover 1-3.
@pytest.mark.parametrize('world_size,options', [
    (3, []), (2, ['--use_hgt_loader'])])
def test_to_hetero_mag_port_as_one_process(world_size, options, root):
    script = str(root / 'examples' / 'to_hetero_dblp.py')
    results = run_workers(_worker, world_size, script, options,
                          timeout_s=180)

    from torch_geometric.datasets import DBLP
    author = DBLP(str(root / 'data' / 'DBLP'))[0]['author']

    # Initial weights: rank 0's, materialized (lazy shapes known) before
    # the broadcast.
    initial = results[0]['sync']['before']
    assert initial and all(v.numel() > 0 for v in initial.values())
    for r in results:
        assert r['sync']['after'].keys() == initial.keys()
        for key, value in r['sync']['after'].items():
            assert torch.equal(value, initial[key]), key

    steps = {r['steps'] for r in results}
    assert steps == {results[0]['global']} and results[0]['global'] >= 1
    seeds = torch.cat([r['train_seeds'] for r in results]).sort().values
    assert torch.equal(seeds, author.train_mask.nonzero().view(-1))
    assert len({r['loss'] for r in results}) == 1

    state = results[0]['state']
    for r in results[1:]:
        for key, value in r['state'].items():
            assert torch.equal(value, state[key]), key

    val_ids = author.val_mask.nonzero().view(-1)
    seeds = torch.cat([r['val_seeds'] for r in results]).sort().values
    assert torch.equal(seeds, val_ids)
    assert len({r['val_acc'] for r in results}) == 1
    correct = sum(r['val_correct'] for r in results)
    assert results[0]['val_acc'] == pytest.approx(correct / len(val_ids))

    ids = torch.cat([r['full_seeds'] for r in results])
    assert torch.equal(ids.sort().values, val_ids)
    got = torch.cat([r['full_logits'] for r in results])
    expected = results[0]['expected'][ids]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    # Predictions: equal wherever the whole graph's top two logits are not
    # a near tie (float sums in another order may swap those).
    top2 = expected.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 1e-3
    assert int(clear.sum()) > 0.9 * len(ids)
    assert torch.equal(got.argmax(-1)[clear], expected.argmax(-1)[clear])
    accs = {r['full_acc'] for r in results}
    assert len(accs) == 1
    full_correct = int((got.argmax(-1) == author.y[ids]).sum())
    assert accs.pop() == pytest.approx(full_correct / len(ids))
