"""Correct & Smooth on Cora over workers: an MLP trained full-batch, then
PyG's ``CorrectAndSmooth`` converted with ``to_distributed``, next to one
process.

    torchrun --nproc-per-node 2 examples/correct_and_smooth_cora.py \\
        --root data --compare
    python examples/correct_and_smooth_cora.py --root data     # one worker

C&S (Huang et al., 2021) post-processes the soft predictions of a model that
never saw the graph: ``correct`` spreads the errors of the training nodes
over the graph (``L1`` steps of label propagation, scaled) and adds them to
the predictions, ``smooth`` puts the true training labels back and
propagates the result (``L2`` steps). As in PyG's
``examples/correct_and_smooth.py``, the base model is an MLP on the node
features and ``y_soft`` is its softmax at the epoch of best validation
accuracy. The MLP trains with the distributed loss (a worker's local sum
over the global number of training nodes, gradients summed over workers),
so each step is the single-process step; the converted ``CorrectAndSmooth``
propagates over the ``DistGraph`` (halo rows fetched at every step) and, with
autoscale, averages the training error over the training nodes of all
workers. ``y_true`` and ``mask`` are the worker's own training nodes.

PyG's example (ogbn-products) uses 50 + 50 steps, alphas 1.0 and 0.8 and a
fixed scale of 20; for Cora's small training set the defaults here are
fewer steps and autoscale (``--scale S`` for a fixed scale). Both
propagations use ``D^-1/2 A D^-1/2`` (PyG's default for an ``edge_index``).

``--compare``: every worker also trains the stock MLP from the same initial
weights on the whole graph and runs the stock ``CorrectAndSmooth`` on it, in
one process, and checks its own rows of the corrected and smoothed
predictions against it; rank 0 prints both runs side by side. No dropout:
the single-process run could not draw the same masks.

``--root`` is a writable folder: Cora in ``ROOT/Cora`` (downloaded when
absent); rank 0 partitions it on first use into ``ROOT/parts/Cora-<N>``.
"""
import pyg_sar  # first: its OpenMP policy must be set before torch loads

import copy
import time

import torch
from torch_geometric.nn.models import CorrectAndSmooth

from cora_workers import argument_parser, load_shard
from pyg_sar import comm
from pyg_sar.nn import to_distributed
from pyg_sar.train import distributed_loss
from side_by_side import print_epochs


def mlp(in_channels: int, hidden: int, out_channels: int) -> torch.nn.Module:
    """The base model: it sees features, never the graph."""
    return torch.nn.Sequential(torch.nn.Linear(in_channels, hidden),
                               torch.nn.ReLU(),
                               torch.nn.Linear(hidden, out_channels))


def fit(model, x, y, masks, args, count=lambda n: n, reduce=lambda m: None,
        total=lambda t: t):
    """Adam on the mean training loss, full batch; ``count``/``reduce``/
    ``total`` make it a distributed step (global counts, summed gradients
    and sums). Returns ``(loss, val acc, test acc, seconds)`` per epoch and
    the softmax of the predictions at the best validation accuracy."""
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr,
                                 weight_decay=args.weight_decay)
    train = masks['train']
    num_train = count(int(train.sum()))
    history, best_val, y_soft = [], -1.0, None
    for _ in range(args.epochs):
        start = time.perf_counter()
        model.train()
        optimizer.zero_grad()
        loss = distributed_loss(model(x), y, train, num_train)
        loss.backward()
        reduce(model)
        optimizer.step()
        loss = float(total(loss.detach().clone()))
        model.eval()
        with torch.no_grad():
            out = model(x)
        val, test = accuracy(out, y, masks, count, total)
        if val > best_val:  # the same epoch on every worker: global accuracy
            best_val, y_soft = val, out.softmax(dim=-1)
        history.append((loss, val, test, time.perf_counter() - start))
    return history, y_soft


@torch.no_grad()
def accuracy(out, y, masks, count=lambda n: n, total=lambda t: t):
    """Validation and test accuracy of the predictions ``out``, counted over
    the nodes of all workers."""
    pred = out.argmax(dim=-1)
    accs = []
    for split in ('val', 'test'):
        mask = masks[split]
        correct = (pred[mask] == y[mask]).sum().to(torch.float)
        accs.append(float(total(correct)) / count(int(mask.sum())))
    return accs


@torch.no_grad()
def correct_and_smooth(post, y_soft, y, train, edge_index):
    """PyG's two calls: the corrected, then the smoothed predictions."""
    y_train = y[train]  # the labels of the (local) training nodes
    corrected = post.correct(y_soft, y_train, train, edge_index)
    smoothed = post.smooth(corrected, y_train, train, edge_index)
    return corrected, smoothed


