"""A homogeneous :class:`~torch_geometric.data.Data` as the partitioner's
input: :func:`split_attributes` checks it and sorts its attributes into
node, edge and graph attributes; :func:`source_of_data` wraps it, without a
copy, as a :class:`~pyg_sar.partition.input.edge_source.GraphSource` (the
interface a graph on disk offers too)."""
import time
from typing import Any, Dict, Optional, Tuple

from torch import Tensor

from torch_geometric.data import Data

from pyg_sar.partition.input.checks import (check_edge_index, check_labels,
                                            is_node_attr_name)
from pyg_sar.partition.input.edge_source import GraphSource, TensorEdgeSource
from pyg_sar.partition.input.finite import check_finite


def split_attributes(
    data: Data,
) -> Tuple[int, Tensor, Dict[str, Tensor], Dict[str, Tensor], Dict[str, Any]]:
    r"""Validates :obj:`data` and sorts its attributes into node-level,
    edge-level and graph-level ones. A tensor with one row per edge is an
    edge attribute unless its name is a node attribute's (:obj:`x`,
    :obj:`y`, :obj:`pos`, :obj:`*_mask`): that is an error, not a silent
    edge attribute that fails when training indexes nodes with it."""
    if not isinstance(data, Data):
        raise TypeError(f"Expected a 'torch_geometric.data.Data' object "
                        f"(got '{type(data).__name__}')")

    edge_index = check_edge_index(data.get('edge_index'), 'data.edge_index')

    num_nodes = data.num_nodes
    if num_nodes is None or num_nodes < 1:
        raise ValueError(f"'data' must have at least one node "
                         f"(got num_nodes={num_nodes})")
    num_edges = edge_index.size(1)
    if num_edges > 0:
        low, high = int(edge_index.min()), int(edge_index.max())
        if low < 0 or high >= num_nodes:
            bad = low if low < 0 else high
            raise ValueError(f"'data.edge_index' contains node id {bad}, "
                             f"outside the valid range [0, {num_nodes - 1}] "
                             f"for num_nodes={num_nodes}")

    node_attrs: Dict[str, Tensor] = {}
    edge_attrs: Dict[str, Tensor] = {}
    graph_attrs: Dict[str, Any] = {}
    for key, value in data.items():
        if key in ('edge_index', 'num_nodes'):
            continue
        if isinstance(value, Tensor):
            if value.dim() == 0:
                graph_attrs[key] = value.item()
            elif value.size(0) == num_nodes and not (
                    value.size(0) == num_edges and 'edge' in key):
                node_attrs[key] = value
            elif value.size(0) == num_edges and is_node_attr_name(key):
                raise ValueError(
                    f"Node attribute '{key}' has {value.size(0)} rows, "
                    f"one per edge (num_edges={num_edges}); expected one "
                    f"per node (num_nodes={num_nodes})")
            elif value.size(0) == num_edges:
                edge_attrs[key] = value
            elif value.numel() == 1:
                graph_attrs[key] = value.item()
            else:
                raise ValueError(
                    f"Attribute '{key}' has shape {list(value.shape)}; "
                    f"expected first dimension num_nodes={num_nodes} "
                    f"(node attribute) or num_edges={num_edges} (edge "
                    f"attribute), or a single graph-level value")
        elif isinstance(value, (bool, int, float, str)) or value is None:
            graph_attrs[key] = value
        else:
            raise ValueError(
                f"Attribute '{key}' has unsupported type "
                f"'{type(value).__name__}'; expected a tensor (node or edge "
                f"attribute) or a Python scalar (graph attribute)")
    return num_nodes, edge_index, node_attrs, edge_attrs, graph_attrs


def source_of_data(data: Data, allow_non_finite: bool
                 ) -> Tuple[GraphSource, Optional[float]]:
    r"""Checks a :class:`Data` and wraps it as an in-memory
    :class:`GraphSource` (no copy)."""
    num_nodes, edge_index, node_attrs, edge_attrs, graph_attrs = \
        split_attributes(data)
    check_labels(node_attrs)
    check_time = None
    if not allow_non_finite:
        check_start = time.perf_counter()
        check_finite(node_attrs, edge_attrs)
        check_time = time.perf_counter() - check_start
    return GraphSource(num_nodes, TensorEdgeSource(edge_index, num_nodes),
                       node_attrs, edge_attrs, graph_attrs), check_time
