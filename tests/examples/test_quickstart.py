"""The quickstart and the examples the documentation includes, run as a
user runs them: ``torchrun --nproc-per-node 2 examples/X.py --root DIR`` on
a copy of the real datasets (skipped, saying why, where they are absent).

The quickstart's losses are also checked against the same stock PyG model
trained in this process on the whole graph from the same initial weights.
"""
import os.path as osp
import re
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import SHARED_DATA
from pyg_sar.comm import find_free_port

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow

# This file is in tests/examples/.
REPO = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
EXAMPLES = osp.join(REPO, 'examples')


def _data_root(tmp_path, *names: str) -> str:
    """A writable copy of the named datasets of the shared data folder."""
    source = osp.normpath(SHARED_DATA)
    missing = [n for n in names if not osp.isdir(osp.join(source, n))]
    if missing:
        pytest.skip(f"real datasets not available: {', '.join(missing)} "
                    f"absent from '{source}' (set PYG_SAR_SHARED_DATA to "
                    f"their folder)")
    root = tmp_path / 'data'
    for name in names:
        shutil.copytree(osp.join(source, name), root / name)
    return str(root)


def _torchrun(script: str, *args: str, nproc: int = 2) -> str:
    """Runs ``examples/<script>`` under torch.distributed.run; returns its
    standard output, failing with everything it printed otherwise."""
    command = [sys.executable, '-m', 'torch.distributed.run', '--nnodes',
               '1', '--nproc-per-node', str(nproc), '--master-addr',
               '127.0.0.1', '--master-port', str(find_free_port()),
               osp.join(EXAMPLES, script), *args]
    result = subprocess.run(command, capture_output=True, text=True,
                            timeout=600, cwd=REPO)
    assert result.returncode == 0, (f'{script} exited with '
                                    f'{result.returncode}:\n' +
                                    result.stdout + result.stderr)
    return result.stdout


