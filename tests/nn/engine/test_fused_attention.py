"""The fused attention path (:mod:`pyg_sar.nn.engine.fused`) against the
separate-operator path and single-process PyG: outputs, input gradients and
every parameter gradient of GATConv, GATv2Conv and TransformerConv (edge
features, ``concat=False``, no self loops, shared weights, ``beta``; with
``edge_dim`` TransformerConv is not fused) at world sizes 1-3, modes
``sar`` and ``one_shot``, chunked and not, float32 and float64, on a
directed graph with self loops, duplicate edges and isolated nodes; attention
dropout replays the same masks on both paths; and the fused path is the
one that ran (and ``PYG_SAR_FUSED=0`` turns it off)."""
import os
from types import SimpleNamespace

import pytest
import torch
import torch_geometric.nn as pyg_nn

import pyg_sar
from pyg_sar import datasets
from _dist import run_workers, to_cpu
from _exact import BY_DTYPE, close, mismatches, report, train_curve

pytestmark = pytest.mark.slow

WORLD_SIZES = [1, 2, 3]
MODES = ('sar', 'one_shot')
CHUNK = 23
DTYPES = (torch.float32, torch.float64)
CONVS = {
    'gat': lambda c: pyg_nn.GATConv(c, 3, heads=2),
    'gat_edge_mean': lambda c: pyg_nn.GATConv(c, 4, heads=3, edge_dim=3,
                                              concat=False),
    'gat_no_loops': lambda c: pyg_nn.GATConv(c, 3, heads=2,
                                             add_self_loops=False),
    'gatv2': lambda c: pyg_nn.GATv2Conv(c, 5, heads=2, concat=False),
    'gatv2_edge_shared': lambda c: pyg_nn.GATv2Conv(
        c, 3, heads=2, edge_dim=3, fill_value=0.5, share_weights=True),
    'transformer': lambda c: pyg_nn.TransformerConv(c, 3, heads=2),
    'transformer_mean_beta': lambda c: pyg_nn.TransformerConv(
        c, 4, heads=3, concat=False, beta=True),
    # The edge term enters the values too: not fused, still exact.
    'transformer_edge': lambda c: pyg_nn.TransformerConv(c, 3, heads=2,
                                                         edge_dim=3),
}
EDGE = ('gat_edge_mean', 'gatv2_edge_shared', 'transformer_edge')
NOT_FUSED = ('transformer_edge', )
NUM_NODES = 90


def graph_data():
    """Directed, with self loops, duplicate edges and isolated nodes."""
    data = datasets.synthetic_graph(NUM_NODES, 5, 6, 3, seed=21)
    isolated = torch.arange(5)
    keep = ~(torch.isin(data.edge_index[0], isolated) |
             torch.isin(data.edge_index[1], isolated))
    ei = data.edge_index[:, keep]
    loops = torch.arange(10, 20).repeat(2, 1)
    data.edge_index = torch.cat([ei, ei[:, :15], loops], dim=1)
    gen = torch.Generator().manual_seed(5)
    data.edge_attr = torch.randn(data.edge_index.shape[1], 3, generator=gen)
    return data


def build(kind, channels, dtype):
    torch.manual_seed(99)
    return CONVS[kind](channels).to(dtype)


def probe(num_nodes, width, dtype):
    gen = torch.Generator().manual_seed(3)
    return torch.randn(num_nodes, width, generator=gen).to(dtype)


def _run(conv, x, graph, edge_attr, rows):
    """Output, input gradient and parameter gradients of a fixed random
    linear loss (``rows``: the global ids of the local nodes)."""
    x = x.clone().requires_grad_()
    out = conv(x, graph) if edge_attr is None else conv(x, graph, edge_attr)
    (out * probe(NUM_NODES, out.shape[1], out.dtype)[rows].to(out.device)
     ).sum().backward()
    return (out.detach(), x.grad,
            {n: p.grad for n, p in conv.named_parameters()})


