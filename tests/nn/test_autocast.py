"""Mixed precision: stock PyG models converted with ``to_distributed`` run
under ``torch.autocast`` (bfloat16 on the CPU here; the same code runs fp16
and bf16 on CUDA) and give stock PyG's outputs, input gradients, every
parameter gradient and loss curve under the same autocast, within bfloat16
tolerance, at world sizes 1-3 and in every mode. The engine computes half
precision inputs in float32 (sums and softmax statistics never round to 16
bits) and returns the dtype PyG's own propagate would return.

One spawn per world size runs every model, in a module-scoped fixture; the
parent compares, one test per model."""
import copy
from types import SimpleNamespace

import pytest
import torch
from torch_geometric.nn import models

import pyg_sar
from _dist import run_workers
from _exact import Tol, close, mismatches, report
from _graphs import hard_graph

# bfloat16 keeps 8 significant bits: 2^-8 relative per rounding; two layers
# and a backward compound it. Errors are scaled by the largest entry.
TOL = 4e-2
BF16 = Tol(rtol=0.0, atol=TOL, scaled=True, floor=1e-3)
CURVE_MODELS = ('GraphSAGE', 'GAT')
CONFIGS = (('sar', None), ('sa', None), ('one_shot', None), ('sar', 19))
MODELS = {
    'GCN': lambda c: models.GCN(c, 16, 2, 4),
    'GraphSAGE': lambda c: models.GraphSAGE(c, 16, 2, 4),
    'GraphSAGE-max': lambda c: models.GraphSAGE(c, 16, 2, 4, aggr='max'),
    'GIN': lambda c: models.GIN(c, 16, 2, 4),
    'GAT': lambda c: models.GAT(c, 8, 2, 4, heads=2),
    'GATv2': lambda c: models.GAT(c, 8, 2, 4, heads=2, v2=True),
}


def build(name, in_channels):
    torch.manual_seed(sum(map(ord, name)))
    return MODELS[name](in_channels)


def probe(num_nodes):
    return torch.randn(num_nodes, 4, generator=torch.Generator()
                       .manual_seed(5))


def one_pass(module, x, edges, weights):
    """Output (float32 copy and dtype), dL/dx and dL/dparameters of one
    forward under bfloat16 autocast."""
    x = x.clone().requires_grad_()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = module(x, edges)
    (out.float() * weights).sum().backward()
    return (out.detach().float(), out.dtype, x.grad,
            {n: p.grad.clone() for n, p in module.named_parameters()})


def curve(module, x, edges, y, mask, num_train, steps=4):
    """Losses of ``steps`` Adam steps under autocast, as partial sums over
    the global number of training nodes (summed over ranks by the parent)."""
    opt = torch.optim.Adam(module.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = module(x, edges)
        loss = torch.nn.functional.cross_entropy(
            out.float()[mask], y[mask], reduction='sum') / num_train
        loss.backward()
        pyg_sar.all_reduce_grads(module)
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def _worker(rank, world_size, root, num_train):
    part = pyg_sar.load_partition(root, rank)
    weights = probe(int(part.num_nodes))[part.orig_ids]
    results = {'ids': part.orig_ids}
    for mode, chunk in CONFIGS:
        graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk)
        for name in MODELS:
            module = pyg_sar.nn.to_distributed(build(name, part.x.size(1)))
            results[(mode, chunk, name)] = one_pass(module, part.x, graph,
                                                    weights)
    graph = pyg_sar.DistGraph(part)
    for name in CURVE_MODELS:
        module = pyg_sar.nn.to_distributed(build(name, part.x.size(1)))
        results[('curve', name)] = curve(module, part.x, graph, part.y,
                                         part.train_mask, num_train)
    return results


@pytest.fixture(scope='module', params=[1, 2, 3])
def autocast_run(request, tmp_path_factory):
    world_size = request.param
    data = hard_graph()
    root = str(tmp_path_factory.mktemp('parts'))
    pyg_sar.partition_graph(data, world_size, root)
    num_train = int(data.train_mask.sum())
    results = run_workers(_worker, world_size, root, num_train,
                          timeout_s=240)
    return SimpleNamespace(world_size=world_size, data=data,
                           num_train=num_train, results=results,
                           ids=[r['ids'] for r in results])


@pytest.mark.slow
@pytest.mark.parametrize('name', list(MODELS))
def test_autocast_matches_stock_pyg_under_autocast(autocast_run, name):
    run, data = autocast_run, autocast_run.data
    stock = build(name, data.num_features)
    out, dtype, x_grad, grads = one_pass(copy.deepcopy(stock), data.x,
                                         data.edge_index,
                                         probe(data.num_nodes))
    failures = []
    for mode, chunk in CONFIGS:
        got = [r[(mode, chunk, name)] for r in run.results]
        what = f'{name} {mode} chunk={chunk} N={run.world_size}'
        if any(g[1] != dtype for g in got):
            failures.append(f'{what}: dtype {[g[1] for g in got]} != '
                            f'{dtype}')
        failures += mismatches(what, run.ids,
                               [(g[0], g[2], g[3]) for g in got],
                               (out, x_grad, grads), BF16)
    report(failures)


@pytest.mark.slow
@pytest.mark.parametrize('name', CURVE_MODELS)
def test_loss_curve_matches_stock_pyg_under_autocast(autocast_run, name):
    run, data = autocast_run, autocast_run.data
    expected = curve(build(name, data.num_features), data.x,
                     data.edge_index, data.y, data.train_mask, run.num_train)
    assert expected[-1] < expected[0]  # it trains
    # The losses are partial sums over the ranks.
    got = [sum(r[('curve', name)][k] for r in run.results)
           for k in range(len(expected))]
    report(close(torch.tensor(got, dtype=torch.float64),
                 torch.tensor(expected, dtype=torch.float64),
                 Tol(rtol=TOL, atol=0.0),
                 f'{name} N={run.world_size} loss curve'))


def test_half_inputs_are_computed_in_float32_and_returned_as_pyg_does(
        tmp_path):
    # One worker, no process group: a bfloat16 table into GATConv's engine
    # path returns float32 (its attention scores are float32, as in PyG),
    # into SAGEConv's returns bfloat16; the engine's sums are float32, so
    # the result is the float32 aggregate rounded once.
    from torch_geometric.nn import SAGEConv
    data = hard_graph()
    pyg_sar.partition_graph(data, 1, str(tmp_path))
    part = pyg_sar.load_partition(str(tmp_path), 0)
    graph = pyg_sar.DistGraph(part)
    conv = pyg_sar.nn.to_distributed(torch.nn.Sequential(
        SAGEConv(6, 6, aggr='sum', root_weight=False, bias=False)))[0]
    with torch.no_grad():
        conv.lin_l.weight.copy_(torch.eye(6))
    x = torch.randn(part.num_nodes, 6).bfloat16()
    out = conv.propagate(graph, x=x)
    assert out.dtype == torch.bfloat16
    exact = conv.propagate(graph, x=x.float())
    assert torch.equal(out, exact.bfloat16())
