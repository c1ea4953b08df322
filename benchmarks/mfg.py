"""Layer-wise MFGs against the full graph: epoch time, per-worker memory and
bytes exchanged, at 1% and 10% labelled nodes.

A 3-layer GraphSAGE (mean, hidden 256) and a 3-layer GAT (4 heads) train
full batch on the synthetic graph; the loss reads only the labelled nodes. "full" runs every propagation
on every node; "mfg" wraps the forward in ``graph.layer_wise(train_mask,
hops=3)`` (outputs at the labelled nodes and all gradients are the same; see
``tests/graph/test_mfg.py``). Every configuration runs in fresh processes
(torchrun, gloo on 127.0.0.1), one worker per part.

    python benchmarks/mfg.py            # 50k nodes, 1M edges, N = 1, 2
    python benchmarks/mfg.py --quick    # small smoke test

Prints a table with the mfg/full ratios, writes ``mfg.json`` and ``mfg.png``
to ``--out`` (default ``benchmarks/results``).
"""
from __future__ import annotations

import argparse
import json
import os
import os.path as osp
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import List

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from _common import free_port  # noqa: E402

HERE = osp.dirname(osp.abspath(__file__))


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(args: argparse.Namespace) -> None:
    import torch
    import pyg_sar
    from pyg_sar.train import GNN, distributed_loss, limit_heap_retention
    limit_heap_retention()
    rank, world_size = pyg_sar.init_distributed()
    part = pyg_sar.load_partition(args.parts, rank)
    graph = pyg_sar.DistGraph(part, mode='sar')
    gen = torch.Generator().manual_seed(rank)
    mask = torch.rand(part.num_local_nodes, generator=gen) < args.fraction
    x, y = part.x.float(), part.y.long()
    num_classes = int(pyg_sar.comm.all_reduce(
        torch.tensor([int(y.max()) + 1]), 'max')[0])
    torch.manual_seed(0)
    model = pyg_sar.nn.to_distributed(GNN(args.model, x.size(1), 256,
                                          num_classes, 3, dropout=0.5))
    pyg_sar.sync_params(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    count = pyg_sar.global_count(mask)
    mfg = graph.layer_wise(mask, hops=3) if args.mfg else None
    times, before = [], _maxrss_mib()
    pyg_sar.reset_comm_stats()
    for _ in range(args.epochs + 1):
        start = time.perf_counter()
        optimizer.zero_grad()
        if mfg is not None:
            with mfg:
                out = model(x, graph)
        else:
            out = model(x, graph)
        distributed_loss(out, y, mask, count).backward()
        pyg_sar.all_reduce_grads(model)
        optimizer.step()
        times.append(time.perf_counter() - start)
    stats = pyg_sar.comm_stats()
    result = dict(rank=rank, epoch_s=statistics.median(times[1:]),
                  rss_delta_mib=_maxrss_mib() - before,
                  bytes_per_epoch=(stats['bytes_sent'] +
                                   stats['bytes_received']) /
                  (args.epochs + 1),
                  destinations=(mfg.num_destinations() if mfg else None),
                  num_nodes=graph.num_nodes)
    with open(osp.join(args.result_dir, f'{rank}.json'), 'w') as f:
        json.dump(result, f)
    pyg_sar.comm.shutdown()


def _launch(args, parts: str, world_size: int, fraction: float,
            mfg: bool, model: str) -> List[dict]:
    with tempfile.TemporaryDirectory() as result_dir:
        command = [sys.executable, '-m', 'torch.distributed.run',
                   '--nproc-per-node', str(world_size), '--master-port',
                   str(free_port()), osp.abspath(__file__), '--worker',
                   '--parts', parts, '--fraction', str(fraction), '--epochs',
                   str(args.epochs), '--result-dir', result_dir,
                   '--model', model] + \
            (['--mfg'] if mfg else [])
        env = dict(os.environ, OMP_NUM_THREADS='1')
        run = subprocess.run(command, env=env, capture_output=True, text=True,
                             timeout=3600)
        if run.returncode != 0:
            raise RuntimeError(f'worker failed:\n{run.stderr[-3000:]}')
        return [json.load(open(osp.join(result_dir, f'{r}.json')))
                for r in range(world_size)]



def main(args: argparse.Namespace) -> None:
    import pyg_sar
    from pyg_sar import datasets
    nodes, degree = (4000, 10) if args.quick else (args.nodes, args.degree)
    work = tempfile.mkdtemp(prefix='pyg_sar_mfg_')
    data = datasets.synthetic_graph(nodes, degree, 128, 16, seed=0)
    rows = []
    for world_size in args.workers:
        parts = osp.join(work, f'parts{world_size}')
        pyg_sar.partition_graph(data, world_size, parts, progress=False)
        for model, fraction in [(m, f) for m in args.models
                                for f in args.fractions]:
            pair = {}
            for mfg in (False, True):
                result = _launch(args, parts, world_size, fraction, mfg,
                                 model)
                pair[mfg] = dict(
                    epoch_s=max(r['epoch_s'] for r in result),
                    rss_delta_mib=max(r['rss_delta_mib'] for r in result),
                    bytes_per_epoch=max(r['bytes_per_epoch']
                                        for r in result),
                    destinations=result[0]['destinations'],
                    num_nodes=result[0]['num_nodes'])
            rows.append(dict(model=model, workers=world_size,
                             fraction=fraction, full=pair[False],
                             mfg=pair[True]))
    print(f'\n3 layers, hidden 256 (GAT: 4 heads), {nodes:,} nodes, '
          f'{data.num_edges:,} edges; worst worker')
    header = ('model', 'N', 'labelled', 'epoch full', 'epoch mfg', 'ratio',
              'mem full MiB', 'mem mfg MiB', 'ratio', 'rank-0 destinations')
    print(' | '.join(header))
    for row in rows:
        f, m = row['full'], row['mfg']
        print(f"{row['model']} | {row['workers']} | "
              f"{100 * row['fraction']:.0f}% | "
              f"{f['epoch_s']:.3f}s | {m['epoch_s']:.3f}s | "
              f"{m['epoch_s'] / f['epoch_s']:.2f} | "
              f"{f['rss_delta_mib']:.0f} | {m['rss_delta_mib']:.0f} | "
              f"{m['rss_delta_mib'] / max(f['rss_delta_mib'], 1e-9):.2f} | "
              f"{m['destinations']} of {m['num_nodes']}")
    os.makedirs(args.out, exist_ok=True)
    with open(osp.join(args.out, 'mfg.json'), 'w') as f:
        json.dump(dict(nodes=nodes, edges=int(data.num_edges), rows=rows),
                  f, indent=1)
    _plot(rows, osp.join(args.out, 'mfg.png'))
    print(f"wrote {osp.join(args.out, 'mfg.json')} and mfg.png")


def _plot(rows: List[dict], path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    labels = [f"{r['model']}\nN={r['workers']}, {100 * r['fraction']:.0f}%"
              for r in rows]
    for ax, key, title in ((axes[0], 'epoch_s', 'epoch time (s)'),
                           (axes[1], 'rss_delta_mib', 'peak RSS delta (MiB)')):
        pos = range(len(rows))
        ax.bar([p - 0.2 for p in pos], [r['full'][key] for r in rows], 0.4,
               label='full graph')
        ax.bar([p + 0.2 for p in pos], [r['mfg'][key] for r in rows], 0.4,
               label='layer-wise MFGs')
        ax.set_xticks(list(pos))
        ax.set_xticklabels(labels)
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--worker', action='store_true')
    parser.add_argument('--parts')
    parser.add_argument('--fraction', type=float)
    parser.add_argument('--mfg', action='store_true')
    parser.add_argument('--result-dir')
    parser.add_argument('--epochs', type=int, default=3)
    parser.add_argument('--nodes', type=int, default=50_000)
    parser.add_argument('--degree', type=float, default=20)
    parser.add_argument('--workers', type=int, nargs='+', default=[1, 2])
    parser.add_argument('--fractions', type=float, nargs='+',
                        default=[0.01, 0.1])
    parser.add_argument('--model', default='sage')
    parser.add_argument('--models', nargs='+', default=['sage', 'gat'])
    parser.add_argument('--quick', action='store_true')
    parser.add_argument('--out', default=osp.join(HERE, 'results'))
    return parser.parse_args(argv)


if __name__ == '__main__':
    arguments = parse_args()
    if arguments.worker:
        worker(arguments)
    else:
        main(arguments)
