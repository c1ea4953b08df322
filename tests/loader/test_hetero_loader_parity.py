"""PyG's sampling options on heterogeneous parts (issue 28 item 4):
``weight_attr``, ``disjoint``, temporal sampling (node and edge times,
``input_time``, ``'uniform'`` and ``'last'``), ``subgraph_type='induced'``
and ``'bidirectional'``, and DistLinkNeighborLoader (binary and triplet
negatives over the whole destination type), at world sizes 1 to 3, every batch checked against
the input HeteroData through the partition's id maps; the layout against
PyG's NeighborLoader fed the same sample."""
import pytest
import torch
from torch_geometric.loader import NeighborLoader
from torch_geometric.sampler import HeteroSamplerOutput

from pyg_sar import load_partition, partition_graph
from tests._dist import run_workers
from tests._hetero import AUTHOR, CITES, PAPER, WRITES, hard_hetero
from tests.loader.test_hetero_loader import DICT_FANOUTS, _assert_same_batch, \
    _in_partition_ids, _reference, _Replay
from tests._loaders import _old, _old_link

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow


def _graph():
    data = hard_hetero(seed=3)
    g = torch.Generator().manual_seed(7)
    w = torch.rand(data[CITES].edge_index.size(1), generator=g)
    w[::3] = 0.0  # never sampled
    data[CITES].w = w
    for t in (PAPER, AUTHOR):  # node times; 'field' has none
        data[t].t = torch.randint(0, 20, (data[t].num_nodes, ), generator=g)
    for e in (CITES, WRITES):  # edge times on two edge types
        data[e].ts = torch.randint(0, 20, (data[e].edge_index.size(1), ),
                                   generator=g)
    return data


@pytest.fixture(scope='module')
def parts(tmp_path_factory):
    data = _graph()
    root = tmp_path_factory.mktemp('hetero_parity')
    roots = {}
    for world_size in (1, 2, 3):
        roots[world_size] = str(root / f'p{world_size}')
        partition_graph(data, world_size, roots[world_size], progress=False)
    return data, roots


def _edge_time(data, e, time_attr):
    """Every input edge's time, or None where the type is not filtered."""
    if time_attr in data[e]:
        return data[e][time_attr]
    if time_attr in data[e[0]]:
        return data[e[0]][time_attr][data[e].edge_index[0]]
    return None


def _check(batch, data, ref, fanouts, mode, time_attr=None, strategy=None):
    """Asserts the rules of ``mode`` for one batch; returns its edges."""
    perm, eperm = ref['perm'], ref['eperm']
    disjoint = mode in ('disjoint', 'temporal')
    bs = batch[PAPER].batch_size
    orig_n = {t: perm[t][batch[t].n_id] for t in data.node_types}
    tree = {t: batch[t].batch if disjoint else None for t in data.node_types}
    start = {}
    for t in data.node_types:
        for key, value in data[t].items():
            if torch.is_tensor(value) and value.size(0) == data[t].num_nodes:
                assert torch.equal(batch[t][key], value[orig_n[t]]), (t, key)
        key = batch[t].n_id if not disjoint else \
            tree[t] * 10**6 + batch[t].n_id
        assert key.unique().numel() == key.numel(), t  # once (per subtree)
        if mode not in ('bidirectional', ):
            counts = batch[t].num_sampled_nodes
            assert sum(counts) == batch[t].n_id.numel()
            start[t] = [sum(counts[:h]) for h in range(len(counts) + 1)]
    if disjoint:
        assert torch.equal(tree[PAPER][:bs], torch.arange(bs))
    num_edges = 0
    for e in data.edge_types:
        src, _, dst = e
        row, col = batch[e].edge_index
        pairs = torch.stack([orig_n[src][row], orig_n[dst][col]])
        if mode == 'bidirectional':
            # Each edge is an input edge of its type or the reverse of one
            # of its reverse type (PyG's to_bidirectional).
            rev = [r for r in data.edge_types if r[0] == dst and r[2] == src]
            known = set(map(tuple, data[e].edge_index.t().tolist()))
            for r in rev:
                known |= set(map(tuple, data[r].edge_index.flip(0)
                                 .t().tolist()))
            assert set(map(tuple, pairs.t().tolist())) <= known, e
            num_edges += row.numel()
            continue
        orig = eperm[e][batch[e].e_id]
        # Every edge exists in the input, with its attributes.
        assert torch.equal(data[e].edge_index[:, orig], pairs), e
        for key, value in data[e].items():
            if key != 'edge_index' and torch.is_tensor(value):
                assert torch.equal(batch[e][key], value[orig]), (e, key)
        num_edges += row.numel()
        if mode == 'induced':
            inside = {t: torch.zeros(data[t].num_nodes, dtype=torch.bool)
                      for t in data.node_types}
            for t in data.node_types:
                inside[t][orig_n[t]] = True
            src_i, dst_i = data[e].edge_index
            want = (inside[src][src_i] & inside[dst][dst_i]).nonzero()
            assert torch.equal(orig.sort().values, want.view(-1)), e
            assert 'num_sampled_edges' not in batch[e]
            continue
        if disjoint:  # an edge stays inside its subtree
            assert torch.equal(tree[src][row], tree[dst][col]), e
        times = _edge_time(data, e, time_attr) if time_attr else None
        if times is not None:
            seed_time = batch[PAPER].seed_time[tree[dst][col]]
            assert bool((times[orig] <= seed_time).all()), e
        if mode == 'weighted' and e == CITES:
            assert bool((data[e].w[orig] > 0).all())
        per_hop = batch[e].num_sampled_edges
        edge_start = 0
        for hop, fanout in enumerate(fanouts[e]):
            n = per_hop[hop]
            hop_col = col[edge_start:edge_start + n] - start[dst][hop]
            num_targets = batch[dst].num_sampled_nodes[hop]
            assert bool(((hop_col >= 0) & (hop_col < num_targets)).all())
            got = torch.bincount(hop_col, minlength=num_targets)
            targets = range(start[dst][hop], start[dst][hop + 1])
            for i, v in enumerate(targets):
                into = data[e].edge_index[1] == orig_n[dst][v]
                if times is not None:
                    into &= times <= batch[PAPER].seed_time[tree[dst][v]]
                if mode == 'weighted' and e == CITES:
                    into &= data[e].w > 0
                want = int(into.sum()) if fanout < 0 else \
                    min(int(into.sum()), fanout)
                assert int(got[i]) == want, (e, hop, mode)
                if strategy == 'last' and times is not None and want:
                    mine = (hop_col == i).nonzero().view(-1) + edge_start
                    best = times[into].sort(descending=True).values[:want]
                    assert torch.equal(times[orig[mine]].sort(
                        descending=True).values, best), e
            edge_start += n
    return num_edges


