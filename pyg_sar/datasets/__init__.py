"""Datasets: where the graphs come from, before partitioning. A scalable
synthetic homogeneous graph (:mod:`~pyg_sar.datasets.synthetic`), an
ogbn-mag-shaped heterogeneous one (:mod:`~pyg_sar.datasets.synthetic_hetero`)
and the real graphs PyG's own dataset classes load
(:mod:`~pyg_sar.datasets.catalog`), all behind :func:`load`. Real graphs are
downloaded by PyG on connected machines; offline, point ``root`` at a folder
that holds their raw files in PyG's layout. For graphs too large to build in
memory, :func:`~pyg_sar.datasets.synthetic_ondisk.write_synthetic_dcsbm`
writes the synthetic model straight to a graph directory (its only import of
``pyg_sar``: the ``.npy`` writer of :mod:`pyg_sar.partition.input.ondisk`).
:func:`~pyg_sar.datasets.partitioned.distribute` turns any of them (or a PyG
dataset) into this worker's part, partitioned once.
"""
from pyg_sar.datasets.catalog import available, load, random_planetoid_split
from pyg_sar.datasets.partitioned import distribute
from pyg_sar.datasets.synthetic import SYNTHETIC_DEFAULTS, synthetic_graph
from pyg_sar.datasets.synthetic_hetero import synthetic_hetero_graph

__all__ = ['load', 'available', 'synthetic_graph', 'synthetic_hetero_graph',
           'random_planetoid_split', 'SYNTHETIC_DEFAULTS', 'distribute']
