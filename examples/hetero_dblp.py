"""Full-batch heterogeneous training on DBLP over workers: R-GCN or a
``to_hetero`` GraphSAGE, next to the same model on one process.

    torchrun --nproc-per-node 2 examples/hetero_dblp.py --root data --model rgcn --compare
    torchrun --nproc-per-node 2 examples/hetero_dblp.py --root data --model sage --compare

``--root`` is a writable folder: DBLP in ``ROOT/DBLP`` (downloaded when
absent), its partitions in ``ROOT/parts`` (``DBLP-N`` for ``sage``,
``DBLP-homogeneous-N`` for ``rgcn``). Rank 0 partitions the graph on first
use; every worker then trains on its own part and classifies authors (4
classes):

* ``sage``: a stock two-layer GraphSAGE made heterogeneous by
  ``torch_geometric.nn.to_hetero`` (one SAGEConv per relation, summed), then
  ``pyg_sar.nn.to_distributed``; conferences get a constant feature, as in
  PyG's DBLP example. The model runs as ``model(x_dict, graph)`` on the
  worker's :class:`~pyg_sar.graph.hetero_graph.HeteroDistGraph`.
* ``rgcn``: two stock ``RGCNConv`` layers on ``HeteroData.to_homogeneous()``
  with learned node embeddings (featureless, as in R-GCN's entity
  classification), converted the same way.

The loss of every worker is its local sum over the global number of training
authors, and gradients are summed over workers, so each step is the
single-process step. ``--compare`` then trains the stock model on one process
(rank 0) from the same initial weights and prints both runs side by side.
No dropout: the single-process run could not draw the same masks.
"""
import pyg_sar  # first: its OpenMP policy must be set before torch loads

import argparse
import copy
import os.path as osp
import time

import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn

from pyg_sar import comm
from side_by_side import print_side_by_side

LABELLED = 'author'


class SAGE(torch.nn.Module):
    def __init__(self, hidden: int, out: int) -> None:
        super().__init__()
        self.conv1 = pyg_nn.SAGEConv((-1, -1), hidden)
        self.conv2 = pyg_nn.SAGEConv((-1, -1), out)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


class RGCN(torch.nn.Module):
    def __init__(self, num_nodes: int, hidden: int, out: int,
                 num_relations: int) -> None:
        super().__init__()
        self.conv1 = pyg_nn.RGCNConv(num_nodes, hidden, num_relations)
        self.conv2 = pyg_nn.RGCNConv(hidden, out, num_relations)

    def forward(self, edge_index, edge_type):
        h = self.conv1(None, edge_index, edge_type).relu()
        return self.conv2(h, edge_index, edge_type)


def load(root: str, model: str):
    """DBLP as the model needs it: heterogeneous with a constant conference
    feature (``sage``), or homogeneous with author labels (``rgcn``)."""
    data = pyg_sar.datasets.load('DBLP', root)
    if model == 'sage':
        data['conference'].x = torch.ones(data['conference'].num_nodes, 1)
        return data
    homo = data.to_homogeneous(node_attrs=[], edge_attrs=[])
    author = homo.node_type == data.node_types.index(LABELLED)
    homo.y = torch.full((homo.num_nodes, ), -1, dtype=torch.long)
    homo.y[author] = data[LABELLED].y
    for split in ('train_mask', 'val_mask', 'test_mask'):
        mask = torch.zeros(homo.num_nodes, dtype=torch.bool)
        mask[author] = data[LABELLED][split]
        homo[split] = mask
    return homo


class Task:
    """The model's inputs, logits and split masks on one graph (a part or
    the whole), so that one training loop serves both runs."""

    def __init__(self, kind: str, data, graph) -> None:
        self.kind, self.data, self.graph = kind, data, graph
        store = data[LABELLED] if kind == 'sage' else data
        self.y = store.y
        self.masks = {s: getattr(store, f'{s}_mask')
                      for s in ('train', 'val', 'test')}

    def logits(self, model):
        if self.kind == 'sage':
            return model(self.data.x_dict, self.graph)[LABELLED]
        return model(self.graph, self.data.edge_type)


