"""Stock PyG convolutions over a :class:`~pyg_sar.DistGraph`, unchanged.

Most PyG convolutions compute per-node transforms, then one or more
``propagate``/``edge_updater`` calls whose results at a node depend only on
that node's in-edges. Such a layer is exact over a ``DistGraph`` when its own
``forward`` runs on the local rows with the local in-edges expressed in the
``local + halo`` numbering of :meth:`DistGraph.fetch_halo`, and every
``propagate`` fetches the halo rows of what it reads as ``*_j``
(:mod:`pyg_sar.nn.neighborhood`). Self loops that ``forward`` adds are local
(local ids come first), so those stay exact too.

:func:`adapt` does this to a module in place, by switching its class to a
subclass of its own class with :class:`DistAdapter` in front: parameters,
buffers, dtype, device, ``requires_grad`` and training mode are the module's
own, and called with a plain ``edge_index`` it behaves exactly as before.
"""
from __future__ import annotations

import inspect
import sys
from typing import Any, Dict, Optional

from torch import Tensor

from pyg_sar.graph import DistGraph
from pyg_sar.nn.message_passing import fill_adj_t_values
from pyg_sar.nn.gcn_norm import NormalizedEdges, gcn_norm, normalization
from pyg_sar.nn.neighborhood import (log_once, pull_edge_tensors,
                                     whole_propagate)

_ADAPTED: Dict[type, type] = {}


class DistAdapter:
    """Mixin put in front of a stock :class:`MessagePassing` class.

    ``forward(x, graph, ...)`` with a :class:`DistGraph` runs the stock
    ``forward`` over the graph's local in-edges (out-edges for
    ``flow='target_to_source'``, whose per-edge arguments are moved into that
    order); ``propagate`` and ``edge_updater`` then run over whole
    neighborhoods.
    """

    # Called with a DistGraph by design (pyg_sar/utils/layer_guard.py).
    accepts_dist_graph = True
    _sar_graph: Optional[DistGraph] = None

    def _set_jittable_templates(self, raise_on_error: bool = False) -> None:
        # Unpickling or deep-copying would render PyG's propagate template
        # onto this class, over the distributed one; the stock class keeps
        # its own.
        pass

    def forward(self, *args: Any, **kwargs: Any):
        stock = super().forward
        args, kwargs = fill_adj_t_values(stock, args, kwargs)
        bound = inspect.signature(stock).bind(*args, **kwargs)
        graph = bound.arguments.get('edge_index')
        if not isinstance(graph, DistGraph):
            return stock(*args, **kwargs)
        if graph.is_bipartite:
            raise ValueError(
                f"{type(self).__name__} runs over whole neighborhoods, which "
                f"is not supported on a bipartite relation graph (source and "
                f"destination types differ); use a layer on the SAR engine "
                f"(SAGEConv, GraphConv, GINConv, GATConv, GATv2Conv) for "
                f"this relation")
        values = bound.arguments
        if self.flow == 'source_to_target':
            run_graph, ei = graph, graph.halo_edge_index()
        else:
            run_graph = graph.reverse()
            ei = run_graph.halo_edge_index().flip(0)
            values.update(pull_edge_tensors(self, graph, run_graph, values))
        ei = ei.to(_device(values))
        norm = normalization(self)
        if norm is not None:
            ei, values['edge_weight'] = gcn_norm(
                run_graph, ei, values.get('edge_weight'), *norm,
                flow=self.flow, dtype=_dtype(values))
            ei = NormalizedEdges(ei)
        values['edge_index'] = ei
        log_once(self, _reason(self, stock, values, graph))
        previous, self._sar_graph = self._sar_graph, run_graph
        try:
            return stock(*bound.args, **bound.kwargs)
        finally:
            self._sar_graph = previous

    def propagate(self, edge_index: Tensor, size=None, **kwargs: Any):
        if self._sar_graph is None:
            return super().propagate(edge_index, size=size, **kwargs)
        if isinstance(edge_index, NormalizedEdges):
            edge_index = edge_index.edge_index
        return whole_propagate(self, self._sar_graph, edge_index, kwargs)

    def edge_updater(self, edge_index: Tensor, size=None, **kwargs: Any):
        if self._sar_graph is None:
            return super().edge_updater(edge_index, size=size, **kwargs)
        if self.flow != 'source_to_target':
            raise ValueError(f"{type(self).__name__}: edge_updater with "
                             f"flow='target_to_source' is not supported "
                             f"over a DistGraph")
        return whole_propagate(self, self._sar_graph, edge_index, kwargs,
                               'edge_updater')


def _reason(module, stock, values: Dict[str, Any],
            graph: DistGraph) -> str:
    """What the exactness log line says, and the edge weights the layer
    does not read: a partition that holds ``edge_weight`` given to a layer
    that takes none, or takes one but is given none."""
    takes = 'edge_weight' in inspect.signature(stock).parameters
    if 'edge_weight' in graph.partition_edge_attrs and (
            not takes or values.get('edge_weight') is None):
        return ("a stock PyG layer; the partition holds edge_weight, which "
                "this layer does not read" + (
                    "" if takes else " (it takes no edge weights)") +
                ": pass edge_weight=part.edge_weight where the stock "
                "script passed weights")
    return 'a stock PyG layer'


def _first_tensor(values: Dict[str, Any]) -> Optional[Tensor]:
    for v in values.values():
        for t in (v if isinstance(v, (tuple, list)) else [v]):
            if isinstance(t, Tensor) and t.is_floating_point():
                return t
    return None


def _device(values: Dict[str, Any]):
    t = _first_tensor(values)
    return t.device if t is not None else 'cpu'


def _dtype(values: Dict[str, Any]):
    t = _first_tensor(values)
    return t.dtype if t is not None else None


def register_adapted(cls: type, adapted: type) -> None:
    """Makes ``adapted`` (a :class:`DistAdapter` subclass written by hand,
    such as :class:`pyg_sar.nn.conv.cheb_conv.ChebConv`) the adapted class of
    the stock ``cls``."""
    _ADAPTED[cls] = adapted


def adapted_class(cls: type) -> type:
    """``cls`` with :class:`DistAdapter` in front (one class per ``cls``,
    importable as ``pyg_sar.nn.adapter.Dist<Name>`` so pickling works)."""
    if cls not in _ADAPTED:
        name = f'Dist{cls.__name__}'
        new = type(name, (DistAdapter, cls), {'__module__': __name__,
                                               '__qualname__': name})
        setattr(sys.modules[__name__], name, new)
        _ADAPTED[cls] = new
    return _ADAPTED[cls]


def adapt(module) -> Any:
    """Switches ``module`` in place to its :func:`adapted_class`."""
    if not isinstance(module, DistAdapter):
        module.__class__ = adapted_class(type(module))
    return module
