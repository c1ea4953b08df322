"""The memory-lean assignment: the streamed symmetrization equals the old
in-memory one, METIS on it gives the old assignment, the ParHIP file is
what KaMinPar reads, KaMinPar's parts are balanced, reproducible with one
thread, and a crash in its child is a one-line error; training on a
KaMinPar partition is exact."""
import os
import sys

import numpy as np
import pytest
import torch

from pyg_sar import datasets
from pyg_sar.partition.assign import kaminpar as kaminpar_mod
from pyg_sar.partition.assign.in_memory import (
    balance_training_nodes_in_memory, fill_empty_parts_in_memory,
    symmetric_csr_in_memory)
from pyg_sar.partition.assign.parts import assign_parts, metis_parts
from pyg_sar.partition.assign.repair import TRAIN_BALANCE_TOLERANCE
from pyg_sar.partition.assign.symmetric import (CsrView, symmetric_csr,
                                                write_parhip)
from pyg_sar.partition.input.edge_source import TensorEdgeSource
from _graphs import hard_graph
from tests.nn.test_sar_exact import CONVS_ON

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow

kaminpar = pytest.importorskip('kaminpar')


def _messy_graph():
    # Directed edges, self loops, duplicates, isolated nodes (the last 5
    # ids have no edge at all).
    data = hard_graph()
    return data.edge_index, data.num_nodes + 5


def _source(edge_index, num_nodes):
    return TensorEdgeSource(edge_index, num_nodes)


@pytest.mark.parametrize('chunk', [1, 7, 64, 1 << 20])
def test_symmetric_equals_old(chunk):
    edge_index, n = _messy_graph()
    rowptr, row, col = symmetric_csr_in_memory(edge_index, n)
    csr = symmetric_csr(_source(edge_index, n), chunk_edges=chunk)
    assert csr.col.dtype == torch.int32
    assert torch.equal(csr.rowptr, rowptr)
    assert torch.equal(csr.col.long(), col)
    # Streamed neighbor counts and cut equal the in-memory ones.
    part = torch.arange(n) % 3
    for target in range(3):
        hits = part[col] == target
        expected = torch.bincount(row[hits], minlength=n)
        assert torch.equal(csr.neighbors_in_part(part, target), expected)
    assert csr.edge_cut(part) == int((part[row] != part[col]).sum()) // 2


def test_metis_same_assignment_as_before():
    data = datasets.synthetic_graph(600, 6, 4, 3, seed=1)
    n = data.num_nodes
    rowptr, row, col = symmetric_csr_in_memory(data.edge_index, n)
    train = data.train_mask
    for seed in (0, 3):
        old = metis_parts(rowptr, col, 4, seed)
        fill_empty_parts_in_memory(old, row, col, 4)
        balance_training_nodes_in_memory(old, row, col, train, 4)
        new, stats = assign_parts(_source(data.edge_index, n), 4, 'metis',
                                  seed=seed, train_mask=train,
                                  chunk_edges=97)
        assert torch.equal(new, old)
        assert stats['edge_cut'] == int((old[row] != old[col]).sum()) // 2


def test_parhip_file_read_by_kaminpar(tmp_path):
    edge_index, n = _messy_graph()
    csr = symmetric_csr(_source(edge_index, n), chunk_edges=13)
    path = str(tmp_path / 'g.parhip')
    write_parhip(csr, path)
    graph = kaminpar.load_graph(path, kaminpar.GraphFileFormat.PARHIP)
    assert graph.n() == n and graph.m() == csr.num_entries
    for u in (0, 11, n - 1, n - 6):
        got = sorted(v for v, _ in graph.neighbors(u))
        lo, hi = int(csr.rowptr[u]), int(csr.rowptr[u + 1])
        assert got == csr.col[lo:hi].tolist()
    part = (torch.arange(n) * 7 % 4)
    assert kaminpar.edge_cut(graph, part.tolist()) == csr.edge_cut(part)
    # Read back memory-mapped: the same adjacency.
    view = CsrView.from_parhip(path, chunk_edges=5)
    assert torch.equal(view.rowptr, csr.rowptr)
    assert np.array_equal(np.asarray(view.col), csr.col.numpy())


