"""Stage 3, the distributed graph: what one worker holds of the partitioned
graph once every rank has loaded its part. :class:`DistGraph` cuts the
worker's in-edges into one :class:`~pyg_sar.graph.blocks.EdgeBlock` per
source partition and agrees with every peer, once, on the rows that travel
between them (:mod:`~pyg_sar.graph.exchange`). Its views are built from it on
demand and cached: the self-loop view (``GCNConv``, ``GATConv``), the
transposed graph (``flow='target_to_source'``), the relation-expanded view
(``RGCNConv``), per-layer destination sets (:mod:`~pyg_sar.graph.mfg`) and
fetches of any node by id (:mod:`~pyg_sar.graph.link`).
:class:`HeteroDistGraph` is one such graph per relation of a heterogeneous
partition. This stage uses the communication stage; it knows nothing of
layers, loaders or training.
"""
from pyg_sar.graph.dist_graph import DistGraph
from pyg_sar.graph.hetero_graph import HeteroDistGraph
from pyg_sar.graph.reverse import reverse_graph

# The graph kinds built on DistGraph (they subclass or wrap it, so it cannot
# import them): registered here, where the package is imported.
DistGraph.register_kind('reverse', reverse_graph)
DistGraph.register_kind('hetero', HeteroDistGraph)

__all__ = ['DistGraph', 'HeteroDistGraph']
