import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn.models import GCN, MLP
from torch_geometric.utils import is_undirected

from pyg_sar import datasets


def test_synthetic_graph_structure():
    data = datasets.synthetic_graph(5000, 16, 12, 5, seed=3)
    assert data.num_nodes == 5000
    assert data.x.shape == (5000, 12) and data.y.shape == (5000, )
    assert int(data.y.min()) == 0 and int(data.y.max()) == 4
    edge_index = data.edge_index
    assert edge_index.dtype == torch.long
    assert is_undirected(edge_index, num_nodes=5000)
    assert not bool((edge_index[0] == edge_index[1]).any())
    codes = edge_index[0] * 5000 + edge_index[1]
    assert torch.unique(codes).numel() == codes.numel()
    assert abs(data.num_edges / 5000 - 16) < 1.6
    # Power-law-ish degrees: hubs far above the mean.
    degree = torch.bincount(edge_index[0], minlength=5000)
    assert int(degree.max()) > 5 * float(degree.float().mean())
    # Homophily: most edges join nodes of the same class.
    assert float((data.y[edge_index[0]] == data.y[edge_index[1]]).float()
                 .mean()) > 0.6
    masks = data.train_mask.long() + data.val_mask.long() + \
        data.test_mask.long()
    assert bool((masks == 1).all())
    assert int(data.train_mask.sum()) == 500


def test_synthetic_graph_is_deterministic():
    first = datasets.synthetic_graph(2000, 10, 4, 3, seed=7)
    second = datasets.synthetic_graph(2000, 10, 4, 3, seed=7)
    other = datasets.synthetic_graph(2000, 10, 4, 3, seed=8)
    for key in ('x', 'y', 'edge_index', 'train_mask', 'test_mask'):
        assert torch.equal(first[key], second[key])
    assert not torch.equal(first.y, other.y)


def _accuracy(model, data, use_graph: bool) -> float:
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01,
                                 weight_decay=5e-4)

    def forward():
        return model(data.x, data.edge_index) if use_graph else model(data.x)

    best_val = best_test = 0.0
    for _ in range(40):
        model.train()
        optimizer.zero_grad()
        out = forward()
        F.cross_entropy(out[data.train_mask],
                        data.y[data.train_mask]).backward()
        optimizer.step()
        model.eval()
        with torch.no_grad():
            pred = forward().argmax(dim=-1)
        val = float((pred[data.val_mask] == data.y[data.val_mask]).float()
                    .mean())
        if val > best_val:
            best_val = val
            best_test = float((pred[data.test_mask] == data.y[data.test_mask]
                               ).float().mean())
    return best_test


def test_gnn_beats_mlp_on_synthetic():
    torch.manual_seed(0)
    data = datasets.synthetic_graph(3000, 12, 32, 5, seed=0)
    mlp = _accuracy(MLP([32, 32, 5], dropout=0.5), data, use_graph=False)
    gcn = _accuracy(GCN(32, 32, 2, 5, dropout=0.5, cached=True), data,
                   use_graph=True)
    assert gcn > mlp + 0.2, (mlp, gcn)
    assert mlp > 0.3  # the features do carry class signal


def test_load_synthetic_with_overrides():
    data = datasets.load('synthetic', num_nodes=1000, num_features=4)
    assert data.num_nodes == 1000 and data.x.size(1) == 4


def test_load_unknown_dataset():
    with pytest.raises(ValueError, match="Unknown dataset 'Nope'"):
        datasets.load('Nope', 'unused')
    with pytest.raises(ValueError, match='takes no extra options'):
        datasets.load('Cora', 'unused', num_nodes=5)


def test_load_ogb_without_package(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, 'ogb', None)
    monkeypatch.setitem(sys.modules, 'ogb.nodeproppred', None)
    with pytest.raises(ImportError, match="needs the 'ogb' package"):
        datasets.load('ogbn-arxiv', 'unused')


@pytest.mark.parametrize('name, num_nodes, num_classes', [
    ('Cora', 2708, 7),
    ('CiteSeer', 3327, 6),
    ('Photo', 7650, 8),
])
def test_load_real(shared_data_root, name, num_nodes, num_classes):
    data = datasets.load(name, shared_data_root)
    assert data.num_nodes == num_nodes
    assert int(data.y.max()) + 1 == num_classes
    if name == 'Photo':  # Shchur et al. split: 20 train, 30 val per class
        assert int(data.train_mask.sum()) == 20 * num_classes
        assert int(data.val_mask.sum()) == 30 * num_classes
        assert not bool((data.train_mask & data.test_mask).any())