def _worker(rank, world_size, root):
    from pyg_sar.nn.engine import fused
    ran = {'fused': 0}
    forward = fused.FusedAttentionAggregator.forward

    def counted(self, *args):
        ran['fused'] += 1
        return forward(self, *args)
    fused.FusedAttentionAggregator.forward = counted
    part = pyg_sar.load_partition(root, rank)
    results = {'ids': part.orig_ids}
    for dtype in DTYPES:
        x = part.x.to(dtype)
        for mode in MODES:
            for chunk in (None, CHUNK):
                graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk)
                for kind in CONVS:
                    edge_attr = part.edge_attr.to(dtype) if kind in EDGE \
                        else None
                    for path in ('fused', 'unfused'):
                        os.environ['PYG_SAR_FUSED'] = \
                            '1' if path == 'fused' else '0'
                        before = ran['fused']
                        conv = pyg_sar.nn.to_distributed(
                            build(kind, x.shape[1], dtype))
                        out = _run(conv, x, graph, edge_attr,
                                   part.orig_ids)
                        results[(dtype, mode, chunk, kind, path)] = out
                        results[('ran', dtype, mode, chunk, kind, path)] = \
                            ran['fused'] > before
    # Attention dropout: the same replayed masks on both paths.
    graph = pyg_sar.DistGraph(part, mode='sar', chunk_size=CHUNK)
    for kind in ('gat', 'gatv2', 'transformer'):
        for path in ('fused', 'unfused'):
            os.environ['PYG_SAR_FUSED'] = '1' if path == 'fused' else '0'
            conv = pyg_sar.nn.to_distributed(build(kind, 6, torch.float64))
            conv.dropout = 0.4
            conv.train()
            torch.manual_seed(17 + rank)
            results[('dropout', kind, path)] = _run(
                conv, part.x.double(), graph, None, part.orig_ids)
    os.environ.pop('PYG_SAR_FUSED', None)
    return results


@pytest.fixture(scope='module', params=WORLD_SIZES)
def run(request, tmp_path_factory):
    from pyg_sar.nn.engine.kernels import cpu
    if cpu.load() is None:  # built once here, not in every worker
        pytest.skip('the C++ kernels could not be built (no compiler)')
    data = graph_data()
    root = str(tmp_path_factory.mktemp('fused'))
    pyg_sar.partition_graph(data, request.param, root)
    results = run_workers(_worker, request.param, root, timeout_s=180)
    return SimpleNamespace(data=data, world_size=request.param,
                           results=results, ids=[r['ids'] for r in results])


def _reference(data, kind, dtype):
    conv = build(kind, data.x.shape[1], dtype)
    edge_attr = data.edge_attr.to(dtype) if kind in EDGE else None
    return _run(conv, data.x.to(dtype), data.edge_index, edge_attr,
                torch.arange(NUM_NODES))


@pytest.mark.parametrize('kind', list(CONVS))
def test_fused_equals_unfused_and_single_process(run, kind):
    failures = []
    for dtype in DTYPES:
        ref = _reference(run.data, kind, dtype)
        for mode in MODES:
            for chunk in (None, CHUNK):
                what = (f'{kind} {dtype} mode={mode} chunk={chunk} '
                        f'world={run.world_size}')
                key = (dtype, mode, chunk, kind)
                for r, res in enumerate(run.results):
                    assert res[('ran', *key, 'fused')] == (
                        kind not in NOT_FUSED), \
                        f'{what}: rank {r} fused kernels ran: ' \
                        f"{res[('ran', *key, 'fused')]}"
                    assert not res[('ran', *key, 'unfused')], what
                for path in ('fused', 'unfused'):
                    failures += mismatches(
                        f'{what} {path}', run.ids,
                        [res[(*key, path)] for res in run.results], ref,
                        BY_DTYPE[dtype])
                for r, res in enumerate(run.results):
                    f, u = res[(*key, 'fused')], res[(*key, 'unfused')]
                    failures += close(f[0], u[0], BY_DTYPE[dtype],
                                      f'{what} rank {r} fused/unfused out')
    report(failures)


@pytest.mark.parametrize('kind', ['gat', 'gatv2', 'transformer'])
def test_fused_dropout_replays_the_unfused_masks(run, kind):
    failures = []
    for r, res in enumerate(run.results):
        fused, unfused = res[('dropout', kind, 'fused')], \
            res[('dropout', kind, 'unfused')]
        what = f'{kind} dropout world={run.world_size} rank {r}'
        failures += close(fused[0], unfused[0], BY_DTYPE[torch.float64],
                          f'{what} out')
        failures += close(fused[1], unfused[1], BY_DTYPE[torch.float64],
                          f'{what} dL/dx')
        for name, grad in unfused[2].items():
            if grad is not None:
                failures += close(fused[2][name], grad,
                                  BY_DTYPE[torch.float64], f'{what} {name}')
    report(failures)


TRITON_KINDS = ('gat', 'gat_edge_mean', 'gatv2', 'gatv2_edge_shared',
                'transformer_mean_beta')


