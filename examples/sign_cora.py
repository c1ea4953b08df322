"""SIGN on Cora over workers: the hop features precomputed once through the
SAR engine, then an MLP trained full-batch, next to one process.

    torchrun --nproc-per-node 2 examples/sign_cora.py --root data --compare
    python examples/sign_cora.py --root data                   # one worker

SIGN (Frasca et al., 2020) moves all message passing before training: it
stores ``A^k X`` for ``k = 1..K`` (``A = D^-1/2 A D^-1/2``) and trains a
model that never looks at the graph again. On one process that is
``torch_geometric.transforms.SIGN(K)``; here every worker computes the rows
of its own nodes with :func:`pyg_sar.nn.sign_features` (K exchanges of halo
rows, nothing else), concatenates ``[X, A X, ..., A^K X]`` and trains a
plain two-layer MLP on them. The loss of a worker is its local sum over the
global number of training nodes and gradients are summed over workers, so
each step is the single-process step.

``--compare``: every worker also applies the stock transform to the whole
graph and checks its own rows of the features against it; rank 0 then
trains the same MLP from the same initial weights on the transform's
features, in one process, and prints both runs side by side. No dropout: the
single-process run could not draw the same masks.

``--root`` is a writable folder: Cora in ``ROOT/Cora`` (downloaded when
absent); rank 0 partitions it on first use into ``ROOT/parts/Cora-<N>``.
"""
import pyg_sar  # first: its OpenMP policy must be set before torch loads

import copy
import time

import torch
from torch_geometric.transforms import SIGN

from cora_workers import argument_parser, load_shard
from pyg_sar import comm
from pyg_sar.nn import sign_features
from pyg_sar.train import distributed_loss
from side_by_side import print_side_by_side


def mlp(in_channels: int, hidden: int, out_channels: int) -> torch.nn.Module:
    """The model SIGN trains: it sees features, never the graph."""
    return torch.nn.Sequential(torch.nn.Linear(in_channels, hidden),
                               torch.nn.ReLU(),
                               torch.nn.Linear(hidden, out_channels))


@torch.no_grad()
def precompute(x, graph, K: int):
    """``[X, A X, ..., A^K X]`` of this worker's nodes, concatenated."""
    return torch.cat([x] + sign_features(x, graph, K), dim=-1)


@torch.no_grad()
def stock_sign(data, K: int):
    """The same features on one process, by PyG's transform."""
    data = SIGN(K)(copy.copy(data))
    return torch.cat([data.x] + [data[f'x{k}'] for k in range(1, K + 1)],
                     dim=-1)


def fit(model, x, y, masks, args, count=lambda n: n, reduce=lambda m: None,
        total=lambda t: t):
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
        loss = distributed_loss(model(x), y, train, num_train)
        loss.backward()
        reduce(model)
        optimizer.step()
        loss = float(total(loss.detach().clone()))
        history.append((loss, *accuracy(model, x, y, masks, count, total),
                        time.perf_counter() - start))
    return history


@torch.no_grad()
def accuracy(model, x, y, masks, count, total):
    model.eval()
    pred = model(x).argmax(dim=-1)
    accs = []
    for split in ('val', 'test'):
        mask = masks[split]
        correct = (pred[mask] == y[mask]).sum().to(torch.float)
        accs.append(float(total(correct)) / count(int(mask.sum())))
    return accs


def main() -> None:
    parser = argument_parser(__doc__.split('\n')[0], hidden=64, lr=0.01)
    parser.set_defaults(epochs=50, weight_decay=5e-3)
    parser.add_argument('--K', type=int, default=3, help='hops')
    parser.add_argument('--compare', action='store_true')
    args = parser.parse_args()
    shard = load_shard(args)

    start = time.perf_counter()
    x = precompute(shard.x, shard.graph, args.K)
    seconds = time.perf_counter() - start
    if shard.rank == 0:
        print(f'SIGN features, K={args.K}: {x.size(1)} per node '
              f'({seconds:.3f}s)', flush=True)
    full = None
    if args.compare:  # rank 0 first: PyG processes the raw files once
        if shard.rank != 0:
            comm.barrier()
        full = pyg_sar.datasets.load('Cora', args.root)
        if shard.rank == 0:
            comm.barrier()
        reference = stock_sign(full, args.K)
        gap = torch.tensor([float((x - reference[shard.part.orig_ids]
                                   ).abs().max())])
        gap = float(comm.all_reduce(gap, 'max'))
        if shard.rank == 0:
            print(f'max |feature difference| to '
                  f'torch_geometric.transforms.SIGN: {gap:.1e}', flush=True)

    torch.manual_seed(args.seed)
    model = mlp(x.size(1), args.hidden, shard.num_classes)
    pyg_sar.sync_params(model)  # rank 0's initial weights everywhere
    stock = copy.deepcopy(model)
    history = fit(model, x, shard.y, shard.masks, args,
                  count=pyg_sar.global_count, reduce=pyg_sar.all_reduce_grads,
                  total=lambda t: comm.all_reduce(t))
    if shard.rank != 0:
        return
    single = None
    if args.compare:
        single = fit(stock, reference, full.y,
                     {s: full[f'{s}_mask'] for s in ('train', 'val', 'test')},
                     args)
    print_side_by_side(history, single, shard.world_size)


if __name__ == '__main__':
    main()
