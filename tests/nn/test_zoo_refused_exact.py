"""The stock layers once refused by ``to_distributed`` (EGConv, PDNConv,
DNAConv, AntiSymmetricConv, SignedConv, WLConv, SuperGATConv) equal
single-process PyG: outputs, input gradients and every parameter gradient,
at world sizes 1-3, in every mode, with and without chunking, on the graph
with self loops, duplicate edges, isolated nodes and a hub
(tests/_graphs.py). SignedConv runs on two relation graphs of one node
type; WLConv's colors and color table equal PyG's; SuperGATConv in training
mode with given negatives gives PyG's attention loss (summed over workers),
and with random sampling it is refused by name; EGConv's self loops follow
PyG's inferred node count when the last nodes are isolated.

One spawn per world size runs every case, in a module-scoped fixture; the
parent compares, one test per layer.
"""
import copy
from types import SimpleNamespace

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric.data import HeteroData

import pyg_sar
from _dist import run_workers
from _exact import BY_DTYPE, close, mismatches, report
from _graphs import hard_graph
from tests.nn.test_zoo_exact import C, CHUNK, MODES, mlp, probe

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow

# Call styles: 'x' conv(x, g), 'a' with edge_attr, 'layers' x as a
# [N, 2, C] layer history, 'layers_w' that and edge_weight.
ZOO = {
    'EGConv_symnorm': (lambda: pyg_nn.EGConv(C, 8, num_heads=2,
                                             num_bases=2), 'x'),
    'EGConv_all': (lambda: pyg_nn.EGConv(
        C, 6, ['sum', 'mean', 'min', 'max', 'var', 'std'], num_heads=3,
        num_bases=2), 'x'),
    'EGConv_symnorm_max_no_loops': (lambda: pyg_nn.EGConv(
        C, 4, ['symnorm', 'max'], num_heads=2, add_self_loops=False), 'x'),
    'PDNConv': (lambda: pyg_nn.PDNConv(C, 5, edge_dim=3,
                                       hidden_channels=4), 'a'),
    'PDNConv_plain': (lambda: pyg_nn.PDNConv(C, 5, 3, 4, normalize=False),
                      'a'),
    'DNAConv': (lambda: pyg_nn.DNAConv(C, heads=2, groups=2), 'layers'),
    'DNAConv_weighted_no_loops': (lambda: pyg_nn.DNAConv(
        C, heads=3, add_self_loops=False), 'layers_w'),
    'AntiSymmetricConv': (lambda: pyg_nn.AntiSymmetricConv(C), 'x'),
    'AntiSymmetricConv_gin': (lambda: pyg_nn.AntiSymmetricConv(
        C, phi=pyg_nn.GINConv(mlp(C, C)), num_iters=2), 'x'),
    'SuperGATConv_MX_eval': (lambda: pyg_nn.SuperGATConv(C, 3,
                                                         heads=2).eval(),
                             'x'),
    'SuperGATConv_SD_eval': (lambda: pyg_nn.SuperGATConv(
        C, 3, heads=2, attention_type='SD', concat=False).eval(), 'x'),
}
SIGNED = {
    'SignedConv_first': (lambda: pyg_nn.SignedConv(C, 4, first_aggr=True)),
    'SignedConv_deep': (lambda: pyg_nn.SignedConv(C // 2, 4,
                                                  first_aggr=False)),
}
FLOAT64 = ('EGConv_all', 'SignedConv_deep')
POS, NEG = ('v', 'pos', 'v'), ('v', 'neg', 'v')


def dtypes(case):
    return ((torch.float32, torch.float64) if case in FLOAT64
            else (torch.float32, ))


def build(case: str, dist: bool):
    torch.manual_seed(1234)
    module = (ZOO[case][0] if case in ZOO else SIGNED[case])()
    if dist:
        module = pyg_sar.nn.to_distributed(copy.deepcopy(module))
    return module


