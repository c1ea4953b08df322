"""Failures: how a worker's failure is detected, named and reported.

Failed waits: :class:`PeerError`, the timed wait every operation goes
through (:func:`timed_wait`), and the message naming the dead or hung peer,
built from the transport's error (:func:`peer_error`); and
:class:`SettingsMismatchError`, a setting that differs across ranks, which a
failed wait reports instead when the ranks' published settings differ.

What a launcher (``torchrun``) reports when a worker fails: the rank that
failed first, with its error, rather than a peer that only saw it die.
``torchrun`` names as "Root Cause" the failure with the earliest timestamp,
compared in whole seconds, the lowest rank winning a tie: the peers of a
failing rank, whose waits fail a moment later, tie with it and the lowest
rank is named, usually a peer. :func:`install_failure_hook` (run when this
worker joins a process group) records an uncaught error of this worker in
the launcher's error file (``TORCHELASTIC_ERROR_FILE``), the format of
torch's own ``@record``: an error of the worker's own is backdated by one
second, below the resolution ``torchrun`` compares at, so that any failure
it causes comes after it; a :class:`PeerError` (a peer died, hung,
disagreed) is recorded as it happens. The error is also left in the
rendezvous store, so that the peers' errors quote it
(:func:`report_failure`).
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback
from typing import Any, Dict, Optional

from pyg_sar.comm import process_group
from pyg_sar.comm.state import SHARED_SETTINGS, config


class PeerError(RuntimeError):
    """A peer died, hung past the timeout, or disagreed about the plan.

    Besides the message, the fields say what failed (``None`` where
    unknown):

    Attributes:
        rank: This worker's rank.
        operation: ``'send'``, ``'receive'`` or the collective
            (``'all_reduce(sum)'``, ``'barrier'``, ...).
        peer: The peer's rank: the other side of a send or receive; for a
            collective, the other rank of a world of two, or a rank the
            transport's error names.
        address: The peer's ``host:port`` where the transport's error names
            it (gloo does for closed and reset connections).
        elapsed: Seconds the failed wait really lasted (a peer that died
            fails a wait at once, long before the timeout).
        timeout: The configured timeout in seconds.
        timed_out: Whether the wait ran into the timeout (rather than
            failing early, e.g. on a closed connection).
    """

    _FIELDS = ('rank', 'operation', 'peer', 'address', 'elapsed', 'timeout',
               'timed_out')

    def __init__(self, message: str, **fields) -> None:
        super().__init__(message)
        unknown = set(fields) - set(self._FIELDS)
        if unknown:
            raise TypeError(f"PeerError got unknown fields {sorted(unknown)}")
        for name in self._FIELDS:
            setattr(self, name, fields.get(name))

    def __reduce__(self):  # keep the fields through pickling
        return (_rebuild_peer_error,
                (str(self), {n: getattr(self, n) for n in self._FIELDS}))


def _rebuild_peer_error(message: str, fields: Dict) -> PeerError:
    return PeerError(message, **fields)


class SettingsMismatchError(ValueError):
    """A setting that shapes messages or collectives differs across ranks
    (raised on every rank; see :mod:`pyg_sar.comm.agreement`).

    Attributes:
        setting: The setting's name.
        values: ``{rank: value}`` of every rank (where known).
    """

    def __init__(self, message: str, setting: Optional[str] = None,
                 values: Optional[Dict[int, Any]] = None) -> None:
        super().__init__(message)
        self.setting, self.values = setting, values

    def __reduce__(self):  # keep the fields through pickling
        return (SettingsMismatchError, (str(self), self.setting, self.values))


def describe_difference(setting: str, values: Dict[int, Any]) -> str:
    """``"<setting> differs across ranks: rank 0 has 1024, ranks 1, 2 have
    16777216"``: every distinct value with the ranks that hold it."""
    holders: Dict[str, list] = {}
    for rank, value in sorted(values.items()):
        holders.setdefault(repr(value), []).append(rank)
    parts = [f"rank {ranks[0]} has {value}" if len(ranks) == 1 else
             f"ranks {', '.join(map(str, ranks))} have {value}"
             for value, ranks in holders.items()]
    return f"{setting} differs across ranks: {', '.join(parts)}"


def timed_wait(work, what: str, peer: Optional[int] = None) -> None:
    """Waits for ``work`` (a ``torch.distributed`` work handle of the
    operation ``what``, with ``peer`` for a send or receive) at most the
    configured timeout; a failed or timed-out wait raises
    :func:`peer_error`'s error."""
    timeout = config().timeout
    start = time.perf_counter()
    try:
        ok = work.wait(timeout)
    except Exception as e:  # gloo raises on closed sockets and timeouts
        raise peer_error(what, peer, e,
                         time.perf_counter() - start) from e
    if ok is False:
        raise peer_error(what, peer, None, time.perf_counter() - start)


