"""PyG's idioms around the layers, ported with only the launch and
distribution lines changed, equal single-process PyG:

* ``gcn2_cora.py``: ``T.GCNNorm()`` + ``T.ToSparseTensor()`` and
  ``GCN2Conv(normalize=False)`` fed ``adj_t``; ``partition_graph`` takes the
  ``adj_t`` data (its values become ``edge_weight``); loss curve, world
  sizes 2 and 3.
* lazy layers (``SAGEConv((-1, -1), ...)``, ``GraphSAGE(-1, ...)``):
  converted before any forward, initialized on the first distributed
  forward (same seed: same weights), every rank the same shapes.
* ``RandomLinkSplit``: its supervision attributes are refused by name;
  ``part[node_type][attr]``; PyG's ``negative_sampling`` signature.
"""
import copy

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
import torch_geometric.transforms as T
from torch_geometric.nn import GCN2Conv, GCNConv
from torch_geometric.utils import negative_sampling

import pyg_sar
from pyg_sar.nn import to_distributed
from _dist import run_workers
from _exact import FLOAT32, mismatches, report, train_curve
from _graphs import hard_graph
from _hetero import hard_hetero

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow


# gcn2_cora.py, its model verbatim (dropout 0: masks are per worker) #########

class Net(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels,
                 num_layers, alpha, theta, shared_weights=True, dropout=0.0):
        super().__init__()
        self.lins = torch.nn.ModuleList()
        self.lins.append(torch.nn.Linear(in_channels, hidden_channels))
        self.lins.append(torch.nn.Linear(hidden_channels, out_channels))
        self.convs = torch.nn.ModuleList()
        for layer in range(num_layers):
            self.convs.append(
                GCN2Conv(hidden_channels, alpha, theta, layer + 1,
                         shared_weights, normalize=False))
        self.dropout = dropout

    def forward(self, x, adj_t):
        x = F.dropout(x, self.dropout, training=self.training)
        x = x_0 = self.lins[0](x).relu()
        for conv in self.convs:
            x = F.dropout(x, self.dropout, training=self.training)
            # Distributed, the DistGraph stands in for adj_t, its values
            # included: the call is the stock script's.
            x = conv(x, x_0, adj_t)
            x = x.relu()
        x = F.dropout(x, self.dropout, training=self.training)
        return self.lins[1](x)


def gcn2_data():
    data = hard_graph()
    del data.edge_weight, data.edge_attr
    return T.Compose([T.GCNNorm(), T.ToSparseTensor()])(data)


def gcn2_curve(x, adj_t, y, mask, total, dist=False, epochs=8):
    return train_curve(
        lambda: Net(x.size(1), 16, 3, num_layers=4, alpha=0.1, theta=0.5),
        (x, adj_t), y, mask, total, epochs, dist, lr=0.01, seed=0)


def _gcn2_worker(rank, world_size, root):
    part = pyg_sar.load_partition(root, rank)
    graph = pyg_sar.DistGraph(part)
    mask = part.train_mask
    return gcn2_curve(part.x, graph, part.y, mask, pyg_sar.global_count(mask),
                      dist=True)


def test_adj_t_becomes_edge_index_and_edge_weight(tmp_path):
    data = gcn2_data()
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, 1, root)
    part = pyg_sar.load_partition(root, 0)
    adj = data.adj_t.to_dense()  # [dst, src]
    src, dst = part.orig_ids[part.edge_index]
    assert part.edge_index.size(1) == int((adj != 0).sum())
    torch.testing.assert_close(part.edge_weight, adj[dst, src])
    # The caller's data is not changed; both forms at once are refused.
    assert 'adj_t' in data and 'edge_index' not in data
    both = copy.copy(data)
    both.edge_index = part.edge_index
    with pytest.raises(ValueError, match="both 'edge_index' and 'adj_t'"):
        pyg_sar.partition_graph(both, 1, str(tmp_path / 'p2'))


@pytest.mark.parametrize('world_size', [2, 3])
def test_gcn2_cora_logic_matches_single_process(world_size, tmp_path):
    data = gcn2_data()
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, world_size, root)
    expected = gcn2_curve(data.x, data.adj_t, data.y, data.train_mask,
                          int(data.train_mask.sum()))
    assert all(loss == loss for loss in expected)  # PyG's own: no nan
    for curve in run_workers(_gcn2_worker, world_size, root, timeout_s=120):
        torch.testing.assert_close(torch.tensor(curve),
                                   torch.tensor(expected), rtol=1e-4,
                                   atol=1e-5)


# Lazy layers ###############################################################

class LazyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = pyg_nn.SAGEConv((-1, -1), 8)
        self.conv2 = pyg_nn.GATConv(-1, 4, heads=2)
        self.conv3 = pyg_nn.SAGEConv(-1, 3, aggr=['mean', 'max'])

    def forward(self, x, edge_index):
        x = self.conv1(x, edge_index).relu()
        x = self.conv2(x, edge_index).relu()
        return self.conv3(x, edge_index)


def _lazy_eval(model, x, edge_index, ids, n):
    x = x.clone().requires_grad_()
    out = model(x, edge_index)
    gen = torch.Generator().manual_seed(1)
    (out * torch.randn(n, out.size(1), generator=gen)[ids]).sum().backward()
    return (out.detach(), x.grad,
            {k: (p.detach(), p.grad) for k, p in model.named_parameters()})


def _gradients(result):
    """``(out, dL/dx, {name: (value, grad)})`` as ``(out, dL/dx, {name:
    grad})``."""
    return result[0], result[1], {k: g for k, (_, g) in result[2].items()}


def _lazy_worker(rank, world_size, root, widen_rank):
    part = pyg_sar.load_partition(root, rank)
    torch.manual_seed(0)
    model = to_distributed(LazyNet())  # before any forward
    x = part.x
    if rank == widen_rank:
        x = torch.cat([x, x[:, :1]], 1)  # a rank with other widths
    try:
        return _lazy_eval(model, x, pyg_sar.DistGraph(part), part.orig_ids,
                          int(part.num_nodes)) + (part.orig_ids, )
    except Exception as e:
        if widen_rank < 0:
            raise
        return repr(e)


@pytest.mark.parametrize('world_size', [2])
def test_lazy_layers_initialize_on_first_distributed_forward(world_size,
                                                             tmp_path):
    data = hard_graph()
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, world_size, root)
    torch.manual_seed(0)
    ref = _lazy_eval(LazyNet(), data.x, data.edge_index,
                     torch.arange(data.num_nodes), data.num_nodes)
    results = run_workers(_lazy_worker, world_size, root, -1, timeout_s=120)
    for name, (value, grad) in ref[2].items():
        for r in results:  # every rank the same initial weights
            torch.testing.assert_close(r[2][name][0], value)
    report(mismatches(f'lazy world={world_size}', [r[3] for r in results],
                      [_gradients(r) for r in results], _gradients(ref),
                      FLOAT32))
    # A rank whose inputs have another width: one clear error, no hang.
    errors = run_workers(_lazy_worker, world_size, root, 1, timeout_s=60)
    assert all('input widths' in e for e in errors), errors


class HeteroGNN(torch.nn.Module):  # PyG's to_hetero example, lazily
    def __init__(self):
        super().__init__()
        self.conv1 = pyg_nn.SAGEConv((-1, -1), 8)
        self.conv2 = pyg_nn.SAGEConv((-1, -1), 4)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def _lazy_hetero(metadata):
    torch.manual_seed(0)
    return pyg_nn.to_hetero(HeteroGNN(), metadata, aggr='sum')


def _hetero_eval(model, x_dict, graph, ids):
    x_dict = {t: x.clone().requires_grad_() for t, x in x_dict.items()}
    torch.manual_seed(5)  # the lazy weights drawn at the first forward
    out = model(x_dict, graph)
    loss = sum((o * (ids[t][:, None] * 3.7 + torch.arange(o.size(1))).sin()
                ).sum() for t, o in out.items())
    loss.backward()
    return ({t: o.detach() for t, o in out.items()},
            {t: x.grad for t, x in x_dict.items()},
            {k: (p.detach(), p.grad) for k, p in model.named_parameters()})


def _hetero_worker(rank, world_size, root):
    data = hard_hetero()
    part = pyg_sar.load_partition(root, rank)
    model = to_distributed(_lazy_hetero(data.metadata()))  # no forward yet
    x_dict = {t: part[t].x for t in part.node_types}
    ids = {t: part[t].orig_ids for t in part.node_types}
    return ids, _hetero_eval(model, x_dict, pyg_sar.DistGraph(part), ids)


def test_lazy_to_hetero_model_matches_single_process(tmp_path):
    data = hard_hetero()
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, 2, root)
    ids = {t: torch.arange(data[t].num_nodes) for t in data.node_types}
    ref = _hetero_eval(_lazy_hetero(data.metadata()), data.x_dict,
                       data.edge_index_dict, ids)
    results = run_workers(_hetero_worker, 2, root, timeout_s=120)
    for name, (value, grad) in ref[2].items():
        for r in results:  # every rank the same initial weights
            torch.testing.assert_close(r[1][2][name][0], value)
    report(mismatches('lazy to_hetero world=2', [r[0] for r in results],
                      [_gradients(r[1]) for r in results], _gradients(ref),
                      FLOAT32))


