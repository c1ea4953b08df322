"""What a batch is made of once its nodes and edges are sampled: their
attribute rows, fetched from the ranks that own them in one exchange
(:mod:`~pyg_sar.loader.batches.attributes`), and the batch laid out as PyG's
loaders lay it out: a :class:`~torch_geometric.data.Data` for a homogeneous
graph (:mod:`~pyg_sar.loader.batches.data`), a
:class:`~torch_geometric.data.HeteroData` for a heterogeneous one
(:mod:`~pyg_sar.loader.batches.hetero_data`), the induced and bidirectional
subgraph types included. Both layouts share the fetch and the induced
edges; the loaders add the keys of their own kind (links, disjoint
subtrees, times).
"""
