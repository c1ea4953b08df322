"""pyg_sar: distributed full-batch GNN training (SAR) for PyTorch Geometric.

The package is laid out as the pipeline a run goes through, one folder per
stage; a stage imports only earlier ones (``tests/test_layout.py`` checks):

0. :mod:`pyg_sar.utils`: the version, optional kernels, allocator policy.
1. :mod:`pyg_sar.partition`: partition a graph on one machine, read a part.
2. :mod:`pyg_sar.comm`: every ``torch.distributed`` call, with timeouts.
3. :mod:`pyg_sar.graph`: :class:`DistGraph`, the exchange plan and its views.
4. :mod:`pyg_sar.nn`: layers on the SAR engine,
   :func:`~pyg_sar.nn.to_distributed`.
5. :mod:`pyg_sar.loader`: distributed neighbor sampling.
6. :mod:`pyg_sar.train`: the training loop, checkpoints, run logs.
7. :mod:`pyg_sar.datasets`: the synthetic graphs and PyG's real ones.
8. :mod:`pyg_sar.cli`: the ``pyg-sar`` command.

Every public name below is imported on first use, so ``import pyg_sar`` (and
``pyg-sar --help``) stays cheap.
"""
import importlib
from typing import Any

from pyg_sar.utils.openmp import prefer_passive_wait
from pyg_sar.utils.version import __version__

# Before torch loads: OpenMP threads sleep instead of spinning between
# parallel regions (pyg_sar.utils.openmp says why).
prefer_passive_wait()

# name -> the module that defines it (a module itself where the name is the
# module's last component).
_LAZY_ATTRIBUTES = {
    'partition_graph': 'pyg_sar.partition',
    'load_partition': 'pyg_sar.partition',
    'Partition': 'pyg_sar.partition',
    'HeteroPartition': 'pyg_sar.partition',
    'init_distributed': 'pyg_sar.comm',
    'sync_params': 'pyg_sar.comm',
    'all_reduce_grads': 'pyg_sar.comm',
    'comm_stats': 'pyg_sar.comm',
    'reset_comm_stats': 'pyg_sar.comm',
    'global_count': 'pyg_sar.comm',
    'global_mean': 'pyg_sar.comm',
    'global_totals': 'pyg_sar.comm',
    'distribute': 'pyg_sar.datasets',
    'configure': 'pyg_sar.comm',
    'PeerError': 'pyg_sar.comm',
    'DistGraph': 'pyg_sar.graph',
    'HeteroDistGraph': 'pyg_sar.graph',
    'comm': 'pyg_sar.comm',
    'graph': 'pyg_sar.graph',
    'nn': 'pyg_sar.nn',
    'loader': 'pyg_sar.loader',
    'train': 'pyg_sar.train',
    'datasets': 'pyg_sar.datasets',
    'cli': 'pyg_sar.cli',
    'partition': 'pyg_sar.partition',
    'utils': 'pyg_sar.utils',
    # Public modules that live inside a stage.
    'link': 'pyg_sar.graph.link',
    'checkpoint': 'pyg_sar.train.checkpoint',
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY_ATTRIBUTES.get(name)
    if module_name is None:
        raise AttributeError(f"module 'pyg_sar' has no attribute '{name}'")
    module = importlib.import_module(module_name)
    if module_name.rsplit('.', 1)[-1] != name:
        module = getattr(module, name)
    globals()[name] = module
    return module


def __dir__():
    return sorted([*globals(), *_LAZY_ATTRIBUTES])


__all__ = [name for name in _LAZY_ATTRIBUTES
           if name not in ('utils', 'graph', 'partition')] + ['__version__']
