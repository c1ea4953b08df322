"""The fused attention kernels (C++ and Triton) on small CSR chunks against
the softmax written with torch operators and differentiated by autograd:
outputs, and the gradients of the source and destination score terms, the
values, the edge terms and GATv2's ``att``, in float64, over two chunks
folded one after the other (the online softmax across blocks), with and
without an edge term and a dropout mask, on rows with no edges, duplicate
edges and self loops. The Triton kernels run under ``TRITON_INTERPRET=1`` in
a subprocess (the variable must be set before Triton is imported)."""
import os
import subprocess
import sys

import pytest
import torch
from torch_geometric.utils import softmax

from pyg_sar.nn.engine import kernels

SLOPE = 0.2
DIVISOR = 5 ** 0.5  # the dot score's sqrt(channels)


def _graph(gen, num_src, num_dst, num_edges):
    src = torch.randint(0, num_src, (num_edges, ), generator=gen)
    dst = torch.randint(0, num_dst - 2, (num_edges, ), generator=gen)
    src[:4], dst[:4] = 3, 1  # duplicate edges
    src[4], dst[4] = 2, 2    # a self loop; rows num_dst-2.. have no edges
    return src, dst


def _chunk(src, dst, num_dst, num_src, dtype):
    order = torch.argsort(dst, stable=True)
    src, dst = src[order], dst[order]
    crow = torch.zeros(num_dst + 1, dtype=dtype)
    crow[1:] = torch.bincount(dst, minlength=num_dst).cumsum(0)
    perm = torch.argsort(src, stable=True)
    crow_t = torch.zeros(num_src + 1, dtype=dtype)
    crow_t[1:] = torch.bincount(src, minlength=num_src).cumsum(0)
    return (order, crow, src.to(dtype), crow_t, dst[perm].to(dtype),
            perm.to(dtype))


def _logits(kind, s_src, s_dst, att, edge, src, dst):
    if kind == 'dot':
        key = s_src[src] + (0 if edge is None else edge)
        return (key * s_dst[dst]).sum(-1) / DIVISOR
    if kind == 'gat':
        pre = s_src[src] + s_dst[dst] + (0 if edge is None else edge)
        return torch.nn.functional.leaky_relu(pre, SLOPE)
    pre = s_src[src] + s_dst[dst] + (0 if edge is None else edge)
    return (torch.nn.functional.leaky_relu(pre, SLOPE) * att).sum(-1)


