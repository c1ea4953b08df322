"""What ``to_distributed`` does with every PyG conv class (converts and is
exact, or refuses by name), what it keeps (dtype, device, requires_grad,
state_dict), and the contract's clear errors (second backward, sizes, half
precision). One worker, no process group: the exchange is local."""
import copy
import warnings

import pytest
import torch
import torch_geometric.nn as pyg_nn
import torch_geometric.nn.conv as pyg_conv

import pyg_sar
from pyg_sar.nn import DistMessagePassing, convertible, to_distributed
from pyg_sar.nn.adapter import DistAdapter
from pyg_sar.nn.convert import REFUSAL_REASONS
from _dist import run_workers
from _exact import BY_DTYPE, mismatches
from _graphs import hard_graph
from tests.nn.test_zoo_exact import ZOO

# Stock layers whose exactness the suite checks: the SAR-engine twins in
# test_sar_exact.py, everything else in test_zoo_exact.py.
TWINS = {pyg_nn.GCNConv, pyg_nn.SAGEConv, pyg_nn.GraphConv, pyg_nn.GINConv,
         pyg_nn.GATConv, pyg_nn.GATv2Conv}
# Exactness tests: tests/nn/conv/test_rgcn_conv.py,
# tests/nn/test_hetero_exact.py.
RELATIONAL = {pyg_nn.RGCNConv, pyg_nn.FastRGCNConv, pyg_nn.HGTConv,
              pyg_nn.HeteroConv,
              # tests/nn/test_hetero_zoo_exact.py
              pyg_nn.RGATConv, pyg_nn.HEATConv, pyg_nn.HANConv}
GLOBAL = {pyg_nn.GPSConv}  # tests/nn/conv/test_gps_conv.py
# tests/nn/test_zoo_refused_exact.py
ONCE_REFUSED = {pyg_nn.EGConv, pyg_nn.PDNConv, pyg_nn.DNAConv,
                pyg_nn.AntiSymmetricConv, pyg_nn.SignedConv, pyg_nn.WLConv,
                pyg_nn.SuperGATConv}


def _bare(cls):
    """An instance without running the constructor (enough to convert)."""
    module = cls.__new__(cls)
    torch.nn.Module.__init__(module)
    return module


def test_every_pyg_conv_converts_exactly_or_is_refused_by_name():
    tested = TWINS | RELATIONAL | GLOBAL | ONCE_REFUSED | {
        type(make()) for make, _ in ZOO.values()}
    converted, refused = [], []
    for name in pyg_conv.__all__:
        cls = getattr(pyg_conv, name)
        if cls is pyg_nn.MessagePassing:
            continue
        if cls in convertible():
            assert cls in tested, f'{name} converts but has no exactness test'
            converted.append(name)
            continue
        assert name in REFUSAL_REASONS, f'{name}: refused without a reason'
        with pytest.raises(ValueError, match=f'{name} at .0.'):
            to_distributed(torch.nn.Sequential(_bare(cls)))
        with pytest.warns(UserWarning, match=name):
            to_distributed(torch.nn.Sequential(_bare(cls)), strict=False)
        refused.append(name)
    assert len(converted) + len(refused) == len(pyg_conv.__all__) - 1
    assert len(converted) >= 30, converted


def test_node_mixing_module_without_distributed_version_is_refused():
    model = torch.nn.Sequential(pyg_nn.SAGEConv(4, 4),
                                pyg_nn.MeanSubtractionNorm())
    with pytest.raises(ValueError, match='MeanSubtractionNorm'):
        to_distributed(model)


@pytest.mark.parametrize('make', [
    lambda: pyg_nn.SAGEConv(6, 4),                     # engine twin
    lambda: pyg_nn.TransformerConv(6, 2, heads=2),     # engine twin
    lambda: pyg_nn.TransformerConv(6, 2, aggr='max'),  # adapted
    lambda: pyg_nn.GENConv(6, 4),                      # adapted + norm inside
])
def test_conversion_keeps_dtype_frozen_params_and_state(make, hard_part):
    data, part = hard_part
    stock = make().double().eval()
    frozen = next(iter(stock.parameters()))
    frozen.requires_grad_(False)
    state = copy.deepcopy(stock.state_dict())
    dist = to_distributed(copy.deepcopy(stock))
    assert not dist.training
    for (name, p), (_, q) in zip(stock.named_parameters(),
                                 dist.named_parameters()):
        assert q.dtype == torch.float64 and q.requires_grad == p.requires_grad
    assert dist.state_dict().keys() == state.keys()
    fresh = make().double()
    fresh.load_state_dict(dist.state_dict(), strict=True)
    out = dist(part.x.double(), pyg_sar.DistGraph(part))
    ref = stock(data.x.double(), data.edge_index)[part.orig_ids]
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


