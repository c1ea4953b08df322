"""Full-batch training: memory, epoch time and bytes of pyg_sar vs. stock PyG
(the earlier benchmark, kept for what ``full_batch.py`` does not measure:
bytes exchanged against the halo bound, explicit ``chunk_size``, and the
whole-neighborhood layers ``transformer`` and ``gen``).

Runs SAGE (3 layers, hidden 256) and GAT (3 layers, 4 heads, hidden 256 in
total) on the synthetic graph, with stock PyG in one process and with pyg_sar
on N = 1, 2, 4 (and 8 with ``--with-8``) workers, plus pyg_sar with
``chunk_size`` at N = 1. Every configuration runs in fresh processes (one per
worker, gloo on 127.0.0.1), so resident memory is clean.

Per worker it measures
  * the peak-RSS delta of one training epoch (forward + backward + step):
    ``ru_maxrss`` after the epoch minus ``ru_maxrss`` right before the first
    forward (after loading the data, building the DistGraph and the model).
    Also reported: the peak of the epoch over the RSS right before it
    (``VmHWM`` reset through ``/proc/self/clear_refs`` where the kernel allows
    it), which does not hide an epoch peak below an earlier set-up peak;
  * the epoch time (median of ``--epochs`` epochs after the first one);
  * the bytes exchanged per epoch (``pyg_sar.comm_stats()``), split into the
    halo exchange of message passing and the gradient all-reduce;
and the halo lower bound of the exchanged bytes (see :func:`halo_bound`).

    python benchmarks/full_batch_legacy.py            # 50k nodes, 1M edges, N=1,2,4
    python benchmarks/full_batch_legacy.py --quick    # small smoke test, N=1,2
    python benchmarks/full_batch_legacy.py --with-8   # adds N=8

Prints a table and PASS/FAIL per target, writes ``full_batch_legacy.json`` and
``full_batch_legacy.png`` to ``--out`` (default ``benchmarks/results``).
"""
from __future__ import annotations

import argparse
import json
import os
import os.path as osp
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

HERE = osp.dirname(osp.abspath(__file__))
sys.path.insert(0, HERE)
from _common import (add_internal_args, finish_worker, free_port,  # noqa: E402
                     init_worker, measure_epochs, run_script, status_mib,
                     write_results)
MODELS = ('sage', 'gat', 'transformer', 'gen')
# GAT and SAGE run on the SAR engine; TransformerConv and GENConv (learnable
# softmax aggregation) over whole neighborhoods.


# Worker ######################################################################

def halo_bound(graph, model: str, layer_dims: List[dict]) -> int:
    r"""Lower bound on the bytes one worker receives per training epoch in
    the halo exchanges.

    A layer must bring every halo source's exchanged row here once in forward
    and send the gradient of that row back once in backward; the two
    directions are symmetric over all workers, so per layer the bytes are
    ``2 * halo_bytes(F_exchanged)`` (received = sent, summed over workers),
    where F_exchanged is the width of what actually crosses the wire:

    * SAGE aggregates *before* its linear maps (``lin_l(mean_j x_j)``), so
      the exchanged rows are the layer's input features: F = F_in.
    * GAT projects first and exchanges the projected values ``h_j = W x_j``
      (H * C) and the source attention logits ``alpha_src[j]`` (H); the
      destination side ``alpha_dst[i]`` is local: F = H * C + H. Its messages
      are not linear in ``h_j``, so the ``sar`` mode re-fetches ``h_j`` and
      ``alpha_src`` in backward (one more forward's worth): expect about
      1.5x this bound for GAT in ``sar`` mode (1.0x in ``sa``).
    * The input features of the first layer need no gradient: for SAGE the
      first layer exchanges ``x`` itself, so its backward sends nothing back
      (forward only, 1x). GAT's first layer exchanges ``W x``, which does
      need a gradient (for ``W``): 2x as every other layer.
    """
    if model not in ('sage', 'gat'):
        return None  # whole neighborhoods: bytes are reported, not bounded
    total = 0
    for layer, dims in enumerate(layer_dims):
        feats = dims['in'] if model == 'sage' else \
            dims['heads'] * dims['out'] + dims['heads']
        directions = 1 if (model == 'sage' and layer == 0) else 2
        total += directions * graph.halo_bytes(feats)
    return total


