"""Tests of pyg_sar.loader: the sampling kernel, DistNeighborLoader on 1, 2
and 3 gloo ranks, and sampled training followed by full-graph inference.

Spawning ranks costs seconds of imports, so each world size runs one worker
function that bundles all distributed checks."""
import copy

import pytest
import torch

from pyg_sar import datasets, load_partition, partition_graph
from pyg_sar.loader import DistNeighborLoader, sample_neighbors
from tests._dist import run_workers

FANOUTS = [3, 2]


def _ptr(degrees):
    ptr = torch.zeros(len(degrees) + 1, dtype=torch.long)
    ptr[1:] = torch.cumsum(torch.tensor(degrees), 0)
    return ptr


# Sampling kernel ##############################################################

def test_kernel_counts_ranges_and_distinctness():
    degrees = [0, 1, 3, 5, 12, 40, 7, 2]
    ptr = _ptr(degrees)
    targets = torch.tensor([7, 5, 0, 4, 3, 5, 1, 2, 6])
    gen = torch.Generator().manual_seed(0)
    for fanout in (0, 2, 5, 9):
        counts, positions = sample_neighbors(ptr, targets, fanout,
                                             generator=gen)
        expected = torch.tensor(degrees)[targets].clamp(max=fanout)
        assert torch.equal(counts, expected)
        for target, segment in zip(targets.tolist(),
                                   positions.split(counts.tolist())):
            assert segment.unique().numel() == segment.numel()
            assert bool(((segment >= ptr[target]) &
                         (segment < ptr[target + 1])).all())

    counts, positions = sample_neighbors(ptr, targets, -1)
    assert torch.equal(counts, torch.tensor(degrees)[targets])
    assert torch.equal(positions[:2], torch.arange(ptr[7], ptr[8]))

    counts, positions = sample_neighbors(ptr, targets, 4, replace=True,
                                         generator=gen)
    assert torch.equal(counts, (torch.tensor(degrees)[targets] > 0).long() * 4)
    owners = torch.repeat_interleave(targets, counts)
    assert bool(((positions >= ptr[owners]) &
                 (positions < ptr[owners + 1])).all())


@pytest.mark.parametrize('degree', [8, 200])  # keys path and rejection path
def test_kernel_is_uniform(degree):
    ptr = _ptr([degree])
    gen = torch.Generator().manual_seed(1)
    fanout, trials = 3, 4000
    targets = torch.zeros(trials, dtype=torch.long)  # sampled independently
    counts, positions = sample_neighbors(ptr, targets, fanout, generator=gen)
    assert bool((counts == fanout).all())
    assert all(s.unique().numel() == fanout
               for s in positions.view(trials, fanout))
    hits = torch.bincount(positions, minlength=degree).double()
    expected = trials * fanout / degree
    # Chi-square statistic far below the 1e-6 tail for `degree` bins.
    chi2 = float(((hits - expected)**2 / expected).sum())
    assert chi2 < degree + 10 * (2 * degree)**0.5


def test_kernel_reproducible():
    ptr = _ptr([5, 50, 9, 1])
    targets = torch.tensor([0, 1, 2, 3, 1])
    out = [sample_neighbors(ptr, targets, 4,
                            generator=torch.Generator().manual_seed(7))
           for _ in range(2)]
    assert torch.equal(out[0][1], out[1][1])


def test_edge_rows_of_consecutive_and_permuted_edge_ids():
    """An edge id's attribute row: an offset when a part's ids are
    consecutive in CSC order (pyg_sar's), else found by search."""
    from pyg_sar.loader.shards.base import EdgeShard
    ptr, src = torch.tensor([0, 2, 4]), torch.tensor([1, 0, 0, 1])
    asked = torch.tensor([6, 8, 5, 6, 7])
    for eid in (torch.tensor([5, 6, 7, 8]), torch.tensor([7, 5, 8, 6])):
        shard = EdgeShard(ptr, src, eid, {})
        assert torch.equal(eid[shard.edge_rows(asked)], asked)
        assert (shard._eid_start is None) == (eid[0] == 7)


# Input validation (one process, no process group) ###########################

@pytest.fixture(scope='module')
def small_parts(tmp_path_factory):
    data = datasets.synthetic_graph(120, 5, 4, 3, seed=3)
    root = tmp_path_factory.mktemp('loader_small')
    partition_graph(data, 1, str(root / 'one'))
    partition_graph(data, 2, str(root / 'two'))
    return str(root / 'one'), str(root / 'two')


