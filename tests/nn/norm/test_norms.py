"""Distributed norms equal stock PyG/torch on the whole graph: outputs, input
and parameter gradients, running statistics after two steps and eval
outputs, for world sizes 1-3 with uneven (and empty) row splits; plus
converters, state_dict round trips, ``allow_single_element`` and errors.

One spawn per world size runs every case, in a module-scoped fixture; the
parent compares, one test per case. The rows of a rank are a contiguous
block of the input rows (SPLITS).
"""
import pytest
import torch
import torch_geometric.nn as pyg_nn

import pyg_sar
from pyg_sar.nn.norm import NORM_CONVERTERS
from _dist import run_workers
from _exact import Tol, assemble, close, mismatches, report

N, C = 40, 6
SPLITS = {1: [N], 2: [N - 3, 3], 3: [1, 0, N - 1]}
# name: (stock module factory, dtype, feature offset)
CASES = {
    'bn': (lambda: pyg_nn.BatchNorm(C), torch.float32, 0.),
    'bn_cumulative': (lambda: pyg_nn.BatchNorm(C, momentum=None),
                      torch.float32, 0.),
    'bn_no_stats': (lambda: pyg_nn.BatchNorm(C, track_running_stats=False),
                    torch.float32, 0.),
    'bn_no_affine': (lambda: pyg_nn.BatchNorm(C, affine=False),
                     torch.float32, 0.),
    'bn_offset': (lambda: pyg_nn.BatchNorm(C), torch.float32, 1000.),
    'bn_f64': (lambda: pyg_nn.BatchNorm(C), torch.float64, 0.),
    'bn1d': (lambda: torch.nn.BatchNorm1d(C), torch.float32, 0.),
    'bn1d_no_bias': (lambda: torch.nn.BatchNorm1d(C, bias=False),
                     torch.float32, 0.),
    'ln_graph': (lambda: pyg_nn.LayerNorm(C), torch.float32, 0.),
    'ln_graph_offset': (lambda: pyg_nn.LayerNorm(C), torch.float32, 1000.),
    'ln_graph_f64': (lambda: pyg_nn.LayerNorm(C, affine=False),
                     torch.float64, 0.),
    'ln_node': (lambda: pyg_nn.LayerNorm(C, mode='node'), torch.float32, 0.),
    'graph_norm': (lambda: pyg_nn.GraphNorm(C), torch.float32, 0.),
    'graph_norm_offset': (lambda: pyg_nn.GraphNorm(C), torch.float32, 1000.),
    'instance': (lambda: pyg_nn.InstanceNorm(C), torch.float32, 0.),
    'instance_stats': (lambda: pyg_nn.InstanceNorm(
        C, momentum=0.3, affine=True, track_running_stats=True),
        torch.float32, 0.),
    'pair': (lambda: pyg_nn.PairNorm(scale=2.), torch.float32, 0.),
    'pair_individual': (lambda: pyg_nn.PairNorm(scale_individually=True),
                        torch.float32, 0.),
    'diff_group': (lambda: pyg_nn.DiffGroupNorm(C, 3, lamda=0.5),
                   torch.float32, 0.),
}
TOL = {torch.float32: Tol(rtol=1e-4, atol=2e-5),
       torch.float64: Tol(rtol=1e-10, atol=1e-12),
       # x ~ 1000 carries float32 rounding of 6e-5 (both sides); the old
       # E[x^2] - E[x]^2 variance was off by 0.66 here.
       'offset': Tol(rtol=5e-4, atol=1e-4)}


def build(name, distributed):
    """The stock module of a case with non-trivial weights, or its twin."""
    factory, dtype, _ = CASES[name]
    torch.manual_seed(sum(map(ord, name)))
    module = factory().to(dtype)
    with torch.no_grad():
        for param in module.parameters():
            param.uniform_(0.5, 1.5)
    if not distributed:
        return module
    if name == 'diff_group':  # exact once its inner BatchNorm1d is converted
        module.norm = NORM_CONVERTERS[torch.nn.BatchNorm1d](module.norm)
        return module
    return NORM_CONVERTERS[type(module)](module)


