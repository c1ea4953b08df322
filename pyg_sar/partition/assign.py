"""Which part every node goes to: METIS (pymetis) on the symmetrized graph,
or a seeded random split, then no empty part, every node type of a
heterogeneous graph and the training nodes balanced."""
import math
from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor

# Allowed deviation of a part's training-node count from the mean before the
# training-node balancing pass moves nodes.
TRAIN_BALANCE_TOLERANCE = 0.05
# The same for the node count of every node type of a heterogeneous graph.
TYPE_BALANCE_TOLERANCE = 0.05


def _symmetric_csr(edge_index: Tensor,
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


def _random_parts(num_nodes: int, num_parts: int, generator: torch.Generator,
                  train_mask: Optional[Tensor]) -> Tensor:
    # Round-robin over a random order: part sizes differ by at most one.
    # Placing training nodes first in that order balances them as well.
    order = torch.randperm(num_nodes, generator=generator)
    if train_mask is not None:
        is_not_train = (~train_mask[order]).to(torch.uint8)
        order = order[torch.sort(is_not_train, stable=True).indices]
    part = torch.empty(num_nodes, dtype=torch.long)
    part[order] = torch.arange(num_nodes) % num_parts
    return part


def _metis_parts(rowptr: Tensor, col: Tensor, num_parts: int,
                 seed: int) -> Tensor:
    import pymetis

    idx_dtype = np.int64
    if pymetis._internal._idx_type_width() == 32:
        idx_dtype = np.int32
    adjacency = pymetis.CSRAdjacency(
        rowptr.numpy().astype(idx_dtype, copy=False),
        col.numpy().astype(idx_dtype, copy=False),
    )
    options = pymetis.Options()
    options.seed = seed
    # Note on training-node balance: METIS supports it via multi-constraint
    # vertex weights (ncon=2), but pymetis 2025.2.2 always calls METIS with
    # ncon=1 and reads an interleaved [n * 2] weight array as n single
    # weights, which silently unbalances the parts. Training nodes are
    # balanced by `_balance_training_nodes` instead.
    result = pymetis.part_graph(num_parts, adjacency, options=options,
                                recursive=False)
    return torch.from_numpy(np.asarray(result.vertex_part, dtype=np.int64))


def _neighbors_in_part(row: Tensor, col: Tensor, part: Tensor, target: int,
                       num_nodes: int) -> Tensor:
    # Per node: the number of its neighbors that lie in part `target`.
    hits = part[col] == target
    return torch.bincount(row[hits], minlength=num_nodes)


def _fill_empty_parts(part: Tensor, row: Tensor, col: Tensor,
                      num_parts: int) -> int:
    r"""Gives every empty part nodes of the currently largest part, those
    with the fewest neighbors inside it first. METIS leaves parts empty on
    tiny graphs, and PyG's stores cannot load an empty part. Returns the
    number of moved nodes."""
    num_nodes = part.numel()
    num_moved = 0
    for empty_part in range(num_parts):
        sizes = torch.bincount(part, minlength=num_parts)
        if sizes[empty_part] > 0:
            continue
        donor = int(sizes.argmax())
        amount = min(math.ceil(num_nodes / num_parts), int(sizes[donor]) // 2)
        candidates = (part == donor).nonzero().view(-1)
        inside = _neighbors_in_part(row, col, part, donor, num_nodes)
        order = torch.sort(inside[candidates], stable=True).indices
        part[candidates[order[:amount]]] = empty_part
        num_moved += amount
    return num_moved


def _balance_training_nodes(part: Tensor, row: Tensor, col: Tensor,
                            train_mask: Tensor, num_parts: int,
                            pool: Optional[Tensor] = None) -> int:
    r"""Moves training nodes from parts with too many to parts with too few,
    swapping the same number of non-training nodes back so that node counts
    stay unchanged. Candidates are ranked by the cut change of the move, so
    boundary nodes move first. Returns the number of swapped pairs.

    :obj:`pool` (a node mask) restricts the non-training nodes swapped back,
    e.g. to the node type of the training nodes, so that per-type node
    counts stay unchanged too."""
    num_nodes = part.numel()
    target = float(train_mask.sum()) / num_parts
    upper = math.floor(target * (1 + TRAIN_BALANCE_TOLERANCE) + 1)
    lower = math.ceil(target * (1 - TRAIN_BALANCE_TOLERANCE) - 1)
    num_swapped = 0
    for _ in range(num_parts * num_parts):
        counts = torch.bincount(part[train_mask], minlength=num_parts)
        donor, receiver = int(counts.argmax()), int(counts.argmin())
        if counts[donor] <= upper and counts[receiver] >= lower:
            break
        amount = int(min(counts[donor] - target, target - counts[receiver]))
        amount = max(amount, 1)

        to_receiver = _neighbors_in_part(row, col, part, receiver, num_nodes)
        to_donor = _neighbors_in_part(row, col, part, donor, num_nodes)
        gain = to_receiver - to_donor

        out_nodes = ((part == donor) & train_mask).nonzero().view(-1)
        back = (part == receiver) & ~train_mask
        if pool is not None:
            back &= pool
        back_nodes = back.nonzero().view(-1)
        amount = min(amount, out_nodes.numel(), back_nodes.numel())
        if amount == 0:
            break
        out_nodes = out_nodes[torch.topk(gain[out_nodes], amount).indices]
        back_nodes = back_nodes[torch.topk(-gain[back_nodes], amount).indices]
        part[out_nodes] = receiver
        part[back_nodes] = donor
        num_swapped += amount
    return num_swapped


def _balance_node_type(part: Tensor, row: Tensor, col: Tensor,
                       type_mask: Tensor, num_parts: int) -> int:
    r"""Moves nodes of one type (:obj:`type_mask`) from parts with too many
    of them to parts with too few, until every part holds the mean count
    within :obj:`TYPE_BALANCE_TOLERANCE` (and at least one node of the type
    when it has :obj:`num_parts` nodes or more). METIS balances only the
    total node count (pymetis has no multi-constraint balancing, see
    :func:`_metis_parts`). Candidates are ranked by the cut change of the
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
