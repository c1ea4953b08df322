"""Defaults that fit the device: the process-group backend a worker gets
(GPU machines, CPU jobs on them, several ranks per GPU) and the engine's edge
budget, with the device's capacity injected so that no GPU is needed."""
from __future__ import annotations

import pytest
import torch

from pyg_sar import comm
from pyg_sar.comm.process_group import pick_backend
from pyg_sar.utils import device as dev
from pyg_sar.utils.device import DeviceCapacity, MiB, GiB


@pytest.mark.parametrize('device,gpus,local,expected', [
    (None, 0, 4, 'gloo'),          # a CPU machine
    (None, 1, 1, 'nccl'),          # one rank per GPU
    (None, 8, 8, 'nccl'),
    (None, 1, 4, 'gloo'),          # 4 ranks share one GPU
    ('cuda', 2, 3, 'gloo'),
    ('cpu', 8, 8, 'gloo'),         # a CPU job on a GPU machine
    ('auto', 1, 1, 'nccl'),
])
def test_backend_fits_ranks_and_gpus(monkeypatch, device, gpus, local,
                                     expected):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: gpus > 0)
    assert pick_backend(None, device, gpus, local) == expected


def test_nccl_with_more_ranks_than_gpus_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    with pytest.raises(ValueError, match=r"backend='nccl' needs one GPU per "
                       r"local rank, but LOCAL_WORLD_SIZE=4 and 1 GPU"):
        pick_backend('nccl', None, 1, 4)
    assert pick_backend('gloo', None, 1, 4) == 'gloo'


def test_bad_backend_or_device_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    with pytest.raises(ValueError, match="backend must be"):
        pick_backend('tcp', None, 0, 1)
    with pytest.raises(ValueError, match="CUDA is not available"):
        pick_backend(None, 'cuda', 0, 1)
    with pytest.raises(ValueError, match="device must be"):
        pick_backend(None, 'meta', 0, 1)


def test_init_distributed_shares_one_gpu_over_gloo(monkeypatch):
    # torchrun --nproc-per-node 4 on a one-GPU machine: every rank joins a
    # gloo group on GPU r % 1 instead of dying in NCCL ("invalid device
    # ordinal"). The group itself is faked: only the choice is under test.
    from pyg_sar.comm import process_group as pg
    calls = {}
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 1)
    monkeypatch.setattr(torch.cuda, 'set_device',
                        lambda i: calls.setdefault('gpu', i))
    monkeypatch.setattr(pg.dist, 'is_initialized', lambda: False)
    monkeypatch.setattr(pg.dist, 'init_process_group',
                        lambda backend, **kw: calls.setdefault('backend',
                                                               backend))
    monkeypatch.setattr(pg, '_destroy_groups_at_exit', lambda: None)
    monkeypatch.setattr(pg, '_AFTER_INIT', [])
    for key, value in dict(RANK='3', WORLD_SIZE='4', LOCAL_RANK='3',
                           LOCAL_WORLD_SIZE='4', MASTER_ADDR='127.0.0.1',
                           MASTER_PORT='1').items():
        monkeypatch.setenv(key, value)
    assert pg.init_distributed() == (3, 4)
    assert calls == {'gpu': 0, 'backend': 'gloo'}


@pytest.fixture
def injected():
    yield dev.set_device_capacity
    dev.set_device_capacity(None, 'cpu')
    dev.set_device_capacity(None, 'cuda')


@pytest.mark.parametrize('cache,budget', [
    (32 * MiB, 16 * MiB),     # this machine's L3: the budget tuned here
    (1 * MiB, 4 * MiB),       # a tiny cache: never below 4 MiB
    (256 * MiB, 64 * MiB),    # a huge one: at most 64 MiB
    (48 * MiB, 16 * MiB),     # rounded down to a power of two
])
def test_cpu_budget_follows_the_cache(injected, cache, budget):
    injected(DeviceCapacity('cpu', cache), 'cpu')
    assert dev.default_edge_budget(torch.device('cpu')) == budget
    assert comm.config().budget_for('cpu') == budget


