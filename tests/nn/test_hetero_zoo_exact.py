"""RGATConv, HEATConv (typed edges on a homogeneous partition of
``HeteroData.to_homogeneous()``) and HANConv (on a ``HeteroDistGraph``)
equal single-process PyG: outputs, input gradients and every parameter
gradient, in every mode, with and without chunks, at world sizes 1-4, on
graphs with self loops, duplicate edges and isolated nodes (tests/_hetero.py;
the block parts leave one part without authors, and at three parts one
without fields).

Each spawn (per world size) runs in a module-scoped fixture; the parent
compares, one test per layer configuration."""
import copy
from types import SimpleNamespace

import pytest
import torch
import torch_geometric.nn as pyg_nn

import pyg_sar
from _dist import halo_slices_with_chunks, run_workers, test_device, to_cpu
from _exact import FLOAT32, assemble, close, mismatches, report
from _hetero import AUTHOR, FIELD, BlockHeteroPart, hard_hetero

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow

RUNS = [('sar', None), ('sa', 11), ('one_shot', None), ('sar', 11)]
R = 5  # relations of hard_hetero

# RGATConv configurations: (first layer kwargs, second layer kwargs).
RGAT = {
    'add_within': (dict(heads=2), dict()),
    'add_across_edge_scaled': (
        dict(attention_mechanism='across-relation', edge_dim=3,
             mod='scaled', heads=2), dict(edge_dim=3, mod='additive')),
    'mul_within_bases': (
        dict(attention_mode='multiplicative-self-attention', dim=2,
             heads=2, num_bases=2),
        dict(attention_mode='multiplicative-self-attention', concat=False,
             mod='f-additive')),
    'mul_across_blocks_edge': (
        dict(attention_mode='multiplicative-self-attention',
             attention_mechanism='across-relation', num_blocks=2,
             edge_dim=3, mod='f-scaled'),
        dict(attention_mechanism='across-relation', concat=False,
             num_bases=3)),
}
HEAT = {
    'heat_concat': dict(heads=2),
    'heat_mean_noroot': dict(heads=3, concat=False, root_weight=False),
}
TYPED = tuple(RGAT) + tuple(HEAT) + ('rgat_float64', )
HAN = ('han', 'han_heads_float64')


def _homogeneous():
    data = hard_hetero().to_homogeneous()
    g = torch.Generator().manual_seed(5)
    data.x = torch.randn(data.num_nodes, 12, generator=g)
    data.edge_attr = torch.randn(data.num_edges, 3, generator=g)
    return data


class RGATNet(torch.nn.Module):
    def __init__(self, kw1, kw2) -> None:
        super().__init__()
        self.conv1 = pyg_nn.RGATConv(12, 4, R, **kw1)
        c1 = 4 * kw1.get('heads', 1) * kw1.get('dim', 1)
        self.conv2 = pyg_nn.RGATConv(c1, 3, R, **kw2)

    def forward(self, x, edge_index, node_type, edge_type, edge_attr):
        def attr(conv):  # only for layers with an edge_dim
            return edge_attr if conv.lin_edge is not None else None

        h = self.conv1(x, edge_index, edge_type, attr(self.conv1)).tanh()
        return self.conv2(h, edge_index, edge_type, attr(self.conv2))


class HEATNet(torch.nn.Module):
    def __init__(self, kw) -> None:
        super().__init__()
        self.conv1 = pyg_nn.HEATConv(12, 4, 3, R, 4, 3, 5, **kw)
        c1 = 4 * kw['heads'] if kw.get('concat', True) else 4
        self.conv2 = pyg_nn.HEATConv(c1, 3, 3, R, 2, 3, 2, heads=2)

    def forward(self, x, edge_index, node_type, edge_type, edge_attr):
        h = self.conv1(x, edge_index, node_type, edge_type, edge_attr).relu()
        return self.conv2(h, edge_index, node_type, edge_type, edge_attr)


class HANNet(torch.nn.Module):
    def __init__(self, metadata, heads) -> None:
        super().__init__()
        self.conv1 = pyg_nn.HANConv({'paper': 12, 'author': 8, 'field': 6},
                                    8, metadata, heads=heads)
        self.conv2 = pyg_nn.HANConv(-1, 6, metadata, heads=heads)

    def forward(self, x_dict, edge_index_dict):
        h = self.conv1(x_dict, edge_index_dict)
        h = {t: v.tanh() for t, v in h.items()}
        return self.conv2(h, edge_index_dict)


