"""The synthetic homogeneous graph: a degree-corrected stochastic block
model with community-correlated features and labels, at any size."""
import math
from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor

from torch_geometric.data import Data

# Default size of the ``synthetic`` dataset; keyword arguments override it.
SYNTHETIC_DEFAULTS: Dict[str, Any] = dict(
    num_nodes=100_000,
    avg_degree=20.0,
    num_features=128,
    num_classes=10,
)


def synthetic_graph(
    num_nodes: int,
    avg_degree: float,
    num_features: int,
    num_classes: int,
    seed: int = 0,
    num_communities: Optional[int] = None,
    intra_community_ratio: float = 0.85,
    class_purity: float = 0.9,
    degree_exponent: float = 2.5,
    feature_margin: float = 2.0,
    train_ratio: float = 0.1,
    val_ratio: float = 0.1,
) -> Data:
    r"""Generates a homophilous graph from a degree-corrected stochastic block
    model (DC-SBM).

    Nodes are split into communities of random sizes. Every community has a
    dominant class that :obj:`class_purity` of its nodes carry. Each node gets a
    power-law distributed degree propensity :math:`\theta_i`, and each edge
    picks its first endpoint with probability proportional to :math:`\theta`
    and its second endpoint, with probability :obj:`intra_community_ratio`,
    from the same community (else from the whole graph), again proportional to
    :math:`\theta`. Features are noisy class centroids, noisy enough that a
    model looking at a single node is mediocre while averaging over
    neighbors (most of which share the class) helps a lot.

    Generation is fully vectorized: 1M nodes and 20M edges take seconds.

    Args:
        num_nodes (int): Number of nodes.
        avg_degree (float): Target average degree (number of directed edges
            divided by :obj:`num_nodes`). Slightly fewer edges remain after
            self-loop and duplicate removal.
        num_features (int): Feature dimension.
        num_classes (int): Number of classes.
        seed (int, optional): Seed; equal seeds give identical graphs.
            (default: :obj:`0`)
        num_communities (int, optional): Number of communities. (default:
            about one per 500 nodes, at least :obj:`num_classes`)
        intra_community_ratio (float, optional): Fraction of edges inside a
            community. (default: :obj:`0.85`)
        class_purity (float, optional): Fraction of a community's nodes that
            carry its dominant class. (default: :obj:`0.9`)
        degree_exponent (float, optional): Exponent of the power-law degree
            propensities. (default: :obj:`2.5`)
        feature_margin (float, optional): Distance between class centroids in
            units of the per-node noise standard deviation; lower is harder.
            (default: :obj:`2.0`)
        train_ratio (float, optional): Fraction of nodes in :obj:`train_mask`.
            (default: :obj:`0.1`)
        val_ratio (float, optional): Fraction of nodes in :obj:`val_mask`; the
            rest goes to :obj:`test_mask`. (default: :obj:`0.1`)

    Returns:
        :class:`torch_geometric.data.Data` with :obj:`x`, :obj:`y`,
        :obj:`edge_index` (undirected, sorted, no self loops, no duplicates)
        and :obj:`train_mask`, :obj:`val_mask`, :obj:`test_mask`.
    """
    if num_nodes < 2:
        raise ValueError(f"'num_nodes' must be at least 2 (got {num_nodes})")
    if num_classes < 1 or num_features < 1 or avg_degree < 0:
        raise ValueError(
            f"'num_classes' and 'num_features' must be positive and "
            f"'avg_degree' non-negative (got num_classes={num_classes}, "
            f"num_features={num_features}, avg_degree={avg_degree})")
    if not 0 <= train_ratio + val_ratio <= 1:
        raise ValueError(f"'train_ratio' + 'val_ratio' must lie in [0, 1] "
                         f"(got {train_ratio} + {val_ratio})")

    generator = torch.Generator().manual_seed(seed)
    num_communities = community_count(num_nodes, num_classes,
                                      num_communities)
    community_ptr, community = community_layout(num_nodes, num_communities,
                                                generator)

    # Labels: the community's dominant class, else a uniformly random class.
    dominant_class = torch.randint(num_classes, (num_communities, ),
                                   generator=generator)
    dominant_class[:num_classes] = torch.randperm(
        num_classes, generator=generator)[:num_communities]
    y = dominant_class[community]
    is_noisy = torch.rand(num_nodes, generator=generator) >= class_purity
    y[is_noisy] = torch.randint(num_classes, (int(is_noisy.sum()), ),
                                generator=generator)

    theta_cumsum = torch.cumsum(
        degree_propensities(num_nodes, degree_exponent, generator), dim=0)

    # Sample undirected edges (symmetrization doubles them). Hubs collect
    # duplicates that get removed, so top up until the target is (nearly) met.
    new_id = torch.randperm(num_nodes, generator=generator)
    num_target = int(round(num_nodes * avg_degree))
    edge_codes = torch.empty(0, dtype=torch.long)
    num_samples = num_target // 2
    for _ in range(4):
        src, dst = sample_dc_sbm_edges(theta_cumsum, community,
                                       community_ptr, num_samples,
                                       intra_community_ratio, generator)
        # Shuffle node ids, so that ids carry no community structure.
        src, dst = new_id[src], new_id[dst]
        edge_codes = _undirected_codes(edge_codes, src, dst, num_nodes)
        del src, dst
        missing = num_target - edge_codes.numel()
        if missing <= 0.01 * num_target:
            break
        # Duplicates are more likely among the new samples than overall.
        num_samples = int(missing * 0.75) + 1
    del theta_cumsum
    edge_index = torch.stack(
        [edge_codes // num_nodes, edge_codes % num_nodes], dim=0)
    del edge_codes
    y_shuffled = torch.empty_like(y)
    y_shuffled[new_id] = y
    y = y_shuffled

    # Features: noisy class centroids. The centroid entries are scaled so that
    # the distance between two centroids is `feature_margin` noise stds.
    centroids = torch.randn(num_classes, num_features, generator=generator)
    centroids *= feature_margin / math.sqrt(2 * num_features)
    x = torch.randn(num_nodes, num_features, generator=generator)
    x += centroids[y]

    order = torch.randperm(num_nodes, generator=generator)
    num_train = int(round(train_ratio * num_nodes))
    num_val = int(round(val_ratio * num_nodes))
    train_mask = torch.zeros(num_nodes, dtype=torch.bool)
    val_mask = torch.zeros(num_nodes, dtype=torch.bool)
    test_mask = torch.ones(num_nodes, dtype=torch.bool)
    train_mask[order[:num_train]] = True
    val_mask[order[num_train:num_train + num_val]] = True
    test_mask[order[:num_train + num_val]] = False

    return Data(x=x, y=y, edge_index=edge_index, train_mask=train_mask,
                val_mask=val_mask, test_mask=test_mask, num_nodes=num_nodes)


def community_count(num_nodes: int, num_classes: int,
                    num_communities: Optional[int] = None) -> int:
    """The number of communities: :obj:`num_communities`, by default about
    one per 500 nodes and at least :obj:`num_classes`, within [1, N]."""
    if num_communities is None:
        num_communities = max(num_classes, num_nodes // 500)
    return max(1, min(num_communities, num_nodes))


def community_layout(num_nodes: int, num_communities: int,
                     generator: torch.Generator) -> Tuple[Tensor, Tensor]:
    """``(community_ptr, community)``: community sizes from Dirichlet-like
    random proportions, every community non-empty, nodes laid out community
    by community (the callers shuffle ids afterwards, so that node ids carry
    no structure)."""
    proportions = torch.rand(num_communities, generator=generator) + 0.5
    sizes = (proportions / proportions.sum() *
             (num_nodes - num_communities)).floor().long() + 1
    sizes[:num_nodes - int(sizes.sum())] += 1
    community_ptr = torch.zeros(num_communities + 1, dtype=torch.long)
    torch.cumsum(sizes, dim=0, out=community_ptr[1:])
    community = torch.repeat_interleave(torch.arange(num_communities), sizes)
    return community_ptr, community


def degree_propensities(num_nodes: int, degree_exponent: float,
                        generator: torch.Generator) -> Tensor:
    """Power-law degree propensities (Pareto with exponent
    :obj:`degree_exponent`, float64), capped so that no node wants more
    than a fraction of all edges."""
    uniform = torch.rand(num_nodes, generator=generator, dtype=torch.float64)
    theta = (1.0 - uniform).pow(-1.0 / (degree_exponent - 1.0))
    return theta.clamp_(max=math.sqrt(num_nodes))


def _sample_by_weight(
    weight_cumsum: Tensor,
    lower: Any,
    upper: Any,
    num_samples: int,
    generator: torch.Generator,
) -> Tensor:
    # Inverse-CDF sampling restricted to the cumulative-weight window
    # [lower, upper): picks node i with probability proportional to its
    # weight among the nodes whose window overlaps.
    uniform = torch.rand(num_samples, generator=generator,
                         dtype=torch.float64)
    target = lower + uniform * (upper - lower)
    index = torch.searchsorted(weight_cumsum, target, right=True)
    return index.clamp_(max=weight_cumsum.numel() - 1)


def sample_dc_sbm_edges(
    theta_cumsum: Tensor,
    community: Tensor,
    community_ptr: Tensor,
    num_samples: int,
    intra_community_ratio: float,
    generator: torch.Generator,
) -> Tuple[Tensor, Tensor]:
    """:obj:`num_samples` edges of the model, as :obj:`(src, dst)` ids of
    the community layout (before the caller shuffles ids): every source
    drawn by degree propensity (the running sum :obj:`theta_cumsum`), its
    destination by propensity within the source's community with
    probability :obj:`intra_community_ratio`, else within the whole graph.
    The in-memory and the streamed generator both draw with it."""
    total = float(theta_cumsum[-1])
    src = _sample_by_weight(theta_cumsum, 0.0, total, num_samples, generator)
    is_intra = torch.rand(num_samples, generator=generator) < \
        intra_community_ratio
    block = community[src][is_intra]
    cumsum_before = torch.cat([theta_cumsum.new_zeros(1), theta_cumsum])
    lower = torch.zeros(num_samples, dtype=torch.float64)
    upper = torch.full((num_samples, ), total, dtype=torch.float64)
    lower[is_intra] = cumsum_before[community_ptr[block]]
    upper[is_intra] = cumsum_before[community_ptr[block + 1]]
    dst = _sample_by_weight(theta_cumsum, lower, upper, num_samples,
                            generator)
    return src, dst


def _undirected_codes(codes: Tensor, src: Tensor, dst: Tensor,
                      num_nodes: int) -> Tensor:
    # Codes `row * N + col` of both directions, without self loops; unique on
    # them both deduplicates and sorts by (row, col).
    keep = src != dst
    src, dst = src[keep], dst[keep]
    codes = torch.cat([codes, src * num_nodes + dst, dst * num_nodes + src])
    return torch.unique(codes)