def test_bad_input_raises_clear_errors(small_parts):
    one, two = small_parts
    part = load_partition(one, 0)
    with pytest.raises(ValueError, match='mask has length 5'):
        DistNeighborLoader(part, [2], input_nodes=torch.ones(5, dtype=bool))
    with pytest.raises(ValueError, match='not owned by rank 0'):
        DistNeighborLoader(part, [2], input_nodes=torch.tensor([3, 500]),
                           ids='partition')
    with pytest.raises(ValueError, match=r"outside \[0, 120\) \(the dataset"):
        DistNeighborLoader(part, [2], input_nodes=torch.tensor([3, 500]))
    with pytest.raises(TypeError, match='integer tensor of node ids'):
        DistNeighborLoader(part, [2], input_nodes=torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"num_neighbors\[1\]"):
        DistNeighborLoader(part, [2, -2])
    with pytest.raises(ValueError, match=r"num_neighbors\[0\]"):
        DistNeighborLoader(part, [2.5])
    with pytest.raises(TypeError, match='list of ints'):
        DistNeighborLoader(part, 3)
    with pytest.raises(ValueError, match='batch_size'):
        DistNeighborLoader(part, [2], batch_size=0)
    with pytest.raises(ValueError, match='num_workers'):
        DistNeighborLoader(part, [2], num_workers=-1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'foo'"):
        DistNeighborLoader(part, [2], foo=1)
    with pytest.raises(TypeError, match='Partition'):
        DistNeighborLoader(torch.zeros(3), [2])

    part0 = load_partition(two, 0)
    owned_by_1 = int(part0.node_ptr[1])
    with pytest.raises(ValueError, match='owned by rank 1'):
        DistNeighborLoader(part0, [2], input_nodes=torch.tensor([owned_by_1]),
                           ids='partition')
    with pytest.raises(ValueError, match='launch one worker per part'):
        DistNeighborLoader(part0, [2])  # 2 parts, but no process group


def test_single_process_epoch_and_kwargs(small_parts):
    part = load_partition(small_parts[0], 0)
    loader = DistNeighborLoader(part, [4, -1], batch_size=50, drop_last=True,
                                num_workers=0, pin_memory=False,
                                transform=lambda b: b.update({'seen': 1}))
    batches = list(loader)
    assert len(loader) == len(batches) == 2
    assert all(b.seen == 1 and b.batch_size == 50 for b in batches)
    assert torch.equal(torch.cat([b.n_id[:50] for b in batches]),
                       torch.arange(100))


# Distributed checks ##########################################################

def _reference(root, world_size):
    """The whole partitioned graph in partition ids: node attributes, and
    source, destination and attribute of every edge id."""
    parts = [load_partition(root, r) for r in range(world_size)]
    num_nodes, num_edges = parts[0].num_nodes, parts[0].num_edges
    x = torch.cat([p.x for p in parts])
    y = torch.cat([p.y for p in parts])
    src = torch.empty(num_edges, dtype=torch.long)
    dst = torch.empty(num_edges, dtype=torch.long)
    edge_attr = torch.empty(num_edges, parts[0].edge_attr.size(1))
    for p in parts:
        src[p.csc_eid], dst[p.csc_eid] = p.edge_index
        edge_attr[p.csc_eid] = p.edge_attr
    in_degree = torch.bincount(dst, minlength=num_nodes)
    return dict(x=x, y=y, src=src, dst=dst, edge_attr=edge_attr,
                in_degree=in_degree)


def _check_batch(batch, ref, fanouts, input_nodes, replace=False):
    """Asserts the NeighborLoader layout and sampling rules for one batch."""
    n_id, row, col = batch.n_id, batch.edge_index[0], batch.edge_index[1]
    bs = batch.batch_size
    assert n_id.unique().numel() == n_id.numel()
    # A mask's input_id is the seeds' ids (PyG's mask.nonzero()); ids' are
    # their positions in the ids.
    assert torch.equal(n_id[:bs], batch.input_id if input_nodes is None
                       else input_nodes[batch.input_id])
    # Every sampled edge exists, flowing from neighbor to target.
    assert torch.equal(ref['src'][batch.e_id], n_id[row])
    assert torch.equal(ref['dst'][batch.e_id], n_id[col])
    assert torch.equal(batch.x, ref['x'][n_id])
    assert torch.equal(batch.y, ref['y'][n_id])
    assert torch.equal(batch.edge_attr, ref['edge_attr'][batch.e_id])
    assert sum(batch.num_sampled_nodes) == n_id.numel()
    assert sum(batch.num_sampled_edges) == batch.e_id.numel()
    node_start, edge_start = 0, 0
    for hop, fanout in enumerate(fanouts):
        num_targets = batch.num_sampled_nodes[hop]
        num_edges = batch.num_sampled_edges[hop]
        hop_col = col[edge_start:edge_start + num_edges] - node_start
        assert bool(((hop_col >= 0) & (hop_col < num_targets)).all())
        targets = n_id[node_start:node_start + num_targets]
        degree = ref['in_degree'][targets]
        expected = torch.where(degree > 0, fanout, 0) if replace else (
            degree if fanout < 0 else degree.clamp(max=fanout))
        assert torch.equal(torch.bincount(hop_col, minlength=num_targets),
                           expected), f'hop {hop}'
        if not replace:
            assert batch.e_id[edge_start:edge_start + num_edges].unique(
            ).numel() == num_edges
        # New nodes of this hop are exactly the next block of n_id.
        hop_row = row[edge_start:edge_start + num_edges]
        assert bool((hop_row < node_start + num_targets +
                     batch.num_sampled_nodes[hop + 1]).all())
        node_start += num_targets
        edge_start += num_edges


def _distributed_checks(rank, world_size, root):
    from torch_geometric.distributed import LocalFeatureStore, LocalGraphStore
    from pyg_sar import comm
    ref = _reference(root, world_size)
    part = load_partition(root, rank)
    report = {}

    # 1. One shuffled epoch over a mask: layout, sampling rules, coverage.
    mask = part.train_mask | part.val_mask
    loader = DistNeighborLoader(part, FANOUTS, input_nodes=mask,
                                batch_size=7, shuffle=True, seed=5,
                                ids='partition', pad_batches=False)
    input_nodes = mask.nonzero().view(-1) + int(part.node_ptr[rank])
    seeds, first_epoch = [], []
    for batch in loader:
        _check_batch(batch, ref, FANOUTS, None)  # a mask
        seeds.append(batch.n_id[:batch.batch_size])
        first_epoch.append(batch.n_id)
    report['seeds'] = torch.cat(seeds) if seeds else torch.empty(0)
    report['input_nodes'] = input_nodes
    assert len(first_epoch) == loader.num_batches

    # 2. Same seed and world size: the same batches, also from PyG's stores.
    stores = (LocalFeatureStore.from_partition(root, rank),
              LocalGraphStore.from_partition(root, rank))
    again = DistNeighborLoader(stores, FANOUTS, input_nodes=mask,
                               batch_size=7, shuffle=True, seed=5,
                               pad_batches=False)
    repeat = [b.n_id for b in again]
    assert len(repeat) == len(first_epoch)
    assert all(torch.equal(a, b) for a, b in zip(first_epoch, repeat))

    # 3. All neighbors and sampling with replacement.
    for fanouts, replace in (([-1, 2], False), ([4, 3], True)):
        loader = DistNeighborLoader(part, fanouts, batch_size=16,
                                    replace=replace, seed=1, ids='partition',
                                    pad_batches=False)
        for batch in loader:
            _check_batch(batch, ref, fanouts, part.node_ids, replace=replace)

    # 4. Uneven batch counts; the last rank has no input nodes at all.
    start = int(part.node_ptr[rank])
    count = 0 if rank == world_size - 1 and world_size > 1 else 3 + 5 * rank
    own = torch.arange(start, start + count)
    loader = DistNeighborLoader(part, FANOUTS, input_nodes=own, batch_size=4,
                                seed=2, ids='partition', pad_batches=False)
    plain = list(loader)
    assert len(plain) == loader.num_batches == -(-count // 4)
    assert sorted(torch.cat([b.n_id[:b.batch_size] for b in plain] +
                            [own[:0]]).tolist()) == own.tolist()
    # Padded: every rank yields num_global_batches, so a collective per step
    # (as all_reduce_grads in training) stays in lockstep.
    padded = DistNeighborLoader(part, FANOUTS, input_nodes=own, batch_size=4,
                                seed=2, pad_batches=True, ids='partition')
    steps = 0
    for batch in padded:
        if steps >= padded.num_batches:
            assert batch.batch_size == 0 and batch.n_id.numel() == 0
            assert batch.x.shape == (0, part.x.size(1))
        total = comm.global_count(batch.batch_size)
        assert total > 0
        steps += 1
    assert steps == len(padded) == padded.num_global_batches
    report['num_global_batches'] = padded.num_global_batches
    return report


@pytest.fixture(scope='module')
def synthetic_parts(tmp_path_factory):
    data = datasets.synthetic_graph(240, 6, 5, 3, seed=11)
    data.edge_attr = torch.randn(data.num_edges, 2)
    root = tmp_path_factory.mktemp('loader_parts')
    roots = {}
    for world_size in (1, 2, 3):
        roots[world_size] = str(root / f'parts{world_size}')
        partition_graph(data, world_size, roots[world_size])
    return roots


@pytest.mark.parametrize('world_size', [1, 2, 3])
def test_distributed_loader(synthetic_parts, world_size):
    reports = run_workers(_distributed_checks, world_size,
                          synthetic_parts[world_size], timeout_s=60)
    seeds = torch.cat([r['seeds'] for r in reports]).long()
    inputs = torch.cat([r['input_nodes'] for r in reports])
    # Over one epoch the seeds are exactly the input nodes, each once.
    assert seeds.numel() == inputs.numel()
    assert torch.equal(seeds.sort().values, inputs.sort().values)
    expected = max(-(-(3 + 5 * r) // 4) for r in range(max(world_size - 1,
                                                           1)))
    assert all(r['num_global_batches'] == expected for r in reports)


# Sampled training, full-graph inference ######################################

def _train_and_infer(rank, world_size, root, data_file):
    import torch.nn.functional as F
    from torch_geometric.nn import SAGEConv
    import pyg_sar
    from pyg_sar import comm
    from pyg_sar.nn import to_distributed

    class SAGE(torch.nn.Module):
        def __init__(self, in_channels, hidden, out_channels):
            super().__init__()
            self.conv1 = SAGEConv(in_channels, hidden)
            self.conv2 = SAGEConv(hidden, out_channels)

        def forward(self, x, edge_index):
            x = F.relu(self.conv1(x, edge_index))
            x = F.dropout(x, p=0.5, training=self.training)
            return self.conv2(x, edge_index)

    torch.manual_seed(0)
    part = load_partition(root, rank)
    num_classes = int(comm.all_reduce(part.y.max().view(1), 'max')) + 1
    model = SAGE(part.x.size(1), 64, num_classes)
    pyg_sar.sync_params(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01,
                                 weight_decay=5e-4)
    loader = DistNeighborLoader(part, [10, 5], input_nodes=part.train_mask,
                                batch_size=32, shuffle=True, seed=0,
                                pad_batches=True)
    for _ in range(20):
        model.train()
        for batch in loader:
            optimizer.zero_grad()
            out = model(batch.x, batch.edge_index)[:batch.batch_size]
            loss = F.cross_entropy(out, batch.y[:batch.batch_size],
                                   reduction='sum')
            (loss / comm.global_count(batch.batch_size)).backward()
            pyg_sar.all_reduce_grads(model)
            optimizer.step()

    model.eval()
    dist_model = to_distributed(copy.deepcopy(model)).eval()
    with torch.no_grad():
        pred = dist_model(part.x, pyg_sar.DistGraph(part)).argmax(-1)
    correct = torch.tensor([int((pred == part.y)[part.test_mask].sum()),
                            int(part.test_mask.sum())])
    comm.all_reduce(correct, 'sum')

    full = torch.load(data_file, weights_only=True)
    with torch.no_grad():
        full_pred = model(full['x'], full['edge_index']).argmax(-1)
    mismatches = int((full_pred[part.orig_ids] != pred).sum())
    return dict(accuracy=float(correct[0]) / float(correct[1]),
                mismatches=mismatches)


def test_sampled_training_then_full_graph_inference(shared_data_root,
                                                    tmp_path):
    data = datasets.load('Cora', shared_data_root)
    # Row-normalized bag-of-words features, as usual for Cora.
    data.x = data.x / data.x.sum(-1, keepdim=True).clamp(min=1)
    root = str(tmp_path / 'cora2')
    partition_graph(data, 2, root)
    data_file = str(tmp_path / 'cora.pt')
    torch.save({'x': data.x, 'edge_index': data.edge_index}, data_file)
    reports = run_workers(_train_and_infer, 2, root, data_file, timeout_s=120)
    assert reports[0]['accuracy'] == reports[1]['accuracy']
    assert reports[0]['accuracy'] >= 0.78, reports
    assert all(r['mismatches'] == 0 for r in reports), reports
