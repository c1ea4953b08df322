"""Throughput of distributed neighbor sampling (seeds per second per process).

Generates a synthetic graph (>= 1M edges), partitions it for every world size
N, spawns N gloo processes on loopback and times
:class:`pyg_sar.loader.DistNeighborLoader` with fanouts [15, 10, 5] (sampling
plus the feature fetch: complete batches, as a training loop gets them). Each
process uses one thread, so N processes need N cores.

Side by side, in the same run, it times PyG's single-process
``torch_geometric.loader.NeighborLoader`` on the unpartitioned graph when
pyg-lib or torch_sparse is importable (PyG has no pure-PyTorch sampler), and
records that the baseline was skipped otherwise.

Writes ``sampling.json`` and ``sampling.png`` to ``--out`` and prints a table.

    python benchmarks/sampling.py
    python benchmarks/sampling.py --num-nodes 200000 --world-sizes 1 2 4
"""
import argparse
import json
import os
import os.path as osp
import sys
import tempfile
import time
from datetime import timedelta

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

FANOUTS = [15, 10, 5]


def _time_batches(loader_iter, num_warmup: int, num_batches: int,
                  step_s: float = 0.0):
    """Times ``num_batches`` batches after ``num_warmup``; returns
    ``(seconds, seeds, sampled nodes, sampled edges)``. ``step_s``: a
    training step's time after every batch, spent sleeping (the core is
    free, as while a GPU computes), which a loader with ``num_workers > 0``
    overlaps with sampling."""
    for _ in range(num_warmup):
        next(loader_iter)
    seeds = nodes = edges = 0
    start = time.perf_counter()
    for _ in range(num_batches):
        batch = next(loader_iter)
        seeds += batch.batch_size
        nodes += batch.n_id.numel()
        edges += batch.edge_index.size(1)
        time.sleep(step_s)
    return time.perf_counter() - start, seeds, nodes, edges


def _worker(rank: int, world_size: int, port: int, root: str,
            args: argparse.Namespace, result_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank), MASTER_ADDR='127.0.0.1',
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from pyg_sar import comm, load_partition
    from pyg_sar.loader import DistNeighborLoader
    comm.init_distributed(backend='gloo', timeout=timedelta(minutes=5))
    part = load_partition(root, rank)
    # Every rank times the same number of full batches: all do real work in
    # every round, as in a balanced training epoch.
    needed = (args.num_warmup + args.num_batches) * args.batch_size
    loader = DistNeighborLoader(part, FANOUTS,
                                input_nodes=part.node_ids[:needed],
                                batch_size=args.batch_size, shuffle=False,
                                seed=0, ids='partition', pad_batches=False,
                                num_workers=args.num_workers)
    comm.barrier()
    comm.reset_comm_stats()
    epoch = iter(loader)
    seconds, seeds, nodes, edges = _time_batches(
        epoch, args.num_warmup, args.num_batches, args.step_ms / 1000)
    stats = comm.comm_stats()
    for _ in epoch:  # end the epoch collectively (no batches are left)
        pass
    with open(osp.join(result_dir, f'{rank}.json'), 'w') as f:
        json.dump(dict(rank=rank, seconds=seconds, seeds=seeds, nodes=nodes,
                       edges=edges, bytes_sent=stats['bytes_sent']), f)
    comm.barrier()


