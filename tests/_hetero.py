"""Heterogeneous test graphs, and parts of them cut in contiguous blocks of
input ids (so the engine is tested independently of the partitioner, on
splits METIS would not make: a part with no node of a type, a relation with
no edge into a part)."""
from __future__ import annotations

from types import SimpleNamespace

import torch
from torch_geometric.data import HeteroData

PAPER, AUTHOR, FIELD = 'paper', 'author', 'field'
CITES = (PAPER, 'cites', PAPER)
WRITES = (AUTHOR, 'writes', PAPER)
WRITTEN = (PAPER, 'written_by', AUTHOR)
HAS = (PAPER, 'has', FIELD)
OF = (FIELD, 'of', PAPER)


def hard_hetero(seed: int = 0, num_papers: int = 40, num_authors: int = 25,
                num_fields: int = 7) -> HeteroData:
    """Paper/author/field graph: directed citations with self loops and
    duplicate edges, isolated nodes of every type, an edge attribute on the
    citations, features of different widths, labels and a training mask on
    papers (none in the last quarter of the ids)."""
    g = torch.Generator().manual_seed(seed)
    data = HeteroData()
    data[PAPER].x = torch.randn(num_papers, 12, generator=g)
    data[AUTHOR].x = torch.randn(num_authors, 8, generator=g)
    data[FIELD].x = torch.randn(num_fields, 6, generator=g)
    data[PAPER].y = torch.randint(0, 4, (num_papers, ), generator=g)
    train = torch.rand(num_papers, generator=g) < 0.6
    train[3 * num_papers // 4:] = False
    data[PAPER].train_mask = train

    def edges(n_src, n_dst, n, skip_src=(), skip_dst=()):
        src = torch.randint(0, n_src, (n, ), generator=g)
        dst = torch.randint(0, n_dst, (n, ), generator=g)
        keep = torch.ones(n, dtype=torch.bool)
        for s in skip_src:
            keep &= src != s
        for d in skip_dst:
            keep &= dst != d
        return torch.stack([src[keep], dst[keep]])

    cites = edges(num_papers, num_papers, 5 * num_papers, (5, ), (5, 7))
    loops = torch.tensor([[1, 2, 9], [1, 2, 9]])
    dup = cites[:, :6]
    data[CITES].edge_index = torch.cat([cites, loops, dup], 1)
    data[CITES].edge_attr = torch.randn(data[CITES].edge_index.size(1), 3,
                                        generator=g)
    writes = edges(num_authors, num_papers, 3 * num_papers, (0, 4), (5, ))
    data[WRITES].edge_index = writes
    data[WRITTEN].edge_index = writes.flip(0)
    has = edges(num_papers, num_fields, 2 * num_papers, (5, ), (num_fields -
                                                               1, ))
    data[HAS].edge_index = has
    data[OF].edge_index = has.flip(0)
    return data


def split_points(num: int, num_parts: int, empty_part: int = -1):
    """Contiguous block boundaries; ``empty_part`` gets no node."""
    sizes = [num // num_parts + (1 if i < num % num_parts else 0)
             for i in range(num_parts)]
    if 0 <= empty_part < num_parts and num_parts > 1:
        donor = (empty_part + 1) % num_parts
        sizes[donor] += sizes[empty_part]
        sizes[empty_part] = 0
    ptr = [0]
    for s in sizes:
        ptr.append(ptr[-1] + s)
    return torch.tensor(ptr)


class BlockHeteroPart:
    """A heterogeneous part in :func:`pyg_sar.load_partition`'s interface,
    with input ids kept (part ``p`` owns the ids ``node_ptr[p]`` to
    ``node_ptr[p + 1] - 1`` of each type)."""
    is_hetero = True

    def __init__(self, data: HeteroData, rank: int, num_parts: int,
                 empty: dict = None) -> None:
        empty = empty or {}
        self.rank, self.num_parts = rank, num_parts
        self.fingerprint = f'block-{num_parts}'
        self.node_types, self.edge_types = data.metadata()
        self._stores = {}
        for t in self.node_types:
            n = data[t].num_nodes
            ptr = split_points(n, num_parts, empty.get(t, -1))
            lo, hi = int(ptr[rank]), int(ptr[rank + 1])
            store = SimpleNamespace(node_ptr=ptr, num_nodes=n,
                                    num_local_nodes=hi - lo,
                                    node_ids=torch.arange(lo, hi),
                                    orig_ids=torch.arange(lo, hi))
            for key, value in data[t].items():
                if torch.is_tensor(value) and value.size(0) == n:
                    setattr(store, key, value[lo:hi])
            self._stores[t] = store
        for e in self.edge_types:
            src, dst = data[e].edge_index
            d_ptr = self._stores[e[2]].node_ptr
            lo, hi = int(d_ptr[rank]), int(d_ptr[rank + 1])
            mine = ((dst >= lo) & (dst < hi)).nonzero().view(-1)
            key = (dst[mine] - lo) * (src.max() + 1 if src.numel() else 1) \
                + src[mine]
            order = mine[torch.sort(key, stable=True).indices]
            deg = torch.bincount(dst[order] - lo, minlength=hi - lo)
            ptr = torch.zeros(hi - lo + 1, dtype=torch.long)
            ptr[1:] = deg.cumsum(0)
            store = SimpleNamespace(csc_ptr=ptr, csc_src=src[order],
                                    csc_eid=order, num_edges=src.numel())
            for key, value in data[e].items():
                if key != 'edge_index' and torch.is_tensor(value):
                    setattr(store, key, value[order])
            self._stores[e] = store

    def __getitem__(self, key):
        return self._stores[key]

    def metadata(self):
        return self.node_types, self.edge_types