# What transports say in their errors. gloo: "[.../pair.cc:537] Read error
# [127.0.0.1]:56218: Connection reset by peer. This is typically caused
# by ...", "Connection closed by peer [127.0.0.1]:14503. ...", "[...] Timed
# out waiting 4000ms for recv operation to complete", "Operation timed out!".
_SOURCE_PREFIX = re.compile(r'^\[[^\]]*\.(?:cc|cpp|cu|h|hpp):\d+\]\s*')
_ADDRESS = re.compile(r'\[([0-9A-Za-z_.:%-]+)\]:(\d+)')
_NAMED_RANKS = re.compile(r'\branks?\s*[=:]?\s*(\d+(?:\s*,\s*\d+)*)',
                          re.IGNORECASE)
_TIMED_OUT = re.compile(r'timed?\s*out', re.IGNORECASE)
_POINT_TO_POINT = {'send': 'to', 'receive': 'from'}


def _transport_summary(cause: BaseException) -> str:
    """The first sentence of a transport error, without gloo's source
    location and boilerplate advice (the full text stays chained)."""
    lines = str(cause).strip().splitlines()
    text = _SOURCE_PREFIX.sub('', lines[0]) if lines else ''
    text = text.split('. This is typically caused by')[0].strip()
    return text or type(cause).__name__


# Where a failing rank leaves its one-line reason for its peers.
_FAILED_KEY = 'pyg_sar/failed/{}'


def _store():
    """The rendezvous store of the process group, or ``None``."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        from torch.distributed.distributed_c10d import _get_default_store
        return _get_default_store()
    except Exception:  # an older or different torch: no report
        return None


def report_failure(message: str) -> None:
    """Leaves this rank's one-line reason for failing in the rendezvous
    store, so that peers whose waits fail next name this rank and quote it
    (``pyg-sar`` does this for every error it prints). Best effort: a store
    that is gone is ignored."""
    store = _store()
    if store is None:
        return
    try:
        store.set(_FAILED_KEY.format(process_group.get_rank()),
                  message[:500])
    except Exception:
        pass


# Where every rank leaves the shared settings it last used or agreed on.
_SETTINGS_KEY = 'pyg_sar/settings/{}'


def publish_settings(values: Dict[str, Any]) -> None:
    """Leaves this rank's shared settings in the rendezvous store, so that a
    peer whose wait fails can tell a settings difference from a dead peer.
    Best effort, like :func:`report_failure`."""
    store = _store()
    if store is None:
        return
    try:
        store.set(_SETTINGS_KEY.format(process_group.get_rank()),
                  json.dumps(values))
    except Exception:
        pass


def _settings_mismatch(rank: int, world_size: int
                       ) -> Optional[SettingsMismatchError]:
    """The first shared setting whose value a peer published differs from
    this rank's, as an error; ``None`` if all agree (or none is known)."""
    store = _store()
    if store is None:
        return None
    mine = {name: getattr(config(), name) for name in SHARED_SETTINGS}
    published: Dict[int, Dict[str, Any]] = {rank: mine}
    try:
        for q in range(world_size):
            key = _SETTINGS_KEY.format(q)
            if q != rank and store.check([key]):
                published[q] = json.loads(store.get(key).decode())
    except Exception:  # the store went down with its host
        return None
    for name in SHARED_SETTINGS:
        values = {q: s.get(name) for q, s in published.items()}
        if len(set(map(repr, values.values()))) > 1:
            return SettingsMismatchError(
                f"rank {rank}: {describe_difference(name, values)} (found "
                f"after a wait failed: it was changed on some ranks only; "
                f"configure() it on every rank at the same point)",
                name, values)
    return None


def _reported_failures(rank: int, world_size: int) -> Dict[int, str]:
    """``{rank: reason}`` of the peers that reported a failure."""
    store = _store()
    found: Dict[int, str] = {}
    if store is None:
        return found
    try:
        for q in range(world_size):
            key = _FAILED_KEY.format(q)
            if q != rank and store.check([key]):
                found[q] = store.get(key).decode(errors='replace')
    except Exception:  # the store went down with its host
        pass
    return found


