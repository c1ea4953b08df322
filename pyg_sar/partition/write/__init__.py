"""Writing a partition directory. The homogeneous writer
(:mod:`~pyg_sar.partition.write.homogeneous`) relabels nodes and edges so
that each part owns a contiguous id range and streams PyG's
``torch_geometric.distributed`` on-disk layout a unit at a time
(:mod:`~pyg_sar.partition.write.shards`,
:mod:`~pyg_sar.partition.write.stream_save`), as one writer or as K
cooperating ones that exchange edges and rows through the collectives they
are given; the heterogeneous writer
(:mod:`~pyg_sar.partition.write.heterogeneous`) does the same per node and
edge type. Both build the output in a temporary folder, record the content
hash of every file in the manifest and rename the folder into place once it
is complete (:mod:`~pyg_sar.partition.write.out_dir`,
:mod:`~pyg_sar.partition.write.common`).
"""