def _number(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match, f'{pattern!r} not in the output:\n{text}'
    return float(match.group(1))


# The quickstart ##############################################################

def _single_process_losses(root: str, epochs: int):
    """examples/quickstart.py's model and optimizer, stock PyG on the whole
    graph in this process, without dropout: the loss of every epoch."""
    import torch.nn.functional as F
    from torch_geometric.nn import GraphSAGE

    import pyg_sar
    data = pyg_sar.datasets.load('Cora', root)
    torch.manual_seed(0)
    model = GraphSAGE(data.num_features, hidden_channels=64, num_layers=2,
                      out_channels=int(data.y.max()) + 1, dropout=0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01,
                                 weight_decay=5e-4)
    losses = []
    for _ in range(epochs):
        model.train()
        optimizer.zero_grad()
        out = model(data.x, data.edge_index)
        loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def test_quickstart_trains_and_matches_single_process_pyg(tmp_path):
    root = _data_root(tmp_path, 'Cora')
    epochs = 10
    out = _torchrun('quickstart.py', '--root', root, '--epochs', str(epochs),
                    '--dropout', '0')
    printed = {int(e): float(v) for e, v in
               re.findall(r'epoch\s+(\d+)\s+loss ([0-9.e+-]+)', out)}
    assert sorted(printed) == [1, epochs], out
    final = _number(r'final loss ([0-9.e+-]+)', out)
    assert final == printed[epochs]
    # Learned: the loss fell, and Cora's 7 classes are well above chance.
    assert printed[epochs] < 0.5 * printed[1], out
    assert _number(r'test accuracy ([0-9.]+)', out) > 0.6, out
    # The global loss is the single-process loss of the same stock model.
    reference = _single_process_losses(root, epochs)
    for epoch, loss in printed.items():
        assert loss == pytest.approx(reference[epoch - 1], rel=1e-4), \
            (epoch, reference, out)


# The examples the tutorials include ##########################################

def test_stock_model_to_distributed_and_back(tmp_path):
    """docs/tutorials/full_batch.rst"""
    root = _data_root(tmp_path, 'Cora')
    out = _torchrun('stock_pyg_to_distributed.py', '--root', root,
                    '--epochs', '10')
    assert 'identical predictions: 2708/2708 nodes' in out, out
    assert _number(r'distributed model \(2 workers\): test accuracy '
                   r'([0-9.]+)', out) > 0.5, out


def test_full_batch_gat(tmp_path):
    """docs/tutorials/full_batch.rst"""
    root = _data_root(tmp_path, 'Cora')
    out = _torchrun('full_batch_gat.py', '--root', root, '--epochs', '5',
                    '--chunk-size', '2000')
    assert _number(r'final test accuracy: ([0-9.]+)', out) > 0.4, out


def test_custom_layer_matches_its_stock_class(tmp_path):
    """docs/tutorials/custom_layer.rst"""
    root = _data_root(tmp_path, 'Cora')
    out = _torchrun('custom_layer.py', '--root', root, '--epochs', '10')
    assert 'identical predictions 2708/2708' in out, out
    assert _number(r'max \|logit difference\| ([0-9.e+-]+)', out) < 1e-4
    assert _number(r'final test accuracy: ([0-9.]+)', out) > 0.5, out


def test_sampled_training_then_full_graph_inference(tmp_path):
    """docs/tutorials/sampling.rst"""
    root = _data_root(tmp_path, 'Cora')
    out = _torchrun('sampling_train_full_infer.py', '--root', root,
                    '--epochs', '3')
    assert _number(r'full-graph inference: .* test ([0-9.]+)', out) > 0.5


def test_sampled_heterogeneous_training(tmp_path):
    """docs/tutorials/sampling.rst"""
    root = _data_root(tmp_path, 'DBLP')
    out = _torchrun('sampled_hetero_dblp.py', '--data-root', root,
                    '--epochs', '2')
    # DBLP's authors have 4 classes.
    assert _number(r'test accuracy ([0-9.]+)', out) > 0.4, out


@pytest.mark.parametrize('model', ['rgcn', 'sage'])
def test_heterogeneous_full_batch_matches_one_process(tmp_path, model):
    """docs/tutorials/heterogeneous.rst"""
    root = _data_root(tmp_path, 'DBLP')
    out = _torchrun('hetero_dblp.py', '--root', root, '--model', model,
                    '--epochs', '2', '--compare')
    gap = _number(r'largest loss difference over 2 epochs: ([0-9.e+-]+)',
                  out)
    assert gap < 1e-4, out


def test_link_prediction_matches_one_process(tmp_path):
    """docs/tutorials/link_prediction.rst"""
    root = _data_root(tmp_path, 'Cora')
    out = _torchrun('link_prediction_cora.py', '--root', root, '--epochs',
                    '5', '--compare')
    gap = _number(r'largest loss difference over 5 epochs: ([0-9.e+-]+)',
                  out)
    assert gap < 1e-4, out
    assert _number(r'pyg_sar x2: .* val auc ([0-9.]+)', out) > 0.6, out


def test_layer_wise_mfg(tmp_path):
    """docs/tutorials/layer_wise.rst"""
    root = _data_root(tmp_path, 'Cora')
    out = _torchrun('layer_wise_mfg.py', '--root', root, '--epochs', '10')
    assert _number(r'max \|difference\| at the training nodes: '
                   r'([0-9.e+-]+)', out) < 1e-5, out
    losses = [float(v) for v in re.findall(r'loss ([0-9.]+)', out)]
    assert losses[-1] < 0.5 * losses[0], out


def test_checkpoint_resume_equals_uninterrupted_run(tmp_path):
    """docs/tutorials/checkpoints.rst: stopped after epoch 4 (last
    checkpoint: epoch 3), run again, it ends where a run that never
    stopped ends."""
    root = _data_root(tmp_path, 'Cora')
    common = ['--root', root, '--epochs', '8', '--checkpoint-every', '3']
    whole = _torchrun('checkpoint_resume.py', *common, '--checkpoint-dir',
                      str(tmp_path / 'whole'))
    ckpt = str(tmp_path / 'stopped')
    first = _torchrun('checkpoint_resume.py', *common, '--checkpoint-dir',
                      ckpt, '--stop-after', '4')
    assert 'final loss' not in first and 'epoch   4' in first, first
    second = _torchrun('checkpoint_resume.py', *common, '--checkpoint-dir',
                       ckpt)
    assert 'resuming from epoch 3' in second, second
    assert 'epoch   3 ' not in second and 'epoch   4 ' in second, second
    final = r'final loss ([0-9.]+)'
    assert _number(final, second) == _number(final, whole)
    resumed = torch.load(osp.join(ckpt, 'model.pt'), weights_only=True)
    straight = torch.load(str(tmp_path / 'whole' / 'model.pt'),
                          weights_only=True)
    assert resumed.keys() == straight.keys()
    for key in straight:
        assert torch.equal(resumed[key], straight[key]), key