def run_case(impl, kind, with_edge, with_mask, index_dtype, device='cpu',
             scale=1.0, dt=torch.float64):
    """The reference runs on the CPU; the kernels on ``device``. ``scale``
    multiplies the score terms (spreads the logits)."""
    gen = torch.Generator().manual_seed(0)
    num_src, num_dst, heads, ch, num_edges = 9, 8, 2, 5, 40
    src, dst = _graph(gen, num_src, num_dst, num_edges)
    value = torch.randn(num_src, heads, ch, generator=gen, dtype=dt)
    if kind == 'gat':
        s_src = torch.randn(num_src, heads, generator=gen, dtype=dt)
        s_dst = torch.randn(num_dst, heads, generator=gen, dtype=dt)
        edge = torch.randn(num_edges, heads, generator=gen, dtype=dt)
        att = None
    elif kind == 'dot':
        s_src = torch.randn(num_src, heads, ch, generator=gen, dtype=dt)
        s_dst = torch.randn(num_dst, heads, ch, generator=gen, dtype=dt)
        edge = torch.randn(num_edges, heads, ch, generator=gen, dtype=dt)
        att = None
    else:
        s_src = value  # GATv2: the values are the score's source terms
        s_dst = torch.randn(num_dst, heads, ch, generator=gen, dtype=dt)
        edge = torch.randn(num_edges, heads, ch, generator=gen, dtype=dt)
        att = torch.randn(heads, ch, generator=gen, dtype=dt)
    if scale != 1.0:
        s_dst = s_dst * scale
        if kind != 'gatv2':
            s_src = s_src * scale
    edge = edge if with_edge else None
    mask = ((torch.rand(num_edges, heads, generator=gen) > 0.3).to(dt) /
            0.7) if with_mask else None
    grad_out = torch.randn(num_dst, heads, ch, generator=gen, dtype=dt)

    # Reference: torch operators and autograd.
    leaves = [t.clone().requires_grad_() for t in (s_src, s_dst, value)]
    ref_edge = None if edge is None else edge.clone().requires_grad_()
    ref_att = None if att is None else att.clone().requires_grad_()
    r_src, r_dst, r_val = leaves
    if kind == 'gatv2':
        r_src = r_val
    alpha = softmax(_logits(kind, r_src, r_dst, ref_att, ref_edge, src, dst),
                    dst, num_nodes=num_dst)
    if mask is not None:
        alpha = alpha * mask
    ref = torch.zeros(num_dst, heads, ch, dtype=dt).index_add_(
        0, dst, alpha.unsqueeze(-1) * r_val[src])
    ref.backward(grad_out)

    # Kernels: two chunks over the same rows (two blocks), folded in turn.
    param = DIVISOR if kind == 'dot' else SLOPE
    on = lambda t: None if t is None else t.to(device)  # noqa: E731
    s_src, s_dst, value, edge, att, mask, grad_out = map(on, (
        s_src, s_dst, value, edge, att, mask, grad_out))
    if kind == 'gatv2':
        s_src = value
    empty = value.new_empty(0)
    run_max = value.new_full((num_dst, heads), float('-inf'))
    run_sum = value.new_zeros((num_dst, heads))
    out = value.new_zeros((num_dst, heads, ch))
    att_k = empty if att is None else att
    halves = [torch.arange(0, num_edges, 2), torch.arange(1, num_edges, 2)]
    chunks = []
    for part in halves:
        order, crow, col, crow_t, col_t, perm = map(on, _chunk(
            src[part], dst[part], num_dst, num_src, index_dtype))
        ids = part.to(device)[order]
        e = empty if edge is None else edge[ids].contiguous()
        z = empty if mask is None else mask[ids].contiguous()
        chunks.append((ids, crow, col, crow_t, col_t, perm, e, z))
        impl.forward(kernels.KINDS[kind], crow, col, s_src, s_dst, e, att_k,
                     value, z, run_max, run_sum, out, param)
    out = out / (run_sum + 1e-16).unsqueeze(-1)
    delta = (grad_out * out).sum(-1)
    g_val = torch.zeros_like(value)
    g_src = g_val if kind == 'gatv2' else torch.zeros_like(s_src)
    g_dst = torch.zeros_like(s_dst)
    g_edge = None if edge is None else torch.zeros_like(edge)
    g_att = value.new_zeros((torch.get_num_threads(), heads, ch)) \
        if kind == 'gatv2' else empty
    for ids, crow, col, crow_t, col_t, perm, e, z in chunks:
        w = value.new_empty((ids.numel(), heads))
        ds = torch.empty_like(w)
        ge = torch.empty_like(e) if kind != 'gat' and e.numel() else empty
        impl.backward_rows(kernels.KINDS[kind], crow, col, s_src, s_dst, e,
                           att_k, value, z, run_max, run_sum, grad_out,
                           delta, w, ds, g_dst, ge, g_att, param)
        impl.backward_cols(kernels.KINDS[kind], crow_t, col_t, perm, s_src,
                           s_dst, e, att_k, grad_out, w, ds, g_val, g_src,
                           param)
        if g_edge is not None:
            g_edge[ids] = ds if kind == 'gat' else ge
    tol = dict(rtol=1e-10, atol=1e-10) if dt == torch.float64 else \
        dict(rtol=2e-5, atol=2e-5)
    out, g_val, g_src, g_dst, g_edge, g_att = [
        None if t is None else t.cpu()
        for t in (out, g_val, g_src, g_dst, g_edge, g_att)]
    torch.testing.assert_close(out, ref.detach(), **tol)
    torch.testing.assert_close(g_val, r_val.grad, **tol)
    if kind != 'gatv2':
        torch.testing.assert_close(g_src, leaves[0].grad, **tol)
    torch.testing.assert_close(g_dst, r_dst.grad, **tol)
    if g_edge is not None:
        torch.testing.assert_close(g_edge, ref_edge.grad, **tol)
    if kind == 'gatv2':
        torch.testing.assert_close(g_att.sum(0), ref_att.grad, **tol)


CASES = [(kind, e, m, d) for kind in ('gat', 'gatv2', 'dot')
         for e in (False, True)
         for m in (False, True) for d in (torch.int32, torch.int64)
         if not (m and d == torch.int32)]


def _cpu():
    from pyg_sar.nn.engine.kernels import cpu
    impl = cpu.load()
    if impl is None:
        pytest.skip('the C++ kernels could not be built here (no compiler)')
    return impl


@pytest.mark.parametrize('kind,with_edge,with_mask,index_dtype', CASES)
def test_cpu_kernels_equal_autograd(kind, with_edge, with_mask, index_dtype):
    run_case(_cpu(), kind, with_edge, with_mask, index_dtype)


