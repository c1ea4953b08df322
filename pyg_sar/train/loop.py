"""Full-batch distributed training: the ``pyg-sar train`` job.

Run under ``torchrun``, one worker per partition::

    torchrun --nproc-per-node 2 -m pyg_sar.cli train --parts parts --model sage

The model is an ordinary PyG model (stock ``torch_geometric.nn`` convs)
converted with :func:`pyg_sar.nn.to_distributed`; the loss is the local sum
over training nodes divided by the global number of training nodes, so that
the all-reduced gradient equals the single-process gradient.
"""
from __future__ import annotations

import math
import os
import os.path as osp
import random
import sys
import time
from datetime import timedelta
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from pyg_sar import comm
from pyg_sar.graph import DistGraph
from pyg_sar.graph.dist_graph import explicit_device
from pyg_sar.nn import to_distributed
from pyg_sar.nn.functional import relu_dropout
from pyg_sar.partition import load_partition
from pyg_sar.partition.layout import MANIFEST_FILE
from pyg_sar.train.files import check_output_dir, check_output_file
from pyg_sar.train.run_log import RunLog
from pyg_sar.utils.malloc import configure_allocator

# Also in pyg_sar/cli/train.py, whose parser imports no torch (a test
# checks that the two are equal).
MODELS = ('sage', 'gcn', 'gat', 'gatv2', 'transformer', 'gen')


class GNN(torch.nn.Module):
    """A plain PyG model: ``layers`` convolutions with ReLU and dropout in
    between. ``forward(x, edge_index)`` works with an ``edge_index`` on one
    machine and, after :func:`pyg_sar.nn.to_distributed`, with a
    :class:`pyg_sar.DistGraph`."""

    def __init__(self, model: str, in_channels: int, hidden_channels: int,
                 out_channels: int, num_layers: int = 2, heads: int = 4,
                 dropout: float = 0.5) -> None:
        super().__init__()
        from torch_geometric.nn import (GATConv, GATv2Conv, GCNConv, GENConv,
                                        SAGEConv, TransformerConv)
        if model not in MODELS:
            raise ValueError(f"model must be one of {MODELS} (got {model!r})")
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1 (got {num_layers})")
        self.dropout = dropout
        self.convs = torch.nn.ModuleList()
        dims = [in_channels] + [hidden_channels] * (num_layers - 1)
        for layer, dim_in in enumerate(dims):
            last = layer == num_layers - 1
            dim_out = out_channels if last else hidden_channels
            if model == 'sage':
                conv = SAGEConv(dim_in, dim_out)
                # Distributed, aggregate lin_l(x) where that is narrower
                # (pyg_sar.nn.SAGEConv.transform_first); ignored by PyG.
                conv.transform_first = True
            elif model == 'gcn':
                conv = GCNConv(dim_in, dim_out)
            elif model == 'gen':
                # Learnable softmax aggregation: runs over whole
                # neighborhoods when distributed.
                conv = GENConv(dim_in, dim_out, aggr='softmax', learn_t=True)
            elif model == 'transformer':
                conv = TransformerConv(dim_in, dim_out if last else
                                       dim_out // heads, heads=heads,
                                       concat=not last)
            else:
                # Hidden layers concatenate heads; the output layer averages.
                layer_cls = GATv2Conv if model == 'gatv2' else GATConv
                conv = layer_cls(dim_in, dim_out if last else
                                 dim_out // heads, heads=heads,
                                 concat=not last)
            self.convs.append(conv)

    def forward(self, x: Tensor, edge_index) -> Tensor:
        for layer, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if layer < len(self.convs) - 1:
                # F.dropout(F.relu(x)) that keeps one tensor, not three.
                x = relu_dropout(x, p=self.dropout, training=self.training)
        return x


