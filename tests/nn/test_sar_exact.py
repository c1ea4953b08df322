"""The SAR engine equals single-process PyG: outputs, input gradients and
parameter gradients of every conv in every mode, for world sizes 1-4, on a
synthetic graph (isolated nodes, feature ties, a part without training
nodes) and on Cora; plus user subclasses, loss curves and BatchNorm.

One spawn per world size (and graph) runs every configuration, in a
module-scoped fixture; the parent compares, one test per conv.
"""
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.nn import MessagePassing

import pyg_sar
from pyg_sar import datasets
from pyg_sar.nn import DistMessagePassing
from _dist import halo_slices_with_chunks, run_workers, test_device, to_cpu
from _exact import FLOAT32_SCALED, Tol, close, mismatches, report

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow

WORLD_SIZES = [1, 2, 3, 4]
MODES = ('sar', 'sa', 'one_shot')
# Small enough to cut every block into several chunks.
CHUNKS = {'synthetic': 37, 'Cora': 1500}
CONVS = ('sage_mean', 'sage_max', 'sage_sum', 'sage_min_project', 'gcn',
         'graph', 'gin', 'gat', 'gatv2', 'user_linear', 'user_param',
         'gcn_weighted', 'graph_weighted', 'gat_edge_attr',
         'gatv2_edge_attr', 'user_attention')
# Layers that read per-edge tensors, and which ones.
EDGE_INPUTS = {'gcn_weighted': 'edge_weight', 'graph_weighted': 'edge_weight',
               'gat_edge_attr': 'edge_attr', 'gatv2_edge_attr': 'edge_attr'}
# The convs each graph runs: Cora has no per-edge tensors.
CONVS_ON = {'synthetic': CONVS,
            'Cora': tuple(k for k in CONVS if k not in EDGE_INPUTS)}
# Loss curves: 20 Adam steps of these models in these modes.
EPOCHS = 20
CURVE_MODELS = ('sage', 'gat')
CURVE_MODES = ('sar', 'one_shot')
CURVE = Tol(rtol=1e-4, atol=1e-4)


# User-written layers: one message, a PyG twin and a distributed twin ##########

def _user_linear_message(x_j: Tensor, edge_scale: float) -> Tensor:
    return edge_scale * x_j - 0.25 * x_j


class RefUserLinear(MessagePassing):
    def __init__(self, channels_in: int, channels_out: int) -> None:
        super().__init__(aggr='sum')
        self.lin = torch.nn.Linear(channels_in, channels_out)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=self.lin(x), edge_scale=1.5)

    def message(self, x_j: Tensor, edge_scale: float) -> Tensor:
        return _user_linear_message(x_j, edge_scale)


class UserLinear(DistMessagePassing):
    """Linear message, generic linear path (no message_weight)."""
    linear_message = True

    def __init__(self, channels_in: int, channels_out: int) -> None:
        super().__init__(aggr='sum')
        self.lin = torch.nn.Linear(channels_in, channels_out)

    def forward(self, x, graph):
        # Indirection on purpose: PyG's template would parse forward's
        # source for self.propagate(...) calls and reject our kwargs.
        return self._aggregate_neighbors(self.lin(x), graph)

    def _aggregate_neighbors(self, h, graph):
        return self.propagate(graph, x=h, edge_scale=1.5)

    def message(self, x_j: Tensor, edge_scale: float) -> Tensor:
        return _user_linear_message(x_j, edge_scale)


def _user_param_message(module, x_j: Tensor, x_i: Tensor) -> Tensor:
    return torch.tanh(x_j * module.gate + x_i) * module.scale


class RefUserParam(MessagePassing):
    def __init__(self, channels_in: int, channels_out: int) -> None:
        super().__init__(aggr='mean')
        self.lin = torch.nn.Linear(channels_in, channels_out)
        self.gate = torch.nn.Parameter(torch.randn(channels_out))
        self.scale = torch.nn.Parameter(torch.randn(channels_out))

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=self.lin(x))

    def message(self, x_j: Tensor, x_i: Tensor) -> Tensor:
        return _user_param_message(self, x_j, x_i)


