"""The CPU kernels: a small C++ extension (``fused_attention.cpp``, OpenMP
over destination rows through ``at::parallel_for``), compiled by
``torch.utils.cpp_extension`` on first use and cached (``TORCH_EXTENSIONS_DIR``
or torch's default cache); ``None`` where no compiler is available."""
from __future__ import annotations

import logging
import os
import os.path as osp
import threading
from typing import Any, Optional

log = logging.getLogger('pyg_sar')

_SOURCE = osp.join(osp.dirname(osp.abspath(__file__)), 'fused_attention.cpp')
_LOCK = threading.Lock()
_STATE: dict = {}


def load() -> Optional[Any]:
    """The compiled extension module, built on first call; ``None`` (said
    once in the log, with the reason) where it cannot be built."""
    with _LOCK:
        if 'module' not in _STATE:
            _STATE['module'] = _build()
        return _STATE['module']


def _ninja_on_path() -> None:
    """torch's extension builder runs ``ninja`` from ``PATH``; the pip
    package's binary is not there when the venv is not activated."""
    import shutil
    if shutil.which('ninja'):
        return
    try:
        import ninja
    except ImportError:
        return
    bin_dir = getattr(ninja, 'BIN_DIR', None)
    if bin_dir:
        os.environ['PATH'] = bin_dir + os.pathsep + \
            os.environ.get('PATH', '')


def _cpu_flags() -> Optional[str]:
    """The x86 CPU's feature flags (``/proc/cpuinfo``), or ``None`` where
    they cannot be read (another OS or architecture)."""
    import platform
    if platform.machine().lower() not in ('x86_64', 'amd64'):
        return None
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('flags'):
                    return ' '.join(sorted(line.split(':', 1)[1].split()))
    except OSError:
        pass
    return None


def compile_flags() -> list:
    """``-O3``, and ``-march=native`` where the CPU's flags are known (they
    are part of the build's name, so a cached build never runs on a CPU
    with other instructions). ``-ffp-contract=off``: no fused multiply-add
    contraction, so every instruction set gives the same numbers."""
    flags = ['-O3', '-fopenmp', '-ffp-contract=off']
    if _cpu_flags() is not None:
        flags.append('-march=native')
    return flags


def _build() -> Optional[Any]:
    try:
        from torch.utils import cpp_extension
        _ninja_on_path()
        flags = compile_flags()
        with open(_SOURCE, 'rb') as f:
            # The source, the flags and the CPU's instruction sets name the
            # build: an edited kernel never reuses a stale cached one, nor a
            # machine one built for another CPU.
            import hashlib
            key = hashlib.sha256(f.read())
            key.update(repr((flags, _cpu_flags())).encode())
            digest = key.hexdigest()[:12]
        module = cpp_extension.load(
            name=f'pyg_sar_fused_attention_{digest}', sources=[_SOURCE],
            extra_cflags=flags, extra_ldflags=['-fopenmp'],
            verbose=False)
    except Exception as exc:  # no compiler, no ninja, a failed build
        log.warning('pyg_sar: fused CPU attention kernels unavailable (%s: '
                    '%s); attention runs as separate torch operators',
                    type(exc).__name__, str(exc).splitlines()[0][:200]
                    if str(exc) else '')
        return None
    log.info('pyg_sar: fused CPU attention kernels loaded (%s)',
             os.path.basename(_SOURCE))
    return module
