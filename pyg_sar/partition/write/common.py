"""What the homogeneous and the heterogeneous writer share: the manifest's
first fields, per-part counts and tensor descriptions, and the one call
that saves a file (which tests replace to fail or stall writes)."""
from typing import Any, Dict, Optional

import torch
from torch import Tensor

from pyg_sar.partition.layout import FORMAT_NAME, FORMAT_VERSION
from pyg_sar.utils.version import __version__


def manifest_header() -> Dict[str, Any]:
    r"""The first fields of every manifest: what wrote it, in which format
    (checked by the reader)."""
    return {'format': FORMAT_NAME, 'format_version': FORMAT_VERSION,
            'pyg_sar_version': __version__}


def count_per_part(values: Tensor, num_parts: int) -> Tensor:
    r"""How many of :obj:`values` (part ids) fall in every part."""
    return torch.bincount(values, minlength=num_parts)


def max_over_mean(counts: Tensor) -> float:
    r"""The balance of per-part :obj:`counts`: the largest over the mean
    (:obj:`1.0` when all are zero)."""
    mean = float(counts.double().mean())
    return float(counts.max()) / mean if mean > 0 else 1.0


def class_count(y) -> Optional[int]:
    """The class count of the labels ``y``: ``max + 1`` of integer labels
    (one per node, or ``[N, 1]``), the width of a multi-label ``[N, C]``
    float/bool target; ``None`` without usable labels."""
    if not isinstance(y, Tensor) or y.numel() == 0:
        return None
    if y.dim() == 2 and y.size(1) > 1:
        return int(y.size(1))
    if y.is_floating_point() or y.dtype == torch.bool or y.dim() > 2:
        return None
    return int(y.max()) + 1


def tensor_info(value: Tensor) -> Dict[str, Any]:
    r"""A tensor's shape and dtype, as the manifest records them."""
    return dict(shape=list(value.shape), dtype=str(value.dtype))


def save_file(obj: Any, path: str) -> None:
    r"""``torch.save(obj, path)``: the writers' one call that saves a file
    (of a streamed file, its skeleton)."""
    torch.save(obj, path)
