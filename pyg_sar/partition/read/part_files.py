"""Reading and checking the files of one part, shared by the homogeneous
and the heterogeneous loader: every file is read through :class:`PartFiles`
(inside the partition directory, ``torch.load(weights_only=True)``, its
content hash checked against the manifest) and every mismatch with the
manifest is an error naming the file (:func:`expect` and its kin)."""
import os.path as osp
import posixpath
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from pyg_sar.partition.digest import (HASH_ALGORITHM, bytes_digest,
                                      file_digest)
from pyg_sar.partition.layout import MANIFEST_FILE, part_path


def set_fields(obj: Any, attrs: Dict[str, Tensor]) -> None:
    """Every attribute as a field of ``obj``, except those that would shadow
    a field (they stay in the dictionaries only)."""
    for key, value in attrs.items():
        if key not in obj.__dict__ and not hasattr(type(obj), key):
            setattr(obj, key, value)


def csc_edge_index(csc_ptr: Tensor, csc_src: Tensor,
                    dst_ids: Tensor) -> Tensor:
    """``[2, num_edges]`` ``(src, dst)`` ids of CSC-ordered in-edges of the
    nodes ``dst_ids``."""
    counts = csc_ptr[1:] - csc_ptr[:-1]
    dst = torch.repeat_interleave(dst_ids, counts)
    return torch.stack([csc_src, dst], dim=0)


def expect(condition: bool, path: str, message: str) -> None:
    r"""Raises a :class:`ValueError` naming the file :obj:`path` and what
    does not match the partition, unless :obj:`condition`."""
    if not condition:
        raise ValueError(f"Partition file '{path}' does not match the "
                         f"partition: {message}")


def expect_vector(value: Any, length: int, path: str, name: str) -> None:
    r""":func:`expect` that :obj:`value` (the field :obj:`name` of
    :obj:`path`) is a vector of :obj:`length` entries."""
    expect(
        isinstance(value, Tensor) and value.dim() == 1
        and value.numel() == length, path,
        f"'{name}' should be a vector of length {length} (got "
        f"{list(value.shape) if isinstance(value, Tensor) else value!r})")


def expect_permutation(value: Any, length: int, path: str,
                        name: str) -> None:
    r"""Checks that :obj:`value` is a permutation of :obj:`0` to
    :obj:`length - 1` (int64): each id exactly once. Min, max and one
    :obj:`bincount`: about 0.4 s for 20M ids on the development machine."""
    expect_vector(value, length, path, name)
    expect(value.dtype == torch.long, path,
            f"'{name}' should have dtype torch.int64 (got {value.dtype})")
    if length == 0:
        return
    low, high = int(value.min()), int(value.max())
    expect(low >= 0 and high < length, path,
            f"'{name}' holds id {low if low < 0 else high}, outside "
            f"[0, {length})")
    wrong = torch.bincount(value, minlength=length) != 1
    if bool(wrong.any()):
        expect(False, path,
                f"'{name}' is not a permutation of [0, {length}): "
                f"{int(wrong.sum()):,} ids are missing or repeated (first: "
                f"{int(wrong.nonzero()[0, 0])})")


