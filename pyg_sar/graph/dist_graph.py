"""The distributed graph of one worker: edge blocks and the exchange plan.

A worker owns a contiguous range of global node ids and every edge whose
destination it owns. :class:`DistGraph` cuts those edges into one
:class:`EdgeBlock` per source partition (the local block plus one per remote
partition that sends edges here), re-indexes each block's sources compactly,
and agrees with every peer, once, on which rows travel between them.
"""
from __future__ import annotations

import inspect
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.graph.blocks import EdgeBlock, EdgeChunk, index_dtype
from pyg_sar.graph.exchange import RowPlan, fetch_rows, push_rows
from pyg_sar.graph.link import fetch_nodes, global_ids
from pyg_sar.graph.mfg import LayerWise
from pyg_sar.graph.self_loops import kept_base_edges, make_loop_view
from pyg_sar.graph.transport import (merged_block, post_row_exchange,
                                    remote_block)
from pyg_sar.utils.malloc import configure_allocator, release_free_memory
from pyg_sar.utils.openmp import warn_if_spinning

MODES = ('sar', 'sa', 'one_shot')
__all__ = ['DistGraph', 'EdgeBlock', 'EdgeChunk', 'MODES', 'check_options',
           'check_partition_set', 'explicit_device']


def explicit_device(device) -> torch.device:
    """``device`` with its index made explicit (``'cuda'`` is the current
    GPU, ``cuda:N``), so that it compares equal to the device tensors
    report."""
    device = torch.device(device)
    if device.type == 'cuda' and device.index is None:
        device = torch.device('cuda', torch.cuda.current_device())
    return device


