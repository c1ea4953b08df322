"""What the Cora examples share: arguments, partitioning on first use, the
worker's shard, and the full-batch training loop.

Not an example itself; ``full_batch_sage_cora.py``, ``full_batch_gat.py`` and
``stock_pyg_to_distributed.py`` import it (it sits next to them).
"""
import pyg_sar  # first: its OpenMP policy must be set before torch loads

import argparse
import os.path as osp
import time
from dataclasses import dataclass
from typing import Dict

import torch
from torch import Tensor

from pyg_sar import comm
from pyg_sar.train import distributed_loss, evaluate


def argument_parser(description: str, hidden: int, lr: float
                    ) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument('--root', default='data',
                        help='writable data folder: Cora in ROOT/Cora '
                        '(downloaded when absent), its partitions in '
                        'ROOT/parts')
    parser.add_argument('--parts', default=None,
                        help='partition directory (default: '
                        'ROOT/parts/Cora-<world size>)')
    parser.add_argument('--hidden', type=int, default=hidden)
    parser.add_argument('--epochs', type=int, default=100)
    parser.add_argument('--lr', type=float, default=lr)
    parser.add_argument('--weight-decay', type=float, default=5e-4)
    parser.add_argument('--seed', type=int, default=0)
    return parser


@dataclass
class CoraShard:
    """One worker's part of Cora, ready for training."""
    rank: int
    world_size: int
    part: pyg_sar.Partition
    graph: pyg_sar.DistGraph
    x: Tensor
    y: Tensor
    masks: Dict[str, Tensor]
    num_classes: int
    num_train: int


def load_shard(args: argparse.Namespace, chunk_size=None) -> CoraShard:
    """Joins the workers, lets rank 0 partition Cora into ``args.parts``
    when it is missing (the others wait), and loads this worker's part."""
    rank, world_size = pyg_sar.init_distributed()
    parts = args.parts or osp.join(args.root, 'parts', f'Cora-{world_size}')
    if rank == 0 and not osp.exists(osp.join(parts, 'META.json')):
        data = pyg_sar.datasets.load('Cora', args.root)
        manifest = pyg_sar.partition_graph(data, world_size, parts,
                                           progress=False)
        print(f"partitioned Cora ({data.num_nodes} nodes, {data.num_edges} "
              f"edges) into {world_size} part(s), edge cut "
              f"{100 * manifest['edge_cut']['fraction']:.1f}%", flush=True)
    comm.barrier()
    part = pyg_sar.load_partition(parts, rank)
    graph = pyg_sar.DistGraph(part, chunk_size=chunk_size)
    y = part.y.long()
    num_classes = int(comm.all_reduce(torch.tensor([int(y.max()) + 1]),
                                      'max')[0])
    masks = {'train': part.train_mask, 'val': part.val_mask,
             'test': part.test_mask}
    if rank == 0:
        print(f'{graph}', flush=True)
    return CoraShard(rank, world_size, part, graph, part.x.float(), y, masks,
                     num_classes, pyg_sar.global_count(part.train_mask))


def train(model: torch.nn.Module, shard: CoraShard,
          args: argparse.Namespace, log_every: int = 1) -> Dict[str, float]:
    """Full-batch training; rank 0 prints the epochs. Returns the final
    accuracies and the test accuracy at the best validation accuracy."""
    pyg_sar.sync_params(model)  # identical initial weights on every rank
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr,
                                 weight_decay=args.weight_decay)
    best_val, best_test = -1.0, 0.0
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        model.train()
        optimizer.zero_grad()
        # Local sum over my training nodes / global count: after the
        # gradient all-reduce this is exactly the single-process gradient.
        loss = distributed_loss(model(shard.x, shard.graph), shard.y,
                                shard.masks['train'], shard.num_train)
        loss.backward()
        pyg_sar.all_reduce_grads(model)
        optimizer.step()
        loss = float(comm.all_reduce(loss.detach().clone()))
        acc = evaluate(model, shard.x, shard.graph, shard.y, shard.masks)
        if acc['val_acc'] > best_val:
            best_val, best_test = acc['val_acc'], acc['test_acc']
        if shard.rank == 0 and (epoch % log_every == 0 or epoch == 1):
            print(f"epoch {epoch:3d}  loss {loss:.4f}  train "
                  f"{acc['train_acc']:.4f}  val {acc['val_acc']:.4f}  "
                  f"test {acc['test_acc']:.4f}  "
                  f"({time.perf_counter() - start:.3f}s)", flush=True)
    final = evaluate(model, shard.x, shard.graph, shard.y, shard.masks)
    final['test_acc_at_best_val'] = best_test
    if shard.rank == 0:
        print(f"final test accuracy: {final['test_acc']:.4f} (at the best "
              f"validation accuracy {best_val:.4f}: {best_test:.4f})")
    return final
