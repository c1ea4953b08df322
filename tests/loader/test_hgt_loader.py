"""Tests of DistHGTLoader (PyG's HGTLoader on collectives): on 1, 2 and 3
gloo ranks of a paper/author/field graph (directed citations, self loops,
duplicate edges, isolated nodes, a part without seeds), every batch against
the whole graph by dataset ids (induced edges, features, budget rules),
HGSampling's iterations against a reference of the whole graph, exact
closures where the budgets are taken whole; in one process the budget²
proportions of the draws, torch_sparse's 50-neighbor cap, the arguments'
refusals and PyG's own HGTLoader where torch_sparse is installed."""
from functools import partial

import pytest
import torch
from torch_geometric.data import HeteroData

from pyg_sar import load_partition, partition_graph
from pyg_sar.loader import DistHGTLoader
from pyg_sar.loader.sampling.hgt import MAX_NEIGHBORS, hgt_sample, \
    in_neighbors
from tests._dist import run_workers
from tests._hetero import PAPER, hard_hetero

# Small per-type budgets (drawn at random) and large ones (taken whole).
SMALL = {'paper': [4, 3], 'author': [3, 2], 'field': [2, 1]}
LARGE = [1000] * 2


def _in_budget(data, sampled):
    """Per node type, the nodes not in ``sampled`` (dataset ids per type)
    with an edge into a node of ``sampled``: HGSampling's budget."""
    out = {t: [] for t in data.node_types}
    for (src, _, dst), store in data.edge_items():
        row, col = store.edge_index
        hit = torch.isin(col, sampled[dst]) & ~torch.isin(row, sampled[src])
        out[src].append(row[hit])
    return {t: torch.cat(v).unique() if v else torch.empty(0, dtype=torch.long)
            for t, v in out.items()}


def _closure(data, seeds, input_type, num_iterations):
    """The nodes HGSampling takes from ``seeds`` when every budget is taken
    whole (all num_samples at least the budget)."""
    sampled = {t: seeds if t == input_type else torch.empty(0,
                                                            dtype=torch.long)
               for t in data.node_types}
    for _ in range(num_iterations):
        budget = _in_budget(data, sampled)
        sampled = {t: torch.cat([sampled[t], budget[t]]) for t in sampled}
    return sampled


def _check_iterations(data, n_id, counts, num_samples):
    """Every iteration of one HGSampling run (dataset ids per type, counts
    per iteration): its draws are budget nodes of the nodes sampled before
    it, ``min(num_samples, budget size)`` of them (all when they fit)."""
    before = {t: n_id[t][:counts[t][0]] for t in n_id}
    for i in range(len(counts[next(iter(n_id))]) - 1):
        budget = _in_budget(data, before)
        for t in n_id:
            start = sum(counts[t][:i + 1])
            drawn = n_id[t][start:start + counts[t][i + 1]]
            assert counts[t][i + 1] == min(num_samples[t][i],
                                           budget[t].numel()), (t, i)
            assert bool(torch.isin(drawn, budget[t]).all()), (t, i)
        before = {t: n_id[t][:sum(counts[t][:i + 2])] for t in n_id}


def _check_batch(batch, data, num_samples, input_nodes):
    """One batch against the whole graph ``data`` (dataset ids): seeds,
    features, per-type counts, induced edges and budget reachability."""
    bs = batch[PAPER].batch_size
    assert batch.node_types == data.node_types
    assert batch.edge_types == data.edge_types
    assert 'num_sampled_nodes' not in batch[PAPER]  # as PyG's HGTLoader
    seeds = batch[PAPER].n_id[:bs]
    # A mask's input_id is the seeds' ids (PyG's mask.nonzero()); ids' are
    # their positions in the ids.
    assert torch.equal(seeds, batch[PAPER].input_id if input_nodes is None
                       else input_nodes[batch[PAPER].input_id])
    for t in data.node_types:
        n_id = batch[t].n_id
        assert n_id.unique().numel() == n_id.numel(), t
        drawn = n_id.numel() - (bs if t == PAPER else 0)
        assert drawn <= sum(num_samples[t]), t
        if bs == 0:
            assert n_id.numel() == 0
        for key, value in data[t].items():
            assert torch.equal(batch[t][key], value[n_id]), (t, key)
    reached = {t: torch.zeros(batch[t].n_id.numel(), dtype=torch.bool)
               for t in data.node_types}
    reached[PAPER][:bs] = True
    for e in data.edge_types:
        src, _, dst = e
        row, col = batch[e].edge_index
        e_id = batch[e].e_id
        # Exactly the whole graph's edges between the batch's nodes, ...
        ei = data[e].edge_index
        inside = torch.isin(ei[0], batch[src].n_id) & \
            torch.isin(ei[1], batch[dst].n_id)
        assert torch.equal(e_id.sort().values, inside.nonzero().view(-1)), e
        assert torch.equal(ei[:, e_id], torch.stack(
            [batch[src].n_id[row], batch[dst].n_id[col]])), e
        for key, value in data[e].items():
            if key != 'edge_index':
                assert torch.equal(batch[e][key], value[e_id]), (e, key)
        # ... by destination in batch order.
        assert bool((col[1:] >= col[:-1]).all()), e
    # Every drawn node entered a budget: an in-neighbor of a node sampled
    # before it, so every node is reached from the seeds against the edges.
    grew = True
    while grew:
        grew = False
        for (src, _, dst), store in batch.edge_items():
            row, col = store.edge_index
            hit = row[reached[dst][col] & ~reached[src][row]]
            if hit.numel():
                reached[src][hit] = True
                grew = True
    for t in data.node_types:
        assert bool(reached[t].all()), t


