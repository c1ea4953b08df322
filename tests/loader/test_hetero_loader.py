"""Tests of heterogeneous sampling: DistNeighborLoader on a heterogeneous
partition, on 1, 2 and 3 gloo ranks (a handcrafted paper/author/field graph
and DBLP), checked against the input HeteroData through the partition's id
maps; the batch layout against PyG's NeighborLoader fed the same sample; and
a to_hetero GraphSAGE trained on the batches on 2 workers."""
import pytest
import torch
from torch_geometric.data import HeteroData
from torch_geometric.loader import NeighborLoader
from torch_geometric.sampler import BaseSampler, HeteroSamplerOutput

from pyg_sar import datasets, load_partition, partition_graph
from pyg_sar.loader import DistHeteroNeighborLoader
from tests._dist import run_workers
from tests._hetero import AUTHOR, CITES, FIELD, HAS, OF, PAPER, WRITES, \
    WRITTEN, hard_hetero
from tests._loaders import _old, _old_link

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow

# Different per edge type, so that a loader ignoring the dict fails the
# per-type fanout checks: 0 (no edges of the type), -1 (all of them).
DICT_FANOUTS = {CITES: [3, 1], WRITES: [2, 0], WRITTEN: [1, 2],
                HAS: [-1, 1], OF: [0, 2]}


def _reference(root, world_size):
    """Maps from the partition's per-type ids to the input's: node ids
    (``perm``) and edge ids (``eperm``), and every edge type's in-degrees
    in partition ids."""
    parts = [load_partition(root, r) for r in range(world_size)]
    node_types, edge_types = parts[0].metadata()
    perm = {t: torch.cat([p[t].orig_ids for p in parts]) for t in node_types}
    eperm = {e: torch.cat([p[e].orig_eids for p in parts])
             for e in edge_types}
    degree = {e: torch.cat([p[e].csc_ptr.diff() for p in parts])
              for e in edge_types}
    return dict(perm=perm, eperm=eperm, degree=degree)


def _check_batch(batch, data, ref, fanouts, input_type, input_nodes,
                 replace=False):
    """Asserts NeighborLoader's heterogeneous layout and the sampling rules
    for one batch, against the input ``data``; returns its edge count."""
    perm, eperm = ref['perm'], ref['eperm']
    bs = batch[input_type].batch_size
    # A mask's input_id is the seeds' ids (PyG's mask.nonzero()); ids'
    # are their positions.
    seeds = batch[input_type].input_id if input_nodes is None else \
        input_nodes[batch[input_type].input_id]
    assert torch.equal(batch[input_type].n_id[:bs], seeds)
    assert batch.node_types == data.node_types
    assert batch.edge_types == data.edge_types
    start = {}  # per node type: first batch-local id of each hop's nodes
    for t in data.node_types:
        n_id = batch[t].n_id
        assert n_id.unique().numel() == n_id.numel(), t
        counts = batch[t].num_sampled_nodes
        assert len(counts) == len(fanouts[data.edge_types[0]]) + 1
        assert sum(counts) == n_id.numel(), t
        assert counts[0] == (bs if t == input_type else 0), t
        start[t] = [sum(counts[:h]) for h in range(len(counts) + 1)]
        orig = perm[t][n_id]
        for key, value in data[t].items():
            if torch.is_tensor(value) and value.size(0) == data[t].num_nodes:
                assert torch.equal(batch[t][key], value[orig]), (t, key)
    num_edges = 0
    for e in data.edge_types:
        src, _, dst = e
        row, col = batch[e].edge_index
        e_id = batch[e].e_id
        orig = eperm[e][e_id]
        # Every sampled edge exists in the input, from neighbor to target.
        assert torch.equal(data[e].edge_index[:, orig], torch.stack(
            [perm[src][batch[src].n_id[row]],
             perm[dst][batch[dst].n_id[col]]])), e
        for key, value in data[e].items():
            if key != 'edge_index' and torch.is_tensor(value):
                assert torch.equal(batch[e][key], value[orig]), (e, key)
        per_hop = batch[e].num_sampled_edges
        assert len(per_hop) == len(fanouts[e])
        assert sum(per_hop) == e_id.numel(), e
        edge_start = 0
        for hop, fanout in enumerate(fanouts[e]):
            n = per_hop[hop]
            hop_col = col[edge_start:edge_start + n] - start[dst][hop]
            num_targets = batch[dst].num_sampled_nodes[hop]
            # Targets are the destination-type nodes new in the last hop ...
            assert bool(((hop_col >= 0) & (hop_col < num_targets)).all())
            targets = batch[dst].n_id[start[dst][hop]:start[dst][hop + 1]]
            degree = ref['degree'][e][targets]
            expected = torch.where(degree > 0, fanout, 0) if replace else (
                degree if fanout < 0 else degree.clamp(max=fanout))
            # ... each with min(degree, fanout of this type and hop) edges.
            assert torch.equal(torch.bincount(hop_col, minlength=num_targets),
                               expected), (e, hop)
            if not replace:
                assert e_id[edge_start:edge_start + n].unique().numel() == n
            # Sources are known before this hop or new in it.
            assert bool((row[edge_start:edge_start + n] <
                         start[src][hop + 2]).all()), (e, hop)
            edge_start += n
        num_edges += e_id.numel()
    return num_edges


