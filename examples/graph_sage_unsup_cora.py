"""PyG's ``examples/graph_sage_unsup.py``, ported to pyg_sar.

PyG's script with its loader line swapped: rank 0 partitions Cora once
(:func:`pyg_sar.distribute`), each worker samples its own edges (and as
many negatives) with :class:`~pyg_sar.loader.DistLinkNeighborLoader`, the
loss is the mean over the global batch (:func:`pyg_sar.global_mean`,
gradients summed by :func:`pyg_sar.all_reduce_grads`), and the evaluation
embeds every node over the whole graph (:func:`pyg_sar.train.inference`)
and gathers the rows the classifier needs in dataset-id order
(:func:`pyg_sar.train.gather_nodes`), so that every worker fits the
logistic regression one process fits.

    torchrun --nproc-per-node 2 --local-ranks-filter 0 \\
        examples/graph_sage_unsup_cora.py

Cora is read from (or downloaded to) ``../data/Cora`` next to this folder,
as PyG's example does; its partitions are kept there too.
"""
import pyg_sar  # first: its OpenMP policy must be set before torch loads
import os.path as osp
import time

import torch
import torch.nn.functional as F
from sklearn.linear_model import LogisticRegression

import torch_geometric.transforms as T
from torch_geometric.datasets import Planetoid
from pyg_sar.loader import DistLinkNeighborLoader as LinkNeighborLoader
from torch_geometric.nn import GraphSAGE

dataset = 'Cora'
path = osp.join(osp.dirname(osp.realpath(__file__)), '..', 'data', dataset)
# Only rank 0 loads the whole graph and partitions it (once); every worker
# gets its own part:
data = pyg_sar.distribute(
    lambda: Planetoid(path, dataset, transform=T.NormalizeFeatures())[0], path)

train_loader = LinkNeighborLoader(
    data,
    batch_size=256,
    shuffle=True,
    neg_sampling_ratio=1.0,
    num_neighbors=[10, 10],
)
device = torch.device('cpu')

model = GraphSAGE(
    data.num_node_features,
    hidden_channels=64,
    num_layers=2,
).to(device)
model = pyg_sar.sync_params(pyg_sar.nn.to_distributed(model))

optimizer = torch.optim.Adam(model.parameters(), lr=0.01)


def train():
    model.train()

    total_loss = 0
    for batch in train_loader:
        batch = batch.to(device)
        optimizer.zero_grad()
        h = model(batch.x, batch.edge_index)
        h_src = h[batch.edge_label_index[0]]
        h_dst = h[batch.edge_label_index[1]]
        pred = (h_src * h_dst).sum(dim=-1)
        loss = F.binary_cross_entropy_with_logits(pred, batch.edge_label)
        loss = pyg_sar.global_mean(loss, pred.numel())
        loss.backward()
        pyg_sar.all_reduce_grads(model)
        optimizer.step()
        total_loss += float(loss) * pred.size(0)

    total_loss = pyg_sar.global_totals(total_loss)
    return total_loss / data.num_nodes


@torch.no_grad()
def test():
    model.eval()
    out = pyg_sar.train.inference(model, data.x, data)  # the whole graph
    # The whole graph's rows, by dataset id, in every worker:
    out, y, train_mask, val_mask, test_mask = pyg_sar.train.gather_nodes(
        data, out, data.y, data.train_mask, data.val_mask, data.test_mask)

    clf = LogisticRegression()
    clf.fit(out[train_mask], y[train_mask])

    val_acc = clf.score(out[val_mask], y[val_mask])
    test_acc = clf.score(out[test_mask], y[test_mask])

    return val_acc, test_acc


times = []
for epoch in range(1, 51):
    start = time.time()
    loss = train()
    val_acc, test_acc = test()
    print(f'Epoch: {epoch:03d}, Loss: {loss:.4f}, '
          f'Val: {val_acc:.4f}, Test: {test_acc:.4f}')
    times.append(time.time() - start)
print(f"Median time per epoch: {torch.tensor(times).median():.4f}s")
