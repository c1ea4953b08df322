"""Full-batch training: per-worker memory and epoch time of pyg_sar's Python
API at N = 1, 2, 4 workers, stock PyG, and the analytic activation floor.

Models: GraphSAGE (mean; 3 layers, hidden 256) on
``synthetic_graph(200000, 20, 128, 16, seed=0)`` (4.1M edges) and GAT
(3 layers, 4 heads x 32) on the same generator at 100k nodes. pyg_sar
trains exactly as the README's snippet does (``full_batch_worker.py``);
stock PyG trains the same architecture in one process. Every configuration
runs in fresh processes (gloo on 127.0.0.1, ``2 // N`` threads each: the
machine has 2 cores), and no allocator option or environment variable is
set for any of them.

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

The exchange-free bound separates what N workers pay for the halo exchange
from what they pay for sharing the machine's cores (docs/benchmarks.rst has
the measured bound).

Per worker: peak RSS from after loading to the end of training over the RSS
after loading (worst worker), the index state of the DistGraph, the worst
single-epoch peak, and the median epoch; the floor is
:func:`full_batch_worker.floor_bytes` of the largest part. Prints a table
with ratios and PASS/FAIL per target, writes ``<name>.json`` and
``<name>.png`` to ``--out`` (default ``benchmarks/results``).
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
from _common import (add_internal_args, free_port, run_script,  # noqa: E402
                     write_results)
REPO = osp.dirname(HERE)
GRAPHS = {'sage': 200_000, 'gat': 200_000, 'gcn': 200_000, 'gen': 200_000}
HIDDEN = {'sage': 256, 'gat': 128, 'gcn': 256, 'gen': 128}
NO_CUT = 'pyg_sar, no cut'
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
    port, procs, paths = free_port(), [], []
    for rank in range(world_size):
        env = {k: v for k, v in os.environ.items()
               if k not in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR',
                            'MASTER_PORT', 'LOCAL_RANK')}
        threads = str(max(1, 2 // world_size))
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads,
                   PYTHONPATH=code, PYG_SAR_BENCH_CODE=code)
        env.update(extra_env or {})
        if world_size > 1:
            env.update(RANK=str(rank), WORLD_SIZE=str(world_size),
                       LOCAL_RANK=str(rank), MASTER_ADDR='127.0.0.1',
                       MASTER_PORT=str(port))
        path = osp.join(work, f'result_{rank}.json')
        if osp.exists(path):
            os.remove(path)
        paths.append(path)
        procs.append(subprocess.Popen(
            [sys.executable, osp.abspath(__file__), '--worker', '--result',
             path, *worker_args], env=env, cwd=work))
    deadline, failed = time.time() + timeout_s, False
    for proc in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            failed = True
        failed |= proc.returncode not in (0, None)
    for proc in procs:  # our own children only
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if failed or not all(osp.exists(p) for p in paths):
        raise RuntimeError(f'a worker failed: {worker_args} ({code})')
    results = []
    for path in paths:
        with open(path) as f:
            results.append(json.load(f))
    return results


def summarize(name: str, code: str, results: List[dict]) -> dict:
    worst = max(results, key=lambda r: r['peak_over_loaded_mib'])
    return dict(
        name=name, code=code, impl=worst['impl'], model=worst['model'],
        workers=worst['world_size'],
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
            (['--no-floor'] if args.no_floor else []) + \
            (['--edge-memory-budget', str(args.edge_memory_budget)]
             if args.edge_memory_budget else [])
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
                    try:
                        if name == 'DGL':
                            results = launch_dgl(code, extra, work,
                                                 args.timeout * 4, all_env)
                        else:
                            results = launch(common + extra, n, work, code,
                                             args.timeout * 4,
                                             all_env if name == 'stock PyG'
                                             else sar_env)
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


# Report ######################################################################

def _get(rows, model, name, n=1, contention=0) -> Optional[dict]:
    for r in rows:
        if r['model'] == model and r['name'] == name and \
                r['workers'] == n and r.get('contention', 0) == contention:
            return r
    return None


def print_table(rows: List[dict]) -> None:
    head = (f"{'model':<6}{'system':<19}{'N':>3}{'K':>3}{'MiB/wkr':>9}"
            f"{'graph':>7}"
            f"{'epoch pk':>9}{'floor':>7}{'/floor':>7}{'N1/N':>6}"
            f"{'stock/':>7}{'epoch s':>8}{'CPU s':>7}{'sys s':>6}"
            f"{'sent':>6}{'floor s':>8}{'ep/fl':>6}{'/DGL':>6}"
            f"{'K/K0':>6}{'vs cmp':>14}")
    print(head)
    print('-' * len(head))
    for r in rows:
        k = r.get('contention', 0)
        one = _get(rows, r['model'], r['name'], 1)
        stock = _get(rows, r['model'], 'stock PyG')
        dgl = _get(rows, r['model'], 'DGL', 1, k)
        quiet = _get(rows, r['model'], r['name'], r['workers'])
        floor = r.get('floor_s') or 0
        cmp_row = _get(rows, r['model'], 'pyg_sar (compare)', r['workers'])
        vs = '-'
        if r['name'] == 'pyg_sar' and cmp_row:
            vs = (f"{r['mem_mib'] / cmp_row['mem_mib']:.2f}x "
                  f"{r['epoch_s'] / cmp_row['epoch_s']:.2f}x")
        print(f"{r['model']:<6}{r['name']:<19}{r['workers']:>3}{k:>3}"
              f"{r['mem_mib']:>9,.0f}{r['graph_mib']:>7,.0f}"
              f"{r['epoch_peak_mib']:>9,.0f}{r['floor_mib']:>7,.0f}"
              f"{r['mem_mib'] / (r['floor_mib'] or math.inf):>7.2f}"
              f"{(one['mem_mib'] / r['mem_mib'] if one else 0):>6.2f}"
              f"{(stock['mem_mib'] / r['mem_mib'] if stock else 0):>7.2f}"
              f"{r['epoch_s']:>8.2f}{r.get('cpu_s', 0):>7.2f}"
              f"{r.get('sys_s', 0):>6.2f}{r.get('sent_mib', 0):>6.0f}"
              f"{floor:>8.2f}{(r['epoch_s'] / floor if floor else 0):>6.2f}"
              f"{(r['epoch_s'] / dgl['epoch_s'] if dgl else 0):>6.2f}"
              f"{(r['epoch_s'] / quiet['epoch_s'] if quiet else 0):>6.2f}"
              f"{vs:>14}")
    print("MiB/wkr: peak RSS over the RSS after loading, worst worker; "
          "graph: DistGraph index state; epoch pk: worst one-epoch peak over "
          "the RSS before it; floor: analytic activations (largest part); "
          "N1/N: memory at N=1 over this row; stock/: stock PyG over this "
          "row; CPU s / sys s: user + system / system CPU seconds of one "
          "epoch, all workers together; sent: MiB one worker sent in an "
          "epoch (most of any); K: busy processes beside it (--contention);"
          " floor s: the model's unavoidable kernels at the largest part's "
          "shapes (floor.py), ep/fl: epoch over it; /DGL: epoch over plain "
          "DGL's at the same K; K/K0: epoch over its own at K=0 (the "
          "contention slowdown); vs cmp: memory and time over the --compare "
          "code at the same N. Shared 2-core machine: times are noisy, "
          "compare ratios taken in one run.")


def check_targets(rows: List[dict]) -> List[dict]:
    checks = []

    def add(name, value, limit, ok):
        checks.append(dict(target=name, value=round(value, 3), limit=limit,
                           ok=bool(ok)))

    for model in ('sage', 'gat'):
        one, four = _get(rows, model, 'pyg_sar', 1), \
            _get(rows, model, 'pyg_sar', 4)
        if one and four:
            ratio = one['mem_mib'] / four['mem_mib']
            add(f'{model}: memory N=1 / N=4 >= 3.5', ratio, 3.5,
                ratio >= 3.5)
            add(f'{model}: epoch N=4 <= N=1 (s)', four['epoch_s'],
                round(one['epoch_s'], 2), four['epoch_s'] <= one['epoch_s'])
    sage1, sage4 = _get(rows, 'sage', 'pyg_sar', 1), \
        _get(rows, 'sage', 'pyg_sar', 4)
    if sage1:
        add('sage: N=1 MiB per worker <= 1334 (DGL)', sage1['mem_mib'], 1334,
            sage1['mem_mib'] <= 1334)
        add('sage: N=1 epoch <= 5.0 s (DGL, measured earlier)',
            sage1['epoch_s'], 5.0, sage1['epoch_s'] <= 5.0)
    if sage4:
        add('sage: N=4 MiB per worker <= 390', sage4['mem_mib'], 390,
            sage4['mem_mib'] <= 390)
    # Issue #29: the floor, plain DGL, the contention slowdown, N=4 / N=1.
    for model, floor_x, dgl_x in (('sage', 1.5, 0.7), ('gat', 2.0, 0.5)):
        one, four = _get(rows, model, 'pyg_sar', 1), \
            _get(rows, model, 'pyg_sar', 4)
        dgl = _get(rows, model, 'DGL')
        if one and one.get('floor_s'):
            ratio = one['epoch_s'] / one['floor_s']
            add(f'{model}: N=1 epoch / floor <= {floor_x}', ratio, floor_x,
                ratio <= floor_x)
        if one and dgl:
            ratio = one['epoch_s'] / dgl['epoch_s']
            add(f'{model}: N=1 epoch / DGL <= {dgl_x}', ratio, dgl_x,
                ratio <= dgl_x)
        if one and four:
            ratio = four['epoch_s'] / one['epoch_s']
            add(f'{model}: epoch N=4 / N=1 <= 1.1', ratio, 1.1, ratio <= 1.1)
        levels = {r.get('contention', 0) for r in rows} - {0}
        for k in sorted(levels):
            ours, theirs = _get(rows, model, 'pyg_sar', 1, k), \
                _get(rows, model, 'DGL', 1, k)
            if one and dgl and ours and theirs:
                mine = ours['epoch_s'] / one['epoch_s']
                limit = round(theirs['epoch_s'] / dgl['epoch_s'], 2)
                add(f'{model}: N=1 slowdown at K={k} <= DGL\'s', mine, limit,
                    mine <= limit)
    for c in checks:
        print(f"{'PASS' if c['ok'] else 'FAIL'}  {c['target']}: "
              f"{c['value']} (limit {c['limit']})")
    return checks


def exchange_bounds(rows: List[dict]) -> List[dict]:
    """The epoch at the most workers over the epoch at one, on the METIS
    partition and without any edge cut (``--no-cut``): how much of the
    parallel epoch is the exchange, and how much the shared cores."""
    bounds = []
    for model in ('sage', 'gat'):
        ns = sorted(r['workers'] for r in rows
                    if r['model'] == model and r['name'] == NO_CUT)
        if len(ns) < 2:
            continue
        ratio = {}
        for name in ('pyg_sar', NO_CUT):
            one, most = _get(rows, model, name, 1), \
                _get(rows, model, name, ns[-1])
            if one and most:
                ratio[name] = most['epoch_s'] / one['epoch_s']
        if len(ratio) == 2:
            bounds.append(dict(model=model, workers=ns[-1],
                               metis=round(ratio['pyg_sar'], 3),
                               no_cut=round(ratio[NO_CUT], 3)))
            print(f"BOUND {model}: epoch N={ns[-1]} / N=1: "
                  f"{ratio['pyg_sar']:.2f} on the METIS partition, "
                  f"{ratio[NO_CUT]:.2f} with no edge cut (no exchange)")
    return bounds


def plot(rows: List[dict], path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    models = sorted({r['model'] for r in rows})
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    styles = {'pyg_sar': 'o-', 'pyg_sar (compare)': 's--', NO_CUT: '^:'}
    for model, color in zip(models, ('tab:blue', 'tab:orange', 'tab:green')):
        for name, style in styles.items():
            sar = sorted((r for r in rows if r['model'] == model and
                          r['name'] == name), key=lambda r: r['workers'])
            if not sar:
                continue
            ns = [r['workers'] for r in sar]
            label = f'{model} {name}'
            axes[0].plot(ns, [r['mem_mib'] for r in sar], style, color=color,
                         label=label)
            axes[1].plot(ns, [r['epoch_s'] for r in sar], style, color=color,
                         label=label)
            if name == 'pyg_sar':
                axes[0].plot(ns, [r['floor_mib'] for r in sar], ':',
                             color=color, label=f'{model} activation floor')
        stock = _get(rows, model, 'stock PyG')
        if stock:
            for ax, key in ((axes[0], 'mem_mib'), (axes[1], 'epoch_s')):
                ax.axhline(stock[key], color=color, ls='-.', lw=1,
                           label=f'{model} stock PyG')
    axes[0].set(xlabel='workers', ylabel='MiB per worker (peak over loaded)',
                title='memory', yscale='log')
    axes[1].set(xlabel='workers', ylabel='seconds', title='median epoch')
    for ax in axes[:2]:
        ax.set_xticks([1, 2, 4])
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    _plot_breakdown(axes[2], rows)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


PARTS = ('dense', 'sparse', 'attention', 'exchange', 'elementwise',
         'python_alloc')


def _plot_breakdown(ax, rows: List[dict]) -> None:
    """Stacked bars: the profiled epoch by category beside the floor (its
    dense, sparse and attention kernels), pyg_sar at K=0, and DGL."""
    bars = [r for r in rows if r['name'] == 'pyg_sar' and
            r.get('contention', 0) == 0 and r.get('breakdown')]
    colors = dict(dense='tab:blue', sparse='tab:orange', attention='tab:red',
                  exchange='tab:purple', elementwise='tab:green',
                  python_alloc='tab:gray')
    labels, seen = [], set()
    for i, r in enumerate(bars):
        for j, (what, parts) in enumerate((('epoch', r['breakdown']),
                                           ('floor', r['floor'] or {}))):
            x, bottom = 2.6 * i + j, 0.0
            for part in PARTS:
                v = parts.get(part, 0.0)
                if v:
                    ax.bar(x, v, bottom=bottom, color=colors[part],
                           label=None if part in seen else part)
                    seen.add(part)
                    bottom += v
            labels.append((x, f"{r['model']} N={r['workers']}\n{what}"))
        dgl = _get(rows, r['model'], 'DGL')
        if dgl and r['workers'] == 1:
            ax.plot([2.6 * i - 0.4, 2.6 * i + 1.4], [dgl['epoch_s']] * 2,
                    'k--', lw=1, label=None if 'dgl' in seen else
                    'plain DGL epoch')
            seen.add('dgl')
    if labels:
        ax.set_xticks([x for x, _ in labels])
        ax.set_xticklabels([t for _, t in labels], fontsize=6)
        ax.legend(fontsize=7)
    ax.set(ylabel='seconds', title='profiled epoch vs compute floor')
    ax.grid(alpha=0.3, axis='y')


def main(args: argparse.Namespace) -> None:
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
                      rows=rows, targets=checks, exchange_bounds=bounds)
        write_results(args.out, name, result, plot, rows)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--models', default='sage,gat')
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
