"""The quickstart and the examples the documentation includes, run as a
user runs them under ``torchrun`` on a copy of the real datasets (skipped,
saying why, where they are absent).

Every run a page documents (``.. pyg-sar-run::``) is run here exactly as
written, in a fresh folder, and what it prints is compared with the
recording the page shows (``docs/_generated``; ``docs/_ext/
recorded_runs.py`` says how): a change in what an example prints fails
here until it is recorded again, with ``PYG_SAR_RECORD_RUNS=1``. Each run's
own claims (exact predictions, matching losses) are checked as well.

The quickstart's losses are also checked against the same stock PyG model
trained in this process on the whole graph from the same initial weights.
"""
import os
import os.path as osp
import re
import shlex
import shutil
import subprocess
import sys
from typing import Callable, Dict, List

import pytest
import torch

from conftest import SHARED_DATA
from pyg_sar.comm import find_free_port

# This file is in tests/examples/.
REPO = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
EXAMPLES = osp.join(REPO, 'examples')
sys.path.insert(0, osp.join(REPO, 'docs', '_ext'))
import recorded_runs  # noqa: E402  (docs/_ext: the pages' runs)

# Many multi-process runs: deselect with -m "not slow".
slow = pytest.mark.slow
RUNS = recorded_runs.documented_runs()


def _data_root(folder, *names: str) -> str:
    """``folder/data``: a writable copy of the named datasets of the shared
    data folder."""
    source = osp.normpath(SHARED_DATA)
    missing = [n for n in names if not osp.isdir(osp.join(source, n))]
    if missing:
        pytest.skip(f"real datasets not available: {', '.join(missing)} "
                    f"absent from '{source}' (set PYG_SAR_SHARED_DATA to "
                    f"their folder)")
    root = osp.join(str(folder), 'data')
    for name in names:
        shutil.copytree(osp.join(source, name), osp.join(root, name))
    return root


def _run(argv: List[str], cwd: str) -> str:
    """Runs ``argv`` (``torchrun`` on a free port); returns its standard
    output, failing with everything it printed otherwise."""
    if argv[0] == 'torchrun':
        argv = [sys.executable, '-m', 'torch.distributed.run',
                '--master-addr', '127.0.0.1', '--master-port',
                str(find_free_port())] + argv[1:]
    elif argv[0] == 'python':
        argv = [sys.executable] + argv[1:]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [REPO] + [p for p in [os.environ.get('PYTHONPATH')] if p]))
    result = subprocess.run(argv, capture_output=True, text=True,
                            timeout=900, cwd=cwd, env=env)
    assert result.returncode == 0, (f'{shlex.join(argv)} exited with '
                                    f'{result.returncode}:\n' +
                                    result.stdout + result.stderr)
    return result.stdout


def _torchrun(script: str, *args: str, nproc: int = 2) -> str:
    return _run(['torchrun', '--nproc-per-node', str(nproc),
                 osp.join(EXAMPLES, script), *args], REPO)


