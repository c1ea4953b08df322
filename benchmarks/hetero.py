"""Heterogeneous full-batch training: memory, epoch time and bytes of
pyg_sar vs. stock PyG.

Trains a 2-layer GraphSAGE made heterogeneous by ``torch_geometric.nn.
to_hetero`` (one ``SAGEConv`` per relation, summed; hidden 128) on the paper
labels of the ogbn-mag-shaped synthetic graph
(:mod:`pyg_sar.datasets.synthetic_hetero`, default 100k papers), with

  * stock PyG in one process: the same model, unconverted, on the whole
    ``HeteroData`` (the baseline);
  * pyg_sar through the Python API on N = 1, 2, 4 workers (one METIS
    partition per N): ``load_partition`` -> ``DistGraph`` -> the model
    converted by ``pyg_sar.nn.to_distributed`` called as
    ``model(x_dict, graph)``, local loss sum over ``global_count(mask)``,
    ``all_reduce_grads``.

The graph gets reverse relations (``T.ToUndirected``), so every node type
receives messages. Only papers have features; authors, institutions and
fields of study get a fixed seeded N(0, 1) input of the papers' width, stored
as ``x`` before partitioning (no learnable embedding: the stock and the
distributed runs see identical inputs). All runs start from one
``state_dict`` (saved once), so their losses must agree: the first epoch's
loss of every N must equal stock PyG's to 1e-4 (relative), otherwise the
script exits with status 1 after writing its results.

Every configuration runs in fresh processes (gloo on 127.0.0.1,
``_common.launch_workers``). Per worker it measures
  * the peak-RSS delta of one training epoch (forward + backward + step):
    ``ru_maxrss`` after the first epoch minus ``ru_maxrss`` right before it,
    and the epoch's ``VmHWM`` over the RSS before it (where the kernel lets
    ``/proc/self/clear_refs`` reset the mark); the table shows the worst
    worker;
  * the epoch time, median of ``--epochs`` epochs after the first;
  * the bytes exchanged per epoch (``pyg_sar.comm_stats()``): halo exchange
    of message passing, and everything (gradient all-reduce included), next
    to the halo lower bound (see :func:`halo_bound`).

    python benchmarks/hetero.py                 # 100k papers, N = 1, 2, 4
    python benchmarks/hetero.py --quick         # 3k papers, N = 1, 2
    python benchmarks/hetero.py --work-dir /tmp/hb   # keep/reuse data+parts

Prints a table, writes ``hetero.json`` and ``hetero.png`` to ``--out``
(default ``benchmarks/results``).
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
from _common import (add_internal_args, finish_worker,  # noqa: E402
                     init_worker, launch_workers, measure_epochs,
                     run_script, status_mib, write_results)

LABELLED = 'paper'
LOSS_RTOL = 1e-4


# Model #######################################################################

def make_model(metadata, in_channels: int, hidden: int, out_channels: int):
    """The stock model: two ``SAGEConv`` made heterogeneous by ``to_hetero``.
    """
    import torch
    from torch_geometric.nn import SAGEConv, to_hetero

    class SAGE(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = SAGEConv(in_channels, hidden)
            self.conv2 = SAGEConv(hidden, out_channels)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    return to_hetero(SAGE(), metadata, aggr='sum')


def halo_bound(graph, in_channels: int, hidden: int) -> int:
    r"""Lower bound on the bytes all workers receive per epoch in the halo
    exchanges, given this worker's graph (summed over workers by the driver).

    SAGE aggregates before its linear maps, so every relation exchanges the
    rows of its source type at the layer's input width. Layer 1 reads the
    input features, which need no gradient: forward only (1x). Layer 2 reads
    hidden rows; its relations into papers (the loss) send gradients back
    (2x), the others only run forward (their outputs reach no loss).
    """
    total = sum(graph.halo_bytes(in_channels).values())
    for (_, _, dst), nbytes in graph.halo_bytes(hidden).items():
        total += (2 if dst == LABELLED else 1) * nbytes
    return total


# Worker ######################################################################

def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F

    import pyg_sar
    from pyg_sar import comm

    rank, world_size = init_worker(args.timeout)
    rss_start = status_mib('VmRSS')
    with open(osp.join(args.work_dir, 'prepare.json')) as f:
        prep = json.load(f)
    graph_info = prep['graph']
    metadata = (graph_info['node_types'],
                [tuple(e) for e in graph_info['edge_types']])
    model = make_model(metadata, graph_info['num_features'], args.hidden,
                       graph_info['num_classes'])
    model.load_state_dict(torch.load(osp.join(args.work_dir, 'init.pt')))
    info: Dict = {}
    if args.impl == 'pyg':
        data = torch.load(osp.join(args.work_dir, 'data.pt'),
                          weights_only=False)
        x_dict, graph = data.x_dict, data.edge_index_dict
        y, train_mask = data[LABELLED].y, data[LABELLED].train_mask
        num_train = int(train_mask.sum())
        del data
    else:
        part = pyg_sar.load_partition(args.parts, rank)
        graph = pyg_sar.DistGraph(part, mode=args.mode)
        x_dict = part.x_dict
        y, train_mask = part[LABELLED].y, part[LABELLED].train_mask
        num_train = pyg_sar.global_count(train_mask)
        model = pyg_sar.nn.to_distributed(model)
        pyg_sar.sync_params(model)
        info.update(
            num_halo_nodes=sum(graph.num_halo_nodes_dict.values()),
            local_nodes=sum(graph.num_nodes_dict.values()),
            local_edges=sum(graph.num_edges_dict.values()),
            halo_bound_bytes=halo_bound(graph, graph_info['num_features'],
                                        args.hidden))
        del part
    y, train_mask = y.long(), train_mask.bool()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()
    losses: List[float] = []

    def epoch() -> Dict[str, int]:
        optimizer.zero_grad()
        out = model(x_dict, graph)[LABELLED]
        loss = F.cross_entropy(out[train_mask], y[train_mask],
                               reduction='sum') / num_train
        loss.backward()
        exchange = comm.comm_stats()
        pyg_sar.all_reduce_grads(model)
        optimizer.step()
        losses.append(float(loss.detach()))
        return exchange

    measured = measure_epochs(epoch, args.epochs)
    # Every worker's loss is its share of the global mean: sum them.
    losses = comm.all_reduce(torch.tensor(losses, dtype=torch.float64))
    result = dict(
        rank=rank, world_size=world_size, impl=args.impl, model='sage',
        mode=args.mode, threads=torch.get_num_threads(),
        rss_start_mib=rss_start, **measured, losses=losses.tolist(),
        **info)
    finish_worker(result, args.result)


# Preparation (a subprocess: the driver imports neither torch nor the graph) ##

def _config(args: argparse.Namespace, worker_counts: List[int]) -> dict:
    return dict(num_papers=args.num_papers, num_features=args.num_features,
                num_classes=args.num_classes, hidden=args.hidden,
                workers=worker_counts)


def prepare(args: argparse.Namespace) -> None:
    import torch
    import torch_geometric.transforms as T

    import pyg_sar
    config = json.loads(args.config)
    work = args.work_dir
    start = time.perf_counter()
    data = pyg_sar.datasets.load(
        'synthetic-hetero', work, num_papers=config['num_papers'],
        num_features=config['num_features'],
        num_classes=config['num_classes'])
    data = T.ToUndirected()(data)
    generator = torch.Generator().manual_seed(1)
    width = data[LABELLED].x.shape[1]
    for node_type in data.node_types:
        if 'x' not in data[node_type]:
            data[node_type].x = torch.randn(data[node_type].num_nodes, width,
                                            generator=generator)
    torch.save(data, osp.join(work, 'data.pt'))
    graph = dict(
        num_nodes={t: int(data[t].num_nodes) for t in data.node_types},
        num_edges={'__'.join(e): int(data[e].num_edges)
                   for e in data.edge_types},
        node_types=data.node_types, edge_types=data.edge_types,
        num_features=width, num_classes=int(data[LABELLED].y.max()) + 1,
        num_train=int(data[LABELLED].train_mask.sum()))
    print(f"synthetic hetero graph: {sum(graph['num_nodes'].values()):,} "
          f"nodes ({graph['num_nodes']}), "
          f"{sum(graph['num_edges'].values()):,} edges in "
          f"{len(data.edge_types)} relations "
          f"({time.perf_counter() - start:.1f}s)", flush=True)
    torch.manual_seed(0)
    model = make_model(data.metadata(), width, config['hidden'],
                       graph['num_classes'])
    torch.save(model.state_dict(), osp.join(work, 'init.pt'))
    cuts = {}
    for n in config['workers']:
        start = time.perf_counter()
        manifest = pyg_sar.partition_graph(
            data, n, osp.join(work, f'parts_{n}'), progress=False,
            overwrite=True)
        cuts[n] = manifest['edge_cut']['fraction']
        print(f'  METIS {n} parts: edge cut {100 * cuts[n]:.1f}% '
              f'({time.perf_counter() - start:.1f}s)', flush=True)
    with open(osp.join(work, 'prepare.json'), 'w') as f:
        json.dump(dict(config=config, graph=graph, cuts=cuts), f)


def _prepare(args: argparse.Namespace, work: str,
             worker_counts: List[int]) -> dict:
    """Generates and partitions the graph, unless ``work`` already holds
    it for the same configuration (``--work-dir`` reuse)."""
    config = _config(args, worker_counts)
    path = osp.join(work, 'prepare.json')
    if osp.exists(path):
        with open(path) as f:
            prep = json.load(f)
        if prep['config'] == config:
            print(f'reusing the graph and partitions in {work}', flush=True)
            return prep
    subprocess.run([sys.executable, osp.abspath(__file__), '--prepare',
                    '--work-dir', work, '--config', json.dumps(config)],
                   check=True)
    with open(path) as f:
        return json.load(f)


# Report ######################################################################

def _fmt_mib(v: Optional[float]) -> str:
    return '-' if v is None else f'{v:,.0f}'


def _fmt_bytes(v: Optional[float]) -> str:
    return '-' if not v else f'{v / 2**20:,.1f}'


def summarize(name: str, results: List[dict]) -> dict:
    """One row of the table from the workers' results: the worst worker's
    memory and time, the bytes of all workers."""
    r0 = results[0]
    peaks = [r['epoch_peak_over_rss_mib'] for r in results]
    row = dict(
        name=name, impl=r0['impl'], model=r0['model'],
        workers=r0['world_size'],
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


def loss_check(rows: List[dict]) -> List[dict]:
    """First-epoch loss (and the largest difference over all epochs) of
    every pyg_sar run against stock PyG's."""
    stock = next(r for r in rows if r['impl'] == 'pyg')['losses']
    checks = []
    for r in rows:
        if r['impl'] == 'pyg':
            continue
        rel = [abs(a - b) / abs(b) for a, b in zip(r['losses'], stock)]
        checks.append(dict(workers=r['workers'], first_loss=r['losses'][0],
                           stock_first_loss=stock[0], first_rel_diff=rel[0],
                           max_rel_diff_all_epochs=max(rel),
                           ok=rel[0] <= LOSS_RTOL))
    return checks


