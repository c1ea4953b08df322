"""Nothing on disk is trusted: the partitioner records the content hash of
every file it writes and the loader refuses a file that differs (a part
swapped in from another partitioning, a flipped byte), a path outside the
partition directory, a permutation that is none, and an older format;
dataset files that could run code when PyG unpickles them are refused; two
runs into one output folder do not both succeed; inputs that would fail at
training time are refused at partition time; ``pyg-sar info`` on a broken
manifest is one line. Every test here failed before the fix."""
import hashlib
import json
import os
import os.path as osp
import pickle
import shutil
import threading

import pytest
import torch
from torch_geometric.data import Data, HeteroData

from pyg_sar import cli, datasets, load_partition, partition_graph


def _graph(seed: int, num_nodes: int = 40) -> Data:
    r"""A graph whose structure and masks do not depend on :obj:`seed`, its
    features and labels do: partitions of two seeds are same-shaped."""
    ring = torch.arange(num_nodes)
    src = torch.cat([ring, ring, (ring * 7) % num_nodes])
    dst = torch.cat([(ring + 1) % num_nodes, (ring + 3) % num_nodes, ring])
    generator = torch.Generator().manual_seed(seed)
    return Data(x=torch.randn(num_nodes, 4, generator=generator),
                y=torch.randint(0, 3, (num_nodes, ), generator=generator),
                train_mask=ring % 2 == 0, test_mask=ring % 2 == 1,
                edge_index=torch.stack([src, dst]))


def _hetero(seed: int) -> HeteroData:
    generator = torch.Generator().manual_seed(seed)
    data = HeteroData()
    data['user'].x = torch.randn(12, 3, generator=generator)
    data['user'].y = torch.randint(0, 2, (12, ), generator=generator)
    data['user'].train_mask = torch.arange(12) < 6
    data['item'].x = torch.randn(8, 2, generator=generator)
    users = torch.arange(12)
    data['user', 'buys', 'item'].edge_index = torch.stack([users,
                                                           users % 8])
    data['user', 'follows', 'user'].edge_index = torch.stack(
        [users, (users + 1) % 12])
    return data


def _partition(data, out_dir, num_parts=2):
    return partition_graph(data, num_parts, out_dir, method='random')


def _one_line(text: str) -> str:
    assert text.count('\n') == 1 and text.endswith('\n'), text
    return text


def _rewrite_manifest(out_dir, change) -> None:
    path = osp.join(out_dir, 'pyg_sar.json')
    with open(path) as f:
        manifest = json.load(f)
    change(manifest)
    with open(path, 'w') as f:
        json.dump(manifest, f)


def _record_hash(out_dir, name: str) -> None:
    r"""Updates the manifest's content hash of :obj:`name`, as a consistent
    (but wrong) manifest would hold it."""
    with open(osp.join(out_dir, name), 'rb') as f:
        raw = f.read()

    def change(manifest):
        if 'files' in manifest:  # (format 1 had no hashes)
            manifest['files'][name] = {
                'bytes': len(raw), 'sha256': hashlib.sha256(raw).hexdigest()}
    _rewrite_manifest(out_dir, change)


# 1. Content hashes ###########################################################


def test_part_swapped_in_from_another_partitioning_is_refused(tmp_path):
    mine, other = tmp_path / 'mine', tmp_path / 'other'
    _partition(_graph(0), mine)
    _partition(_graph(1), other)  # same shape, other features and labels
    shutil.rmtree(mine / 'part_1')
    shutil.copytree(other / 'part_1', mine / 'part_1')
    load_partition(mine, 0)  # untouched part
    with pytest.raises(ValueError) as info:
        load_partition(mine, 1)
    message = str(info.value)
    assert 'part_1' in message and 'differs from the one written' in message
    assert '\n' not in message


def test_flipped_byte_is_refused(tmp_path):
    out_dir = tmp_path / 'out'
    _partition(_graph(0), out_dir)
    path = out_dir / 'part_0' / 'node_feats.pt'
    x = torch.load(path, weights_only=True)['feats']['x']
    raw = bytearray(path.read_bytes())
    offset = raw.find(x[0].numpy().tobytes())
    assert offset > 0
    raw[offset] ^= 1  # the last bit of x[0, 0]: still a valid file
    path.write_bytes(bytes(raw))
    assert not torch.equal(
        torch.load(path, weights_only=True)['feats']['x'], x)
    with pytest.raises(ValueError,
                       match=r"part_0.node_feats.pt' differs .*sha256"):
        load_partition(out_dir, 0)