class UserParam(DistMessagePassing):
    """Parametrized message: its parameters get gradients only through the
    rematerialized backward."""
    message_parameters = ('gate', 'scale')

    def __init__(self, channels_in: int, channels_out: int) -> None:
        super().__init__(aggr='mean')
        self.lin = torch.nn.Linear(channels_in, channels_out)
        self.gate = torch.nn.Parameter(torch.randn(channels_out))
        self.scale = torch.nn.Parameter(torch.randn(channels_out))

    def forward(self, x, graph):
        h = self.lin(x)
        run = self.propagate
        return run(graph, x=h)

    def message(self, x_j: Tensor, x_i: Tensor) -> Tensor:
        return _user_param_message(self, x_j, x_i)


class RefUserAttention(MessagePassing):
    """Softmax over in-edges with a parametrized score and a non-identity
    value: the engine's generic attention path."""

    def __init__(self, channels_in: int, channels_out: int) -> None:
        super().__init__(aggr='sum', node_dim=0)
        self.lin = torch.nn.Linear(channels_in, channels_out)
        self.temperature = torch.nn.Parameter(torch.tensor([0.7]))

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=self.lin(x)).squeeze(1)

    def message(self, x_j, x_i, index, ptr, size_i):
        from torch_geometric.utils import softmax
        score = (x_j * x_i).sum(-1, keepdim=True) * self.temperature
        alpha = softmax(score, index, ptr, size_i)
        return alpha.unsqueeze(-1) * torch.tanh(x_j).unsqueeze(1)


class UserAttention(DistMessagePassing):
    attention = True
    message_parameters = ('temperature', )

    def __init__(self, channels_in: int, channels_out: int) -> None:
        super().__init__(aggr='sum')
        self.lin = torch.nn.Linear(channels_in, channels_out)
        self.temperature = torch.nn.Parameter(torch.tensor([0.7]))

    def forward(self, x, graph):
        return self.propagate(graph, x=self.lin(x)).squeeze(1)

    def edge_score(self, x_j, x_i):
        return (x_j * x_i).sum(-1, keepdim=True) * self.temperature

    def message(self, x_j):
        return torch.tanh(x_j).unsqueeze(1)


def build_conv(kind: str, channels: int, distributed: bool):
    """The same initial weights in every process (seeded construction)."""
    torch.manual_seed(1234)
    if kind == 'user_linear':
        return (UserLinear if distributed else RefUserLinear)(channels, 6)
    if kind == 'user_param':
        return (UserParam if distributed else RefUserParam)(channels, 6)
    if kind == 'user_attention':
        return (UserAttention if distributed else RefUserAttention)(
            channels, 6)
    conv = {
        'sage_mean': lambda: pyg_nn.SAGEConv(channels, 6),
        'sage_max': lambda: pyg_nn.SAGEConv(channels, 6, aggr='max'),
        'sage_sum': lambda: pyg_nn.SAGEConv(channels, 6, aggr='sum'),
        'sage_min_project': lambda: pyg_nn.SAGEConv(
            channels, 6, aggr='min', project=True, normalize=True),
        'gcn': lambda: pyg_nn.GCNConv(channels, 6),
        'graph': lambda: pyg_nn.GraphConv(channels, 6, aggr='max'),
        'gin': lambda: pyg_nn.GINConv(torch.nn.Sequential(
            torch.nn.Linear(channels, 6), torch.nn.ReLU(),
            torch.nn.Linear(6, 6)), train_eps=True),
        'gat': lambda: pyg_nn.GATConv(channels, 3, heads=2),
        'gatv2': lambda: pyg_nn.GATv2Conv(channels, 6, heads=2,
                                          concat=False),
        'gcn_weighted': lambda: pyg_nn.GCNConv(channels, 6),
        'graph_weighted': lambda: pyg_nn.GraphConv(channels, 6),
        'gat_edge_attr': lambda: pyg_nn.GATConv(channels, 3, heads=2,
                                                edge_dim=3, residual=True),
        'gatv2_edge_attr': lambda: pyg_nn.GATv2Conv(
            channels, 3, heads=2, edge_dim=3, fill_value=0.5),
    }[kind]()
    return pyg_sar.nn.to_distributed(conv) if distributed else conv