def run_distributed(world_size: int, root: str,
                    args: argparse.Namespace) -> dict:
    import torch.multiprocessing as mp

    from pyg_sar.comm import find_free_port
    port = find_free_port()
    with tempfile.TemporaryDirectory() as result_dir:
        ctx = mp.get_context('spawn')
        procs = [ctx.Process(target=_worker, args=(r, world_size, port, root,
                                                   args, result_dir))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        results = []
        for r, p in enumerate(procs):
            path = osp.join(result_dir, f'{r}.json')
            if p.exitcode != 0 or not osp.exists(path):
                raise RuntimeError(f'N={world_size}: rank {r} failed (exit '
                                   f'code {p.exitcode})')
            with open(path) as f:
                results.append(json.load(f))
    per_process = [r['seeds'] / r['seconds'] for r in results]
    return dict(
        name=f'pyg_sar DistNeighborLoader N={world_size}',
        world_size=world_size,
        seeds_per_s_per_process=sum(per_process) / world_size,
        min_seeds_per_s_per_process=min(per_process),
        nodes_per_batch=sum(r['nodes'] for r in results) /
        sum(args.num_batches for _ in results),
        edges_per_batch=sum(r['edges'] for r in results) /
        sum(args.num_batches for _ in results),
        mib_sent_per_batch=sum(r['bytes_sent'] for r in results) / 2**20 /
        (world_size * (args.num_batches)),
    )


def run_pyg_baseline(data, args: argparse.Namespace) -> dict:
    from pyg_sar.utils.compat import HAS_PYG_LIB, HAS_TORCH_SPARSE
    name = 'PyG NeighborLoader (1 process)'
    if not (HAS_PYG_LIB or HAS_TORCH_SPARSE):
        return dict(name=name, available=False,
                    reason='neither pyg-lib nor torch_sparse is importable; '
                    "PyG's NeighborLoader has no pure-PyTorch sampler")
    from torch_geometric.loader import NeighborLoader
    torch.set_num_threads(1)
    needed = (args.num_warmup + args.num_batches) * args.batch_size
    loader = NeighborLoader(data, FANOUTS, batch_size=args.batch_size,
                            input_nodes=torch.arange(needed))
    seconds, seeds, nodes, edges = _time_batches(iter(loader),
                                                 args.num_warmup,
                                                 args.num_batches)
    return dict(name=name, available=True,
                backend='pyg-lib' if HAS_PYG_LIB else 'torch_sparse',
                seeds_per_s_per_process=seeds / seconds,
                nodes_per_batch=nodes / args.num_batches,
                edges_per_batch=edges / args.num_batches)


def plot(rows: list, path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    skipped = [r for r in rows if not r.get('seeds_per_s_per_process')]
    rows = [r for r in rows if r.get('seeds_per_s_per_process')]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    names = [r['name'].replace(' DistNeighborLoader', '\n') for r in rows]
    values = [r['seeds_per_s_per_process'] for r in rows]
    ax.bar(names, values, color=['C0'] * len(rows))
    ax.set_ylabel('seeds / s / process')
    ax.set_title(f'Neighbor sampling, fanouts {FANOUTS}')
    for i, v in enumerate(values):
        ax.text(i, v, f'{v:,.0f}', ha='center', va='bottom')
    ax.set_ylim(0, max(values) * 1.2)
    for r in skipped:  # say why a bar is missing
        ax.text(0.5, -0.28, f"{r['name']}: not run ({r['reason']})",
                transform=ax.transAxes, ha='center', va='top', fontsize=7,
                wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--num-nodes', type=int, default=100_000)
    parser.add_argument('--avg-degree', type=float, default=20)
    parser.add_argument('--batch-size', type=int, default=1024)
    parser.add_argument('--num-batches', type=int, default=10)
    parser.add_argument('--num-warmup', type=int, default=2)
    parser.add_argument('--world-sizes', type=int, nargs='+', default=[1, 2])
    parser.add_argument('--num-workers', type=int, default=0,
                        help='the loader\'s num_workers (> 0: sampling in '
                        'a background thread, ahead of the loop)')
    parser.add_argument('--step-ms', type=float, default=0.0,
                        help='a simulated training step per batch (sleep)')
    parser.add_argument('--out', default=osp.join(
        osp.dirname(osp.abspath(__file__)), 'results'))
    args = parser.parse_args()

    from pyg_sar import datasets, partition_graph
    data = datasets.synthetic_graph(args.num_nodes, args.avg_degree, 16, 5,
                                    seed=0)
    if data.num_edges < 1_000_000:
        print(f'warning: only {data.num_edges:,} edges (< 1M)')
    per_rank_seeds = (args.num_warmup + args.num_batches) * args.batch_size
    if per_rank_seeds * max(args.world_sizes) > args.num_nodes:
        parser.error('too few nodes for the requested batches per rank')

    rows = []
    with tempfile.TemporaryDirectory() as work_dir:
        for world_size in args.world_sizes:
            root = osp.join(work_dir, f'parts{world_size}')
            partition_graph(data, world_size, root, progress=False)
            rows.append(run_distributed(world_size, root, args))
    rows.append(run_pyg_baseline(data, args))

    result = dict(num_nodes=data.num_nodes, num_edges=data.num_edges,
                  fanouts=FANOUTS, batch_size=args.batch_size,
                  num_batches=args.num_batches, threads_per_process=1,
                  num_workers=args.num_workers, step_ms=args.step_ms,
                  cpu_count=os.cpu_count(), torch=torch.__version__,
                  results=rows)
    baseline = rows[-1]
    if baseline.get('available'):
        for row in rows[:-1]:
            row['ratio_to_pyg'] = row['seeds_per_s_per_process'] / \
                baseline['seeds_per_s_per_process']
    os.makedirs(args.out, exist_ok=True)
    with open(osp.join(args.out, 'sampling.json'), 'w') as f:
        json.dump(result, f, indent=2)
    plot(rows, osp.join(args.out, 'sampling.png'))

    print(f'graph: {data.num_nodes:,} nodes, {data.num_edges:,} edges; '
          f'fanouts {FANOUTS}, batch size {args.batch_size}, 1 thread per '
          f'process')
    print(f"{'loader':<40}{'seeds/s/proc':>14}{'nodes/batch':>13}"
          f"{'edges/batch':>13}{'vs PyG':>8}")
    for row in rows:
        if not row.get('seeds_per_s_per_process'):
            print(f"{row['name']:<40}{'n/a':>14}  ({row['reason']})")
            continue
        ratio = row.get('ratio_to_pyg')
        print(f"{row['name']:<40}{row['seeds_per_s_per_process']:>14,.0f}"
              f"{row['nodes_per_batch']:>13,.0f}"
              f"{row['edges_per_batch']:>13,.0f}"
              f"{(f'{ratio:.2f}x' if ratio else '-'):>8}")
    print(f"wrote {osp.join(args.out, 'sampling.json')} and sampling.png")


if __name__ == '__main__':
    main()
