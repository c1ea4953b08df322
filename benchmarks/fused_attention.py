"""One attention chunk, forward and backward: pyg_sar's fused kernels against
the same online softmax written with torch operators, side by side in one
run, for GAT's, GATv2's and TransformerConv's (dot product) scores.

* CPU: torch operators eager and under ``torch.compile`` (inductor's C++
  loops) against the C++ kernels (which of the compiled routes pyg_sar takes
  on CPU was decided with it);
* CUDA: torch operators eager against the Triton kernels, over a sweep of
  their launch shape (edges per block, warps per program); the fastest one
  is reported as ``best``.

Prints a table and writes ``<out>/fused_attention[_cuda].json`` and
``.png``::

    python benchmarks/fused_attention.py --rows 50000 --degree 20
    python benchmarks/fused_attention.py --device cuda --rows 1000000
"""
from __future__ import annotations

import argparse
import os
import os.path as osp
import platform
import sys
import time

import torch
import torch.nn.functional as F

HERE = osp.dirname(osp.abspath(__file__))
sys.path.insert(0, HERE)
from _common import write_results  # noqa: E402
from pyg_sar.nn.engine import kernels  # noqa: E402

SLOPE = 0.2
KINDS = tuple(kernels.KINDS)
SWEEP = [(16, 1), (16, 2), (32, 1), (32, 2), (32, 4), (64, 2), (64, 4),
         (64, 8)]


def softmax_chunk(kind, s_src, s_dst, att, value, src, dst, rows: int):
    """Attention over the chunk with torch operators (what the engine's
    separate-operator path computes)."""
    if kind == 'dot':
        a = (s_src[src] * s_dst[dst]).sum(-1) / s_src.shape[-1] ** 0.5
    else:
        a = F.leaky_relu(s_src[src] + s_dst[dst], SLOPE)
    if kind == 'gatv2':
        a = (a * att).sum(-1)
    idx = dst.view(-1, 1).expand_as(a)
    m = a.new_full((rows, a.shape[1]), float('-inf')).scatter_reduce(
        0, idx, a, 'amax', include_self=True)
    w = (a - m[dst]).exp()
    s = a.new_zeros(rows, a.shape[1]).index_add(0, dst, w)
    out = value.new_zeros(rows, *value.shape[1:]).index_add(
        0, dst, w.unsqueeze(-1) * value[src])
    return out / (s + 1e-16).unsqueeze(-1)


def timed(fn, repeat, device):
    def sync():
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
    fn()
    times = []
    for _ in range(repeat):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


class Chunk:
    """A random chunk in CSR order (and its transpose), its score terms,
    values and output gradient."""

    def __init__(self, kind, rows, degree, heads, channels, device):
        gen = torch.Generator().manual_seed(0)
        n, h, c, e = rows, heads, channels, rows * degree
        self.kind, self.n, self.h, self.c, self.e = kind, n, h, c, e
        dst = torch.randint(0, n, (e, ), generator=gen).sort().values
        src = torch.randint(0, n, (e, ), generator=gen)
        self.value = torch.randn(n, h, c, generator=gen)
        if kind == 'gat':
            self.s_src = torch.randn(n, h, generator=gen)
            self.s_dst = torch.randn(n, h, generator=gen)
            self.att = None
        elif kind == 'dot':
            self.s_src = torch.randn(n, h, c, generator=gen)
            self.s_dst = torch.randn(n, h, c, generator=gen)
            self.att = None
        else:
            self.s_src = self.value
            self.s_dst = torch.randn(n, h, c, generator=gen)
            self.att = torch.randn(h, c, generator=gen)
        self.grad = torch.randn(n, h, c, generator=gen)
        crow = torch.zeros(n + 1, dtype=torch.long)
        crow[1:] = torch.bincount(dst, minlength=n).cumsum(0)
        order = torch.argsort(src, stable=True)
        crow_t = torch.zeros(n + 1, dtype=torch.long)
        crow_t[1:] = torch.bincount(src, minlength=n).cumsum(0)
        on = lambda t: None if t is None else t.to(device)  # noqa: E731
        self.src, self.dst, self.crow, self.crow_t = map(
            on, (src, dst, crow, crow_t))
        self.col_t, self.perm = on(dst[order]), on(order)
        self.value, self.s_dst, self.att, self.grad = map(
            on, (self.value, self.s_dst, self.att, self.grad))
        self.s_src = self.value if kind == 'gatv2' else on(self.s_src)

    def torch_step(self, fn):
        leaves = [t.detach().clone().requires_grad_() for t in (
            self.value, self.s_dst) + (() if self.kind == 'gatv2' else
                                       (self.s_src, ))]
        value, s_dst = leaves[:2]
        s_src = value if self.kind == 'gatv2' else leaves[2]

        def step():
            out = fn(self.kind, s_src, s_dst, self.att, value, self.src,
                     self.dst, self.n)
            torch.autograd.grad(out, leaves, self.grad)
        return step

    def fused_step(self, impl):
        n, h, c, e = self.n, self.h, self.c, self.e
        k = kernels.KINDS[self.kind]
        param = self.c ** 0.5 if self.kind == 'dot' else SLOPE
        v = self.value
        empty = v.new_empty(0)
        att = empty if self.att is None else self.att

        def step():
            mx = v.new_full((n, h), float('-inf'))
            sm, out = v.new_zeros(n, h), v.new_zeros(n, h, c)
            impl.forward(k, self.crow, self.src, self.s_src, self.s_dst,
                         empty, att, v, empty, mx, sm, out, param)
            out /= (sm + 1e-16).unsqueeze(-1)
            delta = (self.grad * out).sum(-1)
            w, ds = v.new_empty(e, h), v.new_empty(e, h)
            gd = torch.zeros_like(self.s_dst)
            gv = torch.zeros_like(v)
            gs = gv if k == 1 else torch.zeros_like(self.s_src)
            ga = v.new_zeros(torch.get_num_threads() if v.device.type ==
                             'cpu' else 1, h, c) if k == 1 else empty
            impl.backward_rows(k, self.crow, self.src, self.s_src,
                               self.s_dst, empty, att, v, empty, mx, sm,
                               self.grad, delta, w, ds, gd, empty, ga, param)
            impl.backward_cols(k, self.crow_t, self.col_t, self.perm,
                               self.s_src, self.s_dst, empty, att, self.grad,
                               w, ds, gv, gs, param)
        return step