MODES = {
    'weighted': dict(weight_attr='w'),
    'disjoint': dict(disjoint=True),
    'induced': dict(subgraph_type='induced'),
    'bidirectional': dict(subgraph_type='bidirectional'),
    'temporal': dict(time_attr='t'),
}


def _worker(rank, world_size, root, data):
    """Every case of :data:`CASES` on this rank; the edges of each."""
    ref = _reference(root, world_size)
    part = load_partition(root, rank)
    return [_case(rank, part, ref, data, mode, extra)
            for mode, extra in CASES]


def _case(rank, part, ref, data, mode, extra):
    kwargs = dict(MODES[mode], **extra)
    start = int(part[PAPER].node_ptr[rank])
    seeds = part[PAPER].train_mask.nonzero().view(-1) + start
    if 'input_time' in kwargs:  # one time per seed
        kwargs['input_time'] = kwargs['input_time'][:seeds.numel()]
    loader = _old(part, DICT_FANOUTS, input_nodes=(
        PAPER, seeds), batch_size=4, shuffle=True, seed=1, **kwargs)
    edges, seen = 0, []
    for batch in loader:
        edges += _check(batch, data, ref, loader.num_neighbors, mode,
                        kwargs.get('time_attr'),
                        kwargs.get('temporal_strategy', 'uniform'))
        seen.append(batch[PAPER].n_id[:batch[PAPER].batch_size])
        if mode == 'temporal' and 'input_time' not in kwargs:
            assert torch.equal(batch[PAPER].seed_time,
                               batch[PAPER].t[:batch[PAPER].batch_size])
    seen = torch.cat(seen) if seen else seeds[:0]
    assert torch.equal(seen.sort().values, seeds.sort().values)
    return edges


CASES = [('weighted', {}), ('disjoint', {}), ('induced', {}),
         ('bidirectional', {}), ('temporal', {}),
         ('temporal', dict(temporal_strategy='last')),
         ('temporal', dict(time_attr='ts',
                           input_time=torch.arange(100) % 20))]


@pytest.mark.parametrize('world_size', [1, 2, 3])
def test_hetero_sampling_options(parts, world_size):
    data, roots = parts
    edges = run_workers(_worker, world_size, roots[world_size], data,
                        timeout_s=240)
    for case in range(len(CASES)):  # every case sampled edges somewhere
        assert sum(r[case] for r in edges) > 0, CASES[case]


