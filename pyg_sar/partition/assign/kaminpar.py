r"""KaMinPar (`github.com/KaMinPar/KaMinPar
<https://github.com/KaMinPar/KaMinPar>`_, ``pip install kaminpar``), a
shared-memory multilevel graph partitioner with METIS-quality cuts, run on
the ParHIP file of the symmetrized graph
(:func:`~pyg_sar.partition.assign.symmetric.write_parhip`) in a child process.

Why a child process: KaMinPar's Python bindings (3.7) read graphs only from
files, hold the GIL throughout, and crash the interpreter on some inputs
(a truncated file, a memory-efficient context without compression). In a
child, a crash is a one-line :class:`RuntimeError`
(``KaMinPar failed on <file> (exit signal 11): <last stderr line>``), the
caller's memory is not shared with KaMinPar's, and a timeout bounds the
wait.

Defaults: KaMinPar's memory-efficient context for many blocks
(:obj:`'terapart_largek'`: the graph compressed while it is read, and a
coarsening forced to a level of about :obj:`k` times its contraction limit
before the first partition), one thread. Measured against
:obj:`'terapart'` on the partition benchmark's graphs: the same cut
(within 0.1%), the same peak on ``synthetic_graph`` at 4M nodes and on a
20M-node graph whose edges are half random (6.4 and 6.6 GiB), half the
peak on a 2M-node one (0.53 vs 1.21 GB). Both are offered, see
:obj:`KAMINPAR_CONTEXTS`.
Reproducibility: the seed (:obj:`kaminpar.reseed`) makes the assignment
reproducible with **one thread only**; with more threads assignments differ
from run to run even with the same seed (KaMinPar's Python context exposes
no deterministic mode), so :obj:`threads > 1` trades reproducibility for
speed. Balance: every part gets at most
:func:`~pyg_sar.partition.assign.repair.max_part_size` nodes as KaMinPar's
maximum block weight (node balance ≤ 1.01 where sizes allow it; KaMinPar's
own default would use a 3% allowance)."""
import importlib.util
import os
import os.path as osp
import subprocess
import sys
from typing import List, Optional

import numpy as np
import torch
from torch import Tensor

# Wall-clock limit of one KaMinPar run (seconds).
KAMINPAR_TIMEOUT = 24 * 3600.0
# KaMinPar contexts offered (``kaminpar.<name>_context()``).
KAMINPAR_CONTEXTS = ('terapart_largek', 'terapart', 'terapart_eco', 'default', 'fast', 'eco',
                     'strong')
CHILD_FILE = osp.join(osp.dirname(osp.abspath(__file__)),
                      'kaminpar_child.py')


def require_kaminpar() -> None:
    r"""Raises a one-line :class:`ImportError` if :obj:`kaminpar` is not
    installed."""
    if importlib.util.find_spec('kaminpar') is None:
        raise ImportError("method='kaminpar' needs the 'kaminpar' package: "
                          "pip install kaminpar")


def check_threads(threads) -> None:
    r"""Raises a one-line :class:`ValueError` unless :obj:`threads` is a
    positive int."""
    if isinstance(threads, bool) or not isinstance(threads, int) or \
            threads < 1:
        raise ValueError(f"'threads' must be a positive int (got {threads!r})")


def _child_command() -> List[str]:
    # The child runs as a plain script so that it imports neither torch nor
    # pyg_sar (less memory beside KaMinPar's).
    return [sys.executable, CHILD_FILE]


def _last_line(text: bytes) -> str:
    lines = [line.strip() for line in
             text.decode('utf-8', 'replace').splitlines() if line.strip()]
    return lines[-1] if lines else 'no output'


