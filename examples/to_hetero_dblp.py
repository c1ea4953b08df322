"""PyG's ``examples/hetero/to_hetero_mag.py``, ported to pyg_sar, on DBLP.

PyG's script with its loader line swapped: rank 0 loads DBLP and partitions
it once (:func:`pyg_sar.distribute`), each worker samples the neighborhoods
of its own authors with :class:`~pyg_sar.loader.DistNeighborLoader`
(PyG's heterogeneous :class:`~torch_geometric.loader.NeighborLoader`
arguments), the lazy parameters are materialized on one batch as in PyG and
then made rank 0's everywhere (:func:`pyg_sar.sync_params`), the loss is the
mean over the global batch (:func:`pyg_sar.global_mean`, gradients summed by
:func:`pyg_sar.all_reduce_grads`) and the printed loss and accuracy are
totals over all workers (:func:`pyg_sar.global_totals`). OGB-MAG's papers
become DBLP's authors (4 classes, the dataset's split); conferences have no
features in DBLP and get a constant one. ``--use_hgt_loader`` samples with
:class:`pyg_sar.loader.DistHGTLoader` (PyG's ``HGTLoader`` arguments).

    torchrun --nproc-per-node 2 --local-ranks-filter 0 \\
        examples/to_hetero_dblp.py

DBLP is read from (or downloaded to) ``../data/DBLP`` next to this folder,
as PyG's examples do; its partitions are kept there too.
"""
import pyg_sar  # first: its OpenMP policy must be set before torch loads
import argparse
import os.path as osp

import torch
import torch.nn.functional as F
from torch.nn import ReLU
from tqdm import tqdm

import torch_geometric.transforms as T
from torch_geometric.datasets import DBLP
from pyg_sar.loader import DistHGTLoader as HGTLoader
from pyg_sar.loader import DistNeighborLoader as NeighborLoader
from torch_geometric.nn import Linear, SAGEConv, Sequential, to_hetero

parser = argparse.ArgumentParser()
parser.add_argument('--use_hgt_loader', action='store_true')
args = parser.parse_args()

device = torch.device('cpu')

path = osp.join(osp.dirname(osp.realpath(__file__)), '../data/DBLP')
transform = T.Compose([T.Constant(node_types='conference'),
                       T.ToUndirected(merge=True)])
# Only rank 0 loads the whole graph and partitions it (once); every worker
# gets its own part:
data = pyg_sar.distribute(lambda: DBLP(path, transform=transform)[0], path)

train_input_nodes = ('author', data['author'].train_mask)
val_input_nodes = ('author', data['author'].val_mask)
kwargs = {'batch_size': 1024, 'num_workers': 6, 'persistent_workers': True}

if not args.use_hgt_loader:
    train_loader = NeighborLoader(data, num_neighbors=[10] * 2, shuffle=True,
                                  input_nodes=train_input_nodes, **kwargs)
    val_loader = NeighborLoader(data, num_neighbors=[10] * 2,
                                input_nodes=val_input_nodes, **kwargs)
else:
    train_loader = HGTLoader(data, num_samples=[1024] * 4, shuffle=True,
                             input_nodes=train_input_nodes, **kwargs)
    val_loader = HGTLoader(data, num_samples=[1024] * 4,
                           input_nodes=val_input_nodes, **kwargs)

model = Sequential('x, edge_index', [
    (SAGEConv((-1, -1), 64), 'x, edge_index -> x'),
    ReLU(inplace=True),
    (SAGEConv((-1, -1), 64), 'x, edge_index -> x'),
    ReLU(inplace=True),
    (Linear(-1, 4), 'x -> x'),  # DBLP: 4 author classes
])
model = to_hetero(model, data.metadata(), aggr='sum').to(device)


@torch.no_grad()
def init_params():
    # Initialize lazy parameters via forwarding a single batch to the model:
    batch = next(iter(train_loader))
    batch = batch.to(device, 'edge_index')
    model(batch.x_dict, batch.edge_index_dict)


def train():
    model.train()

    total_examples = total_loss = 0
    for batch in tqdm(train_loader):
        optimizer.zero_grad()
        batch = batch.to(device, 'edge_index')
        batch_size = batch['author'].batch_size
        out = model(batch.x_dict, batch.edge_index_dict)['author'][:batch_size]
        loss = F.cross_entropy(out, batch['author'].y[:batch_size])
        loss = pyg_sar.global_mean(loss, batch_size)
        loss.backward()
        pyg_sar.all_reduce_grads(model)
        optimizer.step()

        total_examples += batch_size
        total_loss += float(loss) * batch_size

    total_loss, total_examples = pyg_sar.global_totals(total_loss,
                                                       total_examples)
    return total_loss / total_examples


@torch.no_grad()
def test(loader):
    model.eval()

    total_examples = total_correct = 0
    for batch in tqdm(loader):
        batch = batch.to(device, 'edge_index')
        batch_size = batch['author'].batch_size
        out = model(batch.x_dict, batch.edge_index_dict)['author'][:batch_size]
        pred = out.argmax(dim=-1)

        total_examples += batch_size
        total_correct += int((pred == batch['author'].y[:batch_size]).sum())

    total_correct, total_examples = pyg_sar.global_totals(total_correct,
                                                          total_examples)
    return total_correct / total_examples


init_params()  # Initialize parameters.
pyg_sar.sync_params(model)  # rank 0's initial weights on every worker
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

for epoch in range(1, 21):
    loss = train()
    val_acc = test(val_loader)
    print(f'Epoch: {epoch:02d}, Loss: {loss:.4f}, Val: {val_acc:.4f}')
