"""``pyg_sar.distribute`` (rank 0 partitions once, every rank loads its part,
a changed graph or world size never reuses a partition) and the loss
helpers a ported script uses: ``global_mean`` (the global batch's mean, its
gradient exact after ``all_reduce_grads``) and ``global_totals``."""
import os
import os.path as osp

import pytest
import torch
import torch.nn.functional as F

import pyg_sar
from pyg_sar.datasets import partitioned as distribute_module
from torch_geometric.data import InMemoryDataset

from _dist import run_workers
from _graphs import hard_graph


def _parts_of(root):
    return sorted(n for n in os.listdir(root) if n.startswith('pyg_sar-'))


def _distribute_worker(rank, world_size, root, slow):
    calls = []

    def graph():
        calls.append(rank)
        return hard_graph()

    if slow:  # longer than several heartbeats: the waiting ranks keep going
        distribute_module.HEARTBEAT_S = 0.05
        real = distribute_module.partition_graph

        def slow_partition(*args, **kwargs):
            import time
            time.sleep(0.5)
            return real(*args, **kwargs)
        distribute_module.partition_graph = slow_partition
    part = pyg_sar.distribute(graph, root)
    folders = _parts_of(root)
    again = pyg_sar.distribute(hard_graph(), root)  # a Data: reused
    changed = hard_graph()
    changed.x[0, 0] += 1
    other = pyg_sar.distribute(changed, root)
    return {'orig_ids': part.orig_ids, 'calls': calls, 'root': part.root,
            'again': again.root, 'other': other.root, 'folders': folders,
            'x': part.x, 'num_parts': part.num_parts}


@pytest.mark.parametrize('world_size,slow', [(1, False), (2, True),
                                             (3, False)])
def test_distribute_partitions_once(tmp_path, world_size, slow):
    root = str(tmp_path / 'data')
    results = run_workers(_distribute_worker, world_size, root, slow)
    whole = hard_graph()
    ids = torch.cat([r['orig_ids'] for r in results])
    assert torch.equal(ids.sort().values, torch.arange(whole.num_nodes))
    for r in results:
        assert r['num_parts'] == world_size
        assert torch.equal(r['x'], whole.x[r['orig_ids']])
        assert r['again'] == r['root'] and r['other'] != r['root']
        assert r['folders'] == [osp.basename(r['root'])]
    # Only rank 0 built the graph.
    assert [r['calls'] for r in results] == [[0]] + [[]] * (world_size - 1)
    assert len(_parts_of(root)) == 2


class _TwoGraphs(InMemoryDataset):
    def __init__(self):
        super().__init__()
        self.data, self.slices = self.collate([hard_graph(), hard_graph()])


def _refused_worker(rank, world_size, root):
    pyg_sar.distribute(_TwoGraphs(), root)


def test_distribute_refusal_reaches_every_rank(tmp_path):
    results = run_workers(_refused_worker, 2, str(tmp_path), expect_errors=True)
    assert all(status == 'error' for status, _ in results)
    assert 'ValueError: distribute: expected a dataset of one graph ' \
        '(got _TwoGraphs with 2 graphs)' in results[0][1]
    assert 'RuntimeError: distribute: rank 0 could not partition the ' \
        'dataset (ValueError: distribute: expected a dataset of one graph' \
        in results[1][1]


def test_distribute_refuses_what_is_not_a_graph(tmp_path):
    with pytest.raises(TypeError, match='expected a Data, a HeteroData'):
        pyg_sar.distribute(torch.zeros(3), str(tmp_path))


def test_content_digest_sees_every_tensor_and_option():
    data = hard_graph()
    digest = distribute_module.content_digest
    base = digest(data, {'seed': 0})
    assert digest(hard_graph(), {'seed': 0}) == base
    assert digest(data, {'seed': 1}) != base
    for name in ('x', 'y', 'edge_index', 'train_mask', 'edge_attr'):
        changed = hard_graph()
        value = changed[name]
        flat = value.view(-1)
        flat[-1] = ~flat[-1] if value.dtype == torch.bool else flat[-1] + 1
        assert digest(changed, {'seed': 0}) != base, name


def _loss_worker(rank, world_size):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(10, 4), torch.randint(0, 3, (10, ))
    counts = {1: [10], 2: [0, 10], 3: [4, 0, 6]}[world_size]
    start = sum(counts[:rank])
    rows = slice(start, start + counts[rank])
    loss = pyg_sar.global_mean(F.cross_entropy(model(x[rows]), y[rows]),
                               counts[rank])
    loss.backward()
    pyg_sar.all_reduce_grads(model)
    totals = pyg_sar.global_totals(float(loss.detach()) * counts[rank], counts[rank],
                                   1)
    return {'loss': float(loss.detach()), 'grads': [p.grad for p in
                                           model.parameters()],
            'totals': totals, 'x': x, 'y': y,
            'state': model.state_dict()}


@pytest.mark.parametrize('world_size', [1, 2, 3])
def test_global_mean_is_the_one_process_loss_and_gradient(world_size):
    results = run_workers(_loss_worker, world_size)
    model = torch.nn.Linear(4, 3)
    model.load_state_dict(results[0]['state'])
    loss = F.cross_entropy(model(results[0]['x']), results[0]['y'])
    loss.backward()
    for r in results:
        assert r['loss'] == pytest.approx(float(loss), rel=1e-6)
        for got, expected in zip(r['grads'], model.parameters()):
            torch.testing.assert_close(got, expected.grad)
        total, count, ranks = r['totals']
        assert isinstance(count, int) and count == 10 and ranks == world_size
        assert total == pytest.approx(float(loss) * 10, rel=1e-6)


def test_global_mean_refuses_bad_input():
    with pytest.raises(ValueError, match='one-element loss tensor'):
        pyg_sar.global_mean(torch.zeros(2), 2)
    with pytest.raises(ValueError, match='count must be >= 0'):
        pyg_sar.global_mean(torch.zeros(()), -1)
    with pytest.raises(TypeError, match='Python ints or floats'):
        pyg_sar.global_totals(torch.zeros(()))
