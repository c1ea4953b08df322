"""What a launcher (``torchrun``) reports when a worker fails: the rank that
failed first, with its error, rather than a peer that only saw it die.

``torchrun`` names as "Root Cause" the failure with the earliest timestamp,
compared in whole seconds, the lowest rank winning a tie: the peers of a
failing rank, whose waits fail a moment later, tie with it and the lowest
rank is named, usually a peer. :func:`install_failure_hook` (called by
:func:`~pyg_sar.comm.init_distributed` under a launcher) records an uncaught
error of this worker in the launcher's error file
(``TORCHELASTIC_ERROR_FILE``), the format of torch's own ``@record``: an
error of the worker's own is backdated by one second, below the resolution
``torchrun`` compares at, so that any failure it causes comes after it; a
:class:`~pyg_sar.comm.PeerError` (a peer died, hung, disagreed) is recorded
as it happens. The error is also left in the rendezvous store, so that the
peers' errors quote it (:func:`~pyg_sar.comm.errors.report_failure`).
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Optional

from pyg_sar.comm.errors import PeerError, report_failure

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
