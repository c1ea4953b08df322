"""Channels: process groups that keep concurrent exchanges apart.

NCCL ignores message tags and matches the point-to-point operations of a
communicator in the order each rank issues them. Two exchanges that may be in
flight at the same time between the same two ranks (the SAR engine's re-fetch
of source rows and its send-back of their gradients, in backward) therefore
run on different communicators, one per channel, never on different tags.

The loaders' traffic has a channel of its own too, ``'loader'``: every
collective round of an epoch runs inside :func:`on_channel`, so a rank that
left its loop early and calls a collective (``global_count``) can never be
paired with a peer's sampling traffic; it waits for the peer's own call on
the default group instead. Every other exchange of the package posts and
completes on the default group before the next one starts.

A channel is a ``torch.distributed`` group over all ranks (same rank
numbering as the world). Creating groups is collective, so they are made in
collective places, :func:`ensure_channels` (called while a
:class:`~pyg_sar.DistGraph` or a loader is built), and first used there by
all ranks together, as NCCL asks of a group's first operation.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Dict, Iterator, Optional, Sequence

import torch
import torch.distributed as dist

from pyg_sar.comm.errors import peer_error, timed_wait
from pyg_sar.comm.process_group import (before_teardown, comm_device,
                                        is_active)
from pyg_sar.comm.state import config

#: Channel names other than ``'default'`` (the world group): the SAR
#: engine's gradient send-back, and the loaders' sampling rounds.
CHANNELS = ('gradients', 'loader')

# The world group the channels were made for, and the channels.
_GROUPS: Dict[str, object] = {}
_WORLD: Dict[str, object] = {'group': None}


class _Scope(threading.local):
    channel = 'default'


# The channel of the innermost on_channel() of this thread.
_SCOPE = _Scope()


def ensure_channels(names: Sequence[str] = ('gradients', )) -> None:
    """Creates the groups of the channels ``names`` that do not exist yet,
    once per process group (collective: every rank calls it at the same
    point with the same names)."""
    if not is_active():
        return
    world = dist.group.WORLD
    if _WORLD['group'] is not world:
        _GROUPS.clear()
        _WORLD['group'] = world
    for name in names:
        _check_name(name)
        if name in _GROUPS:
            continue
        start = time.perf_counter()
        try:
            group = dist.new_group(timeout=config().timeout,
                                   group_desc=f'pyg_sar:{name}')
        except Exception as e:
            raise peer_error(f'new_group({name})', None, e,
                             time.perf_counter() - start) from e
        # The group's first operation involves every rank (NCCL requires it
        # before point-to-point calls between subsets of the group).
        probe = comm_device(torch.zeros(1))
        timed_wait(dist.all_reduce(probe, group=group, async_op=True),
                   f'all_reduce(first use of channel {name!r})')
        _GROUPS[name] = group


def _check_name(channel: str) -> None:
    if channel not in CHANNELS:
        raise ValueError(f"unknown channel {channel!r}; expected 'default' or "
                         f"one of {CHANNELS}")


@contextlib.contextmanager
def on_channel(channel: str) -> Iterator[None]:
    """Runs the operations inside that name no channel of their own (the
    collectives, and exchanges on ``'default'``) on ``channel`` (this thread
    only). Do not keep it open across a ``yield`` to the caller: what the
    caller runs meanwhile would land on the channel too."""
    if channel != 'default':
        _check_name(channel)
    previous, _SCOPE.channel = _SCOPE.channel, channel
    try:
        yield
    finally:
        _SCOPE.channel = previous


def channel_group(channel: str = 'default') -> Optional[object]:
    """The process group of ``channel`` (``None`` is the world group);
    ``'default'`` is the channel of the enclosing :func:`on_channel`, else
    the world group."""
    if channel == 'default':
        channel = _SCOPE.channel
    if channel == 'default' or not is_active():
        return None
    _check_name(channel)
    if _WORLD['group'] is not dist.group.WORLD or channel not in _GROUPS:
        raise RuntimeError(
            f"channel {channel!r} is not set up for this process group; it "
            f"is created collectively when a DistGraph or a loader is built "
            f"(pyg_sar.comm.ensure_channels())")
    return _GROUPS[channel]


def forget_channels() -> None:
    """Drops the channel groups (the process group is being destroyed)."""
    _GROUPS.clear()
    _WORLD['group'] = None


@before_teardown
def _destroy_channels() -> None:
    groups = list(_GROUPS.values()) if _WORLD['group'] is not None and \
        dist.is_initialized() and _WORLD['group'] is dist.group.WORLD else []
    forget_channels()
    for group in groups:
        dist.destroy_process_group(group)
