"""Point-to-point exchanges: non-blocking sends and receives whose sizes
both sides know (:func:`post_exchange`)."""
from __future__ import annotations

import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from pyg_sar.comm.errors import _peer_error, _wait
from pyg_sar.comm.process_group import _comm_device
from pyg_sar.comm.state import _CONFIG, _STATS


class PendingExchange:
    """Messages posted by :func:`post_exchange`; :meth:`wait` returns the
    received tensors, ``{peer: [tensor, ...]}``."""

    def __init__(self, works, received: Dict[int, List[Tensor]],
                 keep_alive: List[Tensor], device: torch.device) -> None:
        self._works = works
        self._received = received
        self._keep_alive = keep_alive
        self._device = device

    def wait(self) -> Dict[int, List[Tensor]]:
        for work, what, peer in self._works:
            _wait(work, what, peer)
        self._works = []
        self._keep_alive = []
        return {peer: [t.to(self._device) for t in tensors]
                for peer, tensors in self._received.items()}


def _split(flat: Tensor) -> List[Tensor]:
    """Cuts a flat tensor into messages of at most the configured size."""
    step = max(1, _CONFIG.max_bytes_per_message // max(flat.element_size(), 1))
    return list(flat.split(step)) if flat.numel() > step else [flat]


def _post(op, tensor: Tensor, peer: int, tag: int):
    """Posts one isend/irecv; a peer whose connection is gone already
    fails here rather than in the wait."""
    what = 'send' if op is dist.isend else 'receive'
    start = time.perf_counter()
    try:
        return op(tensor, peer, tag=tag)
    except Exception as e:
        raise _peer_error(what, peer, e, time.perf_counter() - start) from e


def post_exchange(
    sends: Dict[int, Sequence[Tensor]],
    recv_shapes: Dict[int, Sequence[Tuple[Tuple[int, ...], torch.dtype]]],
    device: Optional[torch.device] = None,
    tag: int = 0,
) -> PendingExchange:
    """Posts non-blocking sends and receives whose sizes both sides know.

    Args:
        sends: ``{peer: [tensor, ...]}`` to send to each peer.
        recv_shapes: ``{peer: [(shape, dtype), ...]}`` expected from each peer,
            in the order the peer sends them.
        device: Where received tensors are returned.
        tag: Channel of the messages; exchanges that may be in flight at the
            same time between the same two ranks use different tags.

    Both sides must post matching lists in the same order. Empty tensors are
    not sent (the receiver skips them too, since it knows their size), so a
    peer with nothing to exchange costs nothing. Receives are posted before
    sends to avoid transport-level stalls.
    """
    device = device or torch.device('cpu')
    works, keep_alive = [], []
    received: Dict[int, List[Tensor]] = {}
    exchange_ran = False
    for peer, specs in recv_shapes.items():
        out = []
        for shape, dtype in specs:
            buf = torch.empty(shape, dtype=dtype, device=device)
            if buf.numel() > 0:
                wire = _comm_device(buf)
                for piece in _split(wire.view(-1)):
                    works.append((_post(dist.irecv, piece, peer, tag),
                                  'receive', peer))
                    _STATS['messages_received'] += 1
                    exchange_ran = True
                _STATS['bytes_received'] += buf.numel() * buf.element_size()
                if wire is not buf:  # nccl: copy back after waiting
                    keep_alive.append(wire)
                    buf = wire
            out.append(buf)
        received[peer] = out
    for peer, tensors in sends.items():
        for tensor in tensors:
            if tensor.numel() == 0:
                continue
            wire = _comm_device(tensor.contiguous())
            keep_alive.append(wire)
            for piece in _split(wire.view(-1)):
                works.append((_post(dist.isend, piece, peer, tag), 'send',
                              peer))
                _STATS['messages_sent'] += 1
                exchange_ran = True
            _STATS['bytes_sent'] += tensor.numel() * tensor.element_size()
    if exchange_ran:
        _STATS['collectives'] += 1
    return PendingExchange(works, received, keep_alive, device)
