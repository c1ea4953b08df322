import json
import os
import os.path as osp

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.distributed import LocalFeatureStore, LocalGraphStore

import pyg_sar.partition.write.homogeneous as partition_module
from pyg_sar import Partition, datasets, load_partition, partition_graph


@pytest.fixture(scope='module')
def graph() -> Data:
    data = datasets.synthetic_graph(3000, 12, 8, 4, seed=1)
    # Extra attributes of every kind that must survive partitioning.
    data.edge_attr = torch.randn(data.num_edges, 3)
    data.edge_weight = torch.rand(data.num_edges)
    data.node_score = torch.randn(data.num_nodes, 2, 2).double()
    data.num_classes = 4
    return data


@pytest.fixture(scope='module')
def parted(graph, tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp('parted') / 'parts')
    manifest = partition_graph(graph, 4, out_dir)
    return out_dir, manifest


def _leftovers(parent) -> list:
    return [name for name in os.listdir(parent) if name.startswith('.')]


def test_manifest(graph, parted):
    out_dir, manifest = parted
    with open(osp.join(out_dir, 'pyg_sar.json')) as f:
        assert json.load(f) == manifest
    assert manifest['num_parts'] == 4
    assert manifest['num_nodes'] == graph.num_nodes
    assert manifest['num_edges'] == graph.num_edges
    assert sum(p['num_nodes'] for p in manifest['parts']) == graph.num_nodes
    assert sum(p['num_edges'] for p in manifest['parts']) == graph.num_edges
    assert manifest['node_ptr'][-1] == graph.num_nodes
    assert manifest['node_attr_names'] == [
        'x', 'y', 'train_mask', 'val_mask', 'test_mask', 'node_score'
    ]
    assert manifest['edge_attr_names'] == ['edge_attr', 'edge_weight']
    assert manifest['source']['graph_attrs'] == {'num_classes': 4}
    assert manifest['source']['node_attrs']['node_score'] == {
        'shape': [graph.num_nodes, 2, 2],
        'dtype': 'torch.float64'
    }
    train = [p['num_train_nodes'] for p in manifest['parts']]
    assert sum(train) == int(graph.train_mask.sum())
    assert manifest['balance']['train_max_over_mean'] <= 1.1
    assert manifest['balance']['nodes_max_over_mean'] <= 1.1

    with open(osp.join(out_dir, 'META.json')) as f:
        assert json.load(f) == {
            'num_parts': 4,
            'node_types': None,
            'edge_types': None,
            'node_offset': None,
            'is_hetero': False,
            'is_sorted': True,
        }


def test_metis_beats_random_on_synthetic(graph, tmp_path):
    metis = partition_graph(graph, 4, tmp_path / 'metis')
    random = partition_graph(graph, 4, tmp_path / 'random', method='random')
    assert metis['edge_cut']['count'] * 3 < random['edge_cut']['count']
    assert random['balance']['nodes_max_over_mean'] <= 1.01
    assert random['balance']['train_max_over_mean'] <= 1.01


def test_pyg_stores_load_every_part(graph, parted):
    out_dir, manifest = parted
    node_ptr = manifest['node_ptr']
    for i in range(4):
        graph_store = LocalGraphStore.from_partition(out_dir, i)
        feature_store = LocalFeatureStore.from_partition(out_dir, i)
        (attr, ) = graph_store.get_all_edge_attrs()
        edge_index = graph_store.get_edge_index(attr)
        assert edge_index.size(1) == manifest['parts'][i]['num_edges']
        assert int(edge_index[1].min()) >= node_ptr[i]
        assert int(edge_index[1].max()) < node_ptr[i + 1]
        names = {a.attr_name for a in feature_store.get_all_tensor_attrs()}
        assert set(manifest['node_attr_names']) <= names
        assert set(manifest['edge_attr_names']) <= names
        x = feature_store.get_tensor(group_name=None, attr_name='x')
        assert x.size(0) == manifest['parts'][i]['num_nodes']
        assert torch.equal(
            feature_store.get_global_id(group_name=None),
            torch.arange(node_ptr[i], node_ptr[i + 1]))


