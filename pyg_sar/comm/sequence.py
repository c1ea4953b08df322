"""Keeping the ranks' operations paired: what every operation of
:mod:`pyg_sar.comm` does first (:func:`before_operation`).

Ranks pair their operations by order. Two things can put a rank's sequence
out of step with its peers', and both are settled here, before the rank's
next operation:

- collective work it left unfinished (a loader's epoch left with ``break``:
  the peers still run its rounds), registered with
  :func:`finish_before_next_operation`. It runs at the rank's next
  operation, not when the work was left: a rank that leaves a loop because
  of an exception and exits has no next operation, so it never blocks on
  peers that may be waiting elsewhere (they fail fast on its closed
  connections);
- a shared setting it changed
  (:func:`~pyg_sar.comm.agreement.ensure_agreed`).

Both are the business of the thread that runs the rank's program. A
loader's background thread (``num_workers > 0``), which runs the sampling
rounds of an epoch ahead on the loaders' own channel, marks itself with
:func:`in_background`: its operations settle neither (the main thread's
unfinished work may be to wait for that very thread, and the agreement is
the main thread's collective).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator, List

from pyg_sar.comm.agreement import ensure_agreed
from pyg_sar.comm.process_group import is_active

# Collective work left unfinished, in the order it was left, and whether it
# is running (its own operations must not start it again).
_UNFINISHED: List[Callable[[], None]] = []
_RUNNING = {'now': False}


class _Thread(threading.local):
    background = False


_THREAD = _Thread()


@contextlib.contextmanager
def in_background() -> Iterator[None]:
    """Marks the operations of this thread (a loader's background thread)
    as not the rank's program: they neither run the unfinished work nor
    agree on changed settings (see the module docs)."""
    previous, _THREAD.background = _THREAD.background, True
    try:
        yield
    finally:
        _THREAD.background = previous


def finish_before_next_operation(work: Callable[[], None]) -> None:
    """Registers collective ``work`` (every rank's peers expect it) that
    this rank runs before its next operation of :mod:`pyg_sar.comm`."""
    _UNFINISHED.append(work)


def before_operation() -> None:
    """Finishes the work left unfinished, then agrees on changed settings
    (free when there is neither)."""
    if _THREAD.background:
        return
    if not is_active():
        _UNFINISHED.clear()  # nobody waits for it
        return
    if _UNFINISHED and not _RUNNING['now']:
        _RUNNING['now'] = True
        try:
            while _UNFINISHED:
                _UNFINISHED.pop(0)()
        finally:
            _RUNNING['now'] = False
    ensure_agreed()
