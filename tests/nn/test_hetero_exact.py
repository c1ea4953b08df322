"""Heterogeneous models over relation graphs equal single-process PyG:
outputs of every node type, input gradients of every node type and every
parameter gradient, for ``HeteroConv`` models and models made by
``torch_geometric.nn.to_hetero``, in every mode, with and without chunks, at
world sizes 1-3. The graph (tests/_hetero.py) has directed citations with
self loops, duplicate edges and an edge attribute, isolated nodes of every
type, and the parts are cut so that one part has no author at all (a
relation with an empty source table) and, at three parts, one has no field.

Each spawn (per world size and graph) runs in a module-scoped fixture; the
parent compares, one test per model.
"""
import copy
import functools
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch_geometric.nn import to_hetero
from torch_geometric.transforms import ToUndirected

import pyg_sar
from _dist import halo_slices_with_chunks, run_workers, test_device, to_cpu
from _exact import FLOAT32, FLOAT32_SCALED, Tol, close, mismatches, report
from _hetero import (AUTHOR, CITES, FIELD, HAS, OF, WRITES, WRITTEN,
                     BlockHeteroPart, hard_hetero)

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow

MODELS = ('hetero_conv', 'hetero_conv_edge_attr', 'to_hetero_sage_sum',
          'to_hetero_sage_mean', 'to_hetero_gat_max', 'hgt')
RUNS = [('sar', None), ('sa', 7), ('one_shot', None), ('sar', 7)]


class HeteroNet(torch.nn.Module):
    """Two HeteroConv layers over every relation (self loops on the
    citations, bipartite attention (GAT, GATv2, TransformerConv), SAGE
    mean/max, GraphConv mean)."""

    def __init__(self, edge_attr: bool = False) -> None:
        super().__init__()
        nn = pyg_nn
        self.conv1 = nn.HeteroConv({
            CITES: nn.GATConv(12, 4, heads=2,
                              edge_dim=3 if edge_attr else None),
            WRITES: nn.SAGEConv((8, 12), 8),
            WRITTEN: nn.GraphConv((12, 8), 8, aggr='mean'),
            HAS: nn.SAGEConv((12, 6), 8, aggr='max'),
            OF: nn.GATConv((6, 12), 4, heads=2, add_self_loops=False),
        }, aggr='sum')
        self.conv2 = nn.HeteroConv({
            CITES: nn.SAGEConv(8, 5),
            WRITES: nn.GATv2Conv((8, 8), 5, add_self_loops=False),
            WRITTEN: nn.TransformerConv((8, 8), 5, heads=2, concat=False,
                                        beta=True),
            OF: nn.GINConv(torch.nn.Linear(8, 5)),
        }, aggr='mean')

    def forward(self, x_dict, edge_index_dict, edge_attr_dict=None):
        kwargs = {} if edge_attr_dict is None else {
            'edge_attr_dict': edge_attr_dict}
        h = self.conv1(x_dict, edge_index_dict, **kwargs)
        h = {t: v.relu() for t, v in h.items()}
        return self.conv2(h, edge_index_dict)