def peer_error(what: str, peer: Optional[int],
               cause: Optional[BaseException],
               elapsed: float) -> Exception:
    """Builds the :class:`PeerError` of a failed wait of ``elapsed`` seconds
    on ``what`` (a send/receive with ``peer``, or a collective); a
    :class:`SettingsMismatchError` instead when the ranks' published shared
    settings differ (a rank that changed one alone waits to agree on it while
    its peers wait on its messages, until the timeout)."""
    # Looked up on the module at call time, so that patching
    # pyg_sar.comm.process_group.get_rank / get_world_size reaches here.
    rank = process_group.get_rank()
    world_size = process_group.get_world_size()
    mismatch = _settings_mismatch(rank, world_size)
    if mismatch is not None:
        return mismatch
    timeout = config().timeout.total_seconds()
    text = str(cause) if cause is not None else ''
    address = None
    match = _ADDRESS.search(text)
    if match:
        address = f'{match.group(1)}:{match.group(2)}'
    named = sorted({int(r) for m in _NAMED_RANKS.finditer(text)
                    for r in re.split(r'\s*,\s*', m.group(1))} - {rank})
    point_to_point = what in _POINT_TO_POINT
    if point_to_point:
        target = f'{what} {_POINT_TO_POINT[what]} rank {peer}'
    elif world_size == 2:
        peer = 1 - rank
        target = f'{what} with rank {peer} (the only other rank)'
    else:
        if len(named) == 1:
            peer = named[0]
        target = f'{what} across {world_size} ranks'
    timed_out = cause is None or bool(_TIMED_OUT.search(text)) or \
        elapsed >= 0.95 * timeout
    # A peer that failed on its own (a bad file, a refused input) left its
    # reason in the store; name it rather than guess.
    reported = _reported_failures(rank, world_size)
    if peer is None and len(reported) == 1:
        peer = next(iter(reported))
    outcome = 'timed out' if timed_out else 'failed'
    verdict = 'has probably hung or died' if timed_out else \
        'has probably died'
    detail = f': {_transport_summary(cause)}' if cause is not None else ''
    clue = ''
    if peer is not None:
        subject = f'rank {peer}'
        if peer in reported:
            verdict, detail = f'stopped first: "{reported[peer]}"', ''
    elif reported:
        subject = 'ranks ' + ', '.join(map(str, sorted(reported)))
        verdict = 'stopped first: ' + '; '.join(
            f'rank {q}: "{m}"' for q, m in sorted(reported.items()))
        detail = ''
    elif named:  # several ranks named by the transport
        subject = 'one of ranks ' + ', '.join(map(str, named))
        clue = ' (named by the transport)'
    else:
        subject = 'a peer rank'
        clue = f' (the one at {address})' if address is not None else ''
    return PeerError(
        f"rank {rank}: {target} {outcome} after {elapsed:.2f}s (timeout "
        f"{timeout:g}s); {subject}{clue} {verdict}{detail}",
        rank=rank, operation=what, peer=peer, address=address,
        elapsed=elapsed, timeout=timeout, timed_out=timed_out)


# What the launcher reports ##################################################

_INSTALLED = {'hook': None}


def install_failure_hook() -> None:
    """Records this worker's uncaught error for the launcher and its peers
    (once per process; the previous ``sys.excepthook`` still runs).
    :mod:`pyg_sar.comm` registers it to run when this worker joins a
    process group."""
    if _INSTALLED['hook'] is not None:
        return
    previous = sys.excepthook

    def hook(etype, value, tb) -> None:
        try:
            record_failure(value, tb)
        except Exception:  # reporting must never hide the error itself
            pass
        previous(etype, value, tb)

    _INSTALLED['hook'] = hook
    sys.excepthook = hook


def record_failure(error: BaseException, tb=None,
                   path: Optional[str] = None) -> Optional[str]:
    """Writes ``error`` to the launcher's error file (``path``, else
    ``TORCHELASTIC_ERROR_FILE``) unless one is there already (``@record``
    wrote it), and leaves its line in the rendezvous store unless it is a
    :class:`~pyg_sar.comm.PeerError`. Returns the file written, or
    ``None``."""
    line = f'{type(error).__name__}: {error}'.splitlines()[0]
    consequence = isinstance(error, PeerError)
    if not consequence:
        report_failure(line)
    path = path or os.environ.get('TORCHELASTIC_ERROR_FILE')
    if not path or os.path.exists(path):
        return None
    stamp = int(time.time()) - (0 if consequence else 1)
    stack = ''.join(traceback.format_exception(type(error), error, tb))
    data = {'message': {'message': line,
                        'extraInfo': {'py_callstack': stack,
                                      'timestamp': str(stamp)}}}
    tmp = f'{path}.tmp'
    with open(tmp, 'w') as f:
        json.dump(data, f)
    os.replace(tmp, path)
    return path
