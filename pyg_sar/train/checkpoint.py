"""Training checkpoints: save on every rank, resume exactly where it stopped,
or from the newest checkpoint that is intact.

A checkpoint is a directory ``DIR/epoch-<K>``::

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

**Trust.** Nothing read back is trusted. Before anything is loaded, every
rank checks ``meta.json`` against its checksum and every file it will read
against the size and hash ``meta.json`` records; DCP's ``.metadata`` is
unpickled with an allowlist of the format's own classes
(:mod:`pyg_sar.train.checkpoint_io`) and the per-rank files with
``weights_only=True``. A checkpoint that fails is a
:class:`CorruptCheckpointError`; :func:`resume` then sets it aside as
``epoch-<K>.corrupt``, says so in one line, and resumes from the newest
checkpoint that passes, all ranks agreeing on which.

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
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.train import checkpoint_io
from pyg_sar.train.files import (HASH_ALGORITHM, bytes_digest, file_digest,
                                 fsync_dir, hash_tree, write_atomically,
                                 write_text_atomically)

__all__ = ['save', 'load', 'resume', 'latest', 'checkpoints', 'rng_state',
           'set_rng_state', 'save_weights', 'CorruptCheckpointError',
           'FORMAT_VERSION']

# 2: meta.json records the hash of every file and a checksum of itself.
FORMAT_VERSION = 2
META_FILE = 'meta.json'
CORRUPT_SUFFIX = '.corrupt'
_NAME = re.compile(r'^epoch-(\d+)$')
_TRASH = re.compile(r'^\.epoch-\d+\.old$')
_MODEL, _OPTIM = 'model.', 'optimizer.state.'


class CorruptCheckpointError(ValueError):
    """A checkpoint that is damaged or cannot be read safely: a file is
    missing, truncated or differs from the hash its manifest records, or a
    file is not what the format allows. :func:`load` raises it;
    :func:`resume` skips such a checkpoint."""


def _corrupt(path: str, reason: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"checkpoint '{path}' is corrupt "
                                  f"({reason})")


def _warn(message: str) -> None:
    """One line on stderr (one write, so that ranks do not interleave)."""
    sys.stderr.write(f'warning: {message}\n')
    sys.stderr.flush()


# Finding checkpoints #########################################################

def checkpoint_path(directory: str, epoch: int) -> str:
    """``directory/epoch-<epoch>``."""
    return osp.join(os.fspath(directory), f'epoch-{int(epoch)}')


def _tmp_path(directory: str, epoch: int) -> str:
    return osp.join(os.fspath(directory), f'.epoch-{int(epoch)}.tmp')


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
                                   OSError, CorruptCheckpointError)}


def _agree(error: Optional[BaseException], payload: Any = None) -> List:
    """Collective: gathers every rank's error and payload; raises one
    rank's error on every rank, so that no rank waits for a failed one: a
    :class:`CorruptCheckpointError` if any rank found the checkpoint
    corrupt (so that all ranks skip it alike), else the first rank's."""
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
                tensors[f'{_OPTIM}{int(index)}.{key}'] = value
            else:
                other.setdefault(int(index), {})[key] = value
    return tensors, {'param_groups': state['param_groups'],
                     'state_other': other}


def _checksum(meta: Dict[str, Any]) -> str:
    """The hash of ``meta`` (without its checksum) in a canonical JSON."""
    return bytes_digest(json.dumps(meta, sort_keys=True,
                                   allow_nan=True).encode())


