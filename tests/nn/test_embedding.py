"""A node-embedding table sharded by the partition (pyg_sar.nn.DistEmbedding)
and the converted LightGCN equal single-process PyG.

One spawn per world size (1, 2, 3, 4), every mode inside: LightGCN's layer
embeddings, its scores of node pairs whose ends live on different ranks,
its link-prediction and BPR losses, and the gradient of every row of the
table (summed at the row's owner); a sparse table with a padding row and
``scale_grad_by_freq`` read by node id (sparse gradients at the owners);
the stock state_dict round trip; each worker's table holds only its rows,
also when built sharded (``LightGCN(..., graph=)``, a meta table), where
the whole table never exists.
"""
import pytest
import torch
from torch_geometric.nn.models import LightGCN

import pyg_sar
from pyg_sar import comm
from pyg_sar.graph.link import local_share
from pyg_sar.nn import DistEmbedding, to_distributed
from pyg_sar.nn.embedding import draw_rows
from pyg_sar.nn.models import LightGCN as SarLightGCN
from _dist import run_workers
from _exact import BY_DTYPE, FLOAT32, assemble, close, mismatches, report
from _graphs import hard_graph

MODES = ('sar', 'sa', 'one_shot')
DIM = 8
PAIRS = 30


def _inputs(num_nodes):
    gen = torch.Generator().manual_seed(7)
    return dict(
        pos=torch.randint(0, num_nodes, (2, PAIRS), generator=gen),
        neg=torch.randint(0, num_nodes, (2, PAIRS), generator=gen),
        label=torch.randint(0, 2, (2 * PAIRS, ), generator=gen).float(),
        probe=torch.randn(num_nodes, DIM, generator=gen),
        ids=torch.randint(0, num_nodes, (40, ), generator=gen),
        coef=torch.randn(40, 4, generator=gen))


def _light_gcn(num_nodes):
    torch.manual_seed(0)
    return LightGCN(num_nodes, DIM, 2)


def _tables(num_nodes):
    """A sparse table with a padding row, and a dense one whose gradient
    is scaled by the frequency of each id among all lookups."""
    torch.manual_seed(1)
    return (torch.nn.Embedding(num_nodes, 4, padding_idx=7, sparse=True),
            torch.nn.Embedding(num_nodes, 4, scale_grad_by_freq=True))


