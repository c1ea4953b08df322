"""The fixed cost per propagation: deep and small models.

On a small graph (Cora: 2,708 nodes, 10,556 edges) an epoch is mostly
per-layer fixed cost: the halo exchange, the engine's planning, Python.
This benchmark times, per propagation (one layer's ``propagate``, forward
and backward), three deep stacks:

* ``gcn2``: PyG's ``gcn2_cora`` example model, 64 ``GCN2Conv`` layers
  (alpha 0.1, theta 0.5, shared weights), ``T.GCNNorm()`` weights fed as
  ``edge_weight`` with ``normalize=False`` (the whole-neighborhood path in
  pyg_sar);
* ``gcn``: 16 ``GCNConv`` layers (normalizing; the engine's sparse path);
* ``gat``: 16 ``GATConv`` layers, 1 head (the engine's attention path);

each in stock PyG in one process and in pyg_sar (``to_distributed``) at
N=1 and N=2 workers (gloo on 127.0.0.1, ``2 // N`` threads each), at the
model's width (``--hidden``, default 64) and at a tiny width (2): there the
arithmetic is near zero and ``epoch / propagations`` is the fixed cost per
propagation. ``fixed - stock`` is pyg_sar's own overhead per propagation
over stock PyG's at the same tiny width.

The graph: Cora from ``$PYG_SAR_SHARED_DATA`` (default
``/work/shared/data``), copied to a temporary directory, when present; else
``pyg_sar.datasets.synthetic_graph(2708, 4, 1433, 7, seed=0)`` (a graph of
Cora's size). The table says which.

    python benchmarks/propagation_cost.py               # all models
    python benchmarks/propagation_cost.py --models gcn2 --profile
        # + a cProfile of one epoch on rank 0 of N=2 (top functions)

Writes ``<out>/<name>.json`` and ``.png`` (default
``benchmarks/results/propagation_cost``).
"""
from __future__ import annotations

import argparse
import os
import os.path as osp
import shutil
import statistics
import sys
import tempfile
import time
from typing import List

HERE = osp.dirname(osp.abspath(__file__))
sys.path.insert(0, HERE)
from _common import write_results  # noqa: E402

LAYERS = {'gcn2': 64, 'gcn': 16, 'gat': 16}
TINY = 2


# Graph #######################################################################

def load_graph(work: str):
    """Cora (normalized weights added) if a shared copy exists, else a
    synthetic graph of its size; returns ``(data, source)``."""
    import torch_geometric.transforms as T

    import pyg_sar
    shared = os.environ.get('PYG_SAR_SHARED_DATA', '/work/shared/data')
    data, source = None, None
    if osp.isdir(osp.join(shared, 'Cora')):
        root = osp.join(work, 'data')
        shutil.copytree(osp.join(shared, 'Cora'), osp.join(root, 'Cora'))
        try:
            data = pyg_sar.datasets.load('Cora', root)
            source = 'Cora'
        except Exception as exc:  # offline / unreadable copy: fall back
            print(f'Cora unavailable ({exc}); using a synthetic graph')
    if data is None:
        data = pyg_sar.datasets.synthetic_graph(2708, 4, 1433, 7, seed=0)
        source = 'synthetic_graph(2708, 4, 1433, 7, seed=0)'
    for key in ('edge_weight', 'edge_attr'):
        if key in data:
            del data[key]
    data = T.GCNNorm()(data)  # edge_weight: gcn2_cora's normalized adj_t
    return data, source


# Models ######################################################################

def build(model: str, in_channels: int, hidden: int, out_channels: int):
    import torch
    import torch.nn.functional as F
    import torch_geometric.nn as pyg_nn

    class Deep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin0 = torch.nn.Linear(in_channels, hidden)
            self.lin1 = torch.nn.Linear(hidden, out_channels)
            self.convs = torch.nn.ModuleList()
            for layer in range(LAYERS[model]):
                if model == 'gcn2':
                    conv = pyg_nn.GCN2Conv(hidden, 0.1, 0.5, layer + 1,
                                           True, normalize=False)
                elif model == 'gcn':
                    conv = pyg_nn.GCNConv(hidden, hidden)
                else:
                    conv = pyg_nn.GATConv(hidden, hidden, heads=1)
                self.convs.append(conv)

        def forward(self, x, edge_index, edge_weight=None):
            x = x_0 = self.lin0(x).relu()
            for conv in self.convs:
                if model == 'gcn2':
                    x = conv(x, x_0, edge_index, edge_weight)
                else:
                    x = conv(x, edge_index)
                x = F.relu(x)
            return self.lin1(x)

    return Deep()


def _epoch_fn(model, x, graph, y, mask, total, weight, dist):
    import torch
    import torch.nn.functional as F

    import pyg_sar
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

    def epoch():
        optimizer.zero_grad()
        out = model(x, graph, weight)
        loss = F.cross_entropy(out[mask], y[mask], reduction='sum') / total
        loss.backward()
        if dist:
            pyg_sar.all_reduce_grads(model)
        optimizer.step()
    return epoch


