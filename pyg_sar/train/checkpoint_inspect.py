"""What every rank checks of a checkpoint before anything of it is loaded,
and how the ranks agree on the outcome.

**Trust.** Nothing read back is trusted. Before anything is loaded, every
rank checks ``meta.json`` against its checksum and every file it will read
against the size and hash ``meta.json`` records
(:mod:`pyg_sar.train.checkpoint_format`); DCP's ``.metadata`` is unpickled
with an allowlist of the format's own classes
(:mod:`pyg_sar.train.checkpoint_io`) and the per-rank files with
``weights_only=True``. The checkpoint must also fit this run: the world
size, the partition fingerprint, the ``extra`` values expected and the
model's tensors. :func:`inspect_everywhere` runs these checks on every
rank; a checkpoint that fails them on any rank fails on all
(:func:`agree`), as a :class:`~pyg_sar.train.checkpoint.CorruptCheckpointError`
when any rank found it corrupt, so that all ranks skip it alike.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.train import checkpoint_io
from pyg_sar.train.checkpoint_format import (MODEL_PREFIX, OPTIMIZER_PREFIX,
                                             CorruptCheckpointError, corrupt,
                                             read_meta, verify)

__all__ = ['agree', 'inspect_everywhere']

_ERRORS = {c.__name__: c for c in (ValueError, TypeError, FileExistsError,
                                   FileNotFoundError, PermissionError,
                                   OSError, CorruptCheckpointError)}


def agree(error: Optional[BaseException], payload: Any = None) -> List:
    """Collective: gathers every rank's error and payload; raises one
    rank's error on every rank, so that no rank waits for a failed one: a
    :class:`~pyg_sar.train.checkpoint.CorruptCheckpointError` if any rank
    found the checkpoint corrupt (so that all ranks skip it alike), else
    the first rank's. Returns every rank's payload, by rank."""
    gathered = comm.all_gather_object(
        (None if error is None else (type(error).__name__, str(error)),
         payload))
    failures = [failed for failed, _ in gathered if failed is not None]
    if failures:
        name, message = next(
            (f for f in failures if f[0] == CorruptCheckpointError.__name__),
            failures[0])
        raise _ERRORS.get(name, RuntimeError)(message) from error
    return [p for _, p in gathered]


def _workers(meta: Dict[str, Any]) -> str:
    n = int(meta['world_size'])
    return f"{n} worker{'s' if n != 1 else ''}"


def _check_meta(path: str, meta: Dict[str, Any], world_size: int,
                fingerprint: Optional[str],
                expect: Optional[Dict[str, Any]]) -> None:
    if int(meta['world_size']) != world_size:
        raise ValueError(
            f"checkpoint '{path}' was written by {_workers(meta)} but "
            f"this run has {world_size}; resume with {_workers(meta)} or "
            f"use a fresh checkpoint directory")
    if fingerprint is not None and meta.get('fingerprint') != fingerprint:
        raise ValueError(
            f"checkpoint '{path}' was written for partition set "
            f"{str(meta.get('fingerprint'))[:16]} but this run loaded "
            f"{str(fingerprint)[:16]} (different partitions); resume on "
            f"the partitions it was trained on or use a fresh checkpoint "
            f"directory")
    stored = meta.get('extra') or {}
    for key, value in (expect or {}).items():
        if key not in stored:
            raise ValueError(f"checkpoint '{path}' does not record {key!r}")
        if stored[key] != value:
            if isinstance(value, dict) and isinstance(stored[key], dict):
                diff = sorted(k for k in set(value) | set(stored[key])
                              if value.get(k) != stored[key].get(k))
                shown = ', '.join(f'{k}={stored[key].get(k)!r} there, '
                                  f'{value.get(k)!r} here' for k in diff)
            else:
                shown = f'{stored[key]!r} there, {value!r} here'
            raise ValueError(f"checkpoint '{path}' was written with a "
                             f"different {key} ({shown}); use the same "
                             f"options or a fresh checkpoint directory")


def _allocate(path: str, specs, model: torch.nn.Module,
              optimizer) -> Dict[str, Tensor]:
    own = {k: v for k, v in model.state_dict().items()
           if isinstance(v, Tensor)}
    stored = {k[len(MODEL_PREFIX):]: v for k, v in specs.items()
              if k.startswith(MODEL_PREFIX)}
    if set(own) != set(stored):
        missing, unexpected = sorted(set(own) - set(stored)), \
            sorted(set(stored) - set(own))
        raise ValueError(f"checkpoint '{path}' holds a different model "
                         f"(missing: {missing[:4]}, unexpected: "
                         f"{unexpected[:4]})")
    for key, value in own.items():
        size, dtype = stored[key]
        if tuple(size) != tuple(value.shape) or dtype != value.dtype:
            raise ValueError(
                f"checkpoint '{path}': model tensor {key!r} is "
                f"{list(size)} {dtype} there but {list(value.shape)} "
                f"{value.dtype} here")
    wanted = {k: v for k, v in specs.items() if k.startswith(MODEL_PREFIX)
              or (optimizer is not None and k.startswith(OPTIMIZER_PREFIX))}
    return {k: torch.empty(size, dtype=dtype)
            for k, (size, dtype) in wanted.items()}


def _inspect(path: str, model: torch.nn.Module, optimizer,
             fingerprint: Optional[str], expect: Optional[Dict[str, Any]]):
    """This rank's checks of the checkpoint ``path`` before anything is
    loaded: the manifest, the compatibility with this run, the hash of
    every file this rank reads, then the files' contents (read safely).
    Returns ``(meta, rank_state, tensors to fill)``."""
    rank, world_size = comm.get_rank(), comm.get_world_size()
    meta = read_meta(path)
    _check_meta(path, meta, world_size, fingerprint, expect)
    verify(path, meta, checkpoint_io.METADATA_FILE)
    try:
        data_files = checkpoint_io.replicated_files(path)
        specs = checkpoint_io.replicated_specs(path)
    except checkpoint_io.UnsafeMetadataError as e:
        raise corrupt(path, f"'{checkpoint_io.METADATA_FILE}' is "
                      f"refused: "
                      f"{e.reason}") from None
    except OSError as e:
        raise corrupt(path, str(e)) from None
    for name in data_files:
        verify(path, meta, name)
    rank_name = f'rank-{rank}.pt'
    rank_file = verify(path, meta, rank_name)
    try:
        rank_state = torch.load(rank_file, weights_only=True)
    except Exception as e:
        raise corrupt(path, f"'{rank_name}' is unreadable: "
                      f"{type(e).__name__}") from None
    if not isinstance(rank_state, dict) or \
            (rank_state.get('rank'), rank_state.get('epoch')) != \
            (rank, meta['epoch']):
        raise corrupt(path, f"'{rank_name}' does not hold the state of "
                      f"rank {rank} at epoch {meta['epoch']}")
    if optimizer is not None and rank_state.get('optimizer') is None:
        raise ValueError(f"checkpoint '{path}' holds no optimizer state")
    return meta, rank_state, _allocate(path, specs, model, optimizer)


def inspect_everywhere(path: str, model: torch.nn.Module, optimizer,
                       fingerprint: Optional[str],
                       expect: Optional[Dict[str, Any]]):
    """Collective: this rank's checks of the checkpoint ``path`` (see the
    module docstring); every rank raises if any rank failed (a
    :class:`~pyg_sar.train.checkpoint.CorruptCheckpointError` first).
    Returns ``(meta, rank_state, tensors to fill)``."""
    error, inspected = None, None
    try:
        inspected = _inspect(path, model, optimizer, fingerprint, expect)
    except Exception as e:
        error = e
    agree(error)
    return inspected
