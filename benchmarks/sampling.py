"""Throughput of distributed neighbor sampling against PyG's own
``NeighborLoader``, side by side in one run (seeds per second per process).

Generates a synthetic graph (>= 1M edges) and partitions it for every world
size N. Then, in rounds, each configuration runs in fresh processes, one
after the other (interleaved, so a change of the machine's load hits all of
them alike):

- PyG's single-process ``torch_geometric.loader.NeighborLoader`` on the
  unpartitioned graph (needs pyg-lib or torch_sparse: PyG has no
  pure-PyTorch sampler; without either the baseline is recorded as skipped);
- :class:`pyg_sar.loader.DistNeighborLoader` on N gloo processes on
  loopback, every rank given the same global seeds (as a PyG script passes
  ``data.train_mask``), each keeping its own, balanced;

for every ``num_workers`` asked (PyG: DataLoader worker processes; pyg_sar:
one background thread). Both use fanouts [15, 10, 5], the same batch size,
the same seeds (a random permutation of the nodes: at N=1 exactly PyG's
seeds, in PyG's order) and complete batches with features, and one thread
per process. Sampled nodes and edges per seed are reported with the speed,
so the comparison is like for like. The ratio of a configuration is its
seeds/s per process over PyG's (same num_workers) in the same round; the
table shows the median over rounds.

Writes ``sampling.json`` and ``sampling.png`` to ``--out`` and prints a
table.

    python benchmarks/sampling.py
    python benchmarks/sampling.py --num-nodes 200000 --num-batches 20 \\
        --num-warmup 3 --world-sizes 1 2 --num-workers 0 1 --rounds 3

The committed results come from the second call, run in a virtual
environment with torch_sparse built from source for the baseline (pyg_sar
needs neither torch_sparse nor pyg-lib).
"""
import argparse
import json
import os
import os.path as osp
import statistics
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


def _seeds(num_nodes: int, count: int) -> torch.Tensor:
    """The benchmark's seeds: the first ``count`` of a fixed random
    permutation of the nodes (dataset ids)."""
    return torch.randperm(num_nodes, generator=torch.Generator().manual_seed(
        0))[:count]


def _ours_worker(rank: int, world_size: int, port: int, root: str,
                 args: argparse.Namespace, num_workers: int, num_nodes: int,
                 result_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank), MASTER_ADDR='127.0.0.1',
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from pyg_sar import comm, load_partition
    from pyg_sar.loader import DistNeighborLoader
    comm.init_distributed(backend='gloo', timeout=timedelta(minutes=5))
    part = load_partition(root, rank)
    # Every rank gets the same global seeds and keeps its own; balancing
    # gives each the same number of full batches, so all do real work in
    # every round, as in a training epoch.
    needed = (args.num_warmup + args.num_batches) * args.batch_size
    loader = DistNeighborLoader(part, FANOUTS,
                                input_nodes=_seeds(num_nodes,
                                                   needed * world_size),
                                batch_size=args.batch_size, shuffle=False,
                                seed=0, num_workers=num_workers)
    comm.barrier()
    comm.reset_comm_stats()
    epoch = iter(loader)
    seconds, seeds, nodes, edges = _time_batches(
        epoch, args.num_warmup, args.num_batches, args.step_ms / 1000)
    stats = comm.comm_stats()
    for _ in epoch:  # end the epoch collectively (no batches are left)
        pass
    with open(osp.join(result_dir, f'{rank}.json'), 'w') as f:
        json.dump(dict(seconds=seconds, seeds=seeds, nodes=nodes,
                       edges=edges, bytes_sent=stats['bytes_sent']), f)
    comm.barrier()


def _pyg_worker(rank: int, data_path: str, args: argparse.Namespace,
                num_workers: int, result_dir: str) -> None:
    torch.set_num_threads(1)
    from torch_geometric.loader import NeighborLoader
    data = torch.load(data_path, weights_only=False)  # written by main()
    needed = (args.num_warmup + args.num_batches) * args.batch_size
    loader = NeighborLoader(data, FANOUTS, batch_size=args.batch_size,
                            input_nodes=_seeds(data.num_nodes, needed),
                            num_workers=num_workers)
    seconds, seeds, nodes, edges = _time_batches(
        iter(loader), args.num_warmup, args.num_batches, args.step_ms / 1000)
    with open(osp.join(result_dir, f'{rank}.json'), 'w') as f:
        json.dump(dict(seconds=seconds, seeds=seeds, nodes=nodes,
                       edges=edges, bytes_sent=0), f)


