"""One model for both worlds (:mod:`pyg_sar.nn.plain`): a layer converted by
``to_distributed`` and called on a plain graph (an ``edge_index``, a
``SparseTensor``, a ``torch.sparse`` adjacency: a sampled batch) gives the
stock PyG layer's result bit for bit (outputs, input and every parameter
gradient, dropout draws included), into the converted layer's own
parameters; its ``state_dict``, caches, hooks and lazy sizes stay right.
One process: a plain graph needs no peers."""
import copy
import pickle

import pytest
import torch
import torch_geometric.nn as pyg_nn
import torch_geometric.nn.models as pyg_models
from torch_geometric.typing import WITH_TORCH_SPARSE, SparseTensor
from torch_geometric.utils import to_torch_csc_tensor

import pyg_sar
from pyg_sar.nn import DistMessagePassing, to_distributed
from pyg_sar.nn.convert import _TWINS
from _graphs import hard_graph
from tests.nn.test_zoo_exact import ZOO, C, call, mlp
from tests.nn.test_zoo_refused_exact import ZOO as ONCE_REFUSED

# The engine twins in their configurations (dropout on: the draws must be
# the stock layer's), each with its call style (tests/nn/test_zoo_exact.py).
TWINS = {
    'SAGEConv': (lambda: pyg_nn.SAGEConv(C, 5), 'x'),
    'SAGEConv_max_project': (lambda: pyg_nn.SAGEConv(
        C, 5, aggr='max', project=True, normalize=True), 'x'),
    'SAGEConv_lazy': (lambda: pyg_nn.SAGEConv(-1, 5, aggr='sum'), 'x'),
    'GCNConv': (lambda: pyg_nn.GCNConv(C, 5), 'w'),
    'GCNConv_cached': (lambda: pyg_nn.GCNConv(C, 5, cached=True), 'x'),
    'GCNConv_lazy_improved': (lambda: pyg_nn.GCNConv(-1, 5, improved=True),
                              'x'),
    'GraphConv': (lambda: pyg_nn.GraphConv(C, 5, aggr='max'), 'w'),
    'GINConv': (lambda: pyg_nn.GINConv(mlp(C, 5), train_eps=True), 'x'),
    'GATConv': (lambda: pyg_nn.GATConv(C, 3, heads=2, dropout=0.4,
                                       edge_dim=3, residual=True), 'a'),
    'GATConv_lazy': (lambda: pyg_nn.GATConv(-1, 4, heads=2, concat=False),
                     'x'),
    'GATv2Conv': (lambda: pyg_nn.GATv2Conv(C, 3, heads=2, dropout=0.3,
                                           fill_value=0.5, edge_dim=3), 'a'),
}
CASES = {**TWINS, **ZOO, **{f'once:{k}': v for k, v in ONCE_REFUSED.items()
                            if v[1] in ('x', 'w', 'a')}}


def _grads(module):
    return {n: p.grad for n, p in module.named_parameters()}


def _run(module, style, data, seed=5, adj=None):
    x = data.x.clone().requires_grad_()
    torch.manual_seed(seed)
    out = call(module, style, x, data.edge_index if adj is None else adj,
               data)
    out = out[0] if isinstance(out, tuple) else out
    weights = torch.randn(out.shape, generator=torch.Generator()
                          .manual_seed(3))
    (out * weights).sum().backward()
    return out.detach(), x.grad


def _same_grads(stock, twin):
    ours, theirs = _grads(twin), _grads(stock)
    assert ours.keys() == theirs.keys()
    for name, grad in theirs.items():
        if grad is None:
            assert ours[name] is None, name
        else:
            assert torch.equal(ours[name], grad), name


@pytest.mark.parametrize('name', list(CASES))
def test_converted_layer_on_edge_index_is_the_stock_layer(name):
    make, style = CASES[name]
    data = hard_graph()
    torch.manual_seed(1234)
    stock = make()
    twin = to_distributed(copy.deepcopy(stock))
    keys = list(twin.state_dict())
    for _ in range(2):  # twice: caches and lazy sizes hold
        for module in (stock, twin):
            for p in module.parameters():
                p.grad = None
        ref = _run(stock, style, data)
        got = _run(twin, style, data)
        assert torch.equal(got[0], ref[0])
        assert (got[1] is None) == (ref[1] is None)
        if ref[1] is not None:
            assert torch.equal(got[1], ref[1])
        _same_grads(stock, twin)
    assert list(twin.state_dict()) == keys  # no view among the keys
    assert list(twin.state_dict()) == list(stock.state_dict())


