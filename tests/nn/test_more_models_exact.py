"""PyG's models of ``torch_geometric.nn.models`` beyond the BasicGNN family
(tests/test_models_exact.py), converted with :func:`pyg_sar.nn.to_distributed`,
equal single-process PyG at world sizes 1-4 in every mode (and chunked):

- ``LabelPropagation`` and ``CorrectAndSmooth`` (outputs; they run under
  ``no_grad``) on the hard graph and on Cora: integer labels whose largest
  class lives on one rank only, masks and index masks, edge weights,
  ``post_step``, autoscale over a rank without training nodes;
- ``DeepGCNLayer``, ``PMLP`` (train and eval), ``RECT_L``, ``GroupAddRev``
  and ``LINKX`` (outputs, input gradients, every parameter gradient);
- the models that never read the graph (``MLP`` with batch norms in
  training mode, ``MaskLabel``, ``JumpingKnowledge``,
  ``HeteroJumpingKnowledge``, ``GPSENodeEncoder``), the same way.

Every other model of ``torch_geometric.nn.models.__all__`` is placed in
:mod:`pyg_sar.nn.model_paths`, and the refused ones raise an error naming
the model and the reason. One spawn per world size runs every case.
"""
import copy
import inspect
import os.path as osp
import shutil

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric.nn import models

import pyg_sar
from pyg_sar.nn import model_paths
from conftest import SHARED_DATA
from _dist import run_workers
from _graphs import hard_graph

# Multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow

CONFIGS = (('sar', None), ('sa', None), ('one_shot', None), ('sar', 19))
C = 6


# Label propagation and C&S: (name, run(module maker, inputs)) ##############

def _index(mask):
    return mask.nonzero().view(-1)


def propagation_cases(weighted: bool):
    """``name -> fn(convert, g, t)``: ``convert`` turns a stock module into
    the one to run, ``g`` the graph (edge_index or DistGraph), ``t`` the
    node tensors of the rows at hand and the edge weights."""
    LP, CS = models.LabelPropagation, models.CorrectAndSmooth
    cases = {
        'lp_labels': lambda cv, g, t: cv(LP(3, 0.9))(t['y'], g),
        'lp_soft_index_post': lambda cv, g, t: cv(LP(2, 0.5))(
            t['y_soft'], g, mask=_index(t['mask']),
            post_step=lambda h: h.softmax(dim=-1)),
        'cs_autoscale': lambda cv, g, t: _correct_smooth(
            cv(CS(2, 0.8, 2, 0.6)), g, t, t['mask'], None),
        'cs_forward': lambda cv, g, t: cv(CS(3, 0.5, 1, 0.9))(
            t['y_soft'], t['y'][t['mask']], t['mask'], g),
    }
    if weighted:
        cases.update({
            'lp_mask_weight': lambda cv, g, t: cv(LP(2, 0.7))(
                t['y'], g, mask=t['mask'], edge_weight=t['w']),
            'cs_fixed_index_weight': lambda cv, g, t: _correct_smooth(
                cv(CS(2, 0.8, 3, 0.6, autoscale=False, scale=0.7)), g, t,
                _index(t['mask']), t['w'], one_hot=True),
        })
    return cases


def _correct_smooth(cs, g, t, mask, w, one_hot=False):
    y_true = t['y'][mask]
    if one_hot:
        y_true = torch.nn.functional.one_hot(
            y_true, t['y_soft'].size(1)).float()
    corrected = cs.correct(t['y_soft'], y_true, mask, g, edge_weight=w)
    return torch.cat([corrected,
                      cs.smooth(corrected, y_true, mask, g, edge_weight=w)],
                     dim=1)


