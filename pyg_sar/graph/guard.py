"""A refusal that names the fix when a :class:`~pyg_sar.DistGraph` reaches a
layer that cannot read it.

A stock PyG ``MessagePassing`` layer called with a ``DistGraph`` where it
expects ``edge_index`` would fail deep inside PyG ("``propagate`` only
supports integer tensors..."). Once a ``DistGraph`` has been built (not on
import: importing the package installs no hook), a global forward pre-hook
checks the positional arguments of every ``MessagePassing`` call: a
layer that does not declare ``accepts_dist_graph`` (``pyg_sar.nn``'s layers
and adapted stock layers do) raises a ``TypeError`` that says to convert the
model with :func:`pyg_sar.nn.to_distributed`. The check is one attribute
lookup per module call, and a scan of the arguments of message-passing
layers only.
"""
from typing import Any, Tuple

from torch.nn.modules.module import register_module_forward_pre_hook
from torch_geometric.nn import MessagePassing

_INSTALLED = []


def _refuse_unconverted(module: Any, args: Tuple) -> None:
    if not isinstance(module, MessagePassing) or \
            getattr(module, 'accepts_dist_graph', False):
        return
    for arg in args:
        if getattr(arg, 'is_dist_graph', False) is True:
            name = type(module).__name__
            raise TypeError(
                f"{name} is a stock PyG layer and got a "
                f"{type(arg).__name__} as its graph; convert the model with "
                f"pyg_sar.nn.to_distributed(model) first (or subclass "
                f"pyg_sar.nn.DistMessagePassing for a layer of your own)")


def install_guard() -> None:
    """Installs the pre-hook once per process (idempotent)."""
    if not _INSTALLED:
        _INSTALLED.append(
            register_module_forward_pre_hook(_refuse_unconverted))
