"""Full-batch training: per-worker memory and epoch time of pyg_sar's Python
API at N = 1, 2, 4 workers, stock PyG, and the analytic activation floor.

Models (``--models``): GraphSAGE (mean; 3 layers, hidden 256) and GAT
(3 layers, 4 heads x 32) on ``synthetic_graph(200000, 20, 128, 16,
seed=0)`` (4.1M edges) by default; also ``gcn``, and ``gen`` and
``transformer``, which run over whole neighborhoods. pyg_sar trains exactly
as the README's snippet does (``full_batch_worker.py``); stock PyG trains
the same architecture in one process. Every configuration runs in fresh
processes (gloo on 127.0.0.1, ``2 // N`` threads each: the machine has 2
cores), and no allocator option or environment variable is set for any of
them (``--env``, ``--sar-env`` set some).

    python benchmarks/full_batch.py                      # the issue's setup
    python benchmarks/full_batch.py --quick              # 2k nodes, N=1,2
    python benchmarks/full_batch.py --compare ../main    # + the code in
        # ../main run side by side (same graphs, alternating), as ratios
    python benchmarks/full_batch.py --part-dir parts --models sage
        # your own partitions: N = their part count, no stock PyG
    python benchmarks/full_batch.py --no-cut
        # + the exchange-free bound: the same model on a graph of the same
        # size made of disconnected copies of the generator (as many as the
        # least common multiple of the worker counts), which METIS
        # partitions without cutting an edge: N workers exchange nothing
    python benchmarks/full_batch.py --chunk-size 500000
        # + pyg_sar at N=1 with DistGraph(chunk_size=500000)
    python benchmarks/full_batch.py --models transformer,gen --nodes 20000
        # the whole-neighborhood layers
    python benchmarks/full_batch.py --mode sa --pipeline-depth 2
        # another execution mode, more ring rounds prefetched

The exchange-free bound separates what N workers pay for the halo exchange
from what they pay for sharing the machine's cores (docs/benchmarks.rst has
the measured bound).

Per worker: peak RSS from after loading to the end of training over the RSS
after loading (worst worker), the index state of the DistGraph, the worst
single-epoch peak, and the median epoch; the floor is
:func:`full_batch_worker.floor_bytes` of the largest part. Bytes: what a
worker sent in an epoch, and the halo bytes all workers received (the
gradient all-reduce excluded) against their lower bound
(:func:`full_batch_worker.halo_bound_bytes`, SAGE and GAT). Prints a table
with ratios and PASS/FAIL per target (``full_batch_report.py``), writes
``<name>.json`` and ``<name>.png`` to ``--out`` (default
``benchmarks/results``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import os.path as osp
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

HERE = osp.dirname(osp.abspath(__file__))
sys.path.insert(0, HERE)
from _common import (add_internal_args, launch_workers,  # noqa: E402
                     run_script, write_results)
from full_batch_report import (CHUNKED, NO_CUT, check_targets,  # noqa: E402
                               exchange_bounds, plot, print_table)
REPO = osp.dirname(HERE)
MODELS = ('sage', 'gat', 'gatv2', 'gcn', 'gen', 'transformer')
GRAPHS = dict.fromkeys(MODELS, 200_000)
HIDDEN = {'sage': 256, 'gat': 128, 'gatv2': 128, 'gcn': 256, 'gen': 128,
          'transformer': 256}
# Models the DGL worker builds (benchmarks/dgl_worker.py).
DGL_MODELS = ('sage', 'gat', 'gcn')



BUSY = 'import time\nend = time.time() + {s}\nwhile time.time() < end: pass'


def busy(k: int, seconds: float) -> List[subprocess.Popen]:
    """``k`` CPU-bound Python loops (``--contention``): other jobs on the
    cores, as on a shared node; each ends by itself after ``seconds``."""
    return [subprocess.Popen([sys.executable, '-c', BUSY.format(s=seconds)])
            for _ in range(k)]


def stop(procs: List[subprocess.Popen]) -> None:
    for proc in procs:  # our own children only
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def launch_dgl(python: str, worker_args: List[str], work: str,
               timeout_s: float,
               extra_env: Optional[dict] = None) -> List[dict]:
    """One plain-DGL process (``dgl_worker.py`` in the DGL venv)."""
    path = osp.join(work, 'result_dgl.json')
    if osp.exists(path):
        os.remove(path)
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    env.update(OMP_NUM_THREADS='2', MKL_NUM_THREADS='2', DGLBACKEND='pytorch')
    env.update(extra_env or {})
    proc = subprocess.run([python, osp.join(HERE, 'dgl_worker.py'),
                           '--result', path, *worker_args], env=env,
                          cwd=work, timeout=timeout_s)
    if proc.returncode or not osp.exists(path):
        raise RuntimeError(f'the DGL worker failed: {worker_args}')
    with open(path) as f:
        out = json.load(f)
    out.setdefault('graph_mib', 0.0)
    out.setdefault('epoch_peak_mib', out['peak_over_loaded_mib'])
    out.setdefault('floor_mib', 0.0)
    return [out]


def launch(worker_args: List[str], world_size: int, work: str,
           code: str, timeout_s: float,
           extra_env: Optional[dict] = None) -> List[dict]:
    """``world_size`` fresh workers importing pyg_sar from ``code``."""
    return launch_workers(osp.abspath(__file__), worker_args, world_size,
                          work, timeout_s,
                          dict(extra_env or {}, PYTHONPATH=code,
                               PYG_SAR_BENCH_CODE=code))


def summarize(name: str, code: str, results: List[dict]) -> dict:
    worst = max(results, key=lambda r: r['peak_over_loaded_mib'])
    return dict(
        name=name, code=code, impl=worst['impl'], model=worst['model'],
        workers=worst['world_size'], threads=worst.get('threads'),
        mem_mib=worst['peak_over_loaded_mib'],
        mem_per_rank_mib=[round(r['peak_over_loaded_mib'], 1)
                          for r in results],
        graph_mib=max(r['graph_mib'] for r in results),
        epoch_peak_mib=max(r['epoch_peak_mib'] for r in results),
        epoch_s=max(r['epoch_s'] for r in results),
        # Summed over the workers: the CPU the whole job spent per epoch
        # (less noisy than the wall clock on a shared machine).
        cpu_s=sum(r.get('cpu_s', 0.0) for r in results),
        sys_s=sum(r.get('sys_s', 0.0) for r in results),
        sent_mib=max(r.get('sent_mib', 0.0) for r in results),
        # All workers: the halo bytes received in an epoch, and their
        # lower bound (full_batch_worker.halo_bound_bytes).
        exchange_mib=sum(r.get('exchange_mib', 0.0) for r in results),
        halo_bound_mib=(sum(r['halo_bound_mib'] for r in results)
                        if all(r.get('halo_bound_mib') for r in results)
                        else None),
        # ... and what the engine fetches again by design (recomputed
        # aggregates; full_batch_worker.halo_refetch_bytes).
        halo_refetch_mib=(sum(r['halo_refetch_mib'] for r in results)
                          if all(r.get('halo_refetch_mib') is not None
                                 for r in results) else None),
        floor_mib=max(r['floor_mib'] for r in results),
        # The compute floor of the slowest worker's shapes (floor.py), and
        # the profiled epoch's breakdown of that worker.
        floor_s=max((r['floor']['total'] for r in results if 'floor' in r),
                    default=None),
        floor=max((r['floor'] for r in results if 'floor' in r),
                  key=lambda f: f['total'], default=None),
        breakdown=max((r['breakdown'] for r in results
                       if 'breakdown' in r),
                      key=lambda b: b['profiled_s'], default=None),
        per_rank=results)


def prepare(args: argparse.Namespace) -> None:
    """(subprocess) Generates and partitions one graph."""
    import torch
    from pyg_sar import partition_graph
    data = _components(args.num_nodes, args.components)
    out = dict(data=osp.join(args.work_dir, 'data.pt'),
               num_nodes=data.num_nodes, num_edges=data.num_edges,
               num_classes=int(data.y.max()) + 1, parts={}, edge_cut={})
    torch.save(data, out['data'])
    # The same tensors for the DGL venv (another torch: plain arrays).
    import numpy as np
    out['npz'] = osp.join(args.work_dir, 'data.npz')
    np.savez(out['npz'], src=data.edge_index[0].numpy(),
             dst=data.edge_index[1].numpy(), x=data.x.numpy(),
             y=data.y.numpy(), train_mask=data.train_mask.numpy())
    for n in map(int, args.workers.split(',')):
        path = osp.join(args.work_dir, f'parts_{n}')
        info = partition_graph(data, n, path, progress=False, overwrite=True)
        out['parts'][n] = path
        out['edge_cut'][n] = info['edge_cut']['count']
        if args.components > 1 and info['edge_cut']['count']:
            raise RuntimeError(
                f"{args.components} components in {n} parts: METIS cut "
                f"{info['edge_cut']['count']} edges, expected none")
    with open(args.result, 'w') as f:
        json.dump(out, f)


def _components(num_nodes: int, components: int):
    """``synthetic_graph(num_nodes, 20, 128, 16, seed=0)``, or with
    ``components > 1`` that many disconnected graphs of the same generator
    (``num_nodes // components`` nodes each, seeds 0, 1, ...) side by side:
    the same size and degree distribution, with no edge between them."""
    from torch_geometric.data import Batch, Data

    from pyg_sar import datasets
    if components == 1:
        return datasets.synthetic_graph(num_nodes, 20, 128, 16, seed=0)
    batch = Batch.from_data_list([
        datasets.synthetic_graph(num_nodes // components, 20, 128, 16,
                                 seed=seed) for seed in range(components)])
    return Data(**{k: v for k, v in batch.to_dict().items()
                   if k not in ('batch', 'ptr')})


def _prepare(num_nodes: int, work: str, counts: List[int],
             components: int = 1) -> dict:
    os.makedirs(work, exist_ok=True)
    info = osp.join(work, 'prepare.json')
    if osp.exists(info):
        # A work dir prepared for other worker counts: partition for the
        # union (a count it lacks would otherwise be skipped silently).
        with open(info) as f:
            old = json.load(f)
        have = {int(k) for k in old['parts']}
        if not set(counts) <= have or 'npz' not in old:
            counts = sorted(have | set(counts))
            os.remove(info)
    if not osp.exists(info):
        subprocess.run([sys.executable, osp.abspath(__file__), '--prepare',
                        '--result', info, '--work-dir', work, '--num-nodes',
                        str(num_nodes), '--components', str(components),
                        '--workers', ','.join(map(str, counts))], check=True,
                       env=dict(os.environ, PYTHONPATH=REPO))
    with open(info) as f:
        out = json.load(f)
    out['parts'] = {int(k): v for k, v in out['parts'].items()}
    return out


def _user_parts(part_dir: str) -> dict:
    with open(osp.join(part_dir, 'META.json')) as f:
        num_parts = int(json.load(f)['num_parts'])
    manifest = osp.join(part_dir, 'pyg_sar.json')
    num_classes = None
    if osp.exists(manifest):
        with open(manifest) as f:
            num_classes = json.load(f).get('num_classes')
    return dict(parts={num_parts: osp.abspath(part_dir)}, data=None,
                num_classes=num_classes)


def run_all(args: argparse.Namespace, work: str) -> List[dict]:
    counts = [1, 2] if args.quick else [1, 2, 4]
    if args.workers:
        counts = [int(n) for n in args.workers.split(',')]
    codes = [REPO] + ([osp.abspath(args.compare)] if args.compare else [])
    rows = []
    for model in args.models.split(','):
        bound = None
        if args.part_dir:
            graph = _user_parts(args.part_dir)
            graph['num_classes'] = graph['num_classes'] or args.num_classes
        else:
            nodes = 2_000 if args.quick else args.nodes or GRAPHS[model]
            graph = _prepare(nodes, osp.join(work, f'graph_{nodes}'), counts)
            print(f"{model}: synthetic graph {graph['num_nodes']:,} nodes, "
                  f"{graph['num_edges']:,} edges", flush=True)
            if args.no_cut and max(counts) > 1:
                # The exchange-free bound (module docs): every worker
                # count divides the copies, so each part holds whole ones.
                parts = math.lcm(*counts)
                bound = _prepare(nodes, osp.join(
                    work, f'graph_{nodes}_{parts}_components'), counts, parts)
                print(f"{model}: {parts} disconnected copies, "
                      f"{bound['num_nodes']:,} nodes, "
                      f"{bound['num_edges']:,} edges, edge cut "
                      f"{bound['edge_cut']}", flush=True)
        hidden = args.hidden or HIDDEN[model]
        common = ['--model', model, '--hidden', str(hidden), '--heads',
                  str(args.heads), '--layers', str(args.layers), '--epochs',
                  str(args.epochs), '--timeout', str(args.timeout),
                  '--num-classes', str(graph['num_classes'])] + \
            ['--mode', args.mode] + \
            (['--no-floor'] if args.no_floor else []) + \
            (['--edge-memory-budget', str(args.edge_memory_budget)]
             if args.edge_memory_budget else []) + \
            (['--pipeline-depth', str(args.pipeline_depth)]
             if args.pipeline_depth else [])
        configs = []
        if graph['data'] and args.dgl and model in DGL_MODELS:
            configs.append(('DGL', 1, args.dgl, [
                '--data', graph['npz'], '--model', model, '--hidden',
                str(hidden), '--heads', str(args.heads), '--layers',
                str(args.layers), '--epochs', str(args.epochs)]))
        if graph['data'] and not args.no_stock:
            configs.append(('stock PyG', 1, REPO,
                            ['--impl', 'pyg', '--data', graph['data']]))
        for n, path in sorted(graph['parts'].items()):
            if not args.part_dir and n not in counts:
                continue
            for code in reversed(codes):  # baseline first, then this tree
                name = 'pyg_sar' if code == REPO else 'pyg_sar (compare)'
                configs.append((name, n, code,
                                ['--impl', 'sar', '--parts', path]))
            if bound:
                configs.append((NO_CUT, n, REPO, [
                    '--impl', 'sar', '--parts', bound['parts'][n]]))
            if args.chunk_size and n == 1:
                configs.append((CHUNKED, n, REPO, [
                    '--impl', 'sar', '--parts', path, '--chunk-size',
                    str(args.chunk_size)]))
        all_env = dict(kv.split('=', 1) for kv in args.env)
        sar_env = dict(all_env, **dict(kv.split('=', 1)
                                       for kv in args.sar_env))
        # Interleaved: every round runs every system once at every
        # contention level; a row keeps the median round.
        runs = {}
        for _ in range(args.rounds):
            for k in map(int, str(args.contention).split(',')):
                for name, n, code, extra in configs:
                    start = time.perf_counter()
                    load = os.getloadavg()[0]
                    others = busy(k, args.timeout * 4)
                    log_lines = len(_kernel_log())
                    try:
                        if name == 'DGL':
                            results = launch_dgl(code, extra, work,
                                                 args.timeout * 4, all_env)
                        else:
                            results = launch(common + extra, n, work, code,
                                             args.timeout * 4,
                                             all_env if name == 'stock PyG'
                                             else sar_env)
                    except RuntimeError as e:
                        # A baseline that does not fit (stock PyG's
                        # per-edge tensors past the machine's memory) is a
                        # result; ours failing is not.
                        if name not in ('stock PyG', 'DGL'):
                            raise
                        print(f"{model} {name} N={n} failed: {e}",
                              flush=True)
                        args.failed.append(dict(
                            model=model, name=name, workers=n,
                            contention=k, hidden=hidden,
                            error='killed: out of memory' if any(
                                'Out of memory' in line for line in
                                _kernel_log()[log_lines:]) else str(e)))
                        continue
                    finally:
                        stop(others)
                    row = summarize(name, code, results)
                    row.update(hidden=hidden, contention=k, load_before=load,
                               load_after=os.getloadavg()[0])
                    runs.setdefault((name, n, k), []).append(row)
                    floor = (f", floor {row['floor_s']:.2f}s "
                             f"({row['epoch_s'] / row['floor_s']:.2f}x)"
                             if row['floor_s'] else '')
                    print(f"[{time.perf_counter() - start:6.1f}s] {model} "
                          f"{name} N={n} contention {k}: "
                          f"{row['mem_mib']:,.0f} MiB per worker, epoch "
                          f"{row['epoch_s']:.2f}s{floor}, load "
                          f"{load:.1f}", flush=True)
        for same in runs.values():
            same.sort(key=lambda r: r['epoch_s'])
            row = dict(same[len(same) // 2])
            row['epoch_rounds_s'] = [r['epoch_s'] for r in same]
            rows.append(row)
    return rows


def _kernel_log() -> List[str]:
    """The kernel log's lines (best effort: none where it cannot be
    read)."""
    import subprocess
    try:
        return subprocess.run(['dmesg'], capture_output=True, text=True,
                              timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return []


def main(args: argparse.Namespace) -> None:
    args.failed = []
    if args.quick:
        args.epochs = 1
    os.makedirs(args.out, exist_ok=True)
    work = args.work_dir or tempfile.mkdtemp(prefix='pyg_sar_bench_')
    try:
        rows = run_all(args, work)
        print()
        print_table(rows)
        print()
        checks = [] if args.quick else check_targets(rows)
        bounds = exchange_bounds(rows)
        name = args.name or ('full_batch_quick' if args.quick else
                             'full_batch')
        result = dict(layers=args.layers, heads=args.heads,
                      epochs=args.epochs, compare=args.compare,
                      part_dir=args.part_dir, cores=os.cpu_count(),
                      machine='shared 2-core CPU, 24 GiB, gloo',
                      rows=rows, failed=args.failed, targets=checks,
                      exchange_bounds=bounds)
        write_results(args.out, name, result, plot, rows)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--models', default='sage,gat',
                        help='comma-separated, from %s' % (MODELS, ))
    parser.add_argument('--layers', type=int, default=3)
    parser.add_argument('--hidden', type=int, default=None,
                        help='default: 256 for sage, 128 (4 x 32) for gat')
    parser.add_argument('--heads', type=int, default=4)
    parser.add_argument('--epochs', type=int, default=2,
                        help='timed epochs after the first (median)')
    parser.add_argument('--compare', default=None, metavar='PATH',
                        help='also run pyg_sar from this source tree')
    parser.add_argument('--part-dir', default=None,
                        help='your own partition directory (N = its parts)')
    parser.add_argument('--num-classes', type=int, default=16,
                        help='classes of --part-dir without a manifest')
    parser.add_argument('--no-stock', action='store_true')
    parser.add_argument('--dgl', default=None, metavar='PYTHON',
                        help='also run plain DGL with this interpreter (a '
                             'venv with dgl==2.1.0; benchmarks/dgl_worker.py)')
    parser.add_argument('--contention', default='0',
                        help='K busy processes beside every system; a '
                             'comma list runs each level, e.g. 0,2')
    parser.add_argument('--rounds', type=int, default=1,
                        help='run every configuration this many times, '
                             'interleaved; rows keep the median')
    parser.add_argument('--env', action='append', default=[],
                        metavar='KEY=VALUE',
                        help='environment of every system (pyg_sar, stock '
                             'PyG and DGL alike)')
    parser.add_argument('--sar-env', action='append', default=[],
                        metavar='KEY=VALUE',
                        help='environment of the pyg_sar workers only')
    parser.add_argument('--nodes', type=int, default=None,
                        help='graph size (default 200k)')
    parser.add_argument('--edge-memory-budget', type=int, default=None,
                        metavar='BYTES',
                        help="pyg_sar's per-chunk edge budget "
                        "(pyg_sar.comm.configure; default: the library's)")
    parser.add_argument('--mode', choices=('sar', 'sa', 'one_shot'),
                        default='sar', help="pyg_sar's execution mode")
    parser.add_argument('--chunk-size', type=int, default=None,
                        metavar='EDGES',
                        help='also run pyg_sar at N=1 with '
                        'DistGraph(chunk_size=EDGES)')
    parser.add_argument('--pipeline-depth', type=int, default=None,
                        help='ring rounds prefetched (pyg_sar.comm.configure;'
                        ' default: the library\'s)')
    parser.add_argument('--no-floor', action='store_true',
                        help='skip the floor and profiler pass')
    parser.add_argument('--no-cut', action='store_true',
                        help='also run the exchange-free bound (graph of '
                             'disconnected copies, no edge cut)')
    parser.add_argument('--quick', action='store_true',
                        help='2k nodes, N=1,2, 1 timed epoch')
    parser.add_argument('--out', default=osp.join(HERE, 'results'))
    parser.add_argument('--name', default=None, help='output file stem')
    parser.add_argument('--work-dir', default=None,
                        help='keep (and reuse) graphs and partitions here')
    parser.add_argument('--timeout', type=float, default=900.0)
    add_internal_args(parser, '--model', '--data')
    parser.add_argument('--num-nodes', type=int, help=argparse.SUPPRESS)
    parser.add_argument('--components', type=int, default=1,
                        help=argparse.SUPPRESS)
    parser.add_argument('--workers', default=None,
                        help='worker counts, e.g. 1,4 (default 1,2,4)')
    return parser.parse_args(argv)


def _worker(args) -> None:
    from full_batch_worker import run_worker
    run_worker(args)


if __name__ == '__main__':
    run_script(parse_args(), _worker, prepare, main)