def propagation_inputs(data, mask):
    """Labels with one extra class at a single node (so only its rank sees
    the largest label), soft predictions, the mask."""
    y = data.y.clone()
    y[data.num_nodes // 2] = int(y.max()) + 1
    gen = torch.Generator().manual_seed(5)
    y_soft = torch.randn(data.num_nodes, int(y.max()) + 1,
                         generator=gen).softmax(dim=-1)
    return {'y': y, 'y_soft': y_soft, 'mask': mask}


def run_propagations(g, t, weighted, dist):
    cv = pyg_sar.nn.to_distributed if dist else (lambda m: m)
    return {name: fn(cv, g, t)
            for name, fn in propagation_cases(weighted).items()}


# Models with trainable layers: (name, make, call) ##########################

def _deepgcn_res_plus():
    return models.DeepGCNLayer(pyg_nn.GENConv(C, C), torch.nn.LayerNorm(C),
                               torch.nn.ReLU(), block='res+')


def _deepgcn_res_batch_norm():
    return models.DeepGCNLayer(pyg_nn.GCNConv(C, C), torch.nn.BatchNorm1d(C),
                               torch.nn.ReLU(), block='res')


def _pmlp(train):
    def make():
        return models.PMLP(C, 8, 4, num_layers=3).train(train)
    return make


def _on_x(module, x, g, store):
    return module(x, g)


def _on_x_w(module, x, g, store):
    return module(x, g, store.edge_weight)


def _two_layers(x):
    return [x, x.tanh()]


# name -> (make, call(module, x, graph, store)): ``store`` is the whole
# graph or this worker's part (edge weights, labels, training mask).
MODELS = {
    'DeepGCNLayer_res+': (_deepgcn_res_plus, _on_x),
    'DeepGCNLayer_res_batch_norm': (_deepgcn_res_batch_norm, _on_x),
    'PMLP_train': (_pmlp(True), _on_x),
    'PMLP_eval': (_pmlp(False), _on_x),
    'RECT_L': (lambda: models.RECT_L(C, 8), _on_x_w),
    'GroupAddRev': (lambda: models.GroupAddRev(
        pyg_nn.SAGEConv(C // 2, C // 2), num_groups=2), _on_x),
    'LINKX': (lambda: models.LINKX(hard_graph().num_nodes, C, 8, 4, 2,
                                   num_edge_layers=2), _on_x_w),
    # The models of MODELS_PER_NODE: they never read the graph, but their
    # batch norms (training mode) average over all nodes.
    'MLP_batch_norm': (lambda: models.MLP([C, 8, 4], norm='batch_norm'),
                       lambda m, x, g, s: m(x)),
    'MaskLabel_add': (lambda: models.MaskLabel(3, C),
                      lambda m, x, g, s: m(x, s.y, s.train_mask)),
    'MaskLabel_concat': (lambda: models.MaskLabel(3, C, method='concat'),
                         lambda m, x, g, s: m(x, s.y, s.train_mask)),
    'JumpingKnowledge_lstm': (
        lambda: models.JumpingKnowledge('lstm', C, 2),
        lambda m, x, g, s: m(_two_layers(x))),
    'HeteroJumpingKnowledge_max': (
        lambda: models.HeteroJumpingKnowledge(['a'], 'max'),
        lambda m, x, g, s: m({'a': _two_layers(x)})['a']),
    'GPSENodeEncoder': (
        lambda: models.GPSENodeEncoder(10, C, 4, C, expand_x=True,
                                       dropout_be=0.0, dropout_ae=0.0),
        lambda m, x, g, s: m(x, x.flip(-1) * 2.0)),
}


def build(name, dist):
    torch.manual_seed(1234)
    make, call = MODELS[name]
    module = make()
    if dist:
        module = pyg_sar.nn.to_distributed(copy.deepcopy(module))
    return module, call


def run_model(name, store, g, ids, num_nodes, dist):
    module, call = build(name, dist)
    x = store.x.clone().requires_grad_()
    out = call(module, x, g, store)
    gen = torch.Generator().manual_seed(99)
    probe = torch.randn(num_nodes, *out.shape[1:], generator=gen)[ids]
    value = out.detach().clone()  # GroupAddRev frees its output in backward
    (out * probe).sum().backward()
    return (value, x.grad,
            {n: p.grad for n, p in module.named_parameters()})


# The workers and the comparison ############################################

def _local(inputs, part):
    t = {k: v[part.orig_ids] for k, v in inputs.items()}
    t['w'] = getattr(part, 'edge_weight', None)
    return t


def _worker(rank, world_size, roots, inputs):
    results = {}
    parts = {name: pyg_sar.load_partition(root, rank)
             for name, root in roots.items()}
    for name, part in parts.items():
        results[('ids', name)] = part.orig_ids
    hard = parts['hard']
    for mode, chunk in CONFIGS:
        for name, part in parts.items():
            graph = pyg_sar.DistGraph(part, mode=mode, chunk_size=chunk)
            out = run_propagations(graph, _local(inputs[name], part),
                                   weighted=name == 'hard', dist=True)
            for case, value in out.items():
                results[(mode, chunk, name, case)] = value
        graph = pyg_sar.DistGraph(hard, mode=mode, chunk_size=chunk)
        for model in MODELS:
            results[(mode, chunk, 'model', model)] = run_model(
                model, hard, graph, hard.orig_ids,
                inputs['hard']['y'].numel(), dist=True)
    return results


def assert_close(actual, expected, what):
    scale = expected.abs().max().clamp(min=1.0)
    torch.testing.assert_close(actual / scale, expected / scale, rtol=1e-4,
                               atol=1e-4, msg=lambda m: f'{what}: {m}')


def _cora(root):
    from torch_geometric.datasets import Planetoid
    if not osp.isdir(osp.join(SHARED_DATA, 'Cora')):
        pytest.skip(f"Cora not available under '{SHARED_DATA}'")
    shutil.copytree(osp.join(SHARED_DATA, 'Cora'), osp.join(root, 'Cora'))
    data = Planetoid(root, 'Cora')[0]
    del data.val_mask, data.test_mask
    return data


@pytest.mark.parametrize('world_size', [1, 2, 3, 4])
def test_models_equal_single_process(world_size, tmp_path):
    datasets = {'hard': hard_graph(), 'cora': _cora(str(tmp_path / 'raw'))}
    roots, inputs = {}, {}
    for name, data in datasets.items():
        roots[name] = str(tmp_path / name)
        pyg_sar.partition_graph(data, world_size, roots[name])
        # The last rank holds no training node: C&S's autoscale averages
        # over the training nodes of the other ranks.
        mask = data.train_mask.clone()
        if world_size > 1:
            last = pyg_sar.load_partition(roots[name], world_size - 1)
            mask[last.orig_ids] = False
        inputs[name] = propagation_inputs(data, mask)
    results = run_workers(_worker, world_size, roots, inputs, timeout_s=240)

    for name, data in datasets.items():
        ids = torch.cat([r[('ids', name)] for r in results])
        t = dict(inputs[name], w=getattr(data, 'edge_weight', None))
        expected = run_propagations(data.edge_index, t, name == 'hard',
                                    dist=False)
        for mode, chunk in CONFIGS:
            for case, ref in expected.items():
                out = torch.cat([r[(mode, chunk, name, case)]
                                 for r in results])
                assert_close(out, ref[ids], f'{name} {case} mode={mode} '
                             f'chunk={chunk} world={world_size}')
    data = datasets['hard']
    ids = torch.cat([r[('ids', 'hard')] for r in results])
    for model in MODELS:
        out, gx, gp = run_model(model, data, data.edge_index,
                                torch.arange(data.num_nodes), data.num_nodes,
                                dist=False)
        for mode, chunk in CONFIGS:
            what = f'{model} mode={mode} chunk={chunk} world={world_size}'
            key = (mode, chunk, 'model', model)
            assert_close(torch.cat([r[key][0] for r in results]), out[ids],
                         f'{what} output')
            assert_close(torch.cat([r[key][1] for r in results]), gx[ids],
                         f'{what} dL/dx')
            for pname, ref in gp.items():
                if ref is not None:
                    total = sum(r[key][2][pname] for r in results)
                    assert_close(total, ref, f'{what} dL/d{pname}')


# Every model of torch_geometric.nn.models has a place ######################

def _model_classes():
    return [getattr(models, n) for n in models.__all__
            if inspect.isclass(getattr(models, n))]


def test_every_stock_model_has_one_place():
    from pyg_sar.nn import convert
    own = {c for c in convert._COMPOSITE
           if c.__module__.startswith('torch_geometric.nn.models')}
    assert own == {models.LabelPropagation, models.CorrectAndSmooth,
                   models.linkx.SparseLinear, models.LightGCN}
    for cls in _model_classes():
        places = [cls in own, cls in model_paths.MODELS_WITH_LAYERS_CONVERTED,
                  cls in model_paths.MODELS_PER_NODE,
                  cls in model_paths.MODEL_REFUSALS]
        assert sum(places) == 1, (cls.__name__, places)
    # This file is in tests/nn/: the repository is two folders up.
    root = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
    for cls, test in {**model_paths.MODELS_WITH_LAYERS_CONVERTED,
                      **model_paths.MODELS_PER_NODE}.items():
        assert osp.isfile(osp.join(root, test)), (cls.__name__, test)
    # Every per-node model runs in this file's exactness test.
    tested = {type(make()) for make, _ in MODELS.values()}
    assert set(model_paths.MODELS_PER_NODE) <= tested


def _refused_instances():
    """A small instance of some refused models (constructors that need no
    optional package)."""
    return {
        'SchNet': lambda: models.SchNet(hidden_channels=8, num_filters=8,
                                        num_interactions=1),
        'GAE': lambda: models.GAE(pyg_nn.GCNConv(C, 4)),
        'GraphUNet': lambda: models.GraphUNet(C, 8, 4, 2),
        'SGFormer': lambda: models.SGFormer(C, 8, 4),
        'DeepGraphInfomax': lambda: models.DeepGraphInfomax(
            8, pyg_nn.GCNConv(C, 8), lambda z, *a: z.mean(0),
            lambda x, *a: (x, ) + a),
    }


@pytest.mark.parametrize('name', sorted(_refused_instances()))
def test_refused_models_name_the_reason(name):
    model = _refused_instances()[name]()
    cls = type(model)
    reason = model_paths.MODEL_REFUSALS[cls]
    with pytest.raises(ValueError) as info:
        pyg_sar.nn.to_distributed(torch.nn.Sequential(model))
    message = str(info.value)
    assert '\n' not in message
    assert f'{name} at ' in message and reason in message, message


def test_linkx_needs_the_whole_graphs_node_count(hard_part):
    data, part = hard_part
    model = pyg_sar.nn.to_distributed(
        models.LINKX(data.num_nodes - 1, C, 8, 4, 2))
    graph = pyg_sar.DistGraph(part)
    with pytest.raises(ValueError, match=f'num_nodes={data.num_nodes - 1} '
                       f'but the graph has {data.num_nodes} nodes'):
        model(part.x, graph)
