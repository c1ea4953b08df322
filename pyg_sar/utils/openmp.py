"""The OpenMP wait policy of torch's CPU kernels. By default libgomp's
threads spin after every parallel region; when other jobs share the cores
(any busy cluster node), each of the tens of thousands of short regions of
a chunked epoch then waits for a time slice, and a GAT epoch measured 4.5x
slower beside two busy processes (DGL: 1.07x). Sleeping threads
(``OMP_WAIT_POLICY=PASSIVE``) keep the slowdown below DGL's
(``benchmarks/full_batch.py --contention``). libgomp reads the variable
once, when torch loads, so :func:`prefer_passive_wait` must run before the
first ``import torch``; ``import pyg_sar`` calls it and imports no torch."""
import logging
import os
import sys

log = logging.getLogger('pyg_sar')
_WARNED = []


def prefer_passive_wait() -> bool:
    r"""Sets ``OMP_WAIT_POLICY=PASSIVE`` unless the user chose how threads
    wait (``OMP_WAIT_POLICY`` or libgomp's ``GOMP_SPINCOUNT``) or torch is
    already loaded (then it would not take effect). Returns whether the
    policy of this process is now passive."""
    if 'torch' not in sys.modules and 'GOMP_SPINCOUNT' not in os.environ:
        os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')
    return os.environ.get('OMP_WAIT_POLICY', '').upper() == 'PASSIVE'


def warn_if_spinning() -> None:
    r"""Logs once, on rank-independent terms, that OpenMP threads spin
    between parallel regions: torch was loaded before ``import pyg_sar``
    and the environment names no wait policy. Such a process can run many
    times slower when other jobs share its cores. Silent where no thread
    can spin (one OpenMP thread: ``OMP_NUM_THREADS=1`` or
    ``torch.set_num_threads(1)``) and on every rank but 0 (``RANK``): the
    message is the same on every rank, so one copy per job says it."""
    if _WARNED or os.environ.get('OMP_WAIT_POLICY') or \
            os.environ.get('GOMP_SPINCOUNT'):
        return
    if os.environ.get('RANK', '0').strip() not in ('', '0'):
        return
    torch = sys.modules.get('torch')
    threads = torch.get_num_threads() if torch is not None else \
        _int(os.environ.get('OMP_NUM_THREADS'))
    if threads == 1:
        return
    _WARNED.append(True)
    log.warning(
        "pyg_sar: OpenMP threads spin between parallel regions (torch was "
        "imported before pyg_sar and OMP_WAIT_POLICY is unset): with other "
        "jobs on the cores an epoch can run many times slower; set "
        "OMP_WAIT_POLICY=PASSIVE in the job's environment or import "
        "pyg_sar before torch")


def _int(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
