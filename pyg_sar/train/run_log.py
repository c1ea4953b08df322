"""Run records of ``pyg-sar train --log-dir``: per-epoch metrics as CSV and a
PNG of the curves.

Every epoch each rank contributes the bytes it exchanged and its peak RSS
(one small collective); rank 0 rewrites ``metrics.csv`` atomically
(:func:`pyg_sar.train.files.write_atomically`), so the file is never half
written, and at the end draws ``curves.png`` the same way. A resumed run
keeps the rows up to the epoch it resumes from and appends the rest.
"""
from __future__ import annotations

import csv
import io
import os
import os.path as osp
import resource
from typing import Dict, List

from pyg_sar import comm
from pyg_sar.train.files import write_atomically, write_text_atomically

METRICS_FILE = 'metrics.csv'
CURVES_FILE = 'curves.png'


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class RunLog:
    """Collects one row per epoch (collective: every rank calls
    :meth:`record`) and writes them under ``log_dir`` on rank 0.

    Args:
        log_dir: Folder of ``metrics.csv`` and ``curves.png`` (created).
        start_epoch: Epoch a resumed run starts after; rows beyond it in an
            existing ``metrics.csv`` are dropped.
    """

    def __init__(self, log_dir: str, start_epoch: int = 0) -> None:
        self.log_dir = log_dir
        self.rank, self.world_size = comm.get_rank(), comm.get_world_size()
        self.rows: List[Dict] = []
        if self.rank == 0:
            os.makedirs(log_dir, exist_ok=True)
            path = osp.join(log_dir, METRICS_FILE)
            if start_epoch > 0 and osp.exists(path):
                with open(path, newline='') as f:
                    self.rows = [r for r in csv.DictReader(f)
                                 if int(r['epoch']) <= start_epoch]
        comm.reset_comm_stats()

    def record(self, record: Dict) -> None:
        """Adds the epoch's ``record`` (epoch, loss, accuracies, time) with
        every rank's bytes exchanged since the previous call and peak RSS."""
        stats = comm.comm_stats(reset=True)
        mine = (stats['bytes_sent'] + stats['bytes_received'],
                round(_peak_rss_mib(), 1))
        everyone = comm.all_gather_object(mine)
        if self.rank != 0:
            return
        row = dict(record)
        for r, (nbytes, rss) in enumerate(everyone):
            row[f'bytes_rank{r}'] = nbytes
            row[f'peak_rss_mib_rank{r}'] = rss
        self.rows.append(row)
        self._write_csv()

    def _write_csv(self) -> None:
        fields: List[str] = []
        for row in self.rows:
            fields += [k for k in row if k not in fields]
        text = io.StringIO(newline='')
        writer = csv.DictWriter(text, fieldnames=fields)
        writer.writeheader()
        writer.writerows(self.rows)
        write_text_atomically(osp.join(self.log_dir, METRICS_FILE),
                              text.getvalue())

    def finish(self) -> None:
        """Draws loss and accuracy curves into ``curves.png`` (rank 0)."""
        if self.rank != 0 or not self.rows:
            return
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
        epochs = [int(r['epoch']) for r in self.rows]
        fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
        ax_loss.plot(epochs, [float(r['loss']) for r in self.rows])
        ax_loss.set(xlabel='epoch', ylabel='training loss')
        for name in ('train', 'val', 'test'):
            key = f'{name}_acc'
            points = [(int(r['epoch']), float(r[key])) for r in self.rows
                      if r.get(key) not in (None, '')]
            if points:
                ax_acc.plot(*zip(*points), label=name)
        ax_acc.set(xlabel='epoch', ylabel='accuracy')
        ax_acc.legend()
        for ax in (ax_loss, ax_acc):
            ax.grid(alpha=0.3)
        fig.tight_layout()
        try:
            write_atomically(osp.join(self.log_dir, CURVES_FILE),
                             lambda f: fig.savefig(f, format='png', dpi=100))
        finally:
            plt.close(fig)
