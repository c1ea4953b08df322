"""Runs a function in N local processes joined by a gloo process group."""
from __future__ import annotations

import os
import pickle
import tempfile
import traceback
from datetime import timedelta
from typing import Any, Callable, List

import torch.multiprocessing as mp


def _worker(rank: int, world_size: int, port: int, fn: Callable,
            args: tuple, out_dir: str, timeout_s: float) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank), MASTER_ADDR='127.0.0.1',
                      MASTER_PORT=str(port))
    import torch
    torch.set_num_threads(1)
    from pyg_sar.comm import init_distributed
    path = os.path.join(out_dir, f'{rank}.pkl')
    try:
        init_distributed(backend='gloo',
                                 timeout=timedelta(seconds=timeout_s))
        # Every exchange buffer goes through the reuse pool, whatever its
        # size (by default only those of 1 MiB and more: test graphs have
        # none), so the exactness tests cover reused buffers.
        from pyg_sar import comm
        comm.configure(reuse_buffers_from=0)
        result = fn(rank, world_size, *args)
        payload = ('ok', result)
    except BaseException:  # report every failure to the parent
        payload = ('error', traceback.format_exc())
    with open(path, 'wb') as f:
        pickle.dump(payload, f)
    import torch.distributed as dist
    if dist.is_initialized() and payload[0] == 'ok':
        dist.destroy_process_group()


def run_workers(fn: Callable, world_size: int, *args: Any,
                timeout_s: float = 60.0, expect_errors: bool = False) -> List:
    """Calls ``fn(rank, world_size, *args)`` in ``world_size`` processes.

    Returns the per-rank results. A worker's exception fails the caller with
    the worker's traceback, unless ``expect_errors``: then the list holds
    ``('error', traceback)`` or ``('ok', result)`` per rank.
    """
    from pyg_sar.comm import find_free_port
    port = find_free_port()
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.get_context('spawn')
        procs = [ctx.Process(target=_worker, args=(r, world_size, port, fn,
                                                   args, out_dir, timeout_s))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=timeout_s * 4 + 60)
            if p.is_alive():
                p.kill()
        payloads = []
        for r in range(world_size):
            path = os.path.join(out_dir, f'{r}.pkl')
            if not os.path.exists(path):
                payloads.append(('error', f'rank {r} exited without a result '
                                 f'(exit code {procs[r].exitcode})'))
                continue
            with open(path, 'rb') as f:
                payloads.append(pickle.load(f))
    if expect_errors:
        return payloads
    errors = [f'--- rank {r} ---\n{p[1]}' for r, p in enumerate(payloads)
              if p[0] != 'ok']
    if errors:
        raise AssertionError('distributed worker failed:\n' +
                             '\n'.join(errors))
    return [p[1] for p in payloads]


def test_device():
    """Where the exactness tests put graphs, models and features:
    ``PYG_SAR_TEST_DEVICE`` (e.g. ``cuda``; every rank on the same GPU,
    exchanging through gloo), default CPU."""
    import torch
    return torch.device(os.environ.get('PYG_SAR_TEST_DEVICE', 'cpu'))


test_device.__test__ = False  # a helper, not a test (imported by tests)


def halo_slices_with_chunks(chunk) -> None:
    """The exactness tests' chunked runs also move halo rows in slices of a
    few rows (``halo_slice_bytes``; the default, 8 MiB, is more than these
    graphs' whole halo); the other runs use the default."""
    import pyg_sar
    from pyg_sar.comm.state import CommConfig
    pyg_sar.comm.configure(halo_slice_bytes=TINY_HALO_SLICES if chunk
                           else CommConfig().halo_slice_bytes)


TINY_HALO_SLICES = 100  # bytes: a few rows of the test graphs' features


def to_cpu(value):
    """``value`` with every tensor inside moved to the CPU (results go back
    to the parent, which compares on the CPU)."""
    import torch
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value