def post_processor(args) -> CorrectAndSmooth:
    return CorrectAndSmooth(
        num_correction_layers=args.correction_layers,
        correction_alpha=args.correction_alpha,
        num_smoothing_layers=args.smoothing_layers,
        smoothing_alpha=args.smoothing_alpha,
        autoscale=args.scale is None,
        scale=1.0 if args.scale is None else args.scale)


def main() -> None:
    parser = argument_parser(__doc__.split('\n')[0], hidden=64, lr=0.01)
    parser.set_defaults(epochs=50, weight_decay=5e-3)
    parser.add_argument('--correction-layers', type=int, default=10)
    parser.add_argument('--correction-alpha', type=float, default=1.0)
    parser.add_argument('--smoothing-layers', type=int, default=10)
    parser.add_argument('--smoothing-alpha', type=float, default=0.8)
    parser.add_argument('--scale', type=float, default=None,
                        help='fixed scale of the corrections (default: '
                        'autoscale)')
    parser.add_argument('--compare', action='store_true')
    args = parser.parse_args()
    shard = load_shard(args)
    count, total = pyg_sar.global_count, lambda t: comm.all_reduce(t)

    torch.manual_seed(args.seed)
    model = mlp(shard.x.size(1), args.hidden, shard.num_classes)
    pyg_sar.sync_params(model)  # rank 0's initial weights everywhere
    stock = copy.deepcopy(model)
    history, y_soft = fit(model, shard.x, shard.y, shard.masks, args,
                          count=count, reduce=pyg_sar.all_reduce_grads,
                          total=total)
    start = time.perf_counter()
    post = to_distributed(post_processor(args))
    corrected, smoothed = correct_and_smooth(post, y_soft, shard.y,
                                             shard.masks['train'],
                                             shard.graph)
    seconds = time.perf_counter() - start
    rows = {'base': accuracy(y_soft, shard.y, shard.masks, count, total),
            'correct': accuracy(corrected, shard.y, shard.masks, count,
                                total),
            'smooth': accuracy(smoothed, shard.y, shard.masks, count, total)}

    single = None
    if args.compare:  # rank 0 first: PyG processes the raw files once
        if shard.rank != 0:
            comm.barrier()
        full = pyg_sar.datasets.load('Cora', args.root)
        if shard.rank == 0:
            comm.barrier()
        masks = {s: full[f'{s}_mask'] for s in ('train', 'val', 'test')}
        curve, soft = fit(stock, full.x, full.y, masks, args)
        outs = correct_and_smooth(post_processor(args), soft, full.y,
                                  masks['train'], full.edge_index)
        single = {'curve': curve,
                  'base': accuracy(soft, full.y, masks),
                  'correct': accuracy(outs[0], full.y, masks),
                  'smooth': accuracy(outs[1], full.y, masks)}
        ids = shard.part.orig_ids  # this worker's rows of the whole graph
        gap = torch.tensor([float((mine - outs[i][ids]).abs().max())
                            for i, mine in enumerate((corrected, smoothed))])
        gap = comm.all_reduce(gap, 'max')
    if shard.rank != 0:
        return

    print_epochs(history, single['curve'] if single else None)
    print(f'C&S ({args.correction_layers} + {args.smoothing_layers} steps, '
          f"{'autoscale' if args.scale is None else f'scale {args.scale}'}"
          f'): {seconds:.3f}s on {shard.world_size} workers')
    header = 'predictions   val    test'
    if single:
        header += '   | one process: val    test'
    print(header)
    for name, label in (('base', 'base MLP'), ('correct', 'corrected'),
                        ('smooth', 'smoothed')):
        val, test = rows[name]
        line = f'{label:12s}  {val:.4f} {test:.4f}'
        if single:
            line += f'   |              {single[name][0]:.4f} ' \
                    f'{single[name][1]:.4f}'
        print(line)
    print(f"test accuracy {rows['base'][1]:.4f} -> {rows['smooth'][1]:.4f} "
          f'after C&S ({shard.world_size} workers)')
    if single:
        loss_gap = max(abs(a[0] - b[0])
                       for a, b in zip(history, single['curve']))
        print(f'largest loss difference over {args.epochs} epochs: '
              f'{loss_gap:.2e}; max |difference| of the corrected '
              f'predictions {float(gap[0]):.1e}, of the smoothed '
              f'{float(gap[1]):.1e} (all {shard.part.num_nodes} '
              f'nodes)')


if __name__ == '__main__':
    main()