def inputs(name):
    _, dtype, offset = CASES[name]
    gen = torch.Generator().manual_seed(0)
    scale = 1 + 0.3 * torch.arange(C, dtype=dtype)
    x = torch.randn(N, C, generator=gen, dtype=dtype) * scale + offset
    x = x + 0.5 * torch.arange(C, dtype=dtype)
    return x, torch.randn(N, C, generator=gen, dtype=dtype)


def run_case(module, x, probe):
    """Step 1 with backward, step 2 on other data, then eval on ``x``."""
    x = x.clone().requires_grad_()
    out = module(x)
    (out * probe).sum().backward()
    grads = {k: p.grad.clone() for k, p in module.named_parameters()
             if p.grad is not None}
    module(x.detach() * 1.5 - 0.25)
    state = {k: v.clone() for k, v in module.state_dict().items()}
    module.eval()
    with torch.no_grad():
        out_eval = module(x.detach())
    return out.detach(), x.grad, grads, state, out_eval


def _worker(rank, world_size):
    sizes = SPLITS[world_size]
    lo, hi = sum(sizes[:rank]), sum(sizes[:rank + 1])
    results = {}
    for name in CASES:
        x, probe = inputs(name)
        results[name] = run_case(build(name, True), x[lo:hi], probe[lo:hi])
    results['single'] = _single_element(rank, world_size)
    return results


def _single_element(rank, world_size):
    """Global node counts 1 and 2 with at most one node per rank."""
    if world_size == 1:
        return None
    got = {}
    x = torch.tensor([[1., 2., 3.], [2., 0., 5.]])
    for total in (1, 2):
        mine = x[rank:rank + 1] if rank < total else x[:0]
        bn = build_single(allow=True)
        got[total] = (bn(mine).detach(), bn.module.running_mean.clone())
        try:
            build_single(allow=False)(mine)
            got[(total, 'error')] = None
        except ValueError as e:
            got[(total, 'error')] = str(e)
    return got


def build_single(allow):
    stock = pyg_nn.BatchNorm(3, allow_single_element=allow)
    with torch.no_grad():
        stock.module.running_mean.fill_(0.5)
        stock.module.running_var.fill_(4.)
        stock.module.weight.fill_(2.)
    return NORM_CONVERTERS[pyg_nn.BatchNorm](stock)


@pytest.fixture(scope='module', params=[1, 2, 3])
def norms_run(request):
    world_size = request.param
    return world_size, run_workers(_worker, world_size, timeout_s=60)


def _ids(world_size):
    """The input rows of every rank."""
    sizes = SPLITS[world_size]
    return [torch.arange(sum(sizes[:r]), sum(sizes[:r + 1]))
            for r in range(world_size)]


@pytest.mark.parametrize('name', list(CASES))
def test_norm_matches_single_process(norms_run, name):
    world_size, results = norms_run
    _, dtype, offset = CASES[name]
    tol = TOL['offset' if offset else dtype]
    x, probe = inputs(name)
    out, x_grad, grads, state, out_eval = run_case(build(name, False), x,
                                                   probe)
    got = [r[name] for r in results]
    what = f'{name} (world {world_size})'
    ids = _ids(world_size)
    failures = mismatches(what, ids, [g[:3] for g in got],
                          (out, x_grad, grads), tol)
    for rank, g in enumerate(got):
        if g[3].keys() != state.keys():
            failures.append(f'{what}: rank {rank} has state '
                            f'{sorted(g[3])}, PyG {sorted(state)}')
            continue
        for key, value in state.items():
            failures += close(g[3][key], value, tol,
                              f'{what} state {key} on rank {rank}')
    failures += close(assemble(ids, [g[4] for g in got], N), out_eval, tol,
                      f'{what} eval output')
    report(failures)


