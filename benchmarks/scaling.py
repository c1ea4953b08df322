"""Strong scaling with workers: GraphSAGE and GAT full batch on one graph,
N workers (a worker stands for a machine) against one.

Two series, side by side in one run, with stock PyG on all cores as the
baseline:

* fixed threads per worker (``--threads T``): N = 1, 2, 4, ... workers of T
  threads each, the efficiency ``t(1) / (N t(N))``;
* the machine's cores split among N workers (cores / N threads each),
  against one worker on every core: ``t(N) / t(1)``.

Each worker is a ``torchrun`` process training on its METIS part
(``benchmarks/device_check.py``'s worker). Writes ``<out>/scaling.json`` and
``scaling.png`` and prints the table::

    python benchmarks/scaling.py                       # this machine's cores
    python benchmarks/scaling.py --workers 1 2 4 --threads 4
"""
from __future__ import annotations

import pyg_sar  # noqa: F401  (before torch: the package's OpenMP policy)

import argparse
import json
import os
import os.path as osp
import shutil
import tempfile
from typing import Dict, List

from device_check import HERE, launch, prepared_graph

MODELS = ('GraphSAGE', 'GAT')


def runs(workers: List[int], threads: int, cores: int) -> List[tuple]:
    """``(impl, workers, threads)`` of both series, each once."""
    out = [('pyg', 1, cores)]
    for n in workers:
        out.append(('sar', n, threads))
        if n * threads != cores and cores // n >= 1:
            out.append(('sar', n, cores // n))
    seen, unique = set(), []
    for run in out:
        if run not in seen:
            seen.add(run)
            unique.append(run)
    return unique


def summarize(rows: List[dict], threads: int, cores: int) -> List[dict]:
    table = []
    for model in MODELS:
        mine = {(r['workers'], r['threads']): r['epoch_s'] for r in rows
                if r['model'] == model and r['impl'] == 'sar' and
                'epoch_s' in r}
        stock = next((r['epoch_s'] for r in rows if r['model'] == model and
                      r['impl'] == 'pyg' and 'epoch_s' in r), None)
        for (n, t), epoch in sorted(mine.items()):
            entry = dict(model=model, workers=n, threads=t, epoch_s=epoch,
                         vs_stock=epoch / stock if stock else None)
            if t == threads and (1, t) in mine and n > 1:
                entry['efficiency'] = mine[(1, t)] / (n * epoch)
            if n * t == cores and (1, cores) in mine and n > 1:
                entry['split_ratio'] = epoch / mine[(1, cores)]
            table.append(entry)
    return table


def plot(table: List[dict], path: str, threads: int, cores: int) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for model in MODELS:
        fixed = [r for r in table if r['model'] == model and
                 r['threads'] == threads]
        axes[0].plot([r['workers'] for r in fixed],
                     [r.get('efficiency', 1.0) for r in fixed], 'o-',
                     label=model)
        split = [r for r in table if r['model'] == model and
                 r['workers'] * r['threads'] == cores]
        axes[1].plot([r['workers'] for r in split],
                     [r.get('split_ratio', 1.0) for r in split], 'o-',
                     label=model)
    axes[0].axhline(0.85, color='gray', ls='--', lw=0.8, label='0.85')
    axes[0].set_title(f'efficiency t(1) / (N t(N)), {threads} thread(s) '
                      f'per worker')
    axes[1].axhline(1.05, color='gray', ls='--', lw=0.8, label='1.05')
    axes[1].set_title(f'{cores} cores split among N workers: t(N) / t(1)')
    for ax in axes:
        ax.set_xlabel('workers N')
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--nodes', type=int, default=200_000)
    p.add_argument('--workers', type=int, nargs='+', default=[1, 2])
    p.add_argument('--threads', type=int, default=1,
                   help='threads per worker of the fixed-thread series')
    p.add_argument('--epochs', type=int, default=3, help='timed epochs')
    p.add_argument('--timeout', type=float, default=900,
                   help='seconds one run may take')
    p.add_argument('--out', default=osp.join(HERE, 'results'))
    args = p.parse_args()
    cores = os.cpu_count() or 1
    # launch() reads these of the device check's arguments.
    args.work = tempfile.mkdtemp(prefix='scaling-')
    args.cpu_epochs = args.epochs
    rows = []
    try:
        prepared = prepared_graph(args.nodes, args.work,
                                  counts=tuple(args.workers))
        for model in MODELS:
            for impl, n, t in runs(args.workers, args.threads, cores):
                row = launch(args, prepared, n, model, 'cpu', t,
                             args.timeout, impl=impl)
                rows.append(dict(row, model=model, impl=impl, workers=n,
                                 threads=t))
                print(f"{model:<10} {impl:<4} {n} x {t:>2} threads: "
                      f"{row.get('epoch_s', float('nan')):.3f} s "
                      f"{row.get('error', '')}", flush=True)
    finally:
        shutil.rmtree(args.work, ignore_errors=True)
    table = summarize(rows, args.threads, cores)
    print(f"\n{'model':<10} {'N x T':>7} {'epoch s':>8} {'vs stock':>8} "
          f"{'efficiency':>10} {'split':>6}")
    for r in table:
        print(f"{r['model']:<10} {r['workers']:>3} x {r['threads']:<3}"
              f"{r['epoch_s']:>8.3f} {r['vs_stock'] or float('nan'):>8.2f} "
              f"{r.get('efficiency', float('nan')):>10.3f} "
              f"{r.get('split_ratio', float('nan')):>6.3f}")
    os.makedirs(args.out, exist_ok=True)
    result: Dict = dict(cores=cores, nodes=args.nodes, threads=args.threads,
                        epochs=args.epochs, runs=rows, table=table)
    with open(osp.join(args.out, 'scaling.json'), 'w') as f:
        json.dump(result, f, indent=1)
    plot(table, osp.join(args.out, 'scaling.png'), args.threads, cores)
    print(f"wrote {osp.join(args.out, 'scaling')}.json/.png")
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