def test_same_batches_at_every_world_size_for_full_fanouts(parts):
    """Fanout -1 everywhere: disjoint sampling is deterministic, so every
    world size gives the same subtrees (in input ids)."""
    data, roots = parts
    out = {}
    for world_size in (1, 3):
        out[world_size] = run_workers(_full, world_size, roots[world_size],
                                      timeout_s=120)
    one = sorted(x for r in out[1] for x in r)
    three = sorted(x for r in out[3] for x in r)
    assert one == three and len(one) > 0


def _full(rank, world_size, root):
    ref = _reference(root, world_size)
    part = load_partition(root, rank)
    fanouts = {e: [-1, -1] for e in part.edge_types}
    found = []
    for b in _old(part, fanouts, input_nodes=PAPER,
                                batch_size=3, disjoint=True):
        for i in range(b[PAPER].batch_size):
            seed = int(ref['perm'][PAPER][b[PAPER].n_id[i]])
            subtree = []
            for e in b.edge_types:
                keep = b[e.__getitem__(2)].batch[b[e].edge_index[1]] == i
                subtree.append((e, tuple(sorted(
                    ref['eperm'][e][b[e].e_id[keep]].tolist()))))
            found.append((seed, tuple(subtree)))
    return found


# Layout against PyG's NeighborLoader fed the same sample ####################

def test_temporal_layout_matches_pyg(parts):
    part = load_partition(parts[1][1], 0)
    data = _in_partition_ids(part)
    loader = _old(part, DICT_FANOUTS, input_nodes=PAPER,
                                batch_size=5, time_attr='t', seed=0)
    checked = 0
    for ours in loader:
        seeds = loader.input_nodes[ours[PAPER].input_id]
        theirs = next(iter(NeighborLoader(
            data, [1], input_nodes=(PAPER, seeds),
            input_time=ours[PAPER].seed_time, time_attr='t',
            batch_size=ours[PAPER].batch_size,
            neighbor_sampler=_Replay(ours, PAPER))))
        _assert_same_batch(ours, theirs)
        checked += 1
    assert checked == loader.num_batches > 1


def test_bidirectional_is_pygs_to_bidirectional(parts):
    part = load_partition(parts[1][1], 0)
    kw = dict(input_nodes=PAPER, batch_size=6, seed=5)
    plain = list(_old(part, DICT_FANOUTS, **kw))
    both = list(_old(part, DICT_FANOUTS,
                                   subgraph_type='bidirectional', **kw))
    assert len(plain) == len(both) > 1
    for a, b in zip(plain, both):
        out = HeteroSamplerOutput(
            node={t: a[t].n_id for t in a.node_types},
            row={e: a[e].edge_index[0] for e in a.edge_types},
            col={e: a[e].edge_index[1] for e in a.edge_types},
            edge={e: a[e].e_id for e in a.edge_types}).to_bidirectional()
        for e in a.edge_types:
            assert torch.equal(b[e].edge_index,
                               torch.stack([out.row[e], out.col[e]])), e
            assert ('e_id' in b[e]) == (out.edge[e] is not None), e
        for t in a.node_types:
            assert torch.equal(a[t].n_id, b[t].n_id)
            assert 'num_sampled_nodes' not in b[t]


def test_option_errors_are_clear(parts):
    part = load_partition(parts[1][1], 0)
    cases = [
        (dict(weight_attr='nope'), 'weight_attr'),
        (dict(time_attr='nope'), "time_attr 'nope'"),
        (dict(time_attr='ts'), 'pass input_time'),
        (dict(time_attr='t', input_time=torch.zeros(2)), 'one time per'),
        (dict(input_time=torch.zeros(2)), 'needs time_attr'),
        (dict(subgraph_type='induced', disjoint=True), 'induced'),
        (dict(subgraph_type='full'), 'subgraph_type'),
        (dict(time_attr='t', temporal_strategy='recent'),
         'temporal_strategy'),
        (dict(time_attr='t', temporal_strategy='last', replace=True),
         'replacement'),
        (dict(time_attr='t', weight_attr='w'), 'cannot be combined'),
    ]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            _old(part, [2], input_nodes=PAPER, **kwargs)


# DistLinkNeighborLoader on heterogeneous parts ##############################

LINK_CASES = [(WRITES, None), (WRITES, ('binary', 2)),
              (WRITES, ('triplet', 2)), (CITES, ('binary', 1)),
              (CITES, ('triplet', 1)), (CITES, 'labels')]


