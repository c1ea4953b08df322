"""Checkpoints: bitwise save/restore per rank, refusals, atomicity, and a
``pyg-sar train`` run whose worker is SIGKILLed, restarted by torchrun and
resumed, ending bitwise equal to an uninterrupted run."""
import copy
import json
import os
import re
import os.path as osp
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import pyg_sar
from pyg_sar import checkpoint, datasets
from pyg_sar.comm import find_free_port
from tests._dist import run_workers

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow


# Helpers #####################################################################

def _setup(seed):
    """A small replicated model (with buffers), Adam and an LR scheduler."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7),
                                torch.nn.BatchNorm1d(7), torch.nn.ReLU(),
                                torch.nn.Dropout(0.5), torch.nn.Linear(7, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 2, gamma=0.5)
    return model, optimizer, scheduler


def _step(model, optimizer, scheduler, rank):
    """One training step whose dropout masks differ per rank (each rank's
    RNG advances differently) while the all-reduced update keeps the
    replicas equal."""
    x = torch.randn(6 + rank, 5)
    loss = model(x).square().sum() / 10
    optimizer.zero_grad()
    loss.backward()
    pyg_sar.all_reduce_grads(model)
    # BatchNorm's running statistics saw local rows: make them replicas.
    for buf in model.buffers():
        if buf.is_floating_point():
            pyg_sar.comm.all_reduce(buf, 'sum').div_(
                pyg_sar.comm.get_world_size())
    optimizer.step()
    scheduler.step()


def _draws():
    return (random.random(), float(np.random.rand()), torch.rand(4))


def _same(a, b) -> bool:
    """Recursive bitwise equality of nested state."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and \
            torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and \
            all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and \
            all(_same(x, y) for x, y in zip(a, b))
    return a == b


# Round trip ##################################################################

def _round_trip(rank, world_size, directory):
    model, optimizer, scheduler = _setup(0)
    pyg_sar.sync_params(model)
    # Per-rank RNG streams, as dropout over each rank's own nodes leaves them.
    random.seed(100 + rank)
    np.random.seed(200 + rank)
    torch.manual_seed(300 + rank)
    for _ in range(3):
        _step(model, optimizer, scheduler, rank)
    expected = (copy.deepcopy(model.state_dict()),
                copy.deepcopy(optimizer.state_dict()),
                copy.deepcopy(scheduler.state_dict()),
                checkpoint.rng_state())
    path = checkpoint.save(directory, 3, model, optimizer, scheduler,
                           fingerprint='parts-a', extra={'note': [1, 2.5]})
    assert path == osp.join(directory, 'epoch-3')
    assert checkpoint.latest(directory) == path
    assert _same(checkpoint.rng_state(), expected[3])  # save draws nothing
    next_draws = _draws()
    _step(model, optimizer, scheduler, rank)
    next_model = copy.deepcopy(model.state_dict())

    # Everything changes; then a fresh model/optimizer/scheduler is restored.
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    fresh, fresh_opt, fresh_sched = _setup(1234)
    assert not _same(fresh.state_dict(), expected[0])
    info = checkpoint.resume(directory, fresh, fresh_opt, fresh_sched,
                             fingerprint='parts-a')
    assert info == {'epoch': 3, 'path': path, 'extra': {'note': [1, 2.5]}}
    assert _same(fresh.state_dict(), expected[0])
    assert _same(fresh_opt.state_dict(), expected[1])
    assert _same(fresh_sched.state_dict(), expected[2])
    assert _same(checkpoint.rng_state(), expected[3])
    assert _same(_draws(), next_draws)
    # Training on from the restored state repeats the original step.
    _step(fresh, fresh_opt, fresh_sched, rank)
    assert _same(fresh.state_dict(), next_model)
    return [float(d) for d in next_draws[:2]]