class SAGE(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = pyg_nn.SAGEConv((-1, -1), 8)
        self.conv2 = pyg_nn.SAGEConv((-1, -1), 5)
        self.lin = torch.nn.Linear(5, 3)

    def forward(self, x, edge_index):
        x = self.conv1(x, edge_index).relu()
        return self.lin(self.conv2(x, edge_index))


class GAT(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = pyg_nn.GATConv((-1, -1), 4, heads=2,
                                    add_self_loops=False)
        self.conv2 = pyg_nn.GATConv((-1, -1), 5, add_self_loops=False)

    def forward(self, x, edge_index):
        return self.conv2(F.elu(self.conv1(x, edge_index)), edge_index)


class HGT(torch.nn.Module):
    def __init__(self, metadata) -> None:
        super().__init__()
        self.conv1 = pyg_nn.HGTConv(-1, 8, metadata, heads=2)
        self.conv2 = pyg_nn.HGTConv(8, 8, metadata, heads=2)

    def forward(self, x_dict, edge_index_dict):
        h = self.conv1(x_dict, edge_index_dict)
        return self.conv2({t: v.relu() for t, v in h.items()},
                          edge_index_dict)


def _stock(name: str, data):
    torch.manual_seed(0)
    metadata = data.metadata()
    if name.startswith('hetero_conv'):
        model = HeteroNet(edge_attr=name.endswith('edge_attr'))
    elif name == 'hgt':
        model = HGT(metadata)
    elif name.startswith('to_hetero_sage'):
        model = to_hetero(SAGE(), metadata, aggr=name.rsplit('_', 1)[1])
    else:
        model = to_hetero(GAT(), metadata, aggr='max')
    with torch.no_grad():  # initializes lazy parameters
        model(data.x_dict, data.edge_index_dict)
    torch.manual_seed(1)
    for p in model.parameters():  # everything non-zero, biases too
        p.data = torch.randn_like(p) * 0.5
    return model


def _loss(out_dict, ids_dict):
    total = 0
    for t, out in out_dict.items():
        ids = ids_dict[t].to(out.dtype)
        weight = (ids[:, None] * 37.0 +
                  torch.arange(out.shape[1], device=ids.device)).sin()
        total = total + (out * weight).sum()
    return total


def _run(model, x_dict, graph, ids_dict, edge_attr_dict=None):
    x_dict = {t: x.clone().requires_grad_() for t, x in x_dict.items()}
    kwargs = {} if edge_attr_dict is None else {
        'edge_attr_dict': edge_attr_dict}
    model.zero_grad()
    out = model(x_dict, graph, **kwargs)
    _loss(out, ids_dict).backward()
    return ({t: v.detach() for t, v in out.items()},
            {t: x.grad for t, x in x_dict.items()},
            {n: p.grad.clone() for n, p in model.named_parameters()
             if p.grad is not None})


def _worker(rank, world_size, models, part_dir=None):
    data = hard_hetero()
    if part_dir is None:
        empty = {AUTHOR: 1, FIELD: 2}
        part = BlockHeteroPart(data, rank, world_size, empty=empty)
    else:
        part = pyg_sar.load_partition(part_dir, rank)
    device = test_device()
    x_dict = {t: part[t].x.to(device) for t in part.node_types}
    ids = {t: part[t].orig_ids.to(device) for t in part.node_types}
    results = {}
    for mode, chunk in RUNS:
        halo_slices_with_chunks(chunk)
        graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk,
                                  device=device)
        assert isinstance(graph, pyg_sar.graph.hetero_graph.HeteroDistGraph)
        edge_attr = {CITES: part[CITES].edge_attr.to(device)}
        for name in models:
            model = pyg_sar.nn.to_distributed(copy.deepcopy(_stock(
                name, data))).to(device)
            attr = edge_attr if name.endswith('edge_attr') else None
            results[(mode, chunk, name)] = to_cpu(_run(model, x_dict, graph,
                                                       ids, attr))
    return to_cpu(ids), results


def _reference(name):
    data = hard_hetero()
    model = _stock(name, data)
    ids = {t: torch.arange(data[t].num_nodes) for t in data.node_types}
    attr = ({CITES: data[CITES].edge_attr} if name.endswith('edge_attr')
            else None)
    return _run(model, data.x_dict, data.edge_index_dict, ids, attr)


def _compare(run, name, tol=FLOAT32, runs=RUNS, grad_scale=None):
    """Outputs and input gradients of every node type, and every parameter
    gradient (summed over ranks), of model ``name`` in every run: one line
    per mismatch."""
    expected = run.reference(name)
    assert expected[2], name  # the model has parameter gradients
    ids = [r[0] for r in run.per_rank]
    failures = []
    for mode, chunk in runs:
        key = (mode, chunk, name)
        failures += mismatches(
            f'{run.label}{name} {mode} chunk={chunk} world={run.world_size}',
            ids, [r[1][key] for r in run.per_rank], expected, tol,
            params='some', grad_scale=grad_scale)
    return failures


@pytest.fixture(scope='module', params=[1, 2, 3])
def block_run(request):
    """Every model on contiguous blocks of input ids."""
    world_size = request.param
    return SimpleNamespace(world_size=world_size, label='',
                           reference=_reference, per_rank=run_workers(
                               _worker, world_size, MODELS, timeout_s=120))


def _tol(name: str):
    # HeteroNet's dot-product attention (TransformerConv): float32 weight
    # gradients summed over every destination, entries up to ~5, carry
    # rounding relative to the tensor's largest entry.
    return FLOAT32_SCALED if name.startswith('hetero_conv') else FLOAT32


@pytest.mark.parametrize('name', MODELS)
def test_hetero_model_matches_pyg(block_run, name):
    report(_compare(block_run, name, _tol(name)))


@pytest.fixture(scope='module', params=[2, 3])
def metis_run(request, tmp_path_factory):
    """The same through the partitioner and load_partition (relabelled
    ids, edges in the partition's CSC order)."""
    world_size = request.param
    root = tmp_path_factory.mktemp('parts')
    pyg_sar.partition_graph(hard_hetero(), world_size, root, progress=False)
    return SimpleNamespace(world_size=world_size, label='metis ',
                           reference=_reference, per_rank=run_workers(
                               _worker, world_size, MODELS[:2], str(root),
                               timeout_s=120))


@pytest.mark.parametrize('name', MODELS[:2])
def test_hetero_model_matches_pyg_on_metis_parts(metis_run, name):
    report(_compare(metis_run, name, _tol(name)))


def _curve(model, x_dict, graph, ids, labels, train, count, reduce, total):
    optimizer = torch.optim.Adam(model.parameters(), lr=0.005)
    losses = []
    for _ in range(20):
        optimizer.zero_grad()
        out = model(x_dict, graph)
        logits = torch.cat([out[t][:, :3] for t in sorted(out)])
        y = torch.cat([labels[t] for t in sorted(out)])
        mask = torch.cat([train[t] for t in sorted(out)])
        loss = F.cross_entropy(logits[mask], y[mask],
                               reduction='sum') / count(int(mask.sum()))
        loss.backward()
        reduce(model)
        optimizer.step()
        losses.append(float(total(loss.detach().clone())))
    return losses


def _labels(ids_dict):
    # Every node type gets labels and a training mask (from its input id).
    return ({t: (ids * 7 + len(t)) % 3 for t, ids in ids_dict.items()},
            {t: (ids * 5 + len(t)) % 3 > 0 for t, ids in ids_dict.items()})


def _curve_worker(rank, world_size, names):
    data = hard_hetero()
    part = BlockHeteroPart(data, rank, world_size, empty={AUTHOR: 1})
    graph = pyg_sar.DistGraph(part)
    x_dict = {t: part[t].x for t in part.node_types}
    ids = {t: part[t].orig_ids for t in part.node_types}
    labels, train = _labels(ids)
    from pyg_sar import comm
    return {name: _curve(pyg_sar.nn.to_distributed(_stock(name, data)),
                         x_dict, graph, ids, labels, train,
                         pyg_sar.global_count, pyg_sar.all_reduce_grads,
                         comm.all_reduce) for name in names}


CURVE_MODELS = ('hetero_conv', 'to_hetero_sage_mean', 'hgt')


@pytest.fixture(scope='module')
def curve_run():
    """20 Adam steps of every curve model on three workers."""
    return run_workers(_curve_worker, 3, CURVE_MODELS, timeout_s=120)


@pytest.mark.parametrize('name', CURVE_MODELS)
def test_hetero_loss_curve_matches_pyg(curve_run, name):
    """20 Adam steps on three workers follow the single-process curve."""
    data = hard_hetero()
    ids = {t: torch.arange(data[t].num_nodes) for t in data.node_types}
    labels, train = _labels(ids)
    ref = _curve(_stock(name, data), data.x_dict, data.edge_index_dict,
                 ids, labels, train, lambda n: n, lambda m: None,
                 lambda t: t)
    assert ref[-1] < ref[0] * 0.9, name  # it does train
    # Rounding differences only (summation order), which Adam amplifies
    # slowly.
    report([line for rank, r in enumerate(curve_run)
            for line in close(torch.tensor(r[name]), torch.tensor(ref),
                              Tol(rtol=1e-4, atol=1e-4),
                              f'{name} loss curve on rank {rank}')])


# The synthetic generator (always) and DBLP (when the data folder is here) ####

DATASET_MODELS = ('to_hetero_sage_sum', 'to_hetero_gat_max', 'hgt')
DATASET_RUNS = [('sar', None), ('one_shot', 500)]


def _dataset(name, root):
    """Every node type with features (featureless ones get a constant)."""
    if name == 'synthetic':
        # With reverse relations, so that every type is a destination.
        data = ToUndirected()(pyg_sar.datasets.load(
            'synthetic-hetero', root, num_papers=400, seed=3))
    else:
        data = pyg_sar.datasets.load('DBLP', root)
    for t in data.node_types:
        if 'x' not in data[t]:
            data[t].x = torch.ones(data[t].num_nodes, 1)
    return data


def _dataset_worker(rank, world_size, name, root, part_dir):
    data = _dataset(name, root)
    part = pyg_sar.load_partition(part_dir, rank)
    device = test_device()
    x_dict = {t: x.to(device) for t, x in part.x_dict.items()}
    ids = {t: part[t].orig_ids.to(device) for t in part.node_types}
    results = {}
    for mode, chunk in DATASET_RUNS:
        graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk,
                                  device=device)
        for model_name in DATASET_MODELS:
            model = pyg_sar.nn.to_distributed(_stock(model_name,
                                                     data)).to(device)
            results[(mode, chunk, model_name)] = to_cpu(_run(
                model, x_dict, graph, ids))
    return to_cpu(ids), results