def _same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for t in x.node_types:
            assert torch.equal(x[t].n_id, y[t].n_id)
            assert torch.equal(x[t].x, y[t].x)
        for e in x.edge_types:
            assert torch.equal(x[e].edge_index, y[e].edge_index)
            assert torch.equal(x[e].e_id, y[e].e_id)


def _checks(rank, world_size, root, data):
    from pyg_sar import comm
    parts = [load_partition(root, r) for r in range(world_size)]
    perm = {t: torch.cat([p[t].orig_ids for p in parts])
            for t in data.node_types}
    part = parts[rank]
    mask = data[PAPER].train_mask
    train = mask.nonzero().view(-1)
    report = {}

    # 1. A shuffled epoch over the whole graph's mask, PyG's positional
    # order (input_nodes, is_sorted, transform, transform_sampler_output,
    # filter_per_worker), as to_hetero_mag.py calls it.
    loader = DistHGTLoader(part, SMALL, (PAPER, mask), False, None, None,
                           None, batch_size=4, shuffle=True, seed=3,
                           persistent_workers=True)
    first = list(loader)
    for batch in first:
        _check_batch(batch, data, SMALL, None)  # a mask
    assert len(first) == len(loader) == loader.num_batches
    report['seeds'] = torch.cat([b[PAPER].n_id[:b[PAPER].batch_size]
                                 for b in first] or [train[:0]])
    report['batches'] = len(first)
    # num_workers > 0: the same batches.
    _same_batches(first, list(DistHGTLoader(
        part, SMALL, (PAPER, mask), batch_size=4, shuffle=True, seed=3,
        num_workers=2, persistent_workers=True)))

    # 2. HGSampling's iterations, per type, against the whole graph.
    own = torch.arange(int(part[PAPER].node_ptr[rank]),
                       int(part[PAPER].node_ptr[rank + 1]))[rank::3][:4]
    for num_samples in (SMALL, {t: [1, 2, 4] for t in data.node_types}):
        n_id, counts = hgt_sample(
            {PAPER: own}, loader.batch_ids, num_samples,
            partial(in_neighbors, loader.shard, rank=rank,
                    world_size=world_size, generator=loader.generator),
            loader.generator)
        _check_iterations(data, {t: perm[t][v] for t, v in n_id.items()},
                          counts, num_samples)

    # 3. Budgets taken whole: the closure of the seeds, exactly; dataset
    # ids as input, none on the last rank's part.
    last = parts[-1][PAPER].orig_ids
    ids = train[~torch.isin(train, last)] if world_size > 1 else train
    whole = DistHGTLoader(part, LARGE, input_nodes=(PAPER, ids),
                          batch_size=3, seed=1)
    for batch in whole:
        _check_batch(batch, data, {t: LARGE for t in data.node_types}, ids)
        bs = batch[PAPER].batch_size
        want = _closure(data, batch[PAPER].n_id[:bs], PAPER, len(LARGE))
        for t in data.node_types:
            assert torch.equal(batch[t].n_id.sort().values,
                               want[t].sort().values), t
    report['whole'] = len(whole)

    # 4. Padded instead of balanced: the seedless part yields empty batches
    # in lockstep.
    padded = DistHGTLoader(part, SMALL, input_nodes=(PAPER, ids),
                           batch_size=3, seed=2, pad_batches=True)
    steps = 0
    for batch in padded:
        _check_batch(batch, data, SMALL, ids)
        if rank == world_size - 1 and world_size > 1:
            assert batch[PAPER].batch_size == 0
        assert comm.global_count(batch[PAPER].batch_size) > 0
        steps += 1
    report['padded'] = steps
    return report


