"""Every PyG layer that ``to_distributed`` converts, and every point of the
``MessagePassing`` contract, equals single-process PyG: outputs, input
gradients and every parameter gradient, at world sizes 1-4, in every mode,
with and without chunking, on a graph with self loops, duplicate edges,
isolated nodes and a hub whose in-edges span all parts.

One spawn per world size runs every case, in a module-scoped fixture; the
parent compares, one test per case.
"""
import copy
from types import SimpleNamespace

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch.nn import Linear, ReLU, Sequential
from torch_geometric.nn import MessagePassing, aggr
from torch_geometric.utils import degree, scatter, softmax

import pyg_sar
from pyg_sar.nn import DistMessagePassing
from _dist import run_workers
from _exact import (BY_DTYPE, FLOAT32, close, mismatches, report,
                    train_curve)
from _graphs import hard_graph

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow

MODES = ('sar', 'sa', 'one_shot')
CHUNK = 19  # cuts the local edges into many whole-neighborhood chunks
C = 6       # input channels


def mlp(i: int, o: int):
    return Sequential(Linear(i, 8), ReLU(), Linear(8, o))


# User layers written the way PyG's docs teach ################################

class FlowReverse(MessagePassing):
    def __init__(self):
        super().__init__(aggr='sum', flow='target_to_source')
        self.lin = Linear(C, 4)

    def forward(self, x, edge_index, edge_attr):
        return self.propagate(edge_index, x=self.lin(x),
                              norm=edge_attr[:, 0])

    def message(self, x_j, x_i, norm):
        return torch.tanh(x_j - x_i) * norm.view(-1, 1)


class SoftmaxMessage(MessagePassing):
    """Attention written with PyG's softmax(alpha, index, ptr, size_i)."""
    def __init__(self):
        super().__init__(aggr='add')
        self.lin = Linear(C, 4)
        self.att = torch.nn.Parameter(torch.randn(4))

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=self.lin(x))

    def message(self, x_j, x_i, index, ptr, size_i):
        alpha = softmax(((x_i + x_j) * self.att).sum(-1), index, ptr, size_i)
        return alpha.view(-1, 1) * x_j


class Aggregating(MessagePassing):
    """Any aggregation string or module."""
    def __init__(self, aggregation):
        super().__init__(aggr=aggregation)
        self.lin = Linear(C, 4)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=torch.tanh(self.lin(x)))


class OwnAggregate(MessagePassing):
    def __init__(self):
        super().__init__()
        self.lin = Linear(C, 4)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=self.lin(x))

    def aggregate(self, inputs, index, dim_size):
        return 2 * scatter(inputs, index, 0, dim_size, 'max') - scatter(
            inputs, index, 0, dim_size, 'mean')


class UpdateArgs(MessagePassing):
    """Tutorial style: per-edge ``norm``, ``update`` reading ``x``."""
    def __init__(self):
        super().__init__(aggr='add')
        self.lin = Linear(C, 4)

    def forward(self, x, edge_index, edge_weight):
        h = self.lin(x)
        return self.propagate(edge_index, x=h, norm=edge_weight.rsqrt(),
                              root=h)

    def message(self, x_j, norm):
        return norm.view(-1, 1) * x_j

    def update(self, inputs, root):
        return inputs + 0.5 * root


class EdgeUpdater(MessagePassing):
    def __init__(self):
        super().__init__(aggr='add', node_dim=0)
        self.lin = Linear(C, 6)

    def forward(self, x, edge_index):
        h = self.lin(x).view(-1, 2, 3)
        alpha = self.edge_updater(edge_index, h=h)
        return self.propagate(edge_index, h=h, alpha=alpha).flatten(1)

    def edge_update(self, h_j, h_i, index, ptr, dim_size):
        return softmax((h_j * h_i).sum(-1), index, ptr, dim_size)

    def message(self, h_j, alpha):
        return alpha.unsqueeze(-1) * h_j


class Hooked(MessagePassing):
    def __init__(self):
        super().__init__(aggr='mean', decomposed_layers=2)
        self.lin = Linear(C, 4)
        self.register_message_forward_hook(lambda m, i, out: out * 1.5)
        self.register_propagate_forward_hook(lambda m, i, out: out - 1.0)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=self.lin(x))

    def message(self, x_j, x_i):
        return torch.sigmoid(x_j) * x_i