def call(case, module, x, graphs, edge_weight, edge_attr):
    style = ZOO[case][1] if case in ZOO else 'signed'
    if style == 'signed':
        return module(x, *graphs)
    if style == 'a':
        return module(x, graphs, edge_attr=edge_attr)
    if style.startswith('layers'):
        x = torch.stack([x, torch.tanh(x)], 1)
        if style == 'layers_w':
            return module(x, graphs, edge_weight=edge_weight)
        return module(x, graphs)
    return module(x, graphs)


def evaluate(case, module, x, graphs, edge_weight, edge_attr, ids, n,
             dtype):
    module = module.to(dtype)
    x = x.to(dtype).clone().requires_grad_()
    out = call(case, module, x, graphs, edge_weight.to(dtype),
               edge_attr.to(dtype))
    (out * probe(n, out.shape[1:])[ids].to(dtype)).sum().backward()
    return (out.detach(), x.grad,
            {k: p.grad for k, p in module.named_parameters()})


def signed_data(data) -> HeteroData:
    """The test graph's edges split into a positive and a negative set over
    one node type."""
    signed = HeteroData()
    signed['v'].x = data.x
    signed['v'].y = data.y
    signed['v'].train_mask = data.train_mask
    signed[POS].edge_index = data.edge_index[:, 0::2]
    signed[NEG].edge_index = data.edge_index[:, 1::2]
    return signed


def colors(x):
    return ((x[:, 0] * 2).round().long() % 4)


def wl_run(x, graph):
    """Three refinements (the last from one-hot colors) and the table."""
    torch.manual_seed(0)
    conv = pyg_nn.WLConv()
    if not isinstance(graph, torch.Tensor):
        conv = pyg_sar.nn.to_distributed(conv)
    c1 = conv(colors(x), graph)
    c2 = conv(c1, graph)
    one_hot = torch.nn.functional.one_hot(c2, int(c2.max()) + 2)
    c3 = conv(one_hot, graph)
    return torch.stack([c1, c2, c3]), dict(conv.hashmap)


def top_isolated(data):
    """The test graph without the edges of its last five nodes (the hub
    among them): PyG's ``add_remaining_self_loops(edge_index)`` infers the
    node count from the edges and gives those nodes no self loop."""
    data = copy.copy(data)
    keep = (data.edge_index < data.num_nodes - 5).all(0)
    data.edge_index = data.edge_index[:, keep]
    data.edge_weight = data.edge_weight[keep]
    data.edge_attr = data.edge_attr[keep]
    return data


def negatives(num_nodes, count=70):
    gen = torch.Generator().manual_seed(11)
    return torch.randint(0, num_nodes, (2, count), generator=gen)


def supergat_train(attention_type, x, graph, neg, ids, n):
    """Training mode with every edge positive and given negatives: output,
    attention loss and all gradients (float64)."""
    torch.manual_seed(5)
    conv = pyg_nn.SuperGATConv(C, 3, heads=2, edge_sample_ratio=1.0,
                               attention_type=attention_type).double()
    if not isinstance(graph, torch.Tensor):
        conv = pyg_sar.nn.to_distributed(conv)
    x = x.double().clone().requires_grad_()
    out = conv(x, graph, neg_edge_index=neg)
    loss = conv.get_attention_loss()
    probe_rows = probe(n, out.shape[1:])[ids].double()
    ((out * probe_rows).sum() + 3 * loss).backward()
    return (out.detach(), x.grad,
            {k: p.grad for k, p in conv.named_parameters()}, loss.detach())