def test_round_trip(graph, parted):
    out_dir, manifest = parted
    parts = [load_partition(out_dir, i) for i in range(4)]
    perm = torch.load(osp.join(out_dir, 'perm.pt'), weights_only=True)
    assert torch.equal(perm.sort().values, torch.arange(graph.num_nodes))
    assert len({p.fingerprint for p in parts}) == 1

    # Node attributes: concatenating the parts gives the permuted input.
    for key in manifest['node_attr_names']:
        joined = torch.cat([p.node_attrs[key] for p in parts])
        assert torch.equal(joined, graph[key][perm]), key
        assert torch.equal(getattr(parts[0], key), parts[0].node_attrs[key])
    assert torch.equal(torch.cat([p.orig_ids for p in parts]), perm)

    # Edges: mapped back through `perm` they are exactly the input edges,
    # with edge attributes in the same order.
    new_id = torch.empty_like(perm)
    new_id[perm] = torch.arange(graph.num_nodes)
    edge_index = torch.cat([p.edge_index for p in parts], dim=1)
    eid = torch.cat([p.csc_eid for p in parts])
    assert torch.equal(eid, torch.arange(graph.num_edges))
    expected = new_id[graph.edge_index]
    key = expected[1] * graph.num_nodes + expected[0]
    order = torch.sort(key, stable=True).indices
    assert torch.equal(edge_index, expected[:, order])
    for name in manifest['edge_attr_names']:
        joined = torch.cat([p.edge_attrs[name] for p in parts])
        assert torch.equal(joined, graph[name][order]), name
    # The input edge id of every stored edge (the loaders' dataset e_id).
    orig_eids = torch.cat([p.orig_eids for p in parts])
    assert torch.equal(orig_eids, order)
    assert torch.equal(perm[edge_index], graph.edge_index[:, orig_eids])


def test_partition_contract(graph, parted):
    out_dir, manifest = parted
    part = load_partition(out_dir, 2)
    assert isinstance(part, Partition)
    start, end = manifest['node_ptr'][2], manifest['node_ptr'][3]
    assert part.rank == 2 and part.num_parts == 4
    assert part.num_nodes == graph.num_nodes
    assert part.num_edges == graph.num_edges
    assert torch.equal(part.node_ptr, torch.tensor(manifest['node_ptr']))
    assert torch.equal(part.node_ids, torch.arange(start, end))
    assert part.node_map.numel() == graph.num_nodes
    assert torch.equal(part.node_map[start:end],
                       torch.full((end - start, ), 2))
    assert part.num_local_nodes == end - start
    assert part.csc_ptr.numel() == part.num_local_nodes + 1
    assert int(part.csc_ptr[-1]) == part.num_local_edges
    assert part.csc_src.numel() == part.csc_eid.numel()
    # Within each destination the sources are ascending.
    dst = part.edge_index[1]
    key = dst * graph.num_nodes + part.csc_src
    assert bool((key[1:] >= key[:-1]).all())
    assert part.x.shape == (part.num_local_nodes, 8)
    assert part.edge_attr.shape == (part.num_local_edges, 3)
    assert part.node_attr_names[:2] == ['x', 'y']
    assert part.edge_attr_names == ['edge_attr', 'edge_weight']
    assert torch.equal(part.y, graph.y[part.orig_ids])
    assert len(part.fingerprint) == 64


def test_deterministic(graph, tmp_path):
    first = partition_graph(graph, 3, tmp_path / 'a', seed=5)
    second = partition_graph(graph, 3, tmp_path / 'b', seed=5)
    assert first['node_ptr'] == second['node_ptr']
    assert first['edge_cut'] == second['edge_cut']
    perm_a = torch.load(tmp_path / 'a' / 'perm.pt', weights_only=True)
    perm_b = torch.load(tmp_path / 'b' / 'perm.pt', weights_only=True)
    assert torch.equal(perm_a, perm_b)