def _seal(meta: Dict[str, Any]) -> str:
    """``meta`` as the JSON text of ``meta.json``, with its checksum. The
    checksum is taken of what reading the text gives back (JSON turns keys
    into strings and tuples into lists)."""
    meta = json.loads(json.dumps(meta, allow_nan=True))
    meta['checksum'] = _checksum(meta)
    return json.dumps(meta, indent=1, allow_nan=True)


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
            trash = osp.join(directory, f'.{osp.basename(path)}.old')
            if osp.lexists(trash):
                shutil.rmtree(trash)
            os.rename(path, trash)
        for name in os.listdir(directory):
            if _TRASH.match(name):
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
    final, tmp = checkpoint_path(directory, epoch), _tmp_path(directory,
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
    checkpoint_io.save_replicated(tensors, tmp)
    rank_state['rng'] = rng_state()
    error = None
    try:
        write_atomically(osp.join(tmp, f'rank-{rank}.pt'),
                         lambda f: torch.save(rank_state, f))
    except Exception as e:
        error = OSError(f"rank {rank}: writing '{tmp}/rank-{rank}.pt' "
                        f"failed: {e}")
    _agree(error)

    # 3. Commit: rank 0 hashes every file, writes the manifest last and
    # renames atomically.
    error = None
    if rank == 0:
        try:
            files = hash_tree(tmp, exclude=(META_FILE,))
            write_text_atomically(osp.join(tmp, META_FILE),
                                  _seal({**meta, 'files': files}))
            fsync_dir(tmp)
            os.rename(tmp, final)
            fsync_dir(directory)
        except Exception as e:
            error = OSError(f"committing checkpoint '{final}' failed: {e}")
        if error is None and keep_last is not None:
            _prune(directory, keep_last, final)
    _agree(error)
    return final


# Load ########################################################################

def _format_error(path: str, meta: Dict[str, Any]) -> ValueError:
    return ValueError(f"checkpoint '{path}' has format "
                      f"{meta.get('format')!r}; this pyg_sar reads format "
                      f"{FORMAT_VERSION} (use a fresh checkpoint directory)")


def _read_meta(path: str) -> Dict[str, Any]:
    """``meta.json`` of the checkpoint ``path``, checked against its
    checksum. Missing: ``FileNotFoundError`` (not a complete checkpoint);
    damaged: :class:`CorruptCheckpointError`; another format:
    ``ValueError``."""
    meta_path = osp.join(path, META_FILE)
    if not osp.isfile(meta_path):
        raise FileNotFoundError(f"'{meta_path}' not found; '{path}' is not "
                                f"a complete pyg_sar checkpoint")
    try:
        with open(meta_path, 'rb') as f:
            meta = json.loads(f.read())
    except (OSError, ValueError) as e:
        raise _corrupt(path, f"{META_FILE} is unreadable: "
                       f"{type(e).__name__}: {e}") from None
    if not isinstance(meta, dict):
        raise _corrupt(path, f"{META_FILE} holds no JSON object")
    if 'checksum' not in meta and meta.get('format') != FORMAT_VERSION:
        raise _format_error(path, meta)  # written by another pyg_sar
    if meta.pop('checksum', None) != _checksum(meta):
        raise _corrupt(path, f"{META_FILE} does not match its checksum")
    if meta.get('format') != FORMAT_VERSION:
        raise _format_error(path, meta)
    files = meta.get('files')
    if not (type(meta.get('epoch')) is int and
            type(meta.get('world_size')) is int and
            isinstance(files, dict) and
            all(isinstance(v, dict) and type(v.get('bytes')) is int and
                isinstance(v.get(HASH_ALGORITHM), str)
                for v in files.values())):
        raise _corrupt(path, f"{META_FILE} lacks the fields of format "
                       f"{FORMAT_VERSION}")
    return meta


def _verify(path: str, meta: Dict[str, Any], name: str) -> str:
    """The path of the file ``name`` of the checkpoint ``path`` once its
    size and hash match what ``meta.json`` records."""
    entry = meta['files'].get(name)
    if entry is None:
        raise _corrupt(path, f"its {META_FILE} does not list '{name}'")
    file = osp.join(path, name)
    try:
        size, digest = file_digest(file)
    except FileNotFoundError:
        raise _corrupt(path, f"'{name}' is missing") from None
    except OSError as e:
        raise _corrupt(path, f"'{name}' is unreadable: "
                       f"{e.strerror or e}") from None
    if size != entry['bytes']:
        raise _corrupt(path, f"'{name}' has {size} bytes, {META_FILE} "
                       f"records {entry['bytes']}")
    if digest != entry[HASH_ALGORITHM]:
        raise _corrupt(path, f"'{name}' does not match the "
                       f"{HASH_ALGORITHM} hash {META_FILE} records")
    return file


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


def _inspect(path: str, model: torch.nn.Module, optimizer,
             fingerprint: Optional[str], expect: Optional[Dict[str, Any]]):
    """This rank's checks of the checkpoint ``path`` before anything is
    loaded: the manifest, the compatibility with this run, the hash of
    every file this rank reads, then the files' contents (read safely).
    Returns ``(meta, rank_state, tensors to fill)``."""
    rank, world_size = comm.get_rank(), comm.get_world_size()
    meta = _read_meta(path)
    _check_meta(path, meta, world_size, fingerprint, expect)
    _verify(path, meta, checkpoint_io.METADATA_FILE)
    try:
        data_files = checkpoint_io.replicated_files(path)
        specs = checkpoint_io.replicated_specs(path)
    except checkpoint_io.UnsafeMetadataError as e:
        raise _corrupt(path, f"'{checkpoint_io.METADATA_FILE}' is "
                       f"refused: "
                       f"{e.reason}") from None
    except OSError as e:
        raise _corrupt(path, str(e)) from None
    for name in data_files:
        _verify(path, meta, name)
    rank_name = f'rank-{rank}.pt'
    rank_file = _verify(path, meta, rank_name)
    try:
        rank_state = torch.load(rank_file, weights_only=True)
    except Exception as e:
        raise _corrupt(path, f"'{rank_name}' is unreadable: "
                       f"{type(e).__name__}") from None
    if not isinstance(rank_state, dict) or \
            (rank_state.get('rank'), rank_state.get('epoch')) != \
            (rank, meta['epoch']):
        raise _corrupt(path, f"'{rank_name}' does not hold the state of "
                       f"rank {rank} at epoch {meta['epoch']}")
    if optimizer is not None and rank_state.get('optimizer') is None:
        raise ValueError(f"checkpoint '{path}' holds no optimizer state")
    return meta, rank_state, _allocate(path, specs, model, optimizer)


def _inspect_everywhere(path: str, model: torch.nn.Module, optimizer,
                        fingerprint: Optional[str],
                        expect: Optional[Dict[str, Any]]):
    """Collective :func:`_inspect`: every rank raises if any rank failed
    (a :class:`CorruptCheckpointError` first)."""
    error, inspected = None, None
    try:
        inspected = _inspect(path, model, optimizer, fingerprint, expect)
    except Exception as e:
        error = e
    _agree(error)
    return inspected


def _restore(path: str, inspected, model: torch.nn.Module, optimizer,
             scheduler, restore_rng: bool) -> Dict[str, Any]:
    """Collective: loads the checkpoint ``path`` that every rank
    inspected."""
    meta, rank_state, tensors = inspected
    checkpoint_io.load_replicated(tensors, path)
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
    inspected = _inspect_everywhere(path, model, optimizer, fingerprint,
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
    found = _agree(error, found)[0]
    corrupt: List[Tuple[str, str]] = []
    chosen, inspected = None, None
    for path in reversed(found):
        try:
            inspected = _inspect_everywhere(path, model, optimizer,
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
