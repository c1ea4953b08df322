"""DistLinkNeighborLoader: PyG's LinkNeighborLoader layout on 1 and 3 gloo
ranks, binary and triplet negatives drawn over the whole graph, and the
sampling rules of DistNeighborLoader for the pairs' endpoints."""
import copy
import math

import pytest
import torch

from pyg_sar import datasets, load_partition, partition_graph
from tests._dist import run_workers
from tests.loader.test_loader import _check_batch, _reference
from tests._loaders import _old, _old_link

FANOUTS = [3, 2]


@pytest.fixture(scope='module')
def parts3(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('link') / 'three')
    data = datasets.synthetic_graph(300, 6, 4, 3, seed=2)
    data.edge_attr = torch.randn(data.num_edges, 2)
    partition_graph(data, 3, root)
    return root


def _check_structure(batch, ref):
    """DistNeighborLoader's rules (edges exist, fanouts, attribute rows) for
    the sampled neighborhood of the pairs' endpoints."""
    bs = batch.num_sampled_nodes[0]
    shim = copy.copy(batch)
    shim.batch_size, shim.input_id = bs, torch.arange(bs)
    _check_batch(shim, ref, FANOUTS, batch.n_id[:bs])


def _link_checks(rank, world_size, root):
    from pyg_sar import comm
    ref = _reference(root, world_size)
    part = load_partition(root, rank)
    num_nodes = part.num_nodes
    gen = torch.Generator().manual_seed(rank)
    num_pairs = 20 + 7 * rank
    pairs = torch.randint(0, num_nodes, (2, num_pairs), generator=gen)
    labels = torch.rand(num_pairs, generator=gen)
    report = {'owners': set(), 'input_ids': []}

    loader = _old_link(
        part, FANOUTS, edge_label_index=pairs, edge_label=labels,
        neg_sampling='binary', batch_size=6, shuffle=True, seed=3,
        pad_batches=True)
    count = 0
    for batch in loader:
        count += 1
        num_pos = batch.input_id.numel()
        num_neg = math.ceil(num_pos * 1.0)
        n_id = batch.n_id
        bs = batch.num_sampled_nodes[0]
        assert not hasattr(batch, 'batch_size')
        ends = n_id[batch.edge_label_index]
        assert ends.shape == (2, num_pos + num_neg)
        # Seeds: the distinct endpoints, sorted, first in n_id.
        assert torch.equal(n_id[:bs], ends.reshape(-1).unique())
        assert torch.equal(ends[:, :num_pos], pairs[:, batch.input_id])
        assert torch.equal(batch.edge_label[:num_pos], labels[batch.input_id])
        assert torch.equal(batch.edge_label[num_pos:], torch.zeros(num_neg))
        negatives = ends[:, num_pos:].reshape(-1)
        report['owners'] |= set(
            (torch.searchsorted(part.node_ptr, negatives, right=True) - 1
             ).tolist())
        report['input_ids'].append(batch.input_id)
        _check_structure(batch, ref)
    assert count == len(loader) == loader.num_global_batches
    report['input_ids'] = torch.cat(report['input_ids']).sort().values

    triplet = _old_link(
        part, FANOUTS, edge_label_index=pairs,
        neg_sampling=dict(mode='triplet', amount=3), batch_size=5, seed=4,
        pad_batches=True)
    for batch in triplet:
        num_pos = batch.input_id.numel()
        n_id = batch.n_id
        assert batch.src_index.shape == (num_pos, )
        assert batch.dst_neg_index.shape == (num_pos, 3)
        assert torch.equal(n_id[batch.src_index], pairs[0, batch.input_id])
        assert torch.equal(n_id[batch.dst_pos_index],
                           pairs[1, batch.input_id])
        assert bool((n_id[batch.dst_neg_index] < num_nodes).all())
        _check_structure(batch, ref)

    # Default pairs: this rank's in-edges, all labelled 1 without negatives.
    default = _old_link(part, [2], batch_size=10**6)
    batches = list(default)
    if part.num_local_edges:
        (batch, ) = batches
        assert torch.equal(batch.n_id[batch.edge_label_index],
                           part.edge_index)
        assert not hasattr(batch, 'edge_label')
    report['world'] = comm.get_world_size()
    return report


@pytest.mark.parametrize('world_size', [1, 3])
def test_link_loader(tmp_path, world_size, parts3):
    if world_size == 1:
        root = str(tmp_path / 'one')
        data = datasets.synthetic_graph(300, 6, 4, 3, seed=2)
        data.edge_attr = torch.randn(data.num_edges, 2)
        partition_graph(data, 1, root)
    else:
        root = parts3
    reports = run_workers(_link_checks, world_size, root, timeout_s=90)
    for rank, report in enumerate(reports):
        # Every pair of the rank came out exactly once per epoch.
        assert torch.equal(report['input_ids'],
                           torch.arange(20 + 7 * rank))
        # Negatives are drawn over the whole graph, not one part.
        assert report['owners'] == set(range(world_size))


def test_link_loader_refusals(parts3):
    part = load_partition(parts3, 0)
    with pytest.raises(ValueError, match='edge_label_time needs time_attr'):
        _old_link(part, [2], edge_label_time=torch.zeros(3))
    with pytest.raises(ValueError, match='triplet'):
        _old_link(part, [2], edge_label=torch.ones(2),
                               edge_label_index=torch.zeros(2, 2).long(),
                               neg_sampling='triplet')
    with pytest.raises(ValueError, match=r'shape \[2, num_pairs\]'):
        _old_link(part, [2],
                               edge_label_index=torch.zeros(3, 2).long())
    # The node loader no longer takes a subgraph type it does not build.
    from torch_geometric.sampler.base import SubgraphType  # noqa
    for value in ('khop', SubgraphType.induced.value + 'x'):
        with pytest.raises(ValueError, match='subgraph_type'):
            _old(part, [2], subgraph_type=value)


