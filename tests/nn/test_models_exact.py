"""PyG's model classes (``torch_geometric.nn.models``: GCN, GraphSAGE, GIN,
GAT, PNA, EdgeCNN) converted with :func:`pyg_sar.nn.to_distributed` equal the
stock model on the whole graph in one process: outputs, input gradients,
every parameter gradient (summed over ranks) and the running statistics of
their norms, across jumping-knowledge modes and normalizations, at world
sizes 1-4, in every mode ('sar', 'sa', 'one_shot') and with chunking.

One spawn per world size runs every case, in a module-scoped fixture; the
parent compares, one test per case. Conversion itself (state_dict keys,
dtypes, frozen parameters, training flags) is checked without a process
group.
"""
import copy
from types import SimpleNamespace

import pytest
import torch
from torch_geometric.nn import models
from torch_geometric.utils import degree

import pyg_sar
from _dist import run_workers
from _exact import BY_DTYPE, close, mismatches, report
from _graphs import hard_graph

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow

# (mode, chunk_size): whole partitions, and many whole-neighborhood chunks.
CONFIGS = (('sar', None), ('sa', None), ('one_shot', None), ('sar', 19))
HIDDEN, OUT = 8, 4
PNA_ARGS = dict(aggregators=['mean', 'min', 'max', 'std'],
                scalers=['identity', 'amplification', 'attenuation'])
MODELS = {
    'GCN': models.GCN,
    'GraphSAGE': models.GraphSAGE,
    'GIN': models.GIN,
    'GAT': models.GAT,
    'PNA': models.PNA,
    'EdgeCNN': models.EdgeCNN,
}


def case(model, jk=None, norm=None, dtype=torch.float32, train=True):
    return (model, jk, norm, dtype, train)


CASES = (
    # Every model, plain.
    [case(m) for m in MODELS] +
    # Every jumping-knowledge mode, with whole-graph batch statistics.
    [case(m, jk, 'batch_norm') for m in ('GCN', 'GraphSAGE')
     for jk in (None, 'cat', 'max', 'lstm')] +
    # Every normalization (GIN's also sit inside its MLPs).
    [case(m, 'cat', norm) for m in ('GIN', 'GAT')
     for norm in (None, 'batch_norm', 'layer_norm', 'graph_norm')] +
    # Per-edge MLP norms (EdgeCNN) and degree scalers (PNA) with a norm.
    # EdgeCNN's norms sit inside EdgeConv's MLP and normalize per-edge
    # messages over all edges: the layer then runs unchunked.
    [case(m, None, 'layer_norm') for m in ('PNA', 'EdgeCNN')] +
    # Eval mode: norms use (non-trivial) running statistics.
    [case('GCN', 'cat', 'batch_norm', train=False),
     case('GIN', 'max', 'batch_norm', train=False)] +
    # float64 end to end.
    [case('GAT', 'lstm', 'graph_norm', dtype=torch.float64)])


def name_of(c) -> str:
    model, jk, norm, dtype, train = c
    extra = ('' if dtype == torch.float32 else ' float64') + (
        '' if train else ' eval')
    return f'{model}(jk={jk}, norm={norm}){extra}'


def full_degree_histogram() -> torch.Tensor:
    data = hard_graph()
    return torch.bincount(degree(data.edge_index[1], data.num_nodes,
                                 dtype=torch.long))


def build(c, in_channels: int) -> torch.nn.Module:
    """The stock model of a case, with seeded, non-trivial weights and
    running statistics, in the case's dtype and mode."""
    model, jk, norm, dtype, train = c
    kwargs = {}
    if model == 'PNA':
        kwargs = dict(PNA_ARGS, deg=full_degree_histogram())
    if model == 'GAT':
        kwargs = dict(heads=2)
    torch.manual_seed(sum(map(ord, name_of(c))))
    module = MODELS[model](in_channels, HIDDEN, 3 if jk else 2, OUT,
                           dropout=0.0, jk=jk, norm=norm, **kwargs)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if 'norms.' in name:  # away from the ones/zeros init
                p.add_(0.2 * torch.randn(p.shape, generator=gen))
        for name, b in module.named_buffers():
            if name.endswith('running_mean'):
                b.copy_(0.5 * torch.randn(b.shape, generator=gen))
            elif name.endswith('running_var'):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))
    return module.to(dtype).train(train)


def probe(num_nodes: int, shape) -> torch.Tensor:
    gen = torch.Generator().manual_seed(99)
    return torch.randn(num_nodes, *shape, generator=gen)


