"""PyG's distributed-loader call, argument for argument, and the batch-
changing arguments: bidirectional subgraphs are built, the rest refused
by name."""
import pytest
import torch
from torch_geometric.distributed import DistContext

from pyg_sar import datasets, load_partition, partition_graph
from pyg_sar.loader import DistLinkNeighborLoader, DistNeighborLoader
from tests._dist import run_workers
from tests.loader.test_loader import _reference
from tests._loaders import _old

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow

FANOUTS = [3, 2]


def _hops(batch):
    """Per hop: ``(fanout, first node, nodes, first edge, edges)``; the
    hop's targets are those nodes, its edges those edges."""
    start = edge_start = 0
    for hop, fanout in enumerate(FANOUTS):
        count = batch.num_sampled_nodes[hop]
        num_edges = batch.num_sampled_edges[hop]
        yield fanout, start, count, edge_start, num_edges
        start += count
        edge_start += num_edges


def _context(rank, world_size):
    return DistContext(rank=rank, global_rank=rank, world_size=world_size,
                       global_world_size=world_size, group_name='test')


@pytest.fixture(scope='module')
def one_part(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('pygcall') / 'one')
    data = datasets.synthetic_graph(200, 5, 4, 3, seed=4)
    data.edge_attr = torch.randn(data.num_edges, 2)
    partition_graph(data, 1, root)
    return root


def _same(a, b):
    assert a.keys() == b.keys()
    for key in a.keys():
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def test_pyg_positional_and_keyword_calls_equal_ours(one_part):
    part = load_partition(one_part, 0)
    mask = part.train_mask
    ours = list(DistNeighborLoader(part, FANOUTS, mask, batch_size=16,
                                   shuffle=True, seed=5))
    # torch_geometric.loader.NeighborLoader's positional order.
    loader_order = list(DistNeighborLoader(
        part, FANOUTS, mask, None, False, 'directional', False, 'uniform',
        None, None, None, None, False, None, None, True, batch_size=16,
        shuffle=True, seed=5))
    # torch_geometric.distributed.DistNeighborLoader's positional order.
    theirs = list(DistNeighborLoader(
        part, FANOUTS, 'localhost', 12345, _context(0, 1), mask, None, None,
        False, 'directional', False, 'uniform', None, None, 4, 16, False,
        True, torch.device('cpu'), batch_size=16, shuffle=True, seed=5,
        num_workers=0, persistent_workers=False))
    # ... and by keyword, as PyG's distributed example calls it.
    keywords = list(DistNeighborLoader(
        data=part, input_nodes=mask, current_ctx=_context(0, 1),
        device=torch.device('cpu'), num_neighbors=FANOUTS, shuffle=True,
        drop_last=False, persistent_workers=False, batch_size=16,
        num_workers=0, master_addr='localhost', master_port=12346,
        concurrency=2, async_sampling=True, seed=5))
    assert len(ours) == len(theirs) == len(keywords) == \
        len(loader_order) > 1
    for a, b, c, d in zip(ours, theirs, keywords, loader_order):
        _same(a, b)
        _same(a, c)
        _same(a, d)
    links = list(DistLinkNeighborLoader(
        part, FANOUTS, 'localhost', 12345, _context(0, 1),
        part.edge_index[:, :30], None, None, None, False, 'directional',
        False, 'uniform', 'binary', batch_size=10, seed=1))
    assert len(links) == 3 and all(b.edge_label.numel() == 20 for b in links)