@pytest.mark.parametrize('world_size', [1, 2])
def test_round_trip_is_bitwise(tmp_path, world_size):
    directory = str(tmp_path / 'ckpt')
    draws = run_workers(_round_trip, world_size, directory, timeout_s=60)
    if world_size == 2:
        assert draws[0] != draws[1]  # the RNG states are per rank
    # DCP wrote each replicated tensor once, spread over the ranks.
    from torch.distributed.checkpoint import FileSystemReader
    metadata = FileSystemReader(osp.join(directory, 'epoch-3')).read_metadata()
    names = [index.fqn for index in metadata.storage_data]
    assert len(names) == len(set(names)) > 10
    assert any(n.startswith('optimizer.state.') for n in names)
    files = {info.relative_path for info in metadata.storage_data.values()}
    assert len(files) == world_size
    assert sorted(f for f in os.listdir(osp.join(directory, 'epoch-3'))
                  if f.startswith('rank-')) == \
        [f'rank-{r}.pt' for r in range(world_size)]


# Refusals ####################################################################

def _save(directory, fingerprint):
    model, optimizer, scheduler = _setup(0)
    _step(model, optimizer, scheduler, 0)  # same rows: replicas stay equal
    checkpoint.save(directory, 1, model, optimizer, fingerprint=fingerprint,
                    extra={'config': {'hidden': 7, 'lr': 0.05}})


def _resume_error(directory, fingerprint, expect=None):
    model, optimizer, _ = _setup(5)
    try:
        checkpoint.resume(directory, model, optimizer,
                          fingerprint=fingerprint, expect=expect)
    except ValueError as e:
        return str(e)
    return None


def _refusals(rank, world_size, two, one, fp_a, fp_b):
    _save(two, fp_a)
    return [_resume_error(one, fp_a),
            _resume_error(two, fp_b),
            _resume_error(two, fp_a, {'config': {'hidden': 8, 'lr': 0.05}}),
            _resume_error(two, fp_a, {'config': {'hidden': 7, 'lr': 0.05}})]


def test_resume_refuses_other_world_size_or_partitions(tmp_path):
    data = datasets.synthetic_graph(300, 6, 8, 3, seed=1)
    pyg_sar.partition_graph(data, 2, str(tmp_path / 'metis'))
    pyg_sar.partition_graph(data, 2, str(tmp_path / 'random'),
                            method='random')
    fp_a = pyg_sar.load_partition(str(tmp_path / 'metis'), 0).fingerprint
    fp_b = pyg_sar.load_partition(str(tmp_path / 'random'), 0).fingerprint
    assert fp_a != fp_b
    two, one = str(tmp_path / 'two'), str(tmp_path / 'one')
    _save(one, fp_a)  # this process: one worker, no process group
    ranks = run_workers(_refusals, 2, two, one, fp_a, fp_b)

    def refused(message, *words):
        assert message is not None and '\n' not in message, message
        for word in words:
            assert word in message, message

    refused(_resume_error(two, fp_a),
            'written by 2 workers but this run has 1', 'epoch-1')
    for other_size, partitions, config, accepted in ranks:  # every rank
        refused(other_size, 'written by 1 worker but this run has 2')
        refused(partitions, 'different partitions', fp_a[:16], fp_b[:16])
        refused(config, 'different config', 'hidden=7 there, 8 here')
        assert accepted is None


# Atomicity ###################################################################

def test_interrupted_save_is_ignored(tmp_path, monkeypatch):
    directory = str(tmp_path / 'ckpt')
    model, optimizer, scheduler = _setup(0)
    assert checkpoint.latest(directory) is None
    first = checkpoint.save(directory, 1, model, optimizer, scheduler)
    _step(model, optimizer, scheduler, 0)
    # A crash after every file was written but before the commit (rename).
    with monkeypatch.context() as patch:
        rename = os.rename

        def crash(src, dst):
            if osp.basename(dst) == 'epoch-2':
                raise KeyboardInterrupt('killed')
            return rename(src, dst)
        patch.setattr(checkpoint.os, 'rename', crash)
        with pytest.raises(KeyboardInterrupt):
            checkpoint.save(directory, 2, model, optimizer, scheduler)
    assert osp.isdir(osp.join(directory, '.epoch-2.tmp'))
    # A checkpoint directory without its metadata (e.g. half copied).
    os.makedirs(osp.join(directory, 'epoch-3'))
    torch.save({}, osp.join(directory, 'epoch-3', 'rank-0.pt'))
    assert checkpoint.latest(directory) == first
    assert checkpoint.checkpoints(directory) == [(1, first)]
    restored, restored_opt, _ = _setup(9)
    assert checkpoint.load(first, restored, restored_opt)['epoch'] == 1
    # The next save of epoch 2 replaces the leftover and commits.
    second = checkpoint.save(directory, 2, model, optimizer, scheduler)
    assert checkpoint.latest(directory) == second
    assert not osp.exists(osp.join(directory, '.epoch-2.tmp'))
    with pytest.raises(FileExistsError, match='epoch-2'):
        checkpoint.save(directory, 2, model, optimizer, scheduler)
    with pytest.raises(FileNotFoundError, match='epoch-3'):
        checkpoint.load(osp.join(directory, 'epoch-3'), restored)


