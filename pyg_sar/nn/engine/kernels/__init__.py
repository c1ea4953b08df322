"""Fused attention kernels: one forward and one backward per CSR-ordered
edge chunk of the engine's online softmax (GAT and GATv2 scores), so the
per-edge gather, score, leaky ReLU, running max and sum, exponentials and
the weighted sum over sources run in one pass over the chunk, and the
backward recomputes the probabilities from the saved per-row max and sum.

Every backend has the same three entry points (all tensors of one dtype,
float32 or float64; index tensors int32 or int64; ``[N, H, C]`` tables may
be head-major, channels contiguous):

* ``forward(kind, crow, col, s_src, s_dst, edge, att, value, mask,
  run_max, run_sum, out, slope)``: folds the chunk into the running max,
  sum and unnormalized output of its rows (in place);
* ``backward_rows(kind, crow, col, s_src, s_dst, edge, att, value, mask,
  run_max, run_sum, grad_out, delta, w, ds, grad_dst, grad_edge, grad_att,
  slope)``: per destination row, the value weights ``w = p z`` and the
  score gradient ``ds`` of every edge, the destination terms' gradient,
  GATv2's per-channel edge gradient and the gradient of ``att`` (one
  ``[H, C]`` slab per thread or program, summed by the caller);
* ``backward_cols(kind, crow_t, col_t, perm, s_src, s_dst, edge, att,
  grad_out, w, ds, grad_value, grad_src, slope)``: per source row of the
  transposed chunk, the value gradient and the source terms' gradient.

``kind`` is 0 for GAT (``lrelu(s_src[j] + s_dst[i] + edge)``, ``[N, H]``
terms), 1 for GATv2 (``att . lrelu(s_src[j] + s_dst[i] + edge)``,
``[N, H, C]`` terms) and 2 for TransformerConv's dot product
(``(s_src[j] + edge) . s_dst[i] / slope``: keys, queries, and ``slope``
the divisor ``sqrt(C)``). Empty tensors stand for absent ones.

Backends: :mod:`.cpu` (a C++ extension compiled on first use) and
:mod:`.gpu` (Triton; CUDA tensors, or CPU tensors under
``TRITON_INTERPRET=1``). :func:`backend` picks one for a device.
"""
from __future__ import annotations

import importlib
import logging
import os
from typing import Any, Optional, Tuple

import torch

log = logging.getLogger('pyg_sar')

KINDS = {'gat': 0, 'gatv2': 1, 'dot': 2}
# PYG_SAR_FUSED=0 turns the fused kernels off (the separate-operator path
# runs); =triton runs the Triton kernels on any device (on CPU tensors they
# need TRITON_INTERPRET=1: a correctness check, not a fast path).
ENV = 'PYG_SAR_FUSED'


def triton_available() -> bool:
    """Whether Triton imports (it ships with CUDA builds of torch)."""
    try:
        importlib.import_module('triton')
    except Exception:
        return False
    return True


def backend(device: torch.device) -> Tuple[Optional[Any], str]:
    """``(kernels, why)``: the kernel module for ``device`` and its name, or
    ``None`` and the reason the separate-operator path runs."""
    choice = os.environ.get(ENV, '1').strip().lower()
    if choice in ('0', 'off', 'false', 'no'):
        return None, f'{ENV}={choice}'
    if choice == 'triton' or device.type == 'cuda':
        if not triton_available():
            return None, 'triton is not installed'
        if device.type != 'cuda' and \
                os.environ.get('TRITON_INTERPRET') != '1':
            return None, 'Triton on CPU tensors needs TRITON_INTERPRET=1'
        from pyg_sar.nn.engine.kernels import gpu
        return gpu, 'Triton kernels'
    if device.type != 'cpu':
        return None, f'no fused kernels for {device.type} tensors'
    from pyg_sar.nn.engine.kernels import cpu
    module = cpu.load()
    if module is None:
        return None, 'the C++ kernels could not be built'
    return module, 'C++ kernels'