def test_single_part_and_edgeless(tmp_path):
    data = Data(x=torch.randn(5, 2), edge_index=torch.tensor([[0, 1],
                                                               [1, 0]]))
    manifest = partition_graph(data, 1, tmp_path / 'one')
    assert manifest['node_ptr'] == [0, 5]
    assert manifest['edge_cut']['count'] == 0
    part = load_partition(tmp_path / 'one', 0)
    assert torch.equal(part.x, data.x[part.orig_ids])

    edgeless = Data(x=torch.randn(6, 2),
                    edge_index=torch.empty(2, 0, dtype=torch.long))
    manifest = partition_graph(edgeless, 3, tmp_path / 'edgeless')
    assert manifest['node_ptr'] == [0, 2, 4, 6]
    assert load_partition(tmp_path / 'edgeless', 2).num_local_edges == 0


def test_no_empty_parts_on_tiny_graphs(tmp_path):
    # METIS leaves parts empty on tiny graphs (here a 4-node star into 3),
    # which PyG's stores cannot load; the partitioner fills them.
    data = Data(x=torch.arange(4.).view(-1, 1), y=torch.arange(4),
                edge_index=torch.tensor([[0, 0, 0, 1, 2, 3],
                                         [1, 2, 3, 0, 0, 0]]))
    out_dir = str(tmp_path / 'tiny')
    manifest = partition_graph(data, 3, out_dir)
    sizes = [p['num_nodes'] for p in manifest['parts']]
    assert sum(sizes) == 4 and min(sizes) >= 1
    for i in range(3):
        part = load_partition(out_dir, i)
        assert part.num_local_nodes == sizes[i]
        assert part.x.shape == (sizes[i], 1)
        assert part.csc_ptr.numel() == sizes[i] + 1
        LocalGraphStore.from_partition(out_dir, i)
        LocalFeatureStore.from_partition(out_dir, i)
    joined = torch.cat([load_partition(out_dir, i).y for i in range(3)])
    assert sorted(joined.tolist()) == [0, 1, 2, 3]


# Bad input ###################################################################


def _small_graph() -> Data:
    return Data(x=torch.randn(4, 3), y=torch.arange(4),
                edge_index=torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]))


@pytest.mark.parametrize('num_parts', [0, -1, 5])
def test_bad_num_parts(tmp_path, num_parts):
    with pytest.raises(ValueError, match=rf'num_parts.*got {num_parts}'):
        partition_graph(_small_graph(), num_parts, tmp_path / 'out')
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize('edge_index, match', [
    (torch.tensor([[0, 1], [1, 4]]), 'node id 4'),
    (torch.tensor([[0, -1], [1, 2]]), 'node id -1'),
    (torch.tensor([[0., 1.], [1., 2.]]), 'dtype torch.int64'),
    (torch.tensor([[0, 1], [1, 2], [2, 3]]), r'shape \[2, num_edges\]'),
])
def test_bad_edge_index(tmp_path, edge_index, match):
    data = _small_graph()
    data.edge_index = edge_index
    with pytest.raises(ValueError, match=match):
        partition_graph(data, 2, tmp_path / 'out')
    assert os.listdir(tmp_path) == []


def test_bad_attribute(tmp_path):
    data = _small_graph()
    data.label = torch.arange(3)
    with pytest.raises(ValueError, match=r"'label' has shape \[3\]"):
        partition_graph(data, 2, tmp_path / 'out')
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="method 'spectral'"):
        partition_graph(_small_graph(), 2, tmp_path / 'out',
                        method='spectral')


def test_out_dir_rules(tmp_path):
    out_dir = tmp_path / 'out'
    out_dir.mkdir()
    (out_dir / 'notes.txt').write_text('keep me')
    with pytest.raises(FileExistsError, match='not empty'):
        partition_graph(_small_graph(), 2, out_dir)
    # A folder that is not a partition is never deleted.
    with pytest.raises(FileExistsError, match='not a partition'):
        partition_graph(_small_graph(), 2, out_dir, overwrite=True)
    assert os.listdir(out_dir) == ['notes.txt']
    assert _leftovers(tmp_path) == []

    empty_dir = tmp_path / 'empty'
    empty_dir.mkdir()
    partition_graph(_small_graph(), 2, empty_dir)
    first = load_partition(empty_dir, 0).fingerprint
    partition_graph(_small_graph(), 1, empty_dir, overwrite=True)
    second = load_partition(empty_dir, 0)
    assert second.num_parts == 1 and second.fingerprint != first
    assert not osp.exists(empty_dir / 'part_1')
    assert _leftovers(tmp_path) == []


