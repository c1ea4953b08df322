"""Failure behaviour, bad input and communication accounting of the engine."""
import os
import time

import pytest
import torch
import torch_geometric

import pyg_sar
from pyg_sar import datasets
from _dist import run_workers

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow


@pytest.fixture(scope='module')
def graph_data():
    return datasets.synthetic_graph(200, 6, 8, 3, seed=11)


@pytest.fixture(scope='module')
def two_parts(graph_data, tmp_path_factory):
    root = str(tmp_path_factory.mktemp('parts') / 'two')
    pyg_sar.partition_graph(graph_data, 2, root)
    return root


def _sage_step(part, graph):
    conv = pyg_sar.nn.SAGEConv(part.x.shape[1], 4)
    conv(part.x, graph).sum().backward()


def _dead_or_hung_peer(rank, world_size, root, failure):
    part = pyg_sar.load_partition(root, rank)
    graph = pyg_sar.DistGraph(part)
    if rank == 1:
        if failure == 'dies':
            os._exit(3)
        time.sleep(25)
        return None
    start = time.perf_counter()
    try:
        _sage_step(part, graph)
    except pyg_sar.PeerError as e:
        return str(e), time.perf_counter() - start
    return 'no error', time.perf_counter() - start


@pytest.mark.parametrize('failure', ['dies', 'hangs'])
def test_dead_or_hung_peer_becomes_an_error_naming_it(two_parts, failure):
    results = run_workers(_dead_or_hung_peer, 2, two_parts, failure,
                          timeout_s=4, expect_errors=True)
    status, payload = results[0]
    assert status == 'ok', payload
    message, elapsed = payload
    assert 'rank 1' in message, message
    assert elapsed < 15, f'took {elapsed:.1f}s to notice'


def _load_other(rank, world_size, roots):
    part = pyg_sar.load_partition(roots[rank], rank)
    try:
        pyg_sar.DistGraph(part)
    except ValueError as e:
        return str(e)
    return 'no error'


def test_mismatched_partitions_fail_before_training(graph_data, two_parts,
                                                    tmp_path):
    other = datasets.synthetic_graph(200, 6, 8, 3, seed=12)
    other_root = str(tmp_path / 'other')
    pyg_sar.partition_graph(other, 2, other_root)
    messages = run_workers(_load_other, 2, [two_parts, other_root],
                           timeout_s=20)
    for message in messages:
        assert 'different partitionings' in message, message


def _wrong_world(rank, world_size, root):
    part = pyg_sar.load_partition(root, rank)
    try:
        pyg_sar.DistGraph(part)
    except ValueError as e:
        return str(e)
    return 'no error'


def test_world_size_must_equal_part_count(graph_data, tmp_path):
    root = str(tmp_path / 'three')
    pyg_sar.partition_graph(graph_data, 3, root)
    messages = run_workers(_wrong_world, 2, root, timeout_s=20)
    for message in messages:
        assert '3 parts but the world size is 2' in message, message


def test_bad_input_is_a_clear_error(graph_data, tmp_path):
    root = str(tmp_path / 'one')
    pyg_sar.partition_graph(graph_data, 1, root)
    part = pyg_sar.load_partition(root, 0)
    with pytest.raises(ValueError, match="mode must be one of"):
        pyg_sar.DistGraph(part, mode='fast')
    with pytest.raises(ValueError, match="chunk_size must be a positive"):
        pyg_sar.DistGraph(part, chunk_size=0)
    graph = pyg_sar.DistGraph(part)
    conv = pyg_sar.nn.SAGEConv(8, 4)
    with pytest.raises(ValueError, match="has 10 rows but this worker owns"):
        conv(part.x[:10], graph)
    # A plain edge_index is a local graph: the stock layer runs
    # (pyg_sar.nn.plain), with the same weights.
    stock = torch_geometric.nn.SAGEConv(8, 4)
    stock.load_state_dict(conv.state_dict())
    assert torch.equal(conv(part.x, part.edge_index),
                       stock(part.x, part.edge_index))
    with pytest.raises(ValueError, match=r"size=\(5, 5\) is not supported"):
        conv.propagate(graph, size=(5, 5), x=part.x)


def _bytes_per_epoch(rank, world_size, root, mode):
    part = pyg_sar.load_partition(root, rank)
    graph = pyg_sar.DistGraph(part, mode=mode)
    conv = pyg_sar.nn.SAGEConv(part.x.shape[1], 4)
    x = part.x.clone().requires_grad_()
    pyg_sar.reset_comm_stats()
    conv(x, graph).sum().backward()
    stats = pyg_sar.comm_stats()
    return stats, graph.halo_bytes(part.x.shape[1])