class Fused(MessagePassing):
    """Defines message_and_aggregate: PyG calls it only for sparse
    adjacencies; with an edge_index (and a DistGraph) message + aggregate
    run, so the numbers are the edge_index numbers."""
    def __init__(self):
        super().__init__(aggr='mean')
        self.lin = Linear(C, 4)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=self.lin(x))

    def message_and_aggregate(self, adj_t, x):
        return adj_t @ x


def distributed(ref_cls):
    """The distributed twin of a user layer: DistMessagePassing in front."""
    return type(f'Dist{ref_cls.__name__}', (DistMessagePassing, ref_cls), {})


USER = {
    'flow_t2s': (FlowReverse, 'a'),
    'softmax_message': (SoftmaxMessage, 'x'),
    'own_aggregate': (OwnAggregate, 'x'),
    'update_args': (UpdateArgs, 'w'),
    'edge_updater': (EdgeUpdater, 'x'),
    'hooks_decomposed': (Hooked, 'x'),
    'message_and_aggregate': (Fused, 'x'),
}
AGGRS = {
    'mul': lambda: 'mul', 'std': lambda: 'std', 'var': lambda: 'var',
    'softmax_learn': lambda: aggr.SoftmaxAggregation(learn=True),
    'powermean_learn': lambda: aggr.PowerMeanAggregation(learn=True),
    'multi': lambda: aggr.MultiAggregation(['mean', 'max', 'std']),
}


def _pna():
    deg = torch.bincount(degree(hard_graph().edge_index[1],
                                dtype=torch.long))
    return pyg_nn.PNAConv(C, 6, ['mean', 'min', 'max', 'std'],
                          ['identity', 'amplification', 'attenuation'], deg,
                          edge_dim=3)


