"""Small graphs that stress exactness: directed edges, self loops, duplicate
edges, isolated nodes, exact feature ties, and a hub whose in-edges come from
every part."""
import torch

from pyg_sar import datasets


def hard_graph(num_nodes: int = 120, seed: int = 3):
    data = datasets.synthetic_graph(num_nodes, 5, 6, 3, seed=seed)
    isolated = torch.arange(4)
    src, dst = data.edge_index
    keep = ~(torch.isin(src, isolated) | torch.isin(dst, isolated))
    src, dst = src[keep], dst[keep]
    gen = torch.Generator().manual_seed(seed)
    loops = torch.arange(10, 20)
    dup = torch.randint(0, src.numel(), (15, ), generator=gen)
    hub_src = torch.arange(4, num_nodes, 7)
    hub = torch.full_like(hub_src, num_nodes - 1)
    data.edge_index = torch.stack([
        torch.cat([src, loops, src[dup], hub_src]),
        torch.cat([dst, loops, dst[dup], hub])])
    data.x = (data.x * 2).round() / 2
    data.edge_weight = torch.rand(data.edge_index.size(1), generator=gen) + .1
    data.edge_attr = torch.randn(data.edge_index.size(1), 3, generator=gen)
    return data


def last_rank_untrained(mask, rank: int, world_size: int):
    """A worker's training mask with no training node on the last rank
    (from two workers on): the part without training nodes that the
    exactness tests cover."""
    mask = mask.clone()
    if rank == world_size - 1 and world_size > 1:
        mask[:] = False
    return mask


def last_part_untrained(mask, root: str, world_size: int):
    """The whole graph's training mask that :func:`last_rank_untrained`
    leaves: the nodes of the last part of the partition at ``root`` are
    dropped."""
    from pyg_sar import load_partition
    mask = mask.clone()
    if world_size > 1:
        mask[load_partition(root, world_size - 1).orig_ids] = False
    return mask