@pytest.mark.parametrize('mode', ['sar', 'one_shot'])
def test_linear_layer_exchanges_exactly_the_halo_bound(tmp_path, graph_data,
                                                        mode):
    root = str(tmp_path / 'three')
    pyg_sar.partition_graph(graph_data, 3, root)
    results = run_workers(_bytes_per_epoch, 3, root, mode, timeout_s=20)
    received = sum(stats['bytes_received'] for stats, _ in results)
    sent = sum(stats['bytes_sent'] for stats, _ in results)
    bound = sum(halo for _, halo in results)
    assert bound > 0
    # Forward fetches each halo row once; backward sends each gradient
    # row back once; nothing is re-fetched for a linear message.
    assert received == sent == 2 * bound


def _train_losses(rank, world_size, root, use_ddp):
    from torch.nn.parallel import DistributedDataParallel
    from pyg_sar.train import GNN, distributed_loss
    part = pyg_sar.load_partition(root, rank)
    graph = pyg_sar.DistGraph(part)
    torch.manual_seed(3)
    model = pyg_sar.nn.to_distributed(GNN('sage', 8, 16, 3, num_layers=2,
                                          dropout=0.0))
    pyg_sar.sync_params(model)
    if use_ddp:
        model = DistributedDataParallel(model)
        model.register_comm_hook(None, pyg_sar.comm.ddp_sum_hook)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    total = pyg_sar.global_count(part.train_mask)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = distributed_loss(model(part.x, graph), part.y,
                                part.train_mask, total)
        loss.backward()
        if not use_ddp:
            pyg_sar.all_reduce_grads(model)
        opt.step()
        losses.append(float(pyg_sar.comm.all_reduce(loss.detach().clone())))
    return losses


def test_ddp_and_all_reduce_grads_both_equal_single_process(graph_data,
                                                            two_parts):
    import torch.nn.functional as F
    from pyg_sar.train import GNN
    torch.manual_seed(3)
    model = GNN('sage', 8, 16, 3, num_layers=2, dropout=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    expected = []
    for _ in range(5):
        opt.zero_grad()
        out = model(graph_data.x, graph_data.edge_index)
        loss = F.cross_entropy(out[graph_data.train_mask],
                               graph_data.y[graph_data.train_mask])
        loss.backward()
        opt.step()
        expected.append(float(loss))
    for use_ddp in (False, True):
        for losses in run_workers(_train_losses, 2, two_parts, use_ddp,
                                  timeout_s=30):
            torch.testing.assert_close(torch.tensor(losses),
                                       torch.tensor(expected), rtol=1e-4,
                                       atol=1e-5)


def _prefetch_and_split(rank, world_size, root):
    part = pyg_sar.load_partition(root, rank)
    results = []
    for depth, cap in ((0, 256 * 1024 * 1024), (1, 64), (3, 40)):
        pyg_sar.configure(pipeline_depth=depth, max_bytes_per_message=cap)
        pyg_sar.reset_comm_stats()
        graph = pyg_sar.DistGraph(part, mode='sar')
        torch.manual_seed(0)
        conv = pyg_sar.nn.SAGEConv(part.x.shape[1], 4, aggr='max')
        x = part.x.clone().requires_grad_()
        out = conv(x, graph)
        (out * out).sum().backward()
        results.append((out.detach(), x.grad, conv.lin_l.weight.grad,
                        pyg_sar.comm_stats()))
    return results


def test_prefetch_depth_and_message_cap_do_not_change_results(graph_data,
                                                              tmp_path):
    root = str(tmp_path / 'four')
    pyg_sar.partition_graph(graph_data, 4, root)
    for per_rank in run_workers(_prefetch_and_split, 4, root, timeout_s=30):
        reference = per_rank[0]
        for out, grad_x, grad_w, stats in per_rank[1:]:
            assert torch.equal(out, reference[0])
            assert torch.equal(grad_x, reference[1])
            assert torch.equal(grad_w, reference[2])
            # Same bytes, more (smaller) messages under a byte cap.
            assert stats['bytes_received'] == reference[3]['bytes_received']
            assert stats['messages_received'] > \
                reference[3]['messages_received']


@pytest.mark.parametrize('mode', ['sar', 'sa', 'one_shot'])
@pytest.mark.parametrize('conv_cls', ['GATConv', 'GATv2Conv'])
def test_attention_dropout_replays_its_mask_in_backward(graph_data, tmp_path,
                                                        mode, conv_cls):
    root = str(tmp_path / 'one')
    pyg_sar.partition_graph(graph_data, 1, root)
    part = pyg_sar.load_partition(root, 0)
    graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=97)
    torch.manual_seed(0)
    conv = getattr(pyg_sar.nn, conv_cls)(8, 3, heads=2, dropout=0.5).double()
    weights = torch.randn(part.num_local_nodes, 6, dtype=torch.float64)

    def loss(x):
        torch.manual_seed(42)  # the same dropout masks on every call
        return (conv(x, graph) * weights).sum()

    x = part.x.double().requires_grad_()
    loss(x).backward()
    with torch.no_grad():
        conv.eval()
        no_dropout = (conv(x, graph) * weights).sum()
        conv.train()
        assert not torch.isclose(loss(x), no_dropout)
        # Directional derivative: the gradient is that of the function the
        # forward computed with its dropout masks.
        direction = torch.randn_like(x)
        eps = 1e-6
        numeric = (loss(x + eps * direction) -
                   loss(x - eps * direction)) / (2 * eps)
    torch.testing.assert_close((x.grad * direction).sum(), numeric,
                               rtol=1e-5, atol=1e-7)