@pytest.fixture(scope='module')
def hetero_parts(tmp_path_factory):
    data = hard_hetero(seed=2)
    root = tmp_path_factory.mktemp('hgt_loader')
    roots = {}
    for world_size in (1, 2, 3):
        roots[world_size] = str(root / f'parts{world_size}')
        partition_graph(data, world_size, roots[world_size], progress=False)
    return data, roots


@pytest.mark.parametrize('world_size', [1, 2, 3])
def test_hgt_loader_distributed(hetero_parts, world_size):
    data, roots = hetero_parts
    for store in data.edge_stores:  # the reference ignores the cap
        assert int(torch.bincount(store.edge_index[1]).max()) <= MAX_NEIGHBORS
    reports = run_workers(_checks, world_size, roots[world_size], data)
    seeds = torch.cat([r['seeds'] for r in reports])
    train = data[PAPER].train_mask.nonzero().view(-1)
    # One epoch: every training paper, once, over all ranks.
    assert torch.equal(seeds.sort().values, train)
    for key in ('batches', 'whole', 'padded'):  # the same count everywhere
        assert len({r[key] for r in reports}) == 1, key


# One process ###############################################################

def _one_part(data, tmp_path, name='one'):
    partition_graph(data, 1, str(tmp_path / name), progress=False)
    return load_partition(str(tmp_path / name), 0)


def _gadget(copies=1):
    """Papers 2g, 2g + 1 and authors 3g .. 3g + 2 per copy g: author 3g
    writes paper 2g once, 3g + 1 twice, 3g + 2 once, and writes paper
    2g + 1 (its only author): budgets 1/4, 2/4, 1/4 + 1."""
    data = HeteroData()
    data[PAPER].x = torch.randn(2 * copies, 2)
    data['author'].x = torch.randn(3 * copies, 2)
    one = torch.tensor([[0, 1, 1, 2, 2], [0, 0, 0, 0, 1]])
    shift = torch.arange(copies).repeat_interleave(5)
    writes = one.repeat(1, copies) + torch.stack([3 * shift, 2 * shift])
    data['author', 'writes', PAPER].edge_index = writes
    data[PAPER, 'written_by', 'author'].edge_index = writes.flip(0)
    return data


def _successive(weights, k):
    """Probability of every k-set when drawing k without replacement, one
    after the other in proportion to ``weights``."""
    from itertools import permutations
    out = {}
    for order in permutations(range(len(weights)), k):
        p, left = 1.0, sum(weights)
        for i in order:
            p *= weights[i] / left
            left -= weights[i]
        key = tuple(sorted(order))
        out[key] = out.get(key, 0.0) + p
    return out


@pytest.mark.parametrize('k', [1, 2])
def test_draws_follow_budget_squared(tmp_path, k):
    copies = 250
    part = _one_part(_gadget(copies), tmp_path)
    loader = DistHGTLoader(part, {PAPER: [0], 'author': [k]},
                           (PAPER, torch.arange(2 * copies)), batch_size=2,
                           seed=0)
    seen = {}
    for _ in range(4):
        for batch in loader:  # one copy of the gadget per batch
            first = int(batch[PAPER].n_id[0]) // 2
            assert batch[PAPER].n_id.tolist() == [2 * first, 2 * first + 1]
            got = tuple(sorted((batch['author'].n_id - 3 * first).tolist()))
            seen[got] = seen.get(got, 0) + 1
    total = sum(seen.values())
    assert total == 4 * copies
    budget = [0.25, 0.5, 1.25]
    want = _successive([b * b for b in budget], k)
    linear = _successive(budget, k)
    assert set(seen) <= set(want)
    for key, p in want.items():
        assert abs(seen.get(key, 0) / total - p) < 0.05, (key, seen, want)
    # Budget (not squared) proportions would have failed.
    assert max(abs(seen.get(key, 0) / total - p)
               for key, p in linear.items()) > 0.1


def test_neighbor_cap_as_torch_sparse(tmp_path):
    data = HeteroData()
    data[PAPER].x = torch.randn(2, 2)
    data['author'].x = torch.randn(70, 2)
    authors = torch.arange(60)
    data['author', 'writes', PAPER].edge_index = torch.stack(
        [authors, torch.zeros(60, dtype=torch.long)])
    part = _one_part(data, tmp_path)
    taken = []
    for seed in (0, 1):
        batch = next(iter(DistHGTLoader(part, [100], (PAPER, [0]),
                                        batch_size=1, seed=seed)))
        n_id = batch['author'].n_id
        assert n_id.numel() == MAX_NEIGHBORS
        assert bool((n_id < 60).all()) and n_id.unique().numel() == 50
        assert batch['author', 'writes', PAPER].e_id.numel() == 50
        taken.append(set(n_id.tolist()))
    assert taken[0] != taken[1]