def test_save_weights_is_atomic(tmp_path):
    model, _, _ = _setup(0)
    path = str(tmp_path / 'w.pt')
    checkpoint.save_weights(model, path)
    assert os.listdir(tmp_path) == ['w.pt']
    assert _same(torch.load(path, weights_only=True), model.state_dict())
    with pytest.raises(FileNotFoundError, match='nowhere'):
        checkpoint.save_weights(model, str(tmp_path / 'nowhere' / 'w.pt'))


def test_train_cli_checkpoint_options(tmp_path, capsys):
    from pyg_sar import cli
    data = datasets.synthetic_graph(200, 6, 8, 3, seed=1)
    parts = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, 1, parts)
    ckpt, weights = str(tmp_path / 'ckpt'), str(tmp_path / 'w.pt')
    base = ['train', '--parts', parts, '--layers', '2', '--hidden', '8',
            '--no-progress', '--checkpoint-dir', ckpt]
    assert cli.main(base + ['--epochs', '3', '--checkpoint-every', '2',
                            '--save-model', weights]) == 0
    assert [e for e, _ in checkpoint.checkpoints(ckpt)] == [2, 3]
    assert osp.isfile(weights)
    assert cli.main(base + ['--epochs', '4']) == 0
    assert f'resuming from epoch 3 ({ckpt}/epoch-3)' in capsys.readouterr().out
    for extra, message in [
            (['--epochs', '2'], 'is at epoch 4, beyond epochs=2'),
            (['--epochs', '5', '--hidden', '16'],
             'hidden=8 there, 16 here'),
            (['--checkpoint-every', '0'], '--checkpoint-every must be >= 1'),
            (['--save-model', str(tmp_path / 'no' / 'w.pt')],
             'does not exist')]:
        assert cli.main(base + extra) == 2
        err = capsys.readouterr().err
        assert message in err and err.count('\n') == 1, err
    assert cli.main(['train', '--parts', parts, '--checkpoint-every',
                     '2']) == 2
    assert 'needs --checkpoint-dir' in capsys.readouterr().err


# Acceptance: kill a worker, torchrun restarts, the run resumes ##############

EPOCHS = 30


def _command(parts, ckpt, model_file, history, max_restarts=0):
    return [
        sys.executable, '-m', 'torch.distributed.run', '--nnodes', '1',
        '--nproc-per-node', '2', '--max-restarts', str(max_restarts),
        '--master-addr', '127.0.0.1', '--master-port', str(find_free_port()),
        '-m', 'pyg_sar.cli', 'train', '--parts', parts, '--model', 'sage',
        '--layers', '2', '--hidden', '16', '--epochs', str(EPOCHS),
        '--dropout', '0.5', '--seed', '0', '--no-progress', '--timeout', '30',
        '--checkpoint-dir', ckpt, '--save-model', model_file,
        '--history', history
    ]


def _worker_of(launcher: int, rank: int):
    import psutil
    for child in psutil.Process(launcher).children(recursive=True):
        try:
            if 'pyg_sar.cli' in ' '.join(child.cmdline()) and \
                    child.environ().get('RANK') == str(rank):
                return child
        except psutil.Error:  # exited meanwhile
            continue
    return None


