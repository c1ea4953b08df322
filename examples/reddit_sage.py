"""PyG's ``examples/reddit.py`` ported to pyg_sar, on Coauthor CS.

The same GraphSAGE, loader arguments, training and test functions as PyG's
script; the changed lines launch and partition, build the loader on this
worker's part, take the mean loss over the global batch and sum gradients
across workers, and replace the layer-wise ``model.inference`` over a
subgraph loader by :func:`pyg_sar.train.inference` over the
:class:`~pyg_sar.DistGraph`. Coauthor CS has no split: it gets a seeded
random one (20 nodes per class for training, 30 for validation, the rest
for testing), the same on every worker.

    torchrun --nproc-per-node 2 --local-ranks-filter 0 \
        examples/reddit_sage.py --root data

``--root`` is a writable folder holding ``ROOT/CS`` (downloaded when
absent); rank 0 partitions it into ``ROOT/parts/CS-<N>`` once.
"""
import pyg_sar  # first: its OpenMP policy must be set before torch loads
import argparse
import os.path as osp

import torch
import torch.nn.functional as F
from tqdm import tqdm
from pyg_sar.comm import global_count
from pyg_sar.loader import DistNeighborLoader
from torch_geometric.nn import SAGEConv

rank, world_size = pyg_sar.init_distributed()
device = torch.device('cpu')
parser = argparse.ArgumentParser()
parser.add_argument('--root', default='data')
parser.add_argument('--dataset', default='CS')
args = parser.parse_args()
path = osp.join(args.root, 'parts', f'{args.dataset}-{world_size}')
if rank == 0 and not osp.exists(osp.join(path, 'META.json')):
    pyg_sar.partition_graph(pyg_sar.datasets.load(args.dataset, args.root),
                            world_size, path)
pyg_sar.comm.barrier()
data = pyg_sar.load_partition(path, rank)
kwargs = {'batch_size': 1024, 'num_workers': 6, 'persistent_workers': True}
train_loader = DistNeighborLoader(data, input_nodes=data.train_mask,
                                  num_neighbors=[25, 10], shuffle=True,
                                  **kwargs)
graph = pyg_sar.DistGraph(data)


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


model = SAGE(data.x.size(1), 256, data.num_classes)
model = pyg_sar.nn.to_distributed(model).to(device)
pyg_sar.sync_params(model)
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
        loss = F.cross_entropy(y_hat, y)
        (loss * batch.batch_size / global_count(batch.batch_size)).backward()
        pyg_sar.all_reduce_grads(model)
        optimizer.step()

        total_loss += float(loss) * batch.batch_size
        total_correct += int((y_hat.argmax(dim=-1) == y).sum())
        total_examples += batch.batch_size
        pbar.update(batch.batch_size)
    pbar.close()
    total_loss, total_correct, total_examples = pyg_sar.comm.all_reduce(
        torch.tensor([total_loss, total_correct, total_examples]).double(),
        'sum').tolist()

    return total_loss / total_examples, total_correct / total_examples


@torch.no_grad()
def test():
    model.eval()
    y_hat = pyg_sar.train.inference(model, data.x, graph).argmax(dim=-1)
    y = data.y.to(y_hat.device)

    accs = []
    for mask in [data.train_mask, data.val_mask, data.test_mask]:
        accs.append(global_count(y_hat[mask] == y[mask]) /
                    global_count(mask))
    return accs


for epoch in range(1, 11):
    loss, acc = train(epoch)
    print(f'Epoch {epoch:02d}, Loss: {loss:.4f}, Approx. Train: {acc:.4f}')
    train_acc, val_acc, test_acc = test()
    print(f'Epoch: {epoch:02d}, Train: {train_acc:.4f}, Val: {val_acc:.4f}, '
          f'Test: {test_acc:.4f}')