def _check_parts(part, n, k, train=None):
    sizes = torch.bincount(part, minlength=k)
    assert part.numel() == n and int(sizes.min()) > 0
    assert int(sizes.max()) <= max(-(-n // k), int(1.01 * n / k))
    if train is not None:
        counts = torch.bincount(part[train], minlength=k).float()
        target = float(train.sum()) / k
        assert float(counts.max()) <= target * (1 + TRAIN_BALANCE_TOLERANCE) \
            + 1
        assert float(counts.min()) >= target * (1 - TRAIN_BALANCE_TOLERANCE) \
            - 1


@pytest.mark.parametrize('k', [2, 3, 5])
def test_kaminpar_balanced_and_reproducible(k, tmp_path):
    data = datasets.synthetic_graph(900, 8, 4, 3, seed=2)
    n = data.num_nodes
    # Skew the training nodes into the low ids so balancing has work to do.
    train = torch.zeros(n, dtype=torch.bool)
    train[:300] = True
    source = _source(data.edge_index, n)
    part, stats = assign_parts(source, k, 'kaminpar', seed=5,
                               train_mask=train, tmp_dir=str(tmp_path),
                               chunk_edges=200)
    _check_parts(part, n, k, train)
    again, _ = assign_parts(source, k, 'kaminpar', seed=5, train_mask=train,
                            tmp_dir=str(tmp_path), chunk_edges=1 << 20)
    assert torch.equal(part, again)
    assert stats['node_balance'] <= 1.01 + 1e-9
    rowptr, row, col = symmetric_csr_in_memory(data.edge_index, n)
    assert stats['edge_cut'] == int((part[row] != part[col]).sum()) // 2
    # Far better than random (random cuts about (k - 1) / k of the edges).
    assert stats['edge_cut'] < 0.8 * (k - 1) / k * \
        stats['num_undirected_edges']
    assert os.listdir(tmp_path) == []  # the temporary file is gone


def test_kaminpar_tiny_graph_no_empty_part():
    # 12 nodes in 2 triangles and isolated nodes, into 5 parts.
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 0, 4, 5, 3]])
    part, _ = assign_parts(_source(edge_index, 12), 5, 'kaminpar', seed=0)
    _check_parts(part, 12, 5)


def test_repair_caps_oversized_parts(monkeypatch):
    # A partitioner that ignores the block weight: the repair fixes it.
    def lopsided(path, num_nodes, num_parts, *args, **kwargs):
        part = torch.zeros(num_nodes, dtype=torch.long)
        part[:num_parts - 1] = torch.arange(1, num_parts)
        return part

    monkeypatch.setattr('pyg_sar.partition.assign.parts.run_kaminpar',
                        lopsided)
    data = datasets.synthetic_graph(500, 6, 4, 3, seed=0)
    part, stats = assign_parts(_source(data.edge_index, 500), 4, 'kaminpar',
                               train_mask=data.train_mask)
    _check_parts(part, 500, 4, data.train_mask)
    assert stats['num_moved'] > 0


@pytest.mark.parametrize('script,match', [
    ('import os, signal; os.kill(os.getpid(), signal.SIGSEGV)',
     r'\(exit signal 11\)'),
    ('import sys; sys.stderr.write("boom\\nlast words\\n"); sys.exit(3)',
     r'\(exit code 3\): last words$'),
    ('pass', r'\(exit code 0\): its output has 0 bytes'),
])
def test_child_crash_is_one_line(monkeypatch, script, match):
    monkeypatch.setattr(kaminpar_mod, '_child_command',
                        lambda: [sys.executable, '-c', script])
    edge_index, n = _messy_graph()
    with pytest.raises(RuntimeError, match=r'^KaMinPar failed on .*' +
                       match) as info:
        assign_parts(_source(edge_index, n), 3, 'kaminpar')
    assert '\n' not in str(info.value)


def test_truncated_parhip_file(tmp_path):
    edge_index, n = _messy_graph()
    path = str(tmp_path / 'g.parhip')
    write_parhip(symmetric_csr(_source(edge_index, n)), path)
    with open(path, 'r+b') as f:
        f.truncate(os.path.getsize(path) - 8)
    with pytest.raises(RuntimeError, match=r'^KaMinPar failed on .*'
                       r'\(exit code 1\): ParHIP file .* needs') as info:
        kaminpar_mod.run_kaminpar(path, n, 3, 0, n)
    assert '\n' not in str(info.value)


def test_bad_arguments(monkeypatch):
    edge_index, n = _messy_graph()
    with pytest.raises(ValueError, match="'threads' must be a positive"):
        assign_parts(_source(edge_index, n), 3, 'kaminpar', threads=0)
    with pytest.raises(ValueError, match="Unknown partition method 'kmp'"):
        assign_parts(_source(edge_index, n), 3, 'kmp')
    with pytest.raises(TypeError, match="'source' must be an EdgeSource"):
        assign_parts(edge_index, 3, 'metis')
    monkeypatch.setattr('importlib.util.find_spec', lambda name: None)
    with pytest.raises(ImportError, match='pip install kaminpar$'):
        assign_parts(_source(edge_index, n), 3, 'kaminpar')


