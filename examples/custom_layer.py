"""Your own message passing layer, distributed: a PyG ``MessagePassing``
class and its pyg_sar twin, trained on Cora over workers.

    torchrun --nproc-per-node 2 examples/custom_layer.py --root data
    python examples/custom_layer.py --root data                # one worker

``GatedConv`` is written for PyG alone. ``DistGatedConv`` puts
``pyg_sar.nn.DistMessagePassing`` in front of it and changes nothing else:
the same ``forward`` now receives a ``pyg_sar.DistGraph`` instead of an
``edge_index``, ``h_j`` is fetched from the workers that own the source
nodes, ``h_i`` is local, and the mean runs on the SAR engine. After
training, rank 0 loads the weights into the stock ``GatedConv`` model and
checks, on the whole graph in one process, that it predicts what the
distributed model predicted.
"""
import pyg_sar  # first: its OpenMP policy must be set before torch loads

import torch
from torch import Tensor
from torch_geometric.nn import MessagePassing

from cora_workers import argument_parser, load_shard, train
from pyg_sar import comm
from pyg_sar.nn import DistMessagePassing


class GatedConv(MessagePassing):
    """Mean of gated neighbor messages plus a root term (plain PyG)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(aggr='mean')
        self.lin = torch.nn.Linear(in_channels, out_channels)
        self.root = torch.nn.Linear(in_channels, out_channels)
        self.gate = torch.nn.Parameter(torch.ones(out_channels))

    def forward(self, x: Tensor, edge_index) -> Tensor:
        return self.propagate(edge_index, h=self.lin(x)) + self.root(x)

    def message(self, h_i: Tensor, h_j: Tensor) -> Tensor:
        return torch.sigmoid(self.gate * h_i * h_j) * h_j


class DistGatedConv(DistMessagePassing, GatedConv):
    """The same layer over a DistGraph. ``gate`` is read inside
    ``message``: naming it lets the rematerialized backward skip the rest."""
    message_parameters = ('gate', )


class Net(torch.nn.Module):
    def __init__(self, conv, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.conv1 = conv(in_channels, hidden_channels)
        self.conv2 = conv(hidden_channels, out_channels)

    def forward(self, x, edge_index):  # edge_index: or a DistGraph
        x = torch.nn.functional.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, edge_index).relu()
        return self.conv2(x, edge_index)


def main() -> None:
    args = argument_parser(__doc__.split('\n')[0], hidden=32,
                           lr=0.01).parse_args()
    shard = load_shard(args)
    torch.manual_seed(args.seed)
    model = Net(DistGatedConv, shard.x.size(1), args.hidden,
                shard.num_classes)
    train(model, shard, args, log_every=10)

    model.eval()  # distributed logits, gathered on rank 0 in input order
    with torch.no_grad():
        logits = model(shard.x, shard.graph)
    gathered = comm.all_gather_object((shard.part.orig_ids, logits))
    if shard.rank == 0:
        data = pyg_sar.datasets.load('Cora', args.root)
        dist_logits = torch.empty(data.num_nodes, shard.num_classes)
        for orig_ids, part_logits in gathered:
            dist_logits[orig_ids] = part_logits
        stock = Net(GatedConv, data.num_features, args.hidden,
                    shard.num_classes)
        stock.load_state_dict(model.state_dict())  # same keys
        stock.eval()
        with torch.no_grad():
            stock_logits = stock(data.x, data.edge_index)
        same = int((stock_logits.argmax(-1) == dist_logits.argmax(-1)).sum())
        diff = float((stock_logits - dist_logits).abs().max())
        print(f'stock GatedConv on one process: identical predictions '
              f'{same}/{data.num_nodes}, max |logit difference| {diff:.1e}')
    comm.shutdown()  # leave the process group cleanly


if __name__ == '__main__':
    main()