def distributed_loss(logits: Tensor, y: Tensor, mask: Tensor,
                     global_count: int) -> Tensor:
    """Cross-entropy summed over this worker's ``mask`` nodes and divided by
    the number of such nodes on all workers: after
    :func:`pyg_sar.all_reduce_grads` the gradient equals the single-process
    mean-loss gradient (a worker without training nodes contributes zero)."""
    return F.cross_entropy(logits[mask], y[mask],
                           reduction='sum') / max(global_count, 1)


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: Tensor, graph, y: Tensor,
             masks: Dict[str, Tensor]) -> Dict[str, float]:
    """Global accuracy (and loss) per mask, all ranks agreeing."""
    model.eval()
    logits = model(x, graph)
    pred = logits.argmax(dim=-1)
    names = list(masks)
    counts = torch.tensor(
        [float(((pred == y) & masks[n]).sum()) for n in names] +
        [float(masks[n].sum()) for n in names] +
        [float(F.cross_entropy(logits[masks[names[0]]],
                               y[masks[names[0]]], reduction='sum'))
         if bool(masks[names[0]].any()) else 0.0], dtype=torch.float64)
    comm.all_reduce(counts, 'sum')
    k = len(names)
    result = {f'{n}_acc': float(counts[i] / max(counts[k + i], 1))
              for i, n in enumerate(names)}
    result[f'{names[0]}_loss'] = float(counts[-1] / max(counts[k], 1))
    return result


def limit_heap_retention(threshold_bytes: int = 1 << 20) -> bool:
    """Makes glibc return freed tensor memory to the OS (a fixed mmap
    threshold; see :mod:`pyg_sar.utils.malloc`, which ``DistGraph`` applies on
    its own). Returns False where the C library is not glibc."""
    from pyg_sar.utils.malloc import limit_heap_retention as limit
    return limit(threshold_bytes)


def resolve_device(device: str = 'auto') -> torch.device:
    """``'auto'``: this worker's GPU when CUDA is available (``cuda:r % G``
    for local rank ``r`` and ``G`` GPUs: more ranks than GPUs share them),
    else the CPU; otherwise the named device."""
    if device == 'auto':
        if torch.cuda.is_available():
            return torch.device('cuda', int(os.environ.get('LOCAL_RANK', 0))
                                % torch.cuda.device_count())
        return torch.device('cpu')
    try:
        out = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device {device!r} is not a torch device (expected "
                         f"'auto', 'cpu' or 'cuda[:N]')") from e
    if out.type == 'cuda' and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available here")
    return explicit_device(out)


