"""``pyg_sar.train.inference``: the converted model's forward over the
``DistGraph`` in eval mode without autograd, its mode restored, the rows'
dataset ids on request; equal to the stock model over the whole graph.
(Several ranks: tests/examples/test_sampling_full_infer_example.py.)"""
import copy

import pytest
import torch
import torch_geometric.nn as pyg_nn

import pyg_sar
from pyg_sar.train import inference


def test_inference_is_the_eval_forward_without_autograd(hard_part):
    data, part = hard_part
    torch.manual_seed(0)
    stock = pyg_nn.models.GraphSAGE(data.num_features, 8, 2, 3, dropout=0.5)
    model = pyg_sar.nn.to_distributed(copy.deepcopy(stock)).train()
    graph = pyg_sar.DistGraph(part)
    out, ids = inference(model, part.x, graph, return_ids=True)
    assert model.training and out.grad_fn is None
    assert torch.equal(ids, part.orig_ids)
    with torch.no_grad():
        ref = stock.eval()(data.x, data.edge_index)
    torch.testing.assert_close(out, ref[ids], rtol=1e-5, atol=1e-6)
    assert torch.equal(inference(model, part.x, graph), out)


def test_return_ids_needs_a_graph_with_ids():
    class Bare:
        is_dist_graph = True

    class Model(torch.nn.Module):
        def forward(self, x, graph):
            return x

    with pytest.raises(ValueError, match='holds no dataset ids'):
        inference(Model(), torch.ones(1), Bare(), return_ids=True)
