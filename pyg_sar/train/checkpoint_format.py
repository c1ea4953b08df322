"""The on-disk format of a training checkpoint, and the reading of its
manifest: what :mod:`pyg_sar.train.checkpoint` writes and what it accepts
back.

A checkpoint is a directory ``DIR/epoch-<K>`` (:func:`checkpoint_path`)
holding the files that :mod:`pyg_sar.train.checkpoint` shows: DCP's
``.metadata`` and data files, one ``rank-<R>.pt`` per rank, and
``meta.json`` (:data:`META_FILE`), which rank 0 writes last.
The tensors are stored under the keys ``model.<name>``
(:data:`MODEL_PREFIX`) and ``optimizer.state.<index>.<name>``
(:data:`OPTIMIZER_PREFIX`). Other entries of ``DIR`` are not checkpoints:
``.epoch-<K>.tmp`` (a save in progress or interrupted), ``.epoch-<K>.old``
(an older checkpoint being deleted) and ``epoch-<K>.corrupt``
(:data:`CORRUPT_SUFFIX`, a checkpoint set aside as corrupt).

**The manifest.** ``meta.json`` records the size and hash of every other
file of the checkpoint and ends with a checksum of its own content
(:func:`seal`). :func:`read_meta` checks that checksum and the fields of
:data:`FORMAT_VERSION`; :func:`verify` checks one file against the size and
hash the manifest records. A checkpoint that fails either is a
:class:`CorruptCheckpointError`.
"""
from __future__ import annotations

import json
import os
import os.path as osp
import re
from typing import Any, Dict, Optional

from pyg_sar.train.files import HASH_ALGORITHM, bytes_digest, file_digest

__all__ = ['FORMAT_VERSION', 'META_FILE', 'CORRUPT_SUFFIX', 'MODEL_PREFIX',
           'OPTIMIZER_PREFIX', 'CorruptCheckpointError', 'corrupt',
           'checkpoint_path', 'epoch_of', 'tmp_path', 'trash_path',
           'is_trash', 'checksum', 'seal', 'read_meta',
           'verify']

# 2: meta.json records the hash of every file and a checksum of itself.
FORMAT_VERSION = 2
META_FILE = 'meta.json'
CORRUPT_SUFFIX = '.corrupt'
MODEL_PREFIX, OPTIMIZER_PREFIX = 'model.', 'optimizer.state.'
_NAME = re.compile(r'^epoch-(\d+)$')
_TRASH = re.compile(r'^\.epoch-\d+\.old$')


class CorruptCheckpointError(ValueError):
    """A checkpoint that is damaged or cannot be read safely: a file is
    missing, truncated or differs from the hash its manifest records, or a
    file is not what the format allows. :func:`load` raises it;
    :func:`resume` skips such a checkpoint."""


def corrupt(path: str, reason: str) -> CorruptCheckpointError:
    """The error for the checkpoint ``path``, corrupt for ``reason``."""
    return CorruptCheckpointError(f"checkpoint '{path}' is corrupt "
                                  f"({reason})")


# Names #######################################################################

def checkpoint_path(directory: str, epoch: int) -> str:
    """``directory/epoch-<epoch>``."""
    return osp.join(os.fspath(directory), f'epoch-{int(epoch)}')


def epoch_of(name: str) -> Optional[int]:
    """The epoch of the checkpoint directory named ``name``
    (``epoch-<K>``), None when ``name`` is not one."""
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


def tmp_path(directory: str, epoch: int) -> str:
    """``directory/.epoch-<epoch>.tmp``, where the ranks write the
    checkpoint of ``epoch`` before it is committed."""
    return osp.join(os.fspath(directory), f'.epoch-{int(epoch)}.tmp')


def trash_path(path: str) -> str:
    """``.epoch-<K>.old`` next to the checkpoint ``path`` (``epoch-<K>``):
    where it is renamed to before it is deleted."""
    return osp.join(osp.dirname(path), f'.{osp.basename(path)}.old')


def is_trash(name: str) -> bool:
    """Whether ``name`` is that of a :func:`trash_path`."""
    return _TRASH.match(name) is not None


# The manifest ################################################################

def checksum(meta: Dict[str, Any]) -> str:
    """The hash of ``meta`` (without its checksum) in a canonical JSON."""
    return bytes_digest(json.dumps(meta, sort_keys=True,
                                   allow_nan=True).encode())


def seal(meta: Dict[str, Any]) -> str:
    """``meta`` as the JSON text of ``meta.json``, with its checksum. The
    checksum is taken of what reading the text gives back (JSON turns keys
    into strings and tuples into lists)."""
    meta = json.loads(json.dumps(meta, allow_nan=True))
    meta['checksum'] = checksum(meta)
    return json.dumps(meta, indent=1, allow_nan=True)


def _format_error(path: str, meta: Dict[str, Any]) -> ValueError:
    return ValueError(f"checkpoint '{path}' has format "
                      f"{meta.get('format')!r}; this pyg_sar reads format "
                      f"{FORMAT_VERSION} (use a fresh checkpoint directory)")


def read_meta(path: str) -> Dict[str, Any]:
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
        raise corrupt(path, f"{META_FILE} is unreadable: "
                      f"{type(e).__name__}: {e}") from None
    if not isinstance(meta, dict):
        raise corrupt(path, f"{META_FILE} holds no JSON object")
    if 'checksum' not in meta and meta.get('format') != FORMAT_VERSION:
        raise _format_error(path, meta)  # written by another pyg_sar
    if meta.pop('checksum', None) != checksum(meta):
        raise corrupt(path, f"{META_FILE} does not match its checksum")
    if meta.get('format') != FORMAT_VERSION:
        raise _format_error(path, meta)
    files = meta.get('files')
    if not (type(meta.get('epoch')) is int and
            type(meta.get('world_size')) is int and
            isinstance(files, dict) and
            all(isinstance(v, dict) and type(v.get('bytes')) is int and
                isinstance(v.get(HASH_ALGORITHM), str)
                for v in files.values())):
        raise corrupt(path, f"{META_FILE} lacks the fields of format "
                      f"{FORMAT_VERSION}")
    return meta


def verify(path: str, meta: Dict[str, Any], name: str) -> str:
    """The path of the file ``name`` of the checkpoint ``path`` once its
    size and hash match what ``meta.json`` records."""
    entry = meta['files'].get(name)
    if entry is None:
        raise corrupt(path, f"its {META_FILE} does not list '{name}'")
    file = osp.join(path, name)
    try:
        size, digest = file_digest(file)
    except FileNotFoundError:
        raise corrupt(path, f"'{name}' is missing") from None
    except OSError as e:
        raise corrupt(path, f"'{name}' is unreadable: "
                      f"{e.strerror or e}") from None
    if size != entry['bytes']:
        raise corrupt(path, f"'{name}' has {size} bytes, {META_FILE} "
                      f"records {entry['bytes']}")
    if digest != entry[HASH_ALGORITHM]:
        raise corrupt(path, f"'{name}' does not match the "
                      f"{HASH_ALGORITHM} hash {META_FILE} records")
    return file