def test_failed_run_leaves_nothing(tmp_path, monkeypatch):
    out_dir = tmp_path / 'out'
    partition_graph(_small_graph(), 2, out_dir)
    before = sorted(os.listdir(out_dir))

    def failing_save(obj, path):
        if osp.basename(path) == 'edge_feats.pt':  # after some files
            raise OSError('disk full')
        torch.save(obj, path)

    monkeypatch.setattr(partition_module, 'save_file', failing_save)
    with pytest.raises(OSError, match='disk full'):
        partition_graph(_small_graph(), 2, out_dir, overwrite=True)
    with pytest.raises(OSError, match='disk full'):
        partition_graph(_small_graph(), 2, tmp_path / 'new')
    assert not osp.exists(tmp_path / 'new')
    assert _leftovers(tmp_path) == []
    # The old partition is untouched.
    assert sorted(os.listdir(out_dir)) == before
    assert load_partition(out_dir, 1).num_parts == 2


def test_load_errors(tmp_path):
    out_dir = tmp_path / 'out'
    partition_graph(_small_graph(), 2, out_dir)
    with pytest.raises(ValueError, match=r'rank.*\[0, 1\].*got 2'):
        load_partition(out_dir, 2)
    with pytest.raises(FileNotFoundError, match='does not exist'):
        load_partition(tmp_path / 'missing', 0)

    os.remove(out_dir / 'part_1' / 'node_feats.pt')
    with pytest.raises(FileNotFoundError, match='part_1.node_feats.pt'):
        load_partition(out_dir, 1)
    load_partition(out_dir, 0)  # other parts still load

    (out_dir / 'part_0' / 'graph.pt').write_bytes(b'not a torch file')
    with pytest.raises(ValueError, match='part_0.graph.pt.*corrupt'):
        load_partition(out_dir, 0)

    meta_path = out_dir / 'META.json'
    meta = json.loads(meta_path.read_text())
    meta['num_parts'] = 3
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match='META.json.*num_parts=3'):
        load_partition(out_dir, 0)

    meta_path.write_text('{broken')
    with pytest.raises(ValueError, match='META.json.*corrupt'):
        load_partition(out_dir, 0)


def test_load_detects_count_mismatch(tmp_path):
    out_dir = tmp_path / 'out'
    partition_graph(_small_graph(), 2, out_dir)
    path = out_dir / 'part_0' / 'node_feats.pt'
    node_feats = torch.load(path, weights_only=True)
    node_feats['feats']['x'] = node_feats['feats']['x'][:-1]
    torch.save(node_feats, path)
    with pytest.raises(ValueError, match=r"node_feats.pt.*'x' has"):
        load_partition(out_dir, 0)


# Real data ###################################################################


def test_physics_metis_vs_random(shared_data_root, tmp_path):
    data = datasets.load('Physics', shared_data_root)
    # Only the structure matters here; the 34k x 8415 features would make
    # the test write a gigabyte.
    graph = Data(edge_index=data.edge_index, y=data.y,
                 train_mask=data.train_mask, num_nodes=data.num_nodes)
    metis = partition_graph(graph, 4, tmp_path / 'metis')
    random = partition_graph(graph, 4, tmp_path / 'random', method='random')
    assert metis['edge_cut']['count'] * 3 <= random['edge_cut']['count']
    assert metis['balance']['nodes_max_over_mean'] <= 1.1
    assert sum(p['num_train_nodes'] for p in metis['parts']) == 100


def test_cora_round_trip(shared_data_root, tmp_path):
    data = datasets.load('Cora', shared_data_root)
    manifest = partition_graph(data, 3, tmp_path / 'cora')
    perm = torch.load(tmp_path / 'cora' / 'perm.pt', weights_only=True)
    parts = [load_partition(tmp_path / 'cora', i) for i in range(3)]
    for key in ('x', 'y', 'train_mask', 'val_mask', 'test_mask'):
        assert torch.equal(torch.cat([p.node_attrs[key] for p in parts]),
                           data[key][perm])
    assert manifest['edge_cut']['fraction'] < 0.2
