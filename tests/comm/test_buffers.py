"""The reuse of exchange buffers within a propagation (issue #11):
a buffer is handed out again only when nothing else holds it, the pool is
empty outside a propagation, and results are bitwise those without reuse."""
import pytest
import torch

import pyg_sar
from pyg_sar import comm
from pyg_sar.comm import buffers

from _dist import run_workers
from _graphs import hard_graph


@pytest.fixture(autouse=True)
def _pool_everything():
    old = (comm.config().reuse_buffers, comm.config().reuse_buffers_from)
    comm.configure(reuse_buffers=True, reuse_buffers_from=0)
    yield
    comm.configure(reuse_buffers=old[0], reuse_buffers_from=old[1])


def test_let_go_buffers_are_reused_inside_a_scope_only():
    buffers.empty((100, 8), torch.float32, 'cpu')  # outside: torch.empty
    assert buffers._POOL.buffers == []
    comm.reset_comm_stats()
    with comm.reusing_buffers():
        a = buffers.empty((100, 8), torch.float32, 'cpu')
        ptr = a.data_ptr()
        del a
        b = buffers.empty((50, 3), torch.int64, 'cpu')  # smaller: fits
        assert b.data_ptr() == ptr and b.shape == (50, 3)
        assert b.dtype == torch.int64
        assert comm.comm_stats()['buffers_reused'] == 1
        assert len(buffers._POOL.buffers) == 1
    assert buffers._POOL.buffers == []


def test_buffers_still_held_are_never_handed_out():
    x = torch.randn(64, requires_grad=True)
    with comm.reusing_buffers():
        held = []
        a = buffers.empty((64,), torch.float32, 'cpu')
        view = a[10:20]  # a view keeps the buffer
        held.append(buffers.empty((64,), torch.float32, 'cpu'))
        a2 = buffers.empty((64,), torch.float32, 'cpu')
        saved = (x * a2).sum()  # autograd keeps a2
        del a2
        ptrs = {view.data_ptr() - 40, held[0].data_ptr()}
        for _ in range(3):
            c = buffers.empty((64,), torch.float32, 'cpu')
            assert c.data_ptr() not in ptrs
            ptrs.add(c.data_ptr())
            held.append(c)
        assert view.data_ptr() - 40 in {b.data_ptr() for b in
                                        buffers._POOL.buffers}
        del saved


def test_buffers_too_small_are_dropped_not_kept():
    with comm.reusing_buffers():
        a = buffers.empty((10,), torch.float32, 'cpu')
        del a
        big = buffers.empty((1000,), torch.float32, 'cpu')
        assert [b.numel() for b in buffers._POOL.buffers] == [
            int(4000 * buffers._SLACK) + 64]
        del big


def test_switching_reuse_off():
    with comm.reusing_buffers(enabled=False):
        buffers.empty((32,), torch.float32, 'cpu')
        assert buffers._POOL.buffers == []
    with comm.reusing_buffers():
        a = buffers.empty((32,), torch.float32, 'cpu')
        del a
        comm.configure(reuse_buffers=False)
        buffers.empty((32,), torch.float32, 'cpu')
        assert len(buffers._POOL.buffers) == 1


def test_configure_checks_the_threshold():
    with pytest.raises(ValueError, match='reuse_buffers_from must be >= 0'):
        comm.configure(reuse_buffers_from=-1)


def _layers(rank, world_size, root, reuse):
    comm.configure(reuse_buffers=reuse, reuse_buffers_from=0,
                   halo_slice_bytes=64)
    part = pyg_sar.load_partition(root, rank)
    out, reused = {}, {}
    for mode in ('sar', 'sa', 'one_shot'):
        graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=40)
        for name, conv in (('sage', pyg_sar.nn.SAGEConv(6, 4)),
                           ('gat', pyg_sar.nn.GATConv(6, 3, heads=2)),
                           ('gcn', pyg_sar.nn.GCNConv(6, 5))):
            torch.manual_seed(0)
            conv.reset_parameters()
            comm.reset_comm_stats()
            x = part.x.clone().requires_grad_()
            y = conv(x, graph)
            (y * torch.arange(y.shape[1], dtype=y.dtype)).sum().backward()
            out[(mode, name)] = (y.detach(), x.grad,
                                 [p.grad for p in conv.parameters()])
            reused[(mode, name)] = comm.comm_stats()['buffers_reused']
    return out, reused


def test_results_are_bitwise_those_without_reuse(tmp_path):
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(hard_graph(), 3, root)
    with_reuse = run_workers(_layers, 3, root, True)
    without = run_workers(_layers, 3, root, False)
    # The sliced sparse path and attention's whole-table exchanges (the
    # re-fetch of "sar", the sends of block gradients) both reuse.
    for _, reused in with_reuse:
        assert sum(reused.values()) > 20
        assert reused[('sar', 'sage')] > 0 and reused[('sar', 'gat')] > 0
    assert all(sum(reused.values()) == 0 for _, reused in without)
    for (a, _), (b, _) in zip(with_reuse, without):
        for key in a:
            out_a, grad_a, params_a = a[key]
            out_b, grad_b, params_b = b[key]
            assert torch.equal(out_a, out_b), key
            assert torch.equal(grad_a, grad_b), key
            for pa, pb in zip(params_a, params_b):
                assert torch.equal(pa, pb), key


@pytest.mark.parametrize('heads_first', [False, True])
def test_gather_rows(heads_first):
    table = torch.randn(50, 3, 4)
    index = torch.tensor([7, 0, 49, 7, 12])
    expected = table[index].transpose(0, 1) if heads_first else table[index]
    with comm.reusing_buffers():
        got = buffers.gather_rows(table, index, heads_first)
        assert got.is_contiguous()
        assert torch.equal(got, expected)
        del got
        again = buffers.gather_rows(table, index.flip(0), heads_first)
        assert torch.equal(again, table[index.flip(0)].transpose(0, 1)
                           if heads_first else table[index.flip(0)])


def test_nothing_is_reused_without_a_trustworthy_count(monkeypatch):
    monkeypatch.setattr(buffers, '_ALONE', None)
    with comm.reusing_buffers():  # plain torch.empty, nothing pooled
        a = buffers.empty((64,), torch.float32, 'cpu')
        del a
        buffers.empty((64,), torch.float32, 'cpu')
        assert buffers._POOL.buffers == []
    monkeypatch.setattr(buffers, '_USE_COUNT', lambda cdata: 7)
    assert buffers._count_alone() is None  # a view must count one more
