"""Full-batch link prediction on Cora (PyG's link_pred example) over workers.

    torchrun --nproc-per-node 2 examples/link_prediction_cora.py --root data
    torchrun --nproc-per-node 2 examples/link_prediction_cora.py --root data --compare

Every worker splits Cora's edges with ``RandomLinkSplit`` (same seed, so the
same split); rank 0 partitions the training graph. A GCN encoder runs on the
worker's part; each epoch PyG's negative sampling is replayed over the whole
distributed graph (``pyg_sar.graph.link.negative_sampling``: the same negatives as
on one machine), every worker scores its share of the labelled pairs with a
dot product, fetching the embeddings of endpoints that live elsewhere
(``graph.fetch_nodes``; their gradients go back to the owners).
``--compare`` then trains the stock PyG model on one process (rank 0) from
the same seeds and prints both runs' losses and AUCs side by side.

Both runs encode validation and test pairs with the training graph's edges.
The loss curves start equal to float rounding and drift apart slowly as Adam
amplifies the rounding.

``--root`` is a writable folder: Cora in ``ROOT/Cora`` (downloaded when
absent), the partition of the training graph in ``ROOT/parts/Cora-links-N``.
"""
import pyg_sar  # first: its OpenMP policy must be set before torch loads

import argparse
import os.path as osp
import random
import time

import torch
import torch.nn.functional as F
from scipy.stats import rankdata
from torch_geometric.nn import GCNConv
from torch_geometric.transforms import RandomLinkSplit
from torch_geometric.utils import negative_sampling

from pyg_sar import comm, link


class Net(torch.nn.Module):
    """PyG's link_pred encoder and dot-product decoder."""

    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden_channels)
        self.conv2 = GCNConv(hidden_channels, out_channels)

    def encode(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """ROC AUC (the Mann-Whitney statistic, ties counted half)."""
    ranks = torch.from_numpy(rankdata(scores.numpy()))
    pos = labels.bool()
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) /
                 (n_pos * n_neg))


def split(root: str, seed: int):
    data = pyg_sar.datasets.load('Cora', root)
    torch.manual_seed(seed)
    random.seed(seed)  # its negatives come from Python's random: same split
    return RandomLinkSplit(num_val=0.05, num_test=0.1, is_undirected=True,
                           add_negative_train_samples=False)(data)


def with_negatives(label_index, neg):
    index = torch.cat([label_index, neg], dim=-1)
    label = torch.cat([torch.ones(label_index.size(1)),
                       torch.zeros(neg.size(1))])
    return index, label


def distributed_scores(z, graph, index):
    """Dot products of this worker's share of the pairs ``index``
    (input-graph node ids)."""
    share = link.local_share(index.size(1))
    ends = graph.global_ids(index[:, share])
    rows = graph.fetch_nodes(z, ends.reshape(-1)).view(2, -1, z.size(-1))
    return (rows[0] * rows[1]).sum(dim=-1), share


@torch.no_grad()
def distributed_auc(model, x, graph, split_data) -> float:
    model.eval()
    z = model.encode(x, graph)
    scores, _ = distributed_scores(z, graph, split_data.edge_label_index)
    everyone = comm.all_gather_object(scores)  # shares in rank order
    return auc(torch.cat(everyone), split_data.edge_label)


