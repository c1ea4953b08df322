"""Checkpoint storage of replicated tensors.

torch.distributed.checkpoint (DCP) for tensors that are the same on every
rank (model and optimizer state of replicated modules): DCP's default save
planner deduplicates equal keys across ranks, so each tensor is written
once, by the least-loaded rank. Its coordination runs on the default
process group, whose waits are bounded by init_distributed's timeout.

**Nothing read is trusted.** DCP's own reader unpickles the ``.metadata``
file with plain :mod:`pickle` (a crafted file runs code on every rank) and
reads values it declares as bytes with ``torch.load(weights_only=False)``.
Here ``.metadata`` is read by :class:`_SafeUnpickler`, which constructs the
checkpoint format's own classes, torch sizes, dtypes and layouts and
nothing else, and is then checked to describe only tensors stored in plain
files of the checkpoint directory; tensor data is read by DCP with
``torch.load(weights_only=True)``. Anything else is refused with a
``ValueError`` before it is loaded.
"""
from __future__ import annotations

import functools
import io
import pickle
import re
from typing import Any, Dict, List, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from pyg_sar.comm.process_group import get_rank
from pyg_sar.comm.state import STATS

# DCP's metadata file, in every checkpoint directory it writes.
METADATA_FILE = '.metadata'
# The names DCP gives its data files: plain names inside the directory.
_DATA_FILE = re.compile(r'^[A-Za-z0-9_][A-Za-z0-9_.-]*$')


def _dcp_no_dist() -> bool:
    return not (dist.is_available() and dist.is_initialized())


def _dcp_error(what: str, path: str, e: BaseException) -> OSError:
    first = str(e).strip().splitlines()
    return OSError(f"rank {get_rank()}: {what} '{path}' failed: "
                   f"{type(e).__name__}: {first[0] if first else ''}")


def _dcp_failures():
    """The exceptions a DCP call raises: its ``CheckpointException``
    wraps a failure on any rank and derives from ``BaseException``."""
    from torch.distributed.checkpoint.api import CheckpointException
    return (Exception, CheckpointException)


def _cause(e: BaseException) -> BaseException:
    """The first rank's own exception inside DCP's
    ``CheckpointException`` (which holds every rank's, with tracebacks),
    else ``e``."""
    failures = getattr(e, 'failures', None)
    if isinstance(failures, dict) and failures:
        first = failures[min(failures)]
        if isinstance(first, tuple) and first and \
                isinstance(first[0], BaseException):
            return first[0]
    return e


# Reading .metadata safely ####################################################

@functools.lru_cache(maxsize=None)
def _allowed_globals() -> Dict[Tuple[str, str], Any]:
    """``{(module, name): object}`` that a DCP ``.metadata`` file may name:
    the metadata classes of the format (not ``BytesStorageMetadata``, whose
    values DCP unpickles unrestricted), torch sizes and layouts, paths and
    plain containers. Dtypes are allowed in :meth:`_SafeUnpickler.find_class`.
    """
    import builtins
    import collections
    import pathlib

    from torch.distributed.checkpoint import filesystem, metadata
    allowed: Dict[Tuple[str, str], Any] = {
        (metadata.__name__, name): getattr(metadata, name)
        for name in ('Metadata', 'TensorStorageMetadata', 'TensorProperties',
                     'ChunkStorageMetadata', 'MetadataIndex', 'StorageMeta',
                     '_MEM_FORMAT_ENCODING')}
    allowed[(filesystem.__name__, '_StorageInfo')] = filesystem._StorageInfo
    allowed[('torch', 'Size')] = torch.Size
    allowed[('torch.serialization', '_get_layout')] = \
        torch.serialization._get_layout
    allowed[('collections', 'OrderedDict')] = collections.OrderedDict
    for name in ('PurePosixPath', 'PosixPath', 'PureWindowsPath',
                 'WindowsPath'):
        allowed[('pathlib', name)] = getattr(pathlib, name)
    for name in ('dict', 'list', 'tuple', 'set', 'frozenset', 'int',
                 'float', 'str', 'bytes', 'bool'):
        allowed[('builtins', name)] = getattr(builtins, name)
    return allowed


