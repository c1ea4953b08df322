"""Layer-wise MFGs (``graph.layer_wise``): outputs at the seeds and every
gradient equal the full computation, at world sizes 1-3, in every mode; what
would not be exact is refused."""
import pytest
import torch
import torch.nn.functional as F

import pyg_sar
from pyg_sar import nn as dnn
from _dist import run_workers
from _exact import FLOAT32, Tol, close, report
from _graphs import hard_graph

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow

LAYERS = {
    'sage': lambda i, o: dnn.SAGEConv(i, o),
    'sage_max': lambda i, o: dnn.SAGEConv(i, o, aggr='max'),
    'gcn': lambda i, o: dnn.GCNConv(i, o),
    'gat': lambda i, o: dnn.GATConv(i, o, heads=2, concat=False),
    'gin': lambda i, o: dnn.GINConv(torch.nn.Sequential(
        torch.nn.Linear(i, o), torch.nn.ReLU(), torch.nn.Linear(o, o))),
    'graph': lambda i, o: dnn.GraphConv(i, o),
}


class Net(torch.nn.Module):
    def __init__(self, kind, dims, norm=None):
        super().__init__()
        self.convs = torch.nn.ModuleList(
            LAYERS[kind](a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.norm = norm

    def forward(self, x, graph):
        for k, conv in enumerate(self.convs):
            x = conv(x, graph)
            if k < len(self.convs) - 1:
                if self.norm is not None:
                    x = self.norm(x)
                x = F.dropout(x.relu(), p=0.3, training=self.training)
        return x


def _run(rank, world_size, root, kind, mode):
    part = pyg_sar.load_partition(root, rank)
    graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=23)
    torch.manual_seed(0)
    model = Net(kind, [part.x.size(1), 8, 8, 3])
    pyg_sar.sync_params(model)
    seeds = part.train_mask
    weight = torch.randn(int(seeds.sum()), 3,
                         generator=torch.Generator().manual_seed(rank))
    results = []
    mfg = graph.layer_wise(seeds, hops=3)
    for layer_wise in (False, True, True):  # reused across forwards
        torch.manual_seed(7 + rank)
        model.zero_grad()
        x = part.x.clone().requires_grad_()
        if layer_wise:
            with mfg:
                out = model(x, graph)
        else:
            out = model(x, graph)
        (out[seeds] * weight).sum().backward()
        pyg_sar.all_reduce_grads(model)
        results.append((out[seeds].detach(), x.grad,
                        [p.grad.clone() for p in model.parameters()]))
    return results, mfg.num_destinations(), int(seeds.sum())


# Every layer at world sizes 1 and 3 in 'sar'; the other modes (and 2
# workers) on the two layers with the most machinery (norms, attention).
CASES = ([(kind, 1, 'sar') for kind in sorted(LAYERS)] +
         [(kind, 3, 'sar') for kind in sorted(LAYERS)] +
         [(kind, ws, mode) for kind in ('gat', 'gcn')
          for ws, mode in ((2, 'one_shot'), (3, 'sa'))])


@pytest.mark.parametrize('kind,world_size,mode', CASES)
def test_layer_wise_equals_full(tmp_path, kind, world_size, mode):
    root = str(tmp_path / 'parts')
    data = hard_graph()
    data.train_mask = torch.zeros(data.num_nodes, dtype=torch.bool)
    data.train_mask[torch.arange(5, data.num_nodes, 17)] = True
    pyg_sar.partition_graph(data, world_size, root)
    for (full, *mfgs), sizes, num_seeds in run_workers(
            _run, world_size, root, kind, mode, timeout_s=60):
        for again in mfgs:
            torch.testing.assert_close(again[0], full[0], rtol=1e-5,
                                       atol=1e-6)
            torch.testing.assert_close(again[1], full[1], rtol=1e-5,
                                       atol=1e-6)
            for a, b in zip(again[2], full[2]):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        # The sets shrink toward the seeds.
        assert sizes[-1] == num_seeds
        assert sizes[0] >= sizes[1] >= sizes[2]


def test_layer_wise_refusals(tmp_path):
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(hard_graph(), 1, root)
    part = pyg_sar.load_partition(root, 0)
    graph = pyg_sar.DistGraph(part)
    x = part.x
    dims = [x.size(1), 4, 4, 3]
    with pytest.raises(ValueError, match='more than hops=2 propagations'):
        with graph.layer_wise(part.train_mask, hops=2):
            Net('sage', dims)(x, graph)
    norm = pyg_sar.nn.to_distributed(
        torch.nn.Sequential(__import__('torch_geometric').nn.BatchNorm(4)))
    with pytest.raises(ValueError, match='norm over all nodes'):
        with graph.layer_wise(part.train_mask, hops=3):
            Net('sage', dims, norm=norm[0])(x, graph)
    gat = dnn.GATConv(x.size(1), 3, dropout=0.5)
    with pytest.raises(ValueError, match='attention dropout'):
        with graph.layer_wise(part.train_mask, hops=1):
            gat(x, graph)
    std = dnn.SAGEConv(x.size(1), 3, aggr='std')
    with pytest.raises(ValueError, match='whole-neighborhood'):
        with graph.layer_wise(part.train_mask, hops=1):
            std(x, graph)
    with pytest.raises(ValueError, match='hops must be a positive int'):
        graph.layer_wise(part.train_mask, hops=0)
    # After a refusal the graph is usable again, with and without MFGs.
    Net('sage', dims)(x, graph)
    with graph.layer_wise(part.train_mask, hops=3):
        Net('sage', dims)(x, graph)


# RGCNConv / FastRGCNConv: the relation view keeps every relation row of D_k.

RGCN_CONFIGS = ('mean', 'bases_sum', 'blocks_max', 'featureless',
                'fast_mean')
# Layer-wise against full on one rank: only the order of the sums differs.
SAME = Tol(rtol=1e-5, atol=1e-6)

def _rgcn(rank, world_size, root):
    import copy
    from tests.nn.conv.test_rgcn_conv import _homogeneous, _stock
    data = _homogeneous()
    part = pyg_sar.load_partition(root, rank)
    seeds = part.train_mask
    weight = torch.randn(int(seeds.sum()), 4,
                         generator=torch.Generator().manual_seed(rank))
    out = {}
    for mode, chunk in (('sar', None), ('sa', 11)):
        graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk)
        mfg = graph.layer_wise(seeds, hops=2)
        for config in RGCN_CONFIGS:
            model = pyg_sar.nn.to_distributed(copy.deepcopy(
                _stock(config, data)))
            runs = []
            for layer_wise in (False, True):
                model.zero_grad()
                x = part.x.clone().requires_grad_()
                if layer_wise:
                    with mfg:
                        y = model(x, graph, part.edge_type)
                else:
                    y = model(x, graph, part.edge_type)
                (y[seeds] * weight).sum().backward()
                pyg_sar.all_reduce_grads(model)
                runs.append((y[seeds].detach(), x.grad,
                             [p.grad.clone() for p in model.parameters()]))
            out[(mode, config)] = runs
        sizes = mfg.num_destinations()
        assert sizes[-1] == int(seeds.sum()) and sizes[0] >= sizes[1]
    return out


