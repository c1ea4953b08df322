"""Stage 6, training: the full-batch loop a user would write, packaged.
:func:`train` (what ``pyg-sar train`` runs) loads a part, builds the
:class:`~pyg_sar.DistGraph`, converts a stock PyG model with
:func:`~pyg_sar.nn.to_distributed` and trains it with the global loss
(:func:`distributed_loss`) and global accuracies (:func:`evaluate`).
:mod:`~pyg_sar.train.checkpoint` saves and resumes sharded checkpoints with
``torch.distributed.checkpoint`` (its replicated tensors stored by
:mod:`~pyg_sar.train.checkpoint_io`, which trusts nothing it reads back),
verifies them against the hashes they record and falls back to the newest
intact one (the on-disk format: :mod:`~pyg_sar.train.checkpoint_format`; the
checks before loading: :mod:`~pyg_sar.train.checkpoint_inspect`);
:mod:`~pyg_sar.train.run_log` writes the per-epoch metrics and curves of a
run; :func:`inference` is PyG's layer-wise inference over the
``DistGraph`` (every layer once over all nodes, no loader) and
:func:`gather_nodes` the whole graph's rows of its output, by dataset id;
:mod:`~pyg_sar.train.files` holds the atomic writes, content hashes and
output-path checks they share.
"""
from pyg_sar.train import checkpoint
from pyg_sar.train.inference import gather_nodes, inference
from pyg_sar.train.loop import (GNN, MODELS, distributed_loss, evaluate,
                                limit_heap_retention, resolve_device, train)
from pyg_sar.train.run_log import RunLog

__all__ = ['train', 'GNN', 'MODELS', 'distributed_loss', 'evaluate',
           'limit_heap_retention', 'resolve_device', 'checkpoint', 'RunLog',
           'inference', 'gather_nodes']
