"""The SAR engine: one ``torch.autograd.Function`` for every mode and layer.

A layer's propagation visits the edge blocks of its :class:`DistGraph` one
source partition at a time (ring order: in round ``r`` a worker sends its rows
to ``rank + r`` and receives from ``rank - r``), aggregates each block into a
running result, and frees the fetched rows. Three kinds of aggregation:

* ``sum`` / ``mean`` / ``max`` / ``min`` of PyG messages, exact across blocks
  (max/min keep per-destination tie counts so the gradient is split exactly as
  ``torch.scatter_reduce`` splits it);
* a softmax over all in-edges of a destination, computed online (running max
  and sum per destination and head, rescaled as blocks arrive);
* a linear fast path for messages ``w_e * x_j``: sparse matrix products both
  ways, so neither forward nor backward materializes ``[E, F]`` messages and
  the backward sends ``A^T g`` without re-fetching anything.

Backward, per mode: ``"sar"`` re-fetches each block and recomputes it,
``"sa"`` reuses the per-block autograd graph kept in forward, and
``"one_shot"`` recomputes from the halo table of its single exchange.
Gradients of remote source rows go back to their owners, which sum what all
peers send.

Layout: the plan is the factory, the Function drives, one aggregator per
kind, and the graph's transport moves rows.

* :mod:`.spec`: what one propagation is (the plan's fields);
* :mod:`.plan`: argument classification, the kind of aggregation and its
  aggregator (:func:`propagate`);
* :mod:`.function`: :class:`SARFunction`, the inputs and their gradients,
  and the :class:`~.function.Aggregator` base that runs both passes over
  :class:`pyg_sar.graph.transport.Transport` and cuts blocks into chunks;
* :mod:`.sparse`: linear messages as sparse products;
* :mod:`.messages`: messages evaluated per chunk, and their backward;
* :mod:`.reduce`: sum / mean / max / min of messages and their gradient;
* :mod:`.attention`: the online softmax, dropout and attention gradients.
* :mod:`.fused`: the same online softmax with fused kernels per chunk for
  GAT- and GATv2-style scores, and the choice between the two paths;
* :mod:`.kernels`: those kernels (C++ on CPU, Triton on CUDA).
"""
from pyg_sar.nn.engine.function import SARFunction
from pyg_sar.nn.engine.plan import SUPPORTED_AGGRS, propagate

__all__ = ['SARFunction', 'SUPPORTED_AGGRS', 'propagate']
