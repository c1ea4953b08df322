"""``pyg-sar demo``: partition the synthetic default and train on 2 workers.

No set-up needed: it writes the partition into a directory (a temporary one
unless ``--out`` is given) and launches local workers through
``torch.distributed.run`` on the loopback interface.
"""
from __future__ import annotations

import argparse
import os
import os.path as osp
import subprocess
import sys
import tempfile

from pyg_sar.cli.registry import register_command


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--workers', type=int, default=2)
    parser.add_argument('--num-nodes', type=int, default=100_000)
    parser.add_argument('--avg-degree', type=float, default=20.0)
    parser.add_argument('--model', choices=('sage', 'gcn', 'gat'),
                        default='sage')
    parser.add_argument('--layers', type=int, default=3)
    parser.add_argument('--hidden', type=int, default=128)
    parser.add_argument('--epochs', type=int, default=20)
    parser.add_argument('--lr', type=float, default=0.01)
    parser.add_argument('--mode', choices=('sar', 'sa', 'one_shot'),
                        default='sar')
    parser.add_argument('--out', default=None,
                        help='keep the partition here (default: a temp dir)')


def _run(args: argparse.Namespace) -> int:
    from pyg_sar import datasets
    from pyg_sar.comm import find_free_port
    from pyg_sar.partition import partition_graph

    with tempfile.TemporaryDirectory() as tmp:
        parts = args.out or osp.join(tmp, 'parts')
        if not osp.exists(osp.join(parts, 'META.json')):
            data = datasets.load('synthetic', tmp, num_nodes=args.num_nodes,
                                 avg_degree=args.avg_degree)
            print(f'synthetic graph: {data.num_nodes:,} nodes, '
                  f'{data.num_edges:,} edges, {data.x.shape[1]} features, '
                  f'{int(data.y.max()) + 1} classes')
            manifest = partition_graph(data, args.workers, parts)
            print(f"METIS: {args.workers} parts, edge cut "
                  f"{100 * manifest['edge_cut']['fraction']:.1f}%")
            del data
        command = [
            sys.executable, '-m', 'torch.distributed.run',
            '--nnodes', '1', '--nproc-per-node', str(args.workers),
            '--master-addr', '127.0.0.1',
            '--master-port', str(find_free_port()),
            '-m', 'pyg_sar.cli', 'train', '--parts', parts,
            '--model', args.model, '--layers', str(args.layers),
            '--hidden', str(args.hidden), '--epochs', str(args.epochs),
            '--lr', str(args.lr), '--mode', args.mode,
        ]
        print('launching: ' + ' '.join(command[2:]), flush=True)
        env = dict(os.environ)
        # Each worker gets its share of the cores instead of oversubscribing.
        env.setdefault('OMP_NUM_THREADS', str(max(
            1, (os.cpu_count() or 1) // args.workers)))
        env.setdefault('OMP_WAIT_POLICY', 'PASSIVE')  # utils/openmp.py
        return subprocess.call(command, env=env)


register_command('demo', 'Partition the synthetic default graph and train on '
                 'local workers (no set-up)', _configure, _run)
