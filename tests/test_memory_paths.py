"""The memory-saving paths (issue #11): the fused ReLU + dropout, SAGE's
``transform_first`` and the allocator policy keep results equal."""
import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import SAGEConv as PygSAGEConv

import pyg_sar
from pyg_sar.nn.functional import relu_dropout
from pyg_sar.train import GNN

from _dist import run_workers
from _graphs import hard_graph


@pytest.mark.parametrize('p', [0.1, 0.5, 0.7])
def test_relu_dropout_equals_the_stock_pair_bitwise(p):
    x = torch.randn(300, 17, requires_grad=True)
    grad = torch.randn(300, 17)
    torch.manual_seed(5)
    expected = F.dropout(F.relu(x), p=p, training=True)
    expected.backward(grad)
    expected_grad, x.grad = x.grad.clone(), None
    after_stock = torch.rand(3)
    torch.manual_seed(5)
    actual = relu_dropout(x, p=p, training=True)
    actual.backward(grad)
    assert torch.equal(actual, expected)
    assert torch.equal(x.grad, expected_grad)
    assert torch.equal(torch.rand(3), after_stock)  # same draws consumed


def test_relu_dropout_without_grad_or_training():
    x = torch.randn(10, 4)
    assert torch.equal(relu_dropout(x, 0.5, training=False), F.relu(x))
    torch.manual_seed(1)
    a = relu_dropout(x, 0.5)
    torch.manual_seed(1)
    assert torch.equal(a, F.dropout(F.relu(x), 0.5))


def _sage_outputs(rank, world_size, root, transform_first):
    part = pyg_sar.load_partition(root, rank)
    graph = pyg_sar.DistGraph(part)
    torch.manual_seed(0)
    stock = PygSAGEConv(6, 3)
    stock.transform_first = transform_first
    conv = pyg_sar.nn.to_distributed(torch.nn.Sequential(stock))[0]
    assert conv.transform_first is transform_first
    x = part.x.clone().requires_grad_()
    out = conv(x, graph)
    (out * torch.arange(3.)).sum().backward()
    return (part.orig_ids, out.detach(), x.grad,
            {n: p.grad for n, p in conv.named_parameters()})


@pytest.mark.parametrize('world_size', [1, 3])
def test_sage_transform_first_matches_pyg(tmp_path, world_size):
    data = hard_graph()
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, world_size, root)
    torch.manual_seed(0)
    ref = PygSAGEConv(6, 3)
    x = data.x.clone().requires_grad_()
    expected = ref(x, data.edge_index)
    (expected * torch.arange(3.)).sum().backward()
    results = run_workers(_sage_outputs, world_size, root, True)
    grads = {}
    for ids, out, x_grad, param_grads in results:
        torch.testing.assert_close(out, expected[ids].detach(), rtol=1e-4,
                                   atol=1e-5)
        torch.testing.assert_close(x_grad, x.grad[ids], rtol=1e-4,
                                   atol=1e-5)
        for name, g in param_grads.items():
            grads[name] = g if name not in grads else grads[name] + g
    for name, p in ref.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-5)


def test_gnn_marks_sage_for_transform_first():
    net = pyg_sar.nn.to_distributed(GNN('sage', 8, 16, 3, num_layers=2))
    assert all(conv.transform_first for conv in net.convs)
    assert not pyg_sar.nn.SAGEConv(8, 4).transform_first
