"""A node loader's seeds: which input nodes a rank batches
(:func:`input_seeds`), in the ids the user passes (the dataset's, or the
partition's with ``ids='partition'``), and the batches of an epoch
(:func:`epoch_batches`).

PyG's scripts pass the whole graph's ``data.train_mask`` (or dataset node
ids) to ``NeighborLoader``; every rank may pass the same tensor and keeps
the seeds it owns, found through its part's ``orig_ids`` (the dataset ids
of its nodes), without a map over the whole graph. ``input_id`` of a batch
is the seeds' positions in that input (for a mask: the seeds' ids, PyG's
``mask.nonzero()``; the batch builders put them in), as in PyG.
"""
from __future__ import annotations

import math
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

IDS = ('dataset', 'partition')


def ids_mode(ids: Optional[str], orig_ids: Optional[Tensor]) -> str:
    """The ids a loader's inputs and batches use: ``'dataset'`` (PyG's:
    the input graph's node ids; the default for a pyg_sar part) or
    ``'partition'`` (the partition's relabelled ids; the only ones PyG's
    stores know, which carry no dataset ids)."""
    if ids is not None and ids not in IDS:
        raise ValueError(f"'ids' must be 'dataset' or 'partition' (got "
                         f"{ids!r})")
    if orig_ids is None:
        if ids == 'dataset':
            raise ValueError("ids='dataset' needs the pyg_sar Partition "
                             "(PyG's stores carry no dataset ids); pass the "
                             "part from pyg_sar.load_partition")
        return 'partition'
    return ids or 'dataset'


def input_seeds(nodes: Any, start: int, count: int, num_nodes: int,
                orig_ids: Optional[Tensor], mode: str, rank: int, kind: str,
                mask_hint: str, local_attrs: Sequence[Tensor] = (),
                owner: Optional[Callable[[int], str]] = None
                ) -> Tuple[Tensor, Tensor]:
    """``(seeds, positions)``: the partition ids of the seeds this rank
    owns among ``nodes`` and their positions in the input (``input_id``).

    ``nodes``: ``None`` (every node: each rank its own; positions are the
    dataset ids, as PyG's ``arange(num_nodes)``), a boolean mask over the
    whole graph in dataset order (length ``num_nodes``) or over this rank's
    ``count`` local nodes (e.g. ``part.train_mask``), or integer ids
    (``mode``: dataset ids, any rank's, each rank keeping its own; or
    partition ids this rank owns; a repeated id is a seed at each of its
    positions, as in PyG). A mask whose length is both (one part
    holds every node) is a local mask when it shares memory with one of
    ``local_attrs`` (the part's node attributes) or ``mode`` is
    ``'partition'``, else a mask in dataset order; the two agree when the
    partition kept the dataset's order. ``kind`` names the ids in
    messages, ``mask_hint`` is an example mask, ``owner`` names the owner
    of a foreign partition id."""
    local = torch.arange(start, start + count)
    dataset = mode == 'dataset'
    if nodes is None:
        return local, (orig_ids.clone() if dataset else torch.arange(count))
    if isinstance(nodes, (list, tuple)):
        nodes = torch.as_tensor(nodes, dtype=torch.long)
    label = 'nodes' if kind == 'global' else f'{kind} nodes'
    if not isinstance(nodes, Tensor) or nodes.dim() != 1:
        raise TypeError(f"'input_nodes' must be a one-dimensional boolean "
                        f"mask or tensor of node ids (got "
                        f"{type(nodes).__name__} of shape "
                        f"{list(getattr(nodes, 'shape', []))})")
    nodes = nodes.cpu()
    if nodes.dtype == torch.bool:
        n = nodes.numel()
        whole = dataset and n == num_nodes and not (
            n == count and any(_shares_memory(nodes, a)
                               for a in local_attrs))
        if whole:
            picked = nodes[orig_ids].nonzero().view(-1)
            position = torch.cumsum(nodes, 0) - 1
            return local[picked], position[orig_ids[picked]]
        if n != count:
            raise ValueError(
                f"'input_nodes' mask has length {n}, but the graph has "
                f"{num_nodes} {label} (a mask over the whole graph, e.g. "
                f"data.train_mask) and rank {rank} owns {count} (a local "
                f"mask, e.g. {mask_hint})")
        picked = nodes.nonzero().view(-1)
        return local[picked], torch.arange(picked.numel())
    if nodes.is_floating_point() or nodes.is_complex():
        raise TypeError(f"'input_nodes' must be a boolean mask or an "
                        f"integer tensor of node ids (got {nodes.dtype})")
    ids = nodes.to(torch.long)  # repeats are seeds each, as in PyG
    if dataset:
        bad = (ids < 0) | (ids >= num_nodes)
        if bool(bad.any()):
            raise ValueError(f"'input_nodes' holds {label[:-1]} ids outside "
                             f"[0, {num_nodes}) (the dataset's ids), e.g. "
                             f"{int(ids[bad][0])}")
        hit, seeds = owned_dataset_ids(ids, orig_ids, start)
        return seeds, hit.nonzero().view(-1)
    not_owned = (ids < start) | (ids >= start + count)
    if bool(not_owned.any()):
        bad = int(ids[not_owned][0])
        owned_by = '' if owner is None else f', owned by {owner(bad)}'
        raise ValueError(
            f"'input_nodes' holds {int(not_owned.sum())} {kind} partition "
            f"ids not owned by rank {rank} (which owns {start}.."
            f"{start + count - 1}), e.g. {bad}{owned_by}; with "
            f"ids='partition' pass every rank only its own nodes")
    return ids, torch.arange(ids.numel())