def test_hetero_part_swapped_in_is_refused(tmp_path):
    mine, other = tmp_path / 'mine', tmp_path / 'other'
    _partition(_hetero(0), mine)
    _partition(_hetero(1), other)
    shutil.copy(other / 'part_0' / 'node_feats.pt',
                mine / 'part_0' / 'node_feats.pt')
    with pytest.raises(ValueError, match=r"part_0.node_feats.pt' differs"):
        load_partition(mine, 0)
    load_partition(mine, 1)


def test_manifest_records_every_file(tmp_path):
    out_dir = tmp_path / 'out'
    manifest = _partition(_hetero(0), out_dir)
    written = sorted(
        osp.relpath(osp.join(folder, name), out_dir).replace(os.sep, '/')
        for folder, _, names in os.walk(out_dir) for name in names)
    assert sorted(manifest['files']) == [n for n in written
                                         if n != 'pyg_sar.json']
    assert manifest['format_version'] == 2


def test_older_format_is_refused(tmp_path):
    out_dir = tmp_path / 'out'
    _partition(_graph(0), out_dir)

    def old(manifest):
        manifest['format_version'] = 1
        del manifest['files']
    _rewrite_manifest(out_dir, old)
    with pytest.raises(ValueError, match='format version 1.*re-partition'):
        load_partition(out_dir, 0)


def test_fingerprint_covers_the_content(tmp_path):
    r"""Ranks compare fingerprints (digest of META.json and pyg_sar.json,
    :func:`pyg_sar.graph.dist_graph.check_partition_set`): partitionings of
    same-shaped graphs must differ there, not only in their part files."""
    dirs = [tmp_path / 'a', tmp_path / 'b']
    for seed, out_dir in enumerate(dirs):
        _partition(_graph(seed), out_dir)
        _rewrite_manifest(out_dir, lambda m: m.update(time_s={}))
    first, second = (load_partition(d, 0) for d in dirs)
    assert first.fingerprint != second.fingerprint


def test_a_rank_reads_only_its_files(tmp_path):
    out_dir = tmp_path / 'out'
    _partition(_graph(0), out_dir, num_parts=3)
    # What a host of rank 1 holds on a multi-node run.
    shutil.rmtree(out_dir / 'part_0')
    shutil.rmtree(out_dir / 'part_2')
    os.remove(out_dir / 'edge_map.pt')
    assert load_partition(out_dir, 1).num_parts == 3


# 2. Paths and permutations read from the manifest ############################


@pytest.mark.parametrize('name', ['../outside.pt', '/etc/passwd',
                                  'part_0/../../outside.pt'])
def test_perm_file_outside_the_partition_is_refused(tmp_path, name):
    out_dir = tmp_path / 'out'
    _partition(_graph(0), out_dir)
    shutil.copy(out_dir / 'perm.pt', tmp_path / 'outside.pt')
    _rewrite_manifest(out_dir, lambda m: m.update(perm_file=name))
    with pytest.raises(ValueError, match='outside the partition directory'):
        load_partition(out_dir, 0)


def test_symlink_out_of_the_partition_is_refused(tmp_path):
    out_dir = tmp_path / 'out'
    _partition(_graph(0), out_dir)
    shutil.move(out_dir / 'perm.pt', tmp_path / 'perm.pt')
    os.symlink(tmp_path / 'perm.pt', out_dir / 'perm.pt')
    with pytest.raises(ValueError, match=r"'perm.pt'.*outside the partition"):
        load_partition(out_dir, 0)


def test_hetero_perm_file_outside_is_refused(tmp_path):
    out_dir = tmp_path / 'out'
    _partition(_hetero(0), out_dir)
    _rewrite_manifest(
        out_dir, lambda m: m['perm_files'].update(user='/etc/passwd'))
    with pytest.raises(ValueError, match=r"perm_files.user.*outside"):
        load_partition(out_dir, 0)


@pytest.mark.parametrize('perm', [
    torch.zeros(40, dtype=torch.long),         # all zeros
    torch.cat([torch.tensor([1]), torch.arange(1, 40)]),  # 1 twice, no 0
    torch.cat([torch.arange(39), torch.tensor([39 + 40])]),  # out of range
])
def test_perm_that_is_no_permutation_is_refused(tmp_path, perm):
    out_dir = tmp_path / 'out'
    _partition(_graph(0), out_dir)
    torch.save(perm, out_dir / 'perm.pt')
    _record_hash(out_dir, 'perm.pt')  # even with a matching hash
    with pytest.raises(ValueError, match=r"perm.pt.*'perm'"):
        load_partition(out_dir, 0)


