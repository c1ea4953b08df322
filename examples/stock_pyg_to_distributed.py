"""From a stock PyG model to distributed training and back.

    torchrun --nproc-per-node 2 examples/stock_pyg_to_distributed.py --root data
    python examples/stock_pyg_to_distributed.py --root data    # one worker

1. ``Net`` is an ordinary PyG model written with ``torch_geometric.nn``
   convolutions; it knows nothing about pyg_sar.
2. ``pyg_sar.nn.to_distributed`` swaps its convolutions, weights included,
   for pyg_sar's twins; the same ``forward(x, edge_index)`` now takes a
   ``pyg_sar.DistGraph`` in place of ``edge_index`` and trains on one
   partition per worker.
3. The trained ``state_dict`` (same keys) is loaded back into a fresh stock
   ``Net`` on rank 0, which evaluates single-process on the whole graph: its
   predictions are those of the distributed model, node for node.
"""
import pyg_sar  # first: its OpenMP policy must be set before torch loads

import torch
import torch.nn.functional as F
from torch_geometric.nn import GCNConv, SAGEConv

from cora_workers import argument_parser, load_shard, train
from pyg_sar import comm
from pyg_sar.nn import to_distributed


class Net(torch.nn.Module):
    """A user's stock PyG model (GCN or SAGE)."""
    def __init__(self, in_channels, hidden_channels, out_channels,
                 conv='gcn', dropout=0.5):
        super().__init__()
        Conv = GCNConv if conv == 'gcn' else SAGEConv
        self.conv1 = Conv(in_channels, hidden_channels)
        self.conv2 = Conv(hidden_channels, out_channels)
        self.dropout = dropout

    def forward(self, x, edge_index):
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = self.conv1(x, edge_index).relu()
        x = F.dropout(x, p=self.dropout, training=self.training)
        return self.conv2(x, edge_index)


def main() -> None:
    parser = argument_parser(__doc__.split('\n')[0], hidden=64, lr=0.01)
    parser.add_argument('--conv', choices=('gcn', 'sage'), default='gcn')
    args = parser.parse_args()
    shard = load_shard(args)
    rank, world_size, num_classes = (shard.rank, shard.world_size,
                                     shard.num_classes)
    x, graph, part = shard.x, shard.graph, shard.part

    # 1-2. The stock model, converted in place.
    torch.manual_seed(args.seed)
    model = to_distributed(Net(x.shape[1], args.hidden, num_classes,
                               args.conv))
    if rank == 0:
        print(f'converted model: {model}', flush=True)
    train(model, shard, args, log_every=10)

    # Distributed predictions, gathered to rank 0 in input node order.
    model.eval()
    with torch.no_grad():
        logits = model(x, graph)
    gathered = comm.all_gather_object((part.orig_ids, logits))

    if rank == 0:
        # 3. Back into the stock model, evaluated on the full graph.
        data = pyg_sar.datasets.load('Cora', args.root)
        dist_logits = torch.empty(data.num_nodes, num_classes)
        for orig_ids, part_logits in gathered:
            dist_logits[orig_ids] = part_logits
        stock = Net(data.num_features, args.hidden, num_classes, args.conv)
        stock.load_state_dict(model.state_dict())
        stock.eval()
        with torch.no_grad():
            stock_logits = stock(data.x, data.edge_index)
        pred, dist_pred = stock_logits.argmax(-1), dist_logits.argmax(-1)
        test = data.test_mask
        acc = float((pred[test] == data.y[test]).float().mean())
        dist_acc = float((dist_pred[test] == data.y[test]).float().mean())
        same = int((pred == dist_pred).sum())
        diff = float((stock_logits - dist_logits).abs().max())
        print(f'stock PyG model, single process, full graph: test accuracy '
              f'{acc:.4f}')
        print(f'distributed model ({world_size} workers): test accuracy '
              f'{dist_acc:.4f}')
        print(f'identical predictions: {same}/{data.num_nodes} nodes; max '
              f'|logit difference| {diff:.2e}')
        if same != data.num_nodes:
            raise SystemExit('predictions differ')
    comm.barrier()


if __name__ == '__main__':
    main()
