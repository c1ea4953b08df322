"""Training checkpoints: save on every rank, resume exactly where it stopped.

A checkpoint is a directory ``DIR/epoch-<K>``::

    epoch-7/
      .metadata, __0_0.distcp, ...   model and optimizer tensors (DCP)
      rank-0.pt, rank-1.pt, ...      per rank: RNG states, the non-tensor
                                     part of the optimizer state (param
                                     groups), LR scheduler
      meta.json                      epoch, world size, partition
                                     fingerprint, ``extra`` (rank 0, last)

**Storage.** Parameters of a full-batch model are replicated: every rank
holds the same weights and, after :func:`pyg_sar.all_reduce_grads`, the same
optimizer state. Their tensors go through ``torch.distributed.checkpoint``
(DCP, via :func:`pyg_sar.comm.save_replicated`): DCP's default planner
deduplicates keys that several ranks save, so each tensor is written once
(spread over the ranks) instead of once per rank. DCP assumes the replicas
are equal and would silently keep one of them, so :func:`save` compares a
digest of every tensor across ranks first and refuses replicas that differ.
DCP does not take the rest: it pickles non-tensor values (optimizer
``param_groups``, scheduler state) and reads them back with
``torch.load(weights_only=False)``, and it would merge per-rank values under
one key. Those, and the RNG states, which differ per rank (each rank draws
dropout masks for its own nodes), are a plain per-rank ``torch.save`` read
back with ``weights_only=True``. The checkpoint directory must be visible to
every rank (one machine, or a shared file system), as DCP requires.

**Atomicity.** Ranks write into ``DIR/.epoch-<K>.tmp``; once every rank has
finished, rank 0 writes ``meta.json`` and renames the directory to
``DIR/epoch-<K>`` (``os.rename`` is atomic). A crash at any point leaves
either the new checkpoint complete or only a temporary directory, which
:func:`latest` ignores and the next save of that epoch removes; earlier
checkpoints are never touched.

**RNG.** Python's ``random``, NumPy's legacy global generator, torch's CPU
generator and every CUDA device generator (when CUDA is available) are saved
and restored per rank. The SAR engine draws its attention-dropout seeds from
torch's generator (``pyg_sar/nn/engine/plan.py``) and checkpointed chunks
replay torch's state, so a resumed run draws the same masks as an
uninterrupted one.
"""
from __future__ import annotations

import hashlib
import json
import os
import os.path as osp
import random
import re
import shutil
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from pyg_sar import comm

__all__ = ['save', 'load', 'resume', 'latest', 'checkpoints', 'rng_state',
           'set_rng_state', 'save_weights', 'FORMAT_VERSION']

FORMAT_VERSION = 1
META_FILE = 'meta.json'
_NAME = re.compile(r'^epoch-(\d+)$')
_MODEL, _OPTIM = 'model.', 'optimizer.state.'


# Finding checkpoints #########################################################

def checkpoint_path(directory: str, epoch: int) -> str:
    """``directory/epoch-<epoch>``."""
    return osp.join(os.fspath(directory), f'epoch-{int(epoch)}')


def _tmp_path(directory: str, epoch: int) -> str:
    return osp.join(os.fspath(directory), f'.epoch-{int(epoch)}.tmp')


def checkpoints(directory: str) -> List[Tuple[int, str]]:
    """The complete checkpoints in ``directory`` as ``(epoch, path)``,
    oldest first. Temporary directories of interrupted saves are not
    listed."""
    directory = os.fspath(directory)
    if not osp.isdir(directory):
        return []
    found = []
    for name in os.listdir(directory):
        match = _NAME.match(name)
        path = osp.join(directory, name)
        if match and osp.isfile(osp.join(path, META_FILE)):
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest(directory: str) -> Optional[str]:
    """The path of the newest complete checkpoint in ``directory`` (None if
    there is none)."""
    found = checkpoints(directory)
    return found[-1][1] if found else None


# RNG states ##################################################################