def test_second_backward_is_a_clear_error(hard_part):
    _, part = hard_part
    conv = to_distributed(pyg_nn.SAGEConv(6, 4))
    out = conv(part.x.requires_grad_(), pyg_sar.DistGraph(part))
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match='second backward'):
        out.sum().backward()


def test_size_other_than_the_local_graph_is_refused(hard_part):
    _, part = hard_part

    class Sized(DistMessagePassing):
        def forward(self, x, g):
            return self.propagate(g, size=(3, 3), x=x)

    with pytest.raises(ValueError, match='size=\\(3, 3\\)'):
        Sized()(part.x, pyg_sar.DistGraph(part))


def test_half_precision(hard_part):
    data, part = hard_part
    torch.manual_seed(0)
    stock = pyg_nn.SAGEConv(6, 4).to(torch.bfloat16)
    dist = to_distributed(copy.deepcopy(stock))
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        out = dist(part.x.bfloat16(), pyg_sar.DistGraph(part))
    ref = stock(data.x.bfloat16(), data.edge_index)[part.orig_ids]
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2,
                               atol=2e-2)
    # Attention in bfloat16 (weights too): computed in float32 by the
    # engine, returned in bfloat16, within bfloat16 rounding of stock PyG.
    stock = pyg_nn.GATConv(6, 4, heads=2).to(torch.bfloat16)
    gat = to_distributed(copy.deepcopy(stock))
    out = gat(part.x.bfloat16(), pyg_sar.DistGraph(part))
    ref = stock(data.x.bfloat16(), data.edge_index)[part.orig_ids]
    assert out.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), rtol=3e-2,
                               atol=3e-2)


def test_attention_score_reading_index_is_refused(hard_part):
    """An engine attention layer cannot see whole neighborhoods in its
    edge_score: PyG's softmax there would normalize per chunk. Refused."""
    _, part = hard_part

    class ScoreWithIndex(DistMessagePassing):
        attention = True

        def forward(self, x, g):
            return self.propagate(g, x=x.unsqueeze(1)).squeeze(1)

        def edge_score(self, x_j, x_i, index):
            return (x_j * x_i).sum(-1)

        def message(self, x_j):
            return x_j

    with pytest.raises(ValueError, match="does not support message reads "
                       r"\['index'\]"):
        ScoreWithIndex()(part.x, pyg_sar.DistGraph(part))


# Every stock layer with an engine twin, across its aggregation options ######
# (strings, modules, lists, learnable parameters, aggr_kwargs, other flows):
# each converts exactly (to its twin or through the whole-neighborhood
# fallback) or is refused by name. World size 2, one spawn for all cases.

def _aggr_options():
    from torch_geometric.nn import aggr as A
    strings = ['sum', 'add', 'mean', 'max', 'min', 'mul', 'var', 'std',
               'median', 'softmax', 'powermean', 'lstm']
    opts = {f'aggr={s!r}': dict(aggr=s) for s in strings}
    opts.update({
        'SoftmaxAggregation(learn=True)':
            lambda: dict(aggr=A.SoftmaxAggregation(learn=True)),
        'SoftmaxAggregation(t=0.5)':
            lambda: dict(aggr=A.SoftmaxAggregation(t=0.5)),
        'PowerMeanAggregation(learn=True)':
            lambda: dict(aggr=A.PowerMeanAggregation(learn=True)),
        'MultiAggregation([mean, max])':
            lambda: dict(aggr=A.MultiAggregation(['mean', 'max'])),
        'QuantileAggregation(0.25)':
            lambda: dict(aggr=A.QuantileAggregation(0.25)),
        'MeanAggregation()': lambda: dict(aggr=A.MeanAggregation()),
        "['mean', 'max']": dict(aggr=['mean', 'max']),
        "['sum', 'std', 'min']": dict(aggr=['sum', 'std', 'min']),
        "softmax + aggr_kwargs learn": dict(aggr='softmax',
                                            aggr_kwargs={'learn': True}),
        'LSTMAggregation(4, 4)': lambda: dict(aggr=A.LSTMAggregation(4, 4)),
        "flow='target_to_source'": dict(flow='target_to_source'),
    })
    return opts


