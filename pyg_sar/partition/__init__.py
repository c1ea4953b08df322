"""Stage 1, partitioning: runs once, on one machine, before any worker
starts. :func:`partition_graph` checks the input graph, a PyG ``Data`` or
``HeteroData`` or a graph directory of memory-mapped ``.npy`` files
(:mod:`~pyg_sar.partition.ondisk`, written by its ``save_graph``)
(:mod:`~pyg_sar.partition.common`, :mod:`~pyg_sar.partition.finite`,
:mod:`~pyg_sar.partition.hetero_input`), assigns every node to a part
(:mod:`~pyg_sar.partition.assign`: METIS, KaMinPar or random on a
symmetrized structure of about 8 bytes per edge, training nodes
balanced), relabels nodes and edges so that each part owns a contiguous id
range, and streams PyG's ``torch_geometric.distributed`` on-disk layout
(:mod:`~pyg_sar.partition.layout`, :mod:`~pyg_sar.partition.shards`)
atomically
(:mod:`~pyg_sar.partition.out_dir`), with the content hash of every file
in the manifest (:mod:`~pyg_sar.partition.digest`). :func:`load_partition`
reads one part back on a worker as a :class:`Partition` or
:class:`HeteroPartition`, checking every file it reads against the
manifest (:mod:`~pyg_sar.partition.reader`), its bytes included. Nothing
here communicates.
"""
from pyg_sar.partition.api import partition_graph
from pyg_sar.partition.hetero_load import EdgePart, HeteroPartition, NodePart
from pyg_sar.partition.load import Partition, load_partition

__all__ = ['partition_graph', 'load_partition', 'Partition',
           'HeteroPartition', 'NodePart', 'EdgePart']
