"""Checkpoint storage of replicated tensors (model and optimizer state of
replicated modules), written and read with torch.distributed.checkpoint
(DCP) through the communication stage (:mod:`pyg_sar.comm.dcp`): each
tensor is stored once across all ranks.

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

import enum
import functools
import io
import pickle
import re
from typing import Any, Dict, List, Tuple

import torch
from torch import Tensor

from pyg_sar.comm import dcp
from pyg_sar.comm.dcp import METADATA_FILE

# The names DCP gives its data files: plain names inside the directory.
_DATA_FILE = re.compile(r'^[A-Za-z0-9_][A-Za-z0-9_.-]*$')


# Reading .metadata safely ####################################################

@functools.lru_cache(maxsize=None)
def _allowed_globals() -> Dict[Tuple[str, str], Any]:
    """``{(module, name): object}`` that a DCP ``.metadata`` file may name:
    the metadata classes of the format
    (:func:`pyg_sar.comm.dcp.format_classes`), torch sizes and layouts,
    paths and plain containers. Dtypes are allowed in
    :meth:`_SafeUnpickler.find_class`.
    """
    import builtins
    import collections
    import pathlib

    allowed = dict(dcp.format_classes())
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


def _format_class(name: str) -> Any:
    """The class ``name`` of DCP's metadata format."""
    return next(obj for (_, key), obj in dcp.format_classes().items()
                if key == name)


def _format_enum_member(cls: Any, name: Any) -> Any:
    """``getattr(cls, name)`` for a member ``name`` of an enum class of the
    checkpoint format, and nothing else."""
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum) and
            cls in _allowed_globals().values() and isinstance(name, str) and
            name in cls.__members__):
        raise pickle.UnpicklingError(
            f"it looks up {name!r} of {cls!r}, which is not a member of an "
            f"enum of the checkpoint format")
    return cls.__members__[name]


class _SafeUnpickler(pickle.Unpickler):
    """An unpickler that constructs only what :func:`_allowed_globals`
    lists and torch dtypes (as ``torch.load(weights_only=True)`` does for
    tensors): anything else is refused before it is looked up, so no code
    of the file's choosing runs."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ('builtins', 'getattr'):
            # How Python >= 3.11.? pickles an Enum member (by name): only
            # members of the format's own enums are looked up.
            return _format_enum_member
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
    (Metadata, TensorStorageMetadata, TensorProperties, ChunkStorageMetadata,
     MetadataIndex, StorageInfo) = map(_format_class, (
         'Metadata', 'TensorStorageMetadata', 'TensorProperties',
         'ChunkStorageMetadata', 'MetadataIndex', '_StorageInfo'))
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
                isinstance(info, StorageInfo) and
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


def _reader(path: str):
    """DCP's reader of ``path`` that reads ``.metadata`` with
    :func:`parse_metadata` and refuses values stored as pickles."""
    return dcp.reader(path, parse_metadata, _refuse)


def _read_metadata(path: str):
    return dcp.read_metadata(_reader(path), path, keep=(UnsafeMetadataError,))


# Saving and loading ##########################################################

def save_replicated(tensors: Dict[str, Tensor], path: str) -> None:
    """Writes ``{name: tensor}`` into the directory ``path`` (collective).

    Every rank passes the same names with equal tensors (replicas); each
    tensor is stored once across all ranks. Only tensors: DCP pickles other
    values and reads them back with ``weights_only=False``.
    """
    bad = [k for k, v in tensors.items() if not isinstance(v, Tensor)]
    if bad:
        raise TypeError(f"save_replicated takes tensors only (got "
                        f"{type(tensors[bad[0]]).__name__} for {bad[0]!r})")
    dcp.save(tensors, path)


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
    _read_metadata(path)  # refused here, before DCP hides why in its retry
    dcp.load(tensors, _reader(path), path, keep=(UnsafeMetadataError,))

