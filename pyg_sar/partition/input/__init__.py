"""The partitioner's input, checked before anything is written: a PyG
``Data`` or ``HeteroData`` (PyG's idioms such as ``adj_t`` normalized first,
:mod:`~pyg_sar.partition.input.pyg_inputs`) or a graph directory of
memory-mapped ``.npy`` files (:mod:`~pyg_sar.partition.input.ondisk`,
written by its ``save_graph``). The checks
(:mod:`~pyg_sar.partition.input.checks`,
:mod:`~pyg_sar.partition.input.finite`, and
:mod:`~pyg_sar.partition.input.hetero` for the typed graph) refuse a bad
graph in one line naming the attribute; the later steps then read it as a
:class:`~pyg_sar.partition.input.edge_source.GraphSource`, the edges a
chunk at a time (:mod:`~pyg_sar.partition.input.edge_source`,
:mod:`~pyg_sar.partition.input.data_source`), so that none needs the whole
edge list in memory. Depends on no other subpackage of the partitioner.
"""