def check_options(mode: str, chunk_size: Optional[int]) -> None:
    """Refuses an unknown ``mode`` or a ``chunk_size`` that is not a
    positive int (or ``None``)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES} (got {mode!r})")
    if chunk_size is not None and (not isinstance(chunk_size, int)
                                   or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive int or None "
                         f"(got {chunk_size!r})")


def check_partition_set(part, sizes, options: Optional[Dict] = None) -> None:
    """Collective: every rank holds its own part of one and the same
    partitioning (``sizes``: what else must agree, e.g. node and edge
    counts), and the world matches the part count. In the same gather, every
    rank must have the same graph ``options`` (``{name: value}``, e.g.
    ``mode`` and ``chunk_size``, which decide which exchanges run) and the
    same shared communication settings (:func:`pyg_sar.comm.agree`); a
    difference is a :class:`~pyg_sar.comm.SettingsMismatchError` naming it,
    on every rank."""
    world_size, rank = comm.get_world_size(), comm.get_rank()
    num_parts, part_rank = int(part.num_parts), int(part.rank)
    if world_size != num_parts:
        raise ValueError(
            f"the partition set has {num_parts} parts but the world size is "
            f"{world_size}: launch exactly one worker per part (torchrun "
            f"--nproc-per-node {num_parts})")
    if rank != part_rank:
        raise ValueError(f"rank {rank} was given partition {part_rank}; "
                         f"load partition {rank} on rank {rank}")
    mine = (str(part.fingerprint), num_parts, sizes)
    everyone = comm.agree('building a DistGraph', options, mine)
    for other_rank, other in enumerate(everyone):
        if other != mine:
            raise ValueError(
                f"rank {rank} and rank {other_rank} loaded different "
                f"partitionings (fingerprint/parts/sizes {mine} vs {other}); "
                f"every rank must load a part of the same partition "
                f"directory")


class DistGraph:
    r"""The partition of one worker, ready for distributed message passing.

    Collective: every rank builds its own ``DistGraph`` at the same time. It
    checks that all ranks loaded partitions of one and the same partitioning
    (same fingerprint, part count equal to the world size) before anything
    else, then exchanges the source-id lists once to build the plan.

    Args:
        part: The worker's :class:`pyg_sar.Partition`.
        mode: ``"sar"`` (no autograd graph kept in forward; backward
            re-fetches and recomputes block by block), ``"sa"`` (keeps the
            per-block graph; no re-fetch in backward) or ``"one_shot"``
            (all halo features in one exchange per layer, one local
            propagation).
        chunk_size: Split every block, the local one too, into chunks of at
            most this many edges that are aggregated in turn; bounds the
            per-edge memory (with one worker, this is the single-machine
            mode for graphs whose per-edge tensors do not fit).
        device: Where the graph's index tensors live; the features it
            aggregates must live there too (see :meth:`to`). Default: CPU.

    Attributes:
        num_nodes: Number of local nodes. ``num_edges``: local in-edges.
        node_offset: First global id of this worker.
        blocks: One :class:`EdgeBlock` per source partition with edges here,
            local first, then in ring order.
        send_ids: ``{peer: local ids of mine that peer needs}``.
        recv_ids: ``{peer: peer-local ids of its nodes that I need}``.
        in_degree: Global in-degree of every local node (all in-edges of a
            node live with its owner, so it is complete locally).
    """

    # What pyg_sar/utils/layer_guard.py looks for in a stock layer's
    # arguments.
    is_dist_graph = True
    # Methods the engine, the views and the loaders use: left out of the
    # user reference (docs/_ext/pyg_sar_api.py lists them apart).
    _doc_internal = ('register_kind', 'shallow_view', 'relation',
                     'local_block', 'remote_block', 'merged_block',
                     'source_values', 'post_row_exchange',
                     'global_in_degree_of_sources', 'kept_base_edges',
                     'expand_edge_values', 'num_ext_nodes', 'halo_plan')

    # Graph kinds built on this class by later modules of this package (the
    # transposed graph, the heterogeneous graph): they subclass or wrap
    # DistGraph, so instead of being imported here they register on import.
    _kinds: Dict[str, type] = {}

    @classmethod
    def register_kind(cls, name: str, builder) -> None:
        """Registers the builder of a graph kind built on
        :class:`DistGraph` (``'reverse'``, ``'hetero'``)."""
        cls._kinds[name] = builder

    def shallow_view(self) -> 'DistGraph':
        """A plain :class:`DistGraph` sharing this graph's tensors, with
        caches of its own: the start of every view that changes the edges
        (self loops, relation expansion)."""
        view = object.__new__(DistGraph)
        view.__dict__.update(self.__dict__)
        view._views, view._source_cache, view.derived = {}, {}, {}
        view.adj_t_values = None  # per edge of this graph, not of the view
        return view

    # Set by __init__; graphs built otherwise (views, relation graphs) have
    # no partitioned adj_t values and name no partition edge attributes.
    adj_t_values: Optional[Tensor] = None
    partition_edge_attrs: Tuple[str, ...] = ()

    def __init__(self, part, mode: str = 'sar',
                 chunk_size: Optional[int] = None,
                 device: Optional[torch.device] = None) -> None:
        check_options(mode, chunk_size)
        configure_allocator()  # RSS tracks live tensors (pyg_sar/utils/malloc.py)
        warn_if_spinning()  # torch loaded first: pyg_sar/utils/openmp.py
        self.mode = mode
        self.chunk_size = chunk_size
        self.rank = int(part.rank)
        self.world_size = int(part.num_parts)
        check_partition_set(part, (int(part.num_nodes), int(part.num_edges)),
                            dict(mode=mode, chunk_size=chunk_size))
        comm.ensure_channels()
        # Input-graph id of every local node (link prediction: global_ids).
        self.orig_ids = part.orig_ids
        # Edge attributes of the partition (named in the log line of a layer
        # that does not read them), and the values of a partitioned adj_t
        # that this graph stands in for (pyg_sar.nn.message_passing.fill_adj_t_values).
        self.partition_edge_attrs = tuple(getattr(part, 'edge_attr_names',
                                                  ()))
        source = (getattr(part, 'manifest', None) or {}).get('source', {})
        self.adj_t_values = None
        if source.get('graph_attrs', {}).get('adj_t_values') == 'edge_weight':
            self.adj_t_values = part.edge_attrs['edge_weight']

        self._setup(part.node_ptr, int(part.num_local_nodes),
                    int(part.num_nodes), part.csc_ptr, part.csc_src,
                    part.csc_eid)
        if device is not None:
            self.to(device)
        release_free_memory()  # the set-up's temporaries, back to the OS

    def __new__(cls, part=None, *args, **kwargs):
        # A heterogeneous partition gives a graph of relation graphs.
        if cls is DistGraph and getattr(part, 'is_hetero', False):
            return DistGraph._kinds['hetero'](part, *args, **kwargs)
        return super().__new__(cls)

    @classmethod
    def relation(cls, rank: int, world_size: int, mode: str,
                 chunk_size: Optional[int], node_ptr: Tensor,
                 src_node_ptr: Optional[Tensor], csc_ptr: Tensor,
                 csc_src: Tensor, edge_ids: Tensor,
                 orig_ids: Optional[Tensor] = None) -> 'DistGraph':
        """The graph of one relation of a heterogeneous partition: edges
        from the owners of the source type (ids partitioned by
        ``src_node_ptr``; ``None``: the destination type's ``node_ptr``)
        into the local nodes of the destination type. Collective (the ranks
        agree on the exchange plan); the caller has checked the partition
        set."""
        graph = super().__new__(cls)
        graph.mode, graph.chunk_size = mode, chunk_size
        graph.rank, graph.world_size = rank, world_size
        graph.orig_ids = orig_ids
        node_ptr = node_ptr.to(torch.long)
        rank_nodes = int(node_ptr[rank + 1] - node_ptr[rank])
        graph._setup(node_ptr, rank_nodes, int(node_ptr[-1]), csc_ptr,
                     csc_src, edge_ids, src_node_ptr=src_node_ptr)
        return graph

    def _setup(self, node_ptr: Tensor, num_nodes: int, num_global_nodes: int,
               csc_ptr: Tensor, csc_src: Tensor, edge_ids: Tensor,
               src_node_ptr: Optional[Tensor] = None) -> None:
        self.device = csc_ptr.device
        self.node_ptr = node_ptr.to(torch.long)
        self.node_offset = int(self.node_ptr[self.rank])
        self.num_nodes = num_nodes
        self.num_global_nodes = num_global_nodes
        # Bipartite relation graphs read sources of another node type, whose
        # ids are partitioned by their own pointer.
        self.is_bipartite = src_node_ptr is not None
        self.src_node_ptr = (src_node_ptr.to(torch.long) if self.is_bipartite
                             else self.node_ptr)
        self.src_offset = int(self.src_node_ptr[self.rank])
        self.num_src_nodes = int(self.src_node_ptr[self.rank + 1]) - \
            self.src_offset
        csc_ptr = csc_ptr.to(torch.long)
        self.num_edges = int(csc_ptr[-1])
        self.in_degree = (csc_ptr[1:] - csc_ptr[:-1])
        self._csc_degree, self._csc_edges = self.in_degree, self.num_edges
        dst = torch.repeat_interleave(torch.arange(self.num_nodes,
                                                   device=self.device),
                                      self.in_degree)
        src_global = csc_src.to(torch.long)
        self.edge_ids = edge_ids
        self._src_global = src_global
        self._build_plan(src_global, dst)
        self._views: Dict[str, 'DistGraph'] = {}
        self._source_cache: Dict[str, List[Tensor]] = {}
        # The running layer-wise computation, shared with every view.
        self._layer_wise: List = [None]
        # Per-graph constants that layers derive once (e.g. GCN's norm).
        self.derived: Dict = {}

    def to(self, device) -> 'DistGraph':
        """Moves every index tensor of the graph to ``device``, in place,
        and returns the graph (as ``Module.to`` and PyG's ``Data.to`` do).
        Cached per-graph values (normalizations, self-loop views, halo plans,
        chunk CSRs) are dropped and rebuilt on the new device when next
        used; the transposed graph of ``flow='target_to_source'`` moves
        along. Local: no communication."""
        device = explicit_device(device)
        if device == self.device:
            return self

        def move(t: Tensor) -> Tensor:
            return t.to(device)

        self.device = device
        self.node_ptr, self.in_degree = move(self.node_ptr), \
            move(self.in_degree)
        self.src_node_ptr = (move(self.src_node_ptr) if self.is_bipartite
                             else self.node_ptr)
        self._csc_degree = self.in_degree
        self.edge_ids = move(self.edge_ids)
        if self.adj_t_values is not None:
            self.adj_t_values = move(self.adj_t_values)
        self._src_global = move(self._src_global)
        if getattr(self, 'orig_ids', None) is not None:
            self.orig_ids = move(self.orig_ids)
        self.recv_ids = {q: move(t) for q, t in self.recv_ids.items()}
        self.send_ids = {q: move(t) for q, t in self.send_ids.items()}
        self._block_edges = {q: tuple(move(t) for t in edges)
                             for q, edges in self._block_edges.items()}
        reverse = self.derived.get('reverse')
        self._views, self._source_cache, self.derived = {}, {}, {}
        self._make_blocks()
        if reverse is not None and reverse is not self:
            self.derived['reverse'] = reverse._moved_with(self, device)
        return self

    # Set-up ##################################################################

    def _build_plan(self, src_global: Tensor, dst: Tensor) -> None:
        p, P = self.rank, self.world_size
        owner = torch.searchsorted(self.src_node_ptr, src_global,
                                   right=True) - 1
        # A stable sort by owner keeps every block sorted by destination.
        order = torch.argsort(owner, stable=True)
        counts = torch.bincount(owner, minlength=P).tolist()
        self.recv_ids: Dict[int, Tensor] = {}
        self._block_edges: Dict[int, Tuple[Tensor, Tensor, Tensor]] = {}
        start = 0
        for q in range(P):
            sel = order[start:start + counts[q]]
            start += counts[q]
            if q == p:
                self._block_edges[q] = (src_global[sel] - self.src_offset,
                                        dst[sel], sel)
                continue
            if counts[q] == 0:
                continue
            local_on_q = src_global[sel] - self.src_node_ptr[q]
            need, compact = torch.unique(local_on_q, return_inverse=True)
            self.recv_ids[q] = need
            self._block_edges[q] = (compact, dst[sel], sel)
        requests = [self.recv_ids.get(q, dst.new_empty(0))
                    for q in range(P)]
        replies = comm.all_to_all_v(requests)
        self.send_ids: Dict[int, Tensor] = {
            q: replies[q] for q in range(P)
            if q != p and replies[q].numel() > 0
        }
        self._make_blocks()

    def _make_blocks(self) -> None:
        p, P = self.rank, self.world_size
        self.blocks: List[EdgeBlock] = []
        # Every per-edge index as int32 where all ids fit (12 bytes per edge
        # instead of 24): sources index the local and halo rows (one_shot's
        # table), destinations the local rows, positions the edges.
        halo = sum(int(t.numel()) for t in self.recv_ids.values())
        dtype = index_dtype(max(self.num_src_nodes + halo, self.num_nodes,
                                self.num_edges))
        self._block_edges = {q: tuple(t.to(dtype) for t in edges)
                             for q, edges in self._block_edges.items()}
        for q in [p] + [(p - r) % P for r in range(1, P)]:
            if q not in self._block_edges:
                continue
            src, dst, pos = self._block_edges[q]
            num_src = self.num_src_nodes if q == p else int(
                self.recv_ids[q].numel())
            self.blocks.append(EdgeBlock(q, num_src, src, dst, pos,
                                         self.num_nodes, self.chunk_size))
        self.merged_cache: Optional[EdgeBlock] = None

    # Queries #################################################################

    @property
    def local_block(self) -> EdgeBlock:
        return self.blocks[0]

    def remote_block(self, peer: int) -> Optional[EdgeBlock]:
        return remote_block(self, peer)

    def merged_block(self) -> EdgeBlock:
        """All edges as one block (the ``one_shot`` layout; see
        :func:`pyg_sar.graph.transport.merged_block`)."""
        return merged_block(self)

    @property
    def num_halo_nodes(self) -> int:
        """Remote source nodes this worker reads (the halo)."""
        return sum(int(v.numel()) for v in self.recv_ids.values())

    def halo_bytes(self, num_features: int, itemsize: int = 4) -> int:
        """Lower bound of bytes received by one forward pass of a layer with
        ``num_features`` features per node."""
        return self.num_halo_nodes * num_features * itemsize

    def edge_dst(self) -> Tensor:
        """Local destination id of every edge, in base edge order."""
        # Recomputed from the CSC degrees rather than kept (8 bytes per edge
        # saved); views (self loops) share their base's CSC.
        return torch.repeat_interleave(
            torch.arange(self.num_nodes, device=self.device),
            self._csc_degree, output_size=self._csc_edges)

    def edge_index(self) -> Tensor:
        """This worker's in-edges as ``[2, E]`` global ``(src, dst)`` ids."""
        return torch.stack([self._src_global,
                            self.edge_dst() + self.node_offset])

    def source_values(self, node_values: Tensor,
                      cache_key: Optional[str] = None) -> List[Tensor]:
        """Rows of a per-node tensor at each block's sources, one tensor per
        block (no gradient). Used for source-side normalizations such as
        GCN's ``deg_j``; ``cache_key`` keeps the result for later calls."""
        if cache_key is not None and cache_key in self._source_cache:
            return self._source_cache[cache_key]
        node_values = node_values.detach()
        received = self.post_row_exchange([node_values], self.send_ids,
                                          self.recv_ids).wait()
        out = [node_values if b.peer == self.rank else received[b.peer][0]
               for b in self.blocks]
        if cache_key is not None:
            self._source_cache[cache_key] = out
        return out

    def post_row_exchange(self, tensors: List[Tensor], send_to, recv_from,
                          send_rows: Optional[Tuple[int, int]] = None,
                          recv_rows: Optional[Tuple[int, int]] = None,
                          heads_first: Sequence[bool] = ()
                          ) -> comm.PendingExchange:
        """Posts the plan's row exchange for per-node ``tensors`` (see
        :func:`pyg_sar.graph.transport.post_row_exchange`)."""
        return post_row_exchange(self, tensors, send_to, recv_from,
                                 send_rows, recv_rows, heads_first)

    def global_in_degree_of_sources(self) -> List[Tensor]:
        """In-degree of every block's source nodes (fetched once, cached)."""
        return self.source_values(self.in_degree, cache_key='in_degree')

    # Self-loop view ###########################################################

    def with_self_loops(self) -> 'DistGraph':
        """A view whose local block has every existing self loop removed and
        exactly one self loop per node appended, as PyG's ``GATConv`` and
        ``GCNConv`` see the graph. The edge order of the view is the base
        order without self loops, followed by one loop per node in node order
        (PyG's layout); :meth:`kept_base_edges` maps the view's base edges
        back and :attr:`loop_source_pos` gives, per node, the base position
        of its existing self loop or ``-1``.
        """
        if self.is_bipartite:
            raise ValueError(
                "self loops on a bipartite relation graph (source and "
                "destination node types differ) are not supported; set "
                "add_self_loops=False, as PyG requires for bipartite "
                "message passing")
        if 'loops' not in self._views:
            self._views['loops'] = make_loop_view(self)
        return self._views['loops']

    def kept_base_edges(self) -> Tensor:
        """On a self-loop view: the base position of each view edge but the
        added loops (:func:`pyg_sar.graph.self_loops.kept_base_edges`)."""
        return kept_base_edges(self)

    def expand_edge_values(self, values: Optional[Tensor],
                           fill_value: float = 1.0,
                           keep_existing_loops: bool = False) -> Optional[Tensor]:
        """Maps an edge tensor in base order onto this self-loop view.

        Added loops get ``fill_value``, or, with ``keep_existing_loops``,
        the value of the node's existing self loop where it had one (PyG's
        ``add_remaining_self_loops``).
        """
        if values is None or not hasattr(self, 'dropped_loops'):
            return values
        kept = values[self.kept_base_edges()]
        if isinstance(fill_value, Tensor):
            loops = fill_value.to(values.dtype).expand(
                self.num_nodes, *values.shape[1:]).clone()
        else:
            loops = values.new_full((self.num_nodes, *values.shape[1:]),
                                    fill_value)
        if keep_existing_loops:
            has = self.loop_source_pos >= 0
            loops[has] = values[self.loop_source_pos[has]]
        return torch.cat([kept, loops])

    # Whole-neighborhood layout ###############################################

    @property
    def num_ext_nodes(self) -> int:
        """Local nodes plus halo nodes (the rows of :meth:`fetch_halo`)."""
        return self.num_src_nodes + self.num_halo_nodes

    def halo_plan(self) -> RowPlan:
        """The plan of :meth:`fetch_halo` (built once)."""
        if 'halo_plan' not in self.derived:
            local = torch.arange(self.num_src_nodes, device=self.device)
            recv_pos, offset = {}, self.num_src_nodes
            for block in self.blocks[1:]:
                recv_pos[block.peer] = torch.arange(
                    offset, offset + block.num_src, device=self.device)
                offset += block.num_src
            self.derived['halo_plan'] = RowPlan(
                offset, local, local, dict(self.send_ids), recv_pos,
                concat=[block.peer for block in self.blocks[1:]])
        return self.derived['halo_plan']

    def fetch_halo(self, x: Tensor, dim: int = 0) -> Tensor:
        """``[local rows; halo rows]`` of a per-node tensor, the halo in
        block order (the ``one_shot`` layout): differentiable, gradients of
        halo rows return to their owners. Collective."""
        return fetch_rows(self.halo_plan(), x, dim)

    def push_halo(self, x_ext: Tensor) -> Tensor:
        """The transpose of :meth:`fetch_halo`: each halo row is added to
        its owner's row (e.g. partial out-degrees summed into global ones).
        Differentiable; collective."""
        return push_rows(self.halo_plan(), x_ext, self.num_src_nodes)

    def halo_edge_index(self) -> Tensor:
        """Every local in-edge as ``[2, E]`` ``(source, destination)`` in the
        graph's edge order: sources index the :meth:`fetch_halo` rows,
        destinations the local nodes (which come first there)."""
        if 'halo_edge_index' not in self.derived:
            merged = self.merged_block()
            out = torch.empty((2, self.num_edges), dtype=torch.long,
                              device=self.device)
            out[0, merged.edge_pos] = merged.src.long()
            out[1, merged.edge_pos] = merged.dst.long()
            self.derived['halo_edge_index'] = out
        return self.derived['halo_edge_index']

    def layer_wise(self, seeds: Tensor, hops: int):
        """Per-propagation destination sets for outputs needed only at
        ``seeds`` (a local mask or owned global ids), for a model of
        ``hops`` propagations; collective. Use the result as a context
        manager around the forward (:mod:`pyg_sar.graph.mfg`)."""
        return LayerWise(self, seeds, hops)

    # Any node, by id ##########################################################

    def fetch_nodes(self, x: Tensor, ids: Tensor) -> Tensor:
        """Rows of ``x`` (each worker's own nodes) at global node ids
        ``ids`` of the whole graph, fetched from their owners;
        differentiable, collective (:func:`pyg_sar.graph.link.fetch_nodes`)."""
        return fetch_nodes(self, x, ids)

    def global_ids(self, input_ids: Tensor) -> Tensor:
        """Global ids of nodes given by their input-graph ids; collective
        (:func:`pyg_sar.graph.link.global_ids`)."""
        return global_ids(self, input_ids)

    def reverse(self) -> 'DistGraph':
        """The transposed graph (``flow='target_to_source'``): every worker
        gets the out-edges of its nodes as in-edges. Built on first use
        (collective), then cached."""
        if self.is_bipartite:
            raise ValueError(
                "flow='target_to_source' over a bipartite relation graph is "
                "not supported; use the graph of the reverse relation")
        if 'reverse' not in self.derived:
            self.derived['reverse'] = DistGraph._kinds['reverse'](self)
        return self.derived['reverse']

    def __repr__(self) -> str:
        src = (f"src_nodes={self.num_src_nodes}, " if self.is_bipartite
               else '')
        return (f"DistGraph(rank={self.rank}/{self.world_size}, {src}"
                f"nodes={self.num_nodes}, edges={self.num_edges}, "
                f"halo={self.num_halo_nodes}, mode={self.mode!r}, "
                f"chunk_size={self.chunk_size})")


def _init_signature(cls: type) -> inspect.Signature:
    """``cls.__init__``'s signature without ``self``: what ``help(cls)``
    shows instead of the dispatching ``__new__``'s ``(*args, **kwargs)``."""
    signature = inspect.signature(cls.__init__)
    return signature.replace(
        parameters=list(signature.parameters.values())[1:])


DistGraph.__signature__ = _init_signature(DistGraph)