def train_distributed(args, train_data, val_data, test_data):
    rank, world_size = pyg_sar.init_distributed()
    parts = args.parts or osp.join(args.root, 'parts',
                                   f'Cora-links-{world_size}')
    if rank == 0 and not osp.exists(osp.join(parts, 'META.json')):
        graph_data = train_data.clone()
        del graph_data.edge_label, graph_data.edge_label_index
        pyg_sar.partition_graph(graph_data, world_size, parts,
                                progress=False)
    comm.barrier()
    part = pyg_sar.load_partition(parts, rank)
    graph = pyg_sar.DistGraph(part)
    torch.manual_seed(args.seed)
    model = pyg_sar.nn.to_distributed(Net(part.x.size(1), 128, 64))
    pyg_sar.sync_params(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    random.seed(args.seed)  # negative sampling draws from Python's random
    label_index = train_data.edge_label_index
    history = []
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        model.train()
        optimizer.zero_grad()
        z = model.encode(part.x, graph)
        neg = link.negative_sampling(graph,
                                     num_neg_samples=label_index.size(1))
        index, label = with_negatives(label_index, neg)
        scores, share = distributed_scores(z, graph, index)
        # Local sum / global count: the all-reduced gradient is the
        # single-process gradient of the mean loss.
        loss = F.binary_cross_entropy_with_logits(
            scores, label[share], reduction='sum') / index.size(1)
        loss.backward()
        pyg_sar.all_reduce_grads(model)
        optimizer.step()
        loss = float(comm.all_reduce(loss.detach().clone()))
        val = distributed_auc(model, part.x, graph, val_data)
        test = distributed_auc(model, part.x, graph, test_data)
        history.append((loss, val, test))
        if rank == 0 and (epoch % 10 == 0 or epoch == 1):
            print(f'epoch {epoch:3d}  loss {loss:.4f}  val auc {val:.4f}  '
                  f'test auc {test:.4f}  ({time.perf_counter() - start:.3f}s)',
                  flush=True)
    return history


def train_single(args, train_data, val_data, test_data):
    torch.manual_seed(args.seed)
    model = Net(train_data.num_features, 128, 64)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    random.seed(args.seed)
    label_index = train_data.edge_label_index

    @torch.no_grad()
    def test(data):
        model.eval()
        # The training graph, as the distributed run has it partitioned
        # (PyG's example adds the validation edges when testing).
        z = model.encode(data.x, train_data.edge_index)
        index = data.edge_label_index
        return auc((z[index[0]] * z[index[1]]).sum(-1), data.edge_label)

    history = []
    for _ in range(args.epochs):
        model.train()
        optimizer.zero_grad()
        z = model.encode(train_data.x, train_data.edge_index)
        neg = negative_sampling(train_data.edge_index,
                                num_nodes=train_data.num_nodes,
                                num_neg_samples=label_index.size(1),
                                method='sparse')
        index, label = with_negatives(label_index, neg)
        out = (z[index[0]] * z[index[1]]).sum(dim=-1)
        loss = F.binary_cross_entropy_with_logits(out, label)
        loss.backward()
        optimizer.step()
        history.append((float(loss.detach()), test(val_data),
                        test(test_data)))
    return history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--root', default='data',
                        help='writable data folder: Cora in ROOT/Cora, the '
                        'partitions in ROOT/parts')
    parser.add_argument('--parts', default=None,
                        help='partition directory (default: '
                        'ROOT/parts/Cora-links-<world size>)')
    parser.add_argument('--epochs', type=int, default=100)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--compare', action='store_true',
                        help='also train stock PyG on one process (rank 0)')
    args = parser.parse_args()
    pyg_sar.init_distributed()
    # Every rank splits Cora the same way. Rank 0 goes first, so that PyG
    # processes the raw files once instead of every rank writing them at
    # the same time.
    if comm.get_rank() != 0:
        comm.barrier()
    train_data, val_data, test_data = split(args.root, args.seed)
    if comm.get_rank() == 0:
        comm.barrier()
    ours = train_distributed(args, train_data, val_data, test_data)
    if comm.get_rank() != 0:
        return
    loss, val, test = ours[-1]
    print(f'pyg_sar x{comm.get_world_size()}: final loss {loss:.4f}  '
          f'val auc {val:.4f}  test auc {test:.4f}')
    if args.compare:
        single = train_single(args, train_data, val_data, test_data)
        s_loss, s_val, s_test = single[-1]
        print(f'stock PyG, one process: final loss {s_loss:.4f}  val auc '
              f'{s_val:.4f}  test auc {s_test:.4f}')
        worst = max(abs(a[0] - b[0]) for a, b in zip(ours, single))
        print(f'largest loss difference over {args.epochs} epochs: '
              f'{worst:.2e}')


if __name__ == '__main__':
    main()
