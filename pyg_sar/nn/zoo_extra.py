"""Conversion of a stock layer whose distributed version is a subclass with
the same state (``EGConv``, ``PDNConv``, ``DNAConv``, ``SignedConv``,
``WLConv``, ``SuperGATConv``, ``AntiSymmetricConv``, in
:mod:`pyg_sar.nn.conv`): the module's children are converted first (e.g.
``AntiSymmetricConv``'s ``phi``), then its class is switched in place, so
parameters, buffers, ``requires_grad`` flags, training mode and
``state_dict`` keys are the module's own. Each of those files calls
:func:`register_switch` on import.
"""
from typing import Callable

import torch

from pyg_sar.nn.convert import convert_children, register_composite

# Stock class -> its distributed class (a subclass with the same state).
DISTRIBUTED = {}


def _switch(cls: type) -> Callable:
    def convert(module: torch.nn.Module, path: str, strict: bool):
        convert_children(module, f'{path}.' if path else '', strict)
        module.__class__ = cls
        return module
    return convert


def register_switch(stock: type, dist: type) -> None:
    """Makes :func:`~pyg_sar.nn.to_distributed` convert every ``stock``
    module to ``dist`` (a subclass of ``stock`` adding no state)."""
    DISTRIBUTED[stock] = dist
    register_composite(stock, _switch(dist))
