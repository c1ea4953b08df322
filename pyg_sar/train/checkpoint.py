"""Training checkpoints: save on every rank, resume exactly where it stopped,
or from the newest checkpoint that is intact.

A checkpoint is a directory ``DIR/epoch-<K>`` (its format and manifest:
:mod:`pyg_sar.train.checkpoint_format`)::

    epoch-7/
      .metadata, __0_0.distcp, ...   model and optimizer tensors (DCP)
      rank-0.pt, rank-1.pt, ...      per rank: RNG states, the non-tensor
                                     part of the optimizer state (param
                                     groups), LR scheduler
      meta.json                      the manifest: epoch, world size,
                                     partition fingerprint, ``extra``, the
                                     size and SHA-256 of every other file,
                                     and a checksum of itself (rank 0,
                                     last)

Nothing read back is trusted: every rank checks a checkpoint before
anything of it is loaded (:mod:`pyg_sar.train.checkpoint_inspect`). One
that fails is a :class:`CorruptCheckpointError`; :func:`resume` sets it
aside as ``epoch-<K>.corrupt`` and resumes from the newest one that passes.

**Storage.** Parameters of a full-batch model are replicated: every rank
holds the same weights and, after :func:`pyg_sar.all_reduce_grads`, the same
optimizer state. Their tensors go through ``torch.distributed.checkpoint``
(DCP, via :func:`pyg_sar.train.checkpoint_io.save_replicated`): DCP's
default planner deduplicates keys that several ranks save, so each tensor
is written once (spread over the ranks) instead of once per rank. DCP
assumes the replicas are equal and would silently keep one of them, so
:func:`save` compares a digest of every tensor across ranks first and
refuses replicas that differ.
DCP does not take the rest: it pickles non-tensor values (optimizer
``param_groups``, scheduler state) and reads them back with
``torch.load(weights_only=False)``, and it would merge per-rank values under
one key. Those, and the RNG states, which differ per rank (each rank draws
dropout masks for its own nodes), are a plain per-rank ``torch.save`` read
back with ``weights_only=True``. The checkpoint directory must be visible to
every rank (one machine, or a shared file system), as DCP requires.

**Atomicity.** Ranks write into ``DIR/.epoch-<K>.tmp``; once every rank
has finished, rank 0 hashes the files, writes ``meta.json`` (atomically)
and renames the directory to ``DIR/epoch-<K>``
(``os.rename`` is atomic). A crash at any point leaves either the new
checkpoint complete or only a temporary directory, which :func:`latest`
ignores and the next save of that epoch removes. With ``keep_last`` the
older checkpoints beyond the newest ``keep_last`` are deleted once the new
one is complete.

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
import shutil
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.train import checkpoint_io
from pyg_sar.train.checkpoint_format import (CORRUPT_SUFFIX, FORMAT_VERSION,
                                             META_FILE, MODEL_PREFIX,
                                             OPTIMIZER_PREFIX,
                                             CorruptCheckpointError,
                                             checkpoint_path, epoch_of,
                                             is_trash, seal, tmp_path,
                                             trash_path)
from pyg_sar.train.checkpoint_inspect import agree, inspect_everywhere
from pyg_sar.train.files import (fsync_dir, hash_tree, write_atomically,
                                 write_text_atomically)

__all__ = ['save', 'load', 'resume', 'latest', 'checkpoints', 'rng_state',
           'set_rng_state', 'save_weights', 'CorruptCheckpointError',
           'FORMAT_VERSION']

def _warn(message: str) -> None:
    """One line on stderr (one write, so that ranks do not interleave)."""
    sys.stderr.write(f'warning: {message}\n')
    sys.stderr.flush()


# Finding checkpoints #########################################################

def checkpoints(directory: str) -> List[Tuple[int, str]]:
    """The complete checkpoints in ``directory`` as ``(epoch, path)``,
    oldest first. Temporary directories of interrupted saves are not
    listed, nor checkpoints set aside as corrupt. (Complete means
    committed; whether the files are intact is checked when loading.)"""
    directory = os.fspath(directory)
    if not osp.isdir(directory):
        return []
    found = []
    for name in os.listdir(directory):
        epoch = epoch_of(name)
        path = osp.join(directory, name)
        if epoch is not None and osp.isfile(osp.join(path, META_FILE)):
            found.append((epoch, path))
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

def check_count(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or \
            value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum} (got "
                         f"{value!r})")


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
                tensors[f'{OPTIMIZER_PREFIX}{int(index)}.{key}'] = value
            else:
                other.setdefault(int(index), {})[key] = value
    return tensors, {'param_groups': state['param_groups'],
                     'state_other': other}


def _prune(directory: str, keep_last: int, keep: str) -> None:
    """Deletes the complete checkpoints of ``directory`` older than the
    ``keep_last`` newest, never ``keep`` (rank 0, after a commit). Each is
    renamed to a hidden ``.epoch-<K>.old`` first, so that a crash halfway
    through never leaves a half-deleted checkpoint that looks complete
    (leftovers are removed by the next prune). A failure is reported, not
    raised: the new checkpoint is complete."""
    try:
        doomed = [path for _, path in checkpoints(directory)[:-keep_last]
                  if path != keep]
        for path in doomed:
            trash = trash_path(path)
            if osp.lexists(trash):
                shutil.rmtree(trash)
            os.rename(path, trash)
        for name in os.listdir(directory):
            if is_trash(name):
                shutil.rmtree(osp.join(directory, name))
    except OSError as e:
        _warn(f"could not delete the checkpoints of '{directory}' older "
              f"than the newest {keep_last} (keep_last): {e}")


# Save ########################################################################

def save(directory: str, epoch: int, model: torch.nn.Module,
         optimizer: Optional[torch.optim.Optimizer] = None, scheduler=None,
         *, fingerprint: Optional[str] = None,
         extra: Optional[Dict[str, Any]] = None,
         keep_last: Optional[int] = None) -> str:
    """Writes the checkpoint of ``epoch`` to ``directory/epoch-<epoch>``
    (collective: every rank calls it) and returns its path.

    ``model`` and ``optimizer`` must be replicas (equal on every rank);
    ``scheduler`` is an optional LR scheduler; ``fingerprint`` is the
    partition set's ``part.fingerprint``, checked by :func:`load`;
    ``extra`` is JSON-serializable data returned by :func:`load` (e.g. the
    loss history). ``keep_last`` (an integer >= 1; None keeps all): once
    the new checkpoint is complete, only the ``keep_last`` newest complete
    checkpoints of ``directory`` are kept, the new one always. Every rank
    returns once the checkpoint is complete; an error on any rank raises on
    every rank and leaves no complete checkpoint of ``epoch``.
    """
    directory = os.fspath(directory)
    rank, world_size = comm.get_rank(), comm.get_world_size()
    final, tmp = checkpoint_path(directory, epoch), tmp_path(directory,
                                                             epoch)

    # 1. Local checks, digests of the replicas, and a fresh temp directory.
    error, digests = None, None
    try:
        check_count('epoch', epoch, 0)
        if keep_last is not None:
            check_count('keep_last', keep_last, 1)
        meta = {'format': FORMAT_VERSION, 'epoch': epoch,
                'world_size': world_size, 'fingerprint': fingerprint,
                'extra': extra or {}, 'torch': torch.__version__,
                'time': time.time()}
        json.dumps(meta, allow_nan=True)  # refuse what JSON cannot hold now
        sharded = [n for n, p in model.named_parameters()
                   if getattr(p, 'sar_sharded', False)]
        if sharded and world_size > 1:
            raise ValueError(
                f"checkpoint: {sharded[0]!r} is sharded by the partition "
                f"(pyg_sar.nn.DistEmbedding); a checkpoint stores replicated "
                f"state only: save DistEmbedding.full_state_dict(model)")
        model_state = model.state_dict()
        tensors = {MODEL_PREFIX + k: v for k, v in model_state.items()
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
    everyone = agree(error, digests)
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
    checkpoint_io.save_replicated(tensors, tmp)
    rank_state['rng'] = rng_state()
    error = None
    try:
        write_atomically(osp.join(tmp, f'rank-{rank}.pt'),
                         lambda f: torch.save(rank_state, f))
    except Exception as e:
        error = OSError(f"rank {rank}: writing '{tmp}/rank-{rank}.pt' "
                        f"failed: {e}")
    agree(error)

    # 3. Commit: rank 0 hashes every file, writes the manifest last and
    # renames atomically.
    error = None
    if rank == 0:
        try:
            files = hash_tree(tmp, exclude=(META_FILE,))
            write_text_atomically(osp.join(tmp, META_FILE),
                                  seal({**meta, 'files': files}))
            fsync_dir(tmp)
            os.rename(tmp, final)
            fsync_dir(directory)
        except Exception as e:
            error = OSError(f"committing checkpoint '{final}' failed: {e}")
        if error is None and keep_last is not None:
            _prune(directory, keep_last, final)
    agree(error)
    return final


# Load ########################################################################

def _restore(path: str, inspected, model: torch.nn.Module, optimizer,
             scheduler, restore_rng: bool) -> Dict[str, Any]:
    """Collective: loads the checkpoint ``path`` that every rank
    inspected."""
    meta, rank_state, tensors = inspected
    checkpoint_io.load_replicated(tensors, path)
    error = None
    try:
        model_state = {k[len(MODEL_PREFIX):]: v for k, v in tensors.items()
                       if k.startswith(MODEL_PREFIX)}
        model_state.update(rank_state['model_other'])
        model.load_state_dict(model_state, strict=True)
        if optimizer is not None:
            saved = rank_state['optimizer']
            state: Dict[int, Dict[str, Any]] = {
                int(i): dict(v) for i, v in saved['state_other'].items()}
            for key, value in tensors.items():
                if key.startswith(OPTIMIZER_PREFIX):
                    index, name = key[len(OPTIMIZER_PREFIX):].split('.', 1)
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
    agree(error)
    return {'epoch': int(meta['epoch']), 'path': path,
            'extra': meta.get('extra') or {}}


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
    other than ``expect``; with a :class:`CorruptCheckpointError` when a
    file it reads differs from its recorded hash or is not what the format
    allows (checked before anything is loaded). Returns ``{'epoch',
    'path', 'extra'}``.
    """
    path = os.fspath(path)
    inspected = inspect_everywhere(path, model, optimizer, fingerprint,
                                    expect)
    return _restore(path, inspected, model, optimizer, scheduler,
                    restore_rng)


