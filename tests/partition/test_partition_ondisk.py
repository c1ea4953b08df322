"""Out-of-core partitioning (issue #27): graphs on disk, the streamed shard
writer, K parallel writers, and the checks of on-disk inputs."""
import hashlib
import json
import os
import os.path as osp
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

from _dist import run_workers
from _graphs import hard_graph
from pyg_sar.partition import load_partition, partition_graph
from pyg_sar.partition.digest import _files_below
from pyg_sar.partition.write.homogeneous import write_homogeneous
from pyg_sar.partition.layout import MANIFEST_FILE
from pyg_sar.partition.input.ondisk import (GraphOnDisk, save_graph,
                                     write_synthetic_graph)
from pyg_sar.partition.write.stream_save import StreamedSave

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow


def _digests(root):
    r"""sha256 of every file of a partition but the manifest (which holds
    timings)."""
    return {rel: hashlib.sha256(open(path, 'rb').read()).hexdigest()
            for rel, path in _files_below(str(root), [MANIFEST_FILE]).items()}


def _graph():
    data = hard_graph(300, seed=5)
    gen = torch.Generator().manual_seed(0)
    data.val_mask = torch.rand(data.num_nodes, generator=gen) < 0.2
    data.h = torch.randn(data.num_nodes, 2, generator=gen).half()
    return data


@pytest.mark.parametrize('chunks', [3, 7])
def test_streamed_save_is_torch_save(tmp_path, chunks):
    gen = torch.Generator().manual_seed(chunks)
    obj = {'edge_id': torch.arange(1000), 'row': torch.randint(
        0, 9, (1000, ), generator=gen), 'col': torch.empty(0, dtype=torch.long),
        'size': (3, 3), 'feats': {'x': torch.randn(1000, 3, generator=gen),
                                  'm': torch.rand(1000, generator=gen) > .5,
                                  'e': torch.empty(0, 4)}}
    (tmp_path / 'a').mkdir()
    (tmp_path / 'b').mkdir()
    torch.save(obj, tmp_path / 'a' / 'g.pt')
    template = {'edge_id': torch.empty(1000, dtype=torch.long),
                'row': torch.empty(1000, dtype=torch.long),
                'col': torch.empty(0, dtype=torch.long), 'size': (3, 3),
                'feats': {'x': torch.empty(1000, 3),
                          'm': torch.empty(1000, dtype=torch.bool),
                          'e': torch.empty(0, 4)}}
    values = [obj['edge_id'], obj['row'], obj['col'], obj['feats']['x'],
              obj['feats']['m'], obj['feats']['e']]
    path = str(tmp_path / 'b' / 'g.pt')
    with StreamedSave(template, path) as out:
        for i, value in enumerate(values):
            for piece in value.tensor_split(chunks):
                out.write(i, piece)
    assert open(path, 'rb').read() == \
        open(tmp_path / 'a' / 'g.pt', 'rb').read()
    assert zipfile.ZipFile(path).testzip() is None
    # An incomplete record is an error, not a silent zero-filled tensor.
    out = StreamedSave(template, path)
    out.write(0, obj['edge_id'][:10])
    with pytest.raises(ValueError, match='got 80 of 8000 bytes'):
        out.close()


