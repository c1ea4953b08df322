"""Full-batch GraphSAGE on Cora with pyg_sar, on one or more workers.

    torchrun --nproc-per-node 2 examples/full_batch_sage_cora.py --root data
    python examples/full_batch_sage_cora.py --root data        # one worker

Rank 0 downloads Cora into ``ROOT/Cora`` (unless present) and partitions it
into ``ROOT/parts/Cora-N`` (``--parts``; one part per worker) if that
directory is missing; the other ranks wait at a barrier. Every worker then trains on its own part: the
2-layer SAGE model is written with ``pyg_sar.nn.SAGEConv``, whose
``forward(x, graph)`` exchanges halo features with the other workers.
"""
import pyg_sar  # noqa: F401  (first: its OpenMP policy must precede torch)

import torch
import torch.nn.functional as F

from cora_workers import argument_parser, load_shard, train
from pyg_sar.nn import SAGEConv


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


def main() -> None:
    parser = argument_parser(__doc__.split('\n')[0], hidden=64, lr=0.01)
    args = parser.parse_args()
    shard = load_shard(args)
    torch.manual_seed(args.seed)
    model = SAGE(shard.x.shape[1], args.hidden, shard.num_classes)
    train(model, shard, args)


if __name__ == '__main__':
    main()