def test_learnable_edge_weights_get_exact_gradients(graph_data, tmp_path):
    import torch_geometric.nn as pyg_nn
    root = str(tmp_path / 'one')
    pyg_sar.partition_graph(graph_data, 1, root)
    part = pyg_sar.load_partition(root, 0)
    weight = torch.rand(part.num_local_edges) + 0.5
    for mode in ('sar', 'sa', 'one_shot'):
        graph = pyg_sar.DistGraph(part, mode=mode)
        grads = []
        for distributed in (True, False):
            torch.manual_seed(0)
            conv = pyg_nn.GraphConv(8, 4, aggr='mean')
            if distributed:
                conv = pyg_sar.nn.to_distributed(conv)
            w = weight.clone().requires_grad_()
            # One part: local ids are the global ids of the edge index.
            out = conv(part.x, graph if distributed else part.edge_index,
                       edge_weight=w)
            (out ** 2).sum().backward()
            grads.append((out.detach(), w.grad))
        torch.testing.assert_close(grads[0][0], grads[1][0])
        torch.testing.assert_close(grads[0][1], grads[1][1])
    conv = pyg_sar.nn.GCNConv(8, 4)
    with pytest.raises(ValueError, match='learnable edge weights'):
        conv(part.x, pyg_sar.DistGraph(part),
             edge_weight=weight.clone().requires_grad_())


def test_csr_matmul_with_more_entries_than_cells():
    """Duplicate edges can give a chunk more entries than its dense block
    has cells, which cuSPARSE refuses; the product must still be exact."""
    from pyg_sar.nn.engine.sparse import csr_matmul
    crow = torch.tensor([0, 4, 7])
    col = torch.tensor([0, 0, 1, 2, 1, 1, 0])
    values = torch.arange(1.0, 8.0)
    dense = torch.randn(3, 5)
    expected = torch.zeros(2, 5)
    rows = [0, 0, 0, 0, 1, 1, 1]
    for r, c, v in zip(rows, col.tolist(), values):
        expected[r] += v * dense[c]
    torch.testing.assert_close(csr_matmul(crow, col, values, (2, 3), dense),
                               expected)
    small = csr_matmul(crow[:2], col[:4], values[:4], (1, 4), dense.new_zeros(
        4, 5) + 1)
    torch.testing.assert_close(small, values[:4].sum().expand(1, 5))


def test_openmp_wait_policy_is_passive_unless_torch_came_first(monkeypatch):
    """``import pyg_sar`` before torch makes OpenMP threads sleep between
    parallel regions (the contention collapse of issue #29); after torch, or
    with a policy of the user's, it changes nothing, and a DistGraph then
    warns once that threads spin."""
    import logging
    import os
    import subprocess
    import sys
    from pyg_sar.utils import openmp

    env = {k: v for k, v in os.environ.items() if k != 'OMP_WAIT_POLICY'}

    def policy(first, extra=None):
        code = (f"import os; {first}; import pyg_sar, torch; "
                f"print(os.environ.get('OMP_WAIT_POLICY'))")
        return subprocess.run([sys.executable, '-c', code],
                              env={**env, **(extra or {})},
                              capture_output=True, text=True,
                              check=True).stdout.strip()

    assert policy('pass') == 'PASSIVE'
    assert policy('import torch') == 'None'
    assert policy('pass', {'OMP_WAIT_POLICY': 'ACTIVE'}) == 'ACTIVE'

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    openmp.log.addHandler(handler)
    monkeypatch.delenv('OMP_WAIT_POLICY', raising=False)
    monkeypatch.delenv('RANK', raising=False)
    threads = torch.get_num_threads()
    try:
        for rank, num_threads in (('1', 2), ('0', 1)):  # silent: no spin,
            monkeypatch.setenv('RANK', rank)  # or not the first rank
            torch.set_num_threads(num_threads)
            monkeypatch.setattr(openmp, '_WARNED', [])
            openmp.warn_if_spinning()
        assert records == []
        monkeypatch.delenv('RANK')
        torch.set_num_threads(2)
        monkeypatch.setattr(openmp, '_WARNED', [])
        openmp.warn_if_spinning()
        openmp.warn_if_spinning()
    finally:
        torch.set_num_threads(threads)
        openmp.log.removeHandler(handler)
    assert len(records) == 1
    assert 'OMP_WAIT_POLICY=PASSIVE' in records[0].getMessage()
