"""Layer-wise inference over a :class:`~pyg_sar.DistGraph`: what PyG's
``model.inference(x_all, subgraph_loader)`` computes, without a loader.

PyG's layer-wise inference runs each layer over all nodes before the next,
batch by batch over a loader with every neighbor (``num_neighbors=[-1]``),
so that no node's representation is computed more than once per layer.
Over a ``DistGraph`` the model's own forward already works that way: each
layer computes every local node once and fetches each remote row it reads
once per layer (per edge block of the SAR engine), so
:func:`inference` is the model's forward in eval mode without autograd. No
loader batches re-fetch the input features, and nothing is kept for a
backward (the engine keeps its fetched rows and per-block graphs only for
inputs that need a gradient).
"""
from __future__ import annotations

from typing import Any, Tuple, Union

import torch


def inference(model: torch.nn.Module, x: Any, graph: Any, *args: Any,
              return_ids: bool = False, **kwargs: Any
              ) -> Union[Any, Tuple[Any, Any]]:
    r"""The output of ``model`` at this rank's nodes, every layer computed
    once over all nodes of the graph (PyG's layer-wise
    ``model.inference(x_all, subgraph_loader)``, over the
    :class:`~pyg_sar.DistGraph` instead of a loader).

    Runs ``model(x, graph, *args, **kwargs)`` in eval mode under
    :func:`torch.no_grad` and puts the model back in the mode it was in. A
    collective: every rank calls it with its own part.

    .. code-block:: python

       model = pyg_sar.nn.to_distributed(model)   # trained on sampled batches
       out, ids = pyg_sar.train.inference(model, part.x, graph,
                                          return_ids=True)
       pred = out.argmax(-1)                      # this rank's nodes

    Args:
        model (torch.nn.Module): A model converted by
            :func:`pyg_sar.nn.to_distributed` (the same object that trains
            on sampled batches).
        x (Tensor or Dict[str, Tensor]): The features of this rank's
            nodes (``part.x``; ``x_dict`` for a heterogeneous graph).
        graph (DistGraph or HeteroDistGraph): The distributed graph.
        *args (optional): Further positional arguments of the model's
            ``forward``.
        **kwargs (optional): Its keyword arguments (e.g.
            ``edge_weight=part.edge_weight``).
        return_ids (bool, optional): Also return the dataset id of every
            output row (``graph.orig_ids``; ``orig_ids_dict`` for a
            heterogeneous graph), e.g. to gather predictions by id.
            (default: :obj:`False`)

    Returns:
        The model's output at this rank's nodes, and with ``return_ids``
        the pair ``(output, ids)``.
    """
    ids = None
    if return_ids:
        ids = getattr(graph, 'orig_ids', None)
        if ids is None:
            ids = getattr(graph, 'orig_ids_dict', None)
        if ids is None:
            raise ValueError(f"inference(return_ids=True): the "
                             f"{type(graph).__name__} holds no dataset ids "
                             f"(orig_ids); build it from a loaded partition")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(x, graph, *args, **kwargs)
    finally:
        model.train(was_training)
    return (out, ids) if return_ids else out
