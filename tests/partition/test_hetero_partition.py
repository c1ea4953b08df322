import json
import math
import os
import os.path as osp

import pytest
import torch
from torch_geometric.data import HeteroData
from torch_geometric.distributed import LocalFeatureStore, LocalGraphStore

from pyg_sar import (HeteroPartition, Partition, cli, datasets,
                     load_partition, partition_graph)
from pyg_sar.partition.assign.in_memory import TYPE_BALANCE_TOLERANCE
from pyg_sar.datasets.synthetic_hetero import synthetic_hetero_graph

FOLLOWS = ('user', 'follows', 'user')
BUYS = ('user', 'buys', 'item')
TAGGED = ('item', 'tagged', 'tag')


def _handcrafted() -> HeteroData:
    r"""Every corner case at once: a node type without attributes
    ('item'), directed edges with self loops and duplicates (FOLLOWS),
    isolated nodes (users 18, 19, items 9, 10, tag 5), node and edge
    attributes of several shapes and dtypes, node and edge times."""
    generator = torch.Generator().manual_seed(3)
    data = HeteroData()
    data['user'].x = torch.randn(20, 4, generator=generator)
    data['user'].y = torch.arange(20) % 3
    data['user'].train_mask = torch.arange(20) % 2 == 0
    data['user'].time = torch.arange(20) * 10
    data['item'].num_nodes = 11
    data['tag'].x = torch.randn(6, 2, generator=generator).double()
    data['tag'].score = torch.randn(6, 2, 2, generator=generator)
    follows = torch.tensor([[0, 1, 2, 3, 3, 3, 4, 5, 5, 6, 7, 8, 9, 10, 11,
                             12, 13, 14, 15, 16, 17, 1, 0],
                            [1, 2, 3, 3, 4, 4, 5, 5, 0, 7, 8, 9, 10, 11, 12,
                             13, 14, 15, 16, 17, 0, 2, 1]])
    data[FOLLOWS].edge_index = follows
    data[FOLLOWS].edge_attr = torch.randn(follows.size(1), 3,
                                          generator=generator)
    data[FOLLOWS].time = torch.arange(follows.size(1)) + 100
    buys = torch.tensor([[0, 2, 4, 6, 8, 10, 12, 14, 16, 1, 3, 0],
                         [0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 0]])
    data[BUYS].edge_index = buys
    data[BUYS].edge_weight = torch.rand(buys.size(1), generator=generator)
    data[TAGGED].edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8],
                                            [0, 1, 2, 3, 4, 0, 1, 2, 3]])
    data.num_classes = 3
    return data


@pytest.fixture(scope='module')
def handcrafted() -> HeteroData:
    return _handcrafted()


@pytest.fixture(scope='module')
def synthetic() -> HeteroData:
    data = synthetic_hetero_graph(300, num_features=6, num_classes=4, seed=2)
    data['author', 'writes', 'paper'].edge_attr = torch.randn(
        data['author', 'writes', 'paper'].num_edges, 2)
    return data


def _dst_ids(store) -> torch.Tensor:
    counts = store.csc_ptr[1:] - store.csc_ptr[:-1]
    return torch.repeat_interleave(store.dst_ids, counts)