def _checks(rank, world_size, root, data, fanouts, input_type):
    """One worker's distributed checks; returns its seeds and inputs."""
    from torch_geometric.distributed import LocalFeatureStore, LocalGraphStore
    from pyg_sar import comm
    ref = _reference(root, world_size)
    part = load_partition(root, rank)
    mask = part[input_type].train_mask
    start = int(part[input_type].node_ptr[rank])
    input_nodes = mask.nonzero().view(-1) + start
    report = dict(input_nodes=input_nodes, edges=0)

    # 1. A shuffled epoch over the training mask, per-edge-type fanouts.
    loader = _old(part, fanouts, input_nodes=(input_type, mask),
                                batch_size=5, shuffle=True, seed=3)
    assert isinstance(loader, DistHeteroNeighborLoader)
    seeds, first = [], []
    for batch in loader:
        report['edges'] += _check_batch(batch, data, ref, loader.num_neighbors,
                                        input_type, None)
        seeds.append(batch[input_type].n_id[:batch[input_type].batch_size])
        first.append(batch)
    assert len(first) == loader.num_batches == len(loader)
    report['seeds'] = torch.cat(seeds) if seeds else input_nodes[:0]

    # 2. Same seed: the same batches, also from PyG's stores.
    stores = (LocalFeatureStore.from_partition(root, rank),
              LocalGraphStore.from_partition(root, rank))
    again = list(_old(stores, fanouts,
                                    input_nodes=(input_type, mask),
                                    batch_size=5, shuffle=True, seed=3))
    assert len(again) == len(first)
    for a, b in zip(first, again):
        _check_batch(b, data, ref, loader.num_neighbors, input_type,
                     None)  # attributes read from PyG's stores
        for t in data.node_types:
            assert torch.equal(a[t].n_id, b[t].n_id)
        for e in data.edge_types:
            assert torch.equal(a[e].edge_index, b[e].edge_index)
            assert torch.equal(a[e].e_id, b[e].e_id)
    # A different seed samples differently (somewhere, on some rank).
    other = list(_old(part, fanouts, input_nodes=input_type,
                                    batch_size=5, seed=4))
    base = list(_old(part, fanouts, input_nodes=input_type,
                                   batch_size=5, seed=3))
    report['differs'] = any(
        not torch.equal(a[e].e_id, b[e].e_id) for a, b in zip(other, base)
        for e in data.edge_types)

    # 3. Sampling with replacement, one list for all edge types, ids input.
    ids = torch.arange(start, start + part[input_type].num_local_nodes)[::2]
    loader = _old(part, [4, 3], input_nodes=(input_type, ids),
                                batch_size=6, replace=True, seed=1)
    for batch in loader:
        _check_batch(batch, data, ref, loader.num_neighbors, input_type, ids,
                     replace=True)

    # 4. Uneven batch counts, the last rank without seeds; padded lockstep.
    count = 0 if rank == world_size - 1 and world_size > 1 else 2 + 3 * rank
    own = torch.arange(start, start + min(count, part[input_type]
                                          .num_local_nodes))
    plain = list(_old(part, fanouts, drop_last=True,
                                    input_nodes=(input_type, own),
                                    batch_size=2, seed=2))
    assert len(plain) == own.numel() // 2
    padded = _old(part, fanouts, input_nodes=(input_type, own),
                                batch_size=2, seed=2, pad_batches=True)
    steps = 0
    for batch in padded:
        if steps >= padded.num_batches:
            assert batch[input_type].batch_size == 0
            assert all(batch[t].n_id.numel() == 0 for t in data.node_types)
            assert batch[input_type].x.size(0) == 0
        assert comm.global_count(batch[input_type].batch_size) > 0
        steps += 1
    assert steps == len(padded) == padded.num_global_batches
    report['num_global_batches'] = steps
    return report