def _shares_memory(a: Tensor, b: Any) -> bool:
    return isinstance(b, Tensor) and b.numel() > 0 and a.numel() > 0 and \
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def num_epoch_batches(counts: Sequence[int], batch_size: int,
                      drop_last: bool, balanced: bool) -> List[int]:
    """Every rank's batches per epoch, from every rank's inputs ``counts``:
    balanced (the default), the same on every rank, ``ceil(total /
    (world_size * batch_size))`` (``floor`` with ``drop_last``); else each
    rank's own ``ceil(count / batch_size)`` (``floor``)."""
    if balanced:
        total, width = sum(counts), len(counts) * batch_size
        every = total // width if drop_last else math.ceil(total / width)
        return [every] * len(counts)
    return [c // batch_size if drop_last else math.ceil(c / batch_size)
            for c in counts]


def epoch_batches(positions: Tensor, num_batches: int, batch_size: int,
                  drop_last: bool) -> List[Tensor]:
    """This rank's ``positions`` (its inputs, in epoch order) as
    ``num_batches`` batches of at most ``batch_size``: chunks of
    ``batch_size`` (the last smaller) when that makes ``num_batches``, as
    PyG does; else (a balanced epoch whose share needs fewer chunks) as
    even as possible, sizes differing by at most one; empty batches only
    when there are fewer inputs than batches. With ``drop_last`` every
    batch is full and the inputs past ``num_batches * batch_size`` are
    left out."""
    if drop_last:
        positions = positions[:num_batches * batch_size]
    chunks = list(positions.split(batch_size))
    if len(chunks) == num_batches:
        return chunks
    if len(chunks) > num_batches:  # only without balancing: own count
        return chunks[:num_batches]
    return list(torch.tensor_split(positions, num_batches))


def owned_dataset_ids(ids: Tensor, orig_ids: Tensor, start: int
                      ) -> Tuple[Tensor, Tensor]:
    """``(hit, partition ids)``: which of the dataset ``ids`` this rank
    owns (its nodes' dataset ids are ``orig_ids``, partition ids from
    ``start``), and the partition ids of those."""
    count = orig_ids.numel()
    if count == 0:
        return torch.zeros(ids.numel(), dtype=torch.bool), ids[:0]
    values, order = torch.sort(orig_ids)
    at = torch.searchsorted(values, ids).clamp(max=count - 1)
    hit = values[at] == ids
    return hit, order[at[hit]] + start


def to_partition_ids(ids: Tensor, orig_ids: Tensor, start: int) -> Tensor:
    """The partition ids of any dataset ``ids`` (collective: every rank
    calls it, with any ids). A directory spread over the ranks (dataset id
    ``d`` on rank ``d % world_size``, built from every rank's
    ``orig_ids``) answers them, so no rank holds a map over the whole
    graph."""
    from pyg_sar import comm
    world_size = comm.get_world_size()
    if world_size == 1:
        return owned_dataset_ids(ids, orig_ids, start)[1]
    local = torch.arange(start, start + orig_ids.numel())
    home = orig_ids % world_size
    order = torch.argsort(home, stable=True)
    counts = torch.bincount(home, minlength=world_size).tolist()
    keys = torch.cat(comm.all_to_all_v(list(orig_ids[order].split(counts))))
    values = torch.cat(comm.all_to_all_v(list(local[order].split(counts))))
    keys, at = torch.sort(keys)
    values = values[at]

    def answer(asked: Tensor) -> Tensor:
        if asked.numel() == 0:
            return asked
        return values[torch.searchsorted(keys, asked)]
    return comm.ask_owners(ids, ids % world_size, answer)


def to_partition_order(weight: Tensor, orig_ids: Tensor) -> Tensor:
    """A vector over the dataset's node ids (e.g. negative sampling
    weights) in the partition's order (collective: every rank contributes
    the entries of its own nodes)."""
    from pyg_sar import comm
    mine = weight[orig_ids]
    if comm.get_world_size() == 1:
        return mine
    return torch.cat(comm.all_to_all_v([mine] * comm.get_world_size()))