@pytest.fixture(scope='module')
def one_part(tmp_path_factory):
    data = hard_hetero(seed=2)
    return data, _one_part(data, tmp_path_factory.mktemp('hgt_one'))


@pytest.mark.parametrize('kwargs, error, match', [
    (dict(num_samples={PAPER: [1]}), ValueError, 'every node type'),
    (dict(num_samples={PAPER: [1], 'author': [1], 'field': [1, 2]}),
     ValueError, 'same number of iterations'),
    (dict(num_samples=[2, -1]), ValueError, 'ints >= 0'),
    (dict(num_samples=3), TypeError, 'list of ints'),
    (dict(input_nodes=('venue', None)), ValueError, 'node type'),
    (dict(replace=True), TypeError, "unexpected keyword argument 'replace'"),
    (dict(batch_size=0), ValueError, 'batch_size'),
    (dict(input_time=torch.zeros(3)), ValueError, 'one time per input'),
])
def test_refusals(one_part, kwargs, error, match):
    _, part = one_part
    args = dict(num_samples=[2], input_nodes=PAPER)
    args.update(kwargs)
    with pytest.raises(error, match=match) as info:
        DistHGTLoader(part, **args)
    assert '\n' not in str(info.value)


def test_homogeneous_part_is_refused(hard_part):
    with pytest.raises(ValueError, match='heterogeneous graphs only'):
        DistHGTLoader(hard_part[1], [2], None)


def test_inputs_and_seed_time(one_part):
    data, part = one_part
    mask = data[PAPER].train_mask
    ids = mask.nonzero().view(-1)
    time = torch.arange(ids.numel()) * 10
    by_mask = list(DistHGTLoader(part, SMALL, (PAPER, mask), batch_size=5,
                                 seed=7, input_time=time))
    by_ids = list(DistHGTLoader(part, SMALL, (PAPER, ids), batch_size=5,
                                seed=7))
    _same_batches(by_mask, by_ids)
    for batch in by_mask:
        _check_batch(batch, data, SMALL, None)  # a mask
        # input_time follows the mask's nonzero ids, as in PyG.
        at = torch.searchsorted(ids, batch[PAPER].input_id)
        assert torch.equal(batch[PAPER].seed_time, time[at])
    every = list(DistHGTLoader(part, SMALL, PAPER, batch_size=16))
    assert torch.equal(torch.cat([b[PAPER].n_id[:b[PAPER].batch_size]
                                  for b in every]),
                       torch.arange(data[PAPER].num_nodes))


def test_matches_pyg_hgt_loader(one_part):
    pytest.importorskip('torch_sparse', reason="PyG's HGTLoader needs "
                        "torch_sparse, which this environment lacks")
    from torch_geometric.loader import HGTLoader
    data, part = one_part
    mask = data[PAPER].train_mask
    ours = DistHGTLoader(part, LARGE, (PAPER, mask), batch_size=4, seed=0)
    theirs = HGTLoader(data, LARGE, (PAPER, mask), batch_size=4)
    for a, b in zip(ours, theirs):
        assert torch.equal(a[PAPER].input_id, b[PAPER].input_id)
        for t in data.node_types:
            n_id = b[t].n_id if 'n_id' in b[t] else a[t].n_id[:0]
            assert torch.equal(a[t].n_id.sort().values, n_id.sort().values)
        for e in data.edge_types:
            assert torch.equal(a[e].e_id.sort().values,
                               b[e].e_id.sort().values)


def test_transforms(one_part):
    from torch_geometric.sampler import HeteroSamplerOutput
    data, part = one_part
    outs = []

    def keep(out):
        outs.append(out)
        return out
    plain = list(DistHGTLoader(part, SMALL, PAPER, batch_size=8, seed=4))
    def tag(batch):
        batch.tag = 1
        return batch
    # PyG's order: input_nodes, is_sorted, transform,
    # transform_sampler_output.
    seen = list(DistHGTLoader(part, SMALL, PAPER, False, tag, keep,
                              batch_size=8, seed=4))
    _same_batches(plain, seen)
    assert all(b.tag == 1 for b in seen)
    assert len(outs) == len(plain)
    for out, batch in zip(outs, plain):
        assert isinstance(out, HeteroSamplerOutput)
        assert out.num_sampled_nodes is None  # as PyG's HGTSampler
        assert torch.equal(out.metadata[0], batch[PAPER].input_id)