def _temporal_links(rank, world_size, root):
    ref = _reference(root, world_size)
    part = load_partition(root, rank)
    parts = [load_partition(root, r) for r in range(world_size)]
    edge_t = torch.empty(part.num_edges, dtype=torch.long)
    for p in parts:
        edge_t[p.csc_eid] = p.et
    gen = torch.Generator().manual_seed(rank)
    pairs = torch.randint(0, part.num_nodes, (2, 17), generator=gen)
    times = torch.randint(30, 100, (17, ), generator=gen)
    loader = _old_link(
        part, FANOUTS, edge_label_index=pairs, edge_label_time=times,
        time_attr='et', neg_sampling='binary', batch_size=5, seed=1,
        pad_batches=True)
    assert loader.disjoint
    checked = 0
    for batch in loader:
        num_pos = batch.input_id.numel()
        total = 2 * num_pos
        n_id, tree = batch.n_id, batch.batch
        assert torch.equal(batch.edge_label_index,
                           torch.arange(2 * total).view(2, -1))
        assert torch.equal(n_id[batch.edge_label_index[:, :num_pos]],
                           pairs[:, batch.input_id])
        pair_time = times[batch.input_id]
        assert torch.equal(batch.edge_label_time, pair_time.repeat(2))
        if num_pos:
            assert torch.equal(tree[:2 * total],
                               torch.arange(2 * total) % num_pos)
            col = batch.edge_index[1]
            assert bool((edge_t[batch.e_id] <= pair_time[tree[col]]).all())
            assert torch.equal(ref['dst'][batch.e_id], n_id[col])
        checked += 1
    # Node timestamps: negatives no later than their pair (PyG's greedy
    # re-draws; what stays invalid becomes the earliest node).
    node_t = torch.cat([p.t for p in parts])
    by_node = _old_link(
        part, FANOUTS, edge_label_index=pairs, edge_label_time=times,
        time_attr='t', neg_sampling=dict(mode='binary', amount=2),
        batch_size=5, seed=3, pad_batches=True)
    earliest = int(torch.argmin(node_t))
    for batch in by_node:
        num_pos = batch.input_id.numel()
        ends = batch.n_id[batch.edge_label_index[:, num_pos:]]
        limit = times[batch.input_id].repeat(2)
        ok = (node_t[ends] <= limit) | (ends == earliest)
        assert bool(ok.all())
        col = batch.edge_index[1]
        src = batch.n_id[batch.edge_index[0]]
        if num_pos:
            limit_all = batch.edge_label_time[batch.batch[col]]
            assert bool((node_t[src] <= limit_all).all())
    # Triplets, disjoint without times.
    triplet = _old_link(
        part, FANOUTS, edge_label_index=pairs, disjoint=True,
        neg_sampling=dict(mode='triplet', amount=2), batch_size=4, seed=2,
        pad_batches=True)
    for batch in triplet:
        num_pos = batch.input_id.numel()
        n_id = batch.n_id
        assert torch.equal(n_id[batch.src_index], pairs[0, batch.input_id])
        assert torch.equal(n_id[batch.dst_pos_index],
                           pairs[1, batch.input_id])
        assert batch.dst_neg_index.shape == (num_pos, 2)
        if num_pos:
            assert torch.equal(batch.batch[batch.dst_neg_index],
                               torch.arange(num_pos).view(-1, 1).expand(
                                   -1, 2))
    return checked


def test_temporal_and_disjoint_link_batches(tmp_path):
    root = str(tmp_path / 'three')
    data = datasets.synthetic_graph(150, 6, 4, 3, seed=12)
    data.edge_attr = torch.randn(data.num_edges, 2)
    data.et = torch.randint(0, 100, (data.num_edges, ),
                            generator=torch.Generator().manual_seed(0))
    data.t = torch.randint(0, 100, (data.num_nodes, ),
                           generator=torch.Generator().manual_seed(1))
    partition_graph(data, 3, root)
    assert sum(run_workers(_temporal_links, 3, root, timeout_s=90)) > 3


def test_label_pairs_are_checked_in_one_line():
    """The homogeneous and the heterogeneous link loader share one check of
    edge_label_index and edge_label: shape, dtype, each row's id range,
    label length; pairs given as two sequences are stacked."""
    from pyg_sar.loader.label_pairs import check_label_pairs
    limits = [(5, 'sources'), (3, 'destinations')]
    out = check_label_pairs(([0, 4], [2, 0]), limits, torch.ones(2))
    assert out.dtype == torch.long and out.tolist() == [[0, 4], [2, 0]]
    cases = [
        (torch.zeros(3, 2, dtype=torch.long), ValueError,
         r" of edge type E must have shape \[2, num_pairs\] \(got \[3, 2\]\)"),
        (torch.zeros(2, 2), TypeError, 'integer node ids'),
        (torch.zeros(2, 2, dtype=torch.bool), TypeError, 'integer node ids'),
        (torch.tensor([[5], [0]]), ValueError,
         r"row 0 holds ids outside \[0, 5\) \(sources\)"),
        (torch.tensor([[0], [-1]]), ValueError,
         r"row 1 holds ids outside \[0, 3\) \(destinations\)"),
    ]
    for pairs, error, match in cases:
        with pytest.raises(error, match=match):
            check_label_pairs(pairs, limits, None, of=' of edge type E')
    with pytest.raises(ValueError, match="'edge_label' has 3 entries for 1"):
        check_label_pairs(torch.tensor([[0], [0]]), limits, torch.ones(3))
