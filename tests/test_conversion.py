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
from pyg_sar.nn.convert import REFUSAL_REASONS
from _graphs import hard_graph
from test_zoo_exact import ZOO

# Stock layers whose exactness the suite checks: the SAR-engine twins in
# test_sar_exact.py, everything else in test_zoo_exact.py.
TWINS = {pyg_nn.GCNConv, pyg_nn.SAGEConv, pyg_nn.GraphConv, pyg_nn.GINConv,
         pyg_nn.GATConv, pyg_nn.GATv2Conv}
# Exactness tests: tests/test_rgcn_exact.py, tests/test_hetero_exact.py.
RELATIONAL = {pyg_nn.RGCNConv, pyg_nn.FastRGCNConv, pyg_nn.HGTConv,
              pyg_nn.HeteroConv}


def _bare(cls):
    """An instance without running the constructor (enough to convert)."""
    module = cls.__new__(cls)
    torch.nn.Module.__init__(module)
    return module


def test_every_pyg_conv_converts_exactly_or_is_refused_by_name():
    tested = TWINS | RELATIONAL | {type(make()) for make, _ in ZOO.values()}
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


@pytest.fixture(scope='module')
def graph(tmp_path_factory):
    data = hard_graph()
    root = str(tmp_path_factory.mktemp('parts'))
    pyg_sar.partition_graph(data, 1, root)
    part = pyg_sar.load_partition(root, 0)
    return data, part


@pytest.mark.parametrize('make', [
    lambda: pyg_nn.SAGEConv(6, 4),                     # engine twin
    lambda: pyg_nn.TransformerConv(6, 2, heads=2),     # adapted
    lambda: pyg_nn.GENConv(6, 4),                      # adapted + norm inside
])
def test_conversion_keeps_dtype_frozen_params_and_state(make, graph):
    data, part = graph
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


def test_second_backward_is_a_clear_error(graph):
    _, part = graph
    conv = to_distributed(pyg_nn.SAGEConv(6, 4))
    out = conv(part.x.requires_grad_(), pyg_sar.DistGraph(part))
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match='second backward'):
        out.sum().backward()


def test_size_other_than_the_local_graph_is_refused(graph):
    _, part = graph

    class Sized(DistMessagePassing):
        def forward(self, x, g):
            return self.propagate(g, size=(3, 3), x=x)

    with pytest.raises(ValueError, match='size=\\(3, 3\\)'):
        Sized()(part.x, pyg_sar.DistGraph(part))


def test_half_precision(graph):
    data, part = graph
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
    gat = to_distributed(pyg_nn.GATConv(6, 4)).to(torch.bfloat16)
    with pytest.raises(ValueError, match='half precision'):
        gat(part.x.bfloat16(), pyg_sar.DistGraph(part))


def test_attention_score_reading_index_is_refused(graph):
    """An engine attention layer cannot see whole neighborhoods in its
    edge_score: PyG's softmax there would normalize per chunk. Refused."""
    _, part = graph

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
