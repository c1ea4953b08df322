"""What the full-batch benchmarks share: launching fresh worker processes,
memory probes of a worker process, worker start-up, the measured epochs of
a worker, and writing the results.

Torch-free at import (drivers import it too); the worker helpers import
torch and pyg_sar when called.
"""
from __future__ import annotations

import argparse
import json
import os
import os.path as osp
import resource
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple


# Launching ###################################################################

def free_port() -> int:
    """A free TCP port on the loopback interface, for a local launch
    (torch-free: the drivers import this module)."""
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def launch_workers(script: str, worker_args: List[str], world_size: int,
                   work: str, timeout_s: float,
                   env: Optional[Dict[str, str]] = None) -> List[dict]:
    """Runs ``world_size`` fresh processes of ``script --worker --result
    PATH *worker_args`` in ``work`` (gloo on 127.0.0.1, ``2 // N`` threads
    each: the machine has 2 cores), with ``env`` added to their
    environment; returns their results, in rank order."""
    import subprocess
    port, procs, paths = free_port(), [], []
    for rank in range(world_size):
        child = {k: v for k, v in os.environ.items()
                 if k not in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR',
                              'MASTER_PORT', 'LOCAL_RANK')}
        threads = str(max(1, 2 // world_size))
        child.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        child.update(env or {})
        if world_size > 1:
            child.update(RANK=str(rank), WORLD_SIZE=str(world_size),
                         LOCAL_RANK=str(rank), MASTER_ADDR='127.0.0.1',
                         MASTER_PORT=str(port))
        path = osp.join(work, f'result_{rank}.json')
        if osp.exists(path):
            os.remove(path)
        paths.append(path)
        procs.append(subprocess.Popen(
            [sys.executable, script, '--worker', '--result', path,
             *worker_args], env=child, cwd=work))
    deadline, failed = time.time() + timeout_s, False
    for proc in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            failed = True
        failed |= proc.returncode not in (0, None)
    for proc in procs:  # our own children only
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if failed or not all(osp.exists(p) for p in paths):
        raise RuntimeError(f'a worker of {osp.basename(script)} failed: '
                           f'{worker_args}')
    results = []
    for path in paths:
        with open(path) as f:
            results.append(json.load(f))
    return results


# Memory probes ###############################################################

def maxrss_mib() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def status_mib(key: str) -> Optional[float]:
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith(key + ':'):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def reset_hwm() -> bool:
    """Resets the kernel's peak-RSS mark (VmHWM) of this process."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        return True
    except OSError:
        return False


# Worker ######################################################################

def init_worker(timeout: float) -> Tuple[int, int]:
    """Torch threads shared out over the 2 cores, then the gloo process
    group; returns ``(rank, world_size)``."""
    from datetime import timedelta

    import torch

    import pyg_sar
    world_size = int(os.environ.get('WORLD_SIZE', '1'))
    torch.set_num_threads(max(1, 2 // world_size))
    return pyg_sar.init_distributed(backend='gloo',
                                    timeout=timedelta(seconds=timeout))


def measure_epochs(epoch: Callable[[], Dict[str, int]],
                   epochs: int) -> Dict[str, Any]:
    """Runs one epoch for memory (peak-RSS delta over the state right before
    it, and the epoch's ``VmHWM`` over that RSS where the mark can be reset),
    then ``epochs`` timed ones. ``epoch()`` returns the halo-exchange
    ``comm_stats()``; the bytes reported are the last epoch's."""
    import gc

    from pyg_sar import comm
    gc.collect()
    comm.barrier()
    # Memory of the first epoch, relative to the state right before it.
    rss_before = status_mib('VmRSS')
    maxrss_before = maxrss_mib()
    hwm_reset = reset_hwm()
    comm.reset_comm_stats()
    start = time.perf_counter()
    epoch()
    first_s = time.perf_counter() - start
    maxrss_after = maxrss_mib()
    hwm_after = status_mib('VmHWM') if hwm_reset else None

    times: List[float] = []
    stats, exchanges = [], []
    for _ in range(epochs):
        comm.barrier()
        comm.reset_comm_stats()
        start = time.perf_counter()
        exchange = epoch()
        times.append(time.perf_counter() - start)
        stats.append(comm.comm_stats())
        exchanges.append(exchange)
    return dict(
        rss_before_mib=rss_before,
        maxrss_before_mib=maxrss_before, maxrss_after_mib=maxrss_after,
        mem_delta_mib=maxrss_after - maxrss_before,
        epoch_peak_over_rss_mib=(hwm_after - rss_before
                                 if hwm_after is not None else None),
        first_epoch_s=first_s, epoch_times_s=times,
        epoch_s=statistics.median(times),
        exchange_bytes_received=exchanges[-1]['bytes_received'],
        exchange_bytes_sent=exchanges[-1]['bytes_sent'],
        bytes_received=stats[-1]['bytes_received'],
        bytes_sent=stats[-1]['bytes_sent'],
        messages_sent=stats[-1]['messages_sent'])


def finish_worker(result: Dict[str, Any], path: str) -> None:
    """Writes the worker's result and leaves the process group."""
    with open(path, 'w') as f:
        json.dump(result, f)
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()


# Driver ######################################################################

def write_results(out: str, name: str, result: Dict[str, Any],
                  plot: Callable[[List[dict], str], None],
                  rows: List[dict]) -> None:
    """``<out>/<name>.json`` and the plot ``<out>/<name>.png``."""
    with open(osp.join(out, f'{name}.json'), 'w') as f:
        json.dump(result, f, indent=1)
    plot(rows, osp.join(out, f'{name}.png'))
    print(f"wrote {osp.join(out, name)}.json/.png")


# Driver scripts ##############################################################

def add_internal_args(parser: argparse.ArgumentParser,
                      *names: str) -> None:
    """The flags a driver passes to its own worker and preparation runs,
    hidden from ``--help``: ``--worker``, ``--prepare``, ``--impl`` (``pyg``
    or ``sar``), ``--parts``, ``--result`` and the string options
    ``names``."""
    for flag in ('--worker', '--prepare'):
        parser.add_argument(flag, action='store_true', help=argparse.SUPPRESS)
    parser.add_argument('--impl', choices=('pyg', 'sar'),
                        help=argparse.SUPPRESS)
    for name in ('--parts', '--result', *names):
        parser.add_argument(name, help=argparse.SUPPRESS)


def run_script(args, worker: Callable, prepare: Callable,
               main: Callable) -> None:
    """A driver's entry point: one worker, the data preparation, or the
    whole benchmark (whose return value is the exit status)."""
    if args.worker:
        worker(args)
    elif args.prepare:
        prepare(args)
    else:
        sys.exit(main(args))
