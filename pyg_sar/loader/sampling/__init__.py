"""How a loader draws a neighborhood. The single-process kernels pick
in-edges among those a rank owns (:mod:`~pyg_sar.loader.sampling.kernel`:
uniform and weighted; :mod:`~pyg_sar.loader.sampling.temporal`: no later
than a seed's time); the collective hop sends a frontier to its owners and
brings their answers back in frontier order
(:mod:`~pyg_sar.loader.sampling.exchange`); a neighborhood grows hop by
hop, shared by all seeds (:mod:`~pyg_sar.loader.sampling.neighborhood`) or
one subtree per seed (:mod:`~pyg_sar.loader.sampling.disjoint`); induced
subgraphs add every edge between the sampled nodes
(:mod:`~pyg_sar.loader.sampling.induced`); link batches draw negatives
(:mod:`~pyg_sar.loader.sampling.negatives`); HGT batches grow by
HGSampling's budgets (:mod:`~pyg_sar.loader.sampling.hgt`). What works on a graph takes
node and edge types, a homogeneous graph being the one-type case, so the
homogeneous and heterogeneous loaders share it.
"""