class _StartupLog:
    """Rank 0 says what it is doing while nothing else shows progress
    (joining, loading, planning), with the seconds since the job began."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and os.environ.get('RANK', '0') == '0'
        self.start = time.perf_counter()

    def __call__(self, what: str) -> None:
        if self.enabled:
            print(f"[{time.perf_counter() - self.start:6.1f}s] {what}...",
                  flush=True)


def _check_paths(parts: str, checkpoint_dir: Optional[str],
                 save_model: Optional[str], log_dir: Optional[str]) -> None:
    """Refuses, before the process group is joined, a partition directory
    that is not one and an output that could not be written (each on the
    ranks that write it: the checkpoint directory on every rank, the rest
    on rank 0), so that a wrong path costs no training."""
    if not osp.isdir(parts):
        raise FileNotFoundError(f"parts '{parts}': no such directory; "
                                f"expected a partition directory written by "
                                f"pyg-sar partition")
    if not osp.isfile(osp.join(parts, MANIFEST_FILE)):
        raise FileNotFoundError(f"parts '{parts}' holds no {MANIFEST_FILE}; "
                                f"expected a partition directory written by "
                                f"pyg-sar partition")
    if checkpoint_dir is not None:
        check_output_dir(checkpoint_dir, 'checkpoint_dir')
    if os.environ.get('RANK', '0') == '0':
        if save_model is not None:
            check_output_file(save_model, 'save_model')
        if log_dir is not None:
            check_output_dir(log_dir, 'log_dir')


def train(parts: str, model: str = 'sage', layers: int = 3,
          hidden: int = 256, heads: int = 4, epochs: int = 10,
          lr: float = 0.01, dropout: float = 0.5, mode: str = 'sar',
          chunk_size: Optional[int] = None, pipeline_depth: int = 1,
          seed: int = 0, timeout_s: float = 300.0,
          progress: bool = True, eval_every: int = 1,
          checkpoint_dir: Optional[str] = None, checkpoint_every: int = 1,
          save_model: Optional[str] = None,
          allow_non_finite_loss: bool = False,
          log_dir: Optional[str] = None,
          device: str = 'auto',
          keep_last: Optional[int] = None) -> List[Dict]:
    """Trains ``model`` full-batch on the partition set ``parts``; one call
    per worker (collective). Returns the per-epoch history (same on every
    rank). Rank 0 prints each epoch's loss and accuracies.

    With ``checkpoint_dir`` it resumes from the newest intact checkpoint
    there (model, optimizer, RNG states and history; see
    :mod:`pyg_sar.train.checkpoint`: a corrupt one is reported and set
    aside) and writes one every ``checkpoint_every`` epochs and after the
    last epoch, so that an interrupted run, restarted with the same options,
    ends bitwise equal to an uninterrupted one; ``keep_last`` keeps only the
    newest ``keep_last`` checkpoints (None: all). ``save_model`` receives
    the trained weights (rank 0, atomically) as the ``state_dict`` of the
    stock :class:`GNN`. A non-finite training loss stops training with a
    ``FloatingPointError`` naming the epoch (on every rank), unless
    ``allow_non_finite_loss``. ``log_dir`` receives
    ``metrics.csv`` (per epoch: loss, accuracies, time, bytes exchanged and
    peak RSS of every rank) and ``curves.png`` (:mod:`pyg_sar.train.run_log`).
    ``device`` is where the model, the features and the graph's index
    tensors live: ``'auto'`` is this worker's GPU (``cuda:LOCAL_RANK``)
    when CUDA is available, else the CPU. The partition directory and
    every output path are checked before the process group is joined."""
    import numpy as np

    from pyg_sar.train import checkpoint
    checkpoint.check_count('checkpoint_every', checkpoint_every, 1)
    if keep_last is not None:
        checkpoint.check_count('keep_last', keep_last, 1)
    if keep_last is not None and checkpoint_dir is None:
        raise ValueError(f"keep_last={keep_last} needs checkpoint_dir")
    _check_paths(parts, checkpoint_dir, save_model, log_dir)
    configure_allocator()  # the library's allocator policy (pyg_sar/utils/malloc.py)
    say = _StartupLog(progress)
    say(f"joining the process group "
        f"({os.environ.get('WORLD_SIZE', '1')} workers)")
    rank, world_size = comm.init_distributed(
        timeout=timedelta(seconds=timeout_s), device=device)
    device = resolve_device(device)
    comm.configure(pipeline_depth=pipeline_depth)
    say(f"loading the parts of {parts!r}, one per rank")
    part = load_partition(parts, rank)
    say(f"building the exchange plan ({part.num_local_nodes:,} nodes, "
        f"{part.num_local_edges:,} in-edges on rank 0; mode {mode}, "
        f"device {device})")
    graph = DistGraph(part, mode=mode, chunk_size=chunk_size, device=device)
    for name in ('x', 'y'):
        if name not in part.node_attrs:
            raise ValueError(
                f"partition {parts!r} has no node attribute {name!r} "
                f"(it has {part.node_attr_names}); pyg-sar train needs "
                f"node features 'x' and labels 'y'")
    x, y = part.x.float().to(device), part.y.long().to(device)
    masks = {name: getattr(part, f'{name}_mask').bool().to(device)
             for name in ('train', 'val', 'test')
             if hasattr(part, f'{name}_mask')}
    if 'train' not in masks:
        raise ValueError(f"partition {parts!r} has no train_mask")
    num_classes = int(comm.all_reduce(
        torch.tensor([int(y.max()) + 1 if y.numel() else 0]), 'max')[0])
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    net = to_distributed(GNN(model, x.shape[1], hidden, num_classes, layers,
                             heads, dropout)).to(device)
    comm.sync_params(net)
    say(f"model {model}: {layers} layers, "
        f"{sum(p.numel() for p in net.parameters()):,} parameters")
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    num_train = comm.global_count(masks['train'])

    history: List[Dict] = []
    start_epoch = 0
    # What the saved state depends on; a resume with other values is refused.
    config = {'model': model, 'layers': layers, 'hidden': hidden,
              'heads': heads, 'lr': lr, 'dropout': dropout, 'seed': seed}
    if checkpoint_dir is not None:
        resumed = checkpoint.resume(checkpoint_dir, net, optimizer,
                                    fingerprint=part.fingerprint,
                                    expect={'config': config})
        if resumed is not None:
            start_epoch = resumed['epoch']
            if start_epoch > epochs:
                raise ValueError(f"checkpoint '{resumed['path']}' is at "
                                 f"epoch {start_epoch}, beyond epochs="
                                 f"{epochs}; train for at least "
                                 f"{start_epoch} epochs or use a fresh "
                                 f"checkpoint directory")
            history = list(resumed['extra'].get('history', []))
            if rank == 0:
                print(f"resuming from epoch {start_epoch} "
                      f"({resumed['path']})", flush=True)
    run_log = None
    if log_dir is not None:
        run_log = RunLog(log_dir, start_epoch)
    # Rank 0 prints one line per epoch; ``progress`` adds the bar under them
    # on a terminal (never in a log file: no carriage returns there).
    show = rank == 0
    bar = None
    if show and progress and sys.stderr.isatty():
        from tqdm import tqdm
        bar = tqdm(total=epochs, initial=min(start_epoch, epochs),
                   desc=f'{model} x{world_size} {mode}', unit='epoch')
    write = bar.write if bar is not None else (
        lambda line: print(line, flush=True))
    if show:
        write(f'{graph}; {num_train:,} training nodes on {world_size} '
              f'workers')
    for epoch in range(start_epoch + 1, epochs + 1):
        start = time.perf_counter()
        net.train()
        optimizer.zero_grad()
        loss = distributed_loss(net(x, graph), y, masks['train'], num_train)
        loss.backward()
        comm.all_reduce_grads(net)
        optimizer.step()
        train_loss = float(comm.all_reduce(loss.detach().clone(), 'sum'))
        if not math.isfinite(train_loss) and not allow_non_finite_loss:
            raise FloatingPointError(
                f"epoch {epoch}: the training loss is {train_loss}; stopping "
                f"(check the features and the learning rate, or pass "
                f"--allow-non-finite-loss to train on)")
        epoch_time = time.perf_counter() - start
        record = {'epoch': epoch, 'loss': train_loss, 'time_s': epoch_time}
        if eval_every and (epoch % eval_every == 0 or epoch == epochs):
            record.update(evaluate(net, x, graph, y, masks))
        history.append(record)
        if run_log is not None:
            run_log.record(record)
        if checkpoint_dir is not None and (epoch % checkpoint_every == 0 or
                                           epoch == epochs):
            checkpoint.save(checkpoint_dir, epoch, net, optimizer,
                            fingerprint=part.fingerprint,
                            extra={'config': config, 'history': history},
                            keep_last=keep_last)
        if show:
            accs = ' '.join(f"{k.split('_')[0]} {v:.4f}"
                            for k, v in record.items() if k.endswith('_acc'))
            write(f'epoch {epoch:3d}  loss {train_loss:.4f}  {accs}  '
                  f'({epoch_time:.2f}s)')
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    if run_log is not None:
        run_log.finish()
    if save_model is not None and rank == 0:
        # The converted model's state_dict keys are the stock GNN's.
        checkpoint.save_weights(net, save_model)
    return history
