"""Full-batch GAT (8 heads) on Cora with pyg_sar, on one or more workers.

    torchrun --nproc-per-node 2 examples/full_batch_gat.py --root data
    python examples/full_batch_gat.py --root data              # one worker

Rank 0 downloads Cora into ``ROOT/Cora`` (unless present) and partitions it
into ``ROOT/parts/Cora-N`` (``--parts``; one part per worker) if that
directory is missing; the other ranks wait at a barrier. Every worker then trains on its own part with
``pyg_sar.nn.GATConv``: the attention softmax over each node's in-edges runs
online across the blocks of edges from every worker (a running max and sum
per node and head), so no ``[E, heads]`` attention matrix is kept; with
``--chunk-size`` the edges are also processed in chunks.
"""
import pyg_sar  # noqa: F401  (first: its OpenMP policy must precede torch)

import torch
import torch.nn.functional as F

from cora_workers import argument_parser, load_shard, train
from pyg_sar.nn import GATConv


class GAT(torch.nn.Module):
    """The GAT of Velickovic et al. for Cora: 8 heads of 8 hidden units
    (concatenated, ELU), one output head, dropout 0.6 on features and
    attention coefficients."""
    def __init__(self, in_channels, hidden_channels, out_channels, heads=8,
                 dropout=0.6):
        super().__init__()
        self.conv1 = GATConv(in_channels, hidden_channels, heads=heads,
                             dropout=dropout)
        self.conv2 = GATConv(hidden_channels * heads, out_channels, heads=1,
                             concat=False, dropout=dropout)
        self.dropout = dropout

    def forward(self, x, graph):
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = F.elu(self.conv1(x, graph))
        x = F.dropout(x, p=self.dropout, training=self.training)
        return self.conv2(x, graph)


def main() -> None:
    parser = argument_parser(__doc__.split('\n')[0], hidden=8, lr=0.005)
    parser.add_argument('--heads', type=int, default=8)
    parser.add_argument('--chunk-size', type=int, default=None,
                        help='edges per aggregation chunk (bounds memory)')
    args = parser.parse_args()
    shard = load_shard(args, chunk_size=args.chunk_size)
    torch.manual_seed(args.seed)
    model = GAT(shard.x.shape[1], args.hidden, shard.num_classes, args.heads)
    train(model, shard, args)


if __name__ == '__main__':
    main()
