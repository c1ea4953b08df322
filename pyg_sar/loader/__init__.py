"""Stage 5, loaders: distributed mini-batch loading, neighbor sampling on
collectives.

:class:`DistNeighborLoader` draws PyG ``NeighborLoader``-style batches from a
partitioned graph with ``all_to_all`` exchanges per hop (no RPC, no pyg-lib),
heterogeneous ones (:class:`DistHeteroNeighborLoader`, built by
:class:`DistNeighborLoader` for a heterogeneous part) included,
and :class:`DistLinkNeighborLoader` PyG ``LinkNeighborLoader``-style ones
(:class:`DistHeteroLinkNeighborLoader` for a heterogeneous part), and
:class:`DistHGTLoader` PyG ``HGTLoader``-style ones (HGSampling);
:func:`sample_neighbors` is its vectorized single-process sampling kernel.
Loaders read a part (or PyG's local stores) and talk through the
communication stage; they use no layer and know nothing of training.
The five loaders take PyG's loaders' arguments, in PyG's order, and yield
batches in the dataset's ids. They sit here with their arguments
(:mod:`~pyg_sar.loader.options`), their inputs
(:mod:`~pyg_sar.loader.seeds`: whole-graph masks and dataset ids;
:mod:`~pyg_sar.loader.balance`: every rank the same number of batches)
and their epochs (:mod:`~pyg_sar.loader.epoch`: in the training thread or
a background one), built from three folders: :mod:`~pyg_sar.loader.shards` (what a loader
reads of its part), :mod:`~pyg_sar.loader.sampling` (how neighborhoods are
drawn) and :mod:`~pyg_sar.loader.batches` (what a batch is made of).
"""
from pyg_sar.loader.hetero_link_loader import DistHeteroLinkNeighborLoader
from pyg_sar.loader.hetero_neighbor_loader import DistHeteroNeighborLoader
from pyg_sar.loader.hgt_loader import DistHGTLoader
from pyg_sar.loader.link_loader import DistLinkNeighborLoader
from pyg_sar.loader.neighbor_loader import DistNeighborLoader
from pyg_sar.loader.sampling.kernel import sample_neighbors

__all__ = ['DistNeighborLoader', 'DistHeteroNeighborLoader',
           'DistLinkNeighborLoader', 'DistHeteroLinkNeighborLoader',
           'DistHGTLoader', 'sample_neighbors']
