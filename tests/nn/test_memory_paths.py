"""The memory-saving paths (issue #11): the fused ReLU + dropout and
``propagate(add_to=)`` keep results equal, attention chunks stay within the
worker's share and GAT stays exact with them, and the ring holds at most
``pipeline_depth + 1`` fetched steps at once. (SAGE's ``transform_first``:
tests/nn/conv/test_sage_conv.py.)"""
import pytest
import torch
import torch.nn.functional as F

import pyg_sar
from pyg_sar.nn.functional import head_scores, relu_dropout

from _dist import run_workers
from _exact import FLOAT32, Tol, mismatches, report
from _graphs import hard_graph

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow


@pytest.mark.parametrize('p', [0.1, 0.5, 0.7])
def test_relu_dropout_equals_the_stock_pair_for_its_mask(p):
    x = torch.randn(300, 17, requires_grad=True)
    x.data[0, :4] = 0.0  # ReLU's kink: no gradient there, as in PyTorch
    grad = torch.randn(300, 17)
    torch.manual_seed(5)
    keep = torch.empty_like(x).uniform_() >= p  # the documented draw
    after_draw = torch.rand(3)
    expected = F.relu(x) * (keep.float() * (1.0 / (1 - p)))
    expected.backward(grad)
    expected_grad, x.grad = x.grad.clone(), None
    torch.manual_seed(5)
    actual = relu_dropout(x, p=p, training=True)
    assert torch.equal(torch.rand(3), after_draw)  # the same draws consumed
    actual.backward(grad)
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=0)
    torch.testing.assert_close(x.grad, expected_grad, rtol=1e-6, atol=0)
    # A Bernoulli(1 - p) keep mask.
    big = relu_dropout(torch.ones(200_000, requires_grad=True), p=p)
    assert abs(float((big > 0).float().mean()) - (1 - p)) < 0.01
    assert torch.allclose(big[big > 0], torch.tensor(1 / (1 - p)))


def test_relu_dropout_without_grad_or_training():
    x = torch.randn(10, 4)
    assert torch.equal(relu_dropout(x, 0.5, training=False), F.relu(x))
    torch.manual_seed(1)
    a = relu_dropout(x, 0.5)  # no gradient needed: the same draw
    torch.manual_seed(1)
    b = relu_dropout(x.clone().requires_grad_(), 0.5)
    assert torch.equal(a, b.detach())


@pytest.mark.parametrize('heads,channels', [(4, 32), (1, 7), (3, 1)])
def test_head_scores_equal_the_idiom_and_its_gradients(heads, channels):
    gen = torch.Generator().manual_seed(0)
    dt = torch.float64
    h = torch.randn(50, heads, channels, generator=gen, dtype=dt,
                    requires_grad=True)
    atts = [torch.randn(1, heads, channels, generator=gen, dtype=dt,
                        requires_grad=True) for _ in range(2)]
    grads = [torch.randn(50, heads, generator=gen, dtype=dt)
             for _ in range(2)]
    leaves = [h, *atts]
    ours = head_scores(h, *atts)
    expected = [(h * att).sum(-1) for att in atts]
    for a, b in zip(ours, expected):
        assert a.shape == b.shape and a.is_contiguous()
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    g_ours = torch.autograd.grad(ours, leaves, grads)
    g_expected = torch.autograd.grad(expected, leaves, grads)
    for a, b in zip(g_ours, g_expected):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # One vector, no gradient wanted for it; an empty table.
    only, = head_scores(h, atts[0].detach())
    torch.testing.assert_close(only, expected[0], rtol=1e-12, atol=1e-12)
    assert head_scores(h[:0], atts[0])[0].shape == (0, heads)


def test_head_scores_keep_the_idioms_dtype_under_autocast():
    """Under CPU autocast the projection is bfloat16 and the idiom's product
    with the float32 vector promotes to float32: so do the scores."""
    att = torch.randn(1, 2, 3, requires_grad=True)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        h = F.linear(torch.randn(5, 4), torch.randn(6, 4)).view(5, 2, 3)
        ours, = head_scores(h, att)
        expected = (h * att).sum(-1)
    assert h.dtype == torch.bfloat16 and ours.dtype == expected.dtype
    torch.testing.assert_close(ours, expected)
    ours.sum().backward()
    assert att.grad is not None and att.grad.dtype == torch.float32


