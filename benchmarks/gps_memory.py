"""Per-worker peak memory of a distributed ``GPSConv`` (exact global
multihead attention: a ring of key/value blocks, online softmax,
rematerialized backward) against the N x N attention of stock PyG.

For each world size P, P processes (gloo, this machine) run one forward and
backward of ``to_distributed(GPSConv(C, GCNConv(C, C), heads))`` over an
N-node graph; each reports its peak RSS over the state right before the
step (``VmHWM`` after a reset of the mark, a fresh process per run). Stock
PyG (``torch.nn.MultiheadAttention`` on ``to_dense_batch`` output, one
process) runs at the sizes of ``--stock-nodes`` with torch's default
attention kernel (``pyg``: a fused kernel on CPU, which builds no N x N
matrix) and at those of ``--stock-math-nodes`` with torch's math attention
(``pyg-math``: it builds the N x N weights). Every row also gives
``N^2 * heads * 4 B``, the size of one float32 attention matrix.

Prints a table, writes ``gps_memory.json``, ``gps_memory.txt`` (the table)
and ``gps_memory.png``::

    python benchmarks/gps_memory.py --nodes 50000 --world-sizes 1 2 4
"""
from __future__ import annotations

import argparse
import json
import os
import os.path as osp
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from _common import free_port, reset_hwm, status_mib  # noqa: E402

HERE = osp.dirname(osp.abspath(__file__))


def _graph(num_nodes: int, seed: int = 0):
    import torch
    from torch_geometric.data import Data
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes, (num_nodes * 8, ), generator=gen)
    dst = torch.randint(0, num_nodes, (num_nodes * 8, ), generator=gen)
    return Data(edge_index=torch.stack([src, dst]), num_nodes=num_nodes)


def _model(args):
    import torch
    import torch_geometric.nn as pyg_nn
    torch.manual_seed(0)
    return pyg_nn.GPSConv(args.channels, pyg_nn.GCNConv(args.channels,
                                                         args.channels),
                          heads=args.heads)


def _step(model, x, graph) -> float:
    """One forward and backward; the peak RSS over the state before it
    (MiB) and the seconds it took."""
    import gc
    gc.collect()
    before = status_mib('VmRSS')
    reset_hwm()
    start = time.perf_counter()
    model(x, graph).square().sum().backward()
    seconds = time.perf_counter() - start
    return status_mib('VmHWM') - before, seconds


def worker(args) -> None:
    import torch
    import pyg_sar
    rank = int(os.environ.get('RANK', '0'))
    world_size = int(os.environ.get('WORLD_SIZE', '1'))
    torch.set_num_threads(max(1, args.threads // world_size))
    if args.impl in ('pyg', 'pyg-math'):
        import contextlib
        from torch.nn.attention import SDPBackend, sdpa_kernel
        data = _graph(args.nodes)
        x = torch.randn(args.nodes, args.channels, generator=torch.Generator(
        ).manual_seed(1))
        with (sdpa_kernel(SDPBackend.MATH) if args.impl == 'pyg-math' else
              contextlib.nullcontext()):
            peak, seconds = _step(_model(args), x, data.edge_index)
    else:
        from datetime import timedelta
        pyg_sar.init_distributed(backend='gloo',
                                 timeout=timedelta(seconds=1800))
        part = pyg_sar.load_partition(args.parts, rank)
        graph = pyg_sar.DistGraph(part, chunk_size=args.block ** 2)
        x = torch.randn(args.nodes, args.channels, generator=torch.Generator(
        ).manual_seed(1))[part.orig_ids].clone()
        model = pyg_sar.nn.to_distributed(_model(args))
        pyg_sar.comm.barrier()
        peak, seconds = _step(model, x, graph)
        pyg_sar.comm.barrier()
    with open(args.result, 'w') as f:
        json.dump(dict(rank=rank, peak_mib=peak, seconds=seconds), f)


def _run(args, impl: str, nodes: int, world_size: int, parts: str, tmp: str):
    port = str(free_port())
    procs, paths = [], []
    for rank in range(world_size):
        path = osp.join(tmp, f'{impl}_{nodes}_{world_size}_{rank}.json')
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size),
                   MASTER_ADDR='127.0.0.1', MASTER_PORT=port)
        cmd = [sys.executable, osp.abspath(__file__), '--worker', '--impl',
               impl, '--nodes', str(nodes), '--parts', parts or '',
               '--result', path, '--channels', str(args.channels),
               '--heads', str(args.heads), '--block', str(args.block),
               '--threads', str(args.threads)]
        procs.append(subprocess.Popen(cmd, env=env))
        paths.append(path)
    for p in procs:
        if p.wait(timeout=args.timeout) != 0:
            raise RuntimeError(f'{impl} worker failed (exit {p.returncode})')
    results = []
    for path in paths:
        with open(path) as f:
            results.append(json.load(f))
    return results



