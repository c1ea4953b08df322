"""``pyg-sar train --log-dir`` writes per-epoch metrics (CSV) and curves
(PNG); two workers report their own bytes and peak memory."""
import csv
import os.path as osp
import subprocess
import sys

import pyg_sar


def test_log_dir_writes_metrics_and_curves(tmp_path):
    data = pyg_sar.datasets.synthetic_graph(300, 5, 8, 3, seed=0)
    parts = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, 2, parts)
    log_dir = str(tmp_path / 'log')
    command = [sys.executable, '-m', 'torch.distributed.run',
               '--nproc-per-node', '2', '-m', 'pyg_sar.cli', 'train',
               '--parts', parts, '--epochs', '3', '--hidden', '8',
               '--layers', '2', '--no-progress', '--log-dir', log_dir]
    run = subprocess.run(command, capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    assert 'best val: epoch' in run.stdout
    with open(osp.join(log_dir, 'metrics.csv'), newline='') as f:
        rows = list(csv.DictReader(f))
    assert [int(r['epoch']) for r in rows] == [1, 2, 3]
    for row in rows:
        assert float(row['loss']) > 0 and 0 <= float(row['val_acc']) <= 1
        for rank in (0, 1):
            assert int(row[f'bytes_rank{rank}']) > 0  # halo + all-reduce
            assert float(row[f'peak_rss_mib_rank{rank}']) > 0
    with open(osp.join(log_dir, 'curves.png'), 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'
