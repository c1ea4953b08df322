"""``TransformerConv`` converted by ``to_distributed`` (the engine twin,
online softmax) equals single-process PyG: outputs, input gradients and
every parameter gradient, at world sizes 1-3, in every mode, chunked and
not, float64 where it matters, on a graph with self loops, duplicate edges,
isolated nodes and a hub; with edge features, ``concat=False``, several
heads, ``beta``, ``root_weight=False``, bipartite inputs, raw edge values
without ``edge_dim``, and a loss curve with a part without training nodes.
A stock layer with another aggregation takes the whole-neighborhood path
and is exact too. A converted layer keeps the stock ``state_dict`` and is
the stock layer on a plain ``edge_index``.

One spawn per world size runs every case, in a module-scoped fixture; the
parent compares, one test per case.
"""
import copy
from types import SimpleNamespace

import pytest
import torch
import torch_geometric.nn as pyg_nn

import pyg_sar
from _dist import run_workers
from _exact import (BY_DTYPE, FLOAT32, close, mismatches, report,
                    train_curve)
from _graphs import hard_graph, last_part_untrained, last_rank_untrained

# The multi-process runs: deselect with -m "not slow".
slow = pytest.mark.slow

C = 6        # input channels
C_DST = 5    # destination channels of the bipartite case
CHUNK = 13   # cuts every block into many chunks
MODES = ('sar', 'sa', 'one_shot')

# case -> (constructor, call style): 'x' conv(x, g), 'a' with edge_attr,
# 'raw' with per-edge values added to the values (no edge_dim), 'bi'
# conv((x, x_dst), g).
CASES = {
    'default': (lambda: pyg_nn.TransformerConv(C, 4), 'x'),
    'edge_beta': (lambda: pyg_nn.TransformerConv(
        C, 3, heads=2, edge_dim=3, beta=True), 'a'),
    'mean_no_root': (lambda: pyg_nn.TransformerConv(
        C, 3, heads=3, concat=False, root_weight=False, bias=False), 'x'),
    'mean_edge_beta': (lambda: pyg_nn.TransformerConv(
        C, 4, heads=2, concat=False, beta=True, edge_dim=3), 'a'),
    'bipartite': (lambda: pyg_nn.TransformerConv((C, C_DST), 4, heads=2),
                  'bi'),
    'raw_edge': (lambda: pyg_nn.TransformerConv(C, 4, heads=2), 'raw'),
    'eval_dropout': (lambda: pyg_nn.TransformerConv(
        C, 4, heads=2, dropout=0.5).eval(), 'x'),
    'aggr_mean': (lambda: pyg_nn.TransformerConv(C, 4, heads=2,
                                                 aggr='mean'), 'x'),
}
FLOAT64 = ('default', 'edge_beta')
TWIN = set(CASES) - {'aggr_mean'}


def build(case: str, dist: bool):
    torch.manual_seed(1234)
    make, style = CASES[case]
    module = make()
    if dist:
        module = pyg_sar.nn.to_distributed(copy.deepcopy(module))
        assert isinstance(module, pyg_sar.nn.TransformerConv) == \
            (case in TWIN), (case, type(module))
    return module, style


def graph_data():
    """The hard graph with destination features for the bipartite case
    and raw per-edge values (partitioned with the edges)."""
    data = hard_graph()
    gen = torch.Generator().manual_seed(21)
    data.x_dst = torch.randn(data.num_nodes, C_DST, generator=gen)
    data.edge_raw = torch.randn(data.edge_index.size(1), 4, generator=gen)
    return data


def evaluate(module, style, x, graph, edge_attr, x_dst, raw, probe, dtype):
    module = module.to(dtype)
    x = x.to(dtype).clone().requires_grad_()
    if style == 'a':
        out = module(x, graph, edge_attr.to(dtype))
    elif style == 'raw':
        out = module(x, graph, raw.to(dtype).view(-1, 1, 4))
    elif style == 'bi':
        out = module((x, x_dst.to(dtype)), graph)
    else:
        out = module(x, graph)
    (out * probe[:, :out.shape[1]].to(dtype)).sum().backward()
    return (out.detach(), x.grad,
            {n: p.grad for n, p in module.named_parameters()})


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = pyg_nn.TransformerConv(C, 4, heads=2, edge_dim=3,
                                            beta=True)
        self.conv2 = pyg_nn.TransformerConv(8, 3, heads=2, concat=False)

    def forward(self, x, edge_index, edge_attr):
        h = self.conv1(x, edge_index, edge_attr).relu()
        return self.conv2(h, edge_index)


def loss_curve(x, edge_index, edge_attr, y, mask, total, epochs=5,
               dist=False):
    if dist:
        assert isinstance(pyg_sar.nn.to_distributed(Net()).conv1,
                          pyg_sar.nn.TransformerConv)
    return train_curve(Net, (x, edge_index, edge_attr), y, mask, total,
                       epochs, dist)


def _refusals(part):
    graph = pyg_sar.DistGraph(part)
    conv = pyg_sar.nn.to_distributed(pyg_nn.TransformerConv(C, 4,
                                                            edge_dim=3))
    found = {}
    for name, call in (
            ('weights', lambda: conv(part.x, graph, part.edge_attr,
                                     return_attention_weights=True)),
            ('no_edge_attr', lambda: conv(part.x, graph))):
        try:
            call()
            found[name] = None
        except ValueError as e:
            found[name] = str(e)
    return found