def _randomize(model, seed=1):
    torch.manual_seed(seed)
    for p in model.parameters():  # everything non-zero, biases too
        p.data = torch.randn_like(p) * 0.5
    return model


def _stock_typed(name):
    torch.manual_seed(0)
    if name == 'rgat_float64':
        model = RGATNet(*RGAT['add_across_edge_scaled'])
    elif name in RGAT:
        model = RGATNet(*RGAT[name])
    else:
        model = HEATNet(HEAT[name])
    model = _randomize(model)
    return model.double() if name.endswith('float64') else model


def _stock_han(name, data):
    torch.manual_seed(0)
    model = HANNet(data.metadata(), heads=2 if 'heads' in name else 1)
    with torch.no_grad():  # initializes lazy parameters
        model(data.x_dict, data.edge_index_dict)
    model = _randomize(model)
    return model.double() if name.endswith('float64') else model


def _weights(ids, width, dtype):
    return (ids[:, None].double() * 37.0 +
            torch.arange(width, device=ids.device)).sin().to(dtype)


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()
            if p.grad is not None}


def _run_typed(model, x, graph, node_type, edge_type, edge_attr, ids):
    dtype = next(model.parameters()).dtype
    x = x.to(dtype).clone().requires_grad_()
    edge_attr = edge_attr.to(dtype)
    model.zero_grad()
    out = model(x, graph, node_type, edge_type, edge_attr)
    (out * _weights(ids, out.shape[1], out.dtype)).sum().backward()
    return out.detach(), x.grad, _grads(model)


def _run_han(model, x_dict, graph, ids_dict):
    dtype = next(model.parameters()).dtype
    x_dict = {t: x.to(dtype).clone().requires_grad_()
              for t, x in x_dict.items()}
    model.zero_grad()
    out = model(x_dict, graph)
    total = sum((v * _weights(ids_dict[t], v.shape[1], v.dtype)).sum()
                for t, v in out.items() if v is not None)
    total.backward()
    return ({t: v.detach() for t, v in out.items() if v is not None},
            {t: x.grad if x.grad is not None else torch.zeros_like(x)
             for t, x in x_dict.items()}, _grads(model))


def _typed_worker(rank, world_size, part_dir):
    part = pyg_sar.load_partition(part_dir, rank)
    device = test_device()
    x, node_type, edge_type, edge_attr, ids = (
        t.to(device) for t in (part.x, part.node_type, part.edge_type,
                               part.edge_attr, part.orig_ids))
    out = {}
    for mode, chunk in RUNS:
        halo_slices_with_chunks(chunk)
        graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk,
                                  device=device)
        for name in TYPED:
            model = pyg_sar.nn.to_distributed(copy.deepcopy(
                _stock_typed(name))).to(device)
            out[(mode, chunk, name)] = to_cpu(_run_typed(
                model, x, graph, node_type, edge_type, edge_attr, ids))
    return part.orig_ids, out


def _compare(run, name, ref):
    """``ref``: (out, x grad, param grads) of model ``name`` in one
    process; every run of the workers against it, one line per
    mismatch."""
    assert ref[2], name  # the model has parameter gradients
    ids = [r[0] for r in run.per_rank]
    failures = []
    for mode, chunk in RUNS:
        key = (mode, chunk, name)
        failures += mismatches(
            f'{name} {mode} chunk={chunk} world={run.world_size}', ids,
            [r[1][key] for r in run.per_rank], ref, FLOAT32, params='some')
    return failures


@pytest.fixture(scope='module', params=[1, 2, 3, 4])
def typed_run(request, tmp_path_factory):
    world_size = request.param
    data = _homogeneous()
    root = tmp_path_factory.mktemp('p')
    pyg_sar.partition_graph(data, world_size, root, progress=False)
    return SimpleNamespace(world_size=world_size, data=data, per_rank=(
        run_workers(_typed_worker, world_size, str(root), timeout_s=180)))


@pytest.mark.parametrize('name', TYPED)
def test_rgat_and_heat_match_pyg(typed_run, name):
    data = typed_run.data
    ref = _run_typed(_stock_typed(name), data.x, data.edge_index,
                     data.node_type, data.edge_type, data.edge_attr,
                     torch.arange(data.num_nodes))
    report(_compare(typed_run, name, ref))