def _link_worker(rank, world_size, root, data):
    from torch_geometric.sampler import NegativeSampling
    ref = _reference(root, world_size)
    perm, eperm = ref['perm'], ref['eperm']
    part = load_partition(root, rank)
    out = []
    for edge_type, neg in LINK_CASES:
        src_t, _, dst_t = edge_type
        kwargs = {}
        if neg == 'labels':
            labels = torch.arange(part[edge_type].csc_src.numel()) % 3
            kwargs['edge_label'] = labels
        elif neg is not None:
            kwargs['neg_sampling'] = NegativeSampling(*neg)
        loader = _old_link(
            part, [3, 2], edge_label_index=(edge_type, None), batch_size=4,
            shuffle=True, seed=2, **kwargs)
        assert type(loader).__name__ == 'DistHeteroLinkNeighborLoader'
        negatives, pairs_seen = [], []
        for b in loader:
            own = b[edge_type].input_id
            pairs_seen.append(own)
            num_pos = own.numel()
            pos = loader.edge_label_index[:, own]
            n_src, n_dst = b[src_t].n_id, b[dst_t].n_id
            # Seeds first in n_id: the distinct endpoints of each type.
            ends = {src_t: [], dst_t: []}
            if neg is not None and neg != 'labels' and neg[0] == 'triplet':
                s, p = b[src_t].src_index, b[dst_t].dst_pos_index
                n = b[dst_t].dst_neg_index
                assert n.shape == ((num_pos, ) if neg[1] == 1 else
                                   (num_pos, neg[1]))
                assert torch.equal(torch.stack([n_src[s], n_dst[p]]), pos)
                negatives.append(n_dst[n].reshape(-1))
                ends[src_t].append(n_src[s])
                ends[dst_t] += [n_dst[p], n_dst[n].reshape(-1)]
            else:
                eli = b[edge_type].edge_label_index
                label = b[edge_type].edge_label if 'edge_label' in \
                    b[edge_type] else None
                got = torch.stack([n_src[eli[0]], n_dst[eli[1]]])
                assert torch.equal(got[:, :num_pos], pos)
                num_neg = eli.size(1) - num_pos
                assert num_neg == (0 if neg in (None, 'labels') else
                                   num_pos * neg[1])
                if neg == 'labels':
                    assert torch.equal(label, labels[own])
                elif neg is not None:
                    assert torch.equal(label, torch.cat([
                        torch.ones(num_pos), torch.zeros(num_neg)]))
                    negatives.append(got[1, num_pos:])
                ends[src_t].append(got[0])
                ends[dst_t].append(got[1])
            for t, parts in ends.items():
                distinct = torch.cat(parts).unique()
                k = b[t].num_sampled_nodes[0]
                assert torch.equal(b[t].n_id[:k], distinct), t
            for t in data.node_types:
                assert torch.equal(b[t].x, data[t].x[perm[t][b[t].n_id]])
            for e in data.edge_types:
                row, col = b[e].edge_index
                orig = eperm[e][b[e].e_id]
                assert torch.equal(data[e].edge_index[:, orig], torch.stack(
                    [perm[e[0]][b[e[0]].n_id[row]],
                     perm[e[2]][b[e[2]].n_id[col]]])), e
        seen = torch.cat(pairs_seen) if pairs_seen else torch.empty(0)
        assert torch.equal(seen.sort().values,
                           torch.arange(loader.edge_label_index.size(1)))
        owners = part[dst_t].node_ptr
        negs = torch.cat(negatives) if negatives else torch.empty(
            0, dtype=torch.long)
        out.append(torch.searchsorted(owners, negs, right=True) - 1)
    return out


@pytest.mark.parametrize('world_size', [1, 2, 3])
def test_hetero_link_loader(parts, world_size):
    data, roots = parts
    reports = run_workers(_link_worker, world_size, roots[world_size], data,
                          timeout_s=240)
    for case, (_, neg) in enumerate(LINK_CASES):
        if neg is None or neg == 'labels':
            continue
        owners = torch.cat([r[case] for r in reports])
        assert owners.numel() > 0
        # Negatives are drawn over the whole destination type: every part.
        assert set(owners.tolist()) == set(range(world_size)), case


def test_hetero_link_refusals(parts):
    part = load_partition(parts[1][1], 0)
    for kwargs, match in [
            (dict(edge_label_index=(('a', 'b', 'c'), None)), 'edge type'),
            (dict(edge_label_index=(WRITES, torch.zeros(3, 2))), 'shape'),
            (dict(edge_label_index=(WRITES, torch.tensor([[10**6], [0]]))),
             'outside'),
            (dict(edge_label_index=WRITES, disjoint=True), 'disjoint'),
            (dict(edge_label_index=WRITES, time_attr='t'), 'temporal')]:
        with pytest.raises(ValueError, match=match):
            _old_link(part, [2], **kwargs)