@pytest.fixture(scope='module', params=[1, 3])
def rgcn_run(request, tmp_path_factory):
    """Every RGCN configuration, full and layer-wise, in one spawn."""
    from tests.nn.conv.test_rgcn_conv import _homogeneous
    world_size = request.param
    data = _homogeneous()
    data.train_mask = torch.zeros(data.num_nodes, dtype=torch.bool)
    data.train_mask[torch.arange(3, data.num_nodes, 11)] = True
    root = str(tmp_path_factory.mktemp('parts'))
    pyg_sar.partition_graph(data, world_size, root, progress=False)
    return run_workers(_rgcn, world_size, root, timeout_s=120)


@pytest.mark.parametrize('config', RGCN_CONFIGS)
def test_rgcn_layer_wise_equals_full(rgcn_run, config):
    failures = []
    for rank, out in enumerate(rgcn_run):
        for mode in ('sar', 'sa'):
            full, mfg = out[(mode, config)]
            what = f'{config} {mode} world={len(rgcn_run)} rank {rank}'
            failures += close(mfg[0], full[0], SAME, f'{what} output')
            if full[1] is not None:
                failures += close(mfg[1], full[1], SAME, f'{what} dL/dx')
            for k, (a, b) in enumerate(zip(mfg[2], full[2])):
                failures += close(a, b, SAME, f'{what} parameter {k} grad')
    report(failures)


