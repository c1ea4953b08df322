"""``examples/sampling_train_full_infer.py`` against one process, at world
sizes 1-3, on a graph with self loops, duplicate edges, isolated nodes and a
hub whose in-edges span all parts:

* with the example's fanouts, the full-graph inference of the trained model
  (the same converted model object, over the ``DistGraph``) gives the
  logits and accuracies that the same weights give on the whole graph in
  one process;
* with every neighbor sampled (fanouts ``-1``) and every training node in
  one batch, sampled training is full-batch training: its losses and
  weights follow stock PyG trained on the whole graph in one process.
"""
import copy
import importlib.util
import os.path as osp

import pytest
import torch
import torch.nn.functional as F

import pyg_sar
from pyg_sar.loader import DistNeighborLoader
from _dist import run_workers
from _graphs import hard_graph

# This file is in tests/<folder>/.
EXAMPLES = osp.join(osp.dirname(osp.abspath(__file__)), '..', '..',
                    'examples')
EPOCHS = 6
HIDDEN = 8
MASKS = ('train', 'val', 'test')


def example():
    spec = importlib.util.spec_from_file_location(
        'example_sampling_train_full_infer',
        osp.join(EXAMPLES, 'sampling_train_full_infer.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def new_model(module, num_features, dropout, convert=False):
    torch.manual_seed(0)
    model = module.GraphSAGE(num_features, HIDDEN, 3, dropout=dropout)
    return pyg_sar.nn.to_distributed(model) if convert else model


def _train(module, part, fanouts, dropout, batch_size, convert=True):
    # As the example: converted once, trained on batches.
    model = new_model(module, part.x.size(1), dropout, convert=convert)
    pyg_sar.sync_params(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01,
                                 weight_decay=5e-4)
    loader = DistNeighborLoader(part, fanouts, input_nodes=part.train_mask,
                                batch_size=batch_size, shuffle=True, seed=0,
                                pad_batches=True)
    losses = []
    for _ in range(EPOCHS):
        totals = module.train_epoch(model, loader, optimizer)
        losses.append(float(totals[0] / totals[2]))
    return model.eval(), losses, loader.num_global_batches


def _worker(rank, world_size, root):
    module = example()
    part = pyg_sar.load_partition(root, rank)
    graph = pyg_sar.DistGraph(part)
    results = {'ids': part.orig_ids}
    # As the example trains: sampled fanouts, dropout, several steps.
    model, _, _ = _train(module, part, [10, 5], 0.5, 16)
    params = [p.data_ptr() for p in model.parameters()]
    results['logits'], ids = pyg_sar.train.inference(model, part.x, graph,
                                                     return_ids=True)
    assert torch.equal(ids, part.orig_ids) and not model.training
    results['accuracy'] = module.full_graph_accuracy(model, part, graph)
    assert [p.data_ptr() for p in model.parameters()] == params
    results['state'] = copy.deepcopy(model.state_dict())
    # The stock model on the same batches: the converted one is the stock
    # one, bit for bit (dropout draws included).
    stock, _, _ = _train(module, part, [10, 5], 0.5, 16, convert=False)
    for key, value in stock.state_dict().items():
        assert torch.equal(results['state'][key], value), key
    # Every neighbor, one global batch: full-batch training.
    model, losses, steps = _train(module, part, [-1, -1], 0.0, 10_000)
    results['full'] = (losses, steps, copy.deepcopy(model.state_dict()))
    return results


def _stock_full_batch(module, data):
    model = new_model(module, data.num_features, 0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01,
                                 weight_decay=5e-4)
    mask = data.train_mask
    losses = []
    for _ in range(EPOCHS):
        model.train()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data.x, data.edge_index)[mask],
                               data.y[mask])
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return model, losses


@pytest.mark.parametrize('world_size', [1, 2, 3])
def test_sampled_training_then_full_graph_inference_as_one_process(
        world_size, tmp_path):
    data = hard_graph()
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, world_size, root, progress=False)
    results = run_workers(_worker, world_size, root, timeout_s=240)
    ids = torch.cat([r['ids'] for r in results])
    module = example()

    # Full-graph inference with the trained weights (the same on all ranks).
    stock = new_model(module, data.num_features, 0.5)
    stock.load_state_dict(results[0]['state'])
    for r in results[1:]:
        for key, value in r['state'].items():
            assert torch.equal(value, results[0]['state'][key]), key
    stock.eval()
    with torch.no_grad():
        logits = stock(data.x, data.edge_index)
    got = torch.cat([r['logits'] for r in results])
    torch.testing.assert_close(got, logits[ids], rtol=1e-4, atol=1e-5)
    assert torch.equal(got.argmax(-1), logits[ids].argmax(-1))
    correct = logits.argmax(-1) == data.y
    for name in MASKS:
        mask = data[f'{name}_mask']
        expected = float(correct[mask].sum()) / max(int(mask.sum()), 1)
        for r in results:
            assert r['accuracy'][name] == pytest.approx(expected), name

    # Sampled training with every neighbor in one batch = full batch.
    stock, losses = _stock_full_batch(module, data)
    for rank, r in enumerate(results):
        got_losses, steps, state = r['full']
        assert steps == 1
        torch.testing.assert_close(
            torch.tensor(got_losses), torch.tensor(losses), rtol=1e-5,
            atol=1e-6, msg=lambda m: f'loss curve, rank {rank}: {m}')
        for key, value in stock.state_dict().items():
            torch.testing.assert_close(state[key], value, rtol=1e-4,
                                       atol=1e-6)
    assert losses[-1] < losses[0]