def test_killed_worker_resumes_bitwise(tmp_path):
    data = datasets.synthetic_graph(300, 6, 8, 3, seed=1)
    parts = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, 2, parts)
    a_ckpt, b_ckpt = str(tmp_path / 'ckpt_a'), str(tmp_path / 'ckpt_b')
    a_model, b_model = str(tmp_path / 'A.pt'), str(tmp_path / 'B.pt')
    a_hist, b_hist = str(tmp_path / 'A.json'), str(tmp_path / 'B.json')

    # A: SIGKILL rank 0 once epoch 2 is checkpointed; torchrun restarts.
    log_a = tmp_path / 'a.log'
    start = time.perf_counter()
    with open(log_a, 'w') as log:
        launcher = subprocess.Popen(
            _command(parts, a_ckpt, a_model, a_hist, max_restarts=1),
            stdout=log, stderr=subprocess.STDOUT)
        try:
            killed_after = None
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and launcher.poll() is None:
                if osp.isdir(osp.join(a_ckpt, 'epoch-2')):
                    victim = _worker_of(launcher.pid, 0)
                    if victim is not None:
                        killed_after = checkpoint.latest(a_ckpt)
                        victim.send_signal(signal.SIGKILL)
                        break
                time.sleep(0.01)
            code = launcher.wait(timeout=120)
        finally:
            if launcher.poll() is None:
                launcher.kill()
    wall_a = time.perf_counter() - start
    output = log_a.read_text()
    assert killed_after is not None, 'no worker was killed:\n' + output
    assert code == 0, output
    resumed = [int(line.split()[3]) for line in output.splitlines()
               if line.startswith('resuming from epoch')]
    assert len(resumed) == 1 and 2 <= resumed[0] < EPOCHS, output
    assert f'resuming from epoch {resumed[0]} ({a_ckpt}/epoch-' \
        f'{resumed[0]})' in output

    # B: the same command, uninterrupted, into a fresh checkpoint directory.
    start = time.perf_counter()
    result = subprocess.run(_command(parts, b_ckpt, b_model, b_hist),
                            capture_output=True, text=True, timeout=120)
    wall_b = time.perf_counter() - start
    assert result.returncode == 0, result.stdout + result.stderr
    assert 'resuming' not in result.stdout

    a = torch.load(a_model, weights_only=True)
    b = torch.load(b_model, weights_only=True)
    assert a.keys() == b.keys() and len(a) > 0
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # The saved weights are the stock PyG model's state_dict.
    from pyg_sar.train import GNN
    stock = GNN('sage', 8, 16, 3, num_layers=2, dropout=0.5)
    stock.load_state_dict(a, strict=True)
    # The whole history (restored across the restart) matches too.
    strip = [{k: v for k, v in e.items() if k != 'time_s'}
             for e in json.loads(open(a_hist).read())]
    assert [e['epoch'] for e in strip] == list(range(1, EPOCHS + 1))
    assert strip == [{k: v for k, v in e.items() if k != 'time_s'}
                     for e in json.loads(open(b_hist).read())]
    assert checkpoint.latest(a_ckpt).endswith(f'epoch-{EPOCHS}')
    print(f'\nkilled rank 0 after {osp.basename(killed_after)}, resumed '
          f'from epoch {resumed[0]}: {wall_a:.1f}s with the restart vs '
          f'{wall_b:.1f}s uninterrupted (lost {wall_a - wall_b:.1f}s)')

    # The same checkpoints on other partitions are refused (on every rank;
    # torchrun may stop the second before it prints).
    pyg_sar.partition_graph(data, 2, str(tmp_path / 'other'),
                            method='random')
    result = subprocess.run(
        _command(str(tmp_path / 'other'), a_ckpt, a_model, a_hist),
        capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    refusals = [line for line in result.stderr.splitlines()
                if re.match(r'pyg-sar train: error \(rank [01]\): checkpoint',
                            line)]
    assert refusals and all('different partitions' in line
                            for line in refusals), result.stderr
