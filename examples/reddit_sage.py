"""PyG's ``examples/reddit.py``, ported to pyg_sar, on Coauthor CS.

PyG's script with its loader line swapped: rank 0 partitions the graph
once (:func:`pyg_sar.distribute`), each worker samples its own seeds with
:class:`~pyg_sar.loader.DistNeighborLoader`, the loss is the mean over the
global batch (:func:`pyg_sar.global_mean`, gradients summed by
:func:`pyg_sar.all_reduce_grads`) and the evaluation runs every layer once
over the whole graph (:func:`pyg_sar.train.inference`) instead of PyG's
layer-wise loop over a subgraph loader. Coauthor CS has no split: a seeded
random one (20 training nodes per class, 450 validation nodes, the rest for
testing), drawn once by rank 0.

    torchrun --nproc-per-node 2 --local-ranks-filter 0 examples/reddit_sage.py

Coauthor CS is read from (or downloaded to) ``../data/CS`` next to this
folder, as PyG's examples do; its partitions are kept there too.
"""
import pyg_sar  # first: its OpenMP policy must be set before torch loads
import os.path as osp
import time

import torch
import torch.nn.functional as F
from tqdm import tqdm

import torch_geometric.transforms as T
from torch_geometric.datasets import Coauthor
from pyg_sar.loader import DistNeighborLoader as NeighborLoader
from torch_geometric.nn import SAGEConv

device = torch.device('cpu')

path = osp.join(osp.dirname(osp.realpath(__file__)), '..', 'data')

torch.manual_seed(0)  # the same random split in every run
# Only rank 0 loads the whole graph and partitions it (once); every worker
# gets its own part:
split = T.RandomNodeSplit('test_rest', num_train_per_class=20, num_val=450)
data = pyg_sar.distribute(lambda: Coauthor(path, 'CS', transform=split)[0],
                          path)

kwargs = {'batch_size': 1024, 'num_workers': 6, 'persistent_workers': True}
train_loader = NeighborLoader(data, input_nodes=data.train_mask,
                              num_neighbors=[25, 10], shuffle=True, **kwargs)


class SAGE(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.convs = torch.nn.ModuleList()
        self.convs.append(SAGEConv(in_channels, hidden_channels))
        self.convs.append(SAGEConv(hidden_channels, out_channels))

    def forward(self, x, edge_index):
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = x.relu_()
                x = F.dropout(x, p=0.5, training=self.training)
        return x

    @torch.no_grad()
    def inference(self, x_all, subgraph_loader):
        pbar = tqdm(total=len(subgraph_loader.dataset) * len(self.convs))
        pbar.set_description('Evaluating')

        # Compute representations of nodes layer by layer, using *all*
        # available edges. This leads to faster computation in contrast to
        # immediately computing the final representations of each batch:
        for i, conv in enumerate(self.convs):
            xs = []
            for batch in subgraph_loader:
                x = x_all[batch.n_id.to(x_all.device)].to(device)
                x = conv(x, batch.edge_index.to(device))
                if i < len(self.convs) - 1:
                    x = x.relu_()
                xs.append(x[:batch.batch_size].cpu())
                pbar.update(batch.batch_size)
            x_all = torch.cat(xs, dim=0)
        pbar.close()
        return x_all


model = SAGE(data.num_features, 256, data.num_classes).to(device)
model = pyg_sar.sync_params(pyg_sar.nn.to_distributed(model))
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)


def train(epoch):
    model.train()

    pbar = tqdm(total=int(len(train_loader.dataset)))
    pbar.set_description(f'Epoch {epoch:02d}')

    total_loss = total_correct = total_examples = 0
    for batch in train_loader:
        optimizer.zero_grad()
        y = batch.y[:batch.batch_size]
        y_hat = model(batch.x, batch.edge_index.to(device))[:batch.batch_size]
        loss = pyg_sar.global_mean(F.cross_entropy(y_hat, y), len(y))
        loss.backward()
        pyg_sar.all_reduce_grads(model)
        optimizer.step()

        total_loss += float(loss) * batch.batch_size
        total_correct += int((y_hat.argmax(dim=-1) == y).sum())
        total_examples += batch.batch_size
        pbar.update(batch.batch_size)
    pbar.close()
    total_loss, total_correct, total_examples = pyg_sar.global_totals(
        total_loss, total_correct, total_examples)
    return total_loss / total_examples, total_correct / total_examples


@torch.no_grad()
def test():
    model.eval()
    y_hat = pyg_sar.train.inference(model, data.x, data).argmax(dim=-1)
    y = data.y.to(y_hat.device)

    accs = []
    for mask in [data.train_mask, data.val_mask, data.test_mask]:
        accs.append(pyg_sar.global_count(y_hat[mask] == y[mask]) /
                    pyg_sar.global_count(mask))
    return accs


times = []
for epoch in range(1, 11):
    start = time.time()
    loss, acc = train(epoch)
    print(f'Epoch {epoch:02d}, Loss: {loss:.4f}, Approx. Train: {acc:.4f}')
    train_acc, val_acc, test_acc = test()
    print(f'Epoch: {epoch:02d}, Train: {train_acc:.4f}, Val: {val_acc:.4f}, '
          f'Test: {test_acc:.4f}')
    times.append(time.time() - start)
print(f"Median time per epoch: {torch.tensor(times).median():.4f}s")
