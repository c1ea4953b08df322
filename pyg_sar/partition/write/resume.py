r"""What makes a long homogeneous run resumable and tells it early when the
disk is too small: :func:`open_work_dir` opens the
:class:`~pyg_sar.partition.workdir.WorkDir` of a run on a graph directory
(keyed by the arguments that shape the result and the input files' sizes
and modification times), :func:`disk_needed` estimates the bytes the phases
still to run will write, and :func:`check_disk` compares them with the free
space of the output's file system before the long phases start (one line
naming the path, the bytes needed and the bytes free)."""
import os
import os.path as osp
import shutil
from typing import Any, Dict, Optional

from pyg_sar.partition.assign.symmetric_file import parhip_bytes_bound
from pyg_sar.partition.input.edge_source import GraphSource
from pyg_sar.partition.input.ondisk import GRAPH_FILE, GraphOnDisk
from pyg_sar.partition.layout import FORMAT_VERSION
from pyg_sar.partition.workdir import (WorkDir, input_fingerprint,
                                       work_dir_for)

# Bytes the shards hold per input edge besides its attributes (edge id,
# row, col and global id in the part files, the edge map: int64 each), per
# node besides its attributes (global id, node map, permutation), and per
# file (zip records, alignment).
SHARD_BYTES_PER_EDGE = 40
SHARD_BYTES_PER_NODE = 24
SHARD_BYTES_PER_FILE = 1 << 14


def open_work_dir(graph: GraphOnDisk, out_dir: str, num_parts: int,
                  method: str, seed: int, balance_train: bool,
                  allow_non_finite: bool, threads: Optional[int],
                  resume: bool) -> WorkDir:
    r"""The (not yet entered) work directory of a run on :obj:`graph`
    that writes :obj:`out_dir`, keyed by everything that shapes its
    result: the same call on unchanged input files resumes it."""
    files = [osp.join(graph.root, GRAPH_FILE)]
    for value in [graph.edge_index, *graph.node_attrs.values(),
                  *graph.edge_attrs.values()]:
        name = getattr(value, 'filename', None)
        if name:
            files.append(os.fspath(name))
    key = {'format_version': FORMAT_VERSION, 'input': graph.root,
           'files': input_fingerprint(files), 'num_parts': num_parts,
           'method': method, 'seed': seed, 'balance_train': balance_train,
           'allow_non_finite': allow_non_finite, 'threads': threads}
    return WorkDir(work_dir_for(out_dir), key, resume)


def _attr_bytes(attrs: Dict[str, Any]) -> int:
    total = 0
    for value in attrs.values():
        if hasattr(value, 'nbytes'):
            total += int(value.nbytes)
        else:  # a tensor
            total += value.numel() * value.element_size()
    return total


def disk_needed(source: GraphSource, num_parts: int, method: str,
                done: Optional[set] = None) -> Dict[str, int]:
    r"""Estimated bytes written by the phases not in :obj:`done`:
    :obj:`symmetrize` (KaMinPar's ParHIP file, every edge counted in both
    directions), :obj:`kaminpar` and :obj:`assign` (4 bytes per node each)
    and :obj:`write` (the shards), and :obj:`peak`: the most of them on disk
    at once (the ParHIP file and KaMinPar's parts are deleted before the
    shards are written)."""
    done = done or set()
    n, e = source.num_nodes, source.num_edges
    shards = (SHARD_BYTES_PER_EDGE * e + SHARD_BYTES_PER_NODE * n +
              _attr_bytes(source.node_attrs) +
              _attr_bytes(source.edge_attrs) +
              SHARD_BYTES_PER_FILE * (4 * num_parts + 4))
    phases = {'symmetrize': parhip_bytes_bound(n, e)
              if method == 'kaminpar' else 0,
              'kaminpar': 8 * n if method == 'kaminpar' else 0,
              'assign': 4 * n, 'write': shards}
    if 'assign' in done:
        phases.update(symmetrize=0, kaminpar=0, assign=0)
    for phase in done & set(phases):
        phases[phase] = 0
    phases['peak'] = max(phases['symmetrize'] + phases['kaminpar'] +
                         phases['assign'], phases['assign'] + shards)
    return phases


def check_disk(path: str, needed: int) -> None:
    r"""Raises a one-line :class:`OSError` if the file system of
    :obj:`path` (its nearest existing folder) has fewer than :obj:`needed`
    bytes free."""
    probe = osp.abspath(path)
    while not osp.exists(probe) and osp.dirname(probe) != probe:
        probe = osp.dirname(probe)
    free = shutil.disk_usage(probe).free
    if needed > free:
        raise OSError(f"Not enough free disk space for the partition at "
                      f"'{path}': it needs {needed:,} bytes "
                      f"({needed / 2**30:.2f} GiB), {free:,} are free")


__all__ = ['open_work_dir', 'disk_needed', 'check_disk',
           'SHARD_BYTES_PER_EDGE', 'SHARD_BYTES_PER_NODE',
           'SHARD_BYTES_PER_FILE']