@pytest.mark.parametrize('free,budget', [
    (140 * GiB, 1 * GiB),     # an idle H200: the cap
    (8 * GiB, 512 * MiB),     # a sixteenth of what is free
    (256 * MiB, 64 * MiB),    # nearly full: never below 64 MiB
])
def test_gpu_budget_follows_free_memory(injected, free, budget):
    injected(DeviceCapacity('cuda', 50 * MiB, free), 'cuda')
    assert dev.default_edge_budget(torch.device('cuda', 0)) == budget
    # A configured budget wins over the device's default; 'auto' restores it.
    comm.configure(edge_memory_budget=3 * MiB)
    try:
        assert comm.config().budget_for(torch.device('cuda', 0)) == 3 * MiB
    finally:
        comm.configure(edge_memory_budget='auto')
    assert comm.config().budget_for(torch.device('cuda', 0)) == budget


def test_injected_capacity_of_the_wrong_kind_is_refused():
    with pytest.raises(ValueError, match="kind 'cuda' given for devices of "
                       "kind 'cpu'"):
        dev.set_device_capacity(DeviceCapacity('cuda', 0, 1), 'cpu')


def test_engine_chunks_follow_the_injected_capacity(injected, tmp_path):
    # The same GAT propagation is cut into more chunks on a device with a
    # small cache than on one with a large cache, and gives stock PyG's
    # outputs and gradients either way.
    import pyg_sar
    from pyg_sar.graph.blocks import EdgeBlock
    from torch_geometric.data import Data
    from torch_geometric.nn import GATConv
    torch.manual_seed(0)
    # Big enough that the worker's value table (40k rows of 4 x 32 floats)
    # does not cap the budget below either device's.
    n = 40000
    data = Data(x=torch.randn(n, 8), edge_index=torch.randint(0, n, (2,
                                                                    200000)))
    pyg_sar.partition_graph(data, 1, str(tmp_path))
    part = pyg_sar.load_partition(str(tmp_path), 0)
    graph = pyg_sar.DistGraph(part)
    ref = GATConv(8, 32, heads=4)
    x = data.x.clone().requires_grad_()
    expected = ref(x, data.edge_index)
    expected.square().sum().backward()
    order = part.orig_ids
    chunked = EdgeBlock.chunked
    counts = {}
    for cache in (8 * MiB, 128 * MiB):
        injected(DeviceCapacity('cpu', cache), 'cpu')
        conv = pyg_sar.nn.to_distributed(torch.nn.Sequential(
            GATConv(8, 32, heads=4)))[0]
        conv.load_state_dict(ref.state_dict())
        cuts = []

        def recording(block, *args, **kwargs):
            chunks = chunked(block, *args, **kwargs)
            cuts.extend(c for c in chunks if c.num_edges > 0)
            return chunks
        EdgeBlock.chunked = recording
        try:
            xs = part.x.clone().requires_grad_()
            out = conv(xs, graph)
            out.square().sum().backward()
        finally:
            EdgeBlock.chunked = chunked
        counts[cache] = len(cuts)
        torch.testing.assert_close(out, expected[order].detach(),
                                   rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(xs.grad, x.grad[order], rtol=1e-4,
                                   atol=1e-4)
        for (name, p), q in zip(ref.named_parameters(), conv.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-3,
                                       msg=name)
    assert counts[8 * MiB] > counts[128 * MiB] >= 1


def test_importing_the_package_changes_nothing_in_the_process():
    # No global module hook and no warnings filter on import (the guard
    # that names to_distributed is a per-layer hook: test_conversion).
    import subprocess
    import sys
    code = '''
import sys, warnings, torch
from torch.nn.modules import module
callers = []
def recording(original):
    def wrapper(*args, **kwargs):
        callers.append(sys._getframe(1).f_globals.get('__name__', '?'))
        return original(*args, **kwargs)
    return wrapper
warnings.filterwarnings = recording(warnings.filterwarnings)
warnings.simplefilter = recording(warnings.simplefilter)
hooks = len(module._global_forward_pre_hooks)
import pyg_sar, pyg_sar.nn, pyg_sar.graph, pyg_sar.loader, pyg_sar.train
assert len(module._global_forward_pre_hooks) == hooks, 'a module hook'
ours = [c for c in callers if c.startswith('pyg_sar')]
assert not ours, f'warnings filters set on import by {ours}'
print('clean')
'''
    run = subprocess.run([sys.executable, '-c', code], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and 'clean' in run.stdout, run.stderr