def _worker(rank, world_size, root, signed_root, top_root):
    part = pyg_sar.load_partition(root, rank)
    top = pyg_sar.load_partition(top_root, rank)
    spart = pyg_sar.load_partition(signed_root, rank)
    n = int(part.num_nodes)
    results = {'ids': part.orig_ids, 'signed_ids': spart['v'].orig_ids,
               'top_ids': top.orig_ids}
    results[('sar', None, 'top', torch.float64)] = evaluate(
        'EGConv_all', build('EGConv_all', True), top.x, pyg_sar.DistGraph(top),
        top.edge_weight, top.edge_attr, top.orig_ids, n, torch.float64)
    for mode in MODES:
        for chunk in (None, CHUNK):
            graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk)
            for case in ZOO:
                for dtype in dtypes(case):
                    results[(mode, chunk, case, dtype)] = evaluate(
                        case, build(case, True), part.x, graph,
                        part.edge_weight, part.edge_attr, part.orig_ids, n,
                        dtype)
            sgraph = pyg_sar.DistGraph(spart, mode=mode, chunk_size=chunk)
            pair = (sgraph[POS], sgraph[NEG])
            for case in SIGNED:
                for dtype in dtypes(case):
                    results[(mode, chunk, case, dtype)] = evaluate(
                        case, build(case, True), spart['v'].x, pair,
                        part.edge_weight, part.edge_attr,
                        spart['v'].orig_ids, n, dtype)
    results['wl'] = wl_run(part.x, pyg_sar.DistGraph(part))
    neg = negatives(n)[:, rank::world_size]
    for mode, chunk in (('sar', CHUNK), ('one_shot', None)):
        graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk)
        for att in ('MX', 'SD'):
            results[(mode, chunk, f'supergat_train_{att}', torch.float64)] = \
                supergat_train(att, part.x, graph, neg, part.orig_ids, n)
    results['refusals'] = refusals(part, pyg_sar.DistGraph(part), sgraph)
    return results


def refusals(part, graph, sgraph):
    """What each layer says, by name, to a call it cannot make exact."""
    dist = pyg_sar.nn.to_distributed
    x = part.x
    calls = {
        'SuperGATConv': lambda: dist(pyg_nn.SuperGATConv(C, 3))(x, graph),
        'DNAConv': lambda: dist(pyg_nn.DNAConv(C))(x, graph),
        'PDNConv': lambda: dist(pyg_nn.PDNConv(C, 5, 3, 4,
                                               normalize=False))(x, graph),
        'WLConv': lambda: dist(pyg_nn.WLConv())(x, graph),
        'SignedConv': lambda: dist(pyg_nn.SignedConv(C, 4, True))(
            x, sgraph[POS], sgraph[NEG].halo_edge_index()),
    }
    said = {}
    for name, run in calls.items():
        try:
            run()
            said[name] = None
        except ValueError as e:
            said[name] = str(e)
    return said


def compare(run, case, ref, ids_key, runs=None):
    """Outputs, dL/dx and the sum over ranks of every parameter gradient of
    ``case`` against ``ref`` (per dtype), for every ``(mode, chunk)``: one
    line per mismatch."""
    ids = [r[ids_key] for r in run.results]
    runs = runs or [(m, c) for m in MODES for c in (None, CHUNK)]
    failures = []
    for dtype, expected in ref.items():
        for mode, chunk in runs:
            key = (mode, chunk, case, dtype)
            failures += mismatches(
                f'{case} {dtype} mode={mode} chunk={chunk} '
                f'world={run.world_size}', ids,
                [r[key] for r in run.results], expected, BY_DTYPE[dtype],
                none_grads='skip')
    return failures


@pytest.fixture(scope='module', params=[1, 2, 3, 4])
def refused_run(request, tmp_path_factory):
    world_size = request.param
    tmp_path = tmp_path_factory.mktemp('refused')
    data = hard_graph()
    signed = signed_data(data)
    root, signed_root = str(tmp_path / 'parts'), str(tmp_path / 'signed')
    pyg_sar.partition_graph(data, world_size, root)
    pyg_sar.partition_graph(signed, world_size, signed_root)
    top = top_isolated(data)
    top_root = str(tmp_path / 'top')
    pyg_sar.partition_graph(top, world_size, top_root)
    results = run_workers(_worker, world_size, root, signed_root, top_root,
                          timeout_s=240)
    return SimpleNamespace(world_size=world_size, data=data, signed=signed,
                           top=top, results=results)


