"""Stage 1, partitioning: runs once, on one machine, before any worker
starts, in four steps, one subpackage each. :func:`partition_graph`
(:mod:`~pyg_sar.partition.api`) checks the input graph, a PyG ``Data`` or
``HeteroData`` or a graph directory of memory-mapped ``.npy`` files
(:mod:`pyg_sar.partition.input`); assigns every node to a part
(:mod:`pyg_sar.partition.assign`: METIS, KaMinPar or random on the
symmetrized graph, built for KaMinPar out of core, training nodes
balanced; a run on a graph directory resumable from its last completed
phase, :mod:`~pyg_sar.partition.workdir`);
relabels nodes and edges so that each part owns a contiguous id range and
streams PyG's ``torch_geometric.distributed`` on-disk layout atomically,
with the content hash of every file in the manifest
(:mod:`pyg_sar.partition.write`; :func:`partition_graph_parallel` runs it
as K processes). :func:`load_partition` reads one part back on a worker as
a :class:`Partition` or :class:`HeteroPartition`, checking the manifest and
every file it reads against it, its bytes included
(:mod:`pyg_sar.partition.read`). The file names and content hashes that
writer and reader share live in :mod:`~pyg_sar.partition.layout` and
:mod:`~pyg_sar.partition.digest`. Nothing here communicates: the K writers
get their collectives from the caller.
"""
from pyg_sar.partition.api import partition_graph, partition_graph_parallel
from pyg_sar.partition.read.heterogeneous import (EdgePart, HeteroPartition,
                                                  NodePart)
from pyg_sar.partition.read.homogeneous import Partition, load_partition

__all__ = ['partition_graph', 'partition_graph_parallel', 'load_partition',
           'Partition', 'HeteroPartition', 'NodePart', 'EdgePart']
