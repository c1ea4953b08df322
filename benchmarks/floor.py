"""The compute floor of one epoch, and where an epoch's time goes.

:func:`measure_floor` times, in the calling process (the benchmark's worker,
right after its epochs, with the same threads), the kernels a model cannot
avoid at one worker's shapes, with torch's own kernels:

* dense: every linear map, forward (``x @ W``) and backward
  (``g @ W^T`` and ``x^T @ g``), as ``torch.mm`` at the layer's shapes
  (SAGE: ``lin_l`` and ``lin_r``; GAT: the projection to ``H x C``; the
  first layer needs no input gradient);
* sparse: one aggregation per layer, forward (CSR SpMM of the local
  adjacency ``[num_nodes, num_nodes + halo]`` with the features at the
  aggregation width) and backward (SpMM of the transposed adjacency);
  SAGE aggregates at ``min(in, out)`` (``transform_first``), GAT at
  ``H x C`` (per head, ``C`` wide, with the attention weights as values);
* attention (GAT): the per-edge arithmetic of the softmax, forward (gather
  both logits, add, leaky ReLU, segment max, subtract, exp, segment sum,
  divide) and backward (the attention-weight gradient by SDDMM
  ``sparse.sampled_addmm`` per head, the softmax and leaky ReLU backward,
  and the two scatters to the node logits); GATv2 computes its logits from
  ``[E, H, C]`` gathered rows (gather both, add, leaky ReLU, times ``att``,
  sum over channels; backward: the same chain and two ``[E, H, C]``
  scatters); TransformerConv's logits are one SDDMM per head (keys and
  queries), and its backward two SpMMs per head (the queries' and keys'
  gradients).

Dense maps per layer: SAGE two (``lin_l``, ``lin_r``), GAT one, GATv2 two
(``lin_l``, ``lin_r``), TransformerConv four (keys, queries, values and the
skip connection).

Each kernel runs once to warm up and then ``repeat`` times (median). The
floor is the sum: a lower bound on the epoch that is reachable only if
nothing else (exchange, Python, allocation, copies) took any time.

:func:`breakdown` folds a ``torch.profiler`` pass over one epoch into the
categories dense, sparse, exchange, elementwise and "Python and allocator"
(the epoch's wall time not inside any profiled operator).
"""
from __future__ import annotations

import statistics
import warnings
import time
from typing import Callable, Dict, List

import torch


