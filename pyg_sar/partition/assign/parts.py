"""Which part every node goes to: :func:`assign_parts`, METIS (pymetis) or
KaMinPar on the symmetrized graph, or a seeded random split, then no empty
part, the node counts capped and the training nodes balanced
(:mod:`~pyg_sar.partition.assign.repair`). The heterogeneous partitioner
runs METIS and the random split on its own in-memory structure
(:mod:`~pyg_sar.partition.assign.in_memory`)."""
import contextlib
import os.path as osp
import tempfile
import time
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from pyg_sar.partition.assign.kaminpar import (KAMINPAR_TIMEOUT,
                                               check_threads,
                                               require_kaminpar, run_kaminpar)
from pyg_sar.partition.assign.repair import (TRAIN_BALANCE_TOLERANCE,
                                             balance_training_nodes,
                                             cap_part_sizes, fill_empty_parts,
                                             max_part_size, node_balance)
from pyg_sar.partition.assign.symmetric import (CsrView, as_idx_arrays,
                                                symmetric_csr)
from pyg_sar.partition.assign.symmetric_file import write_symmetric_parhip
from pyg_sar.partition.input.edge_source import EdgeSource
from pyg_sar.partition.workdir import WorkDir, read_ints, write_ints

# Bounds of the default chunk of assign_parts' streamed passes (edges).
MIN_CHUNK_EDGES = 1 << 18
MAX_CHUNK_EDGES = 1 << 21
# The files of the phases in a work directory
# (:class:`~pyg_sar.partition.workdir.WorkDir`).
PARHIP_FILE = 'graph.parhip'
KAMINPAR_FILE = 'kaminpar.part'
ASSIGNMENT_FILE = 'assignment.bin'


def random_parts(num_nodes: int, num_parts: int, generator: torch.Generator,
                 train_mask: Optional[Tensor]) -> Tensor:
    r"""A seeded balanced random split: part sizes differ by at most one,
    and so do the counts of the nodes of :obj:`train_mask`."""
    # Round-robin over a random order: part sizes differ by at most one.
    # Placing training nodes first in that order balances them as well.
    order = torch.randperm(num_nodes, generator=generator)
    if train_mask is not None:
        is_not_train = (~train_mask[order]).to(torch.uint8)
        order = order[torch.sort(is_not_train, stable=True).indices]
    part = torch.empty(num_nodes, dtype=torch.long)
    part[order] = torch.arange(num_nodes) % num_parts
    return part


def metis_parts(rowptr: Tensor, col, num_parts: int, seed: int) -> Tensor:
    r"""k-way METIS (pymetis) of the symmetric adjacency
    :obj:`(rowptr, col)`; :obj:`col` is converted to METIS's index width
    only if it differs (an int32 :obj:`col` is not copied for a 32-bit
    METIS)."""
    import pymetis

    width = 32 if pymetis._internal._idx_type_width() == 32 else 64
    xadj, adjncy = as_idx_arrays(CsrView(rowptr, col), width)
    adjacency = pymetis.CSRAdjacency(xadj, adjncy)
    del xadj, adjncy
    options = pymetis.Options()
    options.seed = seed
    # Note on training-node balance: METIS supports it via multi-constraint
    # vertex weights (ncon=2), but pymetis 2025.2.2 always calls METIS with
    # ncon=1 and reads an interleaved [n * 2] weight array as n single
    # weights, which silently unbalances the parts. Training nodes are
    # balanced by `balance_training_nodes` instead.
    result = pymetis.part_graph(num_parts, adjacency, options=options,
                                recursive=False)
    del adjacency
    return torch.from_numpy(np.asarray(result.vertex_part, dtype=np.int64))


