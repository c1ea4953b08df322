"""Quickstart: a stock PyG GraphSAGE trained full-batch on Cora over workers.

    torchrun --nproc-per-node 2 examples/quickstart.py --root data

``--root`` is a writable folder: Cora is read from ``ROOT/Cora`` (PyG
downloads it there when absent) and partitioned into ``ROOT/parts/Cora-N``.
"""
import pyg_sar  # first: its OpenMP policy must be set before torch loads

import argparse
import os.path as osp

import torch
from torch_geometric.nn import GraphSAGE

from pyg_sar import comm
from pyg_sar.train import distributed_loss, evaluate

parser = argparse.ArgumentParser(description='pyg_sar quickstart')
parser.add_argument('--root', default='data',
                    help='writable data folder: Cora in ROOT/Cora, its '
                    'partitions in ROOT/parts')
parser.add_argument('--epochs', type=int, default=100)
parser.add_argument('--dropout', type=float, default=0.5)
args = parser.parse_args()

# 1. Join the workers that torchrun started (gloo on CPU, NCCL on GPU).
rank, world_size = pyg_sar.init_distributed()

# 2. Partition once, one part per worker: rank 0 writes, the others wait.
parts = osp.join(args.root, 'parts', f'Cora-{world_size}')
if rank == 0 and not osp.exists(osp.join(parts, 'META.json')):
    data = pyg_sar.datasets.load('Cora', args.root)
    pyg_sar.partition_graph(data, num_parts=world_size, out_dir=parts)
comm.barrier()

# 3. This worker's nodes and their in-edges, and the graph over all workers.
part = pyg_sar.load_partition(parts, rank)
graph = pyg_sar.DistGraph(part)

# 4. A stock PyG model, converted in place; rank 0's weights everywhere.
torch.manual_seed(0)
model = GraphSAGE(part.x.size(1), hidden_channels=64, num_layers=2,
                  out_channels=part.num_classes, dropout=args.dropout)
model = pyg_sar.nn.to_distributed(model)
pyg_sar.sync_params(model)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)

# 5. Full-batch training. Each worker's loss is its local sum over the
#    global number of training nodes, so the summed gradients are exactly
#    those of the single-process mean loss.
num_train = pyg_sar.global_count(part.train_mask)
masks = {'train': part.train_mask, 'val': part.val_mask,
         'test': part.test_mask}
for epoch in range(1, args.epochs + 1):
    model.train()
    optimizer.zero_grad()
    out = model(part.x, graph)  # logits of this worker's nodes
    loss = distributed_loss(out, part.y, part.train_mask, num_train)
    loss.backward()
    pyg_sar.all_reduce_grads(model)  # sum of the partial gradients
    optimizer.step()
    # The per-worker losses are partial sums; their sum is the global loss.
    loss = float(comm.all_reduce(loss.detach().clone()))
    if epoch == 1 or epoch % 10 == 0 or epoch == args.epochs:
        acc = evaluate(model, part.x, graph, part.y, masks)  # collective
        if rank == 0:
            print(f"epoch {epoch:3d}  loss {loss:.6g}  train "
                  f"{acc['train_acc']:.4f}  val {acc['val_acc']:.4f}  "
                  f"test {acc['test_acc']:.4f}", flush=True)

if rank == 0:
    print(f"final loss {loss:.6g}  test accuracy {acc['test_acc']:.4f} "
          f"(world size {world_size})")
comm.shutdown()  # leave the process group cleanly
