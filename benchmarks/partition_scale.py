"""Time, peak memory and quality of the partitioning paths at scale.

Every size is generated once to a graph directory
(:mod:`pyg_sar.partition.input.ondisk`) by a separate process:
``synthetic_graph(N, 20, 16, 16, seed=0)`` written with ``save_graph``, or,
to reach >= 400M edges, written chunk by chunk without holding the graph:
``--streamed-generator dcsbm``, the same model
(:func:`~pyg_sar.datasets.synthetic_ondisk.write_synthetic_dcsbm`), or
``--streamed-generator blocks``, a harder one where half of every node's
edges come from anywhere
(:func:`~pyg_sar.partition.input.ondisk.write_synthetic_graph`). Then every
path runs in its own process,
its peak resident set read from ``/proc/self/status`` (``VmHWM``), joined
with the KaMinPar child's (a process of its own, run while the caller
waits): the larger of the caller's own peak and the caller's resident set
during the child plus the child's peak. For K writers: the sum of the K
ranks' peaks. Every row also states the target's budget, 12 bytes per input
edge plus 16 bytes per node, and whether the peak is within it:

- ``memory-metis``: today's path: the graph as a ``Data`` in memory,
  ``partition_graph(method='metis')``;
- ``memory-kaminpar``: the same with ``method='kaminpar'`` (when the
  partitioner offers it);
- ``ondisk``: ``partition_graph(graph_dir)``, memory-mapped inputs and the
  streamed writer (``--ondisk-method``, default kaminpar when available,
  else metis: then the assignment still gathers the edge list);
- ``parallel2``: the same through ``torchrun --nproc-per-node 2``
  (:func:`pyg_sar.partition.partition_graph_parallel`);
- ``ondisk-random`` (not run by default): the on-disk path with a random
  assignment: the streamed writer's own time and memory, whatever the
  partitioner needs;
- ``ondisk-assign`` (not run by default): the on-disk path's assignment
  alone (:func:`~pyg_sar.partition.assign.parts.assign_parts` on the graph
  directory: symmetrization, KaMinPar, repair, training-node balance), for
  sizes whose shards do not fit the disk.

``--kill-after PHASE`` (path ``ondisk``) first runs the partition until
PHASE is recorded and kills it (SIGKILL), then measures the run that
resumes it (the row's ``resumed`` lists the reused phases);
``--symmetrize-bytes-per-edge`` sets the out-of-core symmetrization's
budget and ``--variant`` labels the rows (e.g. the code version measured).
Rows carry the manifest's ``disk_bytes`` per phase and the caller's own
peak up to KaMinPar's start (``caller_peak_before_child_bytes``: the
symmetrization's).

Bytes per edge are the peak RSS over the input edges (also above the
resident set after the imports, ~0.3 GiB per process, which dominates small
graphs). The edge cut and
node balance of each path sit beside METIS's. Writes
``partition_scale.json`` (and ``partition_scale.png``, memory against
edges with the 24 GiB line, when matplotlib is installed) to ``--out``.

    python benchmarks/partition_scale.py --sizes 1000000
    python benchmarks/partition_scale.py --sizes 1000000 4000000 \\
        --paths memory-metis ondisk parallel2
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

PATHS = ('memory-metis', 'memory-kaminpar', 'ondisk', 'parallel2',
         'ondisk-random', 'ondisk-assign')
DEFAULT_PATHS = PATHS[:4]
BUDGET_GIB = 24


def _peak_bytes() -> int:
    r"""This process's peak resident set: ``VmHWM``, not ``getrusage``,
    whose ``ru_maxrss`` keeps the high-water mark of the process image
    before ``exec`` (the parent's)."""
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmHWM'):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss_bytes() -> int:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmRSS'):
                return int(line.split()[1]) * 1024
    return 0


def _methods():
    from pyg_sar.partition.layout import METHODS
    return METHODS


def generate(args: argparse.Namespace) -> None:
    r"""Child: writes the graph of :obj:`args.num_nodes` nodes."""
    from pyg_sar.partition.input.ondisk import (save_graph,
                                                write_synthetic_graph)
    start = time.perf_counter()
    if args.streamed_generator == 'dcsbm':
        from pyg_sar.datasets.synthetic_ondisk import write_synthetic_dcsbm
        write_synthetic_dcsbm(args.graph_dir, args.num_nodes,
                              args.avg_degree, 16, 16, seed=0)
    elif args.streamed_generator:
        write_synthetic_graph(args.graph_dir, args.num_nodes,
                              args.avg_degree, 16, 16, seed=0)
    else:
        from pyg_sar.datasets import synthetic_graph
        save_graph(synthetic_graph(args.num_nodes, args.avg_degree, 16, 16,
                                   seed=0), args.graph_dir)
    print(json.dumps({'generate_s': round(time.perf_counter() - start, 2),
                      'peak_bytes': _peak_bytes()}))


