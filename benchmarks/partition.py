"""Time and peak memory of partitioning synthetic graphs of growing size.

Each size runs in its own subprocess so that its peak resident memory
(``ru_maxrss``) is measured cleanly. Writes ``partition.json`` and
``partition.png`` to the output directory and prints a table.

    python benchmarks/partition.py                      # 100k and 1M nodes
    python benchmarks/partition.py --max-nodes 3000000  # adds 3M nodes
"""
import argparse
import json
import os
import os.path as osp
import resource
import shutil
import subprocess
import sys
import tempfile
import time

DEFAULT_SIZES = [100_000, 1_000_000, 3_000_000]


def _peak_rss_gib() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def run_one(args: argparse.Namespace) -> None:
    r"""Generates and partitions one graph; prints one JSON line."""
    import torch

    from pyg_sar import datasets, partition_graph

    start = time.perf_counter()
    data = datasets.synthetic_graph(args.num_nodes, args.avg_degree,
                                    args.num_features, args.num_classes,
                                    seed=0)
    generate_s = time.perf_counter() - start
    generate_peak = _peak_rss_gib()
    graph_gib = (data.edge_index.numel() * 8 + data.x.numel() * 4 +
                 data.num_nodes * (8 + 3)) / 2**30

    out_dir = osp.join(args.work_dir, f'{args.method}_{args.num_nodes}')
    start = time.perf_counter()
    manifest = partition_graph(data, args.num_parts, out_dir,
                               method=args.method, progress=False)
    partition_s = time.perf_counter() - start
    print(
        json.dumps({
            'num_nodes': data.num_nodes,
            'num_edges': data.num_edges,
            'num_parts': args.num_parts,
            'method': args.method,
            'threads': torch.get_num_threads(),
            'graph_gib': round(graph_gib, 3),
            'generate_s': round(generate_s, 2),
            'generate_peak_rss_gib': round(generate_peak, 3),
            'partition_s': round(partition_s, 2),
            'stage_s': manifest['time_s'],
            'peak_rss_gib': round(_peak_rss_gib(), 3),
            'edge_cut_fraction': manifest['edge_cut']['fraction'],
            'nodes_max_over_mean': manifest['balance']['nodes_max_over_mean'],
        }))
    shutil.rmtree(out_dir)


def plot(results: list, path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(10, 4))
    for method in sorted({r['method'] for r in results}):
        rows = [r for r in results if r['method'] == method]
        nodes = [r['num_nodes'] for r in rows]
        ax_time.plot(nodes, [r['partition_s'] for r in rows], 'o-',
                     label=f'{method}: partition')
        ax_time.plot(nodes, [r['generate_s'] for r in rows], 's--',
                     label=f'{method}: generate')
        ax_mem.plot(nodes, [r['peak_rss_gib'] for r in rows], 'o-',
                    label=f'{method}: peak RSS')
        ax_mem.plot(nodes, [r['graph_gib'] for r in rows], 's--',
                    label=f'{method}: graph size')
    for ax, label in [(ax_time, 'seconds'), (ax_mem, 'GiB')]:
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.set_xlabel('nodes')
        ax.set_ylabel(label)
        ax.grid(True, which='both', alpha=0.3)
        ax.legend(fontsize=8)
    ax_time.set_title('Partition time')
    ax_mem.set_title('Peak memory')
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--max-nodes', type=int, default=1_000_000,
                        help='largest size to run (default: %(default)s)')
    parser.add_argument('--sizes', type=int, nargs='*', default=None,
                        help=f'node counts (default: {DEFAULT_SIZES} up to '
                        f'--max-nodes)')
    parser.add_argument('--avg-degree', type=float, default=20.0)
    parser.add_argument('--num-features', type=int, default=128)
    parser.add_argument('--num-classes', type=int, default=10)
    parser.add_argument('--num-parts', type=int, default=4)
    parser.add_argument('--methods', nargs='+', default=['metis'],
                        choices=['metis', 'random'])
    parser.add_argument('--out', default=osp.join(
        osp.dirname(osp.abspath(__file__)), 'results'))
    parser.add_argument('--work-dir', default=None,
                        help='scratch space for the partitions')
    # Internal: run a single size in this process.
    parser.add_argument('--one', action='store_true', help=argparse.SUPPRESS)
    parser.add_argument('--num-nodes', type=int, help=argparse.SUPPRESS)
    parser.add_argument('--method', help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.one:
        run_one(args)
        return

    sizes = args.sizes or [n for n in DEFAULT_SIZES if n <= args.max_nodes]
    os.makedirs(args.out, exist_ok=True)
    work_dir = args.work_dir or tempfile.mkdtemp(prefix='pyg_sar_bench_')
    results = []
    try:
        for method in args.methods:
            for num_nodes in sizes:
                command = [
                    sys.executable, osp.abspath(__file__), '--one',
                    '--num-nodes', str(num_nodes), '--method', method,
                    '--avg-degree', str(args.avg_degree), '--num-features',
                    str(args.num_features), '--num-classes',
                    str(args.num_classes), '--num-parts',
                    str(args.num_parts), '--work-dir', work_dir
                ]
                completed = subprocess.run(command, capture_output=True,
                                           text=True)
                if completed.returncode != 0:
                    sys.stderr.write(completed.stderr)
                    raise SystemExit(f'{method} with {num_nodes} nodes '
                                     f'failed (exit {completed.returncode})')
                result = json.loads(completed.stdout.strip().splitlines()[-1])
                results.append(result)
                print(f"{method:>6} {result['num_nodes']:>10,} nodes "
                      f"{result['num_edges']:>12,} edges: "
                      f"partition {result['partition_s']:7.1f}s, peak "
                      f"{result['peak_rss_gib']:5.2f} GiB", flush=True)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work_dir, ignore_errors=True)

    header = (f"{'method':>6} {'nodes':>10} {'edges':>12} {'generate s':>10} "
              f"{'partition s':>11} {'peak GiB':>8} {'graph GiB':>9} "
              f"{'cut %':>6} {'balance':>7}")
    print()
    print(header)
    print('-' * len(header))
    for r in results:
        print(f"{r['method']:>6} {r['num_nodes']:>10,} {r['num_edges']:>12,} "
              f"{r['generate_s']:>10.1f} {r['partition_s']:>11.1f} "
              f"{r['peak_rss_gib']:>8.2f} {r['graph_gib']:>9.2f} "
              f"{100 * r['edge_cut_fraction']:>6.2f} "
              f"{r['nodes_max_over_mean']:>7.3f}")

    json_path = osp.join(args.out, 'partition.json')
    with open(json_path, 'w') as f:
        json.dump(results, f, indent=2)
    png_path = osp.join(args.out, 'partition.png')
    plot(results, png_path)
    print(f'\nWrote {json_path} and {png_path}')


if __name__ == '__main__':
    main()
