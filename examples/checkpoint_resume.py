"""Checkpoints: save every few epochs, resume from the newest after a stop.

    torchrun --nproc-per-node 2 examples/checkpoint_resume.py --root data \
        --checkpoint-dir ckpt --epochs 10

Run the same command again after a crash, a kill or ``--stop-after K`` and
it resumes from the newest valid checkpoint; with ``torchrun
--max-restarts 3`` the restart is automatic. A resumed run ends with the
weights, optimizer state and random numbers (dropout masks) of a run that
never stopped. ``ckpt`` must be visible to every worker.
"""
import pyg_sar  # first: its OpenMP policy must be set before torch loads

import os.path as osp

import torch
from torch_geometric.nn import GraphSAGE

from cora_workers import argument_parser, load_shard
from pyg_sar import comm
from pyg_sar.train import distributed_loss


def main() -> None:
    parser = argument_parser(__doc__.split('\n')[0], hidden=64, lr=0.01)
    parser.add_argument('--checkpoint-dir', required=True)
    parser.add_argument('--checkpoint-every', type=int, default=5)
    parser.add_argument('--stop-after', type=int, default=None,
                        help='exit after this epoch (to try resuming)')
    args = parser.parse_args()
    shard = load_shard(args)
    torch.manual_seed(args.seed)
    model = pyg_sar.nn.to_distributed(GraphSAGE(
        shard.x.size(1), args.hidden, num_layers=2,
        out_channels=shard.num_classes, dropout=0.5))
    pyg_sar.sync_params(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr,
                                 weight_decay=args.weight_decay)

    # Collective: every rank loads the same checkpoint, or none exists yet.
    # The fingerprint refuses checkpoints of another partition set.
    fingerprint = shard.part.fingerprint
    state = pyg_sar.checkpoint.resume(args.checkpoint_dir, model, optimizer,
                                      fingerprint=fingerprint)
    first = 1 if state is None else state['epoch'] + 1
    if state is not None and shard.rank == 0:
        print(f"resuming from epoch {state['epoch']} ({state['path']})",
              flush=True)

    loss = float('nan') if state is None else state['extra']['loss']
    last = min(args.epochs, args.stop_after or args.epochs)
    for epoch in range(first, last + 1):
        model.train()
        optimizer.zero_grad()
        loss = distributed_loss(model(shard.x, shard.graph), shard.y,
                                shard.masks['train'], shard.num_train)
        loss.backward()
        pyg_sar.all_reduce_grads(model)
        optimizer.step()
        loss = float(comm.all_reduce(loss.detach().clone()))
        if shard.rank == 0:
            print(f'epoch {epoch:3d}  loss {loss:.6f}', flush=True)
        if epoch % args.checkpoint_every == 0 or epoch == args.epochs:
            # Collective; atomic: a crash mid-write keeps the previous one.
            pyg_sar.checkpoint.save(args.checkpoint_dir, epoch, model,
                                    optimizer, fingerprint=fingerprint,
                                    extra={'loss': loss})

    if last == args.epochs and shard.rank == 0:
        path = osp.join(args.checkpoint_dir, 'model.pt')  # a stock state_dict
        pyg_sar.checkpoint.save_weights(model, path)
        print(f'final loss {loss:.6f}; weights in {path}')
    comm.shutdown()  # leave the process group cleanly


if __name__ == '__main__':
    main()
