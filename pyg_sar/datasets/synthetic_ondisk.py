r""":func:`~pyg_sar.datasets.synthetic_graph`'s model, written to a graph
directory (:mod:`pyg_sar.partition.input.ondisk`) a chunk of edges at a
time, for graphs too large to build in memory (hundreds of millions of
edges): the input of the partitioner's scale benchmark.
(:func:`~pyg_sar.partition.input.ondisk.write_synthetic_graph` writes a
harder model: half of every node's edges from anywhere.)

The same degree-corrected stochastic block model, with the same defaults:
communities of random sizes (about one per 500 nodes), power-law degree
propensities, 85% of the edges inside a community, node ids shuffled so
that they carry no structure, labels the community's dominant class for 90%
of the nodes, features noisy class centroids, 10% / 10% / 80% train /
validation / test masks. Memory: about 40 bytes per node plus one chunk of
edges. Unlike :func:`~pyg_sar.datasets.synthetic_graph`, nothing is
deduplicated (that would need the whole edge list): every sampled edge is
written in both directions, duplicates and the rare self loop included, so
the graph has exactly :obj:`num_nodes * avg_degree` directed edges."""
import math
import os
import os.path as osp

import numpy as np
import torch

from pyg_sar.datasets.synthetic import (community_count, community_layout,
                                        degree_propensities,
                                        sample_dc_sbm_edges)
from pyg_sar.partition.input.ondisk import (NpyWriter, npy_writers,
                                            write_graph_json)


def write_synthetic_dcsbm(root: str, num_nodes: int, avg_degree: int = 20,
                          num_features: int = 16, num_classes: int = 16,
                          seed: int = 0, chunk_samples: int = 1 << 22,
                          intra_community_ratio: float = 0.85,
                          class_purity: float = 0.9,
                          degree_exponent: float = 2.5,
                          feature_margin: float = 2.0) -> str:
    r"""Writes the graph to the directory :obj:`root` and returns its path.

    Args:
        root (str): The graph directory (created).
        num_nodes (int): Number of nodes.
        avg_degree (int, optional): Directed edges per node (even: edges
            are sampled undirected and written both ways).
        num_features (int, optional): Feature dimension.
        num_classes (int, optional): Number of classes.
        seed (int, optional): Seed; equal seeds (and chunk sizes) give
            identical files.
        chunk_samples (int, optional): Undirected edges sampled per chunk.
        intra_community_ratio, class_purity, degree_exponent,
        feature_margin: As in :func:`~pyg_sar.datasets.synthetic_graph`.
    """
    if num_nodes < 2 or avg_degree < 0 or avg_degree % 2:
        raise ValueError(f"Expected num_nodes >= 2 and an even avg_degree >= "
                         f"0 (got {num_nodes}, {avg_degree})")
    root = osp.abspath(os.fspath(root))
    os.makedirs(root, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    num_communities = community_count(num_nodes, num_classes)
    community_ptr, community = community_layout(num_nodes, num_communities,
                                                generator)
    dominant = torch.randint(num_classes, (num_communities, ),
                             generator=generator)
    theta_cumsum = torch.cumsum(
        degree_propensities(num_nodes, degree_exponent, generator), dim=0)
    new_id = torch.randperm(num_nodes, generator=generator)

    num_samples = num_nodes * avg_degree // 2
    num_edges = 2 * num_samples
    writers = {
        'edge_index': NpyWriter(osp.join(root, 'edge_index.npy'),
                                (2, num_edges), np.int64),
        'x': NpyWriter(osp.join(root, 'x.npy'), (num_nodes, num_features),
                       np.float32),
        'y': NpyWriter(osp.join(root, 'y.npy'), (num_nodes, ), np.int64),
    }
    masks = ('train_mask', 'val_mask', 'test_mask')
    for name in masks:
        writers[name] = NpyWriter(osp.join(root, f'{name}.npy'),
                                  (num_nodes, ), np.bool_)
    with npy_writers(writers):
        for start in range(0, num_samples, chunk_samples):
            count = min(chunk_samples, num_samples - start)
            src, dst = sample_dc_sbm_edges(
                theta_cumsum, community, community_ptr, count,
                intra_community_ratio, generator)
            src, dst = new_id[src], new_id[dst]
            ei = writers['edge_index']
            ei.write(2 * start, src)
            ei.write(2 * start + count, dst)
            ei.write(num_edges + 2 * start, dst)
            ei.write(num_edges + 2 * start + count, src)
            del src, dst
        del theta_cumsum
        # Node rows in the shuffled order: node new_id[i] is the i-th of
        # the community layout.
        y = dominant[community]
        noisy = torch.rand(num_nodes, generator=generator) >= class_purity
        y[noisy] = torch.randint(num_classes, (int(noisy.sum()), ),
                                 generator=generator)
        del noisy, community
        y_out = torch.empty_like(y)
        y_out[new_id] = y
        del y, new_id
        writers['y'].write(0, y_out)
        centroids = torch.randn(num_classes, num_features,
                                generator=generator)
        centroids *= feature_margin / math.sqrt(2 * num_features)
        step = max(1, (1 << 24) // max(num_features, 1))
        for lo in range(0, num_nodes, step):
            hi = min(lo + step, num_nodes)
            x = torch.randn(hi - lo, num_features, generator=generator)
            writers['x'].write(lo * num_features, x + centroids[y_out[lo:hi]])
        order = torch.randperm(num_nodes, generator=generator)
        num_train = int(round(0.1 * num_nodes))
        split = torch.full((num_nodes, ), 2, dtype=torch.int8)
        split[order[:num_train]] = 0
        split[order[num_train:2 * num_train]] = 1
        for index, name in enumerate(masks):
            writers[name].write(0, (split == index).numpy())
    write_graph_json(root, num_nodes, num_edges,
                     {'x': 'x.npy', 'y': 'y.npy',
                      **{name: f'{name}.npy' for name in masks}})
    return root


__all__ = ['write_synthetic_dcsbm']
