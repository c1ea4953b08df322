"""Point-to-point exchanges: grouped sends and receives whose sizes both
sides know (:func:`post_exchange`).

Every exchange is one ``dist.batch_isend_irecv`` call: all sends and receives
of a rank, to and from every peer, are posted together, which NCCL needs
when two ranks send to each other (ungrouped, both would block in their
send). Messages are told apart by their order, never by tags: both sides of
a pair post their messages in the same order, and exchanges that may overlap
in time run on different channels (:mod:`pyg_sar.comm.channels`). No
exchange is posted before the ranks agree on the settings that shape it
(:mod:`pyg_sar.comm.agreement`, :mod:`pyg_sar.comm.sequence`).
"""
from __future__ import annotations

import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from pyg_sar.comm import buffers
from pyg_sar.comm.channels import channel_group
from pyg_sar.comm.errors import peer_error, timed_wait
from pyg_sar.comm.process_group import comm_device
from pyg_sar.comm.sequence import before_operation
from pyg_sar.comm.state import STATS, config


class PendingExchange:
    """Messages posted by :func:`post_exchange`; :meth:`wait` returns the
    received tensors, ``{peer: [tensor, ...]}``."""

    def __init__(self, works, received: Dict[int, List[Tensor]],
                 copy_back: List[Tuple[Tensor, Tensor]],
                 keep_alive: List[Tensor]) -> None:
        self._works = works
        self._received = received
        self._copy_back = copy_back
        self._keep_alive = keep_alive

    def wait(self) -> Dict[int, List[Tensor]]:
        for work, what, peer in self._works:
            timed_wait(work, what, peer)
        for wire, out in self._copy_back:
            out.copy_(wire)
        self._works, self._copy_back, self._keep_alive = [], [], []
        return self._received


def _split(flat: Tensor) -> List[Tensor]:
    """Cuts a flat tensor into messages of at most the configured size."""
    step = max(1, config().max_bytes_per_message //
               max(flat.element_size(), 1))
    return list(flat.split(step)) if flat.numel() > step else [flat]


def _labels(ops: List[Tuple[str, int]], works: List) -> List[Tuple]:
    """``(work, what, peer)`` per work. gloo returns one work per operation;
    NCCL one for the whole coalesced batch, which is then named by its
    peers."""
    if len(works) == len(ops):
        return [(w, what, peer) for w, (what, peer) in zip(works, ops)]
    peers = sorted({peer for _, peer in ops})
    what = 'send' if all(w == 'send' for w, _ in ops) else 'receive'
    if len(peers) == 1:
        return [(w, what, peers[0]) for w in works]
    return [(w, f"exchange with ranks {', '.join(map(str, peers))}", None)
            for w in works]


def post_exchange(
    sends: Dict[int, Sequence[Tensor]],
    recv_shapes: Dict[int, Sequence[Tuple[Tuple[int, ...], torch.dtype]]],
    device: Optional[torch.device] = None,
    channel: str = 'default',
) -> PendingExchange:
    """Posts grouped non-blocking sends and receives whose sizes both sides
    know.

    Args:
        sends: ``{peer: [tensor, ...]}`` to send to each peer.
        recv_shapes: ``{peer: [(shape, dtype), ...]}`` expected from each peer,
            in the order the peer sends them.
        device: Where received tensors are returned.
        channel: ``'default'`` (the channel of the enclosing
            :func:`~pyg_sar.comm.on_channel`, else the world group) or a name
            of :data:`pyg_sar.comm.channels.CHANNELS`: exchanges that may be
            in flight at the same time between the same two ranks use
            different channels.

    Both sides must post matching lists in the same order. Empty tensors are
    not sent (the receiver skips them too, since it knows their size), so a
    peer with nothing to exchange costs nothing.
    """
    device = device or torch.device('cpu')
    before_operation()
    group = channel_group(channel)
    p2p_ops, labels, keep_alive, copy_back = [], [], [], []
    received: Dict[int, List[Tensor]] = {}
    for peer, specs in recv_shapes.items():
        out = []
        for shape, dtype in specs:
            buf = buffers.empty(shape, dtype, device)
            if buf.numel() > 0:
                wire = comm_device(buf)
                for piece in _split(wire.view(-1)):
                    p2p_ops.append(dist.P2POp(dist.irecv, piece, peer, group))
                    labels.append(('receive', peer))
                    STATS['messages_received'] += 1
                STATS['bytes_received'] += buf.numel() * buf.element_size()
                if wire is not buf:  # e.g. gloo with CUDA features
                    keep_alive.append(wire)
                    copy_back.append((wire, buf))
            out.append(buf)
        received[peer] = out
    for peer, tensors in sends.items():
        for tensor in tensors:
            if tensor.numel() == 0:
                continue
            wire = comm_device(tensor.contiguous())
            keep_alive.append(wire)
            for piece in _split(wire.view(-1)):
                p2p_ops.append(dist.P2POp(dist.isend, piece, peer, group))
                labels.append(('send', peer))
                STATS['messages_sent'] += 1
            STATS['bytes_sent'] += tensor.numel() * tensor.element_size()
    works = []
    if p2p_ops:
        STATS['collectives'] += 1
        start = time.perf_counter()
        try:
            works = dist.batch_isend_irecv(p2p_ops)
        except Exception as e:  # a peer whose connection is gone
            what, peer = labels[0]
            raise peer_error(what, peer, e,
                             time.perf_counter() - start) from e
    return PendingExchange(_labels(labels, works), received, copy_back,
                           keep_alive)