def test_hetero_edge_perm_that_is_no_permutation_is_refused(tmp_path):
    out_dir = tmp_path / 'out'
    _partition(_hetero(0), out_dir)
    name = 'edge_perm/user__buys__item.pt'
    torch.save(torch.zeros(12, dtype=torch.long), out_dir / name)
    _record_hash(out_dir, name)
    with pytest.raises(ValueError, match="'edge_perm' is not a permutation"):
        load_partition(out_dir, 0)


# 3. Dataset files that would run code ########################################


class _Payload:
    r"""Unpickling it runs code that creates the file :obj:`marker`
    (through :obj:`builtins.exec`: torch's safe unpickler suggests
    allow-listing it, which makes PyG fall back to a full unpickle)."""
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return exec, (f'open({self.marker!r}, "w").close()', )


def _fake_cora_raw(root) -> None:
    raw = root / 'Cora' / 'raw'
    raw.mkdir(parents=True)
    for part in ('x', 'tx', 'allx', 'y', 'ty', 'ally', 'graph',
                 'test.index'):
        (raw / f'ind.cora.{part}').write_bytes(pickle.dumps(None))


@pytest.mark.parametrize('file_name', ['data.pt', 'pre_transform.pt'])
def test_crafted_processed_file_does_not_run(tmp_path, capsys, file_name):
    root, marker = tmp_path / 'data', tmp_path / 'pwned'
    _fake_cora_raw(root)
    processed = root / 'Cora' / 'processed'
    processed.mkdir()
    torch.save({'x': _Payload(str(marker))}, processed / file_name)
    try:
        code = cli.main(['partition', '--dataset', 'Cora', '--root',
                         str(root), '--num-parts', '2', '--out',
                         str(tmp_path / 'out')])
    finally:
        assert not marker.exists(), 'the crafted file ran code'
    assert code == 2
    err = _one_line(capsys.readouterr().err)
    assert file_name in err and 'weights_only=True' in err
    assert 'delete the folder' in err


def test_crafted_planetoid_raw_file_does_not_run(tmp_path):
    root, marker = tmp_path / 'data', tmp_path / 'pwned'
    _fake_cora_raw(root)
    with open(root / 'Cora' / 'raw' / 'ind.cora.x', 'wb') as f:
        pickle.dump(_Payload(str(marker)), f, protocol=2)
    try:
        with pytest.raises(ValueError,
                           match=r"ind.cora.x.*refers to .__builtin__.exec"):
            datasets.load('Cora', str(root))
    finally:
        assert not marker.exists(), 'the crafted file ran code'


def test_real_processed_files_still_load(shared_data_root):
    first = datasets.load('Cora', shared_data_root)  # processes
    again = datasets.load('Cora', shared_data_root)  # checked, then loaded
    assert torch.equal(first.x, again.x)
    datasets.load('DBLP', shared_data_root)
    dblp = datasets.load('DBLP', shared_data_root)
    assert dblp['author'].num_nodes == 4057


# 4. Two runs into one output folder ##########################################


def test_second_of_two_concurrent_runs_fails(tmp_path, monkeypatch):
    import pyg_sar.partition.write.homogeneous as homogeneous
    out_dir = tmp_path / 'out'
    reached, release = threading.Event(), threading.Event()
    real_save = homogeneous.save_file

    def slow_save(obj, path):
        # The slow run has passed its output checks and is writing.
        if threading.current_thread().name == 'slow':
            reached.set()
            assert release.wait(60)
        real_save(obj, path)

    monkeypatch.setattr(homogeneous, 'save_file', slow_save)
    outcome = {}

    def slow_run():
        try:
            outcome['manifest'] = _partition(_graph(0), out_dir)
        except BaseException as e:  # noqa: B036 (reported to the test)
            outcome['error'] = e

    slow = threading.Thread(target=slow_run, name='slow')
    slow.start()
    assert reached.wait(60)
    fast = _partition(_graph(1), out_dir)  # starts later, finishes first
    release.set()
    slow.join(60)
    assert isinstance(outcome.get('error'), FileExistsError), outcome
    assert 'no longer empty' in str(outcome['error'])
    # The first complete output is untouched, and nothing is left over.
    assert load_partition(out_dir, 0).manifest == fast
    assert sorted(os.listdir(tmp_path)) == ['out']


# 5. Inputs that would fail at training time ##################################


def test_negative_label_on_a_training_node_is_refused(tmp_path):
    data = _graph(0)
    data.y[[4, 8]] = -1  # training nodes
    with pytest.raises(ValueError, match=r"'y' holds the negative label -1 "
                       r"on 2 nodes of 'train_mask' \(first: input node 4\)"):
        _partition(data, tmp_path / 'out')
    assert os.listdir(tmp_path) == []
    data = _graph(0)
    data.y[5] = -3  # a test node
    with pytest.raises(ValueError, match="-3 on 1 nodes of 'test_mask'"):
        _partition(data, tmp_path / 'out')


