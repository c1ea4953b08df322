"""Sampled mini-batch training of a heterogeneous GraphSAGE on DBLP, N ranks.

A stock PyG GraphSAGE, made heterogeneous with
:func:`torch_geometric.nn.to_hetero`, trains on neighborhoods of the
training authors drawn by :class:`pyg_sar.loader.DistNeighborLoader` from a
heterogeneous partition (one fanout list per edge type, or one for all);
gradients are summed with :func:`pyg_sar.all_reduce_grads`. The test
accuracy is computed on batches taking every neighbor (``-1`` fanouts), so
every test author's prediction is that of the whole 2-hop neighborhood.

    torchrun --nproc-per-node 2 examples/sampled_hetero_dblp.py --root data

``--root`` is a writable folder: DBLP in ``ROOT/DBLP`` (downloaded when
absent). Rank 0 partitions it into ``--parts`` (default
``ROOT/parts/DBLP-<N>``) when that folder holds no partition yet; the other
ranks wait at a barrier. Conferences have no
features in DBLP: they get a constant one. Without torchrun it runs as one
process.
"""
import pyg_sar  # first: its OpenMP policy must be set before torch loads

import argparse
import os.path as osp
import time

import torch
import torch.nn.functional as F
from torch_geometric.nn import SAGEConv, to_hetero

from pyg_sar import comm
from pyg_sar.loader import DistNeighborLoader

LABELLED = 'author'


class GraphSAGE(torch.nn.Module):
    """Two-layer GraphSAGE with lazy input sizes; plain PyG, made
    heterogeneous by ``to_hetero``."""

    def __init__(self, hidden_channels: int, out_channels: int,
                 dropout: float = 0.5) -> None:
        super().__init__()
        self.conv1 = SAGEConv((-1, -1), hidden_channels)
        self.conv2 = SAGEConv((-1, -1), out_channels)
        # A module, not F.dropout(training=self.training): to_hetero traces
        # forward once, and a traced self.training stays what it was then
        # (True), so model.eval() would not switch the dropout off.
        self.drop = torch.nn.Dropout(dropout)

    def forward(self, x, edge_index):
        x = F.relu(self.conv1(x, edge_index))
        x = self.drop(x)
        return self.conv2(x, edge_index)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--root', default='data',
                        help='writable data folder: DBLP in ROOT/DBLP, its '
                        'partitions in ROOT/parts')
    parser.add_argument('--parts', default=None,
                        help='partition folder (created when absent)')
    parser.add_argument('--epochs', type=int, default=10)
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--fanouts', type=int, nargs='+', default=[10, 5])
    parser.add_argument('--hidden', type=int, default=64)
    parser.add_argument('--lr', type=float, default=0.005)
    parser.add_argument('--weight-decay', type=float, default=1e-3)
    parser.add_argument('--seed', type=int, default=0)
    return parser.parse_args()


def ensure_partition(args, world_size: int) -> str:
    """Partitions DBLP on rank 0 unless already done; all ranks return the
    partition folder after a barrier."""
    parts = args.parts or osp.join(args.root, 'parts', f'DBLP-{world_size}')
    if comm.get_rank() == 0 and not osp.exists(osp.join(parts, 'META.json')):
        data = pyg_sar.datasets.load('DBLP', args.root)
        for node_type in data.node_types:  # conferences: no features
            if 'x' not in data[node_type]:
                data[node_type].x = torch.ones(data[node_type].num_nodes, 1)
        pyg_sar.partition_graph(data, world_size, parts, seed=args.seed)
        print(f'partitioned DBLP into {world_size} parts: {parts}',
              flush=True)
    comm.barrier()
    return parts


def run_epoch(model, loader, optimizer=None) -> torch.Tensor:
    """One pass over ``loader``; trains when given an optimizer. Returns
    the global ``[loss sum, correct, seeds]``."""
    totals = torch.zeros(3, dtype=torch.float64)
    for batch in loader:
        size = batch[LABELLED].batch_size
        with torch.set_grad_enabled(optimizer is not None):
            out = model(batch.x_dict, batch.edge_index_dict)[LABELLED][:size]
            target = batch[LABELLED].y[:size]
            loss_sum = F.cross_entropy(out, target, reduction='sum')
        if optimizer is not None:
            optimizer.zero_grad()
            # local sum / global count: the summed gradients are those of
            # the mean loss over the global batch.
            (loss_sum / max(comm.global_count(size), 1)).backward()
            pyg_sar.all_reduce_grads(model)
            optimizer.step()
        totals += torch.tensor([float(loss_sum.detach()),
                                float((out.argmax(-1) == target).sum()),
                                size], dtype=torch.float64)
    return comm.all_reduce(totals, 'sum')


def main() -> None:
    args = parse_args()
    rank, world_size = comm.init_distributed()
    part = pyg_sar.load_partition(ensure_partition(args, world_size), rank)
    torch.manual_seed(args.seed)
    num_classes = int(comm.all_reduce(
        part[LABELLED].y.max().view(1), 'max')) + 1

    # pad_batches: ranks own different numbers of training authors, but
    # all_reduce_grads is a collective, so every rank must take the same
    # number of steps; the extra batches are empty.
    train_loader = DistNeighborLoader(
        part, args.fanouts, input_nodes=(LABELLED, part[LABELLED].train_mask),
        batch_size=args.batch_size, shuffle=True, seed=args.seed,
        pad_batches=True)
    test_loader = DistNeighborLoader(
        part, [-1] * len(args.fanouts),
        input_nodes=(LABELLED, part[LABELLED].test_mask),
        batch_size=256, seed=args.seed)

    model = to_hetero(GraphSAGE(args.hidden, num_classes), part.metadata(),
                      aggr='sum')
    with torch.no_grad():  # materialize the lazy shapes on one batch
        batch = next(iter(DistNeighborLoader(
            part, [1] * len(args.fanouts), input_nodes=(
                LABELLED, part[LABELLED].orig_ids[:1]), batch_size=1,
            pad_batches=True)))
        model(batch.x_dict, batch.edge_index_dict)
    pyg_sar.sync_params(model)  # identical initial weights everywhere
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr,
                                 weight_decay=args.weight_decay)
    if rank == 0:
        print(f'{world_size} rank(s), {train_loader.num_global_batches} '
              f'steps per epoch, fanouts {args.fanouts} per edge type',
              flush=True)

    for epoch in range(1, args.epochs + 1):
        model.train()
        start = time.perf_counter()
        loss, correct, seeds = run_epoch(model, train_loader,
                                         optimizer).tolist()
        if rank == 0:
            print(f'epoch {epoch:3d}  loss {loss / seeds:.4f}  sampled '
                  f'train acc {correct / seeds:.4f}  '
                  f'({time.perf_counter() - start:.2f}s)', flush=True)

    model.eval()
    _, correct, seeds = run_epoch(model, test_loader).tolist()
    if rank == 0:
        print(f'test accuracy {correct / max(seeds, 1):.4f} '
              f'({int(seeds)} authors, all neighbors)', flush=True)


if __name__ == '__main__':
    main()