@pytest.mark.parametrize('name, node_type, num_nodes, num_classes', [
    ('DBLP', 'author', 4057, 4),
    ('IMDB', 'movie', 4278, 3),
])
def test_load_heterogeneous(shared_data_root, name, node_type, num_nodes,
                            num_classes):
    data = datasets.load(name, shared_data_root)
    assert data[node_type].num_nodes == num_nodes
    assert int(data[node_type].y.max()) + 1 == num_classes
    assert int(data[node_type].train_mask.sum()) > 0
    assert len(data.edge_types) >= 4


def test_synthetic_hetero_graph_is_shaped_like_ogbn_mag():
    from pyg_sar.datasets.synthetic_hetero import RELATIONS
    data = datasets.load('synthetic-hetero', seed=1, num_papers=3000,
                         num_features=8, num_classes=5)
    again = datasets.load('synthetic-hetero', seed=1, num_papers=3000,
                          num_features=8, num_classes=5)
    other = datasets.load('synthetic-hetero', seed=2, num_papers=3000,
                          num_features=8, num_classes=5)
    assert set(data.node_types) == {'paper', 'author', 'institution',
                                    'field_of_study'}
    assert tuple(data.edge_types) == RELATIONS
    assert data['paper'].x.shape == (3000, 8)
    assert data['author'].num_nodes == 4620
    for relation in RELATIONS:
        edge_index = data[relation].edge_index
        src_type, _, dst_type = relation
        assert int(edge_index[0].max()) < data[src_type].num_nodes
        assert int(edge_index[1].max()) < data[dst_type].num_nodes
        codes = edge_index[0] * data[dst_type].num_nodes + edge_index[1]
        assert codes.unique().numel() == codes.numel()  # no duplicates
        assert torch.equal(edge_index, again[relation].edge_index)
    assert not torch.equal(data['paper', 'cites', 'paper'].edge_index,
                           other['paper', 'cites', 'paper'].edge_index)
    # Per-paper sizes near ogbn-mag's, and authors mostly of one class.
    writes = data['author', 'writes', 'paper'].edge_index
    assert 2.0 < writes.size(1) / 3000 < 3.2
    topics = data['paper', 'has_topic', 'field_of_study'].edge_index
    assert 8.0 < topics.size(1) / 3000 < 11.0
    y = data['paper'].y
    first = torch.full((data['author'].num_nodes, ), -1)
    first[writes[0].flip(0)] = y[writes[1].flip(0)]
    same = (y[writes[1]] == first[writes[0]]).float().mean()
    assert same > 0.6


def test_streamed_dcsbm_graph_is_the_synthetic_model(tmp_path):
    """write_synthetic_dcsbm writes synthetic_graph's model to a graph
    directory chunk by chunk: deterministic, undirected (every edge both
    ways), homophilous, with disjoint masks, readable by GraphOnDisk."""
    import numpy as np

    from pyg_sar.datasets.synthetic_ondisk import write_synthetic_dcsbm
    from pyg_sar.partition.input.ondisk import GraphOnDisk
    a = write_synthetic_dcsbm(str(tmp_path / 'a'), 3000, 10, 8, 4, seed=1,
                              chunk_samples=1000)
    b = write_synthetic_dcsbm(str(tmp_path / 'b'), 3000, 10, 8, 4, seed=1,
                              chunk_samples=1000)
    c = write_synthetic_dcsbm(str(tmp_path / 'c'), 3000, 10, 8, 4, seed=2,
                              chunk_samples=1000)
    names = ('edge_index', 'x', 'y', 'train_mask', 'val_mask', 'test_mask')
    for name in names:
        assert np.array_equal(np.load(f'{a}/{name}.npy'),
                              np.load(f'{b}/{name}.npy')), name
    assert not np.array_equal(np.load(f'{a}/edge_index.npy'),
                              np.load(f'{c}/edge_index.npy'))
    graph = GraphOnDisk(a)
    assert graph.num_nodes == 3000 and graph.num_edges == 30000
    edge_index = torch.from_numpy(np.load(f'{a}/edge_index.npy'))
    assert is_undirected(edge_index, num_nodes=3000)
    y = torch.from_numpy(np.load(f'{a}/y.npy'))
    same = (y[edge_index[0]] == y[edge_index[1]]).float().mean()
    assert same > 0.6  # random labels over 4 classes: 0.25
    masks = torch.stack([torch.from_numpy(np.load(f'{a}/{m}.npy'))
                         for m in names[3:]])
    assert torch.equal(masks.sum(0), torch.ones(3000, dtype=torch.long))
    assert int(masks[0].sum()) == 300 and int(masks[1].sum()) == 300
    with pytest.raises(ValueError, match='even avg_degree'):
        write_synthetic_dcsbm(str(tmp_path / 'd'), 100, 3)
