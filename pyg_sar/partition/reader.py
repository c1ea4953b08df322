"""Reading and checking the files of a partition directory, shared by the
homogeneous and the heterogeneous loader: every file is read with
``torch.load(weights_only=True)`` and every mismatch with the manifest is an
error naming the file."""
import json
import os.path as osp
from typing import Any, Dict, Tuple

import torch
from torch import Tensor

from pyg_sar.partition.layout import _part_dir


def _set_fields(obj: Any, attrs: Dict[str, Tensor]) -> None:
    """Every attribute as a field of ``obj``, except those that would shadow
    a field (they stay in the dictionaries only)."""
    for key, value in attrs.items():
        if key not in obj.__dict__ and not hasattr(type(obj), key):
            setattr(obj, key, value)


def _csc_edge_index(csc_ptr: Tensor, csc_src: Tensor,
                    dst_ids: Tensor) -> Tensor:
    """``[2, num_edges]`` ``(src, dst)`` ids of CSC-ordered in-edges of the
    nodes ``dst_ids``."""
    counts = csc_ptr[1:] - csc_ptr[:-1]
    dst = torch.repeat_interleave(dst_ids, counts)
    return torch.stack([csc_src, dst], dim=0)


def _read_bytes(path: str) -> bytes:
    if not osp.isfile(path):
        raise FileNotFoundError(f"Partition file '{path}' is missing")
    with open(path, 'rb') as f:
        return f.read()


def _parse_json(raw: bytes, path: str) -> Dict[str, Any]:
    try:
        obj = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"Partition file '{path}' is corrupt (invalid "
                         f"JSON: {e})") from e
    if not isinstance(obj, dict):
        raise ValueError(f"Partition file '{path}' is corrupt (expected a "
                         f"JSON object)")
    return obj


def _load(path: str) -> Any:
    if not osp.isfile(path):
        raise FileNotFoundError(f"Partition file '{path}' is missing")
    try:
        return torch.load(path, weights_only=True)
    except Exception as e:
        raise ValueError(f"Partition file '{path}' is corrupt or unreadable "
                         f"({type(e).__name__}: {e})") from e


def _expect(condition: bool, path: str, message: str) -> None:
    if not condition:
        raise ValueError(f"Partition file '{path}' does not match the "
                         f"partition: {message}")


def _load_dict(path: str, keys: Tuple[str, ...]) -> Dict[str, Any]:
    obj = _load(path)
    _expect(isinstance(obj, dict), path, 'expected a dictionary')
    missing = [key for key in keys if key not in obj]
    _expect(not missing, path, f'missing keys {missing}')
    return obj


def _expect_vector(value: Any, length: int, path: str, name: str) -> None:
    _expect(
        isinstance(value, Tensor) and value.dim() == 1
        and value.numel() == length, path,
        f"'{name}' should be a vector of length {length} (got "
        f"{list(value.shape) if isinstance(value, Tensor) else value!r})")


def _load_feats(part_dir: str, kind: str, num_rows: int,
                names) -> Dict[str, Any]:
    """The attributes in ``<kind>_feats.pt`` (``kind``: ``node`` or
    ``edge``), checked: ``num_rows`` global ids and rows, exactly the
    attributes ``names``."""
    path = osp.join(part_dir, f'{kind}_feats.pt')
    feats = _load_dict(path, ('global_id', 'feats'))
    _expect_vector(feats['global_id'], num_rows, path, 'global_id')
    attrs = feats['feats']
    _expect(isinstance(attrs, dict) and sorted(attrs) == sorted(names), path,
            f'expected {kind} attributes {names}')
    for key, value in attrs.items():
        _expect(value.size(0) == num_rows, path,
                f"'{key}' has {value.size(0)} rows, expected {num_rows}")
    return attrs


def _check_rank(root: str, rank: Any, num_parts: int) -> str:
    r"""Checks :obj:`rank` against :obj:`num_parts`; returns the folder of
    the part."""
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise TypeError(f"'rank' must be an int (got {type(rank).__name__})")
    if not 0 <= rank < num_parts:
        raise ValueError(f"'rank' must lie in [0, {num_parts - 1}] for the "
                         f"{num_parts}-part partition in '{root}' (got "
                         f"{rank})")
    part_dir = _part_dir(root, rank)
    if not osp.isdir(part_dir):
        raise FileNotFoundError(f"Partition directory '{part_dir}' is "
                                f"missing")
    return part_dir
