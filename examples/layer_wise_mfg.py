"""Layer-wise message-flow graphs: aggregate only what the loss reads.

    torchrun --nproc-per-node 2 examples/layer_wise_mfg.py --root data
    python examples/layer_wise_mfg.py --root data              # one worker

A 2-layer model's loss on Cora reads 140 training nodes. Its last
propagation is needed only there, the first only there and at their
in-neighbors. ``graph.layer_wise(seeds, hops)`` finds these destination
sets across workers once; inside ``with mfg:`` the unchanged model
aggregates only them. The rows the loss reads, and every gradient, equal the
full computation (checked below before training); the other rows of ``out``
are not computed and must not be read. Evaluation runs on the full graph.
"""
import pyg_sar  # first: its OpenMP policy must be set before torch loads

import torch
from torch_geometric.nn import GraphSAGE

from cora_workers import argument_parser, load_shard
from pyg_sar import comm
from pyg_sar.train import distributed_loss, evaluate


def main() -> None:
    args = argument_parser(__doc__.split('\n')[0], hidden=64,
                           lr=0.01).parse_args()
    shard = load_shard(args)
    x, y, graph, train_mask = shard.x, shard.y, shard.graph, \
        shard.masks['train']
    torch.manual_seed(args.seed)
    model = pyg_sar.nn.to_distributed(GraphSAGE(
        x.size(1), args.hidden, num_layers=2, out_channels=shard.num_classes,
        dropout=0.5))
    pyg_sar.sync_params(model)

    # Collective, once per seed set: one destination set per propagation.
    mfg = graph.layer_wise(train_mask, hops=2)
    if shard.rank == 0:
        print(f'rank 0 aggregates into {mfg.num_destinations()} of its '
              f'{graph.num_nodes} nodes (per propagation)', flush=True)

    model.eval()  # the loss is the same with and without the MFG
    with torch.no_grad():
        full = model(x, graph)
        with mfg:
            restricted = model(x, graph)
    diff = comm.all_reduce((full - restricted)[train_mask].abs().max()
                           .view(1), 'max')
    if shard.rank == 0:
        print(f'max |difference| at the training nodes: {float(diff):.1e}')

    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr,
                                 weight_decay=args.weight_decay)
    for epoch in range(1, args.epochs + 1):
        model.train()
        optimizer.zero_grad()
        with mfg:
            out = model(x, graph)
        loss = distributed_loss(out, y, train_mask, shard.num_train)
        loss.backward()
        pyg_sar.all_reduce_grads(model)
        optimizer.step()
        loss = float(comm.all_reduce(loss.detach().clone()))
        if epoch % 10 == 0 or epoch in (1, args.epochs):
            acc = evaluate(model, x, graph, y, shard.masks)  # full graph
            if shard.rank == 0:
                print(f"epoch {epoch:3d}  loss {loss:.4f}  val "
                      f"{acc['val_acc']:.4f}  test {acc['test_acc']:.4f}",
                      flush=True)
    comm.shutdown()  # leave the process group cleanly


if __name__ == '__main__':
    main()