def _load_data(graph_dir: str):
    r"""The graph directory as an in-memory ``Data`` (today's input)."""
    import numpy as np
    import torch
    from torch_geometric.data import Data

    from pyg_sar.partition.input.ondisk import GraphOnDisk
    graph = GraphOnDisk(graph_dir)
    data = Data(edge_index=torch.from_numpy(np.array(graph.edge_index)),
                num_nodes=graph.num_nodes)
    for key, value in {**graph.node_attrs, **graph.edge_attrs}.items():
        data[key] = torch.from_numpy(np.array(value))
    return data


def _assign_only(args: argparse.Namespace) -> dict:
    r"""The on-disk path's assignment alone, each stage's start logged to
    stderr; the row's statistics."""
    from pyg_sar.partition.assign.parts import assign_parts
    from pyg_sar.partition.input.ondisk import GraphOnDisk
    from pyg_sar.partition.write.homogeneous import _train_mask
    source = GraphOnDisk(args.graph_dir).source()
    start = time.perf_counter()

    def log(stage: str) -> None:
        print(f'{time.perf_counter() - start:9.1f} s  {stage}  (RSS '
              f'{_rss_bytes() / 2**30:.2f} GiB)', file=sys.stderr,
              flush=True)

    part, stats = assign_parts(source.edges, args.num_parts, args.method,
                               train_mask=_train_mask(source),
                               tmp_dir=args.work_dir, progress_callback=log)
    log('input edges cut')
    # The cut over the input's directed edges, as the writer's manifest
    # states it: one more pass over the edges.
    cut_start, cut = time.perf_counter(), 0
    for _, src, dst in source.edges.chunks(1 << 24):
        cut += int((part[src] != part[dst]).sum())
        del src, dst
    stats['timings']['input_cut'] = round(time.perf_counter() - cut_start, 3)
    log('done')
    undirected = stats['num_undirected_edges'] or 1
    return {'stage_s': stats['timings'], 'num_edges': source.num_edges,
            'edge_cut': round(cut / max(source.num_edges, 1), 6),
            'symmetrized_edge_cut': round(stats['edge_cut'] / undirected, 6),
            'node_balance': round(stats['node_balance'], 4),
            'train_swaps': stats['num_swapped']}


def run_path(args: argparse.Namespace) -> None:
    r"""Child (or torchrun rank): one partition run; prints one JSON line
    (rank 0) or writes it to :obj:`args.rank_file`."""
    # The imports' memory is the baseline (the partitioner and the
    # parallel writers' collectives).
    import importlib
    importlib.import_module('pyg_sar.partition')
    importlib.import_module('pyg_sar.comm.shard_exchange')
    base = _rss_bytes()
    if args.symmetrize_bytes_per_edge is not None:
        # The out-of-core symmetrization's default budget, per input edge.
        from pyg_sar.partition.assign import symmetric_file
        symmetric_file.DEFAULT_BYTES_PER_EDGE = args.symmetrize_bytes_per_edge
        symmetric_file.MIN_BUDGET_BYTES = 1 << 20
    out_dir = osp.join(args.work_dir, f'{args.path}_{args.num_nodes}')
    if args.die_after:
        # A run that dies (SIGKILL) right after the phase is recorded.
        import signal

        from pyg_sar.partition import workdir
        workdir.after_phase = lambda name: os.kill(
            os.getpid(), signal.SIGKILL) if name == args.die_after else None
    start = time.perf_counter()
    manifest, assigned = None, None
    if args.path.startswith('memory-'):
        from pyg_sar.partition import partition_graph
        data = _load_data(args.graph_dir)
        start = time.perf_counter()  # the load is not the partitioner's
        manifest = partition_graph(data, args.num_parts, out_dir,
                                   method=args.method, progress=False)
    elif args.path == 'ondisk-assign':
        assigned = _assign_only(args)
    elif args.path in ('ondisk', 'ondisk-random'):
        from pyg_sar.partition import partition_graph
        manifest = partition_graph(args.graph_dir, args.num_parts, out_dir,
                                   method=args.method, progress=False)
    else:
        from datetime import timedelta

        from pyg_sar.comm import ProcessGroupExchange, init_distributed
        from pyg_sar.partition import partition_graph_parallel
        init_distributed(backend='gloo', timeout=timedelta(hours=2))
        manifest = partition_graph_parallel(
            args.graph_dir, args.num_parts, out_dir, method=args.method,
            progress=False, exchange=ProcessGroupExchange())
    # KaMinPar runs in a child process while this one waits: the joint peak
    # is the larger of this process's own peak and, during the child, this
    # process's resident set then plus the child's peak.
    from pyg_sar.partition.assign import kaminpar
    own, child = _peak_bytes(), kaminpar.last_peak_bytes or 0
    during = (kaminpar.last_caller_rss_bytes or own) if child else 0
    row = {'time_s': round(time.perf_counter() - start, 2),
           'peak_bytes': max(own, during + child), 'own_peak_bytes': own,
           'child_peak_bytes': child, 'rss_during_child_bytes': during,
           'import_bytes': base}
    # The caller's own peak up to KaMinPar's start: the symmetrization's.
    before = getattr(kaminpar, 'last_caller_peak_bytes', None)
    if child and before:
        row['caller_peak_before_child_bytes'] = before
    if assigned is not None:
        row.update(assigned)
    if manifest is not None:
        row.update(stage_s=manifest['time_s'], num_edges=manifest['num_edges'],
                   edge_cut=manifest['edge_cut']['fraction'],
                   node_balance=manifest['balance']['nodes_max_over_mean'])
        for key in ('disk_bytes', 'resumed'):
            if key in manifest:
                row[key] = manifest[key]
        shutil.rmtree(out_dir)
    if args.rank_file:
        with open(args.rank_file.replace('RANK', os.environ.get('RANK', '0')),
                  'w') as f:
            json.dump(row, f)
    else:
        print(json.dumps(row))