def _layer_dims(net, model: str) -> List[dict]:
    dims = []
    for conv in net.convs:
        if not hasattr(conv, 'heads'):
            dims.append({'in': conv.in_channels, 'out': conv.out_channels})
        else:
            dims.append({'in': conv.in_channels, 'out': conv.out_channels,
                         'heads': conv.heads})
    return dims


def worker(args: argparse.Namespace) -> None:
    import torch

    import pyg_sar
    from pyg_sar import comm
    from pyg_sar.train import GNN, distributed_loss

    rank, world_size = init_worker(args.timeout)
    if args.pipeline_depth is not None:
        comm.configure(pipeline_depth=args.pipeline_depth)
    rss_start = status_mib('VmRSS')
    torch.manual_seed(0)
    info: Dict = {}
    if args.impl == 'pyg':
        data = torch.load(args.data, weights_only=False)
        x, y = data.x.float(), data.y.long()
        train_mask = data.train_mask.bool()
        graph = data.edge_index
        num_classes = int(y.max()) + 1
        net = GNN(args.model, x.shape[1], args.hidden, num_classes,
                  args.layers, args.heads)
        num_train = int(train_mask.sum())
        del data
    else:
        from pyg_sar.nn import to_distributed
        part = pyg_sar.load_partition(args.parts, rank)
        graph = pyg_sar.DistGraph(part, mode=args.mode,
                                  chunk_size=args.chunk_size)
        x, y = part.x.float(), part.y.long()
        train_mask = part.train_mask.bool()
        num_classes = int(comm.all_reduce(
            torch.tensor([int(y.max()) + 1]), 'max')[0])
        net = to_distributed(GNN(args.model, x.shape[1], args.hidden,
                                 num_classes, args.layers, args.heads))
        pyg_sar.sync_params(net)
        num_train = comm.global_count(train_mask)
        info.update(num_halo_nodes=graph.num_halo_nodes,
                    local_nodes=graph.num_nodes, local_edges=graph.num_edges,
                    halo_bound_bytes=halo_bound(
                        graph, args.model, _layer_dims(net, args.model)))
        del part
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    net.train()

    def epoch() -> Dict[str, int]:
        optimizer.zero_grad()
        loss = distributed_loss(net(x, graph), y, train_mask, num_train)
        loss.backward()
        exchange = comm.comm_stats()
        pyg_sar.all_reduce_grads(net)
        optimizer.step()
        return exchange

    measured = measure_epochs(epoch, args.epochs)
    result = dict(
        rank=rank, world_size=world_size, impl=args.impl, model=args.model,
        chunk_size=args.chunk_size, mode=args.mode,
        threads=torch.get_num_threads(), rss_start_mib=rss_start,
        **measured, **info)
    finish_worker(result, args.result)


# Driver ######################################################################


