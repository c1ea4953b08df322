"""``GPSConv`` converted by ``to_distributed`` equals single-process PyG:
outputs, input gradients and every parameter gradient, at world sizes 1-4,
multihead (ring of key/value blocks, online softmax, rematerialized
backward) and performer (global kernel sums) attention, with and without a
``batch`` vector of several graphs, chunked (tiny attention blocks) and
not, every graph mode, float64 once; attention dropout in training is
refused by name.

One spawn per world size runs every case, in a module-scoped fixture; the
parent compares, one test per case.
"""
from types import SimpleNamespace

import pytest
import torch
import torch_geometric.nn as pyg_nn

import pyg_sar
import pyg_sar.nn.engine.global_attention as ga
from _dist import run_workers
from _exact import BY_DTYPE, FLOAT32, close, mismatches, report
from _graphs import hard_graph

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow

C = 8        # channels (heads 2 -> head dim 4)
CHUNK = 19   # attention blocks of 4 x 4 scores; message-passing chunks
MODES = ('sar', 'sa', 'one_shot')
FLOAT64 = {'mh_gcn_bn'}


def build(case: str):
    torch.manual_seed(11)
    if case in ('mh_gcn_bn', 'mh_tiles'):  # BatchNorm: whole-graph stats
        m = pyg_nn.GPSConv(C, pyg_nn.GCNConv(C, C), heads=2)
    elif case == 'mh_sage_kv':  # extra keys, no in-projection bias
        m = pyg_nn.GPSConv(C, pyg_nn.SAGEConv(C, C), heads=2, norm=None,
                           attn_kwargs=dict(bias=False, add_bias_kv=True,
                                            add_zero_attn=True))
    elif case == 'mh_batch':  # attention within each graph of the batch
        m = pyg_nn.GPSConv(C, pyg_nn.GINConv(torch.nn.Linear(C, C)),
                           heads=2, norm='batch_norm')
    elif case == 'mh_eval_dropout':  # attention dropout is off in eval
        m = pyg_nn.GPSConv(C, None, heads=1, dropout=0.5,
                           attn_kwargs=dict(dropout=0.3)).eval()
    elif case == 'perf':
        m = pyg_nn.GPSConv(C, pyg_nn.GATConv(C, 4, heads=2), heads=2,
                           attn_type='performer',
                           attn_kwargs=dict(head_channels=4, qkv_bias=True))
    elif case == 'perf_batch':  # PyG's padded keys stay in the sums
        m = pyg_nn.GPSConv(C, pyg_nn.GraphConv(C, C), heads=2, norm=None,
                           attn_type='performer',
                           attn_kwargs=dict(head_channels=3, qkv_bias=True))
    else:
        raise KeyError(case)
    return m


BATCHED = {'mh_batch', 'perf_batch'}
CASES = ['mh_gcn_bn', 'mh_tiles', 'mh_sage_kv', 'mh_batch', 'mh_eval_dropout', 'perf',
         'perf_batch']
ALL_MODES = {'mh_gcn_bn', 'perf'}  # the others run mode 'sar' only
# Without a batch the tiles run in torch's fused CPU kernel; 'mh_tiles'
# computes them as explicit score tiles (as with a batch, or on GPU).
EXPLICIT_TILES = {'mh_tiles'}


def inputs(num_nodes: int):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(num_nodes, C, generator=gen)
    probe = torch.randn(num_nodes, C, generator=gen)
    # Three graphs of unequal sizes (PyG pads them to the largest).
    batch = torch.zeros(num_nodes, dtype=torch.long)
    batch[30:] = 1
    batch[80:] = 2
    return x, probe, batch


def labels(x):
    return (x[:, 0] * 3).floor().long().clamp(0, C - 1)


def evaluate(module, x, graph, batch, probe, dtype):
    module = module.to(dtype)
    x = x.to(dtype).clone().requires_grad_()
    out = module(x, graph, batch)
    (out * probe.to(dtype)).sum().backward()
    return (out.detach(), x.grad,
            {n: p.grad for n, p in module.named_parameters()})


def loss_curve(case, x, edge_index, batch, y, total, epochs=5,
               dist=False):
    """Adam steps on a GPSConv; the parameter gradients of a worker are
    partial sums, completed by all_reduce_grads."""
    model = build(case)
    if dist:
        model = pyg_sar.nn.to_distributed(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    losses = []
    for _ in range(epochs):
        opt.zero_grad()
        out = model(x, edge_index, batch if case in BATCHED else None)
        loss = torch.nn.functional.cross_entropy(out, y,
                                                 reduction='sum') / total
        loss.backward()
        if dist:
            pyg_sar.all_reduce_grads(model)
            loss = pyg_sar.comm.all_reduce(loss.detach().clone())
        opt.step()
        losses.append(float(loss.detach()))
    return losses


CURVES = ('mh_gcn_bn', 'perf_batch')


def _worker(rank, world_size, root, x, probe, batch):
    part = pyg_sar.load_partition(root, rank)
    ids = part.orig_ids
    results = {'ids': ids}
    graph = pyg_sar.DistGraph(part, chunk_size=CHUNK)
    for case in CURVES:
        results[('curve', case)] = loss_curve(
            case, x[ids], graph, batch[ids], labels(x)[ids],
            x.shape[0], dist=True)
    for mode in MODES:
        for chunk in (None, CHUNK):
            graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk)
            for case in CASES:
                if mode != 'sar' and case not in ALL_MODES:
                    continue
                for dtype in dtypes(case):
                    model = pyg_sar.nn.to_distributed(build(case))
                    assert isinstance(model, pyg_sar.nn.GPSConv)
                    flash = ga._FLASH
                    if case in EXPLICIT_TILES:
                        ga._FLASH = None
                    try:
                        results[(mode, chunk, case, dtype)] = evaluate(
                            model, x[ids], graph,
                            batch[ids] if case in BATCHED else None,
                            probe[ids], dtype)
                    finally:
                        ga._FLASH = flash
    model = pyg_sar.nn.to_distributed(pyg_nn.GPSConv(
        C, pyg_nn.GCNConv(C, C), heads=2, attn_kwargs=dict(dropout=0.1)))
    try:
        model(x[ids], graph)
        results['refusal'] = None
    except ValueError as e:
        results['refusal'] = str(e)
    return results