def _child(command, timeout, live=False):
    r"""Runs a child; its last stdout line is its JSON row. :obj:`live`:
    its stderr (progress) goes straight to this process's."""
    done = subprocess.run(command, stdout=subprocess.PIPE,
                          stderr=None if live else subprocess.PIPE,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        if live:
            return {'error': f'exit code {done.returncode} (its stderr '
                    f'above)'}
        tail = done.stderr.strip().splitlines()[-3:]
        return {'error': ' | '.join(tail)}
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def measure(args, path: str, num_nodes: int, graph_dir: str) -> dict:
    script = osp.abspath(__file__)
    method = args.ondisk_method
    if path == 'memory-metis':
        method = 'metis'
    elif path == 'memory-kaminpar':
        method = 'kaminpar'
    elif path == 'ondisk-random':
        method = 'random'
    if method not in _methods():
        return {'error': f"method '{method}' not available"}
    common = ['--run-path', path, '--num-nodes', str(num_nodes), '--method',
              method, '--graph-dir', graph_dir, '--work-dir', args.work_dir,
              '--num-parts', str(args.num_parts)]
    if args.symmetrize_bytes_per_edge is not None:
        common += ['--symmetrize-bytes-per-edge',
                   str(args.symmetrize_bytes_per_edge)]
    if path != 'parallel2':
        killed = {}
        if args.kill_after and path == 'ondisk':
            # First a run killed after the phase, then the measured one
            # resumes it.
            start = time.perf_counter()
            done = subprocess.run([sys.executable, script] + common +
                                  ['--die-after', args.kill_after],
                                  capture_output=True, timeout=args.timeout)
            killed = {'killed_after': args.kill_after,
                      'killed_run_s': round(time.perf_counter() - start, 2),
                      'killed_returncode': done.returncode}
        return dict(_child([sys.executable, script] + common, args.timeout,
                           live=path == 'ondisk-assign'),
                    method=method, **killed)
    rank_file = osp.join(args.work_dir, f'rank_RANK_{num_nodes}.json')
    done = _child([sys.executable, '-m', 'torch.distributed.run',
                   '--nproc-per-node', '2', script] + common +
                  ['--rank-file', rank_file], args.timeout)
    if 'error' in done:
        return done
    rows = [json.load(open(rank_file.replace('RANK', str(r))))
            for r in range(2)]
    result = dict(rows[0], method=method)
    result['peak_bytes'] = sum(r['peak_bytes'] for r in rows)
    result['import_bytes'] = sum(r['import_bytes'] for r in rows)
    result['peak_bytes_per_rank'] = [r['peak_bytes'] for r in rows]
    result['time_s'] = max(r['time_s'] for r in rows)
    return result


def budget_bytes(num_edges: int, num_nodes: int) -> int:
    r"""The issue's memory target for a whole out-of-core run: 12 bytes per
    input edge plus 16 bytes per node."""
    return 12 * int(num_edges) + 16 * int(num_nodes)


def add_cut_ratios(results: list) -> None:
    r"""Every row's edge cut over the METIS row's of the same size."""
    metis = {(r['num_nodes'], r.get('generator'), r.get('num_parts')):
             r['edge_cut'] for r in results
             if r.get('method') == 'metis' and r.get('edge_cut')}
    for r in results:
        key = (r['num_nodes'], r.get('generator'), r.get('num_parts'))
        if 'edge_cut' in r and key in metis:
            r['cut_vs_metis'] = round(r['edge_cut'] / metis[key], 4)


def plot(results: list, path: str) -> bool:
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in PATHS:
        for hard in (False, True):
            rows = [r for r in results if r['path'] == name and 'peak_gib'
                    in r and ('blocks' in r.get('generator', '')) == hard]
            if rows:
                ax.plot([r['num_edges'] for r in rows],
                        [r['peak_gib'] for r in rows],
                        'x' if hard else 'o-', label=name + (
                            ', half-random graph' if hard else ''))
    ax.axhline(BUDGET_GIB, color='red', linestyle='--',
               label=f'{BUDGET_GIB} GiB')
    sizes = sorted({(r['num_edges'], r['num_nodes']) for r in results
                    if 'num_edges' in r})
    if sizes:
        ax.plot([e for e, _ in sizes],
                [budget_bytes(e, n) / 2**30 for e, n in sizes], 'k:',
                label='12 B/edge + 16 B/node')
    ax.set_xscale('log')
    ax.set_yscale('log')
    ax.set_xlabel('input edges')
    ax.set_ylabel('peak RSS (GiB)')
    ax.grid(True, which='both', alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--sizes', type=int, nargs='+', default=[1_000_000],
                        help='node counts (default: %(default)s)')
    parser.add_argument('--paths', nargs='+', default=list(DEFAULT_PATHS),
                        choices=PATHS,
                        help='(default: %(default)s)')
    parser.add_argument('--num-parts', type=int, default=4)
    parser.add_argument('--avg-degree', type=int, default=20,
                        help='directed edges per node of the generated '
                        'graphs (even; default: %(default)s)')
    parser.add_argument('--ondisk-method', default=None,
                        help='assignment of the on-disk paths (default: '
                        'kaminpar when available, else metis)')
    parser.add_argument('--streamed-generator', nargs='?', const='blocks',
                        default=None, choices=('blocks', 'dcsbm'),
                        help='write the graphs chunk by chunk, for sizes '
                        "that do not fit memory: 'dcsbm', synthetic_graph's "
                        "model; 'blocks' (the default), half of every "
                        "node's edges from anywhere")
    parser.add_argument('--timeout', type=float, default=7200)
    parser.add_argument('--out', default=osp.join(
        osp.dirname(osp.abspath(__file__)), 'results'))
    parser.add_argument('--work-dir', default=None,
                        help='scratch space for graphs and partitions '
                        '(needs about 200 bytes per edge)')
    parser.add_argument('--keep-graphs', action='store_true')
    parser.add_argument('--symmetrize-bytes-per-edge', type=float,
                        default=None,
                        help='memory budget of the out-of-core '
                        'symmetrization per input edge (default: the '
                        "library's)")
    parser.add_argument('--kill-after', default=None,
                        choices=('check', 'symmetrize', 'kaminpar',
                                 'assign'),
                        help="path 'ondisk': first a run killed (SIGKILL) "
                        'right after this phase, then the measured run, '
                        'which resumes it')
    parser.add_argument('--variant', default=None,
                        help='a label stored in every row (and in the key '
                        'of --append): e.g. the code version measured')
    parser.add_argument('--append', action='store_true',
                        help="keep the other sizes' rows of an earlier "
                        "partition_scale.json in --out")
    # Internal: one child.
    parser.add_argument('--generate', action='store_true',
                        help=argparse.SUPPRESS)
    parser.add_argument('--run-path', dest='path', help=argparse.SUPPRESS)
    parser.add_argument('--num-nodes', type=int, help=argparse.SUPPRESS)
    parser.add_argument('--method', help=argparse.SUPPRESS)
    parser.add_argument('--graph-dir', help=argparse.SUPPRESS)
    parser.add_argument('--rank-file', help=argparse.SUPPRESS)
    parser.add_argument('--die-after', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        return generate(args)
    if args.path:
        return run_path(args)

    if args.ondisk_method is None:
        args.ondisk_method = 'kaminpar' if 'kaminpar' in _methods() \
            else 'metis'
    os.makedirs(args.out, exist_ok=True)
    own_work_dir = args.work_dir is None
    args.work_dir = args.work_dir or tempfile.mkdtemp(prefix='pyg_sar_scale_')
    script = osp.abspath(__file__)
    results = []
    try:
        for num_nodes in args.sizes:
            graph_dir = osp.join(args.work_dir, f'graph_{num_nodes}')
            if not osp.exists(osp.join(graph_dir, 'graph.json')):
                done = _child([sys.executable, script, '--generate',
                               '--num-nodes', str(num_nodes), '--graph-dir',
                               graph_dir, '--avg-degree',
                               str(args.avg_degree)] + (
                                   ['--streamed-generator',
                                    args.streamed_generator]
                                   if args.streamed_generator else []),
                               args.timeout)
                print(f'generated {num_nodes:,} nodes: {done}', flush=True)
            for path in args.paths:
                row = measure(args, path, num_nodes, graph_dir)
                row.update(path=path, num_nodes=num_nodes)
                if args.variant:
                    row['variant'] = args.variant
                if 'peak_bytes' in row:
                    row['peak_gib'] = round(row['peak_bytes'] / 2**30, 3)
                row['generator'] = {
                    None: 'synthetic_graph', 'dcsbm': 'synthetic_graph '
                    'model, streamed', 'blocks': 'blocks, half random '
                    '(streamed)'}[args.streamed_generator]
                if 'num_edges' in row:
                    row['budget_bytes'] = budget_bytes(row['num_edges'],
                                                       num_nodes)
                    row['within_budget'] = \
                        row['peak_bytes'] <= row['budget_bytes']
                    row['bytes_per_edge'] = round(row['peak_bytes'] /
                                                  row['num_edges'], 1)
                    row['bytes_per_edge_above_import'] = round(
                        (row['peak_bytes'] - row['import_bytes']) /
                        row['num_edges'], 1)
                row['num_parts'] = args.num_parts
                results.append(row)
                print(json.dumps(row), flush=True)
            if not args.keep_graphs:
                shutil.rmtree(graph_dir, ignore_errors=True)
    finally:
        if own_work_dir:
            shutil.rmtree(args.work_dir, ignore_errors=True)

    json_path = osp.join(args.out, 'partition_scale.json')
    if args.append and osp.exists(json_path):
        with open(json_path) as f:
            earlier_file = json.load(f)
        earlier = earlier_file['results']
        for r in earlier:  # rows from before the per-row part count
            r.setdefault('num_parts', earlier_file.get('num_parts'))
        def key(r):
            return (r['num_nodes'], r['path'], r.get('generator'),
                    r.get('variant'), r['num_parts'])
        done = {key(r) for r in results}
        results = [r for r in earlier if key(r) not in done] + results
    add_cut_ratios(results)
    header = ['nodes', 'edges', 'path', 'method', 'time (s)', 'peak GiB',
              'B/edge', 'B/edge>import', 'budget GiB', 'cut', 'cut/METIS',
              'balance']
    lines = [header]
    for r in results:
        if 'error' in r:
            lines.append([f"{r['num_nodes']:,}", '-', r['path'],
                          r.get('method', '-'), r['error'][:60], '', '', '',
                          '', '', '', ''])
            continue
        lines.append([f"{r['num_nodes']:,}", f"{r['num_edges']:,}",
                      r['path'], r['method'], f"{r['time_s']:.1f}",
                      f"{r['peak_gib']:.2f}", f"{r['bytes_per_edge']:.0f}",
                      f"{r['bytes_per_edge_above_import']:.0f}",
                      f"{budget_bytes(r['num_edges'], r['num_nodes']) / 2**30:.2f}"
                      + ('' if r['peak_bytes'] <= budget_bytes(
                          r['num_edges'], r['num_nodes']) else ' (over)'),
                      f"{100 * r['edge_cut']:.2f}%",
                      f"{r.get('cut_vs_metis', float('nan')):.3f}",
                      f"{r['node_balance']:.3f}"])
    widths = [max(len(str(line[i])) for line in lines)
              for i in range(len(header))]
    for line in lines:
        print('  '.join(str(c).rjust(w) for c, w in zip(line, widths)))
    with open(json_path, 'w') as f:
        json.dump({'num_parts': args.num_parts, 'results': results}, f,
                  indent=2)
    png = osp.join(args.out, 'partition_scale.png')
    if not plot(results, png):
        print('matplotlib is not installed: no PNG')


if __name__ == '__main__':
    main()