def _check_round_trip(data: HeteroData, out_dir: str, num_parts: int):
    r"""Every node attribute at `orig_ids`, every edge once with its
    attributes, per-type contiguous ids, CSC order; returns the parts."""
    parts = [load_partition(out_dir, i) for i in range(num_parts)]
    assert all(isinstance(p, HeteroPartition) and p.is_hetero
               for p in parts)
    assert len({p.fingerprint for p in parts}) == 1
    assert parts[0].metadata() == (data.node_types, data.edge_types)

    perm = {}
    for t in data.node_types:
        num = data[t].num_nodes
        ptr = parts[0][t].node_ptr
        assert ptr[0] == 0 and ptr[-1] == num and ptr.numel() == num_parts + 1
        orig = []
        for i, part in enumerate(parts):
            store = part[t]
            assert torch.equal(store.node_ptr, ptr)
            assert store.num_nodes == num
            assert torch.equal(store.node_ids,
                               torch.arange(int(ptr[i]), int(ptr[i + 1])))
            # Stable relabeling: input order inside a part.
            assert bool((store.orig_ids[1:] > store.orig_ids[:-1]).all())
            expected = [k for k, v in data[t].items()
                        if torch.is_tensor(v) and v.dim() > 0]
            assert sorted(store.node_attrs) == sorted(expected), t
            for key in expected:
                assert torch.equal(store.node_attrs[key],
                                   data[t][key][store.orig_ids]), (t, key)
                assert torch.equal(getattr(store, key),
                                   store.node_attrs[key])
            orig.append(store.orig_ids)
        perm[t] = torch.cat(orig)
        assert torch.equal(perm[t].sort().values, torch.arange(num))

    for e in data.edge_types:
        src, _, dst = e
        edge_index = data[e].edge_index
        num = edge_index.size(1)
        ptr = parts[0][e].edge_ptr
        assert ptr[0] == 0 and ptr[-1] == num
        orig_eids = []
        for i, part in enumerate(parts):
            store = part[e]
            assert part['__'.join(e)] is store
            assert store.num_edges == num
            assert torch.equal(store.csc_eid,
                               torch.arange(int(ptr[i]), int(ptr[i + 1])))
            assert store.csc_ptr.numel() == part[dst].num_local_nodes + 1
            assert int(store.csc_ptr[-1]) == store.num_local_edges
            new_dst = _dst_ids(store)
            assert torch.equal(store.edge_index,
                               torch.stack([store.csc_src, new_dst]))
            # CSC order: by destination, then source; stable on duplicates.
            key = new_dst * data[src].num_nodes + store.csc_src
            assert bool((key[1:] >= key[:-1]).all())
            same = key[1:] == key[:-1]
            assert bool((store.orig_eids[1:][same] >
                         store.orig_eids[:-1][same]).all())
            # Mapped back to input ids, these are the input edges.
            assert torch.equal(
                torch.stack([perm[src][store.csc_src], perm[dst][new_dst]]),
                edge_index[:, store.orig_eids]), e
            expected = [k for k, v in data[e].items()
                        if torch.is_tensor(v) and k != 'edge_index']
            assert sorted(store.edge_attrs) == sorted(expected), e
            for key in expected:
                assert torch.equal(store.edge_attrs[key],
                                   data[e][key][store.orig_eids]), (e, key)
            orig_eids.append(store.orig_eids)
        assert torch.equal(torch.cat(orig_eids).sort().values,
                           torch.arange(num))
    return parts


def _check_pyg_stores(out_dir: str, parts) -> None:
    r"""PyG's stores read the same edges, edge ids and attributes."""
    for i, part in enumerate(parts):
        graph_store = LocalGraphStore.from_partition(out_dir, i)
        feature_store = LocalFeatureStore.from_partition(out_dir, i)
        attrs = {a.edge_type: a for a in graph_store.get_all_edge_attrs()}
        assert sorted(attrs) == sorted(part.edge_types)
        for e in part.edge_types:
            store = part[e]
            assert torch.equal(graph_store.get_edge_index(attrs[e]),
                               store.edge_index)
            assert torch.equal(graph_store.get_edge_id(attrs[e]),
                               store.csc_eid)
            for key, value in store.edge_attrs.items():
                if store.num_local_edges:
                    assert torch.equal(
                        feature_store.get_tensor(group_name=e,
                                                 attr_name=key), value)
        for t in part.node_types:
            store = part[t]
            if store.num_local_nodes == 0:
                continue
            assert torch.equal(feature_store.get_global_id(group_name=t),
                               store.node_ids)
            for key, value in store.node_attrs.items():
                assert torch.equal(
                    feature_store.get_tensor(group_name=t, attr_name=key),
                    value), (t, key)
                # Lookup by new per-type id, as PyG's samplers do it.
                assert torch.equal(
                    feature_store.get_tensor_from_global_id(
                        group_name=t, attr_name=key,
                        index=store.node_ids.flip(0)), value.flip(0))


def _check_balance(data: HeteroData, manifest, num_parts: int) -> None:
    for t in data.node_types:
        counts = torch.tensor(manifest['node_ptr'][t]).diff()
        assert [p['num_nodes_dict'][t] for p in manifest['parts']] == \
            counts.tolist()
        num = data[t].num_nodes
        target = num / num_parts
        assert int(counts.max()) <= math.floor(
            target * (1 + TYPE_BALANCE_TOLERANCE) + 1), (t, counts)
        if num >= num_parts:
            assert int(counts.min()) >= 1, (t, counts)
        if 'train_mask' in data[t]:
            train = torch.tensor(
                [p['num_train_nodes'][t] for p in manifest['parts']])
            assert int(train.sum()) == int(data[t].train_mask.sum())
            mean = float(train.sum()) / num_parts
            assert int(train.max()) <= math.floor(mean * 1.05 + 1), train


# Round trips #################################################################