class _Linear(pyg_sar.nn.DistMessagePassing):
    linear_message = True

    def message(self, x_j):
        return x_j


class _General(pyg_sar.nn.DistMessagePassing):
    def message(self, x_j):
        return x_j * 2.0


def _add_to_results(rank, world_size, root):
    part = pyg_sar.load_partition(root, rank)
    graph = pyg_sar.DistGraph(part)
    results = {}
    for name, conv in (('linear', _Linear(aggr='mean')),
                       ('general', _General(aggr='sum'))):
        x = part.x.clone().requires_grad_()
        base = part.x[:, :6].flip(1).clone().requires_grad_()  # a leaf
        kept = base.detach().clone()
        out = conv.propagate(graph, x=x, add_to=base)
        (out * torch.arange(6.)).sum().backward()
        assert torch.equal(base.detach(), kept)  # a leaf is not written
        root_term = base * 3.0  # not a leaf: added in place on 'linear'
        out2 = conv.propagate(graph, x=x, add_to=root_term)
        results[name] = (out.detach(), x.grad, base.grad,
                         out2.detach() - 2.0 * kept - out.detach())
    return part.orig_ids, results


def test_propagate_add_to_is_the_sum(tmp_path):
    data = hard_graph()
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, 3, root)
    results = run_workers(_add_to_results, 3, root)
    for name, aggr, scale in (('linear', 'mean', 1.0),
                              ('general', 'sum', 2.0)):
        x = data.x.clone().requires_grad_()
        base = data.x[:, :6].flip(1).clone().requires_grad_()
        from torch_geometric.utils import scatter
        src, dst = data.edge_index
        agg = scatter(x[src] * scale, dst, 0, dim_size=data.num_nodes,
                      reduce=aggr)
        expected = base + agg
        (expected * torch.arange(6.)).sum().backward()
        for ids, got in results:
            out, x_grad, base_grad, diff = got[name]
            torch.testing.assert_close(out, expected[ids].detach(),
                                       rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(x_grad, x.grad[ids], rtol=1e-5,
                                       atol=1e-5)
            torch.testing.assert_close(base_grad, base.grad[ids])
            torch.testing.assert_close(diff, torch.zeros_like(diff),
                                       rtol=0, atol=1e-5)


def _ring_buffers(rank, world_size, root, depth):
    import weakref
    from pyg_sar import comm
    part = pyg_sar.load_partition(root, rank)
    graph = pyg_sar.DistGraph(part)
    comm.configure(pipeline_depth=depth, halo_slice_bytes=48)
    fetched, grads, most = [], [], [0, 0, 0]
    post = comm.post_exchange

    def alive(steps):
        return sum(any(r() is not None for r in refs) for refs in steps)

    def counting_post(sends, shapes, device=None, channel='default'):
        if channel == 'default':  # the ring's fetches
            most[0] = max(most[0], alive(fetched))
        else:  # a step's gradients: the previous step's are gone, and so
            # are the rows the step re-fetched (only those in flight stay)
            most[1] = max(most[1], alive(grads))
            most[2] = max(most[2], alive(fetched))
        pending = post(sends, shapes, device, channel)
        (fetched if channel == 'default' else grads).append(
            [weakref.ref(t) for rows in pending._received.values()
             for t in rows])
        return pending

    comm.post_exchange = counting_post
    try:
        torch.manual_seed(0)
        for conv in (pyg_sar.nn.SAGEConv(6, 4),  # sliced: many steps
                     pyg_sar.nn.GATConv(6, 2, heads=2, dropout=0.3)):
            x = part.x.clone().requires_grad_()
            conv(x, graph).sum().backward()
    finally:
        comm.post_exchange = post
    return most, len(fetched), len(grads)


@pytest.mark.parametrize('depth', [0, 1, 2])
def test_ring_holds_at_most_depth_plus_one_fetched_steps(tmp_path, depth):
    """When a step is posted, only the ``pipeline_depth`` steps before it
    may still be held (the one being computed and those in flight): a
    step's rows are dropped before the next is fetched, in forward and in
    the attention backward's re-fetch; and the gradients a step received
    are gone before the next step's gradients are posted, as are the rows
    the step re-fetched."""
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(hard_graph(), 4, root)
    for (most, most_grads, fetched_at_grads), posts, grad_posts in \
            run_workers(_ring_buffers, 4, root, depth):
        assert posts > 12  # many halo slices, three peers
        assert grad_posts > 12
        assert most <= depth
        assert most_grads == 0
        assert fetched_at_grads <= depth


def test_loop_view_maps_edges_back_only_when_edge_attributes_need_it(
        tmp_path):
    # The self-loop view of GAT and GCN keeps the positions of the dropped
    # loops, not an int64 per edge; the view-to-base map is built (and
    # cached) when an edge attribute is mapped onto the view.
    root = str(tmp_path / 'parts')
    data = hard_graph()  # self loops, duplicate edges, isolated nodes
    pyg_sar.partition_graph(data, 1, root)
    graph = pyg_sar.DistGraph(pyg_sar.load_partition(root, 0))
    view = graph.with_self_loops()
    assert 'kept_base_edges' not in view.derived
    assert not hasattr(view, 'base_edge_pos')
    src, dst, pos = (t.long() for t in graph._block_edges[graph.rank])
    is_loop = src == dst
    assert int(is_loop.sum()) > 0
    assert view.dropped_loops.numel() == int(is_loop.sum())
    expected = pos[~is_loop].sort().values
    assert torch.equal(view.kept_base_edges(), expected)
    assert 'kept_base_edges' in view.derived
    values = torch.arange(graph.num_edges, dtype=torch.float)
    mapped = view.expand_edge_values(values, fill_value=-1.0)
    assert torch.equal(mapped[:expected.numel()], expected.float())
    assert torch.equal(mapped[expected.numel():],
                       torch.full((graph.num_nodes, ), -1.0))
    # With keep_existing_loops, a node's added loop takes its existing
    # loop's value (the last one of duplicates, as PyG keeps).
    kept = view.expand_edge_values(values, keep_existing_loops=True)
    loops = kept[expected.numel():]
    for node in dst[is_loop].unique().tolist():
        last = pos[is_loop & (dst == node)].max()
        assert float(loops[node]) == float(last)


def test_transposed_chunk_csrs_of_one_cut_share_one_buffer(tmp_path):
    # The backward's transposed CSRs live as long as the graph; built chunk
    # by chunk between the engine's temporaries they would pin holes in the
    # C heap, so the first request builds those of every chunk of the cut
    # into one buffer, with and without the edge permutation.
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(hard_graph(), 1, root)
    graph = pyg_sar.DistGraph(pyg_sar.load_partition(root, 0))
    block = graph.local_block
    chunks = block.chunked(7)
    assert len(chunks) > 3

    def expected(chunk):
        order = torch.argsort(chunk.src.long(), stable=True)
        crow = torch.zeros(block.num_src + 1, dtype=torch.long)
        crow[1:] = torch.bincount(chunk.src.long(),
                                  minlength=block.num_src).cumsum(0)
        return crow, chunk.dst.long()[order] - chunk.row_start, order

    def storages():
        return {t.untyped_storage().data_ptr() for c in chunks
                for t in c._csr_t if t is not None}

    chunks[2].csr_transposed(block.num_src, with_perm=False)
    assert all(c._csr_t is not None and c._csr_t[2] is None for c in chunks)
    assert len(storages()) == 1
    for chunk in chunks:
        crow, col, order = expected(chunk)
        assert torch.equal(chunk._csr_t[0].long(), crow)
        assert torch.equal(chunk._csr_t[1].long(), col)
    # A weighted product asks for the permutation: all are rebuilt with it.
    chunks[0].csr_transposed(block.num_src, with_perm=True)
    assert len(storages()) == 1
    for chunk in chunks:
        crow, col, order = expected(chunk)
        got = chunk.csr_transposed(block.num_src, with_perm=False)
        assert torch.equal(got[0].long(), crow)
        assert torch.equal(got[1].long(), col)
        assert torch.equal(got[2].long(), order)
    # Another cut of the same block has its own buffer.
    other = block.chunked(5)
    other[0].csr_transposed(block.num_src)
    assert other[0]._csr_t[0].untyped_storage().data_ptr() not in storages()


def test_chunks_span_at_most_max_rows_destinations():
    # A chunk ends at its edge limit or after max_rows destination rows,
    # whichever comes first; a block with many edges per row is cut by
    # edges alone, exactly as without the row limit.
    from pyg_sar.graph.blocks import _make_chunks
    gen = torch.Generator().manual_seed(0)
    dst = torch.randint(0, 200, (300, ), generator=gen).sort().values.int()
    src = torch.randint(0, 50, (300, ), generator=gen).int()
    pos = torch.arange(300)
    for max_edges, max_rows in ((64, 16), (None, 16), (1000, 7), (64, 1)):
        chunks = _make_chunks(src, dst, pos, max_edges, 200,
                              max_rows=max_rows)
        assert torch.equal(torch.cat([c.edge_pos for c in chunks]), pos)
        assert all(c.num_edges > 0 for c in chunks)
        assert max(c.row_end - c.row_start for c in chunks) <= max_rows
        if max_edges is not None:
            assert max(c.num_edges for c in chunks) <= max_edges
    # Few edges per row (a peer's block): more chunks than by edges alone.
    assert len(_make_chunks(src, dst, pos, 64, 200, max_rows=16)) > \
        len(_make_chunks(src, dst, pos, 64, 200))
    # Many edges per row: the edge limit binds, the cut is unchanged.
    dense = torch.arange(30).repeat_interleave(10).int()
    cut = _make_chunks(src, dense, pos, 64, 30, max_rows=16)
    plain = _make_chunks(src, dense, pos, 64, 30)
    assert [(c.row_start, c.row_end, c.num_edges) for c in cut] == \
        [(c.row_start, c.row_end, c.num_edges) for c in plain]


def _weights(columns: int) -> torch.Tensor:
    """Unit-scale loss weights per output column."""
    return torch.arange(float(columns)).cos()


def _gat_outputs(rank, world_size, root, budget, mode, dims=(6, 4, 2)):
    """A GATConv(in, channels, heads=...) of ``dims`` on the partition:
    ``(ids, out, x_grad, param_grads, chunks)``, with the ``(rows spanned,
    edges)`` of every non-empty chunk the engine ran."""
    from pyg_sar import comm
    from pyg_sar.graph.blocks import EdgeBlock
    from torch_geometric.nn import GATConv as PygGATConv
    if budget is not None:
        comm.configure(edge_memory_budget=budget)
    part = pyg_sar.load_partition(root, rank)
    graph = pyg_sar.DistGraph(part, mode=mode)
    torch.manual_seed(0)
    conv = pyg_sar.nn.to_distributed(torch.nn.Sequential(
        PygGATConv(dims[0], dims[1], heads=dims[2])))[0]
    x = part.x.clone().requires_grad_()
    cuts, chunked = [], EdgeBlock.chunked

    def recording(block, *args, **kwargs):  # the cuts the engine runs
        chunks = chunked(block, *args, **kwargs)
        cuts.extend((c.row_end - c.row_start, c.num_edges) for c in chunks
                    if c.num_edges > 0)
        return chunks

    EdgeBlock.chunked = recording
    try:
        out = conv(x, graph)
        (out * _weights(out.size(1))).sum().backward()
    finally:
        EdgeBlock.chunked = chunked
    return (part.orig_ids, out.detach(), x.grad,
            {n: p.grad for n, p in conv.named_parameters()}, cuts)


# On a graph of tens of thousands of edges, float32 sums in another order
# differ by a few ulps of the tensor's largest entry: the absolute tolerance
# is 1e-6 of it, and at least 1e-5 (FLOAT32's).
FLOAT32_LARGE = Tol(rtol=1e-4, atol=1e-6, scaled=True, floor=10.0)


def _gat_against_pyg(tmp_path, data, world_size, budget, mode, dims,
                     tol=FLOAT32):
    """Runs :func:`_gat_outputs` on ``world_size`` parts of ``data``,
    asserts that outputs and every gradient are stock PyG's (within
    ``tol``), and returns the workers' results (with their chunk cuts)."""
    from torch_geometric.nn import GATConv as PygGATConv
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, world_size, root)
    torch.manual_seed(0)
    ref = PygGATConv(dims[0], dims[1], heads=dims[2])
    x = data.x.clone().requires_grad_()
    expected = ref(x, data.edge_index)
    (expected * _weights(dims[1] * dims[2])).sum().backward()
    results = run_workers(_gat_outputs, world_size, root, budget, mode, dims)
    report(mismatches(
        f'GATConv{dims} budget={budget} mode={mode} world={world_size}',
        [r[0] for r in results], [r[1:4] for r in results],
        (expected.detach(), x.grad,
         {n: p.grad for n, p in ref.named_parameters()}), tol))
    return results