def rng_state() -> Dict[str, Any]:
    """This process's random states: Python ``random``, NumPy's global
    generator, torch CPU and (when available) every CUDA device."""
    import numpy as np
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        'python': random.getstate(),
        'numpy': {'name': str(name),
                  'keys': torch.from_numpy(keys.astype(np.int64)),
                  'pos': int(pos), 'has_gauss': int(has_gauss),
                  'cached_gaussian': float(cached)},
        'torch': torch.get_rng_state(),
        'cuda': (torch.cuda.get_rng_state_all()
                 if torch.cuda.is_available() else None),
    }


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restores what :func:`rng_state` returned."""
    import numpy as np
    cuda = state.get('cuda')
    if cuda is not None:
        devices = torch.cuda.device_count() if torch.cuda.is_available() \
            else 0
        if devices != len(cuda):
            raise ValueError(f"the checkpoint holds the RNG states of "
                             f"{len(cuda)} CUDA devices but this process "
                             f"sees {devices}")
    version, internal, gauss = state['python']
    random.setstate((version, tuple(internal), gauss))
    n = state['numpy']
    np.random.set_state((n['name'], n['keys'].numpy().astype(np.uint32),
                         n['pos'], n['has_gauss'], n['cached_gaussian']))
    torch.set_rng_state(state['torch'])
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


# Helpers #####################################################################

_ERRORS = {c.__name__: c for c in (ValueError, TypeError, FileExistsError,
                                   FileNotFoundError, PermissionError,
                                   OSError)}


def _agree(error: Optional[BaseException], payload: Any = None) -> List:
    """Collective: gathers every rank's error and payload; raises the first
    rank's error on every rank, so that no rank waits for a failed one."""
    gathered = comm.all_gather_object(
        (None if error is None else (type(error).__name__, str(error)),
         payload))
    for failed, _ in gathered:
        if failed is not None:
            kind = _ERRORS.get(failed[0], RuntimeError)
            raise kind(failed[1]) from error
    return [p for _, p in gathered]


def _digest(tensor: Tensor) -> str:
    flat = tensor.detach().reshape(-1).contiguous().cpu()
    h = hashlib.blake2b(digest_size=16)
    h.update(f'{tuple(tensor.shape)}{tensor.dtype}'.encode())
    h.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else
             b'')
    return h.hexdigest()


def _split_optimizer(optimizer) -> Tuple[Dict[str, Tensor], Dict[str, Any]]:
    state = optimizer.state_dict()
    tensors, other = {}, {}
    for index, values in state['state'].items():
        for key, value in values.items():
            if isinstance(value, Tensor):
                tensors[f'{_OPTIM}{int(index)}.{key}'] = value
            else:
                other.setdefault(int(index), {})[key] = value
    return tensors, {'param_groups': state['param_groups'],
                     'state_other': other}


def _fsync_write(path: str, write) -> None:
    with open(path, 'wb') as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# Save ########################################################################