@pytest.mark.parametrize('num_parts', [1, 2, 3])
@pytest.mark.parametrize('method', ['metis', 'random'])
def test_handcrafted_round_trip(handcrafted, tmp_path, num_parts, method):
    out_dir = str(tmp_path / 'parts')
    manifest = partition_graph(handcrafted, num_parts, out_dir,
                               method=method)
    parts = _check_round_trip(handcrafted, out_dir, num_parts)
    _check_pyg_stores(out_dir, parts)
    _check_balance(handcrafted, manifest, num_parts)
    assert manifest['source']['graph_attrs'] == {'num_classes': 3}
    assert manifest['node_attr_names']['item'] == []
    assert all(p['item'].node_attrs == {} for p in parts)
    assert parts[0]['tag'].x.dtype == torch.float64
    assert parts[-1][FOLLOWS].time.dtype == torch.int64
    with open(osp.join(out_dir, 'META.json')) as f:
        meta = json.load(f)
    assert meta == {
        'num_parts': num_parts,
        'node_types': ['user', 'item', 'tag'],
        'edge_types': [list(FOLLOWS), list(BUYS), list(TAGGED)],
        'node_offset': [0, 20, 31],
        'is_hetero': True,
        'is_sorted': True,
    }


@pytest.mark.parametrize('num_parts', [1, 2, 3])
def test_synthetic_round_trip(synthetic, tmp_path, num_parts):
    out_dir = str(tmp_path / 'parts')
    manifest = partition_graph(synthetic, num_parts, out_dir)
    parts = _check_round_trip(synthetic, out_dir, num_parts)
    _check_pyg_stores(out_dir, parts)
    _check_balance(synthetic, manifest, num_parts)
    assert set(parts[0].x_dict) == set(parts[0].y_dict) == {'paper'}
    assert parts[0].num_nodes_dict == synthetic.num_nodes_dict
    assert parts[0]['author', 'writes', 'paper'].edge_attr.size(1) == 2
    assert manifest['num_edges'] == synthetic.num_edges
    assert sum(p['num_edges'] for p in manifest['parts']) == \
        synthetic.num_edges
    with open(osp.join(out_dir, 'pyg_sar.json')) as f:
        assert json.load(f) == manifest


def test_every_type_balanced_where_metis_is_not(tmp_path):
    r"""Two node types in two disconnected chains: METIS alone puts each
    type into one part; the per-type pass must split both."""
    data = HeteroData()
    data['a'].x = torch.randn(60, 2)
    data['b'].num_nodes = 60
    chain = torch.stack([torch.arange(59), torch.arange(1, 60)])
    data['a', 'next', 'a'].edge_index = chain
    data['b', 'next', 'b'].edge_index = chain
    manifest = partition_graph(data, 2, tmp_path / 'parts')
    assert manifest['type_moves'] > 0
    _check_balance(data, manifest, 2)
    _check_round_trip(data, str(tmp_path / 'parts'), 2)


def test_train_balance_keeps_types_balanced(tmp_path):
    r"""All training nodes of type 'a' on one side of the METIS cut: the
    training-node pass must swap them for non-training nodes of type 'a',
    not for the (cheaper to move) nodes of type 'b'."""
    data = HeteroData()
    data['a'].x = torch.randn(60, 2)
    data['a'].train_mask = torch.arange(60) < 30
    data['b'].num_nodes = 60
    data['a', 'next', 'a'].edge_index = torch.stack(
        [torch.arange(59), torch.arange(1, 60)])
    data['b', 'of', 'a'].edge_index = torch.arange(60).repeat(2, 1)
    manifest = partition_graph(data, 2, tmp_path / 'parts')
    assert manifest['train_swaps'] > 0
    _check_balance(data, manifest, 2)


def test_dblp(shared_data_root, tmp_path):
    data = datasets.load('DBLP', shared_data_root)
    out_dir = str(tmp_path / 'dblp')
    manifest = partition_graph(data, 3, out_dir)
    parts = _check_round_trip(data, out_dir, 3)
    _check_balance(data, manifest, 3)
    _check_pyg_stores(out_dir, parts[:1])
    assert manifest['edge_cut']['fraction'] < 0.5


# Command line ################################################################


def test_cli_partition_and_info(tmp_path, capsys):
    out_dir = str(tmp_path / 'parts')
    assert cli.main([
        'partition', '--dataset', 'synthetic-hetero', '--num-nodes', '200',
        '--num-features', '4', '--num-parts', '2', '--out', out_dir
    ]) == 0
    printed = capsys.readouterr().out
    assert 'paper__cites__paper' in printed and 'field_of_study' in printed
    part = load_partition(out_dir, 1)
    assert isinstance(part, HeteroPartition)
    assert part['paper'].num_nodes == 200 and part['paper'].x.size(1) == 4

    assert cli.main(['info', out_dir]) == 0
    printed = capsys.readouterr().out
    assert 'node types' in printed and 'author__writes__paper' in printed
    assert 'halo nodes' in printed
    assert cli.main(['info', out_dir, '--json']) == 0
    assert json.loads(capsys.readouterr().out)['is_hetero'] is True

    assert cli.main([
        'partition', '--dataset', 'synthetic-hetero', '--avg-degree', '3',
        '--num-parts', '2', '--out', str(tmp_path / 'other')
    ]) == 2
    assert '--avg-degree' in capsys.readouterr().err