def dtypes(case):
    return ((torch.float32, torch.float64) if case in FLOAT64
            else (torch.float32, ))


@pytest.fixture(scope='module', params=[1, 2, 3, 4])
def gps_run(request, tmp_path_factory):
    world_size = request.param
    data = hard_graph()
    root = str(tmp_path_factory.mktemp('parts'))
    pyg_sar.partition_graph(data, world_size, root)
    x, probe, batch = inputs(data.num_nodes)
    results = run_workers(_worker, world_size, root, x, probe, batch,
                          timeout_s=240)
    return SimpleNamespace(world_size=world_size, data=data, x=x,
                           probe=probe, batch=batch, results=results,
                           ids=[r['ids'] for r in results])


def test_attention_dropout_in_training_is_refused(gps_run):
    for r in gps_run.results:
        assert 'attention dropout 0.1' in r['refusal']


@pytest.mark.parametrize('case', CURVES)
def test_loss_curve_equals_single_process(gps_run, case):
    run = gps_run
    expected = torch.tensor(loss_curve(case, run.x, run.data.edge_index,
                                       run.batch, labels(run.x),
                                       run.x.shape[0]))
    report([line for rank, r in enumerate(run.results)
            for line in close(torch.tensor(r[('curve', case)]), expected,
                              FLOAT32, f'{case} world={run.world_size} '
                              f'loss curve on rank {rank}')])


@pytest.mark.parametrize('case', CASES)
def test_gps_equals_single_process(gps_run, case):
    run = gps_run
    failures = []
    for dtype in dtypes(case):
        ref = evaluate(build(case), run.x, run.data.edge_index,
                       run.batch if case in BATCHED else None, run.probe,
                       dtype)
        for mode in MODES if case in ALL_MODES else ('sar', ):
            for chunk in (None, CHUNK):
                failures += mismatches(
                    f'{case} {dtype} mode={mode} chunk={chunk} '
                    f'world={run.world_size}', run.ids,
                    [r[(mode, chunk, case, dtype)] for r in run.results],
                    ref, BY_DTYPE[dtype], none_grads='skip')
    report(failures)


def test_state_dict_unchanged():
    for case in CASES:
        stock, model = build(case), pyg_sar.nn.to_distributed(build(case))
        assert list(stock.state_dict()) == list(model.state_dict())
        for key, value in stock.state_dict().items():
            assert torch.equal(value, model.state_dict()[key]), key


@pytest.mark.parametrize('fused', [False, True])
def test_global_attention_gradcheck(fused):
    """Both tile paths, against finite differences (float64), with tiles
    of 2 and all rows; extra keys; a batch mask (explicit tiles)."""
    if fused and not ga.fused_available(torch.zeros(1, dtype=torch.float64),
                                        None):
        pytest.skip("torch has no fused CPU attention kernel")
    gen = torch.Generator().manual_seed(0)
    n, H, d = 9, 2, 3
    q, k, v = [torch.randn(n, H, d, dtype=torch.float64, generator=gen,
                           requires_grad=True) for _ in range(3)]
    ek, ev = [torch.randn(2, H, d, dtype=torch.float64, generator=gen,
                          requires_grad=True) for _ in range(2)]
    batch = torch.tensor([0] * 3 + [1] * 4 + [2] * 2)
    for block in (2, 100):
        def f(q, k, v, ek, ev):
            return ga.global_attention(q, k, v, None, [n], block, ek, ev,
                                       fused=fused)
        assert torch.autograd.gradcheck(f, (q, k, v, ek, ev),
                                        fast_mode=True)
        if not fused:
            def g(q, k, v):
                return ga.global_attention(q, k, v, batch, [n], block)
            assert torch.autograd.gradcheck(g, (q, k, v), fast_mode=True)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))
    torch.testing.assert_close(
        ga.global_attention(q, k, v, None, [n], 4, fused=fused),
        ref.transpose(0, 1))


def test_built_directly_converts_its_norms_and_conv():
    layer = pyg_sar.nn.GPSConv(C, pyg_nn.GCNConv(C, C), heads=2)
    assert isinstance(layer.norm1, pyg_sar.nn.BatchNorm)
    assert isinstance(layer.conv, pyg_sar.nn.GCNConv)

    class Mine(pyg_nn.MessagePassing):  # not convertible: refused by name
        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

    with pytest.raises(ValueError, match="Mine at 'conv'"):
        pyg_sar.nn.GPSConv(C, Mine())