class PartFiles:
    r"""The files of the partition directory :obj:`root` as its manifest
    lists them, for one :func:`~pyg_sar.partition.load_partition` call.

    Every name (relative to :obj:`root`, from the layout or from the
    manifest) must resolve inside :obj:`root`, symbolic links followed, and
    have a content hash in the manifest's :obj:`files` table; every file
    read is hashed (:func:`~pyg_sar.partition.digest.file_digest`).
    Structural checks run on the loaded contents first (their errors say
    precisely what is wrong); a file that differs from the one written
    (a part swapped in from another partitioning, one flipped byte) is
    refused by :meth:`verify`, which the loader calls before returning.
    """
    def __init__(self, root: str, manifest: Dict[str, Any]):
        self.root = root
        self.manifest_path = osp.join(root, MANIFEST_FILE)
        self._real_root = osp.realpath(root)
        self._files = manifest.get('files')
        if not isinstance(self._files, dict):
            raise ValueError(f"Partition file '{self.manifest_path}' is "
                             f"corrupt: 'files' (the content hash of every "
                             f"file) is missing or not an object")
        self._mismatches: List[str] = []

    def path(self, name: Any, field: Optional[str] = None) -> str:
        r"""The path of the file :obj:`name` (relative to the partition
        directory; :obj:`field` names the manifest field it comes from),
        refused unless it resolves inside the partition directory."""
        where = f" ('{field}' in '{self.manifest_path}')" if field else ''
        if not isinstance(name, str) or not name:
            raise ValueError(f"Partition file name {name!r}{where} is not a "
                             f"non-empty string")
        path = osp.join(self.root, name)
        real = osp.realpath(path)
        if osp.isabs(name) or osp.commonpath([self._real_root, real]) \
                != self._real_root:
            raise ValueError(f"Partition file name '{name}'{where} resolves "
                             f"to '{real}', outside the partition directory "
                             f"'{self.root}'; refusing to read it")
        return path

    def _expected(self, name: str) -> Tuple[int, str]:
        entry = self._files.get(posixpath.normpath(name))
        if not (isinstance(entry, dict)
                and type(entry.get('bytes')) is int
                and isinstance(entry.get(HASH_ALGORITHM), str)):
            raise ValueError(f"Partition file '{self.manifest_path}' has no "
                             f"valid content hash for '{name}' in 'files'")
        return entry['bytes'], entry[HASH_ALGORITHM]

    def _compare(self, name: str, size: int, digest: str) -> None:
        expected_size, expected = self._expected(name)
        if (size, digest) != (expected_size, expected):
            change = (f'{size:,} bytes instead of {expected_size:,}'
                      if size != expected_size else
                      f'{HASH_ALGORITHM} {digest[:16]}... instead of '
                      f'{expected[:16]}...')
            self._mismatches.append(
                f"Partition file '{osp.join(self.root, name)}' differs from "
                f"the one written with this partition ({change}, per "
                f"'{MANIFEST_FILE}'): it was modified or swapped in from "
                f"another partitioning; re-partition or restore it")

    def check_bytes(self, name: str, raw: bytes) -> None:
        r"""Checks the already read bytes :obj:`raw` of :obj:`name`."""
        self._compare(name, len(raw), bytes_digest(raw))

    def load(self, name: Any, field: Optional[str] = None) -> Any:
        r"""Reads :obj:`name` with :obj:`torch.load(weights_only=True)`,
        hashing its bytes on the way (one open file: hashed, then
        loaded)."""
        path = self.path(name, field)
        self._expected(name)  # before reading anything
        if not osp.isfile(path):
            raise FileNotFoundError(f"Partition file '{path}' is missing")
        with open(path, 'rb') as f:
            digest = file_digest(f)
            size = f.tell()
            f.seek(0)
            try:
                obj = torch.load(f, weights_only=True)
            except Exception as e:
                raise ValueError(f"Partition file '{path}' is corrupt or "
                                 f"unreadable ({type(e).__name__}: "
                                 f"{_first_line(e)})") from e
        self._compare(name, size, digest)
        return obj

    def load_dict(self, name: str, keys: Tuple[str, ...]) -> Dict[str, Any]:
        obj = self.load(name)
        path = self.path(name)
        expect(isinstance(obj, dict), path, 'expected a dictionary')
        missing = [key for key in keys if key not in obj]
        expect(not missing, path, f'missing keys {missing}')
        return obj

    def load_feats(self, part_dir: str, kind: str, num_rows: int,
                   names) -> Dict[str, Any]:
        """The attributes in ``<part_dir>/<kind>_feats.pt`` (``kind``:
        ``node`` or ``edge``), checked: ``num_rows`` global ids and rows,
        exactly the attributes ``names``."""
        name = f'{part_dir}/{kind}_feats.pt'
        path = self.path(name)
        feats = self.load_dict(name, ('global_id', 'feats'))
        expect_vector(feats['global_id'], num_rows, path, 'global_id')
        attrs = feats['feats']
        expect(isinstance(attrs, dict) and sorted(attrs) == sorted(names),
                path, f'expected {kind} attributes {names}')
        for key, value in attrs.items():
            expect(isinstance(value, Tensor) and value.dim() > 0
                    and value.size(0) == num_rows, path,
                    f"'{key}' has {_rows(value)} rows, expected {num_rows}")
        return attrs

    def verify(self) -> None:
        r"""Raises the first content mismatch of the files read so far."""
        if self._mismatches:
            raise ValueError(self._mismatches[0])


def _rows(value: Any) -> Any:
    return value.size(0) if isinstance(value, Tensor) and value.dim() > 0 \
        else '?'


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else ''


def check_rank(root: str, rank: Any, num_parts: int) -> str:
    r"""Checks :obj:`rank` against :obj:`num_parts`; returns the folder of
    the part, relative to :obj:`root`."""
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise TypeError(f"'rank' must be an int (got {type(rank).__name__})")
    if not 0 <= rank < num_parts:
        raise ValueError(f"'rank' must lie in [0, {num_parts - 1}] for the "
                         f"{num_parts}-part partition in '{root}' (got "
                         f"{rank})")
    part_dir = part_path(root, rank)
    if not osp.isdir(part_dir):
        raise FileNotFoundError(f"Partition directory '{part_dir}' is "
                                f"missing")
    return osp.basename(part_dir)
