"""SAGEConv (``pyg_sar.nn.SAGEConv``, the twin of PyG's): its
``transform_first`` path (the aggregate added into the root term's memory,
``propagate(add_to=)``) equals stock PyG, in every mode; an input that
needs no gradient keeps no aggregate and backward recomputes it (refused if
the input changed in place); the GNN model marks its SAGE layers for it.

SAGEConv's exactness in every mode, chunk size and world size, with mean,
max, sum and min aggregation, is in the sweep of tests/nn/test_sar_exact.py
(its ``sage_*`` ids), which runs every conv in one spawn per world size.
"""
import pytest
import torch
from torch_geometric.nn import SAGEConv as PygSAGEConv

import pyg_sar
from pyg_sar.train import GNN

from _dist import run_workers
from _exact import (FLOAT32, assemble, close, mismatches, report,
                    sum_over_ranks)
from _graphs import hard_graph

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow


def _sage_outputs(rank, world_size, root, transform_first, options, mode):
    part = pyg_sar.load_partition(root, rank)
    graph = pyg_sar.DistGraph(part, mode=mode)
    torch.manual_seed(0)
    stock = PygSAGEConv(6, 3, **options)
    stock.transform_first = transform_first
    conv = pyg_sar.nn.to_distributed(torch.nn.Sequential(stock))[0]
    assert conv.transform_first is transform_first
    x = part.x.clone().requires_grad_()
    out = conv(x, graph)
    (out * torch.arange(3.)).sum().backward()
    return (part.orig_ids, out.detach(), x.grad,
            {n: p.grad for n, p in conv.named_parameters()})


# transform_first adds the aggregate into the root term's memory (add_to):
# with and without a root term and a bias, mean and sum, every mode.
SAGE_OPTIONS = [(1, {}, 'sar'), (3, {}, 'sar'), (3, {}, 'sa'),
                (3, {}, 'one_shot'), (3, dict(aggr='sum'), 'sar'),
                (3, dict(root_weight=False), 'sar'),
                (3, dict(bias=False), 'sar'),
                (2, dict(aggr='sum', root_weight=False, bias=False), 'sar')]


@pytest.mark.parametrize('world_size,options,mode', SAGE_OPTIONS)
def test_sage_transform_first_matches_pyg(tmp_path, world_size, options,
                                          mode):
    data = hard_graph()
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, world_size, root)
    torch.manual_seed(0)
    ref = PygSAGEConv(6, 3, **options)
    x = data.x.clone().requires_grad_()
    expected = ref(x, data.edge_index)
    (expected * torch.arange(3.)).sum().backward()
    results = run_workers(_sage_outputs, world_size, root, True, options,
                          mode)
    report(mismatches(
        f'SAGEConv({options}) transform_first mode={mode} '
        f'world={world_size}', [r[0] for r in results],
        [r[1:] for r in results],
        (expected.detach(), x.grad,
         {n: p.grad for n, p in ref.named_parameters()}), FLOAT32))


def _sage_without_input_grad(rank, world_size, root, options, mode):
    part = pyg_sar.load_partition(root, rank)
    graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=7)
    torch.manual_seed(0)
    conv = pyg_sar.nn.to_distributed(
        torch.nn.Sequential(PygSAGEConv(6, 8, **options)))[0]
    calls = []
    propagate = conv.propagate

    def counted(*args, **kwargs):
        calls.append(torch.is_grad_enabled())
        return propagate(*args, **kwargs)

    conv.propagate = counted
    out = conv(part.x, graph)  # the input needs no gradient
    assert calls == [True]
    (out * torch.arange(8.)).sum().backward()
    # lin_l kept no aggregate: backward aggregated once more, without grad.
    assert calls == [True, False]
    recomputed = ({n: p.grad.clone() for n, p in conv.named_parameters()},
                  out.detach())
    # An input changed in place before backward: refused, not recomputed
    # from the changed values.
    changed = part.x.clone()
    out = conv(changed, graph)
    changed.add_(1.0)
    with pytest.raises(RuntimeError, match='modified'):
        out.sum().backward()
    conv.zero_grad()
    calls.clear()
    x = part.x.clone().requires_grad_()  # needs a gradient: kept as before
    (conv(x, graph) * torch.arange(8.)).sum().backward()
    assert calls == [True]
    return part.orig_ids, recomputed, x.grad


@pytest.mark.parametrize('world_size,mode,options', [
    (1, 'sar', {}), (3, 'sar', {}), (3, 'one_shot', dict(aggr='sum')),
    (2, 'sa', dict(root_weight=False))])
def test_sage_recomputes_the_aggregate_of_an_input_without_grad(
        tmp_path, world_size, mode, options):
    data = hard_graph()
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, world_size, root)
    torch.manual_seed(0)
    ref = PygSAGEConv(6, 8, **options)
    expected = ref(data.x, data.edge_index)
    (expected * torch.arange(8.)).sum().backward()
    results = run_workers(_sage_without_input_grad, world_size, root,
                          options, mode)
    what = f'SAGEConv({options}) mode={mode} world={world_size}'
    # The input needs no gradient: outputs and parameter gradients only.
    failures = close(assemble([r[0] for r in results],
                              [r[1][1] for r in results], data.num_nodes),
                     expected.detach(), FLOAT32, f'{what} output')
    for name, p in ref.named_parameters():
        failures += close(sum_over_ranks([r[1][0].get(name)
                                          for r in results], p.grad),
                          p.grad, FLOAT32, f'{what} dL/d{name}')
    report(failures)



def test_gnn_marks_sage_for_transform_first():
    net = pyg_sar.nn.to_distributed(GNN('sage', 8, 16, 3, num_layers=2))
    assert all(conv.transform_first for conv in net.convs)
    assert not pyg_sar.nn.SAGEConv(8, 4).transform_first
