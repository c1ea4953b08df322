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

:func:`gather_nodes` puts per-rank rows (the output, labels, masks) back
together in the dataset's node order, for an evaluation that needs the
whole graph's rows in one place (e.g. a classifier fitted on embeddings).
"""
from __future__ import annotations

from typing import Any, Tuple, Union

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.graph import DistGraph
from pyg_sar.partition import HeteroPartition, Partition


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
        graph (DistGraph or HeteroDistGraph): The distributed graph, or
            this rank's loaded part (:class:`~pyg_sar.Partition` or
            :class:`~pyg_sar.HeteroPartition`): its
            :class:`~pyg_sar.DistGraph` is then built on the first call
            (a collective) and kept on the part for the next ones.
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
    graph = graph_of(graph)
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


def graph_of(graph: Any) -> Any:
    """The :class:`~pyg_sar.DistGraph` to run a model on: ``graph``
    itself, or for a loaded part the one built on it (on first use, every
    rank at once; kept on the part)."""
    if not isinstance(graph, (Partition, HeteroPartition)):
        return graph
    built = graph.__dict__.get('_inference_graph')
    if built is None:
        built = graph.__dict__['_inference_graph'] = DistGraph(graph)
    return built


def gather_nodes(data: Any, *tensors: Tensor):
    r"""The whole graph's rows of per-node tensors, in dataset-id order, on
    every rank: ``tensors`` hold one row per node of this rank
    (:obj:`data.orig_ids` order: the rows of :func:`inference`, the
    part's ``y`` and masks); row ``i`` of each result is dataset node
    ``i``'s, as one process holds it.

    .. code-block:: python

       out = pyg_sar.train.inference(model, part.x, graph)
       out, y, train_mask = pyg_sar.train.gather_nodes(
           part, out, part.y, part.train_mask)
       clf.fit(out[train_mask], y[train_mask])    # the whole graph's rows

    Every rank ends up with the whole graph's rows (the memory of one
    process), so gather what the evaluation needs only. A collective
    (:func:`~pyg_sar.comm.all_gather_by_id`, one per tensor): every rank
    calls it with the same number of tensors, dtypes and row shapes.

    Args:
        data (Partition or DistGraph): This rank's part (or its graph, or
            one node type's store of a heterogeneous part): what holds
            :obj:`orig_ids`, the dataset ids of this rank's nodes.
        *tensors (Tensor): One row per node of this rank each.

    Returns:
        The gathered tensor, or a tuple of them for several.
    """
    ids = getattr(data, 'orig_ids', None)
    if not isinstance(ids, Tensor):
        raise ValueError(f"gather_nodes: {type(data).__name__} holds no "
                         f"dataset ids (orig_ids); pass a loaded partition "
                         f"(one node type's store of a heterogeneous one) "
                         f"or its DistGraph")
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor) or t.dim() == 0 or \
                t.size(0) != ids.numel():
            raise ValueError(
                f"gather_nodes: tensor {i} has shape "
                f"{tuple(getattr(t, 'shape', ()))}; expected one row per "
                f"node of this rank ({ids.numel()})")
    out = tuple(comm.all_gather_by_id(t, ids) for t in tensors)
    return out[0] if len(out) == 1 else out
