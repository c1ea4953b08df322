"""The heterogeneous partitioner's assignment passes, on the symmetrized
graph held in memory as :obj:`row`/:obj:`col` arrays (all node types laid
out one after the other): :func:`symmetric_csr_in_memory` builds it, and
the repair passes of :mod:`~pyg_sar.partition.assign.repair` run on it
with neighbor counts from those arrays; :func:`balance_node_type`
balances every node type as well."""
import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from pyg_sar.partition.assign.repair import (balance_training_nodes,
                                             fill_empty_parts)

# The largest deviation of a part's node count of one node type from the
# mean, as a fraction of it (TRAIN_BALANCE_TOLERANCE for training nodes).
TYPE_BALANCE_TOLERANCE = 0.05


def symmetric_csr_in_memory(edge_index: Tensor,
                            num_nodes: int) -> Tuple[Tensor, Tensor, Tensor]:
    r"""Returns :obj:`(rowptr, row, col)` of the symmetrized graph without
    self loops and duplicate edges, sorted by :obj:`(row, col)`."""
    src, dst = edge_index[0], edge_index[1]
    keep = src != dst
    src, dst = src[keep], dst[keep]
    codes = torch.cat([src * num_nodes + dst, dst * num_nodes + src])
    del src, dst, keep
    codes = torch.unique(codes)  # sorts, so rows come out in order
    row = codes // num_nodes
    col = codes - row * num_nodes
    del codes
    rowptr = torch.zeros(num_nodes + 1, dtype=torch.long)
    torch.cumsum(torch.bincount(row, minlength=num_nodes), dim=0,
                 out=rowptr[1:])
    return rowptr, row, col


def _neighbors_in_part(row: Tensor, col: Tensor, part: Tensor, target: int,
                       num_nodes: int) -> Tensor:
    # Per node: the number of its neighbors that lie in part `target`.
    hits = part[col] == target
    return torch.bincount(row[hits], minlength=num_nodes)


def _row_col_count(row: Tensor, col: Tensor, num_nodes: int):
    return lambda part, target: _neighbors_in_part(row, col, part, target,
                                                   num_nodes)


def fill_empty_parts_in_memory(part: Tensor, row: Tensor, col: Tensor,
                               num_parts: int) -> int:
    r""":func:`pyg_sar.partition.assign.repair.fill_empty_parts` with neighbor
    counts from in-memory :obj:`row`/:obj:`col` arrays."""
    return fill_empty_parts(part, _row_col_count(row, col, part.numel()),
                            num_parts)


def balance_training_nodes_in_memory(part: Tensor, row: Tensor,
                                     col: Tensor, train_mask: Tensor,
                                     num_parts: int,
                                     pool: Optional[Tensor] = None) -> int:
    r""":func:`pyg_sar.partition.assign.repair.balance_training_nodes` with
    neighbor counts from in-memory :obj:`row`/:obj:`col` arrays."""
    return balance_training_nodes(
        part, _row_col_count(row, col, part.numel()), train_mask, num_parts,
        pool=pool)


def balance_node_type(part: Tensor, row: Tensor, col: Tensor,
                      type_mask: Tensor, num_parts: int) -> int:
    r"""Moves nodes of one type (:obj:`type_mask`) from parts with too many
    of them to parts with too few, until every part holds the mean count
    within :obj:`TYPE_BALANCE_TOLERANCE` (and at least one node of the type
    when it has :obj:`num_parts` nodes or more). METIS balances only the
    total node count (pymetis has no multi-constraint balancing, see
    :func:`~pyg_sar.partition.assign.parts.metis_parts`). Candidates are ranked by the cut change of the
    move, so boundary nodes move first. Returns the number of moved nodes.
    """
    num_nodes = part.numel()
    num_typed = int(type_mask.sum())
    target = num_typed / num_parts
    upper = math.floor(target * (1 + TYPE_BALANCE_TOLERANCE) + 1)
    lower = math.ceil(target * (1 - TYPE_BALANCE_TOLERANCE) - 1)
    lower = max(lower, 1 if num_typed >= num_parts else 0)
    num_moved = 0
    for _ in range(2 * num_parts * num_parts):
        counts = torch.bincount(part[type_mask], minlength=num_parts)
        donor, receiver = int(counts.argmax()), int(counts.argmin())
        if counts[donor] <= upper and counts[receiver] >= lower:
            break
        amount = max(1, int(min(counts[donor] - target,
                                target - counts[receiver])))
        gain = (_neighbors_in_part(row, col, part, receiver, num_nodes) -
                _neighbors_in_part(row, col, part, donor, num_nodes))
        out_nodes = ((part == donor) & type_mask).nonzero().view(-1)
        amount = min(amount, out_nodes.numel())
        out_nodes = out_nodes[torch.topk(gain[out_nodes], amount).indices]
        part[out_nodes] = receiver
        num_moved += amount
    return num_moved