@pytest.mark.parametrize('world_size,mode', [(1, 'sar'), (3, 'sar'),
                                             (3, 'sa'), (3, 'one_shot')])
def test_gat_with_row_limited_chunks_matches_pyg(tmp_path, world_size, mode,
                                                 monkeypatch):
    # A 32 KiB edge budget limits attention chunks to 16 destination rows
    # (edge_memory_budget / 2 KiB): the per-head products of every chunk,
    # a peer's blocks included, then cover few rows. Outputs and every
    # gradient stay those of stock PyG. (The separate-operator path's
    # sparse value products: the fused kernels build no per-head
    # node-sized results and need no row limit.)
    monkeypatch.setenv('PYG_SAR_FUSED', '0')
    results = _gat_against_pyg(tmp_path, hard_graph(), world_size,
                               32 * 1024, mode, (6, 4, 2))
    for *_, cuts in results:
        spans = [span for span, _ in cuts]
        assert max(spans) <= 16 and len(spans) > world_size


@pytest.mark.parametrize('fused', [True, False])
@pytest.mark.parametrize('world_size', [1, 2])
def test_attention_chunks_fall_with_the_worker_share(tmp_path, world_size,
                                                     fused, monkeypatch):
    # At the default 16 MiB edge budget, a worker whose value table (its
    # nodes x 4 heads x 32 channels, 4 B each: 2 MiB here at one worker)
    # is smaller than the budget keeps a chunk's temporaries within that
    # table: at least 256 B of them per edge, so at most table / 256
    # edges per chunk (the fixed budget cut 32,768). The fused kernels
    # keep at least four [E, heads] float32 tensors per edge (64 B): at
    # most table / 64 edges. Outputs and every gradient stay those of
    # stock PyG.
    from pyg_sar.datasets import synthetic_graph
    monkeypatch.setenv('PYG_SAR_FUSED', '1' if fused else '0')
    per_edge = 64 if fused else 256
    results = _gat_against_pyg(tmp_path, synthetic_graph(4000, 10, 16, 4),
                               world_size, None, 'sar', (16, 32, 4),
                               FLOAT32_LARGE)
    for ids, *_, cuts in results:
        table = ids.numel() * 4 * 32 * 4
        assert max(edges for _, edges in cuts) <= \
            max(1 << 20, table) // per_edge


@pytest.mark.parametrize('num_nodes,expected', [
    (100_000, 32_768),  # a 51 MB table: the 16 MiB budget binds
    (10_000, 10_000),   # a 5 MB table binds: one edge per node
    (1_000, 8_192),     # 1 MiB floor, then the 8192-edge minimum
])
def test_whole_neighborhood_chunks_fall_with_the_worker_share(num_nodes,
                                                              expected):
    # The whole-neighborhood path cuts chunks whose per-edge copy of the
    # input rows (here 96 + 32 floats: 512 B) stays within the engine's
    # edge budget, which a worker of fewer nodes caps at its own node-sized
    # table of those rows (the fixed budget cut 32,768 edges at any size).
    from types import SimpleNamespace

    from pyg_sar.nn.neighborhood import chunk_limit
    graph = SimpleNamespace(num_nodes=num_nodes, chunk_size=None)
    tensors = [torch.zeros(num_nodes, 96), torch.zeros(num_nodes, 2, 16),
               torch.zeros(())]
    assert chunk_limit(None, graph, tensors) == expected
    graph.chunk_size = 19  # the graph's own chunk size wins
    assert chunk_limit(None, graph, tensors) == 19