def main(args) -> int:
    import pyg_sar
    rows = []
    formula = lambda n: n * n * args.heads * 4 / 2 ** 20  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        stock = [('pyg-math', n) for n in args.stock_math_nodes] + [
            ('pyg', n) for n in args.stock_nodes]
        for impl, n in stock:
            r = _run(args, impl, n, 1, '', tmp)[0]
            rows.append(dict(impl=impl, nodes=n, world_size=1,
                             peak_mib=r['peak_mib'], seconds=r['seconds'],
                             attention_matrix_mib=formula(n)))
            print(rows[-1], flush=True)
        for P in args.world_sizes:
            parts = osp.join(tmp, f'parts{P}')
            pyg_sar.partition_graph(_graph(args.nodes), P, parts)
            rs = _run(args, 'sar', args.nodes, P, parts, tmp)
            rows.append(dict(impl='pyg_sar', nodes=args.nodes, world_size=P,
                             peak_mib=max(r['peak_mib'] for r in rs),
                             peak_mib_per_rank=[r['peak_mib'] for r in rs],
                             seconds=max(r['seconds'] for r in rs),
                             attention_matrix_mib=formula(args.nodes)))
            print(rows[-1], flush=True)
    table = _table(rows)
    print('\n' + table)
    os.makedirs(args.out, exist_ok=True)
    result = dict(config=dict(channels=args.channels, heads=args.heads,
                              block=args.block, threads=args.threads,
                              edges_per_node=8), rows=rows)
    with open(osp.join(args.out, 'gps_memory.json'), 'w') as f:
        json.dump(result, f, indent=1)
    with open(osp.join(args.out, 'gps_memory.txt'), 'w') as f:
        f.write(table + '\n')
    _plot(rows, osp.join(args.out, 'gps_memory.png'))
    print(f"wrote {osp.join(args.out, 'gps_memory')}.json/.png")
    return 0


def _table(rows) -> str:
    lines = [f"{'impl':9} {'N':>7} {'P':>2} {'peak/worker MiB':>16} "
             f"{'N^2*H*4B MiB':>13} {'step s':>8}"]
    for r in rows:
        lines.append(f"{r['impl']:9} {r['nodes']:7d} {r['world_size']:2d} "
                     f"{r['peak_mib']:16.1f} "
                     f"{r['attention_matrix_mib']:13.1f} "
                     f"{r['seconds']:8.1f}")
    return '\n'.join(lines)


def _plot(rows, path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    sar = [r for r in rows if r['impl'] == 'pyg_sar']
    for impl, label in (('pyg-math', 'stock PyG, math attention'),
                        ('pyg', 'stock PyG, fused attention')):
        stock = [r for r in rows if r['impl'] == impl]
        if stock:
            ax.plot([r['nodes'] for r in stock],
                    [r['peak_mib'] for r in stock], 'o-',
                    label=label + ' (1 process)')
    ns = sorted({r['nodes'] for r in rows})
    ax.plot(ns, [r['attention_matrix_mib'] for r in sorted(
        {r['nodes']: r for r in rows}.values(), key=lambda r: r['nodes'])],
        'k--', label='N x N x heads x 4 B (one attention matrix)')
    for r in sar:
        ax.plot([r['nodes']], [r['peak_mib']], 's',
                label=f"pyg_sar, P={r['world_size']} (per worker)")
    ax.set_xscale('log')
    ax.set_yscale('log')
    ax.set_xlabel('nodes N')
    ax.set_ylabel('peak memory of one step (MiB)')
    ax.set_title('GPSConv global attention: memory per worker')
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--nodes', type=int, default=50000)
    p.add_argument('--world-sizes', type=int, nargs='+', default=[1, 2, 4])
    p.add_argument('--stock-nodes', type=int, nargs='*',
                   default=[12500, 25000, 50000],
                   help="stock PyG sizes, torch's default (fused) attention")
    p.add_argument('--stock-math-nodes', type=int, nargs='*',
                   default=[2000, 4000, 8000],
                   help="stock PyG sizes with torch's math attention, which "
                   "builds the N x N weights")
    p.add_argument('--channels', type=int, default=16)
    p.add_argument('--heads', type=int, default=1)
    p.add_argument('--block', type=int, default=1024,
                   help='query/key rows per attention block')
    p.add_argument('--threads', type=int, default=1,
                   help='torch threads of a run, shared by its workers '
                   '(at least 1 each)')
    p.add_argument('--timeout', type=float, default=3600)
    p.add_argument('--out', default=osp.join(HERE, 'results'))
    p.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--impl', help=argparse.SUPPRESS)
    p.add_argument('--parts', help=argparse.SUPPRESS)
    p.add_argument('--result', help=argparse.SUPPRESS)
    return p.parse_args(argv)


if __name__ == '__main__':
    a = parse_args()
    if a.worker:
        worker(a)
    else:
        sys.exit(main(a))
