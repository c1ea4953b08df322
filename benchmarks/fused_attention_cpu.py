"""One GAT attention chunk on the CPU, forward and backward: the fused C++
kernels (pyg_sar.nn.engine.kernels.cpu) against the same softmax written
with torch operators, eager and under torch.compile (inductor's C++ loops).
Which of the two compiled routes pyg_sar takes on CPU was decided with it.

    python benchmarks/fused_attention_cpu.py --rows 50000 --degree 20
"""
import argparse
import time

import torch
import torch.nn.functional as F

from pyg_sar.nn.engine.kernels import cpu


def softmax_chunk(s_src, s_dst, value, src, dst, rows: int):
    a = F.leaky_relu(s_src[src] + s_dst[dst], 0.2)
    idx = dst.view(-1, 1).expand_as(a)
    m = torch.full((rows, a.shape[1]), float('-inf')).scatter_reduce(
        0, idx, a, 'amax', include_self=True)
    w = (a - m[dst]).exp()
    s = torch.zeros(rows, a.shape[1]).index_add(0, dst, w)
    out = torch.zeros(rows, *value.shape[1:]).index_add(
        0, dst, w.unsqueeze(-1) * value[src])
    return out / (s + 1e-16).unsqueeze(-1)


def timed(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--rows', type=int, default=50000)
    p.add_argument('--degree', type=int, default=20)
    p.add_argument('--heads', type=int, default=4)
    p.add_argument('--channels', type=int, default=32)
    p.add_argument('--repeat', type=int, default=5)
    args = p.parse_args()
    gen = torch.Generator().manual_seed(0)
    n, h, c = args.rows, args.heads, args.channels
    e = n * args.degree
    dst = torch.randint(0, n, (e, ), generator=gen).sort().values
    src = torch.randint(0, n, (e, ), generator=gen)
    s_src = torch.randn(n, h, generator=gen).requires_grad_()
    s_dst = torch.randn(n, h, generator=gen).requires_grad_()
    value = torch.randn(n, h, c, generator=gen).requires_grad_()
    grad = torch.randn(n, h, c, generator=gen)

    def torch_step(fn):
        def step():
            out = fn(s_src, s_dst, value, src, dst, n)
            torch.autograd.grad(out, (s_src, s_dst, value), grad)
        return step

    impl = cpu.load()
    crow = torch.zeros(n + 1, dtype=torch.long)
    crow[1:] = torch.bincount(dst, minlength=n).cumsum(0)
    order = torch.argsort(src, stable=True)
    crow_t = torch.zeros(n + 1, dtype=torch.long)
    crow_t[1:] = torch.bincount(src, minlength=n).cumsum(0)
    col_t = dst[order]
    empty = torch.empty(0)
    ss, sd, val = s_src.detach(), s_dst.detach(), value.detach()

    def fused_step():
        mx = torch.full((n, h), float('-inf'))
        sm, out = torch.zeros(n, h), torch.zeros(n, h, c)
        impl.forward(0, crow, src, ss, sd, empty, empty, val, empty, mx, sm,
                     out, 0.2)
        out /= (sm + 1e-16).unsqueeze(-1)
        delta = (grad * out).sum(-1)
        w, ds = torch.empty(e, h), torch.empty(e, h)
        gd, gv, gs = torch.zeros(n, h), torch.zeros(n, h, c), \
            torch.zeros(n, h)
        impl.backward_rows(0, crow, src, ss, sd, empty, empty, val, empty,
                           mx, sm, grad, delta, w, ds, gd, empty, empty, 0.2)
        impl.backward_cols(0, crow_t, col_t, order, ss, sd, empty, empty,
                           grad, w, ds, gv, gs, 0.2)

    eager = timed(torch_step(softmax_chunk), args.repeat)
    fused = timed(fused_step, args.repeat)
    t = time.perf_counter()
    compiled_fn = torch.compile(softmax_chunk, dynamic=False)
    torch_step(compiled_fn)()
    compile_s = time.perf_counter() - t
    compiled = timed(torch_step(compiled_fn), args.repeat)
    print(f'{n} rows, {e} edges, {h} heads x {c} channels, '
          f'{torch.get_num_threads()} threads; forward + backward, median '
          f'of {args.repeat}:')
    print(f'  torch operators, eager:   {eager * 1e3:8.1f} ms')
    print(f'  torch.compile (inductor): {compiled * 1e3:8.1f} ms '
          f'(first call {compile_s:.0f} s)')
    print(f'  fused C++ kernels:        {fused * 1e3:8.1f} ms')


if __name__ == '__main__':
    main()