def _worker(rank, world_size, root, probe):
    part = pyg_sar.load_partition(root, rank)
    ids = part.orig_ids
    results = {'ids': ids, 'refusals': _refusals(part)}
    mask = last_rank_untrained(part.train_mask, rank, world_size)
    graph = pyg_sar.DistGraph(part, chunk_size=CHUNK)
    results['curve'] = loss_curve(part.x, graph, part.edge_attr, part.y,
                                  mask, pyg_sar.global_count(mask),
                                  dist=True)
    for mode in MODES:
        for chunk in (None, CHUNK):
            graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk)
            for case in CASES:
                for dtype in dtypes(case):
                    module, style = build(case, dist=True)
                    results[(mode, chunk, case, dtype)] = evaluate(
                        module, style, part.x, graph, part.edge_attr,
                        part.x_dst, part.edge_raw, probe[ids], dtype)
    return results


def dtypes(case):
    return ((torch.float32, torch.float64) if case in FLOAT64
            else (torch.float32, ))


@pytest.fixture(scope='module', params=[1, 2, 3])
def tconv_run(request, tmp_path_factory):
    world_size = request.param
    data = graph_data()
    root = str(tmp_path_factory.mktemp('parts'))
    pyg_sar.partition_graph(data, world_size, root)
    probe = torch.randn(data.num_nodes, 16,
                        generator=torch.Generator().manual_seed(99))
    results = run_workers(_worker, world_size, root, probe, timeout_s=240)
    return SimpleNamespace(world_size=world_size, data=data, root=root,
                           probe=probe,
                           results=results, ids=[r['ids'] for r in results])


@slow
@pytest.mark.parametrize('case', list(CASES))
def test_transformer_conv_equals_single_process(tconv_run, case):
    run, data = tconv_run, tconv_run.data
    failures = []
    for dtype in dtypes(case):
        module, style = build(case, dist=False)
        ref = evaluate(module, style, data.x, data.edge_index,
                       data.edge_attr, data.x_dst, data.edge_raw, run.probe,
                       dtype)
        for mode in MODES:
            for chunk in (None, CHUNK):
                failures += mismatches(
                    f'{case} {dtype} mode={mode} chunk={chunk} '
                    f'world={run.world_size}', run.ids,
                    [r[(mode, chunk, case, dtype)] for r in run.results],
                    ref, BY_DTYPE[dtype])
    report(failures)


@slow
def test_loss_curve_equals_single_process(tconv_run):
    run, data = tconv_run, tconv_run.data
    mask = last_part_untrained(data.train_mask, run.root, run.world_size)
    expected = torch.tensor(loss_curve(data.x, data.edge_index,
                                       data.edge_attr, data.y, mask,
                                       int(mask.sum())))
    report([line for rank, r in enumerate(run.results)
            for line in close(torch.tensor(r['curve']), expected, FLOAT32,
                              f'world={run.world_size} loss curve on rank '
                              f'{rank}')])


@slow
def test_refusals_name_the_feature(tconv_run):
    for r in tconv_run.results:
        assert 'return_attention_weights' in r['refusals']['weights']
        assert 'edge_attr of shape [num_edges, 3]' in \
            r['refusals']['no_edge_attr']


def test_state_dict_round_trips_with_the_stock_model():
    torch.manual_seed(3)
    stock = Net()
    model = pyg_sar.nn.to_distributed(copy.deepcopy(stock))
    assert isinstance(model.conv1, pyg_sar.nn.TransformerConv)
    assert isinstance(model.conv2, pyg_sar.nn.TransformerConv)
    ours, theirs = model.state_dict(), stock.state_dict()
    assert list(ours) == list(theirs)
    for key, value in theirs.items():
        assert torch.equal(value, ours[key]), key
    fresh = Net()
    fresh.load_state_dict(model.state_dict())
    data = hard_graph()
    # On a plain edge_index the converted model is the stock one.
    torch.testing.assert_close(
        model(data.x, data.edge_index, data.edge_attr),
        fresh(data.x, data.edge_index, data.edge_attr), rtol=0, atol=0)


def test_values_are_gathered_per_edge_only_with_edge_features(tmp_path):
    """Without edge features the values are the source rows (sparse
    products, message() never runs); with them, message() runs per chunk."""
    data = hard_graph()
    pyg_sar.partition_graph(data, 1, str(tmp_path))
    part = pyg_sar.load_partition(str(tmp_path), 0)
    graph = pyg_sar.DistGraph(part, chunk_size=CHUNK)
    for edge_dim, called in ((None, False), (3, True)):
        conv = pyg_sar.nn.TransformerConv(C, 4, heads=2, edge_dim=edge_dim)
        calls, message = [], conv.message

        def spy(value_j, edge_attr):
            calls.append(1)
            return message(value_j, edge_attr)

        conv.message = spy
        args = () if edge_dim is None else (part.edge_attr, )
        conv(part.x, graph, *args).sum().backward()
        assert bool(calls) == called, edge_dim


def test_aggregations_other_than_add_are_refused_by_the_twin():
    with pytest.raises(ValueError, match="aggr='mean' is not supported"):
        pyg_sar.nn.TransformerConv(C, 4, aggr='mean')