def _run(parts, world_size, data, fanouts, input_type, timeout_s=60):
    reports = run_workers(_checks, world_size, parts, data, fanouts,
                          input_type, timeout_s=timeout_s)
    seeds = torch.cat([r['seeds'] for r in reports])
    inputs = torch.cat([r['input_nodes'] for r in reports])
    # One epoch: every training node of every rank, each exactly once.
    assert seeds.numel() == inputs.numel() > 0
    assert torch.equal(seeds.sort().values, inputs.sort().values)
    assert sum(r['edges'] for r in reports) > 0
    assert any(r['differs'] for r in reports)
    assert len({r['num_global_batches'] for r in reports}) == 1
    return reports


@pytest.fixture(scope='module')
def hard_parts(tmp_path_factory):
    data = hard_hetero(seed=2)
    root = tmp_path_factory.mktemp('hetero_loader')
    roots = {}
    for world_size in (1, 2, 3):
        roots[world_size] = str(root / f'parts{world_size}')
        partition_graph(data, world_size, roots[world_size], progress=False)
    return data, roots


@pytest.mark.parametrize('world_size', [1, 2, 3])
def test_hetero_loader_distributed(hard_parts, world_size):
    data, roots = hard_parts
    _run(roots[world_size], world_size, data, DICT_FANOUTS, PAPER)


def test_hetero_loader_dblp(shared_data_root, tmp_path):
    data = datasets.load('DBLP', shared_data_root)
    root = str(tmp_path / 'dblp2')
    partition_graph(data, 2, root, progress=False)
    fanouts = {e: [4, 2] if e[0] == 'paper' else [2, 3]
               for e in data.edge_types}
    _run(root, 2, data, fanouts, 'author', timeout_s=120)


# Single process: layout, per-type dict, errors ################################

class _Replay(BaseSampler):
    """Hands PyG's NeighborLoader the sample of one of our batches (its
    ``batch`` vectors where the sampling was disjoint, its seed times where
    it was temporal)."""

    def __init__(self, batch, input_type):
        disjoint = all('batch' in batch[t] for t in batch.node_types)
        seed_time = batch[input_type].seed_time \
            if 'seed_time' in batch[input_type] else None
        self.out = HeteroSamplerOutput(
            node={t: batch[t].n_id for t in batch.node_types},
            row={e: batch[e].edge_index[0] for e in batch.edge_types},
            col={e: batch[e].edge_index[1] for e in batch.edge_types},
            edge={e: batch[e].e_id for e in batch.edge_types},
            batch={t: batch[t].batch for t in batch.node_types}
            if disjoint else None,
            num_sampled_nodes={t: batch[t].num_sampled_nodes
                               for t in batch.node_types},
            num_sampled_edges={e: batch[e].num_sampled_edges
                               for e in batch.edge_types},
            metadata=(batch[input_type].input_id, seed_time))

    def sample_from_nodes(self, index, **kwargs):
        return self.out

    def sample_from_edges(self, index, **kwargs):  # pragma: no cover
        raise NotImplementedError


