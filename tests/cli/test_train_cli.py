"""The main job: ``pyg-sar train`` under torch.distributed.run."""
import json
import subprocess
import sys

import pyg_sar
from pyg_sar import datasets
from pyg_sar.comm import find_free_port


def _train_command(tmp_path, data, *options: str):
    """``pyg-sar train`` under torchrun with 2 workers on ``data``,
    partitioned into ``tmp_path/parts``, with ``options``."""
    parts = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, 2, parts)
    return [sys.executable, '-m', 'torch.distributed.run', '--nnodes', '1',
            '--nproc-per-node', '2', '--master-addr', '127.0.0.1',
            '--master-port', str(find_free_port()), '-m', 'pyg_sar.cli',
            'train', '--parts', parts, *options]


def test_train_job_runs_under_torchrun_and_learns(tmp_path):
    history = tmp_path / 'history.json'
    command = _train_command(
        tmp_path, datasets.synthetic_graph(2000, 10, 16, 4, seed=2),
        '--model', 'gat', '--layers', '2', '--hidden', '16', '--heads', '2',
        '--epochs', '15', '--lr', '0.02', '--dropout', '0.2', '--history',
        str(history), '--no-progress', '--timeout', '60')
    result = subprocess.run(command, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert 'final:' in result.stdout
    epochs = json.loads(history.read_text())
    assert [e['epoch'] for e in epochs] == list(range(1, 16))
    assert epochs[-1]['loss'] < epochs[0]['loss']
    # Four balanced classes: chance is 0.25.
    assert epochs[-1]['test_acc'] > 0.5


def test_log_file_has_no_progress_bar(tmp_path):
    # The progress bar is on by default; into a file (not a terminal) the
    # job writes its epoch lines without the bar's carriage returns.
    log = tmp_path / 'train.log'
    command = _train_command(
        tmp_path, datasets.synthetic_graph(500, 5, 8, 3, seed=1),
        '--layers', '2', '--hidden', '8', '--epochs', '3', '--timeout', '60')
    with open(log, 'w') as f:
        result = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT,
                                timeout=300)
    raw = log.read_bytes()  # (read_text would turn \r into \n)
    assert result.returncode == 0, raw.decode()
    assert b'epoch' in raw and b'final:' in raw
    assert b'\r' not in raw