def _time(fn: Callable[[], object], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _csr(rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor,
         shape) -> torch.Tensor:
    warnings.filterwarnings('ignore', message='Sparse')
    order = torch.argsort(rows * shape[1] + cols)
    rows, cols, values = rows[order], cols[order], values[order]
    crow = torch.zeros(shape[0] + 1, dtype=torch.int64)
    crow[1:] = torch.bincount(rows, minlength=shape[0]).cumsum(0)
    return torch.sparse_csr_tensor(crow, cols, values, shape)


def measure_floor(model: str, dims: List[dict], num_nodes: int,
                  num_src: int, dst: torch.Tensor, src: torch.Tensor,
                  repeat: int = 3) -> Dict[str, float]:
    """Seconds per epoch of the model's unavoidable kernels (module docs).

    ``dims``: :func:`full_batch_worker.layer_dims`; ``num_nodes`` the rows
    (local nodes), ``num_src`` the columns (local + halo nodes), ``dst`` and
    ``src`` the edges (``dst < num_nodes``, ``src < num_src``)."""
    gen = torch.Generator().manual_seed(0)
    dst, src = dst.long(), src.long()
    num_edges = dst.numel()
    ones = torch.ones(num_edges)
    adj = _csr(dst, src, ones, (num_nodes, num_src))
    adj_t = _csr(src, dst, ones, (num_src, num_nodes))
    out = dict(dense=0.0, sparse=0.0, attention=0.0)
    attention = model in ('gat', 'gatv2', 'transformer')
    with torch.no_grad():
        for layer, d in enumerate(dims):
            width = d['heads'] * d['channels'] if attention else d['out']
            x = torch.randn(num_nodes, d['inp'], generator=gen)
            w = torch.randn(d['inp'], width, generator=gen)
            g = torch.randn(num_nodes, width, generator=gen)
            linears = dict(sage=2, gatv2=2, transformer=4).get(model, 1)
            dense = _time(lambda: torch.mm(x, w), repeat) + \
                _time(lambda: torch.mm(x.t(), g), repeat)
            if layer > 0:
                dense += _time(lambda: torch.mm(g, w.t()), repeat)
            out['dense'] += linears * dense
            if attention:
                out['sparse'] += _gat_sparse(adj, adj_t, d, num_src, gen,
                                             repeat)
                scores = dict(gat=_gat_attention, gatv2=_gatv2_attention,
                              transformer=_dot_attention)[model]
                out['attention'] += scores(dst, src, num_nodes, num_src, adj,
                                           d['heads'], d['channels'], gen,
                                           repeat)
            else:
                agg = min(d['inp'], d['out'])
                h = torch.randn(num_src, agg, generator=gen)
                gh = torch.randn(num_nodes, agg, generator=gen)
                out['sparse'] += _time(lambda: torch.sparse.mm(adj, h),
                                       repeat) + \
                    _time(lambda: torch.sparse.mm(adj_t, gh), repeat)
    out['total'] = out['dense'] + out['sparse'] + out['attention']
    return out


def _gat_sparse(adj, adj_t, d, num_src, gen, repeat) -> float:
    """H per-head SpMMs forward (``C`` wide, attention weights as values)
    and their transposes backward."""
    heads, channels = d['heads'], d['channels']
    v = torch.randn(num_src, channels, generator=gen)
    g = torch.randn(adj.shape[0], channels, generator=gen)
    return heads * (_time(lambda: torch.sparse.mm(adj, v), repeat) +
                    _time(lambda: torch.sparse.mm(adj_t, g), repeat))


def _gat_attention(dst, src, num_nodes, num_src, adj, heads, channels, gen,
                   repeat) -> float:
    a_src = torch.randn(num_src, heads, generator=gen)
    a_dst = torch.randn(num_nodes, heads, generator=gen)

    def forward():
        score = torch.nn.functional.leaky_relu(
            a_src.index_select(0, src) + a_dst.index_select(0, dst), 0.2)
        return score, _softmax(score, dst, num_nodes)

    score, alpha = forward()
    logit_grad = _LogitGrad(adj, dst, num_nodes, heads, channels, gen)

    def backward():
        # d alpha per head (SDDMM), then softmax and leaky ReLU backward.
        g_score = logit_grad(alpha)
        g_score = torch.where(score > 0, g_score, g_score * 0.2)
        torch.zeros(num_src, heads).index_add_(0, src, g_score)
        torch.zeros(num_nodes, heads).index_add_(0, dst, g_score)

    # The SDDMM's CSR order differs from the edge order; the arithmetic is
    # the same either way.
    return _time(forward, repeat) + _time(backward, repeat)


def _softmax(logit, dst, num_nodes):
    """The segment softmax over destinations (forward of GAT's)."""
    heads = logit.shape[1]
    idx = dst.view(-1, 1).expand(-1, heads)
    top = torch.full((num_nodes, heads), float('-inf')).scatter_reduce_(
        0, idx, logit, 'amax', include_self=True)
    weight = (logit - top.index_select(0, dst)).exp_()
    total = torch.zeros(num_nodes, heads).index_add_(0, dst, weight)
    return weight.div_(total.index_select(0, dst))


class _LogitGrad:
    """The attention weights' gradient (an SDDMM per head of an output
    gradient and the values) through the softmax: the logits' gradient.
    Its random tables and the sampling pattern are made once, here, not in
    the timed calls."""

    def __init__(self, adj, dst, num_nodes, heads, channels, gen) -> None:
        self.dst, self.num_nodes, self.heads = dst, num_nodes, heads
        self.g_out = torch.randn(num_nodes, channels, generator=gen)
        self.v = torch.randn(adj.shape[1], channels, generator=gen)
        self.pattern = torch.sparse_csr_tensor(
            adj.crow_indices(), adj.col_indices(), torch.zeros(dst.numel()),
            adj.shape)

    def __call__(self, alpha):
        grads = [torch.sparse.sampled_addmm(self.pattern, self.g_out,
                                            self.v.t()).values()
                 for _ in range(self.heads)]
        g_alpha = torch.stack(grads, 1)
        dot = torch.zeros(self.num_nodes, self.heads).index_add_(
            0, self.dst, alpha * g_alpha)
        return alpha * (g_alpha - dot.index_select(0, self.dst))


def _gatv2_attention(dst, src, num_nodes, num_src, adj, heads, channels, gen,
                     repeat) -> float:
    x_l = torch.randn(num_src, heads, channels, generator=gen)
    x_r = torch.randn(num_nodes, heads, channels, generator=gen)
    att = torch.randn(heads, channels, generator=gen)

    def forward():
        pre = x_l.index_select(0, src) + x_r.index_select(0, dst)
        logit = (torch.nn.functional.leaky_relu(pre, 0.2) * att).sum(-1)
        return pre, _softmax(logit, dst, num_nodes)

    pre, alpha = forward()
    logit_grad = _LogitGrad(adj, dst, num_nodes, heads, channels, gen)

    def backward():
        g_logit = logit_grad(alpha)
        g_pre = g_logit.unsqueeze(-1) * att * torch.where(pre > 0, 1.0, 0.2)
        torch.zeros(num_src, heads, channels).index_add_(0, src, g_pre)
        torch.zeros(num_nodes, heads, channels).index_add_(0, dst, g_pre)

    return _time(forward, repeat) + _time(backward, repeat)


def _dot_attention(dst, src, num_nodes, num_src, adj, heads, channels, gen,
                   repeat) -> float:
    q = torch.randn(num_nodes, channels, generator=gen)
    k = torch.randn(num_src, channels, generator=gen)
    logit_grad = _LogitGrad(adj, dst, num_nodes, heads, channels, gen)

    def forward():
        logit = torch.stack([torch.sparse.sampled_addmm(
            logit_grad.pattern, q, k.t()).values() for _ in range(heads)], 1)
        return _softmax(logit / channels ** 0.5, dst, num_nodes)

    alpha = forward()

    def backward():
        g_logit = logit_grad(alpha)
        ds = torch.sparse_csr_tensor(adj.crow_indices(), adj.col_indices(),
                                     g_logit[:, 0].contiguous(), adj.shape)
        for _ in range(heads):
            torch.sparse.mm(ds, k)        # the queries' gradient
            torch.sparse.mm(ds.t(), q)    # the keys' gradient

    return _time(forward, repeat) + _time(backward, repeat)


# Profiler breakdown ##########################################################

_DENSE = ('addmm', 'aten::mm', 'bmm', 'matmul', 'linear', 'baddbmm')
_SPARSE = ('sparse', 'spmm', 'index_add', 'scatter', 'index_select',
           'gather', 'segment', 'csr', 'coo', 'index_reduce', 'sddmm',
           'aten::index', 'embedding')
_EXCHANGE = ('gloo', 'nccl', 'c10d', 'all_to_all', 'all_reduce', 'send',
             'recv', 'barrier', 'broadcast', 'allgather', 'all_gather',
             'wait', 'reduce_scatter')


def category(name: str) -> str:
    low = name.lower()
    if any(k in low for k in _EXCHANGE):
        return 'exchange'
    if any(k in low for k in _SPARSE):
        return 'sparse'
    if any(k in low for k in _DENSE):
        return 'dense'
    return 'elementwise'


def breakdown(epoch: Callable[[], None]) -> Dict[str, float]:
    """Seconds of one profiled ``epoch()`` per category (module docs), the
    operator counts, and the profiled wall time (``profiled_s``)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        epoch()
        wall = time.perf_counter() - start
    out = dict(dense=0.0, sparse=0.0, exchange=0.0, elementwise=0.0)
    calls = 0
    top = {}
    for evt in prof.key_averages():
        self_s = evt.self_cpu_time_total / 1e6
        if not evt.key.startswith(('aten::', 'gloo', 'nccl', 'c10d')) and \
                category(evt.key) != 'exchange':
            continue  # autograd nodes, record_function labels: no kernels
        out[category(evt.key)] += self_s
        calls += evt.count
        top[evt.key] = round(self_s, 4)
    kernels = sum(out.values())
    # The profiled ops' self times overlap in threads; scale to the wall.
    if kernels > wall:
        out = {k: v * wall / kernels for k, v in out.items()}
        kernels = wall
    out['python_alloc'] = max(0.0, wall - kernels)
    out['profiled_s'] = wall
    out['op_calls'] = calls
    out['top_ops'] = dict(sorted(top.items(), key=lambda kv: -kv[1])[:12])
    return out
