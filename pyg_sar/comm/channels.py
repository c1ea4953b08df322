"""Channels: process groups that keep concurrent exchanges apart.

NCCL ignores message tags and matches the point-to-point operations of a
communicator in the order each rank issues them. Two exchanges that may be in
flight at the same time between the same two ranks (the SAR engine's re-fetch
of source rows and its send-back of their gradients, in backward) therefore
run on different communicators, one per channel, never on different tags.
Every other exchange of the package posts and completes on the default group
before the next one starts, so it needs no channel of its own.

A channel is a ``torch.distributed`` group over all ranks (same rank
numbering as the world). Creating groups is collective, so they are made in
one collective place, :func:`ensure_channels` (called while a
:class:`~pyg_sar.DistGraph` is built), and first used there by all ranks
together, as NCCL asks of a group's first operation.
"""
from __future__ import annotations

import time
from typing import Dict, Optional

import torch
import torch.distributed as dist

from pyg_sar.comm.errors import _peer_error, _wait
from pyg_sar.comm.process_group import _active, _comm_device
from pyg_sar.comm.state import _CONFIG

#: Channel names other than ``'default'`` (the world group).
CHANNELS = ('gradients', )

# The world group the channels were made for, and the channels.
_GROUPS: Dict[str, object] = {}
_WORLD: Dict[str, object] = {'group': None}


def ensure_channels() -> None:
    """Creates every channel's group once per process group (collective:
    every rank calls it at the same point)."""
    if not _active():
        return
    world = dist.group.WORLD
    if _WORLD['group'] is world and len(_GROUPS) == len(CHANNELS):
        return
    _GROUPS.clear()
    for name in CHANNELS:
        start = time.perf_counter()
        try:
            group = dist.new_group(timeout=_CONFIG.timeout,
                                   group_desc=f'pyg_sar:{name}')
        except Exception as e:
            raise _peer_error(f'new_group({name})', None, e,
                              time.perf_counter() - start) from e
        # The group's first operation involves every rank (NCCL requires it
        # before point-to-point calls between subsets of the group).
        probe = _comm_device(torch.zeros(1))
        _wait(dist.all_reduce(probe, group=group, async_op=True),
              f'all_reduce(first use of channel {name!r})')
        _GROUPS[name] = group
    _WORLD['group'] = world


def channel_group(channel: str) -> Optional[object]:
    """The process group of ``channel`` (``None`` is the world group)."""
    if channel == 'default' or not _active():
        return None
    if channel not in CHANNELS:
        raise ValueError(f"unknown channel {channel!r}; expected 'default' or "
                         f"one of {CHANNELS}")
    if _WORLD['group'] is not dist.group.WORLD or channel not in _GROUPS:
        raise RuntimeError(
            f"channel {channel!r} is not set up for this process group; it "
            f"is created collectively when a DistGraph is built "
            f"(pyg_sar.comm.ensure_channels())")
    return _GROUPS[channel]


def forget_channels() -> None:
    """Drops the channel groups (the process group is being destroyed)."""
    _GROUPS.clear()
    _WORLD['group'] = None
