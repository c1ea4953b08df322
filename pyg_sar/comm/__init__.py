"""Stage 2, communication: every inter-worker message of pyg_sar.

Every ``torch.distributed`` call of the package goes through here, so that
bytes and messages can be counted in one place (:func:`comm_stats`), every
wait has a timeout, and a dead or hung peer becomes a :class:`PeerError`
naming the rank instead of an endless wait. With a world size of 1 (or no
process group at all) every function is a cheap local no-op, so the same
model code runs on one machine.

The user's API (``__all__``): joining and leaving the process group
(:func:`init_distributed`, :func:`shutdown`), the settings and counters
(:func:`configure`, :func:`comm_stats`), the errors, the collectives a
training script calls (:func:`all_reduce`, :func:`global_count`,
:func:`global_sum`, :func:`global_mean`, :func:`global_totals`,
:func:`all_gather_by_id`, ...), the model helpers (:func:`sync_params`,
:func:`all_reduce_grads`, :func:`ddp_sum_hook`) and the exchange of the
partition writers (:class:`ProcessGroupExchange`).

Layout:

- :mod:`~pyg_sar.comm.state`: :class:`CommConfig`, :func:`configure`,
  :func:`config` and the counters of :func:`comm_stats`.
- :mod:`~pyg_sar.comm.errors`: :class:`PeerError`,
  :class:`SettingsMismatchError`, the timed wait, and what torchrun
  reports when a worker fails (the failing rank first).
- :mod:`~pyg_sar.comm.process_group`: :func:`init_distributed`,
  :func:`get_rank`, :func:`get_world_size`, :func:`find_free_port`; the
  groups are destroyed at interpreter exit when :func:`shutdown` was not
  called.
- :mod:`~pyg_sar.comm.agreement`: the check that every rank shares the
  settings that shape messages, before any is posted.
- :mod:`~pyg_sar.comm.sequence`: what every operation does first so that
  the ranks' operations stay paired.
- :mod:`~pyg_sar.comm.collectives`: :func:`barrier`, :func:`all_reduce`,
  :func:`broadcast_`, :func:`all_gather_object`, :func:`all_gather_by_id`,
  :func:`global_sum`, :func:`global_count`, and the variable-size
  all-to-all.
- :mod:`~pyg_sar.comm.p2p`: grouped point-to-point exchanges.
- :mod:`~pyg_sar.comm.buffers`: the reuse of a propagation's exchange
  buffers.
- :mod:`~pyg_sar.comm.channels`: the process groups that keep concurrent
  exchanges apart (no tags), the loaders' traffic included.
- :mod:`~pyg_sar.comm.model`: :func:`sync_params`,
  :func:`all_reduce_grads`, :func:`ddp_sum_hook`.
- :mod:`~pyg_sar.comm.shard_exchange`: :class:`ProcessGroupExchange`, the
  collectives of the K writers of
  :func:`~pyg_sar.partition.partition_graph_parallel`.
- :mod:`~pyg_sar.comm.dcp`: ``torch.distributed.checkpoint``'s save and
  load, with the reader that the checkpoints' trust rules
  (:mod:`pyg_sar.train.checkpoint_io`) plug into.

The later stages also call the package's own plumbing as
``pyg_sar.comm.<name>`` (``PLUMBING``: the all-to-all, the exchanges, the
channels, ...); it is not the user's API and is documented with the
package's internals.
"""
import importlib
from typing import Any

from pyg_sar.comm.collectives import (all_gather_by_id, all_gather_object,
                                      all_reduce, barrier, broadcast_, global_count,
                                      global_mean, global_sum, global_totals,
                                      shutdown)
from pyg_sar.comm.errors import (PeerError, SettingsMismatchError,
                                 install_failure_hook, report_failure)
from pyg_sar.comm.model import all_reduce_grads, ddp_sum_hook, sync_params
from pyg_sar.comm.process_group import (after_init, find_free_port, get_rank,
                                        get_world_size, init_distributed)
from pyg_sar.comm.shard_exchange import ProcessGroupExchange
from pyg_sar.comm.state import (CommConfig, comm_stats, config, configure,
                                reset_comm_stats)

# Under a launcher, this worker's uncaught error is recorded for torchrun and
# its peers once it has joined a process group (pyg_sar.comm.errors).
after_init(install_failure_hook)

__all__ = [
    'init_distributed', 'get_rank', 'get_world_size', 'find_free_port',
    'shutdown', 'CommConfig', 'configure', 'config', 'comm_stats',
    'reset_comm_stats', 'PeerError', 'SettingsMismatchError',
    'report_failure', 'barrier', 'all_reduce', 'broadcast_',
    'all_gather_object', 'all_gather_by_id', 'global_sum', 'global_mean', 'global_count',
    'global_totals', 'sync_params',
    'all_reduce_grads', 'ddp_sum_hook', 'ProcessGroupExchange',
]

#: The package's own plumbing, reached as ``pyg_sar.comm.<name>`` by the
#: later stages (name -> its module, a module itself where the name is the
#: module's last component; imported on first use): the all-to-all and the
#: exchanges of the engine, the graph and the loaders, their channels and
#: buffers, the agreement on settings and the work a rank left unfinished.
PLUMBING = {
    'all_to_all_v': 'pyg_sar.comm.collectives',
    'ask_owners': 'pyg_sar.comm.collectives',
    'post_exchange': 'pyg_sar.comm.p2p',
    'PendingExchange': 'pyg_sar.comm.p2p',
    'ensure_channels': 'pyg_sar.comm.channels',
    'on_channel': 'pyg_sar.comm.channels',
    'reusing_buffers': 'pyg_sar.comm.buffers',
    'buffers': 'pyg_sar.comm.buffers',
    'agree': 'pyg_sar.comm.agreement',
    'finish_before_next_operation': 'pyg_sar.comm.sequence',
    'in_background': 'pyg_sar.comm.sequence',
}


def __getattr__(name: str) -> Any:
    module_name = PLUMBING.get(name)
    if module_name is None:
        raise AttributeError(f"module 'pyg_sar.comm' has no attribute "
                             f"'{name}'")
    module = importlib.import_module(module_name)
    value = module if module_name.rsplit('.', 1)[-1] == name else \
        getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *PLUMBING])