# Stock layers: (constructor, call style). Call styles: 'x' conv(x, g),
# 'w' with edge_weight, 'a' with edge_attr, 'p' with edge_attr as third
# argument (pseudo-coordinates), 'x0' conv(x, x, g), 'pos' conv(x, pos, g),
# 'ppf' conv(x, pos, normal, g).
ZOO = {
    'GINEConv': (lambda: pyg_nn.GINEConv(mlp(C, 6), edge_dim=3), 'a'),
    'TransformerConv': (lambda: pyg_nn.TransformerConv(
        C, 3, heads=2, edge_dim=3, beta=True), 'a'),
    'EdgeConv': (lambda: pyg_nn.EdgeConv(mlp(2 * C, 5), aggr='max'), 'x'),
    'ResGatedGraphConv': (lambda: pyg_nn.ResGatedGraphConv(C, 5), 'x'),
    'GENConv_softmax': (lambda: pyg_nn.GENConv(
        C, 6, aggr='softmax', learn_t=True, num_layers=2), 'x'),
    'GENConv_powermean': (lambda: pyg_nn.GENConv(
        C, 6, aggr='powermean', learn_p=True, edge_dim=3), 'a'),
    'PNAConv': (_pna, 'a'),
    'LEConv': (lambda: pyg_nn.LEConv(C, 5), 'w'),
    'ClusterGCNConv': (lambda: pyg_nn.ClusterGCNConv(C, 5), 'x'),
    'GeneralConv': (lambda: pyg_nn.GeneralConv(
        C, 6, in_edge_channels=3, attention=True, heads=2), 'a'),
    'CGConv': (lambda: pyg_nn.CGConv(C, dim=3), 'a'),
    'NNConv': (lambda: pyg_nn.NNConv(C, 4, Linear(3, C * 4),
                                     aggr='mean'), 'a'),
    'SimpleConv': (lambda: pyg_nn.SimpleConv('max', 'self_loop'), 'x'),
    'SGConv': (lambda: pyg_nn.SGConv(C, 5, K=2), 'w'),
    'SSGConv': (lambda: pyg_nn.SSGConv(C, 5, alpha=0.1, K=2), 'x'),
    'APPNP': (lambda: pyg_nn.APPNP(K=3, alpha=0.2), 'w'),
    'TAGConv': (lambda: pyg_nn.TAGConv(C, 5, K=2), 'x'),
    'GCN2Conv': (lambda: pyg_nn.GCN2Conv(C, alpha=0.2, theta=0.5,
                                         layer=2), 'x0'),
    'LGConv': (lambda: pyg_nn.LGConv(), 'x'),
    'MixHopConv': (lambda: pyg_nn.MixHopConv(C, 3, powers=[0, 1, 2]), 'x'),
    'AGNNConv': (lambda: pyg_nn.AGNNConv(requires_grad=True), 'x'),
    'FeaStConv': (lambda: pyg_nn.FeaStConv(C, 5, heads=2), 'x'),
    'MFConv': (lambda: pyg_nn.MFConv(C, 5, max_degree=4), 'x'),
    'FiLMConv': (lambda: pyg_nn.FiLMConv(C, 5), 'x'),
    'GatedGraphConv': (lambda: pyg_nn.GatedGraphConv(C, 2), 'x'),
    'GMMConv': (lambda: pyg_nn.GMMConv(C, 5, dim=3, kernel_size=2), 'p'),
    'ARMAConv': (lambda: pyg_nn.ARMAConv(C, 5, num_stacks=2,
                                         num_layers=2), 'w'),
    'FAConv': (lambda: pyg_nn.FAConv(C, eps=0.2), 'x0'),
    'ChebConv_sym': (lambda: pyg_nn.ChebConv(C, 5, K=3), 'w'),
    'ChebConv_rw': (lambda: pyg_nn.ChebConv(C, 5, K=2,
                                            normalization='rw'), 'x'),
    'ChebConv_none': (lambda: pyg_nn.ChebConv(C, 5, K=2,
                                              normalization=None), 'w'),
    'PointNetConv': (lambda: pyg_nn.PointNetConv(mlp(C + 3, 6),
                                                 mlp(6, 5)), 'pos'),
    'PPFConv': (lambda: pyg_nn.PPFConv(mlp(C + 4, 6), mlp(6, 5)), 'ppf'),
    'PointTransformerConv': (lambda: pyg_nn.PointTransformerConv(C, 5),
                             'pos'),
    'PointGNNConv': (lambda: pyg_nn.PointGNNConv(
        mlp(C, 3), mlp(3 + C, C), mlp(C, C)), 'pos'),
    'WLConvContinuous': (lambda: pyg_nn.WLConvContinuous(), 'w'),
    'DirGNNConv': (lambda: pyg_nn.DirGNNConv(pyg_nn.SAGEConv(C, 5)), 'x'),
    'DirGNNConv_gcn_twin': (lambda: pyg_nn.DirGNNConv(
        pyg_nn.GCNConv(C, 5), alpha=0.3), 'x'),
    'DirGNNConv_gat_twin': (lambda: pyg_nn.DirGNNConv(
        pyg_nn.GATConv(C, 3, heads=2), root_weight=False), 'x'),
    'DirGNNConv_gen': (lambda: pyg_nn.DirGNNConv(
        pyg_nn.GENConv(C, 5, aggr='softmax')), 'x'),
}
CASES = ([f'user:{k}' for k in USER] + [f'aggr:{k}' for k in AGGRS] +
         [f'zoo:{k}' for k in ZOO])
FLOAT64 = ('zoo:TransformerConv', 'user:softmax_message')


def build(case: str, dist: bool):
    torch.manual_seed(1234)
    kind, name = case.split(':')
    if kind == 'user':
        cls, style = USER[name]
        return (distributed(cls) if dist else cls)(), style
    if kind == 'aggr':
        cls = distributed(Aggregating) if dist else Aggregating
        return cls(AGGRS[name]()), 'x'
    make, style = ZOO[name]
    module = make()
    if dist:
        module = pyg_sar.nn.to_distributed(copy.deepcopy(module))
    return module, style


def call(module, style, x, graph, source):
    if style == 'w':
        return module(x, graph, edge_weight=source.edge_weight)
    if style == 'a':
        return module(x, graph, edge_attr=source.edge_attr)
    if style == 'p':
        return module(x, graph, source.edge_attr)
    if style in ('pos', 'ppf'):
        # Positions (and normals) per node, from the features.
        pos, normal = x.detach()[:, :3] * 0.7 + 0.1, x.detach()[:, 3:6]
        if style == 'pos':
            return module(x, pos, graph)
        return module(x, pos, normal, graph)
    if style == 'x0':
        return module(x, x, graph)
    return module(x, graph)


def probe(num_nodes, shape):
    gen = torch.Generator().manual_seed(99)
    return torch.randn(num_nodes, *shape, generator=gen)