def assign_parts(
    source: EdgeSource,
    num_parts: int,
    method: str = 'metis',
    seed: int = 0,
    train_mask: Optional[Tensor] = None,
    threads: Optional[int] = None,
    tmp_dir: Optional[str] = None,
    progress_callback: Optional[Callable[[str], None]] = None,
    chunk_edges: Optional[int] = None,
    kaminpar_context: str = 'terapart_largek',
    timeout: float = KAMINPAR_TIMEOUT,
    work: Optional[WorkDir] = None,
    symmetrize_budget: Optional[int] = None,
) -> Tuple[Tensor, Dict[str, Any]]:
    r"""Assigns every node of :obj:`source` to one of :obj:`num_parts`
    parts, with the symmetrized graph built once with little memory
    (:func:`~pyg_sar.partition.assign.symmetric.symmetric_csr`, about 8
    bytes per input edge) and no part empty. Returns the part of every node (int64)
    and statistics: :obj:`num_swapped` (training-node swaps),
    :obj:`num_moved` (nodes moved by the repair passes), :obj:`edge_cut`
    (undirected edges between parts of the symmetrized graph, :obj:`None`
    for :obj:`'random'`), :obj:`num_undirected_edges`, :obj:`node_balance`
    (largest part / mean) and :obj:`timings` (seconds per stage).

    Methods:

    - :obj:`'metis'`: k-way METIS (pymetis) on the symmetrized graph, as
      before (the same CSR and seed give the same assignment), then empty
      parts filled. METIS is single-threaded (:obj:`threads` is ignored).
    - :obj:`'kaminpar'`: KaMinPar
      (:mod:`~pyg_sar.partition.assign.kaminpar`) on a ParHIP file of the
      symmetrized graph in :obj:`tmp_dir`, written out of core a node range
      at a time within :obj:`symmetrize_budget`
      (:mod:`~pyg_sar.partition.assign.symmetric_file`: the file, and so
      the assignment, are the same whatever the budget), in a child process
      (a crash is a one-line :class:`RuntimeError`). Memory-efficient
      context by default; parts capped at
      :func:`~pyg_sar.partition.assign.repair.max_part_size` (node balance
      ≤ 1.01 where sizes allow), with a repair pass if KaMinPar exceeds it. The
      seed reproduces the assignment with :obj:`threads=1` (the default);
      more threads are faster but not reproducible.
    - :obj:`'random'`: a seeded balanced random split (part sizes differ by
      at most one; training nodes spread evenly).

    With :obj:`train_mask`, training nodes are then balanced (every part
    within :obj:`TRAIN_BALANCE_TOLERANCE` of the mean, by swaps that keep
    node counts), the neighbor counts streamed from the adjacency a chunk
    at a time (:mod:`~pyg_sar.partition.assign.repair`).

    Args:
        source (EdgeSource): The directed edges.
        num_parts (int): Number of parts.
        method (str, optional): :obj:`'metis'`, :obj:`'kaminpar'` or
            :obj:`'random'`. (default: :obj:`'metis'`)
        seed (int, optional): Seed of the method. (default: :obj:`0`)
        train_mask (torch.Tensor, optional): Nodes whose count per part is
            balanced too.
        threads (int, optional): KaMinPar's threads. (default: :obj:`1`)
        tmp_dir (str, optional): Folder of KaMinPar's temporary input file
            (about 4 bytes per adjacency entry). (default: the system's)
        progress_callback (callable, optional): Called with the name of
            every stage as it starts.
        chunk_edges (int, optional): Edges per chunk of the streamed passes
            (a chunk's work space is about 120 bytes per edge). (default:
            1/32 of the edges, between :math:`2^{18}` and :math:`2^{21}`)
        kaminpar_context (str, optional): KaMinPar's context, see
            :obj:`~pyg_sar.partition.assign.kaminpar.KAMINPAR_CONTEXTS`.
        timeout (float, optional): Seconds KaMinPar may run.
        work (WorkDir, optional): A resumable run's work directory
            (:class:`~pyg_sar.partition.workdir.WorkDir`): the ParHIP file,
            KaMinPar's parts and the final assignment are recorded there,
            and reused when they verify.
        symmetrize_budget (int, optional): Memory (bytes) of one node range
            of the out-of-core symmetrization for KaMinPar
            (:func:`~pyg_sar.partition.assign.symmetric_file.write_symmetric_parhip`).
            (default: 2 bytes per input edge, at least 256 MiB)
    """
    if method not in ('metis', 'kaminpar', 'random'):
        raise ValueError(f"Unknown partition method '{method}'; expected one "
                         f"of ['metis', 'kaminpar', 'random']")
    if method == 'kaminpar':
        require_kaminpar()
        if threads is not None:
            check_threads(threads)
    if not isinstance(source, EdgeSource):
        raise TypeError(f"'source' must be an EdgeSource (got "
                        f"'{type(source).__name__}'; wrap an edge_index in "
                        f"TensorEdgeSource(edge_index, num_nodes))")
    num_nodes = source.num_nodes
    stats: Dict[str, Any] = {'num_swapped': 0, 'num_moved': 0,
                             'edge_cut': None, 'num_undirected_edges': None,
                             'timings': {}}
    timings = stats['timings']

    def stage(name: str) -> float:
        if progress_callback is not None:
            progress_callback(name)
        return time.perf_counter()

    def done(name: str, start: float) -> None:
        timings[name] = round(time.perf_counter() - start, 3)

    generator = torch.Generator().manual_seed(seed)
    if method == 'random' or num_parts == 1:
        start = stage('random assignment')
        part = random_parts(num_nodes, num_parts, generator, train_mask)
        done('random', start)
        stats['node_balance'] = node_balance(part, num_parts)
        return part, stats

    if chunk_edges is None:
        chunk_edges = min(MAX_CHUNK_EDGES,
                          max(MIN_CHUNK_EDGES, source.num_edges // 32))
    if work is not None:
        record = work.verified('assign', work.digest_of(
            'kaminpar' if method == 'kaminpar' else None))
        if record is not None:
            part = torch.from_numpy(read_ints(
                work.path(ASSIGNMENT_FILE), np.int32, num_nodes,
                num_parts)).long()
            stats.update(record['info'])
            return part, stats

    # A work directory holds the files itself; else a temporary folder.
    with contextlib.nullcontext(work.root) if work is not None else \
            tempfile.TemporaryDirectory(prefix='pyg_sar_kaminpar_',
                                        dir=tmp_dir) as folder:
        depends = None
        if method == 'metis':
            start = stage('symmetrize')
            csr = symmetric_csr(source, chunk_edges)
            done('symmetrize', start)
            view: CsrView = csr
            stats['num_undirected_edges'] = csr.num_entries // 2
            if csr.num_entries:
                start = stage('METIS')
                part = metis_parts(csr.rowptr, csr.col, num_parts, seed)
                done('metis', start)
        else:
            path, entries, depends = _symmetrize(
                source, work, folder, symmetrize_budget, chunk_edges, stage,
                done)
            stats['num_undirected_edges'] = entries // 2
            if entries:
                part, depends = _kaminpar(
                    path, num_nodes, num_parts, seed, threads,
                    kaminpar_context, timeout, work, depends, stage, done)
            view = CsrView.from_parhip(path, chunk_edges)
        if stats['num_undirected_edges'] == 0:
            # Nothing to cut: any balanced assignment is optimal.
            part = random_parts(num_nodes, num_parts, generator, train_mask)
        else:
            start = stage('repair')
            count = view.neighbors_in_part
            stats['num_moved'] = fill_empty_parts(part, count, num_parts)
            if method == 'kaminpar':
                stats['num_moved'] += cap_part_sizes(
                    part, count, num_parts,
                    max_part_size(num_nodes, num_parts))
            done('repair', start)
            if train_mask is not None and int(train_mask.sum()) > 0:
                start = stage('balance training nodes')
                stats['num_swapped'] = balance_training_nodes(
                    part, count, train_mask, num_parts)
                done('balance_train', start)
        stats['edge_cut'] = view.edge_cut(part)
        stats['node_balance'] = node_balance(part, num_parts)
        del view
    if work is not None:
        write_ints(part.numpy(), work.path(ASSIGNMENT_FILE), np.int32)
        work.record('assign', [ASSIGNMENT_FILE], info=stats, depends=depends)
    return part, stats


def _symmetrize(source: EdgeSource, work: Optional[WorkDir], folder: str,
                budget: Optional[int], chunk_edges: int, stage: Callable,
                done: Callable) -> Tuple[str, int, Optional[str]]:
    r"""The ParHIP file of the symmetrized graph (out of core,
    :func:`~pyg_sar.partition.assign.symmetric_file.write_symmetric_parhip`),
    in the work directory (reused when it verifies) or in :obj:`folder`:
    its path, its number of adjacency entries and its digest."""
    if work is not None:
        record = work.verified('symmetrize')
        if record is not None:  # its entry count from the (hashed) file
            path = work.path(PARHIP_FILE)
            entries = int(np.fromfile(path, dtype=np.uint64, count=3)[2])
            return path, entries, record['digest']
        path = work.path(PARHIP_FILE)
    else:
        path = osp.join(folder, PARHIP_FILE)
    start = stage('symmetrize')
    info = write_symmetric_parhip(source, path, budget, chunk_edges)
    done('symmetrize', start)
    if work is None:
        return path, info['num_entries'], None
    record = work.record('symmetrize', [PARHIP_FILE], info=info)
    return path, info['num_entries'], record['digest']


def _kaminpar(path: str, num_nodes: int, num_parts: int, seed: int,
              threads: Optional[int], context: str, timeout: float,
              work: Optional[WorkDir], depends: Optional[str],
              stage: Callable, done: Callable
              ) -> Tuple[Tensor, Optional[str]]:
    r"""KaMinPar's parts of the ParHIP file :obj:`path` (read back from the
    work directory when they verify) and their digest."""
    if work is not None:
        record = work.verified('kaminpar', depends)
        if record is not None:
            part = read_ints(work.path(KAMINPAR_FILE), np.int32, num_nodes,
                             num_parts)
            return torch.from_numpy(part).long(), record['digest']
    start = stage('KaMinPar')
    part = run_kaminpar(path, num_nodes, num_parts, seed,
                        max_part_size(num_nodes, num_parts),
                        threads=1 if threads is None else threads,
                        context=context, timeout=timeout)
    done('kaminpar', start)
    if work is None:
        return part, None
    write_ints(part.numpy(), work.path(KAMINPAR_FILE), np.int32)
    return part, work.record('kaminpar', [KAMINPAR_FILE],
                             depends=depends)['digest']


__all__ = ['assign_parts', 'random_parts', 'metis_parts',
           'TRAIN_BALANCE_TOLERANCE']