def test_negative_label_outside_every_mask_is_fine(tmp_path):
    data = _graph(0)
    data.test_mask[3] = False
    data.y[3] = -1  # an unlabeled node
    _partition(data, tmp_path / 'out')
    assert int(load_partition(tmp_path / 'out', 0).manifest['num_nodes']) \
        == 40


def test_hetero_negative_label_is_refused(tmp_path):
    data = _hetero(0)
    data['user'].y[0] = -1
    with pytest.raises(ValueError, match=r"'user.y' holds the negative "
                       r"label -1 on 1 nodes of 'user.train_mask'"):
        _partition(data, tmp_path / 'out')


@pytest.mark.parametrize('key', ['train_mask', 'x', 'y'])
def test_node_attribute_with_a_row_per_edge_is_refused(tmp_path, key):
    data = _graph(0)
    num_edges = data.num_edges
    data[key] = torch.zeros(num_edges, dtype=data[key].dtype) \
        if data[key].dim() == 1 else torch.zeros(num_edges, 4)
    data.num_nodes = 40
    with pytest.raises(ValueError, match=rf"Node attribute '{key}' has "
                       rf"{num_edges} rows, one per edge"):
        _partition(data, tmp_path / 'out')


def test_edge_mask_with_a_row_per_edge_is_an_edge_attribute(tmp_path):
    data = _graph(0)
    data.train_edge_mask = torch.ones(data.num_edges, dtype=torch.bool)
    manifest = _partition(data, tmp_path / 'out')
    assert manifest['edge_attr_names'] == ['train_edge_mask']


def test_featureless_graph_is_still_partitioned(tmp_path):
    # Structure-only partitions are a feature
    # (tests/partition/test_partition.py partitions Physics without x);
    # training needs x and says so.
    data = _graph(0)
    del data.x
    data.num_nodes = 40
    _partition(data, tmp_path / 'out')
    assert 'x' not in load_partition(tmp_path / 'out', 1).node_attrs


# 6. pyg-sar info and the output path #########################################


def test_info_on_an_empty_manifest_is_one_line(tmp_path, capsys):
    (tmp_path / 'pyg_sar.json').write_text('{}')
    assert cli.main(['info', str(tmp_path)]) == 2
    assert 'pyg_sar.json' in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize('hetero', [False, True])
def test_info_names_the_missing_field(tmp_path, capsys, hetero):
    out_dir = tmp_path / 'out'
    _partition(_hetero(0) if hetero else _graph(0), out_dir)
    _rewrite_manifest(out_dir, lambda m: m.pop('edge_cut'))
    assert cli.main(['info', str(out_dir)]) == 2
    err = _one_line(capsys.readouterr().err)
    assert "field 'edge_cut' is missing" in err
    assert capsys.readouterr().out == ''

    _rewrite_manifest(out_dir, lambda m: m.update(
        edge_cut={'count': 'many', 'fraction': 0.1}))
    assert cli.main(['info', str(out_dir)]) == 2
    assert "'edge_cut.count' should be int" in capsys.readouterr().err


def test_unusable_out_fails_before_the_dataset_load(tmp_path, capsys):
    blocker = tmp_path / 'file'
    blocker.write_text('')
    code = cli.main(['partition', '--dataset', 'Cora', '--root',
                     str(tmp_path / 'no-data'), '--num-parts', '2',
                     '--out', str(blocker / 'sub' / 'out')])
    assert code == 2
    captured = capsys.readouterr()
    assert 'Loading' not in captured.out
    assert f"'{blocker}' is a file, not a directory" in \
        _one_line(captured.err)


def test_unwritable_out_fails_before_the_dataset_load(tmp_path, capsys,
                                                      monkeypatch):
    parent = tmp_path / 'locked'
    parent.mkdir()
    parent.chmod(0o500)
    if os.geteuid() == 0:  # root writes anywhere: deny this folder only
        access = os.access
        monkeypatch.setattr(os, 'access', lambda path, mode: False if
                            osp.abspath(path) == str(parent) else
                            access(path, mode))
    try:
        code = cli.main(['partition', '--dataset', 'Cora', '--root',
                         str(tmp_path / 'no-data'), '--num-parts', '2',
                         '--out', str(parent / 'sub' / 'out')])
    finally:
        parent.chmod(0o700)
    assert code == 2
    captured = capsys.readouterr()
    assert 'Loading' not in captured.out
    assert f"'{parent}' is not writable" in _one_line(captured.err)