# Bad input ###################################################################


def _mutated(change) -> HeteroData:
    data = _handcrafted()
    change(data)
    return data


def _set(store_key, attr, value):
    return lambda data: setattr(data[store_key], attr, value)


@pytest.mark.parametrize('change, error, match', [
    (_set('user', 'label', torch.arange(3)), ValueError,
     r"Node type 'user': attribute 'label' has shape \[3\]"),
    (_set(FOLLOWS, 'weight', torch.rand(4)), ValueError,
     r"Edge type \('user', 'follows', 'user'\): attribute 'weight' has "
     r"shape \[4\]"),
    (_set(BUYS, 'edge_index', torch.tensor([[0], [11]])), ValueError,
     r"destination node id 11, outside .*\[0, 10\].*'item'"),
    (_set(BUYS, 'edge_index', torch.tensor([[-1], [0]])), ValueError,
     r"source node id -1.*'user'"),
    (_set(TAGGED, 'edge_index', torch.tensor([[0.], [1.]])), ValueError,
     r"data\[\('item', 'tagged', 'tag'\)\].edge_index' must have dtype"),
    (_set(('user', 'likes', 'ghost'), 'edge_index',
          torch.tensor([[0], [0]])), ValueError,
     r"refers to node type 'ghost'"),
    (_set('user', 'x', torch.full((20, 4), float('nan'))), ValueError,
     r"'user.x' has NaN"),
    (_set(FOLLOWS, 'edge_attr', torch.full((23, 3), float('inf'))),
     ValueError, r"'user__follows__user.edge_attr' has inf"),
])
def test_bad_input(tmp_path, change, error, match):
    with pytest.raises(error, match=match):
        partition_graph(_mutated(change), 2, tmp_path / 'out')
    assert os.listdir(tmp_path) == []


def test_bad_num_parts_and_allow_non_finite(tmp_path):
    with pytest.raises(ValueError, match=r'num_parts.*37.*got 38'):
        partition_graph(_handcrafted(), 38, tmp_path / 'out')
    data = _mutated(_set('tag', 'x', torch.full((6, 2), float('nan'))))
    partition_graph(data, 2, tmp_path / 'out', allow_non_finite=True)
    assert torch.isnan(load_partition(tmp_path / 'out', 0)['tag'].x).all()


def test_loader_errors(handcrafted, tmp_path):
    out_dir = tmp_path / 'parts'
    partition_graph(handcrafted, 2, out_dir)
    part = load_partition(out_dir, 0)
    assert part.is_hetero and Partition.is_hetero is False
    with pytest.raises(KeyError, match="'movie' is neither"):
        part['movie']
    with pytest.raises(ValueError, match=r'rank.*\[0, 1\].*got 2'):
        load_partition(out_dir, 2)

    (out_dir / 'part_1' / 'graph.pt').write_bytes(b'garbage')
    with pytest.raises(ValueError, match='part_1.graph.pt.*corrupt'):
        load_partition(out_dir, 1)
    os.remove(out_dir / 'perm' / 'item.pt')
    with pytest.raises(FileNotFoundError, match='perm.item.pt'):
        load_partition(out_dir, 0)

    partition_graph(handcrafted, 2, out_dir, overwrite=True)
    node_feats = torch.load(out_dir / 'part_0' / 'node_feats.pt',
                            weights_only=True)
    node_feats['user']['feats'].pop('y')
    torch.save(node_feats, out_dir / 'part_0' / 'node_feats.pt')
    with pytest.raises(ValueError, match="node_feats.pt.*'user'.*attributes"):
        load_partition(out_dir, 0)

    meta = json.loads((out_dir / 'META.json').read_text())
    meta['node_types'] = ['user', 'tag', 'item']
    (out_dir / 'META.json').write_text(json.dumps(meta))
    with pytest.raises(ValueError, match='META.json.*node/edge types'):
        load_partition(out_dir, 1)


def test_failed_run_leaves_nothing(handcrafted, tmp_path, monkeypatch):
    import pyg_sar.partition.write.heterogeneous as hetero_module
    out_dir = tmp_path / 'out'
    partition_graph(handcrafted, 2, out_dir)
    before = sorted(os.listdir(out_dir))

    def failing_save(obj, path):
        if osp.basename(path) == 'node_feats.pt':  # after some files
            raise OSError('disk full')
        torch.save(obj, path)

    monkeypatch.setattr(hetero_module, 'save_file', failing_save)
    with pytest.raises(OSError, match='disk full'):
        partition_graph(handcrafted, 3, out_dir, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ['out']
    assert sorted(os.listdir(out_dir)) == before
    assert load_partition(out_dir, 1).num_parts == 2