def _set_aside(path: str) -> str:
    """Renames the corrupt checkpoint ``path`` to ``path.corrupt`` (or
    ``.corrupt-2``, ...), out of :func:`checkpoints`' sight and of the way
    of the next save of its epoch; returns the new path."""
    target, n = path + CORRUPT_SUFFIX, 1
    while osp.lexists(target):
        n += 1
        target = f'{path}{CORRUPT_SUFFIX}-{n}'
    os.rename(path, target)
    return target


def resume(directory: str, model: torch.nn.Module,
           optimizer: Optional[torch.optim.Optimizer] = None, scheduler=None,
           *, fingerprint: Optional[str] = None,
           expect: Optional[Dict[str, Any]] = None) -> Optional[Dict]:
    """Loads the newest intact checkpoint of ``directory`` (collective).
    Returns what :func:`load` returns, or None when there is none.

    Rank 0 lists the checkpoints, so every rank tries the same ones,
    newest first; a checkpoint that any rank finds corrupt
    (:class:`CorruptCheckpointError`) is skipped by all, set aside as
    ``epoch-<K>.corrupt`` and reported on stderr in one line naming the
    checkpoint resumed from instead. Refusals (other world size,
    partitions or ``expect``) raise as in :func:`load`."""
    directory = os.fspath(directory)
    error, found = None, None
    if comm.get_rank() == 0:
        try:
            found = [path for _, path in checkpoints(directory)]
        except OSError as e:
            error = e
    found = agree(error, found)[0]
    corrupt: List[Tuple[str, str]] = []
    chosen, inspected = None, None
    for path in reversed(found):
        try:
            inspected = inspect_everywhere(path, model, optimizer,
                                            fingerprint, expect)
        except CorruptCheckpointError as e:
            corrupt.append((path, str(e)))
            continue
        chosen = path
        break
    if comm.get_rank() == 0:
        then = f"resuming from '{chosen}'" if chosen is not None else \
            'no intact checkpoint is left to resume from'
        for path, message in corrupt:
            try:
                moved = f"moved it to '{_set_aside(path)}'"
            except OSError as e:
                moved = f"could not move it aside ({e})"
            _warn(f'{message}; {moved}; {then}')
    if chosen is None:
        return None
    return _restore(chosen, inspected, model, optimizer, scheduler, True)


# Trained weights #############################################################

def save_weights(model: torch.nn.Module, path: str) -> None:
    """Writes ``model.state_dict()`` to ``path`` atomically (temporary file
    in the same directory, then ``os.replace``). Call it on one rank."""
    state = {k: v.detach().cpu() if isinstance(v, Tensor) else v
             for k, v in model.state_dict().items()}
    write_atomically(path, lambda f: torch.save(state, f))