AGGR_OPTIONS = _aggr_options()
AGGR_LAYERS = {
    'SAGEConv': lambda kw: pyg_nn.SAGEConv(6, 4, **kw),
    'GraphConv': lambda kw: pyg_nn.GraphConv(6, 4, **kw),
    'GCNConv': lambda kw: pyg_nn.GCNConv(6, 4, **kw),
    'GINConv': lambda kw: pyg_nn.GINConv(torch.nn.Sequential(
        torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4)),
        train_eps=True, **kw),
    'GATConv': lambda kw: pyg_nn.GATConv(6, 4, heads=2, **kw),
    'GATv2Conv': lambda kw: pyg_nn.GATv2Conv(6, 4, heads=2, **kw),
    'TransformerConv': lambda kw: pyg_nn.TransformerConv(6, 4, heads=2,
                                                         **kw),
    'RGCNConv': lambda kw: pyg_nn.RGCNConv(6, 4, num_relations=2, **kw),
    'FastRGCNConv': lambda kw: pyg_nn.FastRGCNConv(6, 4, num_relations=2,
                                                   **kw),
    'HGTConv': lambda kw: pyg_nn.HGTConv(6, 4, (['a'], [('a', 'to', 'a')]),
                                         heads=2, **kw),
    'GraphSAGE': lambda kw: pyg_nn.GraphSAGE(6, 4, 2, **kw),
}
# Typed layers: their configurations are checked to convert to the twin
# (exact: tests/nn/conv/test_rgcn_conv.py, tests/nn/test_hetero_exact.py)
# or to be refused; the others run here.
TYPED = {'RGCNConv', 'FastRGCNConv', 'HGTConv'}
_AGGR_CHUNK = 19


def _stock(layer, option):
    """The stock layer (seeded), or None where PyG itself rejects it."""
    kw = AGGR_OPTIONS[option]
    torch.manual_seed(0)
    try:
        module = AGGR_LAYERS[layer](kw() if callable(kw) else dict(kw))
        if layer not in TYPED:
            # Sorted by destination: what sequence aggregations need.
            data = hard_graph().sort(sort_by_row=False)
            out = module(data.x, data.edge_index)
            if out.size(0) != data.num_nodes:
                return None  # e.g. GATConv(flow='target_to_source')
    except Exception:
        return None
    # Learnable aggregation parameters away from their initial values.
    with torch.no_grad():
        for name, p in module.named_parameters():
            if 'aggr_module' in name:
                p.add_(0.3)
    return module


def _classify(module, layer):
    """('twin'|'adapted', module) or ('refused', message)."""
    try:
        dist = to_distributed(copy.deepcopy(module))
    except ValueError as e:
        name = layer if layer != 'GraphSAGE' else 'SAGEConv'
        if name in str(e) and '\n' not in str(e):
            return 'refused', str(e)
        raise
    return 'converted', dist


def _aggr_probe(n, shape):
    gen = torch.Generator().manual_seed(5)
    return torch.randn(n, *shape, generator=gen)


def _aggr_eval(module, x, graph, ids, n):
    x = x.clone().requires_grad_()
    out = module(x, graph)
    (out * _aggr_probe(n, out.shape[1:])[ids]).sum().backward()
    return (out.detach(), x.grad,
            {k: p.grad for k, p in module.named_parameters()})


def _aggr_worker(rank, world_size, root, cases):
    part = pyg_sar.load_partition(root, rank)
    n = int(part.num_nodes)
    results = {'ids': part.orig_ids}
    for mode, chunk in (('sar', _AGGR_CHUNK), ('one_shot', None)):
        graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk)
        for layer, option in cases:
            stock = _stock(layer, option)
            _, dist = _classify(stock, layer)
            try:
                results[(mode, layer, option)] = _aggr_eval(
                    dist, part.x, graph, part.orig_ids, n)
            except Exception as e:  # counted as neither by the parent
                results[(mode, layer, option)] = repr(e)[:300]
    return results


