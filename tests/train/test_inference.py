"""``pyg_sar.train.inference``: the converted model's forward over the
``DistGraph`` in eval mode without autograd, its mode restored, the rows'
dataset ids on request; equal to the stock model over the whole graph;
``gather_nodes`` puts the ranks' rows back together by dataset id.
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
    # Given the part, the DistGraph is built once and kept on it.
    assert torch.equal(inference(model, part.x, part), out)
    kept = part.__dict__['_inference_graph']
    assert isinstance(kept, pyg_sar.DistGraph)
    assert torch.equal(inference(model, part.x, part), out)
    assert part.__dict__['_inference_graph'] is kept
    assert part.num_node_features == part.num_features == data.num_features


def test_return_ids_needs_a_graph_with_ids():
    class Bare:
        is_dist_graph = True

    class Model(torch.nn.Module):
        def forward(self, x, graph):
            return x

    with pytest.raises(ValueError, match='holds no dataset ids'):
        inference(Model(), torch.ones(1), Bare(), return_ids=True)


def _gather_worker(rank, world_size, root):
    part = pyg_sar.load_partition(root, rank)
    graph = pyg_sar.DistGraph(part)
    x, y, mask = pyg_sar.train.gather_nodes(part, part.x, part.y,
                                            part.train_mask)
    return x, y, mask, pyg_sar.train.gather_nodes(graph, part.orig_ids)


@pytest.mark.parametrize('world_size', [1, 2, 3])
def test_gather_nodes_gives_the_whole_graph_by_dataset_id(world_size,
                                                          tmp_path):
    from _dist import run_workers
    from _graphs import hard_graph
    data = hard_graph()
    pyg_sar.partition_graph(data, world_size, str(tmp_path), progress=False)
    for x, y, mask, ids in run_workers(_gather_worker, world_size,
                                       str(tmp_path)):
        assert torch.equal(x, data.x) and torch.equal(y, data.y)
        assert torch.equal(mask, data.train_mask)
        assert torch.equal(ids, torch.arange(data.num_nodes))


def test_gather_nodes_refuses_rows_that_are_not_this_ranks_nodes(hard_part):
    from pyg_sar.train import gather_nodes
    _, part = hard_part
    with pytest.raises(ValueError, match='one row per node of this rank'):
        gather_nodes(part, part.x[1:])
    with pytest.raises(ValueError, match='holds no dataset ids'):
        gather_nodes(object(), part.x)