@functools.lru_cache(maxsize=None)
def _dataset_reference(name, root, model_name):
    data = _dataset(name, root)
    ids = {t: torch.arange(data[t].num_nodes) for t in data.node_types}
    return _run(_stock(model_name, data), data.x_dict, data.edge_index_dict,
                ids)


def _dataset_run(name, root, world_size, tmp_path):
    data = _dataset(name, root)
    pyg_sar.partition_graph(data, world_size, tmp_path / 'p',
                            progress=False)
    return SimpleNamespace(
        world_size=world_size, label=f'{name} ',
        reference=functools.partial(_dataset_reference, name, root),
        per_rank=run_workers(_dataset_worker, world_size, name, root,
                             str(tmp_path / 'p'), timeout_s=300))


def _check_dataset(run, model_name):
    # float32 rounding of sums over many edges: absolute error relative to
    # the tensor's scale. Some parameter gradients are zero in exact
    # arithmetic (GAT's att_dst into a node with one in-edge per source
    # type...): their rounding noise follows the scale of the whole
    # backward, the largest entry of every parameter gradient.
    ref_pgrad = run.reference(model_name)[2]
    scale = max(float(g.abs().max()) for g in ref_pgrad.values())
    report(_compare(run, model_name, FLOAT32_SCALED, DATASET_RUNS, scale))


@pytest.fixture(scope='module', params=[1, 2, 3])
def synthetic_run(request, tmp_path_factory):
    root = str(tmp_path_factory.getbasetemp() / 'synthetic-hetero')
    return _dataset_run('synthetic', root, request.param,
                        tmp_path_factory.mktemp('synthetic'))


@pytest.fixture(scope='module', params=[1, 2, 3])
def dblp_run(request, tmp_path_factory):
    root = request.getfixturevalue('shared_data_root')  # skips without it
    return _dataset_run('DBLP', root, request.param,
                        tmp_path_factory.mktemp('dblp'))


@pytest.mark.parametrize('model_name', DATASET_MODELS)
def test_hetero_model_matches_pyg_on_synthetic(synthetic_run, model_name):
    _check_dataset(synthetic_run, model_name)


@pytest.mark.parametrize('model_name', DATASET_MODELS)
def test_hetero_model_matches_pyg_on_dblp(dblp_run, model_name):
    _check_dataset(dblp_run, model_name)