@pytest.fixture(scope='module')
def kaminpar_run(tmp_path_factory):
    """The workers' results of the exactness sweep of test_sar_exact (every
    conv, mode and chunk size) on a KaMinPar partition at world size 3:
    one spawn for every conv's test."""
    from tests.nn import test_sar_exact as exact
    from pyg_sar.partition.write.homogeneous import write_homogeneous
    from _dist import run_workers

    data = exact.synthetic_data()
    part, _ = assign_parts(_source(data.edge_index, data.num_nodes), 3,
                           'kaminpar', seed=0, train_mask=data.train_mask)
    root = str(tmp_path_factory.mktemp('kaminpar') / 'synthetic')
    write_homogeneous(data, 3, root, method='kaminpar', assignment=part)
    return data, run_workers(_exact_worker, 3, root, timeout_s=120)


@pytest.mark.parametrize('kind', CONVS_ON['synthetic'])
def test_training_exact_on_kaminpar_partition(kaminpar_run, kind):
    from tests.nn import test_sar_exact as exact
    from _exact import FLOAT32_SCALED, mismatches, report

    data, results = kaminpar_run
    assert kind in exact.kinds_for(data)
    ids = [r['ids'] for r in results]
    ref = exact.reference(data, kind)
    failures = []
    for mode in exact.MODES:
        for chunk in (None, exact.CHUNKS['synthetic']):
            key = (mode, chunk, kind)
            failures += mismatches(
                f'kaminpar {kind} mode={mode} chunk={chunk}', ids,
                [r[key] for r in results], ref, FLOAT32_SCALED)
    report(failures)


def _exact_worker(rank, world_size, root):
    import pyg_sar
    from tests.nn import test_sar_exact as exact
    from _dist import halo_slices_with_chunks, test_device, to_cpu

    part = pyg_sar.load_partition(root, rank)
    device = test_device()
    x = part.x.float().to(device)
    weights = exact.probe(int(part.num_nodes), 6)[part.orig_ids].to(device)
    on_device = exact._OnDevice(part, device)
    results = {'ids': part.orig_ids}
    for mode in exact.MODES:
        for chunk in (None, exact.CHUNKS['synthetic']):
            halo_slices_with_chunks(chunk)
            graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk,
                                      device=device)
            for kind in exact.kinds_for(part):
                conv = exact.build_conv(kind, x.shape[1],
                                        distributed=True).to(device)
                x_in = x.clone().requires_grad_()
                out = exact.run_conv(kind, conv, x_in, graph, on_device)
                (out * weights).sum().backward()
                results[(mode, chunk, kind)] = to_cpu((
                    out.detach(), x_in.grad,
                    {n: p.grad for n, p in conv.named_parameters()}))
    halo_slices_with_chunks(None)
    return results



def test_heterogeneous_graph_partitioned_by_kaminpar(tmp_path, monkeypatch):
    """``method='kaminpar'`` on a HeteroData runs KaMinPar, not METIS under
    its name, and every node of every type lands in exactly one part."""
    import pyg_sar
    from pyg_sar.partition.write import heterogeneous
    from _hetero import hard_hetero

    def no_metis(*args, **kwargs):
        raise AssertionError('METIS ran for method="kaminpar"')

    monkeypatch.setattr(heterogeneous, 'metis_parts', no_metis)
    data = hard_hetero()
    root = str(tmp_path / 'k')
    manifest = pyg_sar.partition_graph(data, 3, root, method='kaminpar')
    assert manifest['method'] == 'kaminpar'
    parts = [pyg_sar.load_partition(root, rank) for rank in range(3)]
    for node_type in data.node_types:
        assert sum(p.num_local_nodes_dict[node_type] for p in parts) == \
            data[node_type].num_nodes


def test_auto_method_picks_kaminpar_for_large_graphs(tmp_path, monkeypatch):
    """``method='auto'`` (the default) runs KaMinPar from
    ``AUTO_KAMINPAR_EDGES`` edges on and METIS below; the manifest says
    which ran."""
    import pyg_sar
    from pyg_sar.partition import api
    data = datasets.synthetic_graph(600, 6, 4, 3, seed=0)
    small = pyg_sar.partition_graph(data, 2, str(tmp_path / 'small'))
    assert small['method'] == 'metis'
    monkeypatch.setattr(api, 'AUTO_KAMINPAR_EDGES', data.num_edges)
    large = pyg_sar.partition_graph(data, 2, str(tmp_path / 'large'))
    assert large['method'] == 'kaminpar'
    assert large['balance']['nodes_max_over_mean'] <= 1.01