def _time(epoch, epochs: int, barrier=None) -> List[float]:
    epoch()  # warm-up: caches, plans, allocator
    times = []
    for _ in range(epochs):
        if barrier:
            barrier()
        start = time.perf_counter()
        epoch()
        times.append(time.perf_counter() - start)
    return times


# Workers #####################################################################

def stock_run(data, model: str, hidden: int, epochs: int) -> List[float]:
    import torch
    torch.set_num_threads(2)
    torch.manual_seed(0)
    net = build(model, data.num_features, hidden, int(data.y.max()) + 1)
    mask = data.train_mask
    epoch = _epoch_fn(net, data.x, data.edge_index, data.y, mask,
                      int(mask.sum()), data.edge_weight, False)
    return _time(epoch, epochs)


def sar_worker(rank: int, world_size: int, parts: str, model: str,
               hidden: int, epochs: int, profile: bool, mode: str = 'sar'):
    import torch

    import pyg_sar
    from pyg_sar import comm
    torch.set_num_threads(max(1, 2 // world_size))
    part = pyg_sar.load_partition(parts, rank)
    graph = pyg_sar.DistGraph(part, mode=mode)
    classes = int(comm.all_reduce(torch.tensor([int(part.y.max()) + 1]),
                                  'max')[0])
    torch.manual_seed(0)
    net = pyg_sar.nn.to_distributed(
        build(model, part.x.size(1), hidden, classes))
    pyg_sar.sync_params(net)
    mask = part.train_mask
    epoch = _epoch_fn(net, part.x.float(), graph, part.y.long(), mask,
                      pyg_sar.global_count(mask), part.edge_weight, True)
    times = _time(epoch, epochs, comm.barrier)
    comm.barrier()
    comm.reset_comm_stats()
    epoch()  # exchange rounds and collectives of one epoch
    rounds = comm.comm_stats()['collectives']
    text = None
    if profile and rank == 0:
        import cProfile
        import io
        import pstats
        prof = cProfile.Profile()
        prof.enable()
        epoch()
        prof.disable()
        s = io.StringIO()
        stats = pstats.Stats(prof, stream=s).sort_stats('tottime')
        stats.print_stats(25)
        text = s.getvalue()
    elif profile:
        epoch()
    return dict(times=times, profile=text, rounds=rounds)


def _spawn(rank, world_size, port, args, out_dir):
    import pickle
    import traceback
    from datetime import timedelta
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size),
                      MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    import pyg_sar
    try:
        pyg_sar.init_distributed(backend='gloo',
                                 timeout=timedelta(seconds=300))
        payload = ('ok', sar_worker(rank, world_size, *args))
    except BaseException:
        payload = ('error', traceback.format_exc())
    with open(osp.join(out_dir, f'{rank}.pkl'), 'wb') as f:
        pickle.dump(payload, f)
    import torch.distributed as dist
    if dist.is_initialized() and payload[0] == 'ok':
        dist.destroy_process_group()


def sar_run(world_size: int, *args) -> List[dict]:
    import pickle

    import torch.multiprocessing as mp

    from pyg_sar.comm import find_free_port
    port = find_free_port()
    ctx = mp.get_context('spawn')
    with tempfile.TemporaryDirectory() as out_dir:
        procs = [ctx.Process(target=_spawn,
                             args=(r, world_size, port, args, out_dir))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=900)
            if p.is_alive():
                p.kill()
        results = []
        for r in range(world_size):
            path = osp.join(out_dir, f'{r}.pkl')
            if not osp.exists(path):
                raise RuntimeError(f'rank {r} exited without a result')
            with open(path, 'rb') as f:
                status, value = pickle.load(f)
            if status != 'ok':
                raise RuntimeError(f'rank {r} failed:\n{value}')
            results.append(value)
    return results


# Driver ######################################################################

def plot(rows: List[dict], path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    models = sorted({r['model'] for r in rows})
    systems = ['stock PyG', 'pyg_sar N=1', 'pyg_sar N=2']
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, width in zip(axes, ('hidden', 'tiny')):
        for k, system in enumerate(systems):
            vals = [next((r['ms_per_propagation'] for r in rows
                          if r['model'] == m and r['system'] == system and
                          r['width_kind'] == width), 0) for m in models]
            ax.bar([i + 0.27 * (k - 1) for i in range(len(models))], vals,
                   0.27, label=system)
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(models)
        ax.set_ylabel('ms per propagation (fwd + bwd)')
        ax.set_title(f'{width} width')
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args) -> int:
    import pyg_sar
    work = tempfile.mkdtemp(prefix='propcost_')
    try:
        data, source = load_graph(work)
        print(f'graph: {source} ({data.num_nodes} nodes, {data.num_edges} '
              f'edges); load average {os.getloadavg()[0]:.1f}', flush=True)
        parts = {}
        for n in (1, 2):
            parts[n] = osp.join(work, f'parts{n}')
            pyg_sar.partition_graph(data, n, parts[n], progress=False)
        rows = []
        for model in args.models.split(','):
            layers = LAYERS[model]
            for kind, width in (('hidden', args.hidden), ('tiny', TINY)):
                for system in ('stock PyG', 'pyg_sar N=1', 'pyg_sar N=2'):
                    prof, rounds = None, 0
                    if system == 'stock PyG':
                        times = stock_run(data, model, width, args.epochs)
                    else:
                        n = int(system[-1])
                        res = sar_run(n, parts[n], model, width, args.epochs,
                                      args.profile and n == 2 and
                                      kind == 'tiny', args.mode)
                        times = [max(t) for t in
                                 zip(*[r['times'] for r in res])]
                        prof = res[0]['profile']
                        rounds = max(r['rounds'] for r in res)
                    epoch = statistics.median(times)
                    rows.append(dict(model=model, layers=layers,
                                     system=system, width_kind=kind,
                                     width=width, epoch_s=epoch,
                                     epoch_times_s=times,
                                     rounds_per_epoch=rounds,
                                     ms_per_propagation=1e3 * epoch / layers))
                    print(f'{model:5s} {kind:6s} {system:12s} epoch '
                          f'{epoch * 1e3:8.1f} ms  per propagation '
                          f'{1e3 * epoch / layers:6.2f} ms  exchange rounds '
                          f'and collectives per propagation '
                          f'{rounds / layers:.2f}', flush=True)
                    if prof:
                        print(prof)
        print()
        print(f"{'model':6s} {'system':12s} {'ms/prop':>8s} "
              f"{'tiny ms/prop':>12s} {'tiny - stock':>12s} "
              f"{'/stock':>7s} {'rounds/prop':>11s}")
        summary = []
        for model in args.models.split(','):
            stock_tiny = next(r for r in rows if r['model'] == model and
                              r['system'] == 'stock PyG' and
                              r['width_kind'] == 'tiny')
            stock = next(r for r in rows if r['model'] == model and
                         r['system'] == 'stock PyG' and
                         r['width_kind'] == 'hidden')
            for system in ('stock PyG', 'pyg_sar N=1', 'pyg_sar N=2'):
                h = next(r for r in rows if r['model'] == model and
                         r['system'] == system and
                         r['width_kind'] == 'hidden')
                t = next(r for r in rows if r['model'] == model and
                         r['system'] == system and r['width_kind'] == 'tiny')
                over = (t['ms_per_propagation'] -
                        stock_tiny['ms_per_propagation'])
                ratio = h['epoch_s'] / stock['epoch_s']
                summary.append(dict(model=model, system=system,
                                    ms_per_propagation=h['ms_per_propagation'],
                                    fixed_ms_per_propagation=t[
                                        'ms_per_propagation'],
                                    overhead_over_stock_ms=over,
                                    epoch_over_stock=ratio,
                                    rounds_per_propagation=h[
                                        'rounds_per_epoch'] / h['layers']))
                print(f"{model:6s} {system:12s} "
                      f"{h['ms_per_propagation']:8.2f} "
                      f"{t['ms_per_propagation']:12.2f} {over:12.2f} "
                      f"{ratio:7.2f} "
                      f"{h['rounds_per_epoch'] / h['layers']:11.2f}")
        os.makedirs(args.out, exist_ok=True)
        write_results(args.out, args.name,
                      dict(graph=source, hidden=args.hidden, tiny=TINY,
                           mode=args.mode,
                           epochs=args.epochs, layers=LAYERS,
                           load_average=os.getloadavg(), rows=rows,
                           summary=summary), plot, rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--models', default='gcn2,gcn,gat',
                        help='comma list of gcn2, gcn, gat')
    parser.add_argument('--hidden', type=int, default=64)
    parser.add_argument('--epochs', type=int, default=5,
                        help='timed epochs after a warm-up (median)')
    parser.add_argument('--mode', default='sar',
                        choices=('sar', 'sa', 'one_shot'),
                        help='the DistGraph mode of the pyg_sar runs')
    parser.add_argument('--profile', action='store_true',
                        help='cProfile one tiny-width epoch on rank 0, N=2')
    parser.add_argument('--out', default=osp.join(HERE, 'results'))
    parser.add_argument('--name', default='propagation_cost')
    args = parser.parse_args(argv)
    for m in args.models.split(','):
        if m not in LAYERS:
            parser.error(f'--models: unknown model {m!r}; expected one of '
                         f'{sorted(LAYERS)}')
    return args


if __name__ == '__main__':
    sys.exit(main(parse_args()))