def _han_worker(rank, world_size):
    data = hard_hetero()
    part = BlockHeteroPart(data, rank, world_size,
                           empty={AUTHOR: 1, FIELD: 2})
    device = test_device()
    x_dict = {t: part[t].x.to(device) for t in part.node_types}
    ids = {t: part[t].orig_ids.to(device) for t in part.node_types}
    out = {}
    for mode, chunk in RUNS:
        halo_slices_with_chunks(chunk)
        graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk,
                                  device=device)
        for name in HAN:
            model = pyg_sar.nn.to_distributed(copy.deepcopy(
                _stock_han(name, data))).to(device)
            assert isinstance(model.conv1, pyg_sar.nn.HANConv)
            out[(mode, chunk, name)] = to_cpu(_run_han(model, x_dict, graph,
                                                       ids))
    return to_cpu(ids), out


@pytest.fixture(scope='module', params=[1, 2, 3, 4])
def han_run(request):
    world_size = request.param
    return SimpleNamespace(world_size=world_size, per_rank=run_workers(
        _han_worker, world_size, timeout_s=180))


@pytest.mark.parametrize('name', HAN)
def test_han_matches_pyg(han_run, name):
    data = hard_hetero()
    ids = {t: torch.arange(data[t].num_nodes) for t in data.node_types}
    ref = _run_han(_stock_han(name, data), data.x_dict, data.edge_index_dict,
                   ids)
    report(_compare(han_run, name, ref))


def _han_metis_worker(rank, world_size, part_dir):
    data = hard_hetero()
    part = pyg_sar.load_partition(part_dir, rank)
    graph = pyg_sar.DistGraph(part, mode='sar', chunk_size=5)
    x_dict = {t: part[t].x for t in part.node_types}
    conv = pyg_sar.nn.to_distributed(copy.deepcopy(
        _stock_han('han_heads', data).conv1))
    out, beta = conv(x_dict, graph, return_semantic_attention_weights=True)
    ids = {t: part[t].orig_ids for t in part.node_types}
    return ids, out, beta


@pytest.mark.parametrize('world_size', [2])
def test_han_semantic_attention_on_metis_parts(world_size, tmp_path):
    """Through the partitioner (relabelled ids, CSC edge order): the same
    outputs, and the same semantic attention weights on every worker."""
    data = hard_hetero()
    pyg_sar.partition_graph(data, world_size, tmp_path / 'p', progress=False)
    per_rank = run_workers(_han_metis_worker, world_size,
                           str(tmp_path / 'p'), timeout_s=120)
    ref_out, ref_beta = _stock_han('han_heads', data).conv1(
        data.x_dict, data.edge_index_dict,
        return_semantic_attention_weights=True)
    failures = []
    for t, ref in ref_out.items():
        for rank, (_, _, beta) in enumerate(per_rank):
            failures += close(beta[t].detach(), ref_beta[t].detach(),
                              FLOAT32, f'beta {t} on rank {rank}')
        full = assemble([ids[t] for ids, _, _ in per_rank],
                        [out[t].detach() for _, out, _ in per_rank],
                        ref.size(0))
        failures += close(full, ref.detach(), FLOAT32, f'out {t}')
    report(failures)


def _refusals(rank, world_size, part_dir):
    part = pyg_sar.load_partition(part_dir, rank)
    graph = pyg_sar.DistGraph(part)
    x, nt, et, ea = part.x, part.node_type, part.edge_type, part.edge_attr
    rgat = pyg_sar.nn.to_distributed(pyg_nn.RGATConv(12, 4, R))
    heat = pyg_sar.nn.to_distributed(pyg_nn.HEATConv(12, 4, 3, R, 2, 3, 2))
    han = pyg_sar.nn.HANConv(12, 4, (['a'], [('a', 'to', 'a')]))
    calls = {
        'rgat_weights': lambda: rgat(x, graph, et,
                                     return_attention_weights=True),
        'rgat_no_type': lambda: rgat(x, graph),
        'heat_node_type': lambda: heat(x, graph, nt[:-1], et, ea),
        'heat_no_attr': lambda: heat(x, graph, nt, et),
        'han_graph': lambda: han({'a': x}, graph),
    }
    messages = {}
    for name, call in calls.items():
        try:
            call()
            messages[name] = None
        except (ValueError, TypeError) as e:
            messages[name] = str(e)
    return messages


