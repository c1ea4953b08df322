"""pyg_sar: distributed full-batch GNN training (SAR) for PyTorch Geometric."""
import importlib
from typing import Any

from pyg_sar import datasets
from pyg_sar.partition import (HeteroPartition, Partition, load_partition,
                               partition_graph)

__version__ = '0.1.0'

# The distributed runtime is imported lazily: it pulls in torch.distributed and
# is not needed to partition a graph or to inspect a partition on disk.
_LAZY_ATTRIBUTES = {
    'init_distributed': 'pyg_sar.comm',
    'sync_params': 'pyg_sar.comm',
    'all_reduce_grads': 'pyg_sar.comm',
    'comm_stats': 'pyg_sar.comm',
    'reset_comm_stats': 'pyg_sar.comm',
    'global_count': 'pyg_sar.comm',
    'configure': 'pyg_sar.comm',
    'PeerError': 'pyg_sar.comm',
    'DistGraph': 'pyg_sar.graph',
    'nn': 'pyg_sar.nn',
    'loader': 'pyg_sar.loader',
    'link': 'pyg_sar.link',
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY_ATTRIBUTES.get(name)
    if module_name is None:
        raise AttributeError(f"module 'pyg_sar' has no attribute '{name}'")
    module = importlib.import_module(module_name)
    return module if module_name == f'pyg_sar.{name}' else getattr(module,
                                                                    name)


__all__ = [
    'partition_graph',
    'load_partition',
    'Partition',
    'HeteroPartition',
    'datasets',
    *_LAZY_ATTRIBUTES,
    '__version__',
]
