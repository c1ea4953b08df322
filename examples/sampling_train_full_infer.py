"""Sampled mini-batch training, then full-graph inference, on N ranks.

Converts a stock PyG GraphSAGE once with :func:`pyg_sar.nn.to_distributed`,
trains it on neighborhoods drawn by :class:`pyg_sar.loader.DistNeighborLoader`
(on a batch's plain ``edge_index`` the converted layers compute what the stock
ones do), then evaluates the same model object full-batch over the
:class:`pyg_sar.DistGraph` (:func:`pyg_sar.train.inference`): every node's
exact prediction, each layer computed once, with no per-layer sampling.

    torchrun --nproc-per-node 2 examples/sampling_train_full_infer.py \
        --dataset Cora --root data

``--root`` is a writable folder: the dataset in ``ROOT/<dataset>``
(downloaded when absent). Rank 0 partitions it into ``--parts`` (default
``ROOT/parts/<dataset>-<N>``) when that folder holds no partition yet; the
other ranks wait at a barrier. Without torchrun it runs as one process.
"""
import pyg_sar  # first: its OpenMP policy must be set before torch loads

import argparse
import os.path as osp
import time

import torch
import torch.nn.functional as F
from torch_geometric.nn import SAGEConv

from pyg_sar import comm
from pyg_sar.loader import DistNeighborLoader
from pyg_sar.nn import to_distributed


class GraphSAGE(torch.nn.Module):
    """Two-layer GraphSAGE; plain PyG, unaware of distribution."""

    def __init__(self, in_channels: int, hidden_channels: int,
                 out_channels: int, dropout: float = 0.5) -> None:
        super().__init__()
        self.conv1 = SAGEConv(in_channels, hidden_channels)
        self.conv2 = SAGEConv(hidden_channels, out_channels)
        self.dropout = dropout

    def forward(self, x, edge_index):
        x = F.relu(self.conv1(x, edge_index))
        x = F.dropout(x, p=self.dropout, training=self.training)
        return self.conv2(x, edge_index)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--dataset', default='Cora')
    parser.add_argument('--root', default='data',
                        help='writable data folder: the dataset in '
                        'ROOT/<dataset>, its partitions in ROOT/parts')
    parser.add_argument('--parts', default=None,
                        help='partition folder (created when absent)')
    parser.add_argument('--epochs', type=int, default=20)
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--fanouts', type=int, nargs='+', default=[10, 5])
    parser.add_argument('--hidden', type=int, default=64)
    parser.add_argument('--lr', type=float, default=0.01)
    parser.add_argument('--weight-decay', type=float, default=5e-4)
    parser.add_argument('--seed', type=int, default=0)
    return parser.parse_args()


def ensure_partition(args, world_size: int) -> str:
    """Partitions the dataset on rank 0 unless already done; all ranks
    return the partition folder after a barrier."""
    parts = args.parts or osp.join(args.root, 'parts',
                                   f'{args.dataset}-{world_size}')
    if comm.get_rank() == 0 and not osp.exists(osp.join(parts, 'META.json')):
        data = pyg_sar.datasets.load(args.dataset, args.root,
                                     seed=args.seed)
        pyg_sar.partition_graph(data, world_size, parts, seed=args.seed)
        print(f'partitioned {args.dataset} into {world_size} parts: {parts}',
              flush=True)
    comm.barrier()
    return parts


def train_epoch(model: torch.nn.Module, loader: DistNeighborLoader,
                optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """One pass over the loader's batches, one optimizer step each; returns
    the summed loss, correct predictions and seeds of all ranks."""
    model.train()
    totals = torch.zeros(3, dtype=torch.float64)  # loss, correct, seeds
    for batch in loader:
        optimizer.zero_grad()
        out = model(batch.x, batch.edge_index)[:batch.batch_size]
        target = batch.y[:batch.batch_size]
        loss_sum = F.cross_entropy(out, target, reduction='sum')
        # local_sum / global_count: the summed gradients equal those of
        # the mean loss over the whole global batch.
        (loss_sum / max(comm.global_count(batch.batch_size), 1)).backward()
        pyg_sar.all_reduce_grads(model)
        optimizer.step()
        totals += torch.tensor([float(loss_sum.detach()),
                                float((out.argmax(-1) == target).sum()),
                                batch.batch_size], dtype=torch.float64)
    return comm.all_reduce(totals, 'sum')


def full_graph_accuracy(model: torch.nn.Module, part,
                        graph: pyg_sar.DistGraph) -> dict:
    """Accuracy of every mask over the whole graph, one full-batch pass of
    the model that trained on batches (no copy, no conversion)."""
    pred = pyg_sar.train.inference(model, part.x, graph).argmax(-1)
    correct = pred == part.y
    names = ('train_mask', 'val_mask', 'test_mask')
    counts = torch.tensor([[int(correct[getattr(part, m)].sum()),
                            int(getattr(part, m).sum())] for m in names])
    comm.all_reduce(counts, 'sum')
    return {m.split('_')[0]: float(c) / max(int(n), 1)
            for m, (c, n) in zip(names, counts.tolist())}


def main() -> None:
    args = parse_args()
    rank, world_size = comm.init_distributed()
    parts = ensure_partition(args, world_size)
    part = pyg_sar.load_partition(parts, rank)

    torch.manual_seed(args.seed)
    num_classes = int(comm.all_reduce(part.y.max().view(1), 'max')) + 1
    # Converted once: batches (plain edge_index) and the DistGraph alike.
    model = to_distributed(GraphSAGE(part.x.size(1), args.hidden,
                                     num_classes))
    pyg_sar.sync_params(model)  # identical initial weights everywhere
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr,
                                 weight_decay=args.weight_decay)
    # pad_batches: ranks own different numbers of training nodes, but
    # all_reduce_grads is a collective, so every rank must take the same
    # number of steps (num_global_batches); extra batches are empty.
    loader = DistNeighborLoader(part, args.fanouts,
                                input_nodes=part.train_mask,
                                batch_size=args.batch_size, shuffle=True,
                                seed=args.seed, pad_batches=True)
    if rank == 0:
        print(f'{world_size} rank(s), {loader.num_global_batches} steps per '
              f'epoch, fanouts {args.fanouts}', flush=True)

    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        totals = train_epoch(model, loader, optimizer)
        if rank == 0:
            loss, acc = totals[0] / totals[2], totals[1] / totals[2]
            print(f'epoch {epoch:3d}  loss {loss:.4f}  sampled train acc '
                  f'{acc:.4f}  ({time.perf_counter() - start:.2f}s)',
                  flush=True)

    accuracy = full_graph_accuracy(model, part, pyg_sar.DistGraph(part))
    if rank == 0:
        print(f"full-graph inference: train {accuracy['train']:.4f}  "
              f"val {accuracy['val']:.4f}  test {accuracy['test']:.4f}",
              flush=True)


if __name__ == '__main__':
    main()