@pytest.mark.slow
def test_every_twin_aggregation_option_is_exact_or_refused(tmp_path):
    data = hard_graph()
    counts = {'exact': 0, 'refused': 0, 'neither': []}
    to_run = []
    for layer in AGGR_LAYERS:
        for option in AGGR_OPTIONS:
            stock = _stock(layer, option)
            if stock is None:
                continue
            try:
                kind, dist = _classify(stock, layer)
            except Exception as e:  # a third-party error escaping
                counts['neither'].append((layer, option, repr(e)[:200]))
                continue
            if kind == 'refused':
                counts['refused'] += 1
            elif layer in TYPED:
                twin = type(dist).__module__.startswith('pyg_sar.nn.conv')
                aggr_ok = stock.aggr in ('mean', 'sum', 'add', 'max', 'min')
                if twin and aggr_ok and not isinstance(dist, DistAdapter):
                    counts['exact'] += 1
                else:
                    counts['neither'].append((layer, option, 'converted'))
            else:
                to_run.append((layer, option))
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, 2, root)
    results = run_workers(_aggr_worker, 2, root, to_run, timeout_s=300)
    ids = [r['ids'] for r in results]
    for layer, option in to_run:
        ref = _aggr_eval(_stock(layer, option), data.x, data.edge_index,
                         torch.arange(data.num_nodes), data.num_nodes)
        bad = []
        for mode in ('sar', 'one_shot'):
            got = [r[(mode, layer, option)] for r in results]
            if any(isinstance(g, str) for g in got):
                bad.append(f'{mode}: ' + next(g for g in got
                                               if isinstance(g, str)))
                continue
            bad += mismatches(mode, ids, got, ref, BY_DTYPE[torch.float32],
                              none_grads='skip')
        if bad:
            counts['neither'].append((layer, option, bad))
        else:
            counts['exact'] += 1
    assert counts['neither'] == [], counts['neither']
    # Learnable, list, module and kwarg options all counted, none skipped.
    assert counts['exact'] >= 60 and counts['refused'] >= 10, counts


@pytest.mark.parametrize('make', [lambda: pyg_nn.SAGEConv(6, 4),
                                  lambda: pyg_nn.GATConv(6, 4)])
def test_stock_layer_given_a_dist_graph_names_the_fix(make, hard_part):
    # A model handed to pyg_sar (sync_params) whose stock layers are then
    # called with a DistGraph says to convert the model, instead of failing
    # deep inside PyG; the same layer on a plain edge_index (sampled
    # batches) runs as before, and the hook is the layer's own.
    from torch.nn.modules import module as torch_module
    data, part = hard_part
    dist_graph = pyg_sar.DistGraph(part)
    model = torch.nn.ModuleList([make()])
    global_hooks = len(torch_module._global_forward_pre_hooks)
    pyg_sar.sync_params(model)
    assert len(torch_module._global_forward_pre_hooks) == global_hooks
    layer = model[0]
    with pytest.raises(TypeError, match=r"is a stock PyG layer and got a "
                       r"DistGraph as its graph; convert the model with "
                       r"pyg_sar.nn.to_distributed\(model\)"):
        layer(part.x, dist_graph)
    with pytest.raises(TypeError, match=r"is a stock PyG layer"):
        layer(part.x, edge_index=dist_graph)
    torch.manual_seed(0)
    expected = make()(part.x, part.edge_index)
    torch.manual_seed(0)
    fresh = torch.nn.ModuleList([make()])
    pyg_sar.sync_params(fresh)
    pyg_sar.sync_params(fresh)  # one hook per layer, however often
    assert len(fresh[0]._forward_pre_hooks) == 1
    torch.testing.assert_close(fresh[0](part.x, part.edge_index), expected)
    # A converted model's layers accept the graph, whether converted
    # before or after sync_params guarded them (layers adapted in place
    # keep the hook, which then lets the graph through).
    converted = pyg_sar.nn.to_distributed(make())
    pyg_sar.sync_params(converted)
    # (Its one pre-hook marks plain calls for norms: pyg_sar.nn.plain.)
    from pyg_sar.utils.layer_guard import refuse_unconverted
    assert refuse_unconverted not in converted._forward_pre_hooks.values()
    for stock in (make(), pyg_nn.ResGatedGraphConv(6, 4)):
        guarded = torch.nn.ModuleList([stock])
        pyg_sar.sync_params(guarded)
        pyg_sar.nn.to_distributed(guarded)[0](part.x, dist_graph)
    # The guard is not a user's hook: a guarded layer with an engine twin
    # still becomes the twin (a user's hook sends it to the adapter).
    guarded = torch.nn.ModuleList([make()])
    pyg_sar.sync_params(guarded)
    twin = pyg_sar.nn.to_distributed(guarded)[0]
    assert type(twin).__module__.startswith('pyg_sar.nn.conv'), type(twin)
    hooked = make()
    hooked.register_forward_pre_hook(lambda module, args: None)
    adapted = pyg_sar.nn.to_distributed(torch.nn.ModuleList([hooked]))[0]
    assert not type(adapted).__module__.startswith('pyg_sar.nn.conv')
    rgcn = torch.nn.ModuleList([pyg_nn.RGCNConv(6, 4, 2)])
    pyg_sar.sync_params(rgcn)
    assert type(pyg_sar.nn.to_distributed(rgcn)[0]).__module__.startswith(
        'pyg_sar.nn.conv')
