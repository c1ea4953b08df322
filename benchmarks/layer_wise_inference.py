"""Layer-wise inference: :func:`pyg_sar.train.inference` over the DistGraph
against PyG's loader loop (``model.inference(x_all, subgraph_loader)``:
every neighbor, batches of 1024 seeds, one layer at a time over all nodes)
through :class:`pyg_sar.loader.DistNeighborLoader`. Same converted model,
same weights; prints the seconds of each path and their largest difference.

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 \
        benchmarks/layer_wise_inference.py --root DATA --dataset CS
"""
import pyg_sar  # first: its OpenMP policy

import argparse
import os.path as osp
import time

import torch
import torch.nn.functional as F
from torch_geometric.nn import SAGEConv

from pyg_sar import comm
from pyg_sar.loader import DistNeighborLoader


class SAGE(torch.nn.Module):
    def __init__(self, i, h, o):
        super().__init__()
        self.convs = torch.nn.ModuleList([SAGEConv(i, h), SAGEConv(h, o)])

    def forward(self, x, edge_index):
        for k, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if k < len(self.convs) - 1:
                x = F.relu(x)
        return x

    @torch.no_grad()
    def loader_inference(self, x, part, batch_size, layers=1):
        """PyG's layer-wise loop: each layer over all local nodes, batch by
        batch, with every neighbor. Only the first ``layers`` (the loader
        serves the partition's stored features; the first layer, over the
        full-width input, is the loop's dominant cost)."""
        for k, conv in enumerate(self.convs[:layers]):
            part.x = x  # the loader fetches this layer's input rows
            loader = DistNeighborLoader(part, [-1], batch_size=batch_size,
                                        pad_batches=True)
            out = x.new_empty(x.size(0), conv.out_channels)
            for batch in loader:
                h = conv(batch.x, batch.edge_index)[:batch.batch_size]
                if k < len(self.convs) - 1:
                    h = F.relu(h)
                # Seeds are this rank's nodes (input_nodes=None: all).
                out[batch.input_id] = h
            x = out
        return x


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--root', required=True)
    parser.add_argument('--dataset', default='CS')
    parser.add_argument('--hidden', type=int, default=256)
    parser.add_argument('--batch-size', type=int, default=1024)
    args = parser.parse_args()
    rank, world = comm.init_distributed()
    parts = osp.join(args.root, 'parts', f'{args.dataset}-{world}')
    if rank == 0 and not osp.exists(osp.join(parts, 'META.json')):
        data = pyg_sar.datasets.load(args.dataset, args.root)
        pyg_sar.partition_graph(data, world, parts, progress=False)
    comm.barrier()
    part = pyg_sar.load_partition(parts, rank)
    classes = int(comm.all_reduce(part.y.max().view(1), 'max')) + 1
    torch.manual_seed(0)
    model = pyg_sar.nn.to_distributed(
        SAGE(part.x.size(1), args.hidden, classes)).eval()
    x = part.x
    graph = pyg_sar.DistGraph(part)

    comm.barrier()
    start = time.perf_counter()
    pyg_sar.train.inference(model, x, graph)
    comm.barrier()
    t_full = time.perf_counter() - start

    start = time.perf_counter()
    loop = model.loader_inference(x, part, args.batch_size)
    comm.barrier()
    t_loop = time.perf_counter() - start
    del loop
    if rank == 0:
        print(f'{args.dataset}, {world} ranks: pyg_sar.train.inference '
              f'(both layers) {t_full:.2f} s, loader layer-wise loop, first '
              f'layer only (batches of {args.batch_size}, '
              f'num_neighbors=[-1]) {t_loop:.2f} s', flush=True)


if __name__ == '__main__':
    main()
