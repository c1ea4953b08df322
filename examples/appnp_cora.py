"""APPNP on Cora over workers: PyG's ``APPNP`` propagation converted with
``to_distributed``, trained full-batch next to one process.

    torchrun --nproc-per-node 2 examples/appnp_cora.py --root data --compare
    python examples/appnp_cora.py --root data                  # one worker

APPNP (Gasteiger et al., 2019) predicts with an MLP, then propagates the
predictions by personalized PageRank: ``K`` steps of
``h = (1 - alpha) A h + alpha z`` with ``A = D^-1/2 (A + I) D^-1/2``. The
model below is PyG's (``examples/citation/appnp.py``), written for an
``edge_index``; :func:`pyg_sar.nn.to_distributed` converts it, and
``torch_geometric.nn.APPNP`` then normalizes with the degrees of remote
sources fetched from their workers and exchanges halo rows at each of its
``K`` steps. The loss of a worker is its local sum over the global number of
training nodes and gradients are summed over workers, so each step is the
single-process step.

``--compare``: rank 0 also trains the stock model from the same initial
weights on the whole graph in one process and prints both runs side by
side. No dropout: the single-process run could not draw the same masks.

``--root`` is a writable folder: Cora in ``ROOT/Cora`` (downloaded when
absent); rank 0 partitions it on first use into ``ROOT/parts/Cora-<N>``.
"""
import pyg_sar  # first: its OpenMP policy must be set before torch loads

import copy
import time

import torch
from torch_geometric.nn import APPNP

from cora_workers import argument_parser, load_shard
from pyg_sar import comm
from pyg_sar.nn import to_distributed
from pyg_sar.train import distributed_loss
from side_by_side import print_side_by_side


class Net(torch.nn.Module):
    """PyG's APPNP model: an MLP, then K steps of personalized PageRank."""

    def __init__(self, in_channels: int, hidden_channels: int,
                 out_channels: int, K: int = 10, alpha: float = 0.1) -> None:
        super().__init__()
        self.lin1 = torch.nn.Linear(in_channels, hidden_channels)
        self.lin2 = torch.nn.Linear(hidden_channels, out_channels)
        self.prop = APPNP(K, alpha)

    def forward(self, x, edge_index):  # edge_index: or a DistGraph
        x = self.lin2(self.lin1(x).relu())
        return self.prop(x, edge_index)


def fit(model, x, edge_index, y, masks, args, count=lambda n: n,
        reduce=lambda m: None, total=lambda t: t):
    """Adam on the mean training loss, full batch; ``count``/``reduce``/
    ``total`` make it a distributed step (global counts, summed gradients
    and sums). Returns ``(loss, val acc, test acc, seconds)`` per epoch."""
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr,
                                 weight_decay=args.weight_decay)
    train = masks['train']
    num_train = count(int(train.sum()))
    history = []
    for _ in range(args.epochs):
        start = time.perf_counter()
        model.train()
        optimizer.zero_grad()
        loss = distributed_loss(model(x, edge_index), y, train, num_train)
        loss.backward()
        reduce(model)
        optimizer.step()
        loss = float(total(loss.detach().clone()))
        history.append((loss, *accuracy(model, x, edge_index, y, masks,
                                        count, total),
                        time.perf_counter() - start))
    return history


@torch.no_grad()
def accuracy(model, x, edge_index, y, masks, count, total):
    model.eval()
    pred = model(x, edge_index).argmax(dim=-1)
    accs = []
    for split in ('val', 'test'):
        mask = masks[split]
        correct = (pred[mask] == y[mask]).sum().to(torch.float)
        accs.append(float(total(correct)) / count(int(mask.sum())))
    return accs


def main() -> None:
    parser = argument_parser(__doc__.split('\n')[0], hidden=64, lr=0.01)
    parser.set_defaults(epochs=50, weight_decay=5e-3)
    parser.add_argument('--K', type=int, default=10,
                        help='propagation steps')
    parser.add_argument('--alpha', type=float, default=0.1,
                        help='teleport probability')
    parser.add_argument('--compare', action='store_true')
    args = parser.parse_args()
    shard = load_shard(args)

    torch.manual_seed(args.seed)
    stock = Net(shard.x.size(1), args.hidden, shard.num_classes, args.K,
                args.alpha)
    pyg_sar.sync_params(stock)  # rank 0's initial weights everywhere
    model = to_distributed(copy.deepcopy(stock))
    history = fit(model, shard.x, shard.graph, shard.y, shard.masks, args,
                  count=pyg_sar.global_count, reduce=pyg_sar.all_reduce_grads,
                  total=lambda t: comm.all_reduce(t))
    if shard.rank != 0:
        return
    single = None
    if args.compare:
        full = pyg_sar.datasets.load('Cora', args.root)
        single = fit(stock, full.x, full.edge_index, full.y,
                     {s: full[f'{s}_mask'] for s in ('train', 'val', 'test')},
                     args)
    print_side_by_side(history, single, shard.world_size)


if __name__ == '__main__':
    main()