# RandomLinkSplit, part[type][attr], negative_sampling ######################

def test_random_link_split_output_is_refused_by_name(tmp_path):
    data = hard_graph()
    train, _, _ = T.RandomLinkSplit(num_val=0.1, num_test=0.1)(data)
    with pytest.raises(ValueError, match='RandomLinkSplit.*edge_label'):
        pyg_sar.partition_graph(train, 2, str(tmp_path / 'parts'))
    kept = copy.copy(train)
    del kept.edge_label, kept.edge_label_index
    pyg_sar.partition_graph(kept, 1, str(tmp_path / 'ok'))


def test_part_node_type_attr_as_in_pyg(tmp_path):
    data = hard_hetero()
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, 1, root)
    part = pyg_sar.load_partition(root, 0)
    node_type = data.node_types[0]
    for attr in data[node_type].keys():
        got = part[node_type][attr]
        want = data[node_type][attr]
        if isinstance(want, torch.Tensor) and want.dim() > 0 and \
                want.size(0) == data[node_type].num_nodes:
            torch.testing.assert_close(got, want[part[node_type].orig_ids])
        assert attr in part[node_type]
    with pytest.raises(KeyError, match='no attribute'):
        part[node_type]['nothing']
    edge_type = data.edge_types[0]
    assert part[edge_type]['edge_index'].size(0) == 2


def _neg_worker(rank, world_size, root, n, k):
    import random
    part = pyg_sar.load_partition(root, rank)
    graph = pyg_sar.DistGraph(part)
    random.seed(4)
    pyg_style = pyg_sar.link.negative_sampling(graph, num_nodes=n,
                                               num_neg_samples=k)
    random.seed(4)
    old_style = pyg_sar.link.negative_sampling(graph, num_neg_samples=k)
    try:
        pyg_sar.link.negative_sampling(graph, n + 1)
        bad = None
    except ValueError as e:
        bad = str(e)
    return pyg_style, old_style, bad


def test_negative_sampling_takes_pyg_signature(tmp_path):
    import random
    data = hard_graph()
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, 2, root)
    n, k = data.num_nodes, 40
    random.seed(4)
    ref = negative_sampling(data.edge_index, n, k)
    for pyg_style, old_style, bad in run_workers(_neg_worker, 2, root, n, k):
        assert torch.equal(pyg_style, ref) and torch.equal(old_style, ref)
        assert 'num_nodes=121' in bad


def test_graph_stands_in_for_weighted_adj_t(tmp_path):
    """A layer called as in the stock script, ``conv(x, x_0, graph)``, reads
    the partitioned adj_t's values as PyG reads them from ``adj_t``; an
    explicit edge_weight still wins."""
    data = gcn2_data()
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, 1, root)
    part = pyg_sar.load_partition(root, 0)
    conv = to_distributed(GCN2Conv(6, 0.1, normalize=False))
    ref = GCN2Conv(6, 0.1, normalize=False)
    ref.load_state_dict(conv.state_dict())
    x, graph = part.x, pyg_sar.DistGraph(part)
    expected = ref(data.x, data.x, data.adj_t)[part.orig_ids]
    torch.testing.assert_close(conv(x, x, graph), expected)
    torch.testing.assert_close(conv(x, x, graph, part.edge_weight), expected)
    ones = torch.ones_like(part.edge_weight)
    assert not torch.allclose(conv(x, x, graph, edge_weight=ones), expected)
    # The same on the engine (a twin): GCNConv over the normalized adj_t.
    gcn = to_distributed(GCNConv(6, 4, normalize=False))
    stock = GCNConv(6, 4, normalize=False)
    stock.load_state_dict(gcn.state_dict())
    torch.testing.assert_close(gcn(x, graph), stock(data.x, data.adj_t)[
        part.orig_ids])


def test_weights_a_layer_does_not_read_are_said_in_the_exactness_line(
        tmp_path, caplog):
    """A partition holding edge_weight (not adj_t's), given to a layer
    called without it: the log line that claims exactness says so."""
    data = hard_graph()
    assert 'edge_weight' in data
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, 1, root)
    part = pyg_sar.load_partition(root, 0)
    conv = to_distributed(GCN2Conv(data.num_features, 0.1, normalize=False))
    with caplog.at_level('WARNING', logger='pyg_sar'):
        conv(part.x, part.x, pyg_sar.DistGraph(part))
    assert any('does not read' in r.getMessage() and 'exact' in
               r.getMessage() for r in caplog.records), caplog.text
