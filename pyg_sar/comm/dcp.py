"""torch.distributed.checkpoint (DCP), the one place the package calls it:
:func:`save` writes tensors that are the same on every rank (DCP's default
save planner deduplicates equal keys across ranks, so each is written once,
by the least-loaded rank); :func:`load` fills them back through a reader
from :func:`reader`. Coordination runs on the default process group, whose
waits are bounded by :func:`~pyg_sar.comm.init_distributed`'s timeout;
without one, both run on this process alone.

What a checkpoint may hold is the caller's decision
(:mod:`pyg_sar.train.checkpoint_io`): :func:`reader` reads DCP's
``.metadata`` file with the caller's parser and refuses, through the
caller's error, every value DCP would unpickle; :func:`format_classes`
names the classes of DCP's metadata format, for the caller's allowlist.
Every DCP failure becomes a one-line :class:`OSError` naming the rank and
the path, except the caller's own errors, which pass through.
"""
from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Dict, Tuple, Type

import torch.distributed as dist
from torch import Tensor

from pyg_sar.comm.process_group import get_rank
from pyg_sar.comm.state import STATS

# DCP's metadata file, in every checkpoint directory it writes.
METADATA_FILE = '.metadata'

# (data, where) -> DCP Metadata; (where, reason) -> the error to raise.
ParseMetadata = Callable[[bytes, str], Any]
Refuse = Callable[[str, str], BaseException]


def _no_dist() -> bool:
    return not (dist.is_available() and dist.is_initialized())


def _error(what: str, path: str, e: BaseException) -> OSError:
    first = str(e).strip().splitlines()
    return OSError(f"rank {get_rank()}: {what} '{path}' failed: "
                   f"{type(e).__name__}: {first[0] if first else ''}")


def _failures():
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


@functools.lru_cache(maxsize=None)
def format_classes() -> Dict[Tuple[str, str], Any]:
    """``{(module, name): object}`` of DCP's metadata format that a
    ``.metadata`` file of tensors is built from: the metadata classes (not
    ``BytesStorageMetadata``, whose values DCP unpickles unrestricted) and
    the file system's storage record."""
    from torch.distributed.checkpoint import filesystem, metadata
    found: Dict[Tuple[str, str], Any] = {
        (metadata.__name__, name): getattr(metadata, name)
        for name in ('Metadata', 'TensorStorageMetadata', 'TensorProperties',
                     'ChunkStorageMetadata', 'MetadataIndex', 'StorageMeta',
                     '_MEM_FORMAT_ENCODING')}
    found[(filesystem.__name__, '_StorageInfo')] = filesystem._StorageInfo
    return found


@functools.lru_cache(maxsize=None)
def _reader_class():
    """DCP's ``FileSystemReader`` that reads ``.metadata`` with the
    caller's parser and refuses to unpickle values stored as bytes (built
    on first use: importing DCP takes a second)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta
    from torch.distributed.checkpoint.planner import LoadItemType

    class SafeFileSystemReader(FileSystemReader):
        def __init__(self, path: str, parse: ParseMetadata,
                     refuse: Refuse) -> None:
            super().__init__(path)
            self._parse, self._refuse = parse, refuse

        def read_metadata(self, *args: Any, **kwargs: Any):
            path = self._get_metadata_path(kwargs.get('rank'))
            with self.fs.create_stream(path, 'rb') as f:
                metadata = self._parse(f.read(), str(path))
            if metadata.storage_meta is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

        def read_data(self, plan, planner):
            if any(item.type == LoadItemType.BYTE_IO for item in plan.items):
                raise self._refuse(str(self._get_metadata_path()),
                                   'it declares values stored as pickles, '
                                   'not only tensors')
            return super().read_data(plan, planner)

    return SafeFileSystemReader


def reader(path: str, parse: ParseMetadata, refuse: Refuse) -> Any:
    """A DCP storage reader of the directory ``path`` that reads
    ``.metadata`` with ``parse(data, where)`` (which returns DCP
    ``Metadata`` or raises) and raises ``refuse(where, reason)`` for a
    value stored as a pickle, before DCP unpickles it."""
    return _reader_class()(path, parse, refuse)


def read_metadata(storage: Any, path: str,
                  keep: Tuple[Type[BaseException], ...] = ()) -> Any:
    """The ``Metadata`` of the checkpoint ``path`` read by ``storage`` (a
    :func:`reader`); an error of a type in ``keep`` passes, any other is
    a one-line :class:`OSError` (local, no collective)."""
    try:
        return storage.read_metadata()
    except keep:
        raise
    except Exception as e:
        raise _error('reading checkpoint metadata of', path, e) from e


def save(tensors: Dict[str, Tensor], path: str) -> None:
    """Writes ``{name: tensor}`` into the directory ``path`` with DCP
    (collective: every rank passes the same names with equal tensors)."""
    from torch.distributed import checkpoint as dcp
    STATS['collectives'] += 1
    try:
        with warnings.catch_warnings():  # "assuming ... a single process"
            warnings.simplefilter('ignore', UserWarning)
            dcp.save(tensors, storage_writer=dcp.FileSystemWriter(
                path, sync_files=True), no_dist=_no_dist())
    except _failures() as e:
        raise _error('writing checkpoint tensors to', path,
                     _cause(e)) from None


def load(tensors: Dict[str, Tensor], storage: Any, path: str,
         keep: Tuple[Type[BaseException], ...] = ()) -> None:
    """Fills ``{name: tensor}`` in place from the checkpoint ``path``
    through ``storage`` (a :func:`reader`; collective, every rank reads
    every tensor). The first rank's error passes when its type is in
    ``keep``; any other is a one-line :class:`OSError`."""
    from torch.distributed import checkpoint as dcp
    STATS['collectives'] += 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', UserWarning)
            dcp.load(tensors, storage_reader=storage, no_dist=_no_dist())
    except _failures() as e:
        cause = _cause(e)
        if isinstance(cause, keep):
            raise cause.with_traceback(None) from None
        raise _error('reading checkpoint tensors from', path,
                     cause) from None
