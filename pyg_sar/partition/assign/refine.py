r"""Size-constrained label-propagation refinement of a partition, streamed
over a symmetric adjacency (:class:`~pyg_sar.partition.assign.symmetric.CsrView`,
in memory or memory-mapped), as multilevel partitioners refine each level:
every node moves to the part holding most of its neighbors where that
lowers the cut and the part has room. Used after KaMinPar partitioned a
sample of the edges (:mod:`~pyg_sar.partition.assign.sample`): the moves
see every edge."""
import torch
from torch import Tensor

from pyg_sar.partition.assign.symmetric import CsrView

# Rounds over the graph (fewer once no node moves).
REFINE_ROUNDS = 2
# The share of a chunk's nodes with a gain that move (moving all at once
# lets neighbors swap parts back and forth).
REFINE_ACTIVE = 0.5


def _step(part: Tensor, sizes: Tensor, max_size: int, nodes: Tensor,
          rows: Tensor, col: Tensor, num_parts: int,
          generator: torch.Generator) -> int:
    r"""One step: the nodes :obj:`nodes` (global ids), their entries
    :obj:`rows` (positions in :obj:`nodes`) and :obj:`col`."""
    num_rows = nodes.numel()
    counts = torch.zeros(num_rows * num_parts, dtype=torch.long)
    counts.index_add_(0, rows * num_parts + part[col],
                      torch.ones(1, dtype=torch.long).expand(rows.numel()))
    counts = counts.view(num_rows, num_parts)
    own = part[nodes]
    here = counts.gather(1, own.view(-1, 1)).view(-1)
    # The best other part, ties at random.
    score = counts.double() + torch.rand(counts.shape, generator=generator,
                                         dtype=torch.float64)
    score.scatter_(1, own.view(-1, 1), -1.0)
    best = score.argmax(1)
    gain = counts.gather(1, best.view(-1, 1)).view(-1) - here
    move = ((gain > 0) & (torch.rand(num_rows, generator=generator) <
                          REFINE_ACTIVE)).nonzero().view(-1)
    if move.numel() == 0:
        return 0
    target, gain = best[move], gain[move]
    # Room: into every part the largest gains first, up to its free size
    # (moves out of a part in the same step are not counted as room).
    order = torch.argsort(target * (gain.max() + 1) - gain, stable=True)
    move, target = move[order], target[order]
    first = torch.ones_like(target, dtype=torch.bool)
    first[1:] = target[1:] != target[:-1]
    start = torch.cummax(torch.where(first, torch.arange(target.numel()), 0),
                         0).values
    ok = torch.arange(target.numel()) - start < max_size - sizes[target]
    move, target = nodes[move[ok]], target[ok]
    sizes.index_add_(0, part[move], torch.full_like(move, -1))
    sizes.index_add_(0, target, torch.ones_like(move))
    part[move] = target
    return move.numel()


def refine_cut(view: CsrView, part: Tensor, num_parts: int, max_size: int,
               rounds: int = REFINE_ROUNDS, seed: int = 0) -> int:
    r"""Moves nodes of :obj:`part` (int64, changed in place) to the part
    holding most of their neighbors in :obj:`view` where that cuts fewer
    edges, no part growing above :obj:`max_size` nodes (a part already
    above it only shrinks). Every move lowers the cut given the parts of the
    nodes it sees; in every chunk a random :obj:`REFINE_ACTIVE` share of the
    nodes with a gain move, and the next chunk sees the moves. Returns the
    number of moves.

    Args:
        view (CsrView): The symmetric adjacency.
        part (torch.Tensor): The part of every node.
        num_parts (int): Number of parts.
        max_size (int): The most nodes a part may receive up to.
        rounds (int, optional): Rounds over the graph.
        seed (int, optional): Seed of the random choices.
    """
    generator = torch.Generator().manual_seed(seed)
    sizes = torch.bincount(part, minlength=num_parts)
    moved = 0
    for _ in range(rounds):
        moved_now = 0
        for r0, r1, col in view.chunks():
            if col.numel() == 0:
                continue
            deg = view.rowptr[r0 + 1:r1 + 1] - view.rowptr[r0:r1]
            rows = torch.repeat_interleave(torch.arange(r1 - r0), deg)
            moved_now += _step(part, sizes, max_size,
                               torch.arange(r0, r1), rows, col, num_parts,
                               generator)
        moved += moved_now
        if moved_now == 0:
            break
    return moved


__all__ = ['refine_cut', 'REFINE_ROUNDS', 'REFINE_ACTIVE']