def test_refusals_name_the_problem(tmp_path):
    pyg_sar.partition_graph(_homogeneous(), 1, tmp_path / 'p',
                            progress=False)
    messages = run_workers(_refusals, 1, str(tmp_path / 'p'))[0]
    expected = {'rgat_weights': 'return_attention_weights',
                'rgat_no_type': 'needs edge_type',
                'heat_node_type': 'node_type has shape',
                'heat_no_attr': 'needs edge_attr',
                'han_graph': 'expects a HeteroDistGraph'}
    for name, text in expected.items():
        assert messages[name] is not None and text in messages[name], (
            name, messages[name])
        assert '\n' not in messages[name], name


@pytest.mark.parametrize('make', [
    lambda: pyg_nn.RGATConv(12, 4, R, edge_dim=3),
    lambda: pyg_nn.HEATConv(12, 4, 3, R, 2, 3, 2, heads=2),
    lambda: pyg_nn.HANConv(-1, 8, hard_hetero().metadata(), heads=2),
])
def test_conversion_keeps_state(make):
    """The converted layer holds the stock layer's parameters (same keys,
    values, dtype and requires_grad; lazy ones stay lazy) and training
    mode, and the state_dict loads back into the stock layer."""
    stock = make().double().eval()
    first = next(p for p in stock.parameters()
                 if not isinstance(p, torch.nn.UninitializedParameter))
    first.requires_grad_(False)
    state = {k: v.clone() for k, v in stock.state_dict().items()
             if not isinstance(v, torch.nn.UninitializedParameter)}
    flags = {n: p.requires_grad for n, p in stock.named_parameters()}
    model = pyg_sar.nn.to_distributed(torch.nn.Sequential(stock))
    conv = model[0]
    assert type(conv).__module__.startswith('pyg_sar.nn.conv'), type(conv)
    assert not conv.training
    assert {n: p.requires_grad for n, p in conv.named_parameters()} == flags
    new = conv.state_dict()
    assert set(new) == set(stock.state_dict())
    for k, v in state.items():
        # Bit for bit; NaN equals NaN (a lazy layer's bias is uninitialized
        # memory until its first call, which may hold NaN).
        assert new[k].dtype == torch.float64, k
        torch.testing.assert_close(new[k], v, rtol=0, atol=0, equal_nan=True,
                                   msg=k)
    make().double().load_state_dict(new)


def _han_curve(model, x_dict, graph, y, train, count, reduce, total):
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(10):
        optimizer.zero_grad()
        logits = model(x_dict, graph)['paper'][:, :4]
        loss = torch.nn.functional.cross_entropy(
            logits[train], y[train], reduction='sum') / count(
                int(train.sum()))
        loss.backward()
        reduce(model)
        optimizer.step()
        losses.append(float(total(loss.detach().clone())))
    return losses


def _han_curve_worker(rank, world_size):
    from pyg_sar import comm
    data = hard_hetero()
    part = BlockHeteroPart(data, rank, world_size, empty={AUTHOR: 1})
    model = pyg_sar.nn.to_distributed(_stock_han('han_heads', data))
    x_dict = {t: part[t].x for t in part.node_types}
    return _han_curve(model, x_dict, pyg_sar.DistGraph(part),
                      part['paper'].y, part['paper'].train_mask,
                      pyg_sar.global_count, pyg_sar.all_reduce_grads,
                      comm.all_reduce)


def test_han_trains_along_the_same_loss_curve():
    """A stock training loop (Adam, masked cross entropy over the papers)
    on two workers follows the single-process loss curve."""
    data = hard_hetero()
    ref = _han_curve(_stock_han('han_heads', data), data.x_dict,
                     data.edge_index_dict, data['paper'].y,
                     data['paper'].train_mask, lambda n: n,
                     lambda m: None, lambda t: t)
    per_rank = run_workers(_han_curve_worker, 2, timeout_s=120)
    assert ref[-1] < ref[0]
    report([line for rank, losses in enumerate(per_rank)
            for line in close(torch.tensor(losses), torch.tensor(ref),
                              FLOAT32, f'loss curve on rank {rank}')])
