"""Full-batch GraphSAGE on Cora with pyg_sar, on one or more workers.

    torchrun --nproc-per-node 2 examples/full_batch_sage_cora.py --root data
    python examples/full_batch_sage_cora.py --root data        # one worker

Rank 0 downloads Cora (unless present under ``--root``) and partitions it into
``--parts`` (one part per worker) if that directory is missing; the other
ranks wait at a barrier. Every worker then trains on its own part: the
2-layer SAGE model is written with ``pyg_sar.nn.SAGEConv``, whose
``forward(x, graph)`` exchanges halo features with the other workers.
"""
import argparse
import os.path as osp
import time

import torch
import torch.nn.functional as F

import pyg_sar
from pyg_sar import comm
from pyg_sar.nn import SAGEConv
from pyg_sar.train import distributed_loss, evaluate


class SAGE(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels,
                 dropout=0.5):
        super().__init__()
        self.conv1 = SAGEConv(in_channels, hidden_channels)
        self.conv2 = SAGEConv(hidden_channels, out_channels)
        self.dropout = dropout

    def forward(self, x, graph):
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = self.conv1(x, graph).relu()
        x = F.dropout(x, p=self.dropout, training=self.training)
        return self.conv2(x, graph)


def prepare_partition(root: str, parts: str, rank: int,
                      world_size: int) -> None:
    """Rank 0 partitions Cora into ``parts`` if needed; all ranks wait."""
    if rank == 0 and not osp.exists(osp.join(parts, 'META.json')):
        data = pyg_sar.datasets.load('Cora', root)
        manifest = pyg_sar.partition_graph(data, world_size, parts,
                                           progress=False)
        print(f"partitioned Cora ({data.num_nodes} nodes, {data.num_edges} "
              f"edges) into {world_size} part(s), edge cut "
              f"{100 * manifest['edge_cut']['fraction']:.1f}%", flush=True)
    comm.barrier()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--root', default='data',
                        help='dataset root (Cora is downloaded to ROOT/Cora)')
    parser.add_argument('--parts', default=None,
                        help='partition directory (default: '
                        'ROOT/partitions/Cora-<world size>)')
    parser.add_argument('--hidden', type=int, default=64)
    parser.add_argument('--epochs', type=int, default=100)
    parser.add_argument('--lr', type=float, default=0.01)
    parser.add_argument('--weight-decay', type=float, default=5e-4)
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()

    rank, world_size = pyg_sar.init_distributed()
    parts = args.parts or osp.join(args.root, 'partitions',
                                   f'Cora-{world_size}')
    prepare_partition(args.root, parts, rank, world_size)

    part = pyg_sar.load_partition(parts, rank)
    graph = pyg_sar.DistGraph(part)
    x, y = part.x.float(), part.y.long()
    masks = {'train': part.train_mask, 'val': part.val_mask,
             'test': part.test_mask}
    num_classes = int(comm.all_reduce(torch.tensor([int(y.max()) + 1]),
                                      'max')[0])
    num_train = pyg_sar.global_count(masks['train'])

    torch.manual_seed(args.seed)
    model = SAGE(x.shape[1], args.hidden, num_classes)
    pyg_sar.sync_params(model)  # identical initial weights on every rank
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr,
                                 weight_decay=args.weight_decay)
    if rank == 0:
        print(f'{graph}', flush=True)

    best_val, best_test = -1.0, 0.0
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        model.train()
        optimizer.zero_grad()
        # Local sum over my training nodes / global count: after the
        # gradient all-reduce this is exactly the single-process gradient.
        loss = distributed_loss(model(x, graph), y, masks['train'],
                                num_train)
        loss.backward()
        pyg_sar.all_reduce_grads(model)
        optimizer.step()
        loss = float(comm.all_reduce(loss.detach().clone()))
        acc = evaluate(model, x, graph, y, masks)  # same on every rank
        if acc['val_acc'] > best_val:
            best_val, best_test = acc['val_acc'], acc['test_acc']
        if rank == 0:
            print(f"epoch {epoch:3d}  loss {loss:.4f}  train "
                  f"{acc['train_acc']:.4f}  val {acc['val_acc']:.4f}  "
                  f"test {acc['test_acc']:.4f}  "
                  f"({time.perf_counter() - start:.3f}s)", flush=True)
    acc = evaluate(model, x, graph, y, masks)
    if rank == 0:
        print(f"final test accuracy: {acc['test_acc']:.4f} (at the best "
              f"validation accuracy {best_val:.4f}: {best_test:.4f})")


if __name__ == '__main__':
    main()