@pytest.mark.parametrize('kind', ['gat', 'gatv2', 'dot'])
@pytest.mark.parametrize('dt', [torch.float32, torch.float64])
def test_cpu_kernels_exp_over_wide_logits(kind, dt):
    """The kernels' own vectorized exp against torch's: logits spread over
    hundreds in float64 (many weights underflowing to 0) and tens in
    float32 (where a logit of hundreds is itself only good to about 1e-5),
    and over a hundredth of a unit."""
    wide = 60.0 if dt == torch.float64 else 15.0
    if kind == 'dot':  # both score terms scale: the logit goes as scale^2
        wide = wide ** 0.5
    for scale in (wide, 0.01):
        run_case(_cpu(), kind, True, False, torch.int64, scale=scale, dt=dt)


_TRITON_SCRIPT = '''
import torch, sys
sys.path.insert(0, {tests!r})
from nn.engine.test_fused_kernels import CASES, run_case
from pyg_sar.nn.engine.kernels import gpu
for case in CASES:
    run_case(gpu, *case)
print('ok', len(CASES))
'''


def test_triton_kernels_equal_autograd_interpreted():
    if not kernels.triton_available():
        pytest.skip('triton is not installed (pip install triton; the test '
                    'extra lists it)')
    tests = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    env = dict(os.environ, TRITON_INTERPRET='1')
    res = subprocess.run([sys.executable, '-c', _TRITON_SCRIPT.format(
        tests=tests)], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == ['ok', str(len(CASES))], res.stdout


@pytest.mark.parametrize('kind,with_edge,with_mask,index_dtype', CASES)
def test_triton_kernels_equal_autograd_on_cuda(kind, with_edge, with_mask,
                                               index_dtype):
    """Compiled for and run on the GPU (skipped where there is none)."""
    if not torch.cuda.is_available() or not kernels.triton_available():
        pytest.skip('needs a CUDA device and triton (the GPU check runs it)')
    from pyg_sar.nn.engine.kernels import gpu
    run_case(gpu, kind, with_edge, with_mask, index_dtype, device='cuda')


# Integer (stride and size) arguments and index pointers of the kernels; the
# other non-constexpr arguments are pointers to the feature dtype.
_INT_ARGS = {'H', 'C'}
_INDEX_ARGS = {'crow', 'col', 'crow_t', 'col_t', 'perm'}


def _signature(fn, dtype, index, constants):
    sig = {}
    for name in fn.arg_names:
        if name in constants:
            sig[name] = 'constexpr'
        elif name in _INT_ARGS or name.endswith(('_n', '_h', '_e')):
            sig[name] = 'i64'
        else:
            sig[name] = '*' + (index if name in _INDEX_ARGS else dtype)
    return sig


def test_triton_kernels_compile_for_a_gpu():
    """Compiled ahead of time for an H100/H200 (sm_90, PTX and cubin by the
    ptxas Triton ships), without a GPU: the interpreter accepts code that
    the compiler refuses (it once hid a non-constexpr global)."""
    if not kernels.triton_available():
        pytest.skip('triton is not installed (pip install triton; the test '
                    'extra lists it)')
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from pyg_sar.nn.engine.kernels import gpu
    target = GPUTarget('cuda', 90, 32)
    failures = []
    for kind in kernels.KINDS.values():
        for dtype, index in (('fp32', 'i32'), ('fp64', 'i64')):
            flags = dict(KIND=kind, HAS_EDGE=True, BLOCK_E=16, BLOCK_C=32)
            cases = [
                (gpu._forward, dict(flags, HAS_MASK=True)),
                (gpu._backward_rows, dict(flags, HAS_MASK=True,
                                          HAS_GE=kind > 0)),
                (gpu._backward_cols, dict(flags, HAS_GV=True, HAS_GS=True,
                                          SAME=kind == 1)),
            ]
            for fn, constants in cases:
                source = ASTSource(
                    fn=fn, signature=_signature(fn, dtype, index, constants),
                    constexprs={(fn.arg_names.index(k), ): v
                                for k, v in constants.items()})
                try:
                    triton.compile(source, target=target)
                except Exception as e:  # noqa: BLE001 (reported below)
                    if 'ptxas' in str(e) and 'not found' in str(e):
                        pytest.skip(f'no ptxas for sm_90 here: {e}')
                    failures.append(f'{fn.__name__} kind={kind} {dtype}: '
                                    f'{str(e)[-600:]}')
    assert not failures, '\n'.join(failures)
