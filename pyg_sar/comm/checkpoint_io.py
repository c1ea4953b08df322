"""Checkpoint storage of replicated tensors.

torch.distributed.checkpoint (DCP) for tensors that are the same on every
rank (model and optimizer state of replicated modules): DCP's default save
planner deduplicates equal keys across ranks, so each tensor is written
once, by the least-loaded rank. Its coordination runs on the default
process group, whose waits are bounded by init_distributed's timeout.
"""
from __future__ import annotations

from typing import Dict, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from pyg_sar.comm.process_group import get_rank
from pyg_sar.comm.state import _STATS


def _dcp_no_dist() -> bool:
    return not (dist.is_available() and dist.is_initialized())


def _dcp_error(what: str, path: str, e: BaseException) -> OSError:
    first = str(e).strip().splitlines()
    return OSError(f"rank {get_rank()}: {what} '{path}' failed: "
                   f"{type(e).__name__}: {first[0] if first else ''}")


def save_replicated(tensors: Dict[str, Tensor], path: str) -> None:
    """Writes ``{name: tensor}`` into the directory ``path`` (collective).

    Every rank passes the same names with equal tensors (replicas); each
    tensor is stored once across all ranks. Only tensors: DCP pickles other
    values and reads them back with ``weights_only=False``.
    """
    import warnings

    from torch.distributed import checkpoint as dcp
    bad = [k for k, v in tensors.items() if not isinstance(v, Tensor)]
    if bad:
        raise TypeError(f"save_replicated takes tensors only (got "
                        f"{type(tensors[bad[0]]).__name__} for {bad[0]!r})")
    _STATS['collectives'] += 1
    try:
        with warnings.catch_warnings():  # "assuming ... a single process"
            warnings.simplefilter('ignore', UserWarning)
            dcp.save(tensors, storage_writer=dcp.FileSystemWriter(
                path, sync_files=True), no_dist=_dcp_no_dist())
    except Exception as e:
        raise _dcp_error('writing checkpoint tensors to', path, e) from e


def replicated_specs(path: str) -> Dict[str, Tuple[torch.Size, torch.dtype]]:
    """Names, shapes and dtypes of the tensors :func:`save_replicated`
    wrote into ``path`` (local read of its metadata file)."""
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    try:
        metadata = dcp.FileSystemReader(path).read_metadata()
    except Exception as e:
        raise _dcp_error('reading checkpoint metadata of', path, e) from e
    return {name: (m.size, m.properties.dtype)
            for name, m in metadata.state_dict_metadata.items()
            if isinstance(m, TensorStorageMetadata)}


def load_replicated(tensors: Dict[str, Tensor], path: str) -> None:
    """Fills ``{name: tensor}`` in place from ``path`` (collective; every
    rank reads every tensor)."""
    import warnings

    from torch.distributed import checkpoint as dcp
    _STATS['collectives'] += 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', UserWarning)
            dcp.load(tensors, storage_reader=dcp.FileSystemReader(path),
                     no_dist=_dcp_no_dist())
    except Exception as e:
        raise _dcp_error('reading checkpoint tensors from', path, e) from e
