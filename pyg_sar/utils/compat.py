"""Import-time detection of optional accelerator packages.

None of these packages is required: code paths that can use them must check the
flags below and fall back to pure PyTorch otherwise.
"""


def _importable(module_name: str) -> bool:
    # A broken binary install (ABI mismatch with the installed torch) raises
    # OSError or RuntimeError rather than ImportError; treat it as absent.
    try:
        __import__(module_name)
    except Exception:
        return False
    return True


HAS_PYG_LIB: bool = _importable('pyg_lib')
HAS_TORCH_SCATTER: bool = _importable('torch_scatter')
HAS_TORCH_SPARSE: bool = _importable('torch_sparse')

__all__ = ['HAS_PYG_LIB', 'HAS_TORCH_SCATTER', 'HAS_TORCH_SPARSE']