def save(directory: str, epoch: int, model: torch.nn.Module,
         optimizer: Optional[torch.optim.Optimizer] = None, scheduler=None,
         *, fingerprint: Optional[str] = None,
         extra: Optional[Dict[str, Any]] = None) -> str:
    """Writes the checkpoint of ``epoch`` to ``directory/epoch-<epoch>``
    (collective: every rank calls it) and returns its path.

    ``model`` and ``optimizer`` must be replicas (equal on every rank);
    ``scheduler`` is an optional LR scheduler; ``fingerprint`` is the
    partition set's ``part.fingerprint``, checked by :func:`load`;
    ``extra`` is JSON-serializable data returned by :func:`load` (e.g. the
    loss history). Every rank returns once the checkpoint is complete; an
    error on any rank raises on every rank and leaves no complete
    checkpoint of ``epoch``.
    """
    directory = os.fspath(directory)
    rank, world_size = comm.get_rank(), comm.get_world_size()
    final, tmp = checkpoint_path(directory, epoch), _tmp_path(directory,
                                                              epoch)

    # 1. Local checks, digests of the replicas, and a fresh temp directory.
    error, digests = None, None
    try:
        if isinstance(epoch, bool) or not isinstance(epoch, int) or \
                epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0 (got "
                             f"{epoch!r})")
        meta_text = json.dumps({
            'format': FORMAT_VERSION, 'epoch': epoch,
            'world_size': world_size, 'fingerprint': fingerprint,
            'extra': extra or {}, 'torch': torch.__version__,
            'time': time.time()}, indent=1, allow_nan=True)
        model_state = model.state_dict()
        tensors = {_MODEL + k: v for k, v in model_state.items()
                   if isinstance(v, Tensor)}
        rank_state: Dict[str, Any] = {
            'format': FORMAT_VERSION, 'rank': rank,
            'world_size': world_size, 'epoch': epoch,
            'fingerprint': fingerprint,
            'model_other': {k: v for k, v in model_state.items()
                            if not isinstance(v, Tensor)},
            'optimizer': None,
            'scheduler': scheduler.state_dict() if scheduler is not None
            else None,
        }
        if optimizer is not None:
            optim_tensors, rank_state['optimizer'] = _split_optimizer(
                optimizer)
            tensors.update(optim_tensors)
        digests = {k: _digest(v) for k, v in tensors.items()}
        if rank == 0:
            if osp.exists(final):
                raise FileExistsError(
                    f"checkpoint '{final}' already exists; resume from it "
                    f"or use another checkpoint directory")
            os.makedirs(directory, exist_ok=True)
            if osp.lexists(tmp):  # left by a crash while saving this epoch
                shutil.rmtree(tmp)
            os.makedirs(tmp)
    except Exception as e:  # every rank must hear of it
        error = e
    everyone = _agree(error, digests)
    for other_rank, other in enumerate(everyone):
        if other != everyone[0]:
            keys = sorted(set(other) ^ set(everyone[0])) or sorted(
                k for k in other if other[k] != everyone[0][k])
            raise ValueError(
                f"rank {other_rank} and rank 0 hold different values of "
                f"{keys[0]!r}; a checkpoint stores replicated model and "
                f"optimizer state once, so it must be equal on every rank "
                f"(sync_params and all_reduce_grads keep it so)")

    # 2. Replicated tensors (DCP, deduplicated) and this rank's own state.
    comm.save_replicated(tensors, tmp)
    rank_state['rng'] = rng_state()
    error = None
    try:
        _fsync_write(osp.join(tmp, f'rank-{rank}.pt'),
                     lambda f: torch.save(rank_state, f))
    except Exception as e:
        error = OSError(f"rank {rank}: writing '{tmp}/rank-{rank}.pt' "
                        f"failed: {e}")
    _agree(error)

    # 3. Commit: rank 0 writes the metadata last and renames atomically.
    error = None
    if rank == 0:
        try:
            _fsync_write(osp.join(tmp, META_FILE),
                         lambda f: f.write(meta_text.encode()))
            _fsync_dir(tmp)
            os.rename(tmp, final)
            _fsync_dir(directory)
        except Exception as e:
            error = OSError(f"committing checkpoint '{final}' failed: {e}")
    _agree(error)
    return final


# Load ########################################################################

def _read_meta(path: str) -> Dict[str, Any]:
    meta_path = osp.join(path, META_FILE)
    if not osp.isfile(meta_path):
        raise FileNotFoundError(f"'{meta_path}' not found; '{path}' is not "
                                f"a complete pyg_sar checkpoint")
    try:
        with open(meta_path) as f:
            meta = json.load(f)
        int(meta['epoch']), int(meta['world_size'])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"checkpoint metadata '{meta_path}' is unreadable "
                         f"or corrupt ({type(e).__name__}: {e})") from e
    if meta.get('format') != FORMAT_VERSION:
        raise ValueError(f"checkpoint '{path}' has format "
                         f"{meta.get('format')!r}; this pyg_sar reads "
                         f"format {FORMAT_VERSION}")
    return meta


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
    stored = {k[len(_MODEL):]: v for k, v in specs.items()
              if k.startswith(_MODEL)}
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
    wanted = {k: v for k, v in specs.items() if k.startswith(_MODEL) or
              (optimizer is not None and k.startswith(_OPTIM))}
    return {k: torch.empty(size, dtype=dtype)
            for k, (size, dtype) in wanted.items()}