@pytest.mark.parametrize('method', ['metis', 'random'])
def test_on_disk_equals_in_memory(tmp_path, method):
    data = _graph()
    graph_dir = save_graph(data, tmp_path / 'graph')
    assert sorted(os.listdir(graph_dir)) == sorted(
        ['graph.json', 'edge_index.npy', 'x.npy', 'y.npy', 'train_mask.npy',
         'val_mask.npy', 'h.npy', 'edge__edge_weight.npy',
         'edge__edge_attr.npy'] + [f'{k}.npy' for k in data.keys()
                                   if k.endswith('_mask') and k not in (
                                       'train_mask', 'val_mask')])
    memory = partition_graph(data, 3, tmp_path / 'memory', method=method)
    disk = partition_graph(graph_dir, 3, tmp_path / 'disk', method=method)
    assert _digests(tmp_path / 'memory') == _digests(tmp_path / 'disk')
    for key in ('node_ptr', 'edge_ptr', 'parts', 'edge_cut', 'balance',
                'source', 'num_classes'):
        assert memory[key] == disk[key], key
    # Several units per part (a pass over the edges each), tiny chunks.
    write_homogeneous(GraphOnDisk(graph_dir), 3, tmp_path / 'units',
                      method=method, chunk_edges=97, max_unit_edges=50)
    assert _digests(tmp_path / 'units') == _digests(tmp_path / 'memory')
    part = load_partition(tmp_path / 'disk', 1)
    assert part.x.dtype == data.x.dtype and part.num_parts == 3

    from torch_geometric.distributed import (LocalFeatureStore,
                                             LocalGraphStore)
    graph_store = LocalGraphStore.from_partition(str(tmp_path / 'disk'), 2)
    feature_store = LocalFeatureStore.from_partition(str(tmp_path / 'disk'),
                                                     2)
    # PyG's own distributed stores read the part written from disk.
    assert graph_store.num_partitions == 3
    assert torch.equal(graph_store.node_pb, feature_store.node_feat_pb)
    mine = load_partition(tmp_path / 'disk', 2)
    ids = feature_store.get_global_id(None)
    assert torch.equal(ids, mine.node_ids)
    x = feature_store.get_tensor_from_global_id(group_name=None,
                                                attr_name='x', index=ids)
    assert torch.equal(x, mine.x) and torch.equal(x, data.x[mine.orig_ids])


def _parallel_writer(rank, world_size, graph_dir, out_dir, kwargs):
    from pyg_sar.comm import ProcessGroupExchange
    from pyg_sar.partition import partition_graph_parallel
    manifest = partition_graph_parallel(graph_dir, 3, out_dir, **kwargs,
                                        exchange=ProcessGroupExchange())
    return None if manifest is None else manifest['edge_cut']['count']


def test_two_writers_equal_one(tmp_path):
    data = _graph()
    graph_dir = save_graph(data, tmp_path / 'graph')
    one = partition_graph(data, 3, tmp_path / 'one')
    results = run_workers(_parallel_writer, 2, graph_dir,
                          str(tmp_path / 'two'), {'max_unit_edges': 120},
                          timeout_s=120)
    assert results == [one['edge_cut']['count'], None]
    assert _digests(tmp_path / 'two') == _digests(tmp_path / 'one')
    assert sorted(os.listdir(tmp_path)) == ['graph', 'one', 'two']


def _corrupt(root, kind):
    r"""Breaks the graph directory :obj:`root` one way; returns the expected
    error (a regular expression)."""
    if kind == 'truncated':
        path = osp.join(root, 'x.npy')
        os.truncate(path, os.stat(path).st_size - 5)
        return r"x\.npy.*is truncated"
    if kind == 'id out of range':
        array = np.load(osp.join(root, 'edge_index.npy'))
        array[1, 17] = 300
        np.save(osp.join(root, 'edge_index.npy'), array)
        return r"node id 300 at \[1, 17\], outside the valid range \[0, 299\]"
    if kind == 'mask length':
        np.save(osp.join(root, 'train_mask.npy'), np.ones(299, dtype=bool))
        return r"train_mask.*has shape \[299\].*num_nodes=300"
    if kind == 'nan':
        array = np.load(osp.join(root, 'x.npy'))
        array[42, 1] = np.nan
        np.save(osp.join(root, 'x.npy'), array)
        return r"'x' has NaN values in 1 of 300 rows \(first: input node 42\)"
    if kind == 'object dtype':
        np.save(osp.join(root, 'y.npy'), np.array([None] * 300, dtype=object),
                allow_pickle=True)
        return r"y\.npy.*dtype object"
    if kind == 'path escape':
        meta = json.load(open(osp.join(root, 'graph.json')))
        meta['node_attrs']['x'] = '../x.npy'
        json.dump(meta, open(osp.join(root, 'graph.json'), 'w'))
        return r"not a plain '\.npy' file name"
    if kind == 'negative label':
        y = np.load(osp.join(root, 'y.npy'))
        mask = np.load(osp.join(root, 'train_mask.npy'))
        y[np.nonzero(mask)[0][0]] = -1
        np.save(osp.join(root, 'y.npy'), y)
        return r"negative label -1"
    raise AssertionError(kind)


