"""Input checks of the partitioner, shared by the homogeneous and the
heterogeneous path: the method and part count asked for, an
:obj:`edge_index`'s shape and dtype, which attribute names are per node,
and class labels on the nodes of a mask."""
from typing import Any, Dict

import torch
from torch import Tensor

from pyg_sar.partition.layout import METHODS

# Attributes that PyG and this package read per node: a tensor of one of
# these names is a node attribute or an error, never an edge attribute.
NODE_ATTR_NAMES = ('x', 'y', 'pos')


def is_node_attr_name(key: str) -> bool:
    r"""Whether :obj:`key` names a per-node attribute: :obj:`x`, :obj:`y`,
    :obj:`pos`, or a mask :obj:`*_mask` (except edge masks, whose name
    holds :obj:`edge`)."""
    return key in NODE_ATTR_NAMES or (key.endswith('_mask')
                                      and 'edge' not in key)


def _is_node_mask(key: str, value: Tensor) -> bool:
    return is_node_attr_name(key) and key.endswith('_mask') \
        and value.dtype == torch.bool and value.dim() == 1


def check_labels(node_attrs: Dict[str, Tensor], prefix: str = '') -> None:
    r"""Raises a :class:`ValueError` when the integer class labels
    :obj:`y` (one per node, or :obj:`[num_nodes, 1]`) are negative on a node
    of a mask (a boolean node attribute :obj:`*_mask`, such as
    :obj:`train_mask`): that node would be trained on or scored with a label
    that is no class. Labels outside every mask (e.g. :obj:`-1` for
    unlabeled nodes) are fine. :obj:`prefix` (e.g. :obj:`'paper.'`) names
    the node type in the error."""
    y = node_attrs.get('y')
    if not isinstance(y, Tensor) or y.is_floating_point() or y.is_complex() \
            or y.dtype == torch.bool or y.numel() == 0 \
            or not (y.dim() == 1 or (y.dim() == 2 and y.size(1) == 1)):
        return  # no class ids: multi-label or regression targets
    negative = y.view(-1) < 0
    if not bool(negative.any()):
        return
    for key, mask in node_attrs.items():
        if not _is_node_mask(key, mask):
            continue
        bad = negative & mask
        count = int(bad.sum())
        if count:
            first = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"Node attribute '{prefix}y' holds the negative label "
                f"{int(y.view(-1)[first])} on {count:,} nodes of "
                f"'{prefix}{key}' (first: input node {first}); expected a "
                f"class id >= 0 on every node of a mask: fix those labels or "
                f"remove the nodes from the mask")


def check_edge_index(edge_index: Any, name: str) -> Tensor:
    r"""Checks that :obj:`edge_index` (called :obj:`name` in errors) is an
    integer tensor of shape :obj:`[2, num_edges]`; returns it as int64."""
    if edge_index is None:
        raise ValueError(f"'{name}' is missing; expected a tensor of "
                         f"shape [2, num_edges]")
    if not isinstance(edge_index, Tensor):
        raise TypeError(f"'{name}' must be a tensor of shape "
                        f"[2, num_edges] (got '{type(edge_index).__name__}')")
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"'{name}' must have shape [2, num_edges] "
                         f"(got {list(edge_index.shape)})")
    if edge_index.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"'{name}' must have dtype torch.int64 "
                         f"(got {edge_index.dtype})")
    return edge_index.long()


def check_method(method: str) -> None:
    r"""Refuses a partition method other than :obj:`METHODS`."""
    if method not in METHODS:
        raise ValueError(f"Unknown partition method '{method}'; expected one "
                         f"of {list(METHODS)}")


def check_num_parts(num_parts: Any, num_nodes: int) -> None:
    r"""Refuses a part count that is no int or outside
    :obj:`[1, num_nodes]`."""
    if isinstance(num_parts, bool) or not isinstance(num_parts, int):
        raise TypeError(f"'num_parts' must be an int (got "
                        f"{type(num_parts).__name__})")
    if not 1 <= num_parts <= num_nodes:
        raise ValueError(f"'num_parts' must lie in [1, num_nodes="
                         f"{num_nodes}] (got {num_parts})")
