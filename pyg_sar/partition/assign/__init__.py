"""Which part every node goes to
(:func:`~pyg_sar.partition.assign.parts.assign_parts`): METIS, KaMinPar
(run in a child process, :mod:`~pyg_sar.partition.assign.kaminpar`) or a
seeded random split, on the symmetrized graph, built with about 8 bytes per
edge for METIS (:mod:`~pyg_sar.partition.assign.symmetric`) and written out
of core, a node range at a time within a memory budget, to KaMinPar's input
file (:mod:`~pyg_sar.partition.assign.symmetric_file`), then repaired so
that no part is empty, node counts stay capped and training nodes are
balanced (:mod:`~pyg_sar.partition.assign.repair`). The heterogeneous
partitioner runs the same passes on its in-memory structure and balances
every node type as well (:mod:`~pyg_sar.partition.assign.in_memory`).
Reads the graph through the input's edge sources only; writes nothing but
temporary files and, for a resumable run, the phase files of its work
directory (:mod:`~pyg_sar.partition.workdir`).
"""