def print_table(rows: List[dict]) -> None:
    stock = rows[0]
    one = next(r for r in rows if r['impl'] == 'sar' and r['workers'] == 1)
    header = (f"{'config':<16}{'N':>3}{'mem MiB':>9}{'epoch pk':>10}"
              f"{'vs PyG':>8}{'vs N=1':>8}{'epoch s':>9}{'vs PyG':>8}"
              f"{'xchg MiB':>10}{'all MiB':>9}{'bound':>8}{'loss 1':>10}")
    print(header)
    print('-' * len(header))
    for r in rows:
        ratio = '-' if r['bytes_over_bound'] is None else \
            f"{r['bytes_over_bound']:.3f}"
        mem_one = '-' if r['impl'] == 'pyg' else \
            f"{one['mem_delta_mib'] / r['mem_delta_mib']:.2f}x"
        print(f"{r['name']:<16}{r['workers']:>3}"
              f"{_fmt_mib(r['mem_delta_mib']):>9}"
              f"{_fmt_mib(r['epoch_peak_over_rss_mib']):>10}"
              f"{r['mem_delta_mib'] / stock['mem_delta_mib']:>7.2f}x"
              f"{mem_one:>8}{r['epoch_s']:>9.2f}"
              f"{r['epoch_s'] / stock['epoch_s']:>7.2f}x"
              f"{_fmt_bytes(r['exchange_bytes']):>10}"
              f"{_fmt_bytes(r['total_bytes']):>9}{ratio:>8}"
              f"{r['losses'][0]:>10.6f}")
    print('mem: worst worker, ru_maxrss after epoch 1 - before it; epoch pk: '
          'VmHWM over VmRSS before the epoch; vs PyG: over stock PyG; vs '
          'N=1: fall from pyg_sar N=1; xchg: halo bytes received per epoch, '
          'all workers; all: incl. gradient all-reduce; bound: xchg over '
          'the halo lower bound; loss 1: first epoch loss')