def evaluate(module, style, x, graph, source, ids, num_nodes, dtype):
    module = module.to(dtype)
    x = x.to(dtype).clone().requires_grad_()
    source = _cast(source, dtype)
    out = call(module, style, x, graph, source)
    (out * probe(num_nodes, out.shape[1:])[ids].to(dtype)).sum().backward()
    return (out.detach(), x.grad,
            {n: p.grad for n, p in module.named_parameters()})


def _cast(source, dtype):
    class View:
        edge_weight = source.edge_weight.to(dtype)
        edge_attr = source.edge_attr.to(dtype)
    return View


class CurveNet(torch.nn.Module):
    """An engine twin (TransformerConv), a layer on the whole-neighborhood
    path and a graph-mode norm."""
    def __init__(self):
        super().__init__()
        self.conv1 = pyg_nn.TransformerConv(C, 4, heads=2, edge_dim=3)
        self.norm = pyg_nn.LayerNorm(8)
        self.conv2 = pyg_nn.GENConv(8, 3, aggr='softmax', learn_t=True)

    def forward(self, x, edge_index, edge_attr):
        h = self.norm(self.conv1(x, edge_index, edge_attr)).relu()
        return self.conv2(h, edge_index)


def loss_curve(x, edge_index, edge_attr, y, mask, total, epochs=15,
               dist=False):
    return train_curve(CurveNet, (x, edge_index, edge_attr), y, mask, total,
                       epochs, dist)


def _train_mask(part, rank, world_size):
    mask = part.train_mask.clone()
    if rank == world_size - 1 and world_size > 1:
        mask[:] = False  # a part without training nodes
    return mask


def _worker(rank, world_size, root, cases):
    part = pyg_sar.load_partition(root, rank)
    n = int(part.num_nodes)
    results = {}
    mask = _train_mask(part, rank, world_size)
    graph = pyg_sar.DistGraph(part, mode='sar', chunk_size=CHUNK)
    results['curve'] = loss_curve(part.x, graph, part.edge_attr, part.y, mask,
                                  pyg_sar.global_count(mask), dist=True)
    for mode in MODES:
        for chunk in (None, CHUNK):
            graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk)
            for case in cases:
                for dtype in dtypes(case):
                    module, style = build(case, dist=True)
                    results[(mode, chunk, case, dtype)] = evaluate(
                        module, style, part.x, graph, part, part.orig_ids, n,
                        dtype)
    results['ids'] = part.orig_ids
    return results


def dtypes(case):
    return ((torch.float32, torch.float64) if case in FLOAT64
            else (torch.float32, ))


@pytest.fixture(scope='module', params=[1, 2, 3, 4])
def zoo_run(request, tmp_path_factory):
    world_size = request.param
    data = hard_graph()
    root = str(tmp_path_factory.mktemp('parts'))
    pyg_sar.partition_graph(data, world_size, root)
    results = run_workers(_worker, world_size, root, CASES, timeout_s=240)
    return SimpleNamespace(world_size=world_size, data=data, root=root,
                           results=results, ids=[r['ids'] for r in results])


def test_loss_curve_equals_single_process(zoo_run):
    run, data = zoo_run, zoo_run.data
    mask = data.train_mask.clone()
    if run.world_size > 1:
        last = pyg_sar.load_partition(run.root, run.world_size - 1)
        mask[last.orig_ids] = False
    expected = torch.tensor(loss_curve(data.x, data.edge_index,
                                       data.edge_attr, data.y, mask,
                                       int(mask.sum())))
    report([line for rank, r in enumerate(run.results)
            for line in close(torch.tensor(r['curve']), expected,
                              FLOAT32,
                              f'world={run.world_size} loss curve on rank '
                              f'{rank}')])


@pytest.mark.parametrize('case', CASES)
def test_layer_equals_single_process(zoo_run, case):
    run, data = zoo_run, zoo_run.data
    failures = []
    for dtype in dtypes(case):
        module, style = build(case, dist=False)
        ref = evaluate(module, style, data.x, data.edge_index, data,
                       torch.arange(data.num_nodes), data.num_nodes, dtype)
        for mode in MODES:
            for chunk in (None, CHUNK):
                failures += mismatches(
                    f'{case} {dtype} mode={mode} chunk={chunk} '
                    f'world={run.world_size}', run.ids,
                    [r[(mode, chunk, case, dtype)] for r in run.results],
                    ref, BY_DTYPE[dtype], none_grads='skip')
    report(failures)
