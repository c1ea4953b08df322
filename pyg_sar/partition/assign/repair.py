r"""Repair passes after a partitioner: no empty part, node counts within a
bound, training nodes balanced. Every pass ranks its candidate nodes by the
cut change of the move (neighbors in the receiving part minus neighbors in
the donor part), so boundary nodes move first.

The neighbor counts come from a callable :obj:`count(part, target)` that
returns, per node, the number of its neighbors in part :obj:`target`: from
in-memory :obj:`row`/:obj:`col` arrays
(:mod:`~pyg_sar.partition.assign.in_memory`) or streamed from a
:class:`~pyg_sar.partition.assign.symmetric.CsrView` a range of rows at a
time (in memory or memory-mapped from the partitioner's ParHIP file), so
that a repair never needs more than the part vector, a few per-node counters and
one chunk of the adjacency."""
import math
from typing import Callable, Optional

import torch
from torch import Tensor

# Allowed deviation of a part's training-node count from the mean before the
# training-node balancing pass moves nodes.
TRAIN_BALANCE_TOLERANCE = 0.05
# The node balance (largest part / mean part size) every method guarantees
# where the part sizes allow it (sizes are integers: never below
# ceil(n / k) / (n / k)).
NODE_BALANCE = 1.01

NeighborCount = Callable[[Tensor, int], Tensor]


def max_part_size(num_nodes: int, num_parts: int,
                  balance: float = NODE_BALANCE) -> int:
    r"""The largest part size allowed: :obj:`floor(balance * n / k)`, but
    at least :obj:`ceil(n / k)`."""
    return max(math.ceil(num_nodes / num_parts),
               math.floor(balance * num_nodes / num_parts))


def fill_empty_parts(part: Tensor, count: NeighborCount,
                     num_parts: int) -> int:
    r"""Gives every empty part nodes of the currently largest part, those
    with the fewest neighbors inside it first (partitioners leave parts
    empty on tiny graphs, and PyG's stores cannot load an empty part).
    Returns the number of moved nodes."""
    num_nodes = part.numel()
    num_moved = 0
    for empty_part in range(num_parts):
        sizes = torch.bincount(part, minlength=num_parts)
        if sizes[empty_part] > 0:
            continue
        donor = int(sizes.argmax())
        amount = min(math.ceil(num_nodes / num_parts), int(sizes[donor]) // 2)
        candidates = (part == donor).nonzero().view(-1)
        inside = count(part, donor)
        order = torch.sort(inside[candidates], stable=True).indices
        part[candidates[order[:amount]]] = empty_part
        num_moved += amount
    return num_moved


def cap_part_sizes(part: Tensor, count: NeighborCount, num_parts: int,
                   max_size: int) -> int:
    r"""Moves nodes out of every part larger than :obj:`max_size` into the
    smallest parts, best cut change first, until no part exceeds it.
    Returns the number of moved nodes."""
    num_moved = 0
    for _ in range(2 * num_parts * num_parts):
        sizes = torch.bincount(part, minlength=num_parts)
        donor, receiver = int(sizes.argmax()), int(sizes.argmin())
        if sizes[donor] <= max_size:
            break
        amount = min(int(sizes[donor]) - max_size,
                     max_size - int(sizes[receiver]))
        if amount <= 0:
            break
        gain = count(part, receiver) - count(part, donor)
        out_nodes = (part == donor).nonzero().view(-1)
        out_nodes = out_nodes[torch.topk(gain[out_nodes], amount).indices]
        part[out_nodes] = receiver
        num_moved += amount
    return num_moved


def balance_training_nodes(part: Tensor, count: NeighborCount,
                           train_mask: Tensor, num_parts: int,
                           pool: Optional[Tensor] = None) -> int:
    r"""Moves training nodes from parts with too many to parts with too few,
    swapping the same number of non-training nodes back so that node counts
    stay unchanged, until every part holds the mean within
    :obj:`TRAIN_BALANCE_TOLERANCE`. Returns the number of swapped pairs.

    :obj:`pool` (a node mask) restricts the non-training nodes swapped back,
    e.g. to the node type of the training nodes, so that per-type node
    counts stay unchanged too."""
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

        gain = count(part, receiver) - count(part, donor)

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


def node_balance(part: Tensor, num_parts: int) -> float:
    r"""Largest part size over the mean part size."""
    sizes = torch.bincount(part, minlength=num_parts)
    return float(sizes.max()) * num_parts / max(part.numel(), 1)


__all__ = ['fill_empty_parts', 'cap_part_sizes', 'balance_training_nodes',
           'max_part_size', 'node_balance', 'NODE_BALANCE',
           'TRAIN_BALANCE_TOLERANCE']