@pytest.mark.parametrize('norms_run', [2, 3], indirect=True)
def test_batch_norm_over_one_or_two_nodes(norms_run):
    _check_single_element([r['single'] for r in norms_run[1]])


def _check_single_element(got):
    x = torch.tensor([[1., 2., 3.], [2., 0., 5.]])
    # One node in the whole graph: running statistics, no update (PyG).
    ref = pyg_nn.BatchNorm(3, allow_single_element=True)
    ref.load_state_dict(build_single(True).state_dict())
    torch.testing.assert_close(got[0][1][0], ref(x[:1]).detach())
    assert got[1][1][0].shape == (0, 3)
    assert all(torch.equal(g[1][1], ref.module.running_mean) for g in got)
    assert all(g[(1, 'error')] and 'more than 1' in g[(1, 'error')]
               for g in got)
    # Two nodes, one per rank: batch statistics although each rank holds a
    # single node, exactly like PyG on the two-node graph.
    expected = ref(x).detach()
    torch.testing.assert_close(torch.cat([g[2][0] for g in got]), expected)
    for g in got:
        torch.testing.assert_close(g[2][1], ref.module.running_mean)
        assert g[(2, 'error')] is None


def test_converters_round_trip_state_dtype_and_frozen_params():
    for name in CASES:
        if name == 'diff_group':
            continue
        stock = build(name, False).double()
        params = dict(stock.named_parameters())
        if params:
            next(iter(params.values())).requires_grad_(False)
        stock.eval()
        twin = NORM_CONVERTERS[type(stock)](stock)
        assert type(twin).__module__.startswith('pyg_sar.nn.norm')
        assert not twin.training
        state, twin_state = stock.state_dict(), twin.state_dict()
        assert state.keys() == twin_state.keys()
        for key, value in state.items():
            assert twin_state[key].dtype == value.dtype, (name, key)
            assert torch.equal(twin_state[key], value), (name, key)
        for key, param in twin.named_parameters():
            assert param.requires_grad == params[key].requires_grad
        fresh = CASES[name][0]().double()
        fresh.load_state_dict(twin_state, strict=True)
    assert isinstance(pyg_sar.nn.BatchNorm(4), pyg_sar.nn.norm.BatchNorm)


def test_no_process_group_and_errors():
    x, probe = inputs('bn_offset')
    for name in ('bn_offset', 'ln_graph_offset', 'pair'):
        got, expected = (run_case(build(name, dist), x, probe)
                         for dist in (True, False))
        for a, b in zip(got[:2], expected[:2]):
            torch.testing.assert_close(a, b, rtol=TOL['offset'].rtol,
                                       atol=TOL['offset'].atol)
    # The old E[x^2] - E[x]^2 formula was off by 0.66 here.
    bn = build('bn_offset', True)
    ref = (x - x.double().mean(0)) / (x.double().var(0, False) + 1e-5).sqrt()
    out = (bn(x) - bn.module.bias) / bn.module.weight
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=2e-4)
    batch = torch.zeros(N, dtype=torch.long)
    for cls in (pyg_sar.nn.norm.LayerNorm, pyg_sar.nn.norm.GraphNorm,
                pyg_sar.nn.norm.InstanceNorm, pyg_sar.nn.norm.PairNorm):
        with pytest.raises(ValueError, match='not supported over a dist'):
            (cls(C) if cls is not pyg_sar.nn.norm.PairNorm else cls())(
                x, batch)
    node = pyg_sar.nn.norm.LayerNorm(C, mode='node')
    torch.testing.assert_close(node(x, batch), node(x))
    with pytest.raises(ValueError, match='more than 1'):
        pyg_sar.nn.norm.BatchNorm1d(C)(x[:1])
    with pytest.raises(ValueError, match='expects node rows'):
        pyg_sar.nn.norm.BatchNorm1d(C)(x.view(N, C, 1))