def _assert_same_batch(ours, theirs) -> None:
    """Every node and edge type, every attribute, equal."""
    assert ours.node_types == theirs.node_types
    assert ours.edge_types == theirs.edge_types
    for key in ours.node_types + ours.edge_types:
        assert sorted(ours[key].keys()) == sorted(theirs[key].keys()), key
        for attr, value in theirs[key].items():
            if torch.is_tensor(value):
                assert torch.equal(ours[key][attr], value), (key, attr)
            else:
                assert ours[key][attr] == value, (key, attr)


def _in_partition_ids(part):
    """The one-part graph as a HeteroData in partition ids."""
    data = HeteroData()
    for t in part.node_types:
        for key, value in part[t].node_attrs.items():
            data[t][key] = value
        if not part[t].node_attrs:
            data[t].num_nodes = part[t].num_local_nodes
    for e in part.edge_types:
        order = torch.argsort(part[e].csc_eid)
        data[e].edge_index = part[e].edge_index[:, order]
        for key, value in part[e].edge_attrs.items():
            data[e][key] = value[order]
    return data


@pytest.fixture(scope='module')
def one_part(hard_parts):
    return load_partition(hard_parts[1][1], 0)


def test_layout_matches_pyg_neighbor_loader(tmp_path):
    graph = hard_hetero(seed=5)
    del graph[AUTHOR].x  # a type with num_nodes only, as DBLP's conference
    graph[AUTHOR].num_nodes = 25
    partition_graph(graph, 1, str(tmp_path / 'one'), progress=False)
    part = load_partition(str(tmp_path / 'one'), 0)
    data = _in_partition_ids(part)
    loader = _old(part, DICT_FANOUTS, input_nodes=(
        PAPER, part[PAPER].train_mask), batch_size=4, shuffle=True, seed=0)
    checked = 0
    for ours in loader:
        theirs = next(iter(NeighborLoader(
            data, [1], input_nodes=(PAPER, ours[PAPER].input_id),  # a mask's
            batch_size=ours[PAPER].batch_size,
            neighbor_sampler=_Replay(ours, PAPER))))
        _assert_same_batch(ours, theirs)
        checked += 1
    assert checked == loader.num_batches > 1


def test_per_edge_type_dict_is_respected(one_part):
    part = one_part
    # Only citations are sampled; every other type must stay empty.
    only = {e: [0, 0] for e in part.edge_types}
    only[CITES] = [-1, 2]
    batches = list(_old(part, only, input_nodes=PAPER,
                                      batch_size=8, seed=0))
    assert sum(b[CITES].e_id.numel() for b in batches) > 0
    for b in batches:
        assert all(b[e].e_id.numel() == 0 for e in part.edge_types
                   if e != CITES)
        assert b[AUTHOR].n_id.numel() == b[FIELD].n_id.numel() == 0
    # Hop 1 takes every citation into every seed (fanout -1).
    degree = part[CITES].csc_ptr.diff()
    for b in batches:
        seeds = b[PAPER].n_id[:b[PAPER].batch_size]
        assert b[CITES].num_sampled_edges[0] == int(degree[seeds].sum())
    # The reverse choice: authors only, all of them, no citation.
    authors = {e: [0] for e in part.edge_types}
    authors[WRITES] = [-1]
    writes_degree = part[WRITES].csc_ptr.diff()
    for b in _old(part, authors, input_nodes=PAPER,
                                batch_size=8, seed=0):
        seeds = b[PAPER].n_id[:b[PAPER].batch_size]
        assert b[CITES].e_id.numel() == 0
        assert b[WRITES].e_id.numel() == int(writes_degree[seeds].sum())
    # String keys as PyG writes them, and PyG's NumNeighbors, are the same.
    from torch_geometric.sampler import NumNeighbors
    as_str = {'__'.join(e): v for e, v in only.items()}
    for fanouts in (as_str, NumNeighbors(only)):
        again = list(_old(part, fanouts, input_nodes=PAPER,
                                        batch_size=8, seed=0))
        assert all(torch.equal(a[CITES].e_id, b[CITES].e_id)
                   for a, b in zip(batches, again))


