"""Every example model with dropout is deterministic in ``eval()`` mode and
not in training mode, as the examples use it: stock PyG models on an
``edge_index``, converted ones on a ``DistGraph``, and ``to_hetero`` models
(whose traced ``forward`` keeps what ``self.training`` was at trace time,
so a dropout must be a module there)."""
import importlib.util
import os.path as osp

import pytest
import torch

import pyg_sar
from _hetero import hard_hetero

# This file is in tests/examples/.
EXAMPLES = osp.abspath(osp.join(osp.dirname(__file__), '..', '..', 'examples'))


def example(name):
    spec = importlib.util.spec_from_file_location(
        f'example_{name}', osp.join(EXAMPLES, f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    import sys
    sys.path.insert(0, EXAMPLES)  # (cora_workers)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(EXAMPLES)
    return module


@pytest.fixture(scope='module')
def homogeneous(hard_part):
    data, part = hard_part
    return data, part, pyg_sar.DistGraph(part)


def _homogeneous_cases(data, part, graph):
    c = data.num_features
    yield ('full_batch_gat', lambda m: m.GAT(c, 4, 3, heads=2),
           part.x, graph)
    yield ('full_batch_sage_cora', lambda m: m.SAGE(c, 8, 3), part.x, graph)
    yield ('sampling_train_full_infer', lambda m: m.GraphSAGE(c, 8, 3),
           data.x, data.edge_index)
    yield ('stock_pyg_to_distributed', lambda m: pyg_sar.nn.to_distributed(
        m.Net(c, 8, 3, 'sage')), part.x, graph)


def _outputs(model, *inputs):
    torch.manual_seed(0)
    first = model(*inputs)
    second = model(*inputs)
    if isinstance(first, dict):
        first, second = torch.cat(list(first.values())), torch.cat(
            list(second.values()))
    return first, second


@pytest.mark.parametrize('index', range(4))
def test_example_model_eval_is_deterministic(homogeneous, index):
    data, part, graph = homogeneous
    name, make, x, edges = list(_homogeneous_cases(data, part, graph))[index]
    model = make(example(name))
    a, b = _outputs(model.train(), x, edges)
    assert not torch.equal(a, b), f'{name}: no dropout in training'
    a, b = _outputs(model.eval(), x, edges)
    assert torch.equal(a, b), f'{name}: eval() is not deterministic'


def test_to_hetero_example_model_eval_is_deterministic():
    from torch_geometric.nn import to_hetero
    data = hard_hetero()
    module = example('sampled_hetero_dblp')
    model = to_hetero(module.GraphSAGE(8, 3), data.metadata(), aggr='sum')
    with torch.no_grad():  # the lazy input sizes
        model(data.x_dict, data.edge_index_dict)
    a, b = _outputs(model.train(), data.x_dict, data.edge_index_dict)
    assert not torch.equal(a, b), 'no dropout in training'
    a, b = _outputs(model.eval(), data.x_dict, data.edge_index_dict)
    assert torch.equal(a, b), 'eval() is not deterministic'
