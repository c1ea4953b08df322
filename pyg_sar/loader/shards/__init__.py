"""What a loader reads of this rank's part, and nothing else: a *shard*.
:class:`~pyg_sar.loader.shards.shard.Shard` is a homogeneous part and
:class:`~pyg_sar.loader.shards.hetero_shard.HeteroShard` a heterogeneous
one; both are made of the same pieces (:mod:`~pyg_sar.loader.shards.base`:
the ownership and attributes of one node type, the local CSC and attributes
of one edge type) and read either a pyg_sar partition or PyG's
``LocalFeatureStore``/``LocalGraphStore`` pair
(:mod:`~pyg_sar.loader.shards.stores`). Shards are local: no collective
runs here.
"""
