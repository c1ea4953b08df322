"""Stage 5, loaders: distributed mini-batch loading, neighbor sampling on
collectives.

:class:`DistNeighborLoader` draws PyG ``NeighborLoader``-style batches from a
partitioned graph with ``all_to_all`` exchanges per hop (no RPC, no pyg-lib),
heterogeneous ones (:class:`DistHeteroNeighborLoader`, built by
:class:`DistNeighborLoader` for a heterogeneous part) included,
and :class:`DistLinkNeighborLoader` PyG ``LinkNeighborLoader``-style ones
(:class:`DistHeteroLinkNeighborLoader` for a heterogeneous part);
:func:`sample_neighbors` is its vectorized single-process sampling kernel.
Loaders read a part (or PyG's local stores) and talk through the
communication stage; they use no layer and know nothing of training.
"""
from pyg_sar.loader.hetero import DistHeteroNeighborLoader
from pyg_sar.loader.hetero_link import DistHeteroLinkNeighborLoader
from pyg_sar.loader.link_loader import DistLinkNeighborLoader
from pyg_sar.loader.neighbor_loader import DistNeighborLoader
from pyg_sar.loader.sampler import sample_neighbors

__all__ = ['DistNeighborLoader', 'DistHeteroNeighborLoader',
           'DistLinkNeighborLoader', 'DistHeteroLinkNeighborLoader',
           'sample_neighbors']