def test_pyg_arguments_that_change_batches_are_refused(one_part):
    part = load_partition(one_part, 0)
    mask = part.train_mask
    cases = [
        (dict(current_ctx=_context(1, 2)), 'current_ctx says rank 1 of 2'),
        (dict(dist_sampler=object()), 'dist_sampler'),
        (dict(input_time=torch.zeros(3)), 'input_time needs time_attr'),
        (dict(time_attr='time'), "time_attr 'time' is neither"),
        (dict(temporal_strategy='last'), 'needs time_attr'),
        (dict(time_attr='time', temporal_strategy='first'),
         "'uniform' or 'last'"),
        (dict(weight_attr='w'), "weight_attr 'w' is not an edge attr"),
        (dict(subgraph_type='khop'), 'subgraph_type'),
        (dict(subgraph_type='induced', disjoint=True), 'induced'),
        (dict(concurrency=0), 'concurrency'),
        (dict(master_port='x'), 'master_port'),
        (dict(neighbor_sampler=object()), 'neighbor_sampler'),
        (dict(sampler=[0, 1]), 'custom sampler'),
        (dict(batch_sampler=[[0]]), 'custom batch_sampler'),
        (dict(prefetch_factor=2), 'num_workers > 0'),
        (dict(num_workers=-1), 'num_workers'),
        (dict(pad_batches='yes'), 'pad_batches'),
        (dict(ids='orig'), "'dataset' or 'partition'"),
        (dict(node_attrs=['nope']), "node_attrs' names \\['nope'\\]"),
        (dict(seed=1, generator=torch.Generator()), 'either'),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            DistNeighborLoader(part, FANOUTS, **kwargs)
    with pytest.raises(TypeError, match="multiple values for argument "
                       "'input_nodes'"):
        DistNeighborLoader(part, FANOUTS, None, input_nodes=None)
    with pytest.raises(TypeError, match="unexpected keyword argument "
                       "'edge_label'"):
        DistNeighborLoader(part, FANOUTS, edge_label=None)
    with pytest.raises(TypeError, match="'transform_sampler_output' must be "
                       "callable"):
        DistNeighborLoader(part, FANOUTS, transform_sampler_output=3)
    with pytest.raises(TypeError, match="'generator' must be a "
                       "torch.Generator"):
        DistNeighborLoader(part, FANOUTS, generator=3)
    # pyg_sar's old order (input_nodes, batch_size, shuffle) is named.
    with pytest.raises(TypeError, match="16 was passed as 'input_time'.*"
                       "keyword-only"):
        DistNeighborLoader(part, FANOUTS, mask, 16, True)


def _bidirectional(rank, world_size, root):
    ref = _reference(root, world_size)
    part = load_partition(root, rank)
    loader = _old(part, FANOUTS, batch_size=8, seed=2,
                                subgraph_type='bidirectional',
                                pad_batches=True)
    plain = _old(part, FANOUTS, batch_size=8, seed=2,
                               pad_batches=True)
    checked = 0
    for batch, directed in zip(loader, plain):
        n_id = batch.n_id
        assert torch.equal(n_id, directed.n_id)
        assert 'num_sampled_nodes' not in batch
        pairs = set(map(tuple, batch.edge_index.t().tolist()))
        # Every sampled edge, its reverse, and nothing else.
        expected = set(map(tuple, directed.edge_index.t().tolist()))
        expected |= {(c, r) for r, c in expected}
        assert pairs == expected
        # Edge ids and attributes follow: each edge is a sampled edge in
        # one of its two directions.
        src, dst = n_id[batch.edge_index]
        forward = (ref['src'][batch.e_id] == src) & \
            (ref['dst'][batch.e_id] == dst)
        backward = (ref['src'][batch.e_id] == dst) & \
            (ref['dst'][batch.e_id] == src)
        assert bool((forward | backward).all())
        assert torch.equal(batch.edge_attr, ref['edge_attr'][batch.e_id])
        checked += 1
    return checked


def test_bidirectional_subgraphs(tmp_path):
    root = str(tmp_path / 'three')
    data = datasets.synthetic_graph(240, 5, 4, 3, seed=6)
    data.edge_attr = torch.randn(data.num_edges, 2)
    partition_graph(data, 3, root)
    assert sum(run_workers(_bidirectional, 3, root, timeout_s=60)) > 3


def test_weight_attr_samples_in_proportion(tmp_path):
    from torch_geometric.data import Data
    # Node 0's in-edges come from 1..4 with weights 0, 1, 3, 6; a chain
    # 1 <- 2 <- 3 <- 4 <- 5 gives the second hop something to sample.
    src = torch.tensor([1, 2, 3, 4, 2, 3, 4, 5])
    dst = torch.tensor([0, 0, 0, 0, 1, 2, 3, 4])
    w = torch.tensor([0., 1., 3., 6., 1., 0., 1., 1.])
    data = Data(x=torch.randn(6, 2), edge_index=torch.stack([src, dst]),
                w=w, num_nodes=6)
    root = str(tmp_path / 'w')
    partition_graph(data, 1, root)
    part = load_partition(root, 0)
    node0 = int((part.orig_ids == 0).nonzero())
    loader = _old(part, [1, -1], input_nodes=torch.tensor(
        [node0]), batch_size=1, seed=0, weight_attr='w')
    picks = torch.zeros(6)
    for _ in range(3000):
        (batch, ) = list(loader)
        assert batch.num_sampled_edges[0] == 1
        picks[part.orig_ids[batch.n_id[batch.edge_index[0, :1]]]] += 1
        # The zero-weight edge 1 -> 0 is never drawn; all=-1 takes every
        # in-edge, zero weights included (as PyG's -1).
        assert float(batch.w[0]) > 0
    share = picks[2:5] / picks.sum()
    assert picks[1] == 0
    torch.testing.assert_close(share, torch.tensor([.1, .3, .6]),
                               atol=0.03, rtol=0)
    # fanout 2 without replacement: both picks distinct and positive.
    loader = _old(part, [2], input_nodes=torch.tensor([node0]),
                                seed=1, weight_attr='w')
    for _ in range(50):
        (batch, ) = list(loader)
        assert batch.e_id.numel() == 2 and bool((batch.w > 0).all())
        assert batch.e_id.unique().numel() == 2


def _disjoint(rank, world_size, root):
    ref = _reference(root, world_size)
    part = load_partition(root, rank)
    loader = _old(part, FANOUTS, batch_size=6, seed=3,
                                disjoint=True, shuffle=True)
    checked = 0
    for batch in loader:
        n_id, tree = batch.n_id, batch.batch
        bs = batch.batch_size
        row, col = batch.edge_index
        assert torch.equal(n_id[:bs], loader.input_nodes[batch.input_id])
        assert torch.equal(tree[:bs], torch.arange(bs))
        # Every node is in one subtree once; edges stay inside subtrees.
        keys = tree * part.num_nodes + n_id
        assert keys.unique().numel() == keys.numel()
        assert torch.equal(tree[row], tree[col])
        assert torch.equal(ref['src'][batch.e_id], n_id[row])
        assert torch.equal(ref['dst'][batch.e_id], n_id[col])
        assert torch.equal(batch.x, ref['x'][n_id])
        # Fanouts per hop, per subtree copy of a node.
        for fanout, start, count, edge_start, num_edges in _hops(batch):
            hop_col = col[edge_start:edge_start + num_edges] - start
            degree = ref['in_degree'][n_id[start:start + count]]
            assert torch.equal(torch.bincount(hop_col, minlength=count),
                               degree.clamp(max=fanout))
        checked += 1
    return checked


def test_disjoint_subtrees(tmp_path):
    root = str(tmp_path / 'three')
    data = datasets.synthetic_graph(150, 6, 4, 3, seed=8)
    data.edge_attr = torch.randn(data.num_edges, 2)
    partition_graph(data, 3, root)
    assert sum(run_workers(_disjoint, 3, root, timeout_s=60)) > 3


def _induced(rank, world_size, root):
    ref = _reference(root, world_size)
    part = load_partition(root, rank)
    # Two loaders iterated together: pad_batches keeps their collective
    # rounds in step on every rank.
    loader = _old(part, FANOUTS, batch_size=5, seed=4,
                                subgraph_type='induced', pad_batches=True)
    plain = _old(part, FANOUTS, batch_size=5, seed=4,
                               pad_batches=True)
    checked = 0
    for batch, directed in zip(loader, plain):
        n_id = batch.n_id
        assert torch.equal(n_id, directed.n_id)
        assert 'num_sampled_edges' not in batch
        # Exactly the graph's edges between the batch's nodes, each once.
        inside = torch.isin(ref['src'], n_id) & torch.isin(ref['dst'], n_id)
        assert torch.equal(batch.e_id.sort().values,
                           inside.nonzero().view(-1))
        assert torch.equal(ref['src'][batch.e_id], n_id[batch.edge_index[0]])
        assert torch.equal(ref['dst'][batch.e_id], n_id[batch.edge_index[1]])
        assert torch.equal(batch.edge_attr, ref['edge_attr'][batch.e_id])
        assert bool((batch.edge_index[1][1:] >=
                     batch.edge_index[1][:-1]).all())
        checked += 1
    return checked


def test_induced_subgraphs(tmp_path):
    root = str(tmp_path / 'three')
    data = datasets.synthetic_graph(120, 6, 4, 3, seed=9)
    data.edge_attr = torch.randn(data.num_edges, 2)
    partition_graph(data, 3, root)
    assert sum(run_workers(_induced, 3, root, timeout_s=60)) > 3


def _temporal(rank, world_size, root, strategy, on_edges):
    ref = _reference(root, world_size)
    part = load_partition(root, rank)
    parts = [load_partition(root, r) for r in range(world_size)]
    node_t = torch.cat([p.t for p in parts])
    edge_t = torch.empty(part.num_edges, dtype=torch.long)
    for p in parts:
        edge_t[p.csc_eid] = p.et
    seeds = torch.arange(part.num_local_nodes) + int(part.node_ptr[rank])
    kwargs = dict(time_attr='t', temporal_strategy=strategy)
    if on_edges:
        gen = torch.Generator().manual_seed(rank)
        kwargs = dict(time_attr='et', temporal_strategy=strategy,
                      input_time=torch.randint(20, 100, (seeds.numel(), ),
                                               generator=gen))
    loader = _old(part, FANOUTS, batch_size=7, seed=5,
                                pad_batches=True, **kwargs)
    assert loader.disjoint  # temporal sampling is disjoint, as in PyG
    checked = 0
    for batch in loader:
        bs = batch.batch_size
        n_id, tree = batch.n_id, batch.batch
        row, col = batch.edge_index
        expected_seed_time = kwargs['input_time'][batch.input_id] \
            if on_edges else node_t[n_id[:bs]]
        assert torch.equal(batch.seed_time, expected_seed_time)
        limit = batch.seed_time[tree[col]]
        times = edge_t[batch.e_id] if on_edges else node_t[n_id[row]]
        assert bool((times <= limit).all())
        assert torch.equal(ref['src'][batch.e_id], n_id[row])
        # Per target copy: min(#qualifying in-edges, fanout), and with
        # 'last' the most recent of them.
        for fanout, start, count, edge_start, num_edges in _hops(batch):
            for k in range(count):
                v = int(n_id[start + k])
                t = batch.seed_time[int(tree[start + k])]
                into = (ref['dst'] == v).nonzero().view(-1)
                cand_t = edge_t[into] if on_edges else node_t[ref['src'][into]]
                valid = cand_t[cand_t <= t]
                mine = (col[edge_start:edge_start + num_edges] ==
                        start + k).nonzero().view(-1) + edge_start
                assert mine.numel() == min(valid.numel(), fanout)
                if strategy == 'last' and mine.numel():
                    got = times[mine]
                    rest = valid.sort(descending=True).values[mine.numel():]
                    if rest.numel():
                        assert bool(got.min() >= rest.max())
        checked += 1
    return checked


@pytest.mark.parametrize('strategy,on_edges', [('uniform', False),
                                               ('last', True)])
def test_temporal_sampling(tmp_path, strategy, on_edges):
    root = str(tmp_path / 'three')
    data = datasets.synthetic_graph(120, 6, 4, 3, seed=10)
    data.edge_attr = torch.randn(data.num_edges, 2)
    gen = torch.Generator().manual_seed(0)
    data.t = torch.randint(0, 100, (data.num_nodes, ), generator=gen)
    data.et = torch.randint(0, 100, (data.num_edges, ), generator=gen)
    partition_graph(data, 3, root)
    assert sum(run_workers(_temporal, 3, root, strategy, on_edges,
                           timeout_s=90)) > 3
