"""The exchange takes the code path NCCL needs, here on gloo: grouped
``batch_isend_irecv`` calls and ``all_to_all_single``, no tags, concurrent
exchanges on separate channels (process groups), and index tensors on the
device of the features they index.

No GPU runs in this suite; these tests pin the properties that make the same
code NCCL-safe, and the exactness suites check the numbers it gives."""
import os.path as osp
import re

import pytest
import torch
import torch.distributed as dist

import pyg_sar
from pyg_sar import comm
from pyg_sar.comm.channels import channel_group
from pyg_sar.graph.blocks import EdgeBlock, EdgeChunk
from pyg_sar.graph.exchange import RowPlan
from _dist import run_workers
from _graphs import hard_graph

PACKAGE = osp.dirname(pyg_sar.__file__)


def test_no_ungrouped_or_tagged_point_to_point_in_the_package():
    """Every send and receive of the package is an operation of a
    batch_isend_irecv list; none names a tag."""
    offenders = []
    for folder, _, files in __import__('os').walk(PACKAGE):
        for name in files:
            if not name.endswith('.py'):
                continue
            path = osp.join(folder, name)
            text = open(path).read()
            for pattern in (r'dist\.(isend|irecv|send|recv)\(', r'\btag\s*=',
                            r'dist\.all_to_all\('):
                for match in re.finditer(pattern, text):
                    offenders.append(f'{osp.relpath(path, PACKAGE)}: '
                                     f'{match.group(0)}')
    assert not offenders, offenders


def _record_exchanges(rank, world_size, root, mode, chunk_size):
    batches, singles = [], []
    original_batch = dist.batch_isend_irecv
    original_single = dist.all_to_all_single

    def recording_batch(ops):
        channel = channel_group('gradients')
        batches.append([(op.op.__name__, op.peer, op.tag,
                         op.group is not channel) for op in ops])
        return original_batch(ops)

    def recording_single(*args, **kwargs):
        singles.append(1)
        return original_single(*args, **kwargs)

    dist.batch_isend_irecv = recording_batch
    dist.all_to_all_single = recording_single
    try:
        pyg_sar.configure(pipeline_depth=2)
        part = pyg_sar.load_partition(root, rank)
        graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk_size)
        torch.manual_seed(0)
        model = torch.nn.ModuleList([
            pyg_sar.nn.GATConv(part.x.shape[1], 4, heads=2),
            pyg_sar.nn.SAGEConv(8, 3, aggr='max')])
        x = part.x.clone().requires_grad_()
        out = model[1](model[0](x, graph).relu(), graph)
        (out * out).sum().backward()
    finally:
        dist.batch_isend_irecv = original_batch
        dist.all_to_all_single = original_single
    return batches, len(singles)


@pytest.mark.parametrize('mode', ['sar', 'one_shot'])
def test_exchanges_are_grouped_untagged_and_channelled(tmp_path, mode):
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(hard_graph(), 3, root)
    results = run_workers(_record_exchanges, 3, root, mode, 16,
                          timeout_s=60)
    for rank, (batches, num_all_to_all) in enumerate(results):
        assert num_all_to_all >= 1  # the plan's id lists
        assert batches, f'rank {rank} exchanged nothing'
        ops = [op for batch in batches for op in batch]
        assert all(tag == 0 for _, _, tag, _ in ops)
        # A rank's receives and sends of one exchange are one batch: with
        # one_shot, every exchange talks to both peers at once.
        if mode == 'one_shot':
            assert any(len({peer for _, peer, _, _ in b}) == 2 and
                       {name for name, _, _, _ in b} == {'isend', 'irecv'}
                       for b in batches)
        # Gradients go back on their own channel, everything else on the
        # default group.
        on_default = [b for b in batches if all(d for *_, d in b)]
        on_channel = [b for b in batches if not any(d for *_, d in b)]
        assert len(on_default) + len(on_channel) == len(batches)
        assert on_channel, 'no gradient exchange ran on its channel'
        assert on_default


def _all_to_all_v(rank, world_size):
    sends = [torch.full((q + rank, 2), float(10 * rank + q))
             for q in range(world_size)]
    got = comm.all_to_all_v(sends)
    return [t.tolist() for t in got]


def test_all_to_all_v_with_uneven_and_empty_splits():
    results = run_workers(_all_to_all_v, 3)
    for rank, got in enumerate(results):
        for q, rows in enumerate(got):
            assert rows == [[float(10 * q + rank)] * 2] * (q + rank)


def _walk_tensors(obj, path='graph', seen=None):
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk_tensors(v, f'{path}[{k!r}]', seen)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _walk_tensors(v, f'{path}[{i}]', seen)
    elif isinstance(obj, (pyg_sar.DistGraph, EdgeBlock, EdgeChunk, RowPlan)):
        fields = obj.__dict__ if hasattr(obj, '__dict__') else {}
        for k, v in fields.items():
            yield from _walk_tensors(v, f'{path}.{k}', seen)


def test_graph_to_moves_every_index_tensor(tmp_path):
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(hard_graph(), 1, root)
    graph = pyg_sar.DistGraph(pyg_sar.load_partition(root, 0), chunk_size=7)
    # Build what layers cache: views, halo plan, chunk CSRs, the reverse.
    graph.with_self_loops()
    graph.halo_plan()
    graph.halo_edge_index()
    for block in graph.blocks:
        for chunk in block.chunks:
            chunk.csr()
    reverse = graph.reverse()
    assert graph.to('cpu') is graph
    assert graph.to('meta') is graph
    assert graph.device == torch.device('meta')
    tensors = list(_walk_tensors(graph))
    assert len(tensors) > 10
    wrong = [p for p, t in tensors if t.device.type != 'meta']
    assert not wrong, wrong
    moved_reverse = graph.reverse()
    assert moved_reverse is reverse and moved_reverse.base is graph
    assert moved_reverse.device == torch.device('meta')
    wrong = [p for p, t in _walk_tensors(moved_reverse, 'reverse')
             if t.device.type != 'meta']
    assert not wrong, wrong


def test_features_on_another_device_than_the_graph_are_refused(tmp_path):
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(hard_graph(), 1, root)
    part = pyg_sar.load_partition(root, 0)
    graph = pyg_sar.DistGraph(part, device='meta')
    conv = pyg_sar.nn.SAGEConv(part.x.shape[1], 4)
    with pytest.raises(ValueError, match=r"is on cpu but the DistGraph is "
                       r"on meta; move the graph with graph\.to\('cpu'\)"):
        conv(part.x, graph)