@pytest.mark.parametrize('kind', [
    'truncated', 'id out of range', 'mask length', 'nan', 'object dtype',
    'path escape', 'negative label'
])
def test_bad_inputs_fail_before_writing(tmp_path, kind):
    root = save_graph(_graph(), tmp_path / 'graph')
    match = _corrupt(root, kind)
    with pytest.raises(ValueError, match=match) as info:
        partition_graph(root, 2, tmp_path / 'out')
    assert '\n' not in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ['graph']  # nothing written
    if kind == 'nan':  # allowed on request
        partition_graph(root, 2, tmp_path / 'out', allow_non_finite=True)
        assert torch.isnan(load_partition(tmp_path / 'out', 0).x).any() or \
            torch.isnan(load_partition(tmp_path / 'out', 1).x).any()


# VmHWM, not getrusage's ru_maxrss: the latter keeps the high-water mark of
# the process image before exec, i.e. of the (large) pytest parent.
_RSS_CHILD = r'''
import json, sys
import torch
from pyg_sar.partition import partition_graph
def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
base = status('VmRSS')
partition_graph(sys.argv[1], 4, sys.argv[2], method='random')
print(json.dumps({'base': base, 'peak': status('VmHWM')}))
'''


def test_out_of_core_peak_memory(tmp_path):
    r"""200k nodes, 4M edges (64 MB of int64 ids, 13 MB of features) on
    disk: the partition run (random assignment: the writer's memory, not
    the partitioner's) stays within 64 bytes per edge above the process's
    resident set after import (measured 28 B/edge: the largest part's
    in-edges, sorted, and one chunk). The in-memory path holds the whole
    graph, ids relabelled, and needs over 100 bytes per edge."""
    root = write_synthetic_graph(tmp_path / 'graph', 200_000, 20, 16, 16)
    result = subprocess.run(
        [sys.executable, '-c', _RSS_CHILD, root, str(tmp_path / 'out')],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    usage = json.loads(result.stdout.strip().splitlines()[-1])
    grown = usage['peak'] - usage['base']
    assert grown < 64 * 4_000_000, f'{grown / 4e6:.1f} bytes per edge'
    assert load_partition(tmp_path / 'out', 3).num_nodes > 0


def test_parallel_writers_refuse_bad_input_together(tmp_path):
    root = save_graph(_graph(), tmp_path / 'graph')
    _corrupt(root, 'nan')
    results = run_workers(_parallel_writer, 2, root, str(tmp_path / 'out'),
                          {}, timeout_s=60, expect_errors=True)
    assert [state for state, _ in results] == ['error', 'error']
    assert "ValueError: Node attribute 'x' has NaN" in results[0][1]
    assert "Partition writer 0 failed: ValueError: Node attribute 'x' has " \
        "NaN" in results[1][1]
    assert sorted(os.listdir(tmp_path)) == ['graph']


def test_cli_input_with_given_assignment(tmp_path, capsys):
    from pyg_sar.cli.main import main
    data = _graph()
    root = save_graph(data, tmp_path / 'graph')
    part = torch.arange(data.num_nodes) % 3
    np.save(tmp_path / 'part.npy', part.numpy())
    assert main(['partition', '--input', root, '--num-parts', '3', '--out',
                 str(tmp_path / 'cli'), '--assignment',
                 str(tmp_path / 'part.npy'), '--max-unit-edges', '100']) == 0
    assert 'Wrote 3 parts' in capsys.readouterr().out
    write_homogeneous(data, 3, tmp_path / 'python', assignment=part)
    assert _digests(tmp_path / 'cli') == _digests(tmp_path / 'python')
    manifest = load_partition(tmp_path / 'cli', 0).manifest
    assert manifest['node_ptr'] == [0, 100, 200, 300]
    # A wrong assignment is refused before anything is written.
    np.save(tmp_path / 'bad.npy', np.full(data.num_nodes, 3))
    assert main(['partition', '--input', root, '--num-parts', '3', '--out',
                 str(tmp_path / 'bad'), '--assignment',
                 str(tmp_path / 'bad.npy')]) == 2
    assert "'assignment' must give every node a part in [0, 2]" in \
        capsys.readouterr().err
    assert not osp.exists(tmp_path / 'bad')
