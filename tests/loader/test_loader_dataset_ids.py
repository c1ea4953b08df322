"""The loaders as PyG scripts use them (issue 37): whole-graph masks and
dataset ids as inputs, batches in dataset ids (``x_all[batch.n_id]``),
``e_id`` and ``input_id`` as PyG's, balanced inputs by default (every rank
the same number of non-empty batches; a stock mean loss on a rank without
training nodes), the background thread of ``num_workers``, and the PyG
keywords (``transform_sampler_output``, ``generator``,
``worker_init_fn``, ``collate_fn``, ``directed``), at world sizes 1 to 3.
"""
import threading
import warnings

import pytest
import torch

from pyg_sar import datasets, load_partition, partition_graph
from pyg_sar.loader import DistLinkNeighborLoader, DistNeighborLoader
from tests._dist import run_workers
from tests._hetero import CITES, PAPER, WRITES, hard_hetero

FANOUTS = [3, 2]


def _graph():
    """Directed, with self loops, duplicate edges and isolated nodes."""
    data = datasets.synthetic_graph(150, 4, 5, 3, seed=21)
    loops = torch.tensor([[3, 8, 8], [3, 8, 8]])
    data.edge_index = torch.cat([data.edge_index, loops,
                                 data.edge_index[:, :5]], 1)
    keep = (data.edge_index != 140).all(0) & (data.edge_index != 141).all(0)
    data.edge_index = data.edge_index[:, keep]  # 140, 141 isolated
    data.edge_attr = torch.randn(data.edge_index.size(1), 2)
    return data


@pytest.fixture(scope='module')
def parts(tmp_path_factory):
    data = _graph()
    root = tmp_path_factory.mktemp('dataset_ids')
    roots = {}
    for world_size in (1, 2, 3):
        roots[world_size] = str(root / f'p{world_size}')
        partition_graph(data, world_size, roots[world_size])
    return data, roots


def _check(batch, data):
    """The batch in dataset ids: attributes, edges and edge ids index the
    input graph, as a PyG NeighborLoader batch does."""
    assert torch.equal(data.x[batch.n_id], batch.x)
    assert torch.equal(data.y[batch.n_id], batch.y)
    assert torch.equal(data.edge_index[:, batch.e_id],
                       batch.n_id[batch.edge_index])
    assert torch.equal(data.edge_attr[batch.e_id], batch.edge_attr)


def _seeds(loader, data, inputs):
    """One epoch: every batch checked; the seeds (dataset ids) of each
    batch, which are ``inputs[input_id]``."""
    out = []
    for batch in loader:
        _check(batch, data)
        seeds = batch.n_id[:batch.batch_size]
        # A mask's (inputs None) input_id is the seeds' ids, as in PyG.
        assert torch.equal(batch.input_id if inputs is None else
                           inputs[batch.input_id], seeds)
        out.append(seeds)
    return out


