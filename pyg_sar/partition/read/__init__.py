"""Reading one part back on a worker: :func:`~pyg_sar.partition.load_partition`
returns a :class:`~pyg_sar.partition.Partition`
(:mod:`~pyg_sar.partition.read.homogeneous`) or a
:class:`~pyg_sar.partition.HeteroPartition`
(:mod:`~pyg_sar.partition.read.heterogeneous`). The manifest is checked
first (:mod:`~pyg_sar.partition.read.manifest`: its format and version, and
for a summary every field it reads), then every file is read through
:class:`~pyg_sar.partition.read.part_files.PartFiles`: inside the partition
directory, with ``torch.load(weights_only=True)``, its bytes checked against
the content hash the manifest records. Depends on no other subpackage of the
partitioner, only on the layout and the hashes it shares with the writer.
"""