def _number(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match, f'{pattern!r} not in the output:\n{text}'
    return float(match.group(1))


# The runs the pages document ################################################

def _run_documented(name: str, folder) -> List[str]:
    """Runs the page's commands of ``name`` in ``folder`` (holding ``data``,
    the datasets they read, and ``examples``), as written; compares what
    they print with the recording, or records it. Returns the outputs."""
    commands = RUNS[name]
    _data_root(folder, *sorted({'DBLP' if 'dblp' in c else 'Cora'
                                for c in commands}))
    os.symlink(EXAMPLES, osp.join(str(folder), 'examples'))
    outputs = [_run(shlex.split(c), str(folder)) for c in commands]
    printed = [o.splitlines() for o in outputs]
    if os.environ.get(recorded_runs.RECORD_ENV):
        recorded_runs.write_recording(name, list(zip(commands, printed)))
        return outputs
    recording = recorded_runs.read_recording(name)
    assert [c for c, _ in recording] == commands, \
        f'{name}: recorded for other commands; {recorded_runs.HOW_TO_RECORD}'
    for command, (_, want), got in zip(commands, recording, printed):
        stale = recorded_runs.differences(want, got)
        assert not stale, (
            f'docs/_generated/{name}.txt is stale: `{command}` now prints\n'
            + '\n'.join(stale) + f'\nrecord it with '
            f'{recorded_runs.HOW_TO_RECORD}')
    return outputs


def _quickstart(outputs, folder) -> None:
    assert _number(r'final loss [0-9.e+-]+  test accuracy ([0-9.]+)',
                   outputs[0]) > 0.7, outputs[0]


def _stock_model_to_distributed_and_back(outputs, folder) -> None:
    out, = outputs
    assert 'identical predictions: 2708/2708 nodes' in out, out
    assert _number(r'distributed model \(2 workers\): test accuracy '
                   r'([0-9.]+)', out) > 0.5, out


def _custom_layer(outputs, folder) -> None:
    out, = outputs
    assert 'identical predictions 2708/2708' in out, out
    assert _number(r'max \|logit difference\| ([0-9.e+-]+)', out) < 1e-4
    assert _number(r'final test accuracy: ([0-9.]+)', out) > 0.5, out


def _sampled_then_full_graph(outputs, folder) -> None:
    assert _number(r'full-graph inference: .* test ([0-9.]+)',
                   outputs[0]) > 0.5, outputs[0]


def _sampled_heterogeneous(outputs, folder) -> None:
    # DBLP's authors have 4 classes.
    assert _number(r'test accuracy ([0-9.]+)', outputs[0]) > 0.4, outputs[0]


def _heterogeneous_matches_one_process(outputs, folder) -> None:
    for out in outputs:  # R-GCN, to_hetero GraphSAGE
        gap = _number(r'largest loss difference over \d+ epochs: '
                      r'([0-9.e+-]+)', out)
        assert gap < 1e-4, out


def _link_prediction_matches_one_process(outputs, folder) -> None:
    out, = outputs
    gap = _number(r'largest loss difference over \d+ epochs: ([0-9.e+-]+)',
                  out)
    assert gap < 1e-4, out
    assert _number(r'pyg_sar x2: .* val auc ([0-9.]+)', out) > 0.6, out


def _layer_wise(outputs, folder) -> None:
    out, = outputs
    assert _number(r'max \|difference\| at the training nodes: '
                   r'([0-9.e+-]+)', out) < 1e-5, out
    losses = [float(v) for v in re.findall(r'loss ([0-9.]+)', out)]
    assert losses[-1] < 0.5 * losses[0], out


def _checkpoint_resume(outputs, folder) -> None:
    """Stopped after epoch 7 (last checkpoint: epoch 5) and run again, it
    ends where a run that never stopped ends, bitwise."""
    first, second = outputs
    assert 'final loss' not in first and 'epoch   7' in first, first
    assert 'resuming from epoch 5' in second, second
    assert 'epoch   5 ' not in second and 'epoch   6 ' in second, second
    command = RUNS['checkpoint_resume'][-1].replace('--checkpoint-dir ckpt',
                                                    '--checkpoint-dir whole')
    whole = _run(shlex.split(command), str(folder))
    final = r'final loss ([0-9.]+)'
    assert _number(final, second) == _number(final, whole)
    resumed = torch.load(osp.join(str(folder), 'ckpt', 'model.pt'),
                         weights_only=True)
    straight = torch.load(osp.join(str(folder), 'whole', 'model.pt'),
                          weights_only=True)
    assert resumed.keys() == straight.keys()
    for key in straight:
        assert torch.equal(resumed[key], straight[key]), key


def _sign_matches_one_process(outputs, folder) -> None:
    out, = outputs
    assert _number(r'max \|feature difference\| to '
                   r'torch_geometric\.transforms\.SIGN: ([0-9.e+-]+)',
                   out) < 1e-5, out
    gap = _number(r'largest loss difference over \d+ epochs: ([0-9.e+-]+)',
                  out)
    assert gap < 1e-4, out
    assert _number(r'test accuracy ([0-9.]+) \(2 workers', out) > 0.7, out


def _appnp_matches_one_process(outputs, folder) -> None:
    out, = outputs
    gap = _number(r'largest loss difference over \d+ epochs: ([0-9.e+-]+)',
                  out)
    assert gap < 1e-4, out
    assert _number(r'test accuracy ([0-9.]+) \(2 workers', out) > 0.75, out


def _correct_and_smooth_matches_one_process(outputs, folder) -> None:
    out, = outputs
    assert _number(r'largest loss difference over \d+ epochs: '
                   r'([0-9.e+-]+)', out) < 1e-4, out
    assert _number(r'of the corrected predictions ([0-9.e+-]+)',
                   out) < 1e-5, out
    assert _number(r'of the smoothed ([0-9.e+-]+)', out) < 1e-5, out
    base, after = (float(a) for a in re.search(
        r'test accuracy ([0-9.]+) -> ([0-9.]+) after C&S \(2 workers',
        out).groups())
    assert after > base + 0.1 and after > 0.75, out


# What each documented run must show besides its recorded output.
CHECKS: Dict[str, Callable] = {
    'quickstart': _quickstart,
    'stock_pyg_to_distributed': _stock_model_to_distributed_and_back,
    'custom_layer': _custom_layer,
    'sampling_train_full_infer': _sampled_then_full_graph,
    'sampled_hetero_dblp': _sampled_heterogeneous,
    'hetero_dblp': _heterogeneous_matches_one_process,
    'link_prediction_cora': _link_prediction_matches_one_process,
    'layer_wise_mfg': _layer_wise,
    'checkpoint_resume': _checkpoint_resume,
    'sign_cora': _sign_matches_one_process,
    'appnp_cora': _appnp_matches_one_process,
    'correct_and_smooth_cora': _correct_and_smooth_matches_one_process,
}


def test_every_documented_run_is_checked_and_recorded():
    """Quick: the pages' runs, the checks above and the recordings name the
    same runs, and each recording is of the page's commands."""
    assert set(RUNS) == set(CHECKS), (sorted(RUNS), sorted(CHECKS))
    recorded = {osp.splitext(f)[0] for f in
                os.listdir(recorded_runs.RECORDINGS) if f.endswith('.txt')}
    assert recorded == set(RUNS), (sorted(recorded), sorted(RUNS))
    for name, commands in RUNS.items():
        assert [c for c, _ in recorded_runs.read_recording(name)] == \
            commands, f'{name}: {recorded_runs.HOW_TO_RECORD}'


@slow
@pytest.mark.parametrize('name', sorted(CHECKS))
def test_documented_run(name, tmp_path):
    outputs = _run_documented(name, tmp_path)
    CHECKS[name](outputs, tmp_path)


# The quickstart against one process ##########################################

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


@slow
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


def test_readme_quotes_the_recorded_quickstart():
    """Quick: the accuracy the README says the quickstart prints is the
    recorded one."""
    with open(osp.join(REPO, 'README.md'), encoding='utf-8') as f:
        said = _number(r'It prints a test accuracy of about ([0-9.]+)',
                       f.read())
    (_, lines), = recorded_runs.read_recording('quickstart')
    printed = _number(r'final loss [0-9.e+-]+  test accuracy ([0-9.]+)',
                      '\n'.join(lines))
    assert abs(said - printed) <= 0.01, (said, printed)


# An example the tutorials include without its output #########################

@slow
def test_full_batch_gat(tmp_path):
    """docs/tutorials/full_batch.rst"""
    root = _data_root(tmp_path, 'Cora')
    out = _torchrun('full_batch_gat.py', '--root', root, '--epochs', '5',
                    '--chunk-size', '2000')
    assert _number(r'final test accuracy: ([0-9.]+)', out) > 0.4, out