def _launch(target, world_size: int, args_of_rank) -> list:
    """Runs ``target(rank, *args_of_rank(result_dir))`` in ``world_size``
    fresh (spawned) processes; returns their results in rank order."""
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as result_dir:
        ctx = mp.get_context('spawn')
        procs = [ctx.Process(target=target,
                             args=(r, *args_of_rank(result_dir)))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        results = []
        for r, p in enumerate(procs):
            path = osp.join(result_dir, f'{r}.json')
            if p.exitcode != 0 or not osp.exists(path):
                raise RuntimeError(f'{target.__name__}: rank {r} failed '
                                   f'(exit code {p.exitcode})')
            with open(path) as f:
                results.append(json.load(f))
    return results


def _measure(results: list, batches: int) -> dict:
    """One configuration's numbers from its ranks' results (``batches``:
    each rank's, warm-up included, over which the traffic is counted)."""
    per_process = [r['seeds'] / r['seconds'] for r in results]
    seeds = sum(r['seeds'] for r in results)
    return dict(seeds_per_s_per_process=sum(per_process) / len(results),
                min_seeds_per_s_per_process=min(per_process),
                nodes_per_seed=sum(r['nodes'] for r in results) / seeds,
                edges_per_seed=sum(r['edges'] for r in results) / seeds,
                mib_sent_per_batch=sum(r['bytes_sent'] for r in results) /
                2**20 / (len(results) * batches))


def run_ours(world_size: int, root: str, args: argparse.Namespace,
             num_workers: int, num_nodes: int) -> dict:
    from pyg_sar.comm import find_free_port
    port = find_free_port()
    return _measure(_launch(_ours_worker, world_size, lambda d: (
        world_size, port, root, args, num_workers, num_nodes, d)),
        args.num_warmup + args.num_batches)


def run_pyg(data_path: str, args: argparse.Namespace,
            num_workers: int) -> dict:
    return _measure(_launch(_pyg_worker, 1, lambda d: (
        data_path, args, num_workers, d)), args.num_warmup + args.num_batches)


def plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    rows = [r for r in result['results'] if r.get('seeds_per_s_per_process')]
    fig, ax = plt.subplots(figsize=(7.5, 4))
    names = [r['name'].replace('pyg_sar DistNeighborLoader', 'pyg_sar')
             .replace('PyG NeighborLoader', 'PyG').replace(', ', '\n')
             for r in rows]
    values = [r['seeds_per_s_per_process'] for r in rows]
    colors = ['C1' if r['loader'] == 'pyg' else 'C0' for r in rows]
    ax.bar(range(len(rows)), values, color=colors)
    ax.set_xticks(range(len(rows)), names, fontsize=8)
    ax.set_ylabel('seeds / s / process')
    ax.set_title(f"Neighbor sampling, fanouts {FANOUTS}, "
                 f"{result['num_nodes']:,} nodes "
                 f"(orange: PyG, blue: pyg_sar)", fontsize=9)
    for i, r in enumerate(rows):
        label = f'{values[i]:,.0f}'
        if r.get('ratio_to_pyg'):
            label += f"\n{r['ratio_to_pyg']:.2f}x PyG"
        ax.text(i, values[i], label, ha='center', va='bottom', fontsize=7)
    ax.set_ylim(0, max(values) * 1.3)
    if not result['baseline_available']:
        ax.text(0.5, -0.3, f"PyG: not run ({result['baseline_reason']})",
                transform=ax.transAxes, ha='center', va='top', fontsize=7,
                wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _load() -> list:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--num-nodes', type=int, default=100_000)
    parser.add_argument('--avg-degree', type=float, default=20)
    parser.add_argument('--batch-size', type=int, default=1024)
    parser.add_argument('--num-batches', type=int, default=10)
    parser.add_argument('--num-warmup', type=int, default=2)
    parser.add_argument('--world-sizes', type=int, nargs='+', default=[1, 2])
    parser.add_argument('--num-workers', type=int, nargs='+', default=[0],
                        help="the loaders' num_workers (pyg_sar: > 0 runs "
                        "the rounds in a background thread; PyG: worker "
                        "processes)")
    parser.add_argument('--rounds', type=int, default=1,
                        help='interleaved repetitions of every '
                        'configuration (the table shows medians)')
    parser.add_argument('--step-ms', type=float, default=0.0,
                        help='a simulated training step per batch (sleep)')
    parser.add_argument('--note', default='',
                        help='recorded with the results (e.g. the load)')
    parser.add_argument('--out', default=osp.join(
        osp.dirname(osp.abspath(__file__)), 'results'))
    args = parser.parse_args()

    from pyg_sar import datasets, partition_graph
    from pyg_sar.utils.compat import HAS_PYG_LIB, HAS_TORCH_SPARSE
    data = datasets.synthetic_graph(args.num_nodes, args.avg_degree, 16, 5,
                                    seed=0)
    if data.num_edges < 1_000_000:
        print(f'warning: only {data.num_edges:,} edges (< 1M)')
    per_rank_seeds = (args.num_warmup + args.num_batches) * args.batch_size
    if per_rank_seeds * max(args.world_sizes) > args.num_nodes:
        parser.error('too few nodes for the requested batches per rank')
    baseline = HAS_PYG_LIB or HAS_TORCH_SPARSE
    configs = []  # (loader, world size, num_workers), in running order
    for nw in args.num_workers:
        if baseline:
            configs.append(('pyg', 1, nw))
        configs += [('ours', n, nw) for n in args.world_sizes]

    load_before, start = _load(), time.perf_counter()
    runs = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as work_dir:
        data_path = osp.join(work_dir, 'data.pt')
        torch.save(data, data_path)
        roots = {}
        for world_size in args.world_sizes:
            roots[world_size] = osp.join(work_dir, f'parts{world_size}')
            partition_graph(data, world_size, roots[world_size],
                            progress=False)
        for round_ in range(args.rounds):
            for loader, n, nw in configs:
                runs[(loader, n, nw)].append(
                    run_pyg(data_path, args, nw) if loader == 'pyg' else
                    run_ours(n, roots[n], args, nw, data.num_nodes))
                speed = runs[(loader, n, nw)][-1]['seeds_per_s_per_process']
                print(f'round {round_}: {loader} N={n} num_workers={nw}: '
                      f'{speed:,.0f} seeds/s/process', flush=True)

    rows = []
    for loader, n, nw in configs:
        measured = runs[(loader, n, nw)]
        name = (f'PyG NeighborLoader, 1 process, num_workers={nw}'
                if loader == 'pyg' else
                f'pyg_sar DistNeighborLoader, N={n}, num_workers={nw}')
        row = dict(name=name, loader=loader, world_size=n, num_workers=nw,
                   rounds=measured)
        for key in measured[0]:
            row[key] = statistics.median(m[key] for m in measured)
        if loader == 'ours' and baseline:
            pyg = runs[('pyg', 1, nw)]
            ratios = [m['seeds_per_s_per_process'] /
                      p['seeds_per_s_per_process']
                      for m, p in zip(measured, pyg)]
            row['ratio_to_pyg'] = statistics.median(ratios)
            row['ratios_per_round'] = ratios
        rows.append(row)

    result = dict(
        num_nodes=data.num_nodes, num_edges=data.num_edges, fanouts=FANOUTS,
        batch_size=args.batch_size, num_batches=args.num_batches,
        num_warmup=args.num_warmup, rounds=args.rounds,
        threads_per_process=1, step_ms=args.step_ms,
        cpu_count=os.cpu_count(), torch=torch.__version__,
        pyg=__import__('torch_geometric').__version__,
        baseline_available=baseline,
        baseline_backend=('pyg-lib' if HAS_PYG_LIB else 'torch_sparse')
        if baseline else None,
        baseline_reason=None if baseline else
        "neither pyg-lib nor torch_sparse is importable; PyG's "
        "NeighborLoader has no pure-PyTorch sampler",
        load_average_before=load_before, load_average_after=_load(),
        wall_s=round(time.perf_counter() - start, 1), note=args.note,
        results=rows)
    if baseline and result['baseline_backend'] == 'torch_sparse':
        import torch_sparse
        result['baseline_backend'] += f' {torch_sparse.__version__}'
    os.makedirs(args.out, exist_ok=True)
    with open(osp.join(args.out, 'sampling.json'), 'w') as f:
        json.dump(result, f, indent=2)
    plot(result, osp.join(args.out, 'sampling.png'))

    print(f'graph: {data.num_nodes:,} nodes, {data.num_edges:,} edges; '
          f'fanouts {FANOUTS}, batch size {args.batch_size}, 1 thread per '
          f'process; medians of {args.rounds} interleaved round(s); load '
          f'average {load_before} -> {result["load_average_after"]}')
    if not baseline:
        print(f"PyG baseline not run: {result['baseline_reason']}")
    print(f"{'loader':<54}{'seeds/s/proc':>13}{'nodes/seed':>11}"
          f"{'edges/seed':>11}{'vs PyG':>8}")
    for row in rows:
        ratio = row.get('ratio_to_pyg')
        print(f"{row['name']:<54}{row['seeds_per_s_per_process']:>13,.0f}"
              f"{row['nodes_per_seed']:>11.1f}{row['edges_per_seed']:>11.1f}"
              f"{(f'{ratio:.2f}x' if ratio else '-'):>8}")
    print(f"wrote {osp.join(args.out, 'sampling.json')} and sampling.png")


if __name__ == '__main__':
    main()