@pytest.mark.parametrize('name', ['SAGEConv', 'GCNConv', 'GraphConv',
                                  'GINConv', 'GATConv_lazy'])
def test_sparse_adjacencies(name):
    make, style = TWINS[name]
    data = hard_graph()
    adjs = [to_torch_csc_tensor(data.edge_index,
                                size=(data.num_nodes, data.num_nodes)).t()]
    if WITH_TORCH_SPARSE:
        adjs.append(SparseTensor.from_edge_index(
            data.edge_index,
            sparse_sizes=(data.num_nodes, data.num_nodes)).t())
    for adj in adjs:
        torch.manual_seed(1234)
        stock = make()
        twin = to_distributed(copy.deepcopy(stock))
        ref, got = _run(stock, 'x', data, adj=adj), _run(twin, 'x', data,
                                                         adj=adj)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
        _same_grads(stock, twin)


def test_one_model_trains_on_batches_and_runs_on_the_dist_graph(hard_part):
    """The same Parameter objects in both worlds; the GCN cache of the
    DistGraph is not the cache of a batch."""
    data, part = hard_part
    torch.manual_seed(0)
    stock = pyg_nn.GCNConv(C, 4, cached=True)
    twin = to_distributed(copy.deepcopy(stock))
    params = list(twin.parameters())
    graph = pyg_sar.DistGraph(part)
    full = twin(part.x, graph)
    batch = data.edge_index[:, :40]
    torch.testing.assert_close(twin(data.x, batch), stock(data.x, batch))
    # The DistGraph's cache is not the batch's, nor the other way round.
    assert torch.equal(twin(part.x, graph), full)
    other = data.edge_index[:, 40:]
    assert torch.equal(twin(data.x, other), stock(data.x, other))
    twin(data.x, batch).sum().backward()
    assert all(p.grad is not None for p in params)
    assert list(twin.parameters()) == params
    # Copies keep the cache as stock copies do (sharing the copy's
    # parameters); reset_parameters drops it.
    again = pickle.loads(pickle.dumps(twin))
    stock_again = copy.deepcopy(stock)
    assert torch.equal(again(data.x, other), stock_again(data.x, other))
    assert again.lin.weight is not twin.lin.weight
    with torch.no_grad():
        again.lin.weight.mul_(2)
        stock_again.lin.weight.mul_(2)
    assert torch.equal(again(data.x, other), stock_again(data.x, other))
    twin.reset_parameters()
    assert not torch.equal(twin(data.x, batch), stock(data.x, batch))


def test_training_mode_hooks_and_guard_follow_the_twin():
    data = hard_graph()
    torch.manual_seed(0)
    stock = pyg_nn.GATConv(C, 4, dropout=0.5)
    twin = to_distributed(copy.deepcopy(stock))
    pyg_sar.sync_params(twin)  # installs the layer guard: plain calls pass
    seen = []
    twin.register_forward_hook(lambda m, i, o: seen.append('forward'))
    twin.register_message_forward_hook(lambda m, i, o: seen.append('msg'))
    stock.eval(), twin.eval()
    assert torch.equal(twin(data.x, data.edge_index),
                       stock(data.x, data.edge_index))
    assert seen == ['msg', 'forward']
    twin.train(), stock.train()
    torch.manual_seed(1)
    a = stock(data.x, data.edge_index)
    torch.manual_seed(1)
    assert torch.equal(twin(data.x, data.edge_index), a)


class UserMean(DistMessagePassing):
    """A layer of the user's own, no stock class: PyG's propagate on a
    plain graph."""

    def __init__(self):
        super().__init__(aggr='mean')
        self.lin = torch.nn.Linear(C, 4)

    def forward(self, x, edge_index, edge_weight):
        return self.propagate(edge_index, x=self.lin(x), w=edge_weight)

    def message(self, x_j, w):
        return w.view(-1, 1) * x_j