def load(path: str, model: torch.nn.Module,
         optimizer: Optional[torch.optim.Optimizer] = None, scheduler=None,
         *, fingerprint: Optional[str] = None,
         expect: Optional[Dict[str, Any]] = None,
         restore_rng: bool = True) -> Dict[str, Any]:
    """Restores the checkpoint ``path`` (collective) into ``model``,
    ``optimizer`` and ``scheduler``, and this rank's RNG states.

    Refused with a ``ValueError`` on every rank when the checkpoint was
    written by a different number of workers, for a partition set with a
    different ``fingerprint`` (None: not checked), or with ``extra`` values
    other than ``expect``. Returns ``{'epoch', 'path', 'extra'}``.
    """
    path = os.fspath(path)
    rank, world_size = comm.get_rank(), comm.get_world_size()
    error, meta = None, None
    try:
        meta = _read_meta(path)
        _check_meta(path, meta, world_size, fingerprint, expect)
        rank_file = osp.join(path, f'rank-{rank}.pt')
        if not osp.isfile(rank_file):
            raise FileNotFoundError(f"'{rank_file}' not found; checkpoint "
                                    f"'{path}' is incomplete")
        try:
            rank_state = torch.load(rank_file, weights_only=True)
        except Exception as e:
            raise ValueError(f"'{rank_file}' is unreadable or corrupt "
                             f"({type(e).__name__})") from e
        if (rank_state.get('rank'), rank_state.get('epoch')) != \
                (rank, int(meta['epoch'])):
            raise ValueError(f"'{rank_file}' belongs to rank "
                             f"{rank_state.get('rank')} epoch "
                             f"{rank_state.get('epoch')}, not rank {rank} "
                             f"epoch {meta['epoch']}")
        if optimizer is not None and rank_state['optimizer'] is None:
            raise ValueError(f"checkpoint '{path}' holds no optimizer state")
        tensors = _allocate(path, comm.replicated_specs(path), model,
                            optimizer)
    except Exception as e:
        error = e
    _agree(error)

    comm.load_replicated(tensors, path)
    error = None
    try:
        model_state = {k[len(_MODEL):]: v for k, v in tensors.items()
                       if k.startswith(_MODEL)}
        model_state.update(rank_state['model_other'])
        model.load_state_dict(model_state, strict=True)
        if optimizer is not None:
            saved = rank_state['optimizer']
            state: Dict[int, Dict[str, Any]] = {
                int(i): dict(v) for i, v in saved['state_other'].items()}
            for key, value in tensors.items():
                if key.startswith(_OPTIM):
                    index, name = key[len(_OPTIM):].split('.', 1)
                    state.setdefault(int(index), {})[name] = value
            optimizer.load_state_dict({'state': state,
                                       'param_groups': saved['param_groups']})
        if scheduler is not None:
            if rank_state['scheduler'] is None:
                raise ValueError(f"checkpoint '{path}' holds no LR "
                                 f"scheduler state")
            scheduler.load_state_dict(rank_state['scheduler'])
        if restore_rng:
            set_rng_state(rank_state['rng'])
    except Exception as e:
        error = e if isinstance(e, ValueError) else ValueError(
            f"restoring checkpoint '{path}' failed: "
            f"{str(e).strip().splitlines()[0] if str(e).strip() else e!r}")
    _agree(error)
    return {'epoch': int(meta['epoch']), 'path': path,
            'extra': meta.get('extra') or {}}


def resume(directory: str, model: torch.nn.Module,
           optimizer: Optional[torch.optim.Optimizer] = None, scheduler=None,
           *, fingerprint: Optional[str] = None,
           expect: Optional[Dict[str, Any]] = None) -> Optional[Dict]:
    """Loads the newest complete checkpoint of ``directory`` (rank 0's
    choice, so every rank loads the same one; collective). Returns what
    :func:`load` returns, or None when there is no checkpoint yet."""
    choice = comm.all_gather_object(
        latest(directory) if comm.get_rank() == 0 else None)[0]
    if choice is None:
        return None
    return load(choice, model, optimizer, scheduler, fingerprint=fingerprint,
                expect=expect)


# Trained weights #############################################################

def save_weights(model: torch.nn.Module, path: str) -> None:
    """Writes ``model.state_dict()`` to ``path`` atomically (temporary file
    in the same directory, then ``os.replace``). Call it on one rank."""
    path = os.fspath(path)
    folder = osp.dirname(osp.abspath(path))
    if not osp.isdir(folder):
        raise FileNotFoundError(f"cannot write '{path}': directory "
                                f"'{folder}' does not exist")
    tmp = osp.join(folder, f'.{osp.basename(path)}.tmp-{os.getpid()}')
    state = {k: v.detach().cpu() if isinstance(v, Tensor) else v
             for k, v in model.state_dict().items()}
    try:
        _fsync_write(tmp, lambda f: torch.save(state, f))
        os.replace(tmp, path)
    except BaseException:
        if osp.lexists(tmp):
            os.remove(tmp)
        raise
    _fsync_dir(folder)