def _step(model, g, w, t, pairs, rows, probe):
    """Scores, embeddings and the loss of one step (``pairs``: this
    worker's columns, ``rows``: its local nodes' probe rows)."""
    z = model.get_embedding(g, w)
    index = torch.cat([t['pos'][:, pairs], t['neg'][:, pairs]], dim=1)
    label = torch.cat([t['label'][:PAIRS][pairs], t['label'][PAIRS:][pairs]])
    scores = model(g, index, w)
    pos, neg = scores.split(scores.numel() // 2)
    loss = (model.link_pred_loss(scores, label) +
            model.recommendation_loss(pos, neg, t['pos'][0, pairs]) +
            model.recommendation_loss(pos, neg, lambda_reg=1e-2) +
            (z * probe[rows]).sum())
    return z, scores, loss


def _reference(data, t):
    model = _light_gcn(data.num_nodes)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    every = slice(0, PAIRS)
    z, scores, loss = _step(model, data.edge_index, data.edge_weight, t,
                            every, slice(None), t['probe'])
    loss.backward()
    tables = _tables(data.num_nodes)
    for table in tables:
        (table(t['ids']) * t['coef']).sum().backward()
    return dict(z=z.detach(), scores=scores.detach(), state=state,
                grad=model.embedding.weight.grad,
                tables=[tb.weight.grad.to_dense() for tb in tables])


def _worker(rank, world_size, root, t):
    part = pyg_sar.load_partition(root, rank)
    out = {'ids': part.orig_ids}
    pairs = local_share(PAIRS)
    for mode in MODES:
        graph = pyg_sar.DistGraph(part, mode=mode)
        model = to_distributed(_light_gcn(graph.num_global_nodes))
        pyg_sar.sync_params(model)  # before sharding: the whole table
        z, scores, loss = _step(model, graph, part.edge_weight, t, pairs,
                                part.orig_ids, t['probe'])
        loss.backward()
        grad = model.embedding.weight.grad.clone()
        pyg_sar.all_reduce_grads(model)  # leaves the sharded table alone
        assert torch.equal(model.embedding.weight.grad, grad)
        weight = model.embedding.weight
        # The bytes this worker keeps for the table (not a view into a
        # whole table).
        out[mode] = (z.detach(), scores.detach(), grad, weight.shape[0],
                     weight.untyped_storage().nbytes())
    # Tables read by node id: sparse with a padding row, dense with
    # frequencies.
    ids = local_share(t['ids'].numel())
    out['tables'] = []
    for stock in _tables(graph.num_global_nodes):
        table = DistEmbedding(stock, graph)
        (table(t['ids'][ids]) * t['coef'][ids]).sum().backward()
        out['tables'].append((table.weight.grad.is_sparse,
                              table.weight.grad.to_dense()))
    # The state: the stock state_dict, gathered; a stock one loaded keeps
    # the local rows; a shard of one worker is refused.
    fresh = to_distributed(_light_gcn(graph.num_global_nodes))
    fresh.get_embedding(graph)  # shards
    out['full'] = DistEmbedding.full_state_dict(fresh)
    out['own'] = {k: v.clone() for k, v in fresh.state_dict().items()}
    other = to_distributed(LightGCN(graph.num_global_nodes, DIM, 2))
    other.embedding.shard_(graph)
    other.load_state_dict(out['full'])
    out['loaded'] = other.embedding.weight.detach().clone()
    try:
        other.load_state_dict(out['own'])
        out['own_refused'] = None
    except RuntimeError as e:
        out['own_refused'] = str(e)
    # Built sharded (graph=): the whole table never exists on a worker; the
    # rows and the random state after are the stock constructor's. A table
    # built on the meta device gets its rows of Embedding's own draw.
    torch.manual_seed(0)
    built = SarLightGCN(graph.num_global_nodes, DIM, 2, graph=graph)
    weight = built.embedding.weight
    out['built'] = (weight.detach().clone(), torch.rand(3),
                    weight.untyped_storage().nbytes())
    torch.manual_seed(1)
    meta = DistEmbedding(torch.nn.Embedding(graph.num_global_nodes, 4,
                                            padding_idx=7, device='meta'),
                         graph)
    out['meta'] = (meta.weight.detach().clone(), torch.rand(3))
    if world_size > 1:  # replicated checkpoints refuse a sharded table
        from pyg_sar.train import checkpoint
        try:
            checkpoint.save(root + '-ckpt', 0, other)
            out['ckpt_refused'] = None
        except ValueError as e:
            out['ckpt_refused'] = str(e)
    return out


@pytest.mark.parametrize('world_size', [1, 2, 3, 4])
def test_light_gcn_and_sharded_tables_equal_one_process(world_size,
                                                        tmp_path):
    data = hard_graph()
    N = data.num_nodes
    t = _inputs(N)
    pyg_sar.partition_graph(data, world_size, str(tmp_path))
    results = run_workers(_worker, world_size, str(tmp_path), t,
                          timeout_s=120)
    ref = _reference(data, t)
    ids = [r['ids'] for r in results]
    failures = []
    for mode in MODES:
        what = f'LightGCN mode={mode} world={world_size}'
        got = [(r[mode][0], r[mode][2], {}) for r in results]
        failures += mismatches(what, ids, got, (ref['z'], ref['grad'], {}),
                               BY_DTYPE[torch.float32])
        # Ranks score their share of the positives, then of the negatives.
        pos = torch.cat([r[mode][1][:r[mode][1].numel() // 2]
                         for r in results])
        neg = torch.cat([r[mode][1][r[mode][1].numel() // 2:]
                         for r in results])
        assert pos.numel() == neg.numel() == PAIRS
        failures += close(torch.cat([pos, neg]), ref['scores'], FLOAT32,
                          f'{what} scores')
        # Memory: each worker holds the rows of its own nodes only, about
        # N / world_size of them (the partition is balanced).
        rows = [r[mode][3] for r in results]
        assert rows == [i.numel() for i in ids] and sum(rows) == N
        assert max(rows) <= 1.1 * N / world_size + 1, rows
        assert [r[mode][4] for r in results] == [n * DIM * 4 for n in rows]
    for k, (name, expected) in enumerate(zip(('sparse', 'freq'),
                                             ref['tables'])):
        grads = [r['tables'][k] for r in results]
        assert all(is_sparse == (name == 'sparse') for is_sparse, _ in grads)
        failures += close(assemble(ids, [g for _, g in grads], N), expected,
                          FLOAT32, f'{name} table world={world_size} '
                          f'dL/dweight')
    report(failures)
    torch.manual_seed(0)
    stock = LightGCN(N, DIM, 2).embedding.weight.detach()
    after = torch.rand(3)
    torch.manual_seed(1)
    meta = torch.nn.Embedding(N, 4, padding_idx=7).weight.detach()
    meta_after = torch.rand(3)
    for r in results:
        assert torch.equal(r['built'][0], stock[r['ids']])
        assert torch.equal(r['built'][1], after)
        assert r['built'][2] == r['ids'].numel() * DIM * 4
        assert torch.equal(r['meta'][0], meta[r['ids']])
        assert torch.equal(r['meta'][1], meta_after)
    for r in results:
        assert set(r['full']) == set(ref['state'])
        for k, v in ref['state'].items():
            assert torch.equal(r['full'][k], v), k
        assert torch.equal(r['loaded'], ref['state']['embedding.weight']
                           [r['ids']])
        if world_size == 1:  # one worker: its own state is the stock one
            assert r['own_refused'] is None
            assert torch.equal(r['own']['embedding.weight'],
                               ref['state']['embedding.weight'])
        else:
            assert 'a shard of one worker is not loaded' in \
                r['own_refused']
            assert "'embedding.weight' is sharded by the partition" in \
                r['ckpt_refused']


# Refusals (one worker, no process group) ##################################

@pytest.mark.parametrize('init', [None, torch.nn.init.xavier_uniform_])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_rows_drawn_by_blocks_equal_the_whole_draw(init, dtype):
    """draw_rows keeps one block of rows at a time and gives the rows, and
    leaves the random state, of one whole draw: sizes below 16 elements,
    not multiples of 16, a last block that would be short."""
    for rows, dim, block in [(3, 2, 16), (40, 1, 16), (33, 1, 16),
                             (1000, 7, 16), (1000, 7, 64), (4099, 3, 256)]:
        torch.manual_seed(3)
        whole = torch.empty(rows, dim, dtype=dtype)
        (init or torch.nn.init.normal_)(whole)
        after = torch.rand(2)
        ids = torch.randperm(rows)[:max(1, rows // 3)]
        torch.manual_seed(3)
        got = draw_rows(torch.empty(ids.numel(), dim, dtype=dtype), rows,
                        ids, init, block_rows=block)
        assert torch.equal(got, whole[ids]), (rows, dim, block)
        assert torch.equal(torch.rand(2), after), (rows, dim, block)
    with pytest.raises(ValueError, match='block_rows=24'):
        draw_rows(torch.empty(1, 1), 4, torch.tensor([0]), block_rows=24)


def test_table_size_must_be_the_graphs_node_count(hard_part):
    data, part = hard_part
    graph = pyg_sar.DistGraph(part)
    with pytest.raises(ValueError, match=f'num_embeddings={data.num_nodes - 1}'
                       f' rows but the graph has {data.num_nodes} nodes'):
        DistEmbedding(torch.nn.Embedding(data.num_nodes - 1, 4), graph)
    model = to_distributed(LightGCN(data.num_nodes + 1, 4, 1))
    with pytest.raises(ValueError, match='num_embeddings'):
        model.get_embedding(graph)


def test_light_gcn_refusals_name_what(hard_part):
    data, part = hard_part
    graph = pyg_sar.DistGraph(part)
    model = to_distributed(LightGCN(data.num_nodes, 4, 1))
    with pytest.raises(ValueError, match='edge_label_index=None'):
        model(graph)
    with pytest.raises(ValueError, match='LightGCN.recommend over a '
                       'DistGraph is not supported'):
        model.recommend(graph, k=2)
    with pytest.raises(ValueError, match='sharded by a partition'):
        model.get_embedding(data.edge_index)
    assert model.embedding.weight.sar_sharded
    assert comm.get_world_size() == 1


def test_ddp_sum_hook_refuses_a_sharded_table():
    # DDP treats every parameter as a replica (broadcast at construction,
    # gradients summed): a sharded table's rows would be mixed silently.
    import pytest
    import torch
    from pyg_sar.comm import ddp_sum_hook

    class Bucket:
        def __init__(self, params):
            self._params = params

        def parameters(self):
            return self._params

        def buffer(self):
            return torch.zeros(1)

    table = torch.nn.Parameter(torch.zeros(4, 2))
    table.sar_sharded = True
    with pytest.raises(ValueError, match=r"sharded by the partition.*"
                       r"pyg_sar.all_reduce_grads"):
        ddp_sum_hook(None, Bucket([torch.nn.Parameter(torch.zeros(3)),
                                   table]))