def test_hetero_errors_are_clear(one_part):
    part = one_part
    mask = part[PAPER].train_mask
    cases = [
        (dict(input_nodes=mask), ValueError, 'node type'),
        (dict(input_nodes=('venue', mask)), ValueError, "'venue'"),
        (dict(input_nodes=(PAPER, mask[:3])), ValueError, 'mask has length'),
        (dict(input_nodes=(PAPER, torch.tensor([10**6]))), ValueError,
         'not owned by rank 0'),
        # (the sampling options: tests/loader/test_hetero_loader_parity.py)
        (dict(input_nodes=PAPER, time_attr='t'), ValueError,
         "time_attr 't' is neither"),
        (dict(input_nodes=PAPER, weight_attr='w'), ValueError,
         "weight_attr 'w' is not an edge attribute"),
        (dict(input_nodes=PAPER, batch_size=0), ValueError, 'batch_size'),
    ]
    for kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            _old(part, [2], **kwargs)
    with pytest.raises(ValueError, match='must be an edge type'):
        _old_link(part, [2])  # needs edge_label_index
    with pytest.raises(ValueError, match='misses edge types'):
        _old(part, {CITES: [2]}, input_nodes=PAPER)
    with pytest.raises(ValueError, match="lacks"):
        _old(part, {**DICT_FANOUTS, ('a', 'b', 'c'): [1, 1]},
                           input_nodes=PAPER)
    with pytest.raises(ValueError, match='same number of hops'):
        _old(part, {**DICT_FANOUTS, CITES: [1]},
                           input_nodes=PAPER)
    with pytest.raises(ValueError, match=r"num_neighbors\[.*cites"):
        _old(part, {**DICT_FANOUTS, CITES: [1, -3]},
                           input_nodes=PAPER)


# Sampled training of a to_hetero model on 2 workers #########################

def _train(rank, world_size, root, epochs):
    import torch.nn.functional as F
    from torch_geometric.nn import SAGEConv, to_hetero
    import pyg_sar
    from pyg_sar import comm

    class SAGE(torch.nn.Module):
        def __init__(self, hidden, out_channels):
            super().__init__()
            self.conv1 = SAGEConv((-1, -1), hidden)
            self.conv2 = SAGEConv((-1, -1), out_channels)

        def forward(self, x, edge_index):
            return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)

    torch.manual_seed(0)
    part = load_partition(root, rank)
    model = to_hetero(SAGE(32, 4), part.metadata(), aggr='sum')
    loader = _old(part, {e: [6, 4] for e in part.edge_types},
                                input_nodes=(PAPER, part[PAPER].train_mask),
                                batch_size=16, shuffle=True, seed=0,
                                pad_batches=True)
    optimizer = None
    losses = []
    for _ in range(epochs):
        total = torch.zeros(2, dtype=torch.float64)
        for batch in loader:
            if optimizer is None:  # lazy shapes, then equal weights
                with torch.no_grad():
                    model(batch.x_dict, batch.edge_index_dict)
                pyg_sar.sync_params(model)
                optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
            bs = batch[PAPER].batch_size
            optimizer.zero_grad()
            out = model(batch.x_dict, batch.edge_index_dict)[PAPER][:bs]
            loss = F.cross_entropy(out, batch[PAPER].y[:bs], reduction='sum')
            (loss / comm.global_count(bs)).backward()
            pyg_sar.all_reduce_grads(model)
            optimizer.step()
            total += torch.tensor([float(loss), bs], dtype=torch.float64)
        comm.all_reduce(total, 'sum')
        losses.append(float(total[0] / total[1]))
    return losses


def test_to_hetero_sage_trains_on_two_workers(tmp_path):
    import torch_geometric.transforms as T
    from pyg_sar.datasets.synthetic_hetero import synthetic_hetero_graph
    data = synthetic_hetero_graph(400, num_features=16, num_classes=4,
                                  seed=1)
    data = T.ToUndirected()(data)  # every type receives messages
    for t in data.node_types:
        if 'x' not in data[t]:
            data[t].x = torch.ones(data[t].num_nodes, 1)
    root = str(tmp_path / 'synthetic2')
    partition_graph(data, 2, root, progress=False)
    losses = run_workers(_train, 2, root, 6, timeout_s=120)
    assert losses[0] == losses[1]  # the same global loss on both ranks
    assert losses[0][-1] < 0.7 * losses[0][0], losses[0]