def _launch(script_args: List[str], world_size: int, out_dir: str,
            timeout_s: float,
            mmap_threshold: Optional[int] = None,
            script: Optional[str] = None) -> List[dict]:
    """Runs ``world_size`` fresh worker processes of ``script`` (default:
    this file) with ``--worker``, returns their results."""
    port = free_port()
    procs, paths = [], []
    for rank in range(world_size):
        env = dict(os.environ)
        threads = str(max(1, 2 // world_size))
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        if mmap_threshold:
            # A fixed threshold turns off glibc's dynamic one, which after
            # the first large free serves blocks up to 32 MiB from the heap,
            # whose freed pages stay resident (RSS above live tensors).
            env['MALLOC_MMAP_THRESHOLD_'] = str(mmap_threshold)
        if world_size > 1:
            env.update(RANK=str(rank), WORLD_SIZE=str(world_size),
                       LOCAL_RANK=str(rank), MASTER_ADDR='127.0.0.1',
                       MASTER_PORT=str(port))
        else:
            for key in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT'):
                env.pop(key, None)
        path = osp.join(out_dir, f'result_{rank}.json')
        if osp.exists(path):
            os.remove(path)
        paths.append(path)
        procs.append(subprocess.Popen(
            [sys.executable, script or osp.abspath(__file__), '--worker',
             '--result', path, *script_args], env=env))
    deadline = time.time() + timeout_s
    failed = False
    for proc in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            failed = True
        if proc.returncode not in (0, None):
            failed = True
    for proc in procs:  # our own children only
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    results = []
    for path in paths:
        if not osp.exists(path):
            failed = True
            continue
        with open(path) as f:
            results.append(json.load(f))
    if failed:
        raise RuntimeError(f'a worker failed: {script_args}')
    return results


def _summarize(name: str, results: List[dict]) -> dict:
    r0 = results[0]
    peaks = [r['epoch_peak_over_rss_mib'] for r in results]
    row = dict(
        name=name, impl=r0['impl'], model=r0['model'],
        workers=r0['world_size'], chunk_size=r0['chunk_size'],
        mem_delta_mib=max(r['mem_delta_mib'] for r in results),
        mem_delta_per_rank_mib=[round(r['mem_delta_mib'], 1)
                                for r in results],
        epoch_peak_over_rss_mib=(max(peaks) if None not in peaks else None),
        rss_before_mib=max(r['rss_before_mib'] for r in results),
        maxrss_after_mib=max(r['maxrss_after_mib'] for r in results),
        epoch_s=max(r['epoch_s'] for r in results),
        first_epoch_s=max(r['first_epoch_s'] for r in results),
        exchange_bytes=sum(r['exchange_bytes_received'] for r in results),
        total_bytes=sum(r['bytes_received'] for r in results),
        halo_bound_bytes=(sum(r['halo_bound_bytes'] for r in results)
                          if r0.get('halo_bound_bytes') is not None
                          else None),
        halo_nodes=(sum(r['num_halo_nodes'] for r in results)
                    if 'num_halo_nodes' in r0 else None),
        per_rank=results)
    bound = row['halo_bound_bytes']
    row['bytes_over_bound'] = (row['exchange_bytes'] / bound
                               if bound else None)
    return row


def _prepare(args: argparse.Namespace, work: str, worker_counts: List[int]):
    """Generates and partitions the graph in a subprocess.

    A child's ``ru_maxrss`` starts at the RSS of the parent it was forked
    from, so the driver itself stays small: it imports neither torch nor
    the graph, and every worker's baseline is its own.
    """
    info = osp.join(work, 'prepare.json')
    command = [sys.executable, osp.abspath(__file__), '--prepare',
               '--result', info, '--work-dir', work,
               '--num-nodes', str(args.num_nodes),
               '--avg-degree', str(args.avg_degree),
               '--num-features', str(args.num_features),
               '--num-classes', str(args.num_classes),
               '--workers', ','.join(map(str, worker_counts))]
    subprocess.run(command, check=True)
    with open(info) as f:
        out = json.load(f)
    return out['data_path'], out['graph'], {int(k): v for k, v in
                                            out['cuts'].items()}


def prepare(args: argparse.Namespace) -> None:
    import torch
    work = args.work_dir
    worker_counts = [int(n) for n in args.workers.split(',')]

    from pyg_sar import datasets, partition_graph
    data_path = osp.join(work, 'data.pt')
    start = time.perf_counter()
    data = datasets.synthetic_graph(args.num_nodes, args.avg_degree,
                                    args.num_features, args.num_classes,
                                    seed=0)
    torch.save(data, data_path)
    graph = dict(num_nodes=data.num_nodes, num_edges=data.num_edges,
                 num_features=data.x.shape[1],
                 num_classes=int(data.y.max()) + 1)
    print(f"synthetic graph: {graph['num_nodes']:,} nodes, "
          f"{graph['num_edges']:,} edges, {graph['num_features']} features "
          f"({time.perf_counter() - start:.1f}s)", flush=True)
    cuts = {}
    for n in worker_counts:
        out = osp.join(work, f'parts_{n}')
        manifest = partition_graph(data, n, out, progress=False,
                                   overwrite=True)
        cuts[n] = manifest['edge_cut']['fraction']
        print(f'  METIS {n} parts: edge cut {100 * cuts[n]:.1f}%',
              flush=True)
    with open(args.result, 'w') as f:
        json.dump(dict(data_path=data_path, graph=graph, cuts=cuts), f)


def _fmt_mib(v: Optional[float]) -> str:
    return '-' if v is None else f'{v:,.0f}'


def _fmt_bytes(v: Optional[float]) -> str:
    return '-' if not v else f'{v / 2**20:,.1f}'


def print_table(rows: List[dict]) -> None:
    header = (f"{'config':<24}{'N':>3}{'mem delta':>11}{'epoch pk':>10}"
              f"{'epoch s':>9}{'xchg MiB':>10}{'all MiB':>10}"
              f"{'bound MiB':>11}{'ratio':>7}")
    print(header)
    print('-' * len(header))
    for r in rows:
        ratio = '-' if r['bytes_over_bound'] is None else \
            f"{r['bytes_over_bound']:.3f}"
        print(f"{r['name']:<24}{r['workers']:>3}"
              f"{_fmt_mib(r['mem_delta_mib']):>11}"
              f"{_fmt_mib(r['epoch_peak_over_rss_mib']):>10}"
              f"{r['epoch_s']:>9.2f}{_fmt_bytes(r['exchange_bytes']):>10}"
              f"{_fmt_bytes(r['total_bytes']):>10}"
              f"{_fmt_bytes(r['halo_bound_bytes']):>11}{ratio:>7}")
    print('mem delta: max over workers of ru_maxrss(after epoch 1) - '
          'ru_maxrss(before it), MiB; epoch pk: VmHWM over VmRSS before the '
          'epoch; xchg: halo bytes received per epoch, all workers; all: '
          'incl. gradient all-reduce; bound: halo lower bound')


def check_targets(rows: List[dict], worker_counts: List[int]) -> List[dict]:
    by = {(r['impl'], r['model'], r['workers'], r['chunk_size'] is not None):
          r for r in rows}
    checks = []

    def add(name, value, limit, ok):
        checks.append(dict(target=name, value=value, limit=limit, ok=ok))

    # Memory targets on the spec's metric (ru_maxrss delta) and on the epoch
    # peak over the RSS before it, which a set-up peak cannot hide.
    for key, tag in (('mem_delta_mib', 'ru_maxrss delta'),
                     ('epoch_peak_over_rss_mib', 'epoch peak')):
        if any(r[key] is None for r in rows):
            continue
        for model in _models(rows):
            one = by.get(('sar', model, 1, False))
            for n in worker_counts:
                r = by.get(('sar', model, n, False))
                if one is None or r is None or n == 1:
                    continue
                limit = 1.15 * one[key] / n
                add(f'{model} N={n} per-worker mem <= 1.15 x (N=1)/N ({tag})',
                    round(r[key], 1), round(limit, 1),
                    r[key] <= limit)
        stock_gat = by.get(('pyg', 'gat', 1, False))
        n_max = max(worker_counts)
        gat_n = by.get(('sar', 'gat', n_max, False))
        if stock_gat and gat_n:
            factor = 8 if n_max >= 4 else 2 * n_max
            ratio = stock_gat[key] / max(gat_n[key], 1e-9)
            add(f'GAT mem >= {factor}x below stock PyG at N={n_max} ({tag})',
                round(ratio, 2), factor, ratio >= factor)
        gat_chunk = by.get(('sar', 'gat', 1, True))
        if stock_gat and gat_chunk:
            ratio = stock_gat[key] / max(gat_chunk[key], 1e-9)
            add(f'GAT mem >= 2x below stock PyG at N=1 with chunk_size '
                f'({tag})', round(ratio, 2), 2, ratio >= 2)
    for n in worker_counts:
        r = by.get(('sar', 'sage', n, False))
        if r is not None and r['bytes_over_bound'] is not None:
            add(f'sage N={n} bytes <= 1.05 x halo bound',
                round(r['bytes_over_bound'], 3), 1.05,
                r['bytes_over_bound'] <= 1.05)
    for model in _models(rows):
        stock, one = by.get(('pyg', model, 1, False)), \
            by.get(('sar', model, 1, False))
        if stock and one:
            ratio = one['epoch_s'] / stock['epoch_s']
            add(f'{model} N=1 epoch time <= 1.2 x stock PyG',
                round(ratio, 3), 1.2, ratio <= 1.2)
    for c in checks:
        print(f"{'PASS' if c['ok'] else 'FAIL'}  {c['target']}: "
              f"{c['value']} (limit {c['limit']})")
    return checks


def _models(rows: List[dict]) -> List[str]:
    return [m for m in MODELS if any(r['model'] == m for r in rows)]


def plot(rows: List[dict], path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    colors = ('tab:blue', 'tab:orange', 'tab:green', 'tab:red')
    for model, color in zip(_models(rows), colors):
        sar = sorted((r for r in rows if r['model'] == model and
                      r['impl'] == 'sar' and r['chunk_size'] is None),
                     key=lambda r: r['workers'])
        ns = [r['workers'] for r in sar]
        stock = [r for r in rows if r['model'] == model and r['impl'] == 'pyg']
        chunk = [r for r in rows if r['model'] == model and
                 r['impl'] == 'sar' and r['chunk_size'] is not None]
        axes[0].plot(ns, [r['mem_delta_mib'] for r in sar], 'o-',
                     color=color, label=f'{model} pyg_sar')
        if sar:
            axes[0].plot(ns, [sar[0]['mem_delta_mib'] / n for n in ns], ':',
                         color=color, label=f'{model} ideal (N=1)/N')
        if stock:
            axes[0].axhline(stock[0]['mem_delta_mib'], color=color,
                            ls='--', label=f'{model} stock PyG')
        if chunk:
            axes[0].plot([1], [chunk[0]['mem_delta_mib']], 's', color=color,
                         label=f'{model} chunked')
        axes[1].plot(ns, [r['epoch_s'] for r in sar], 'o-', color=color,
                     label=f'{model} pyg_sar')
        if stock:
            axes[1].axhline(stock[0]['epoch_s'], color=color, ls='--',
                            label=f'{model} stock PyG')
        multi = [r for r in sar if r['halo_bound_bytes']]
        axes[2].plot([r['workers'] for r in multi],
                     [r['exchange_bytes'] / 2**20 for r in multi], 'o-',
                     color=color, label=f'{model} halo exchange')
        axes[2].plot([r['workers'] for r in multi],
                     [r['halo_bound_bytes'] / 2**20 for r in multi], ':',
                     color=color, label=f'{model} lower bound')
    axes[0].set(xlabel='workers', ylabel='peak RSS delta per worker (MiB)',
                title='memory of one epoch', yscale='log')
    axes[1].set(xlabel='workers', ylabel='seconds', title='epoch time')
    axes[2].set(xlabel='workers', ylabel='MiB per epoch (all workers)',
                title='bytes exchanged')
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(args: argparse.Namespace) -> None:
    if args.quick:
        args.num_nodes, args.epochs = min(args.num_nodes, 2_000), 1
    worker_counts = [1, 2] if args.quick else [1, 2, 4]
    if args.with_8:
        worker_counts.append(8)
    os.makedirs(args.out, exist_ok=True)
    work = args.work_dir or tempfile.mkdtemp(prefix='pyg_sar_bench_')
    os.makedirs(work, exist_ok=True)
    try:
        data_path, graph, cuts = _prepare(args, work, worker_counts)
        chunk = args.chunk_size or max(1, graph['num_edges'] // 8)
        common = ['--layers', str(args.layers), '--hidden', str(args.hidden),
                  '--heads', str(args.heads), '--epochs', str(args.epochs),
                  '--timeout', str(args.timeout), '--mode', args.mode]
        if args.pipeline_depth is not None:
            common += ['--pipeline-depth', str(args.pipeline_depth)]
        configs = []
        for model in args.models.split(','):
            configs.append((f'{model} stock PyG', 1,
                            ['--impl', 'pyg', '--data', data_path]))
            for n in worker_counts:
                configs.append((f'{model} pyg_sar', n,
                                ['--impl', 'sar', '--parts',
                                 osp.join(work, f'parts_{n}')]))
            configs.append((f'{model} pyg_sar chunk', 1,
                            ['--impl', 'sar', '--parts',
                             osp.join(work, 'parts_1'),
                             '--chunk-size', str(chunk)]))
        rows = []
        for name, n, extra in configs:
            model = name.split()[0]
            start = time.perf_counter()
            results = _launch(['--model', model, *common, *extra], n, work,
                              args.timeout * 4, args.malloc_mmap_threshold)
            row = _summarize(name, results)
            rows.append(row)
            print(f"[{time.perf_counter() - start:6.1f}s] {name} N={n}: "
                  f"mem {row['mem_delta_mib']:,.0f} MiB, epoch "
                  f"{row['epoch_s']:.2f}s, exchange "
                  f"{_fmt_bytes(row['exchange_bytes'])} MiB", flush=True)
        print()
        print(f"graph: {graph['num_nodes']:,} nodes, {graph['num_edges']:,} "
              f"edges; {args.layers} layers, hidden {args.hidden}, GAT "
              f"{args.heads} heads; mode {args.mode}; chunk_size {chunk}")
        print_table(rows)
        print()
        checks = check_targets(rows, worker_counts)
        result = dict(graph=graph, edge_cut=cuts, chunk_size=chunk,
                      malloc_mmap_threshold=args.malloc_mmap_threshold,
                      layers=args.layers, hidden=args.hidden,
                      heads=args.heads, mode=args.mode,
                      epochs=args.epochs, rows=rows, targets=checks)
        name = 'full_batch_legacy_quick' if args.quick else 'full_batch_legacy'
        if args.models != 'sage,gat':
            name += '_' + args.models.replace(',', '_')
        if not args.malloc_mmap_threshold:
            name += '_dynamic_malloc'
        write_results(args.out, name, result, plot, rows)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--num-nodes', type=int, default=50_000)
    parser.add_argument('--avg-degree', type=float, default=20.0)
    parser.add_argument('--num-features', type=int, default=128)
    parser.add_argument('--num-classes', type=int, default=10)
    parser.add_argument('--models', default='sage,gat',
                        help='comma-separated, from %s' % (MODELS, ))
    parser.add_argument('--layers', type=int, default=3)
    parser.add_argument('--hidden', type=int, default=256)
    parser.add_argument('--heads', type=int, default=4)
    parser.add_argument('--epochs', type=int, default=2,
                        help='timed epochs after the first (median)')
    parser.add_argument('--mode', choices=('sar', 'sa', 'one_shot'),
                        default='sar')
    parser.add_argument('--chunk-size', type=int, default=None,
                        help='edges per chunk of the chunked N=1 run '
                        '(default: E/8)')
    parser.add_argument('--pipeline-depth', type=int, default=None,
                        help='ring rounds prefetched (default: the '
                        'engine default)')
    parser.add_argument('--malloc-mmap-threshold', type=int, default=1 << 20,
                        help='MALLOC_MMAP_THRESHOLD_ (bytes) of every worker, '
                        'stock PyG included: RSS then tracks live tensors, as '
                        'under pyg-sar train, which sets the same (default: '
                        '%(default)s; 0: glibc\'s dynamic threshold)')
    parser.add_argument('--with-8', action='store_true',
                        help='also run N=8 workers')
    parser.add_argument('--quick', action='store_true',
                        help='2k nodes, N=1,2, 1 timed epoch: a smoke test')
    parser.add_argument('--out', default=osp.join(HERE, 'results'))
    parser.add_argument('--work-dir', default=None,
                        help='keep data and partitions here')
    parser.add_argument('--timeout', type=float, default=600.0)
    # Worker-only arguments.
    add_internal_args(parser, '--workers', '--data')
    parser.add_argument('--model', choices=MODELS, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == '__main__':
    run_script(parse_args(), worker, prepare, main)