def _node_worker(rank, world_size, root, data):
    from pyg_sar import comm
    part = load_partition(root, rank)
    report = {}
    # 1. PyG's script: the whole graph's mask, the same on every rank.
    mask = data.train_mask | data.val_mask
    loader = DistNeighborLoader(part, FANOUTS, input_nodes=mask,
                                batch_size=5, shuffle=True, seed=3)
    batches = _seeds(loader, data, None)
    report['mask'] = torch.cat(batches)
    report['sizes'] = [b.numel() for b in batches]
    assert len(batches) == len(loader) == loader.num_batches
    assert loader.data is part and len(loader.dataset) == sum(
        report['sizes'])
    # The part's own mask gives the same seeds (before balancing, the
    # seeds this rank owns).
    local = DistNeighborLoader(part, FANOUTS, input_nodes=part.train_mask |
                               part.val_mask, batch_size=5, pad_batches=False)
    owned = torch.cat([b.n_id[:b.batch_size] for b in local] +
                      [torch.empty(0, dtype=torch.long)])
    assert torch.equal(owned.sort().values,
                       part.orig_ids[(part.train_mask |
                                      part.val_mask)].sort().values)

    # 2. Dataset ids, any order; input_id their positions.
    ids = torch.randperm(data.num_nodes,
                         generator=torch.Generator().manual_seed(1))[:37]
    loader = DistNeighborLoader(part, FANOUTS, ids, batch_size=4, seed=1)
    report['ids'] = torch.cat(_seeds(loader, data, ids))

    # 3. Layer-wise inference reads x_all[batch.n_id]: no features fetched.
    bare = DistNeighborLoader(part, [-1], batch_size=16, node_attrs=[],
                              seed=0)
    for batch in bare:
        assert 'x' not in batch and 'y' not in batch
        assert torch.equal(data.edge_index[:, batch.e_id],
                           batch.n_id[batch.edge_index])
    only_x = next(iter(DistNeighborLoader(part, [2], batch_size=8,
                                          node_attrs=['x'], seed=0)))
    assert 'x' in only_x and 'y' not in only_x

    # 4. num_workers: a background thread, the same batches as without.
    def epoch(workers, **kwargs):
        loader = DistNeighborLoader(part, FANOUTS, input_nodes=mask,
                                    batch_size=3, shuffle=True, seed=9,
                                    num_workers=workers, **kwargs)
        return [(b.n_id, b.e_id, b.input_id) for b in loader]
    plain, threaded = epoch(0), epoch(2, prefetch_factor=1)
    assert len(plain) == len(threaded) > 1
    for a, b in zip(plain, threaded):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    # Left early (break), then a collective and a new epoch.
    seen = []
    loader = DistNeighborLoader(
        part, FANOUTS, input_nodes=mask, batch_size=3, seed=9, num_workers=1,
        worker_init_fn=lambda i: seen.append(
            (i, threading.current_thread() is threading.main_thread())))
    for step, batch in enumerate(loader):
        if step == rank:  # each rank leaves at another step
            break
    assert comm.global_count(1) == world_size
    assert sum(1 for _ in loader) == len(loader)
    assert seen == [(0, False), (0, False)]

    # 5. transform_sampler_output sees the sample (partition ids) before
    # the fetch; dropping edges keeps their attributes right.
    def drop_half(out):
        keep = torch.arange(0, out.row.numel(), 2)
        out.row, out.col, out.edge = out.row[keep], out.col[keep], \
            out.edge[keep]
        out.num_sampled_edges = None
        return out
    for batch in DistNeighborLoader(part, FANOUTS, batch_size=6, seed=4,
                                    transform_sampler_output=drop_half):
        _check(batch, data)
        assert 'num_sampled_edges' not in batch

    # 6. generator seeds like seed.
    runs = [[b.n_id for b in DistNeighborLoader(
        part, FANOUTS, mask, batch_size=4, shuffle=True,
        generator=torch.Generator().manual_seed(5))] for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    return report


@pytest.mark.parametrize('world_size', [2, 3])
def test_dataset_ids_and_whole_graph_inputs(parts, world_size):
    data, roots = parts
    reports = run_workers(_node_worker, world_size, roots[world_size], data,
                          timeout_s=90)
    mask = data.train_mask | data.val_mask
    seeds = torch.cat([r['mask'] for r in reports])
    assert torch.equal(seeds.sort().values, mask.nonzero().view(-1))
    ids = torch.cat([r['ids'] for r in reports])
    assert ids.numel() == 37 and ids.unique().numel() == 37
    # Balanced: the same number of batches on every rank, none empty.
    counts = {len(r['sizes']) for r in reports}
    assert len(counts) == 1
    assert all(min(r['sizes']) > 0 for r in reports)


def _no_train_worker(rank, world_size, root, mask):
    """Training with a stock mean loss; the last part has no training
    node, so balancing moves seeds to it."""
    import torch.nn.functional as F
    from torch_geometric.nn import SAGEConv
    import pyg_sar
    torch.manual_seed(0)
    part = load_partition(root, rank)
    assert rank < world_size - 1 or not bool(mask[part.orig_ids].any())
    model = SAGEConv(part.x.size(1), 3)
    pyg_sar.sync_params(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DistNeighborLoader(part, [4, 4], mask, batch_size=16,
                                shuffle=True, seed=0)
    losses = []
    for _ in range(2):
        for batch in loader:
            optimizer.zero_grad()
            out = model(batch.x, batch.edge_index)[:batch.batch_size]
            loss = F.cross_entropy(out, batch.y[:batch.batch_size])
            loss.backward()
            pyg_sar.all_reduce_grads(model)
            optimizer.step()
            losses.append(float(loss))
    return losses


def test_rank_without_training_nodes_trains_with_a_stock_loss(parts):
    data, roots = parts
    owned_last = load_partition(roots[3], 2).orig_ids
    mask = torch.ones(data.num_nodes, dtype=torch.bool)
    mask[owned_last] = False
    assert int(mask.sum()) >= 3 * 16
    losses = run_workers(_no_train_worker, 3, roots[3], mask, timeout_s=90)
    assert len({len(r) for r in losses}) == 1 and len(losses[0]) > 2
    assert all(torch.isfinite(torch.tensor(r)).all() for r in losses)


def _few_seeds_worker(rank, world_size, root, ids):
    loader = DistNeighborLoader(load_partition(root, rank), [2], ids,
                                batch_size=2)
    return [int(b.batch_size) for b in loader]


def test_fewer_seeds_than_batches_pads_with_empty_batches(parts):
    data, roots = parts
    # 5 seeds, batch_size 2, 3 ranks: 1 batch each; one rank gets 1 seed.
    sizes = run_workers(_few_seeds_worker, 3, roots[3],
                        torch.tensor([0, 20, 40, 60, 80]), timeout_s=60)
    assert sorted(s[0] for s in sizes) == [1, 2, 2]
    # 2 seeds: the rank without one yields an empty batch, never hangs.
    sizes = run_workers(_few_seeds_worker, 3, roots[3],
                        torch.tensor([0, 100]), timeout_s=60)
    assert sorted(s[0] for s in sizes) == [0, 1, 1]


def _link_worker(rank, world_size, root, data):
    part = load_partition(root, rank)
    pairs = data.edge_index[:, ::3]  # the same on every rank
    loader = DistLinkNeighborLoader(part, [2], pairs, batch_size=6,
                                    neg_sampling='binary', shuffle=True,
                                    seed=rank)
    seen = []
    for batch in loader:
        _check(batch, data)
        num_pos = batch.input_id.numel()
        positives = batch.n_id[batch.edge_label_index[:, :num_pos]]
        assert torch.equal(positives, pairs[:, batch.input_id])
        seen.append(batch.input_id)
    # Negative sampling weights are over the dataset's ids.
    from torch_geometric.sampler import NegativeSampling
    allowed = torch.tensor([4, 77, 120])
    weight = torch.zeros(data.num_nodes)
    weight[allowed] = 1.0
    for batch in DistLinkNeighborLoader(
            part, [2], pairs, batch_size=6, seed=rank,
            neg_sampling=NegativeSampling('binary', 1, dst_weight=weight)):
        num_pos = batch.input_id.numel()
        negatives = batch.n_id[batch.edge_label_index[1, num_pos:]]
        assert bool(torch.isin(negatives, allowed).all())
    return torch.cat(seen), len(loader)


def test_link_loader_whole_graph_pairs(parts):
    data, roots = parts
    reports = run_workers(_link_worker, 2, roots[2], data, timeout_s=60)
    seen = torch.cat([r[0] for r in reports])
    assert torch.equal(seen.sort().values,
                       torch.arange(data.edge_index[:, ::3].size(1)))
    assert reports[0][1] == reports[1][1]


def _hetero_worker(rank, world_size, root, data):
    part = load_partition(root, rank)
    mask = data[PAPER].train_mask
    loader = DistNeighborLoader(part, [3, 2], (PAPER, mask), batch_size=4,
                                shuffle=True, seed=2, num_workers=1)
    seeds = []
    for batch in loader:
        for t in batch.node_types:
            assert torch.equal(data[t].x[batch[t].n_id], batch[t].x)
        for e in (CITES, WRITES):
            src, dst = e[0], e[2]
            ends = torch.stack([batch[src].n_id[batch[e].edge_index[0]],
                                batch[dst].n_id[batch[e].edge_index[1]]])
            assert torch.equal(data[e].edge_index[:, batch[e].e_id], ends)
        bs = batch[PAPER].batch_size
        assert torch.equal(batch[PAPER].input_id,  # a mask's: the seeds
                           batch[PAPER].n_id[:bs])
        seeds.append(batch[PAPER].n_id[:bs])
    # transform_sampler_output on a HeteroSamplerOutput (partition ids):
    # keeping every citation of an even position keeps its attributes.
    seen = []

    def halve_cites(out):
        seen.append((out.metadata[0],
                     out.node[PAPER][:out.metadata[0].numel()]))
        keep = torch.arange(0, out.row[CITES].numel(), 2)
        for name in ('row', 'col', 'edge'):
            getattr(out, name)[CITES] = getattr(out, name)[CITES][keep]
        out.num_sampled_edges = None
        return out
    for batch in DistNeighborLoader(part, [3, 2], (PAPER, mask),
                                    batch_size=4, seed=2,
                                    transform_sampler_output=halve_cites):
        # A mask's input_id: the seeds' ids (partition ids in the sampler
        # output the transform sees, dataset ids in the batch).
        assert torch.equal(*seen[-1])
        bs = batch[PAPER].batch_size
        assert torch.equal(batch[PAPER].input_id, batch[PAPER].n_id[:bs])
        ends = torch.stack([batch[PAPER].n_id[batch[CITES].edge_index[0]],
                            batch[PAPER].n_id[batch[CITES].edge_index[1]]])
        assert torch.equal(data[CITES].edge_index[:, batch[CITES].e_id],
                           ends)
        assert torch.equal(data[CITES].edge_attr[batch[CITES].e_id],
                           batch[CITES].edge_attr)
    return torch.cat(seeds), len(loader)


def test_hetero_dataset_ids_and_whole_graph_mask(tmp_path):
    data = hard_hetero(seed=5)
    root = str(tmp_path / 'h3')
    partition_graph(data, 3, root, progress=False)
    reports = run_workers(_hetero_worker, 3, root, data, timeout_s=90)
    seeds = torch.cat([r[0] for r in reports])
    assert torch.equal(seeds.sort().values,
                       data[PAPER].train_mask.nonzero().view(-1))
    assert len({r[1] for r in reports}) == 1


def test_single_process_keywords(parts):
    data, roots = parts
    part = load_partition(roots[1], 0)
    # At world size 1 a mask of the part (its own attribute, the part's
    # order) and the whole graph's mask (dataset order) agree.
    seeds = [torch.cat([b.n_id[:b.batch_size] for b in DistNeighborLoader(
        part, [2], m, batch_size=8)]).sort().values
        for m in (part.train_mask, data.train_mask)]
    assert torch.equal(seeds[0], seeds[1])
    assert torch.equal(seeds[0], data.train_mask.nonzero().view(-1))
    # directed=False is PyG's deprecated spelling of 'induced'.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        loader = DistNeighborLoader(part, [2], directed=False, batch_size=8)
    assert loader.subgraph_type == 'induced'
    assert any('deprecated' in str(w.message) for w in caught)
    # collate_fn is dropped, as PyG's NodeLoader drops it.
    plain = next(iter(DistNeighborLoader(part, [2], batch_size=8, seed=0)))
    other = next(iter(DistNeighborLoader(part, [2], batch_size=8, seed=0,
                                         collate_fn=lambda x: None)))
    assert torch.equal(plain.n_id, other.n_id)
    # ids='partition': the partition's ids, as before.
    same = next(iter(DistNeighborLoader(part, [2], batch_size=8, seed=0,
                                        ids='partition')))
    assert torch.equal(part.orig_ids[same.n_id], plain.n_id)


def _uneven_worker(rank, world_size, root):
    from pyg_sar import comm
    part = load_partition(root, rank)
    own = part.node_ids[:4 if rank == 0 else 2]
    loader = DistNeighborLoader(part, [2], own, batch_size=2,
                                ids='partition', pad_batches=False)
    for _ in loader:
        comm.global_count(1)  # a collective per step: not paired at the end


def test_uneven_opt_in_names_pad_batches_when_it_fails(parts):
    _, roots = parts
    out = run_workers(_uneven_worker, 2, roots[2], timeout_s=4,
                      expect_errors=True)
    assert out[1][0] == 'error' and 'pad_batches=False' in out[1][1]
    assert 'rank 0: 2, rank 1: 1' in out[1][1]


# Repeated seeds ##############################################################

def _first_rows(n_id):
    """For every row of ``n_id``, the first row holding the same id."""
    first = {}
    for i, v in enumerate(n_id.tolist()):
        first.setdefault(v, i)
    return torch.tensor([first[v] for v in n_id.tolist()], dtype=torch.long)


def _check_repeated(n_id, edge_index, bs, hop0_edges, in_degree, fanout,
                    sources_of=None):
    """PyG's layout with repeated seeds: every occurrence is a row of the
    seeds; the rows after them are distinct and none of them a seed; every
    occurrence gets its own hop-1 edges (``min(in-degree, fanout)`` each);
    an edge from a repeated node comes from its first row."""
    seeds, rest = n_id[:bs], n_id[bs:]
    assert rest.unique().numel() == rest.numel()
    assert not bool(torch.isin(rest, seeds).any())
    col = edge_index[1][:hop0_edges]
    assert torch.equal(torch.bincount(col, minlength=bs)[:bs],
                       in_degree[seeds].clamp(max=fanout))
    src_ids = n_id if sources_of is None else sources_of
    assert torch.equal(edge_index[0], _first_rows(src_ids)[edge_index[0]])


def _repeated_worker(rank, world_size, root, data, inputs):
    part = load_partition(root, rank)
    in_degree = torch.bincount(data.edge_index[1], minlength=data.num_nodes)
    out = {}
    # Directional, balanced (the default), and induced without balancing
    # (every occurrence then stays with the rank that owns it).
    for name, kwargs in (('directional', {}),
                         ('induced', dict(subgraph_type='induced',
                                          pad_batches=False))):
        loader = DistNeighborLoader(part, FANOUTS, input_nodes=inputs,
                                    batch_size=4, seed=3, **kwargs)
        input_ids = []
        for batch in loader:
            _check(batch, data)
            bs = batch.batch_size
            assert torch.equal(batch.n_id[:bs], inputs[batch.input_id])
            if name == 'directional':
                _check_repeated(batch.n_id, batch.edge_index, bs,
                                batch.num_sampled_edges[0], in_degree,
                                FANOUTS[0])
            else:  # every in-edge between batch nodes, at every row
                first = _first_rows(batch.n_id)
                assert torch.equal(batch.edge_index[0],
                                   first[batch.edge_index[0]])
                inside = torch.isin(data.edge_index[0], batch.n_id)
                want = torch.bincount(data.edge_index[1][inside],
                                      minlength=data.num_nodes)[batch.n_id]
                assert torch.equal(torch.bincount(
                    batch.edge_index[1], minlength=batch.n_id.numel()), want)
                assert bool(torch.isin(batch.n_id[:bs], part.orig_ids).all())
            input_ids.append(batch.input_id)
        out[name] = torch.cat(input_ids)
    return out


@pytest.mark.parametrize('world_size', [1, 2, 3])
def test_repeated_input_nodes_are_seeds_at_every_occurrence(parts,
                                                            world_size):
    """PyG's NeighborLoader takes ``input_nodes`` with repeated ids: each
    occurrence is a seed (its own row, own ``input_id``)."""
    data, roots = parts
    # Repeats of a self-loop node (8), an isolated node (140) and others.
    inputs = torch.tensor([8, 17, 8, 140, 17, 8, 3, 99, 140, 3, 60])
    reports = run_workers(_repeated_worker, world_size, roots[world_size],
                          data, inputs, timeout_s=90)
    for name in ('directional', 'induced'):
        input_ids = torch.cat([r[name] for r in reports])
        assert torch.equal(input_ids.sort().values, torch.arange(11))
        if world_size == 1:  # PyG's batches: chunks of the inputs in order
            assert torch.equal(reports[0][name], torch.arange(11))


def _repeated_hetero_worker(rank, world_size, root, data, inputs):
    part = load_partition(root, rank)
    loader = DistNeighborLoader(part, [3, 2], (PAPER, inputs), batch_size=4,
                                seed=1)
    input_ids = []
    for batch in loader:
        bs = batch[PAPER].batch_size
        assert torch.equal(batch[PAPER].n_id[:bs],
                           inputs[batch[PAPER].input_id])
        for t in batch.node_types:
            assert torch.equal(data[t].x[batch[t].n_id], batch[t].x)
        for e in (CITES, WRITES):
            ends = torch.stack([batch[e[0]].n_id[batch[e].edge_index[0]],
                                batch[PAPER].n_id[batch[e].edge_index[1]]])
            assert torch.equal(data[e].edge_index[:, batch[e].e_id], ends)
            in_degree = torch.bincount(data[e].edge_index[1],
                                       minlength=data[PAPER].num_nodes)
            _check_repeated(batch[PAPER].n_id, batch[e].edge_index, bs,
                            batch[e].num_sampled_edges[0], in_degree, 3,
                            sources_of=batch[e[0]].n_id)
        input_ids.append(batch[PAPER].input_id)
    return torch.cat(input_ids)


@pytest.mark.parametrize('world_size', [1, 3])
def test_hetero_repeated_input_nodes(tmp_path, world_size):
    data = hard_hetero(seed=5)
    root = str(tmp_path / f'h{world_size}')
    partition_graph(data, world_size, root, progress=False)
    # Paper 5 has no citations in, 9 a self loop.
    inputs = torch.tensor([9, 5, 9, 30, 5, 9, 12])
    reports = run_workers(_repeated_hetero_worker, world_size, root, data,
                          inputs, timeout_s=90)
    assert torch.equal(torch.cat(reports).sort().values, torch.arange(7))
    if world_size == 1:
        assert torch.equal(reports[0], torch.arange(7))