def make_model(args, data):
    torch.manual_seed(args.seed)
    if args.model == 'rgcn':
        return RGCN(int(data.num_nodes_total), args.hidden, 4,
                    int(data.num_relations))
    model = pyg_nn.to_hetero(SAGE(args.hidden, 4), data.metadata(),
                             aggr='sum')
    # Lazy layers take their sizes from one pass without edges.
    empty = {e: torch.zeros(2, 0, dtype=torch.long) for e in data.edge_types}
    with torch.no_grad():
        model(data.x_dict, empty)
    return model


def fit(task: Task, model, args, count=lambda n: n, reduce=lambda m: None,
        total=lambda t: t):
    """Adam on the mean training loss; ``count``/``reduce``/``total`` make
    it a distributed step (global counts, summed gradients and sums)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr,
                                 weight_decay=5e-4)
    train = task.masks['train']
    num_train = count(int(train.sum()))
    history = []
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        model.train()
        optimizer.zero_grad()
        out = task.logits(model)
        loss = F.cross_entropy(out[train], task.y[train],
                               reduction='sum') / num_train
        loss.backward()
        reduce(model)
        optimizer.step()
        loss = float(total(loss.detach().clone()))
        accs = accuracy(task, model, count, total)
        history.append((loss, *accs, time.perf_counter() - start))
    return history


@torch.no_grad()
def accuracy(task: Task, model, count, total):
    model.eval()
    pred = task.logits(model).argmax(dim=-1)
    accs = []
    for split in ('val', 'test'):
        mask = task.masks[split]
        correct = (pred[mask] == task.y[mask]).sum().to(torch.float)
        accs.append(float(total(correct)) / count(int(mask.sum())))
    return accs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--root', default='data',
                        help='writable data folder: DBLP in ROOT/DBLP, its '
                        'partitions in ROOT/parts')
    parser.add_argument('--model', choices=('rgcn', 'sage'), default='rgcn')
    parser.add_argument('--parts', default=None)
    parser.add_argument('--mode', default='sar',
                        choices=('sar', 'sa', 'one_shot'))
    parser.add_argument('--epochs', type=int, default=20)
    parser.add_argument('--hidden', type=int, default=32)
    parser.add_argument('--lr', type=float, default=0.01)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--compare', action='store_true')
    args = parser.parse_args()

    rank, world_size = pyg_sar.init_distributed()
    graph_name = 'DBLP' if args.model == 'sage' else 'DBLP-homogeneous'
    parts = args.parts or osp.join(args.root, 'parts',
                                   f'{graph_name}-{world_size}')
    full = None
    if rank == 0:
        full = load(args.root, args.model)
        if not osp.exists(osp.join(parts, 'META.json')):
            pyg_sar.partition_graph(full, world_size, parts, progress=False)
    comm.barrier()
    part = pyg_sar.load_partition(parts, rank)
    graph = pyg_sar.DistGraph(part, mode=args.mode)
    local = Task(args.model, part, graph)
    # Every rank builds the model's shapes (from its part), then takes
    # rank 0's weights; rank 0 keeps a stock copy for --compare.
    if args.model == 'rgcn':
        part.num_nodes_total = part.num_nodes
        # DBLP's six edge types (the part may lack some of them).
        part.num_relations = 6
    model = make_model(args, part)
    pyg_sar.sync_params(model)
    stock = copy.deepcopy(model)
    model = pyg_sar.nn.to_distributed(model)

    history = fit(local, model, args, count=pyg_sar.global_count,
                  reduce=pyg_sar.all_reduce_grads,
                  total=lambda t: comm.all_reduce(t))
    if rank != 0:
        return
    print(f'DBLP, {args.model}, {world_size} workers, mode {args.mode}: '
          f'{graph}', flush=True)
    single = None
    if args.compare:
        full_graph = (full.edge_index_dict if args.model == 'sage' else
                      full.edge_index)
        single = fit(Task(args.model, full, full_graph), stock, args)
    print_side_by_side(history, single, world_size)


if __name__ == '__main__':
    main()
