"""Agreement: the settings every rank must share are compared across ranks
before any message they shape is posted.

Which settings: the shared fields of :class:`~pyg_sar.comm.CommConfig`
(:data:`~pyg_sar.comm.state.SHARED_SETTINGS`: ``max_bytes_per_message`` cuts
a tensor into messages, ``halo_slice_bytes`` picks the rows of each exchange
of the SAR engine), and what the callers of :func:`agree` add
(:class:`~pyg_sar.DistGraph`'s ``mode`` and ``chunk_size``, the loaders'
options). Ranks that disagree would pair messages of different sizes: gloo
takes a short message into a larger receive buffer (the rest is garbage) and
aborts the process on a longer one.

When:

- :func:`agree`, where a :class:`~pyg_sar.DistGraph` or a loader is built
  (which gathers from every rank anyway): the shared settings travel in the
  same gather, so the check costs no extra collective.
- :func:`ensure_agreed`, at the start of every operation of
  :mod:`pyg_sar.comm`: a tuple comparison while the shared settings are
  those last agreed. After a change (:func:`~pyg_sar.comm.configure`, or an
  assignment to a field of :func:`~pyg_sar.comm.config`), the rank agrees
  once more, on the control group (a gloo group of its own, made at the
  first :func:`agree`, so the agreement never pairs with data traffic): one
  tiny all-gather per change. Every rank that changed the setting at the
  same point of the program joins it at its next operation, so a change made
  on every rank takes effect at once. Before a process group's first
  :func:`agree` there is nothing to compare with: the settings are first
  compared there (every exchange they shape runs on a graph or a loader,
  built after it).

A difference raises :class:`~pyg_sar.comm.SettingsMismatchError` on every
rank, naming the setting and each rank's value. A rank that changed a shared
setting *alone*, after the ranks last agreed, cannot be told apart by its
peers from one that changed nothing: they do not join its agreement and wait
for its messages, which it does not post. Nothing is paired wrongly; both
sides wait until the timeout (``CommConfig.timeout``), and then each reports
the setting and the values, which every rank publishes in the rendezvous
store when it agrees (:func:`pyg_sar.comm.errors.publish_settings`).
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from pyg_sar.comm.errors import (SettingsMismatchError, describe_difference,
                                 peer_error, publish_settings, timed_wait)
from pyg_sar.comm.process_group import (before_teardown, comm_device,
                                        get_rank, is_active)
from pyg_sar.comm.state import SHARED_SETTINGS, STATS, config

# The world group the last agreement was made in, the shared settings agreed
# there, and the control group (made at a process group's first agreement).
_STATE: Dict[str, Any] = {'world': None, 'values': None, 'control': None,
                          'control_backend': None}


def shared_settings() -> Tuple[int, ...]:
    """This rank's values of :data:`~pyg_sar.comm.state.SHARED_SETTINGS`."""
    return tuple(getattr(config(), name) for name in SHARED_SETTINGS)


def ensure_agreed() -> None:
    """Agrees on the shared settings when they changed on this rank since
    the ranks last agreed (see the module docs): free otherwise."""
    if not is_active() or _STATE['world'] is not dist.group.WORLD:
        return  # not agreed yet in this process group: agree() compares
    values = shared_settings()
    if values == _STATE['values']:
        return
    publish_settings(dict(zip(SHARED_SETTINGS, values)))
    _refuse_differences(_gather_on_control(values),
                        'at the first operation after a change')
    _STATE['values'] = values


def _gather_on_control(values: Tuple[int, ...]) -> List[Dict[str, int]]:
    """Every rank's shared settings (one all-gather on the control
    group)."""
    mine = torch.tensor(values, dtype=torch.long)
    if _STATE['control_backend'] != 'gloo':
        mine = comm_device(mine)
    out = mine.new_empty(dist.get_world_size() * mine.numel())
    STATS['collectives'] += 1
    timed_wait(dist.all_gather_into_tensor(out, mine, group=_STATE['control'],
                                           async_op=True),
               'all_gather(shared settings)')
    return [dict(zip(SHARED_SETTINGS, row))
            for row in out.view(-1, mine.numel()).tolist()]


def agree(what: str, options: Optional[Dict[str, Any]] = None,
          payload: Any = None) -> List[Any]:
    """Checks (collectively, one gather) that every rank has the same shared
    settings and the same ``options`` (``{name: value}``, compared with
    ``==``), and returns every rank's ``payload``. ``what`` names the caller
    in the error (e.g. ``'building a DistGraph'``)."""
    values = shared_settings()
    mine = ({**dict(zip(SHARED_SETTINGS, values)), **(options or {})},
            payload)
    if not is_active():
        return [payload]
    publish_settings(dict(zip(SHARED_SETTINGS, values)))
    everyone = gather_objects(mine)
    _refuse_differences([settings for settings, _ in everyone],
                        f'when {what}')
    _start()
    _STATE['values'] = values
    return [theirs for _, theirs in everyone]


def gather_objects(obj: Any, group: Optional[object] = None) -> List[Any]:
    """Gathers one picklable object from every rank of ``group`` (the world
    group by default); no agreement first."""
    STATS['collectives'] += 1
    out: List = [None] * dist.get_world_size(group)
    start = time.perf_counter()
    try:
        dist.all_gather_object(out, obj, group=group)
    except Exception as e:
        raise peer_error('all_gather_object', None, e,
                         time.perf_counter() - start) from e
    return out


def _start() -> None:
    """At a process group's first :func:`agree` (every rank takes part in
    it; made after its gather, so that a dead peer fails that fast), makes
    the control group; later ones find it."""
    world = dist.group.WORLD
    if _STATE['world'] is world:
        return
    start = time.perf_counter()
    # gloo when available: the control messages are a few integers on the
    # CPU, whatever the backend of the data.
    backend = 'gloo' if dist.is_gloo_available() else None
    try:
        control = dist.new_group(backend=backend, timeout=config().timeout,
                                 group_desc='pyg_sar:control')
    except Exception as e:
        raise peer_error('new_group(control)', None, e,
                         time.perf_counter() - start) from e
    _STATE.update(world=world, values=None, control=control,
                  control_backend=backend)


def _refuse_differences(everyone: Sequence[Dict[str, Any]],
                        when: str) -> None:
    """Raises :class:`SettingsMismatchError` on the first setting whose
    value differs across ranks (every rank sees the same values, so every
    rank raises it)."""
    names = list(dict.fromkeys(n for settings in everyone for n in settings))
    for name in names:
        values = {q: settings.get(name) for q, settings in
                  enumerate(everyone)}
        first = values[0]
        if any(not _same(first, v) for v in values.values()):
            raise SettingsMismatchError(
                f"rank {get_rank()}: {describe_difference(name, values)} "
                f"(compared {when}; every rank must use the same value)",
                name, values)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # e.g. tensors of different shapes
        return False


@before_teardown
def _forget_control() -> None:
    control = _STATE['control']
    live = _STATE['world'] is not None and dist.is_initialized() and \
        _STATE['world'] is dist.group.WORLD
    _STATE.update(world=None, values=None, control=None,
                  control_backend=None)
    if live and control is not None:
        dist.destroy_process_group(control)