# The peak resident set of the last KaMinPar child in bytes, as it reported
# it (None where /proc is missing), and the caller's resident set while that
# child ran (the caller only waits meanwhile): their sum is the joint peak
# of both processes during the KaMinPar run, for memory benchmarks.
# last_caller_peak_bytes: the caller's own peak before the child started
# (the symmetrization's, for the benchmarks).
last_peak_bytes: Optional[int] = None
last_caller_rss_bytes: Optional[int] = None
last_caller_peak_bytes: Optional[int] = None


def _rss_bytes(field: str = 'VmRSS') -> Optional[int]:
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith(field + ':'):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _peak_from(stdout: bytes) -> Optional[int]:
    for line in stdout.decode(errors='replace').splitlines():
        if line.startswith('peak_bytes '):
            return int(line.split()[1])
    return None


def run_kaminpar(path: str, num_nodes: int, num_parts: int, seed: int,
                 max_block_weight: int, threads: int = 1,
                 context: str = 'terapart_largek',
                 timeout: float = KAMINPAR_TIMEOUT) -> Tensor:
    r"""Partitions the ParHIP file :obj:`path` into :obj:`num_parts` blocks
    of at most :obj:`max_block_weight` nodes in a child process, and returns
    the part of every node (int64), checked: :obj:`num_nodes` ids in
    :obj:`[0, num_parts)`.

    Args:
        path (str): The graph
            (:func:`~pyg_sar.partition.assign.symmetric.write_parhip`).
        num_nodes (int): Its number of nodes.
        num_parts (int): Number of parts.
        seed (int): KaMinPar's seed; reproducible with one thread only.
        max_block_weight (int): The most nodes a part may hold.
        threads (int, optional): KaMinPar's threads. (default: :obj:`1`)
        context (str, optional): One of :obj:`KAMINPAR_CONTEXTS`.
            (default: :obj:`'terapart_largek'`, memory-efficient)
        timeout (float, optional): Seconds before the child is killed.
    """
    require_kaminpar()
    if context not in KAMINPAR_CONTEXTS:
        raise ValueError(f"Unknown KaMinPar context '{context}'; expected "
                         f"one of {list(KAMINPAR_CONTEXTS)}")
    check_threads(threads)
    out = path + '.part'
    if osp.exists(out):
        os.remove(out)
    command = _child_command() + [
        path, out, str(num_parts), str(int(seed) % 2**32), str(threads),
        str(int(max_block_weight)), context]
    global last_caller_rss_bytes, last_caller_peak_bytes
    last_caller_rss_bytes = _rss_bytes()
    last_caller_peak_bytes = _rss_bytes('VmHWM')
    try:
        result = subprocess.run(command, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"KaMinPar failed on {path} (timed out after "
                           f"{timeout:g} s)") from None
    code = result.returncode
    if code != 0:
        how = f'exit signal {-code}' if code < 0 else f'exit code {code}'
        message = _last_line(result.stderr)
        if message == 'no output':
            message = _last_line(result.stdout)
        raise RuntimeError(f"KaMinPar failed on {path} ({how}): {message}")
    try:
        size = osp.getsize(out) if osp.exists(out) else -1
        if size != 4 * num_nodes:
            raise RuntimeError(
                f"KaMinPar failed on {path} (exit code 0): its output has "
                f"{max(size, 0)} bytes, expected {4 * num_nodes} "
                f"({num_nodes} int32 part ids)")
        part = torch.from_numpy(np.fromfile(out, dtype=np.int32)).long()
    finally:
        if osp.exists(out):
            os.remove(out)
    global last_peak_bytes
    last_peak_bytes = _peak_from(result.stdout)
    if part.numel() and (int(part.min()) < 0 or
                         int(part.max()) >= num_parts):
        raise RuntimeError(
            f"KaMinPar failed on {path} (exit code 0): part ids in "
            f"[{int(part.min())}, {int(part.max())}], expected [0, "
            f"{num_parts - 1}]")
    return part


__all__ = ['run_kaminpar', 'require_kaminpar', 'check_threads', 'KAMINPAR_TIMEOUT',
           'KAMINPAR_CONTEXTS']