def plot(rows: List[dict], path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    stock = rows[0]
    sar = [r for r in rows if r['impl'] == 'sar']
    ns = [r['workers'] for r in sar]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    axes[0].plot(ns, [r['mem_delta_mib'] for r in sar], 'o-',
                 label='pyg_sar (worst worker)')
    axes[0].plot(ns, [sar[0]['mem_delta_mib'] / n for n in ns], ':',
                 label='ideal (N=1)/N')
    axes[0].axhline(stock['mem_delta_mib'], color='k', ls='--',
                    label='stock PyG, 1 process')
    axes[1].plot(ns, [r['epoch_s'] for r in sar], 'o-', label='pyg_sar')
    axes[1].axhline(stock['epoch_s'], color='k', ls='--', label='stock PyG')
    multi = [r for r in sar if r['halo_bound_bytes']]
    axes[2].plot([r['workers'] for r in multi],
                 [r['exchange_bytes'] / 2**20 for r in multi], 'o-',
                 label='halo exchange')
    axes[2].plot([r['workers'] for r in multi],
                 [r['total_bytes'] / 2**20 for r in multi], 's-',
                 label='incl. gradient all-reduce')
    axes[2].plot([r['workers'] for r in multi],
                 [r['halo_bound_bytes'] / 2**20 for r in multi], ':',
                 label='halo lower bound')
    axes[0].set(xlabel='workers', ylabel='peak RSS delta per worker (MiB)',
                title='memory of one epoch', yscale='log')
    axes[1].set(xlabel='workers', ylabel='seconds',
                title='median epoch time (2 shared cores)')
    axes[2].set(xlabel='workers', ylabel='MiB per epoch (all workers)',
                title='bytes exchanged')
    for ax in axes:
        ax.set_xticks(ns)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle('to_hetero GraphSAGE on the synthetic ogbn-mag-shaped '
                 'graph', fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(args: argparse.Namespace) -> int:
    if args.quick:
        args.num_papers, args.epochs = min(args.num_papers, 3_000), 1
    worker_counts = [1, 2] if args.quick else [1, 2, 4]
    os.makedirs(args.out, exist_ok=True)
    work = args.work_dir or tempfile.mkdtemp(prefix='pyg_sar_hetero_')
    os.makedirs(work, exist_ok=True)
    try:
        prep = _prepare(args, work, worker_counts)
        common = ['--work-dir', work, '--hidden', str(args.hidden),
                  '--epochs', str(args.epochs), '--mode', args.mode,
                  '--timeout', str(args.timeout)]
        configs = [('stock PyG', 1, ['--impl', 'pyg'])]
        configs += [('pyg_sar', n, ['--impl', 'sar', '--parts',
                                    osp.join(work, f'parts_{n}')])
                    for n in worker_counts]
        rows = []
        for name, n, extra in configs:
            start = time.perf_counter()
            # A fixed threshold turns off glibc's dynamic one, which after
            # the first large free serves blocks up to 32 MiB from the heap,
            # whose freed pages stay resident (RSS above live tensors).
            env = ({'MALLOC_MMAP_THRESHOLD_': str(args.malloc_mmap_threshold)}
                   if args.malloc_mmap_threshold else {})
            results = launch_workers(osp.abspath(__file__),
                                     [*common, *extra], n, work,
                                     args.timeout * 4, env)
            row = summarize(name, results)
            row['losses'] = results[0]['losses']
            rows.append(row)
            print(f"[{time.perf_counter() - start:6.1f}s] {name} N={n}: "
                  f"mem {row['mem_delta_mib']:,.0f} MiB, epoch "
                  f"{row['epoch_s']:.2f}s, exchange "
                  f"{_fmt_bytes(row['exchange_bytes'])} MiB, loss "
                  f"{row['losses'][0]:.6f}", flush=True)
        graph = prep['graph']
        print()
        print(f"graph: {sum(graph['num_nodes'].values()):,} nodes "
              f"({graph['num_nodes'][LABELLED]:,} papers), "
              f"{sum(graph['num_edges'].values()):,} edges, "
              f"{len(graph['edge_types'])} relations; to_hetero SAGE, 2 "
              f"layers, hidden {args.hidden}; mode {args.mode}")
        print_table(rows)
        checks = loss_check(rows)
        print()
        for c in checks:
            print(f"{'PASS' if c['ok'] else 'FAIL'}  N={c['workers']} first "
                  f"loss {c['first_loss']:.8f} vs stock PyG "
                  f"{c['stock_first_loss']:.8f}: relative difference "
                  f"{c['first_rel_diff']:.1e} (limit {LOSS_RTOL:g}); largest "
                  f"over {len(rows[0]['losses'])} epochs "
                  f"{c['max_rel_diff_all_epochs']:.1e}")
        one = next(r for r in rows if r['impl'] == 'sar'
                   and r['workers'] == 1)
        last = rows[-1]
        fall = one['mem_delta_mib'] / last['mem_delta_mib']
        print(f"memory N=1 -> N={last['workers']}: falls {fall:.2f}x; "
              f"stock PyG / pyg_sar: {rows[0]['mem_delta_mib'] / one['mem_delta_mib']:.2f}x "
              f"at N=1, {rows[0]['mem_delta_mib'] / last['mem_delta_mib']:.2f}x "
              f"at N={last['workers']}")
        result = dict(
            graph=graph, edge_cut=prep['cuts'], config=prep['config'],
            mode=args.mode, epochs=args.epochs,
            malloc_mmap_threshold=args.malloc_mmap_threshold,
            featureless_input='fixed seeded N(0,1), paper feature width',
            machine='shared 2-core CPU, no GPU', rows=rows,
            loss_checks=checks, memory_fall_1_to_max=fall)
        name = 'hetero_quick' if args.quick else 'hetero'
        write_results(args.out, name, result, plot, rows)
        if not all(c['ok'] for c in checks):
            print(f'FAILED: a pyg_sar first-epoch loss differs from stock '
                  f'PyG\'s by more than {LOSS_RTOL:g} (relative)',
                  file=sys.stderr)
            return 1
        return 0
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--num-papers', type=int, default=100_000)
    parser.add_argument('--num-features', type=int, default=128)
    parser.add_argument('--num-classes', type=int, default=16)
    parser.add_argument('--hidden', type=int, default=128)
    parser.add_argument('--epochs', type=int, default=3,
                        help='timed epochs after the first (median)')
    parser.add_argument('--mode', choices=('sar', 'sa', 'one_shot'),
                        default='sar')
    parser.add_argument('--malloc-mmap-threshold', type=int, default=1 << 20,
                        help='MALLOC_MMAP_THRESHOLD_ of every worker, stock '
                        'PyG included (as in full_batch.py; 0: glibc default)')
    parser.add_argument('--quick', action='store_true',
                        help='3k papers, N=1,2, 1 timed epoch: a smoke test')
    parser.add_argument('--out', default=osp.join(HERE, 'results'))
    parser.add_argument('--work-dir', default=None,
                        help='keep the graph, initial weights and partitions '
                        'here, and reuse them when the sizes match')
    parser.add_argument('--timeout', type=float, default=600.0)
    # Worker-only arguments.
    add_internal_args(parser, '--config')
    return parser.parse_args(argv)


if __name__ == '__main__':
    run_script(parse_args(), worker, prepare, main)