def measure(args, device):
    rows = []
    for kind in args.kinds:
        chunk = Chunk(kind, args.rows, args.degree, args.heads,
                      args.channels, device)
        row = dict(kind=kind, rows=chunk.n, edges=chunk.e, heads=chunk.h,
                   channels=chunk.c)
        row['torch_eager_s'] = timed(chunk.torch_step(softmax_chunk),
                                     args.repeat, device)
        if device.type == 'cpu':
            from pyg_sar.nn.engine.kernels import cpu
            t = time.perf_counter()
            compiled = torch.compile(softmax_chunk, dynamic=False)
            chunk.torch_step(compiled)()
            row['compile_first_call_s'] = time.perf_counter() - t
            row['torch_compile_s'] = timed(chunk.torch_step(compiled),
                                           args.repeat, device)
            row['fused_s'] = timed(chunk.fused_step(cpu.load()),
                                   args.repeat, device)
        else:
            from pyg_sar.nn.engine.kernels import gpu
            sweep = []
            for block_e, warps in SWEEP:
                gpu.BLOCK_E, gpu.NUM_WARPS = block_e, warps
                sweep.append(dict(block_e=block_e, num_warps=warps,
                                  fused_s=timed(chunk.fused_step(gpu),
                                                args.repeat, device)))
            gpu.BLOCK_E, gpu.NUM_WARPS = None, None
            row['default_s'] = timed(chunk.fused_step(gpu), args.repeat,
                                     device)
            row['sweep'] = sweep
            best = min(sweep, key=lambda r: r['fused_s'])
            row['best'] = best
            row['fused_s'] = best['fused_s']
        row['fused_vs_eager'] = row['fused_s'] / row['torch_eager_s']
        rows.append(row)
        say(row)
        del chunk
    return rows


def say(row):
    extra = ''
    if 'torch_compile_s' in row:
        extra = f", torch.compile {row['torch_compile_s'] * 1e3:8.1f} ms"
    if 'best' in row:
        extra = (f", default launch {row['default_s'] * 1e3:8.1f} ms, best "
                 f"BLOCK_E={row['best']['block_e']} "
                 f"num_warps={row['best']['num_warps']}")
    print(f"  {row['kind']:<6} torch eager {row['torch_eager_s'] * 1e3:8.1f} "
          f"ms, fused {row['fused_s'] * 1e3:8.1f} ms "
          f"(x{row['fused_vs_eager']:.2f}){extra}", flush=True)


def plot(rows, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels = [('torch_eager_s', 'torch operators'),
              ('torch_compile_s', 'torch.compile'),
              ('fused_s', 'fused kernels')]
    width = 0.8 / len(labels)
    for k, (key, label) in enumerate(labels):
        xs = [i + k * width for i, r in enumerate(rows) if key in r]
        ys = [r[key] * 1e3 for r in rows if key in r]
        if ys:
            ax.bar(xs, ys, width, label=label)
    ax.set_xticks([i + width for i in range(len(rows))])
    ax.set_xticklabels([r['kind'] for r in rows])
    ax.set_ylabel('forward + backward (ms)')
    ax.set_title(f"one chunk: {rows[0]['rows']:,} rows, "
                 f"{rows[0]['edges']:,} edges")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--device', default='cpu')
    p.add_argument('--rows', type=int, default=50000)
    p.add_argument('--degree', type=int, default=20)
    p.add_argument('--heads', type=int, default=4)
    p.add_argument('--channels', type=int, default=32)
    p.add_argument('--repeat', type=int, default=5)
    p.add_argument('--kinds', nargs='+', default=list(KINDS), choices=KINDS)
    p.add_argument('--out', default=osp.join(HERE, 'results'))
    args = p.parse_args()
    device = torch.device(args.device)
    name = (torch.cuda.get_device_name(device) if device.type == 'cuda'
            else platform.processor() or 'cpu')
    print(f"{name}: {args.rows} rows x {args.degree} edges, {args.heads} "
          f"heads x {args.channels} channels, {torch.get_num_threads()} "
          f"threads; forward + backward, median of {args.repeat}:")
    os.makedirs(args.out, exist_ok=True)
    rows = measure(args, device)
    result = dict(env=dict(device_name=name, torch=torch.__version__,
                           threads=torch.get_num_threads(), **vars(args)),
                  rows=rows)
    write_results(args.out, 'fused_attention' + (
        '_cuda' if device.type == 'cuda' else ''), result, plot, rows)


if __name__ == '__main__':
    main()