def evaluate(module, x, graph, ids, num_nodes, dtype):
    """Output, dL/dx, dL/dparameters and buffers after one forward."""
    x = x.to(dtype).clone().requires_grad_()
    out = module(x, graph)
    (out * probe(num_nodes, out.shape[1:])[ids].to(dtype)).sum().backward()
    return (out.detach(), x.grad,
            {n: p.grad for n, p in module.named_parameters()},
            {n: b.detach().clone() for n, b in module.named_buffers()})


def _worker(rank, world_size, root, cases, configs):
    part = pyg_sar.load_partition(root, rank)
    n = int(part.num_nodes)
    results = {}
    for mode, chunk in configs:
        graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk)
        for c in cases:
            stock = build(c, part.x.size(1))
            module = pyg_sar.nn.to_distributed(copy.deepcopy(stock))
            results[(mode, chunk, c)] = evaluate(module, part.x, graph,
                                                 part.orig_ids, n, c[3])
    results['ids'] = part.orig_ids
    return results


@pytest.fixture(scope='module', params=[1, 2, 3, 4])
def models_run(request, tmp_path_factory):
    """Every case in every config, in one spawn of ``world_size``
    workers."""
    world_size = request.param
    data = hard_graph()
    root = str(tmp_path_factory.mktemp('parts'))
    pyg_sar.partition_graph(data, world_size, root)
    results = run_workers(_worker, world_size, root, CASES, CONFIGS,
                          timeout_s=120)
    return SimpleNamespace(world_size=world_size, data=data, results=results,
                           ids=[r['ids'] for r in results])


@pytest.mark.parametrize('c', CASES, ids=name_of)
def test_model_equals_single_process(models_run, c):
    """Every output row, input-gradient row, parameter gradient (summed
    over ranks) and running statistic (on every rank) equals the stock
    model's on the whole graph."""
    run, data = models_run, models_run.data
    tol = BY_DTYPE[c[3]]
    ref_out, ref_gx, ref_gp, ref_buf = evaluate(
        build(c, data.x.size(1)), data.x, data.edge_index,
        torch.arange(data.num_nodes), data.num_nodes, c[3])
    failures = []
    for mode, chunk in CONFIGS:
        key = (mode, chunk, c)
        got = [r[key] for r in run.results]
        what = (f'{name_of(c)} mode={mode} chunk={chunk} '
                f'world={run.world_size}')
        failures += mismatches(what, run.ids, got, (ref_out, ref_gx, ref_gp),
                               tol)
        for bname, ref in ref_buf.items():
            if ref.is_floating_point():  # running statistics
                for rank, g in enumerate(got):
                    failures += close(g[3][bname], ref, tol,
                                      f'{what} {bname} on rank {rank}')
    report(failures)


# Conversion, no process group needed ########################################

@pytest.mark.parametrize('c', CASES, ids=name_of)
def test_conversion_keeps_state(c):
    stock = build(c, 6)
    # Freeze one parameter of a conv, of a norm (where there is one) and of
    # the final linear map (where there is one).
    names = [n for n, _ in stock.named_parameters()]
    frozen = {names[0]} | {n for n in names if n.startswith('norms.0.')
                           } | {n for n in names if n.startswith('lin.')}
    for n, p in stock.named_parameters():
        p.requires_grad_(n not in frozen)
    module = pyg_sar.nn.to_distributed(copy.deepcopy(stock))

    state, ref = module.state_dict(), stock.state_dict()
    assert list(state) == list(ref)
    for k in ref:
        assert state[k].dtype == ref[k].dtype, k
        assert torch.equal(state[k], ref[k]), k
    assert {n: p.requires_grad for n, p in module.named_parameters()} == {
        n: p.requires_grad for n, p in stock.named_parameters()}
    assert all(m.training == c[4] for m in module.modules())

    fresh = copy.deepcopy(stock)
    with torch.no_grad():
        for t in fresh.state_dict().values():
            t.zero_()
    fresh.load_state_dict(state, strict=True)
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, ref[k]), k


@pytest.mark.parametrize('model', list(MODELS))
def test_float64_and_frozen_parameters_survive(model):
    stock = build(case(model, 'cat', 'batch_norm'), 6).double()
    for n, p in stock.named_parameters():
        if n.startswith('convs.0.'):
            p.requires_grad_(False)
    module = pyg_sar.nn.to_distributed(copy.deepcopy(stock))
    for n, p in module.named_parameters():
        assert p.dtype == torch.float64, n
        assert p.requires_grad == (not n.startswith('convs.0.')), n
    for n, b in module.named_buffers():
        if b.is_floating_point():
            assert b.dtype == torch.float64, n
    # A fresh stock model (default dtype) loads the converted state.
    fresh = build(case(model, 'cat', 'batch_norm'), 6).double()
    fresh.load_state_dict(module.state_dict(), strict=True)