# to_hetero / HeteroConv models over a HeteroDistGraph ######################

def _hetero(rank, world_size, root, names):
    import copy
    from _hetero import PAPER, hard_hetero
    from tests.nn.test_hetero_exact import _stock
    data = hard_hetero()
    part = pyg_sar.load_partition(root, rank)
    seeds = part[PAPER].train_mask
    weight = torch.randn(int(seeds.sum()), 8,
                         generator=torch.Generator().manual_seed(rank))
    out = {}
    for mode, chunk in (('sar', None), ('sa', 7)):
        graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk)
        mfg = graph.layer_wise({PAPER: seeds}, hops=2)
        sizes = mfg.num_destinations()
        assert sizes[-1][PAPER] == int(seeds.sum())
        assert all(sizes[0][t] >= sizes[1][t] for t in sizes[0])
        for name in names:
            model = pyg_sar.nn.to_distributed(copy.deepcopy(
                _stock(name, data)))
            runs = []
            for layer_wise in (False, True, True):
                model.zero_grad()
                x = {t: part[t].x.clone().requires_grad_()
                     for t in part.node_types}
                if layer_wise:
                    with mfg:
                        y = model(x, graph)[PAPER]
                else:
                    y = model(x, graph)[PAPER]
                (y[seeds] * weight[:, :y.size(1)]).sum().backward()
                pyg_sar.all_reduce_grads(model)
                runs.append((y[seeds].detach(),
                             [x[t].grad for t in part.node_types],
                             [p.grad for p in model.parameters()]))
            out[(mode, name)] = runs
    return out


HETERO_MODELS = ('to_hetero_sage_sum', 'to_hetero_sage_mean',
                 'to_hetero_gat_max')


@pytest.fixture(scope='module', params=[1, 3])
def hetero_run(request, tmp_path_factory):
    """Every model, full and twice layer-wise, in one spawn."""
    from _hetero import hard_hetero
    world_size = request.param
    root = str(tmp_path_factory.mktemp('parts'))
    pyg_sar.partition_graph(hard_hetero(), world_size, root, progress=False)
    return run_workers(_hetero, world_size, root, HETERO_MODELS,
                       timeout_s=120)


@pytest.mark.parametrize('name', HETERO_MODELS)
def test_hetero_layer_wise_equals_full(hetero_run, name):
    failures = []
    for rank, out in enumerate(hetero_run):
        for mode in ('sar', 'sa'):
            full, *mfgs = out[(mode, name)]
            what = f'{name} {mode} world={len(hetero_run)} rank {rank}'
            for again in mfgs:
                failures += close(again[0], full[0], FLOAT32,
                                  f'{what} output')
                # Input gradients per node type, then parameter gradients.
                for k, (a, b) in enumerate(zip(again[1] + again[2],
                                               full[1] + full[2])):
                    if b is None:
                        if a is not None and bool(a.any()):
                            failures.append(f'{what} gradient {k}: none '
                                            f'in full, non-zero '
                                            f'layer-wise')
                        continue
                    # Chunk sums reorder.
                    failures += close(a, b, FLOAT32, f'{what} gradient {k}')
    report(failures)