class _SafeUnpickler(pickle.Unpickler):
    """An unpickler that constructs only what :func:`_allowed_globals`
    lists and torch dtypes (as ``torch.load(weights_only=True)`` does for
    tensors): anything else is refused before it is looked up, so no code
    of the file's choosing runs."""

    def find_class(self, module: str, name: str) -> Any:
        found = _allowed_globals().get((module, name))
        if found is not None:
            return found
        if module == 'torch' and isinstance(getattr(torch, name, None),
                                            torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(
            f"it names '{module}.{name}', which is not part of the "
            f"checkpoint format")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError('it holds a persistent reference')


class UnsafeMetadataError(ValueError):
    """A ``.metadata`` file that is not plain DCP metadata of tensors
    (corrupt or crafted); refused without running any of it."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"refusing checkpoint metadata '{where}': {reason}")
        self.where, self.reason = where, reason


def _refuse(where: str, reason: str) -> UnsafeMetadataError:
    return UnsafeMetadataError(where, reason)


def _check_metadata(metadata: Any, where: str) -> None:
    """Refuses metadata that describes anything but tensors stored in plain
    files of the checkpoint directory."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata,
                                                       Metadata,
                                                       MetadataIndex,
                                                       TensorProperties,
                                                       TensorStorageMetadata)
    if not isinstance(metadata, Metadata):
        raise _refuse(where, f"it holds a {type(metadata).__name__}, not "
                      f"DCP metadata")
    entries = metadata.state_dict_metadata
    if not isinstance(entries, dict):
        raise _refuse(where, 'its state_dict_metadata is not a dict')
    for key, entry in entries.items():
        if not (isinstance(key, str) and
                isinstance(entry, TensorStorageMetadata) and
                isinstance(entry.properties, TensorProperties) and
                isinstance(entry.properties.dtype, torch.dtype) and
                isinstance(entry.size, torch.Size) and
                isinstance(entry.chunks, list) and
                all(isinstance(c, ChunkStorageMetadata)
                    for c in entry.chunks)):
            raise _refuse(where, f"its entry {key!r} is not a tensor")
    storage = metadata.storage_data
    if not isinstance(storage, dict):
        raise _refuse(where, 'its storage_data is not a dict')
    for index, info in storage.items():
        if not (isinstance(index, MetadataIndex) and
                isinstance(info, _StorageInfo) and
                isinstance(info.relative_path, str) and
                _DATA_FILE.match(info.relative_path) and
                type(info.offset) is int and info.offset >= 0 and
                type(info.length) is int and info.length >= 0):
            raise _refuse(where, f"its storage entry {index!r} is not a "
                          f"slice of a data file in the checkpoint")
        if info.transform_descriptors:
            raise _refuse(where, f"its storage entry {index!r} needs stream "
                          f"transforms {info.transform_descriptors!r}")


def parse_metadata(data: bytes, where: str = METADATA_FILE):
    """The DCP ``Metadata`` pickled in ``data``, read with
    :class:`_SafeUnpickler` and checked (``where`` names the file in
    messages). Raises :class:`UnsafeMetadataError` for anything else,
    corrupt or crafted, without running code of the file's choosing."""
    try:
        metadata = _SafeUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as e:  # a name the format does not know
        raise _refuse(where, str(e)) from None
    except Exception as e:  # truncated or garbled
        raise _refuse(where, f"{type(e).__name__}: {e}") from None
    _check_metadata(metadata, where)
    return metadata


@functools.lru_cache(maxsize=None)
def _safe_reader_class():
    """DCP's ``FileSystemReader`` that reads ``.metadata`` with
    :func:`parse_metadata` and refuses to unpickle values stored as bytes
    (built on first use: importing DCP takes a second)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta
    from torch.distributed.checkpoint.planner import LoadItemType

    class SafeFileSystemReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            path = self._get_metadata_path(kwargs.get('rank'))
            with self.fs.create_stream(path, 'rb') as f:
                metadata = parse_metadata(f.read(), str(path))
            if metadata.storage_meta is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

        def read_data(self, plan, planner):
            if any(item.type == LoadItemType.BYTE_IO for item in plan.items):
                raise _refuse(str(self._get_metadata_path()),
                              'it declares values stored as pickles, not '
                              'only tensors')
            return super().read_data(plan, planner)

    return SafeFileSystemReader


def _read_metadata(path: str):
    try:
        return _safe_reader_class()(path).read_metadata()
    except UnsafeMetadataError:
        raise
    except Exception as e:
        raise _dcp_error('reading checkpoint metadata of', path, e) from e


# Saving and loading ##########################################################

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
    STATS['collectives'] += 1
    try:
        with warnings.catch_warnings():  # "assuming ... a single process"
            warnings.simplefilter('ignore', UserWarning)
            dcp.save(tensors, storage_writer=dcp.FileSystemWriter(
                path, sync_files=True), no_dist=_dcp_no_dist())
    except _dcp_failures() as e:
        raise _dcp_error('writing checkpoint tensors to', path,
                         _cause(e)) from None


def replicated_specs(path: str) -> Dict[str, Tuple[torch.Size, torch.dtype]]:
    """Names, shapes and dtypes of the tensors :func:`save_replicated`
    wrote into ``path`` (local, safe read of its metadata file; a file that
    is not plain checkpoint metadata raises :class:`UnsafeMetadataError`).
    """
    metadata = _read_metadata(path)
    return {name: (m.size, m.properties.dtype)
            for name, m in metadata.state_dict_metadata.items()}


def replicated_files(path: str) -> List[str]:
    """The files of ``path`` that :func:`load_replicated` reads: the
    metadata file and the data files it names (local, safe read)."""
    metadata = _read_metadata(path)
    return [METADATA_FILE] + sorted({info.relative_path for info in
                                     metadata.storage_data.values()})


def load_replicated(tensors: Dict[str, Tensor], path: str) -> None:
    """Fills ``{name: tensor}`` in place from ``path`` (collective; every
    rank reads every tensor). The metadata is read safely and only tensors
    are read (``torch.load(weights_only=True)``); anything else raises
    :class:`UnsafeMetadataError`."""
    import warnings

    from torch.distributed import checkpoint as dcp
    _read_metadata(path)  # refused here, before DCP hides why in its retry
    STATS['collectives'] += 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', UserWarning)
            dcp.load(tensors, storage_reader=_safe_reader_class()(path),
                     no_dist=_dcp_no_dist())
    except _dcp_failures() as e:
        cause = _cause(e)
        if isinstance(cause, UnsafeMetadataError):
            raise UnsafeMetadataError(cause.where, cause.reason) from None
        raise _dcp_error('reading checkpoint tensors from', path,
                         cause) from None
