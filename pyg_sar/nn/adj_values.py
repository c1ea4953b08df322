"""A :class:`~pyg_sar.DistGraph` standing in for PyG's weighted ``adj_t``.

PyG's ``gcn2_cora`` example keeps normalized edge weights as the values of
``adj_t`` (``T.GCNNorm()`` + ``T.ToSparseTensor()``) and calls
``conv(x, adj_t)``: a layer whose ``forward`` takes ``edge_weight`` then
multiplies every message by the value. A graph partitioned from such an
``adj_t`` (:mod:`pyg_sar.partition.input.pyg_inputs`) keeps the values as the
edge attribute ``edge_weight`` and marks them as ``adj_t``'s; its
``DistGraph`` carries them (``graph.adj_t_values``), and
:func:`fill_adj_t_values` hands them to every layer that takes
``edge_weight`` and is called without one, so the stock script's call
``conv(x, graph)`` gets the same weights. Layers without an ``edge_weight``
argument (``SAGEConv``, ``GINConv``, ...) drop the values, as PyG does for
them. An ``edge_weight`` passed explicitly always wins."""
import functools
import inspect
from typing import Any, Callable, Dict, Tuple


@functools.lru_cache(maxsize=None)
def _signature(func: Callable) -> inspect.Signature:
    return inspect.signature(func)


def fill_adj_t_values(forward: Callable, args: Tuple,
                      kwargs: Dict[str, Any]) -> Tuple[Tuple, Dict[str, Any]]:
    r""":obj:`(args, kwargs)` of a call of :obj:`forward`, with
    :obj:`edge_weight` set to the graph's :obj:`adj_t_values` where the
    call passes a :class:`~pyg_sar.DistGraph` that has them, :obj:`forward`
    takes :obj:`edge_weight` and the call gives none."""
    target = getattr(forward, '__func__', forward)
    signature = _signature(target)
    if 'edge_weight' not in signature.parameters:
        return args, kwargs
    graph = next((a for a in list(args) + list(kwargs.values())
                  if getattr(a, 'is_dist_graph', False) is True), None)
    values = getattr(graph, 'adj_t_values', None)
    if values is None:
        return args, kwargs
    owner = getattr(forward, '__self__', None)
    prefix = () if owner is None else (owner, )
    try:
        bound = signature.bind(*prefix, *args, **kwargs)
    except TypeError:
        return args, kwargs  # the call itself is wrong: let forward say so
    if bound.arguments.get('edge_weight') is not None:
        return args, kwargs
    bound.arguments['edge_weight'] = values
    return bound.args[len(prefix):], bound.kwargs
