"""A refusal that names the fix when a :class:`~pyg_sar.DistGraph` reaches a
stock PyG layer.

A stock ``MessagePassing`` layer called with a ``DistGraph`` where it
expects ``edge_index`` would fail deep inside PyG ("``propagate`` only
supports integer tensors..."). :func:`guard_layers` gives each stock
message-passing layer of a model a forward pre-hook of its own that raises
a ``TypeError`` saying to convert the model with
:func:`pyg_sar.nn.to_distributed`, when the layer is called with a
distributed graph. :func:`pyg_sar.sync_params` guards the model it is
given, which is where a training script first hands its model to pyg_sar.
No hook is global: a model never given to pyg_sar runs untouched, and the
layers of a converted model (``accepts_dist_graph``), or of a model trained
on sampled batches (plain ``edge_index``), never raise.
"""
import weakref
from typing import Any, Dict, Tuple

import torch

_GUARDED: 'weakref.WeakSet[torch.nn.Module]' = weakref.WeakSet()


def refuse_unconverted(module: Any, args: Tuple,
                       kwargs: Dict[str, Any]) -> None:
    """The guard's forward pre-hook (its identity lets
    :func:`pyg_sar.nn.to_distributed` tell it from a user's hook)."""
    # A guarded layer converted in place later (to_distributed adapts
    # stock layers by class) keeps its hook and now accepts the graph.
    if getattr(module, 'accepts_dist_graph', False):
        return
    for arg in list(args) + list(kwargs.values()):
        if getattr(arg, 'is_dist_graph', False) is True:
            raise TypeError(
                f"{type(module).__name__} is a stock PyG layer and got a "
                f"{type(arg).__name__} as its graph; convert the model with "
                f"pyg_sar.nn.to_distributed(model) first (or subclass "
                f"pyg_sar.nn.DistMessagePassing for a layer of your own)")


def guard_layers(model: torch.nn.Module) -> int:
    """Gives every stock message-passing layer of ``model`` (one that does
    not declare ``accepts_dist_graph``) the pre-hook that refuses a
    distributed graph, once per layer; returns how many layers are
    guarded now."""
    # (Imported here: the communication stage loads without PyG.)
    from torch_geometric.nn import MessagePassing
    for module in model.modules():
        if isinstance(module, MessagePassing) and module not in _GUARDED \
                and not getattr(module, 'accepts_dist_graph', False):
            module.register_forward_pre_hook(refuse_unconverted,
                                             with_kwargs=True)
            _GUARDED.add(module)
    return sum(1 for m in model.modules() if m in _GUARDED)