def test_egconv_self_loops_follow_pyg_node_count(refused_run):
    top = refused_run.top
    ref = {torch.float64: evaluate(
        'EGConv_all', build('EGConv_all', False), top.x, top.edge_index,
        top.edge_weight, top.edge_attr, torch.arange(top.num_nodes),
        top.num_nodes, torch.float64)}
    report(compare(refused_run, 'top', ref, 'top_ids', [('sar', None)]))


@pytest.mark.parametrize('case', list(ZOO) + list(SIGNED))
def test_layer_equals_single_process(refused_run, case):
    data = refused_run.data
    n = data.num_nodes
    if case in SIGNED:
        signed = refused_run.signed
        graph = (signed[POS].edge_index, signed[NEG].edge_index)
        ids_key = 'signed_ids'
    else:
        graph, ids_key = data.edge_index, 'ids'
    ref = {dtype: evaluate(case, build(case, False), data.x, graph,
                           data.edge_weight, data.edge_attr, torch.arange(n),
                           n, dtype)
           for dtype in dtypes(case)}
    report(compare(refused_run, case, ref, ids_key))


def test_wl_conv_colors_and_table_equal_pyg(refused_run):
    # WLConv: the same colors and the same table on every worker.
    data, results = refused_run.data, refused_run.results
    ids = torch.cat([r['ids'] for r in results])
    ref_colors, ref_table = wl_run(data.x, data.edge_index)
    got = torch.cat([r['wl'][0] for r in results], 1)
    assert torch.equal(got, ref_colors[:, ids])
    for r in results:
        assert r['wl'][1] == ref_table


@pytest.mark.parametrize('att', ['MX', 'SD'])
def test_supergat_training_equals_single_process(refused_run, att):
    data, results = refused_run.data, refused_run.results
    n = data.num_nodes
    case = f'supergat_train_{att}'
    runs = [('sar', CHUNK), ('one_shot', None)]
    ref = supergat_train(att, data.x, data.edge_index, negatives(n),
                         torch.arange(n), n)
    failures = compare(refused_run, case, {torch.float64: ref[:3]}, 'ids',
                       runs)
    for key in runs:
        total = sum(r[(*key, case, torch.float64)][3] for r in results)
        failures += close(total, ref[3], BY_DTYPE[torch.float64],
                          f'{case} {key} world={refused_run.world_size} '
                          f'attention loss')
    report(failures)


def test_refusals_name_the_layer(refused_run):
    for r in refused_run.results:
        for name, message in r['refusals'].items():
            assert message is not None and message.startswith(name), name
            assert '\n' not in message
        assert 'training mode' in r['refusals']['SuperGATConv']


def test_conversion_keeps_state_and_refuses_bad_phi():
    torch.manual_seed(0)
    for case in ZOO:
        stock = build(case, False)
        state = {k: v.clone() for k, v in stock.state_dict().items()}
        dist = pyg_sar.nn.to_distributed(copy.deepcopy(stock))
        assert isinstance(dist, type(stock))
        assert set(dist.state_dict()) == set(state)
        for k, v in dist.state_dict().items():
            assert torch.equal(v, state[k]), (case, k)
        assert dist.training == stock.training
    for cls in (pyg_nn.EGConv, pyg_nn.PDNConv, pyg_nn.DNAConv,
                pyg_nn.AntiSymmetricConv, pyg_nn.SignedConv, pyg_nn.WLConv,
                pyg_nn.SuperGATConv):
        assert cls in pyg_sar.nn.convertible()
    # A phi with no distributed version is refused by its path.
    bad = pyg_nn.AntiSymmetricConv(C, phi=pyg_nn.HypergraphConv(C, C))
    with pytest.raises(ValueError, match=r"HypergraphConv at 'phi'"):
        pyg_sar.nn.to_distributed(bad)