def probe(num_nodes: int, channels: int) -> Tensor:
    """Fixed random weights of the scalar loss, indexed by input node id."""
    gen = torch.Generator().manual_seed(99)
    return torch.randn(num_nodes, channels, generator=gen)


# Data #########################################################################

def synthetic_data():
    """Synthetic graph with isolated nodes and exact feature ties (so max/min
    ties are certain)."""
    data = datasets.synthetic_graph(240, 6, 8, 3, seed=3)
    isolated = torch.arange(8)
    keep = ~(torch.isin(data.edge_index[0], isolated) |
             torch.isin(data.edge_index[1], isolated))
    data.edge_index = data.edge_index[:, keep]
    data.x = (data.x * 2).round() / 2
    gen = torch.Generator().manual_seed(4)
    data.edge_weight = torch.rand(data.num_edges, generator=gen) + 0.1
    data.edge_attr = torch.randn(data.num_edges, 3, generator=gen)
    return data


def run_conv(kind, conv, x, graph, source):
    """Calls a conv, handing it the per-edge input it reads from
    ``source`` (the Data or the Partition)."""
    name = EDGE_INPUTS.get(kind)
    if name is None:
        return conv(x, graph)
    return conv(x, graph, **{name: getattr(source, name)})


def partition(data, world_size: int, out_dir: str) -> str:
    pyg_sar.partition_graph(data, world_size, out_dir)
    return out_dir


# Worker #######################################################################

class _OnDevice:
    """The partition's attributes, on the test device."""

    def __init__(self, part, device) -> None:
        self.part, self.device = part, device

    def __getattr__(self, name):
        return getattr(self.part, name).to(self.device)


def _worker(rank, world_size, roots, curve_epochs):
    results = {}
    for name, root in roots.items():
        part = pyg_sar.load_partition(root, rank)
        device = test_device()
        x = part.x.float().to(device)
        weights = probe(int(part.num_nodes), 6)[part.orig_ids].to(device)
        on_device = _OnDevice(part, device)
        for mode in MODES:
            for chunk in (None, CHUNKS[name]):
                halo_slices_with_chunks(chunk)
                graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk,
                                          device=device)
                for kind in kinds_for(part):
                    conv = build_conv(kind, x.shape[1],
                                      distributed=True).to(device)
                    x_in = x.clone().requires_grad_()
                    out = run_conv(kind, conv, x_in, graph, on_device)
                    (out * weights).sum().backward()
                    results[(name, mode, chunk, kind)] = to_cpu((
                        out.detach(), x_in.grad,
                        {n: p.grad for n, p in conv.named_parameters()}))
        results[(name, 'ids')] = part.orig_ids
    halo_slices_with_chunks(None)
    if 'synthetic' in roots:
        part = pyg_sar.load_partition(roots['synthetic'], rank)
        results['curves'] = _loss_curves(part, rank, world_size,
                                         curve_epochs)
        results['batch_norm'] = _batch_norm(part)
    return results


def _train_mask(part, rank: int, world_size: int) -> Tensor:
    # The last part gets no training nodes at all.
    mask = part.train_mask.clone()
    if rank == world_size - 1 and world_size > 1:
        mask[:] = False
    return mask