def _triton_worker(rank, world_size, root, device='cpu',
                   dtypes=(torch.float64, )):
    from pyg_sar.nn.engine import fused
    ran = []
    forward = fused.FusedAttentionAggregator.forward

    def counted(self, *args):
        ran.append(self.impl.__name__)
        return forward(self, *args)
    fused.FusedAttentionAggregator.forward = counted
    part = pyg_sar.load_partition(root, rank)
    # Chunked: blocks fold into the running max and sum chunk by chunk.
    graph = pyg_sar.DistGraph(part, mode='sar', chunk_size=4 * CHUNK,
                              device=device)
    results = {'ids': part.orig_ids}
    for dtype in dtypes:
        x, edge_attr = (t.to(device, dtype) for t in (part.x, part.edge_attr))
        for kind in TRITON_KINDS:
            conv = pyg_sar.nn.to_distributed(build(kind, 6, dtype)).to(device)
            out = _run(conv, x, graph, edge_attr if kind in EDGE else None,
                       part.orig_ids)
            results[(kind, dtype)] = to_cpu(out)
    results['ran'] = sorted(set(ran))
    return results


def _check_triton(data, results, dtypes, what):
    ids = [r['ids'] for r in results]
    failures = []
    for r in results:
        assert r['ran'] == ['pyg_sar.nn.engine.kernels.gpu'], r['ran']
    for dtype in dtypes:
        for kind in TRITON_KINDS:
            failures += mismatches(f'{kind} {dtype} {what}', ids,
                                   [r[(kind, dtype)] for r in results],
                                   _reference(data, kind, dtype),
                                   BY_DTYPE[dtype])
    report(failures)


@pytest.mark.parametrize('world_size', [1, 2, 3])
def test_triton_kernels_in_the_engine_on_cuda(tmp_path, world_size):
    """The compiled Triton kernels inside the engine on a GPU (ranks share
    it over gloo), chunked, float32 and float64, against single-process
    PyG on the CPU (skipped without a GPU; the GPU check runs it)."""
    from pyg_sar.nn.engine import kernels
    if not torch.cuda.is_available() or not kernels.triton_available():
        pytest.skip('needs a CUDA device and triton (the GPU check runs it)')
    data = graph_data()
    pyg_sar.partition_graph(data, world_size, str(tmp_path))
    dtypes = (torch.float32, torch.float64)
    results = run_workers(_triton_worker, world_size, str(tmp_path), 'cuda',
                          dtypes, timeout_s=300)
    _check_triton(data, results, dtypes, f'cuda world={world_size}')


def test_triton_kernels_in_the_engine_interpreted(tmp_path, monkeypatch):
    """The Triton kernels (interpreted on CPU tensors) inside the engine, at
    world size 2, chunked, in float64, against single-process PyG."""
    from pyg_sar.nn.engine import kernels
    if not kernels.triton_available():
        pytest.skip('triton is not installed (pip install triton; the test '
                    'extra lists it)')
    data = graph_data()
    pyg_sar.partition_graph(data, 2, str(tmp_path))
    # In the workers' environment from their start: Triton reads it when
    # it is imported (some imports of torch's may import it early).
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    monkeypatch.setenv('PYG_SAR_FUSED', 'triton')
    results = run_workers(_triton_worker, 2, str(tmp_path), timeout_s=300)
    _check_triton(data, results, (torch.float64, ), 'triton world=2')


def _gnn(model, channels):
    from pyg_sar.train import GNN
    return lambda: GNN(model, channels, 8, 3, num_layers=2, heads=2,
                       dropout=0.0).double()


def _curve_worker(rank, world_size, root, model, epochs):
    part = pyg_sar.load_partition(root, rank)
    graph = pyg_sar.DistGraph(part, mode='sar', chunk_size=4 * CHUNK)
    mask = part.train_mask.bool() & (rank < world_size - 1)
    losses = train_curve(_gnn(model, part.x.shape[1]),
                         (part.x.double(), graph), part.y, mask,
                         pyg_sar.global_count(mask), epochs, dist=True,
                         lr=0.01)
    return {'losses': losses, 'ids': part.orig_ids}


@pytest.mark.parametrize('model', ['gatv2', 'transformer'])
def test_gnn_loss_curve_equals_single_process(tmp_path, model):
    """``pyg_sar.train.GNN`` (what ``pyg-sar train --model`` builds) with
    fused attention, 3 workers (the last without training nodes), chunked,
    float64: the loss curve of one process. (In float32 the curves part at
    a few 1e-4 after some Adam steps, the fused and separate-operator paths
    alike: rounding, not a different computation.)"""
    data = graph_data()
    pyg_sar.partition_graph(data, 3, str(tmp_path))
    epochs = 12
    results = run_workers(_curve_worker, 3, str(tmp_path), model, epochs,
                          timeout_s=180)
    train = data.train_mask.clone()
    train[results[-1]['ids']] = False
    expected = train_curve(_gnn(model, data.x.shape[1]),
                           (data.x.double(), data.edge_index), data.y, train,
                           int(train.sum()), epochs, lr=0.01)
    for r in results:
        torch.testing.assert_close(
            torch.tensor(r['losses'], dtype=torch.float64),
            torch.tensor(expected, dtype=torch.float64), rtol=1e-10,
            atol=1e-12)