class RefMean(pyg_nn.MessagePassing):
    def __init__(self):
        super().__init__(aggr='mean')
        self.lin = torch.nn.Linear(C, 4)

    def forward(self, x, edge_index, edge_weight):
        return self.propagate(edge_index, x=self.lin(x), w=edge_weight)

    def message(self, x_j, w):
        return w.view(-1, 1) * x_j


def test_user_layer_runs_pyg_propagate_on_a_plain_graph(hard_part):
    data, part = hard_part
    torch.manual_seed(0)
    ref = RefMean()
    torch.manual_seed(0)
    ours = UserMean()
    args = (data.x, data.edge_index, data.edge_weight)
    assert torch.equal(ours(*args), ref(*args))
    out = ours(part.x, pyg_sar.DistGraph(part), part.edge_weight)
    torch.testing.assert_close(out, ref(*args)[part.orig_ids])


def test_subclass_of_a_twin_is_refused_on_a_plain_graph():
    class Mine(pyg_sar.nn.SAGEConv):
        def message(self, x_j):
            return 2 * x_j

    data = hard_graph()
    with pytest.raises(TypeError, match='Mine subclasses .*SAGEConv.*'
                       'DistGraph only'):
        Mine(C, 4)(data.x, data.edge_index)


def _compare_models(stock, twin, run):
    outs = []
    for model in (stock, twin):
        torch.manual_seed(5)
        out = run(model)
        out = torch.cat([o for o in out.values() if o is not None]) if \
            isinstance(out, dict) else out
        (out * torch.randn(out.shape, generator=torch.Generator()
                           .manual_seed(3))).sum().backward()
        outs.append(out.detach())
    assert torch.equal(outs[0], outs[1])
    _same_grads(stock, twin)


@pytest.mark.parametrize('norm', ['batch', 'layer', 'graph', 'pair',
                                  'instance'])
def test_model_with_graph_wide_norms_on_a_batch(norm):
    """Normalizations see no graph: on a batch they take the batch's
    statistics (and running statistics), as the stock modules do."""
    data = hard_graph()
    torch.manual_seed(0)
    kwargs = {'norm_kwargs': {'mode': 'graph'}} if norm == 'layer' else {}
    stock = pyg_models.GraphSAGE(C, 8, 2, 4, norm=norm, dropout=0.2,
                                       **kwargs)
    twin = to_distributed(copy.deepcopy(stock))
    _compare_models(stock, twin, lambda m: m(data.x, data.edge_index))
    for key, value in stock.state_dict().items():
        assert torch.equal(twin.state_dict()[key], value), key


def test_relational_layers_on_edge_type():
    data = hard_graph()
    edge_type = torch.arange(data.num_edges) % 3
    for cls in (pyg_nn.RGCNConv, pyg_nn.FastRGCNConv):
        torch.manual_seed(0)
        stock = cls(C, 4, 3, num_bases=2)
        twin = to_distributed(copy.deepcopy(stock))
        _compare_models(stock, twin,
                        lambda m: m(data.x, data.edge_index, edge_type))


def test_hetero_layers_on_edge_index_dict():
    from _hetero import hard_hetero
    data = hard_hetero()
    makes = [lambda: pyg_nn.HGTConv(-1, 8, data.metadata(), heads=2),
             lambda: pyg_nn.HANConv(-1, 8, data.metadata(), heads=2,
                                    dropout=0.3),
             lambda: pyg_nn.HeteroConv({
                 et: pyg_nn.SAGEConv((-1, -1), 8)
                 for et in data.edge_types}, aggr='sum')]
    for make in makes:
        torch.manual_seed(0)
        stock = make()
        twin = to_distributed(copy.deepcopy(stock))
        _compare_models(stock, twin, lambda m: m(data.x_dict,
                                                 data.edge_index_dict))


def test_every_twin_has_its_stock_class():
    from pyg_sar.nn.plain import stock_class
    for stock, (twin, _) in _TWINS.items():
        assert stock_class(twin) is stock
    assert stock_class(pyg_sar.nn.HANConv) is pyg_nn.HANConv