def _loss_curves(part, rank, world_size, epochs):
    from pyg_sar.train import GNN, distributed_loss
    curves = {}
    for model in CURVE_MODELS:
        for mode in CURVE_MODES:
            halo_slices_with_chunks(mode == 'sar')
            graph = pyg_sar.DistGraph(part, mode=mode)
            torch.manual_seed(7)
            net = pyg_sar.nn.to_distributed(
                GNN(model, part.x.shape[1], 8, 3, num_layers=2, heads=2,
                    dropout=0.0))
            pyg_sar.sync_params(net)
            opt = torch.optim.Adam(net.parameters(), lr=0.01)
            mask = _train_mask(part, rank, world_size)
            total = pyg_sar.global_count(mask)
            losses = []
            for _ in range(epochs):
                opt.zero_grad()
                loss = distributed_loss(net(part.x, graph), part.y, mask,
                                        total)
                loss.backward()
                pyg_sar.all_reduce_grads(net)
                opt.step()
                losses.append(float(pyg_sar.comm.all_reduce(
                    loss.detach().clone())))
            curves[(model, mode)] = losses
    halo_slices_with_chunks(None)
    return curves


def _batch_norm(part):
    torch.manual_seed(5)
    norm = pyg_sar.nn.to_distributed(pyg_nn.BatchNorm(part.x.shape[1]))
    with torch.no_grad():
        norm.module.weight.uniform_(0.5, 1.5)
        norm.module.bias.uniform_(-0.5, 0.5)
    x = part.x.clone().requires_grad_()
    out = norm(x)
    (out * probe(int(part.num_nodes), part.x.shape[1])[part.orig_ids]
     ).sum().backward()
    return (out.detach(), x.grad, norm.module.weight.grad,
            norm.module.bias.grad, norm.module.running_mean.clone(),
            norm.module.running_var.clone())


# Single-process references #####################################################

def kinds_for(data):
    return [k for k in CONVS if k not in EDGE_INPUTS
            or getattr(data, EDGE_INPUTS[k], None) is not None]


def reference(data, kind: str):
    conv = build_conv(kind, data.x.shape[1], distributed=False)
    x = data.x.float().clone().requires_grad_()
    out = run_conv(kind, conv, x, data.edge_index, data)
    (out * probe(data.num_nodes, 6)).sum().backward()
    return out.detach(), x.grad, {n: p.grad for n, p in
                                  conv.named_parameters()}


def reference_curve(data, model: str, train_mask: Tensor, epochs: int):
    from pyg_sar.train import GNN
    torch.manual_seed(7)
    net = GNN(model, data.x.shape[1], 8, 3, num_layers=2, heads=2,
              dropout=0.0)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    losses = []
    for _ in range(epochs):
        opt.zero_grad()
        out = net(data.x, data.edge_index)
        loss = F.cross_entropy(out[train_mask], data.y[train_mask])
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


@pytest.fixture(scope='module')
def cora(shared_data_root):
    return datasets.load('Cora', shared_data_root)


def _spawn(name, data, world_size, tmp_path_factory):
    """One spawn of ``world_size`` workers runs every conv, mode and chunk
    size (and, on the synthetic graph, the loss curves and BatchNorm)."""
    assert kinds_for(data) == list(CONVS_ON[name]), name
    root = partition(data, world_size, str(tmp_path_factory.mktemp(name)))
    results = run_workers(_worker, world_size, {name: root}, EPOCHS,
                          timeout_s=120)
    return SimpleNamespace(name=name, data=data, root=root,
                           world_size=world_size, results=results,
                           ids=[r[(name, 'ids')] for r in results])


@pytest.fixture(scope='module', params=WORLD_SIZES)
def synthetic_run(request, tmp_path_factory):
    return _spawn('synthetic', synthetic_data(), request.param,
                  tmp_path_factory)


@pytest.fixture(scope='module', params=WORLD_SIZES)
def cora_run(request, tmp_path_factory):
    data = request.getfixturevalue('cora')  # skips without real data
    return _spawn('Cora', data, request.param, tmp_path_factory)


