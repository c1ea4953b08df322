"""RGCNConv and FastRGCNConv over a homogeneous partition of
``HeteroData.to_homogeneous()`` equal single-process PyG: outputs, input
gradients and every parameter gradient (plain, basis and block-diagonal
decompositions, mean/sum/max aggregation, featureless embeddings), in every
mode, with chunks, at world sizes 1-3; a converted stock model trains along
the same loss curve.

One spawn per world size runs every configuration, in a module-scoped
fixture; the parent compares, one test per configuration."""
import copy
from types import SimpleNamespace

import pytest
import torch
import torch_geometric.nn as pyg_nn

import pyg_sar
from _dist import halo_slices_with_chunks, run_workers, test_device, to_cpu
from _exact import FLOAT32, mismatches, report
from _hetero import hard_hetero

RUNS = [('sar', None), ('sa', 11), ('one_shot', None), ('sar', 11)]
CONFIGS = ('mean', 'bases_sum', 'blocks_max', 'featureless', 'fast_mean',
           'fast_featureless_bases')


def _homogeneous():
    data = hard_hetero().to_homogeneous()
    del data.edge_attr  # only the citations have one (NaN elsewhere)
    g = torch.Generator().manual_seed(5)
    data.x = torch.randn(data.num_nodes, 12, generator=g)
    data.y = torch.randint(0, 4, (data.num_nodes, ), generator=g)
    return data


class Net(torch.nn.Module):
    def __init__(self, config: str, num_nodes: int, R: int) -> None:
        super().__init__()
        fast = config.startswith('fast')
        Conv = pyg_nn.FastRGCNConv if fast else pyg_nn.RGCNConv
        featureless = config.endswith(('featureless', 'featureless_bases'))
        in1 = num_nodes if featureless else 12
        kw1 = {}
        if 'bases' in config:
            kw1['num_bases'] = 3
        if 'blocks' in config:
            kw1['num_blocks'] = 2
        aggr = ('sum' if 'sum' in config else 'max' if 'max' in config
                else 'mean')
        self.conv1 = Conv(in1, 8, R, aggr=aggr, **kw1)
        self.conv2 = Conv(8, 4, R, num_bases=2, aggr=aggr if fast or
                          aggr != 'max' else 'mean')
        self.featureless = featureless

    def forward(self, x, edge_index, edge_type):
        x = None if self.featureless else x
        h = self.conv1(x, edge_index, edge_type).relu()
        return self.conv2(h, edge_index, edge_type)


def _stock(config, data):
    torch.manual_seed(0)
    model = Net(config, data.num_nodes, int(data.edge_type.max()) + 1)
    torch.manual_seed(1)
    for p in model.parameters():
        p.data = torch.randn_like(p) * 0.5
    return model


def _run(model, x, graph, edge_type, ids):
    x = x.clone().requires_grad_()
    model.zero_grad()
    out = model(x, graph, edge_type)
    w = (ids[:, None].double() * 37.0 +
         torch.arange(out.shape[1], device=ids.device)).sin()
    (out * w.to(out.dtype)).sum().backward()
    grad = x.grad if x.grad is not None else torch.zeros_like(x)
    return out.detach(), grad, {n: p.grad.clone() for n, p in
                                model.named_parameters() if p.grad is not
                                None}


def _worker(rank, world_size, part_dir):
    data = _homogeneous()
    part = pyg_sar.load_partition(part_dir, rank)
    device = test_device()
    x, edge_type, ids = (t.to(device) for t in (part.x, part.edge_type,
                                                 part.orig_ids))
    out = {}
    for mode, chunk in RUNS:
        halo_slices_with_chunks(chunk)
        graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk,
                                  device=device)
        for config in CONFIGS:
            model = pyg_sar.nn.to_distributed(copy.deepcopy(_stock(
                config, data))).to(device)
            out[(mode, chunk, config)] = to_cpu(_run(model, x, graph,
                                                     edge_type, ids))
    return part.orig_ids, out


@pytest.fixture(scope='module', params=[1, 2, 3])
def rgcn_run(request, tmp_path_factory):
    world_size = request.param
    data = _homogeneous()
    root = tmp_path_factory.mktemp('p')
    pyg_sar.partition_graph(data, world_size, root, progress=False)
    return SimpleNamespace(world_size=world_size, data=data, per_rank=(
        run_workers(_worker, world_size, str(root), timeout_s=120)))


@pytest.mark.parametrize('config', CONFIGS)
def test_rgcn_matches_pyg(rgcn_run, config):
    data = rgcn_run.data
    ref = _run(_stock(config, data), data.x, data.edge_index,
               data.edge_type, torch.arange(data.num_nodes))
    assert ref[2], config  # the model has parameter gradients
    ids = [r[0] for r in rgcn_run.per_rank]
    failures = []
    for mode, chunk in RUNS:
        key = (mode, chunk, config)
        failures += mismatches(
            f'{config} {mode} chunk={chunk} world={rgcn_run.world_size}',
            ids, [r[1][key] for r in rgcn_run.per_rank], ref, FLOAT32,
            params='some')
    report(failures)


def _bad_edge_types(rank, world_size, part_dir):
    part = pyg_sar.load_partition(part_dir, rank)
    graph = pyg_sar.DistGraph(part)
    conv = pyg_sar.nn.RGCNConv(12, 4, 3)
    messages = []
    for bad in (part.edge_type[:-1], part.edge_type.float(),
                part.edge_type + 5):
        try:
            conv(part.x, graph, bad)
        except ValueError as e:
            messages.append(str(e))
    return messages


def test_rgcn_refuses_bad_edge_type(tmp_path):
    data = _homogeneous()
    pyg_sar.partition_graph(data, 1, tmp_path / 'p', progress=False)

    messages = run_workers(_bad_edge_types, 1, str(tmp_path / 'p'))[0]
    assert len(messages) == 3
    assert 'local edges' in messages[0]
    assert 'integer' in messages[1]
    assert '[0, 3)' in messages[2]
