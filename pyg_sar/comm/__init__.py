"""All inter-worker communication of pyg_sar lives in this module.

Every ``torch.distributed`` call of the package goes through here, so that
bytes and messages can be counted in one place (:func:`comm_stats`), every wait
has a timeout, and a dead or hung peer becomes a :class:`PeerError` naming the
rank instead of an endless wait.

With a world size of 1 (or no process group at all) every function is a cheap
local no-op, so the same model code runs on one machine.

Layout (everything is importable from ``pyg_sar.comm`` itself):

- :mod:`~pyg_sar.comm.state`: :class:`CommConfig`, :func:`configure`,
  :func:`config` and the counters of :func:`comm_stats`.
- :mod:`~pyg_sar.comm.errors`: :class:`PeerError`,
  :class:`SettingsMismatchError` and the timed wait.
- :mod:`~pyg_sar.comm.launcher`: what torchrun reports when a worker
  fails (the failing rank first).
- :mod:`~pyg_sar.comm.process_group`: :func:`init_distributed`,
  :func:`get_rank`, :func:`get_world_size`, :func:`find_free_port`; the
  groups are destroyed at interpreter exit when :func:`shutdown` was not
  called.
- :mod:`~pyg_sar.comm.agreement`: :func:`agree`, the check that every rank
  shares the settings that shape messages, before any is posted.
- :mod:`~pyg_sar.comm.sequence`: :func:`finish_before_next_operation`, what
  every operation does first so that the ranks' operations stay paired.
- :mod:`~pyg_sar.comm.collectives`: :func:`barrier`, :func:`all_reduce`,
  :func:`broadcast_`, :func:`all_gather_object`, :func:`all_to_all_v`,
  :func:`ask_owners`,
  :func:`global_sum`, :func:`global_count`.
- :mod:`~pyg_sar.comm.p2p`: :func:`post_exchange`, :class:`PendingExchange`.
- :mod:`~pyg_sar.comm.buffers`: :func:`reusing_buffers`, the reuse of a
  propagation's exchange buffers.
- :mod:`~pyg_sar.comm.channels`: :func:`ensure_channels`,
  :func:`on_channel`, the process groups that keep concurrent exchanges
  apart (no tags), the loaders' traffic included.
- :mod:`~pyg_sar.comm.model`: :func:`sync_params`, :func:`all_reduce_grads`,
  :func:`ddp_sum_hook`.
- :mod:`~pyg_sar.comm.shard_exchange`: :class:`ProcessGroupExchange`, the
  collectives of the K writers of
  :func:`~pyg_sar.partition.partition_graph_parallel`.
- :mod:`~pyg_sar.comm.dcp`: ``torch.distributed.checkpoint``'s save and
  load, with the reader that the checkpoints' trust rules
  (:mod:`pyg_sar.train.checkpoint_io`) plug into.
"""
from pyg_sar.comm import (channels, collectives, errors, launcher, p2p,
                          process_group, state)
from pyg_sar.comm.agreement import agree
from pyg_sar.comm.buffers import reusing_buffers
from pyg_sar.comm.channels import ensure_channels, on_channel
from pyg_sar.comm.collectives import (all_gather_object, all_reduce,
                                      all_to_all_v, ask_owners, barrier,
                                      broadcast_,
                                      global_count, global_sum, shutdown)
from pyg_sar.comm.errors import (PeerError, SettingsMismatchError,
                                 report_failure)
from pyg_sar.comm.model import all_reduce_grads, ddp_sum_hook, sync_params
from pyg_sar.comm.p2p import PendingExchange, post_exchange
from pyg_sar.comm.process_group import (find_free_port, get_rank,
                                        get_world_size, init_distributed)
from pyg_sar.comm.sequence import finish_before_next_operation
from pyg_sar.comm.shard_exchange import ProcessGroupExchange
from pyg_sar.comm.state import (CommConfig, comm_stats, config, configure,
                                reset_comm_stats)

__all__ = [
    'CommConfig', 'PeerError', 'init_distributed', 'get_rank',
    'get_world_size', 'configure', 'config', 'comm_stats',
    'reset_comm_stats', 'all_reduce', 'all_gather_object', 'broadcast_',
    'all_to_all_v', 'ask_owners', 'post_exchange', 'PendingExchange', 'sync_params',
    'all_reduce_grads', 'global_count', 'barrier', 'shutdown',
    'find_free_port',
    'ddp_sum_hook', 'global_sum', 'ensure_channels', 'report_failure',
    'reusing_buffers', 'agree', 'on_channel', 'SettingsMismatchError',
    'finish_before_next_operation', 'ProcessGroupExchange',
]

# Internals reached as ``pyg_sar.comm._name`` (tests use ``_peer_error``).
# The same objects as in the submodules: ``_CONFIG`` and ``_STATS`` are only
# ever changed in place.
_CONFIG = state._CONFIG
_STATS = state._STATS
_rebuild_peer_error = errors._rebuild_peer_error
_wait = errors._wait
_transport_summary = errors._transport_summary
_peer_error = errors._peer_error
_restart_store = process_group._restart_store
_active = process_group._active
_comm_device = process_group._comm_device
_CHANNEL_GROUPS = channels._GROUPS
_GlobalSum = collectives._GlobalSum
_all_to_all_counts = collectives._all_to_all_counts
_split = p2p._split