def _check_conv(run, kind):
    ref = reference(run.data, kind)
    failures = []
    for mode in MODES:
        for chunk in (None, CHUNKS[run.name]):
            key = (run.name, mode, chunk, kind)
            failures += mismatches(
                f'{run.name} {kind} mode={mode} chunk={chunk} '
                f'world={run.world_size}', run.ids,
                [r[key] for r in run.results], ref, FLOAT32_SCALED)
    report(failures)


@pytest.mark.parametrize('kind', CONVS_ON['synthetic'])
def test_conv_equals_single_process_on_synthetic(synthetic_run, kind):
    _check_conv(synthetic_run, kind)


@pytest.mark.parametrize('kind', CONVS_ON['Cora'])
def test_conv_equals_single_process_on_cora(cora_run, kind):
    _check_conv(cora_run, kind)


@pytest.mark.parametrize('model', CURVE_MODELS)
def test_loss_curve_equals_single_process(synthetic_run, model):
    # The last part has no training nodes.
    run = synthetic_run
    train_mask = run.data.train_mask.clone()
    if run.world_size > 1:
        last = pyg_sar.load_partition(run.root, run.world_size - 1)
        train_mask[last.orig_ids] = False
    expected = torch.tensor(reference_curve(run.data, model, train_mask,
                                            EPOCHS))
    failures = []
    for mode in CURVE_MODES:
        for rank, r in enumerate(run.results):
            failures += close(torch.tensor(r['curves'][(model, mode)]),
                              expected, CURVE,
                              f'{model} mode={mode} world={run.world_size} '
                              f'loss curve on rank {rank}')
    report(failures)


def test_batch_norm_equals_single_process(synthetic_run):
    # BatchNorm normalizes with whole-graph statistics.
    run, data = synthetic_run, synthetic_run.data
    torch.manual_seed(5)
    norm = pyg_nn.BatchNorm(data.x.shape[1])
    with torch.no_grad():
        norm.module.weight.uniform_(0.5, 1.5)
        norm.module.bias.uniform_(-0.5, 0.5)
    x = data.x.clone().requires_grad_()
    out = norm(x)
    (out * probe(data.num_nodes, data.x.shape[1])).sum().backward()
    got = [r['batch_norm'] for r in run.results]
    what = f'BatchNorm world={run.world_size}'
    failures = mismatches(
        what, run.ids, [(g[0], g[1], {'weight': g[2], 'bias': g[3]})
                        for g in got],
        (out.detach(), x.grad, {'weight': norm.module.weight.grad,
                                'bias': norm.module.bias.grad}),
        FLOAT32_SCALED)
    for rank, g in enumerate(got):
        failures += close(g[4], norm.module.running_mean, FLOAT32_SCALED,
                          f'{what} running mean on rank {rank}')
        failures += close(g[5], norm.module.running_var, FLOAT32_SCALED,
                          f'{what} running var on rank {rank}')
    report(failures)


def test_to_distributed_round_trips_weights():
    from pyg_sar.train import GNN
    for model in ('sage', 'gcn', 'gat'):
        torch.manual_seed(0)
        stock = GNN(model, 10, 8, 3, num_layers=3, heads=2)
        state = {k: v.clone() for k, v in stock.state_dict().items()}
        import copy
        converted = pyg_sar.nn.to_distributed(copy.deepcopy(stock))
        kinds = {type(c).__module__.split('.')[0] for c in converted.convs}
        assert kinds == {'pyg_sar'}
        assert converted.state_dict().keys() == state.keys()
        for key, value in converted.state_dict().items():
            assert torch.equal(value, state[key]), key
        fresh = GNN(model, 10, 8, 3, num_layers=3, heads=2)
        fresh.load_state_dict(converted.state_dict())
        for key, value in fresh.state_dict().items():
            assert torch.equal(value, state[key]), key
    gin = pyg_nn.GINConv(torch.nn.Sequential(torch.nn.Linear(4, 4),
                                             torch.nn.BatchNorm1d(4)))
    before = {k: v.clone() for k, v in gin.state_dict().items()}
    after = pyg_sar.nn.to_distributed(gin).state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
