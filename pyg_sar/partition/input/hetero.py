"""Input checks of the heterogeneous partitioner: :func:`split_hetero`
validates a :class:`~torch_geometric.data.HeteroData` and sorts the
attributes of every node and edge type, with the rules of the homogeneous
partitioner
(:func:`~pyg_sar.partition.input.data_source.split_attributes`)."""
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from torch import Tensor
from torch_geometric.data import HeteroData

from pyg_sar.partition.input.checks import check_edge_index
from pyg_sar.partition.layout import edge_type_str

EdgeType = Tuple[str, str, str]


@dataclass
class HeteroInput:
    r"""A validated :class:`HeteroData`: per-type node counts, edge indices
    (int64) and attributes, plus graph-level scalars."""
    node_types: List[str]
    edge_types: List[EdgeType]
    num_nodes: Dict[str, int]
    edge_index: Dict[EdgeType, Tensor]
    node_attrs: Dict[str, Dict[str, Tensor]]
    edge_attrs: Dict[EdgeType, Dict[str, Tensor]]
    graph_attrs: Dict[str, Any]

    @property
    def total_nodes(self) -> int:
        return sum(self.num_nodes.values())

    def num_edges(self, edge_type: EdgeType) -> int:
        return self.edge_index[edge_type].size(1)


def _check_type_name(node_type: Any) -> None:
    if not isinstance(node_type, str) or not node_type or '/' in node_type \
            or '\\' in node_type or node_type.startswith('.'):
        raise ValueError(f"Node type {node_type!r} cannot name a file; "
                         f"expected a non-empty string without '/', '\\' "
                         f"or a leading '.'")


def _scalar(value: Any) -> Any:
    return value.item() if isinstance(value, Tensor) else value


def _sort_store(store: Any, where: str, num_rows: int, kind: str,
                skip: Tuple[str, ...], scalars: Dict[str, Any],
                prefix: str) -> Dict[str, Tensor]:
    r"""The row attributes (first dimension :obj:`num_rows`) of one node or
    edge store; scalars go to :obj:`scalars` under :obj:`prefix + key`."""
    attrs: Dict[str, Tensor] = {}
    for key, value in store.items():
        if key in skip:
            continue
        if isinstance(value, Tensor):
            if value.dim() > 0 and value.size(0) == num_rows:
                attrs[key] = value
            elif value.numel() == 1:
                scalars[prefix + key] = value.item()
            else:
                raise ValueError(
                    f"{where}: attribute '{key}' has shape "
                    f"{list(value.shape)}; expected first dimension "
                    f"num_{kind}s={num_rows} ({kind} attribute) or a single "
                    f"value")
        elif isinstance(value, (bool, int, float, str)) or value is None:
            scalars[prefix + key] = value
        else:
            raise ValueError(
                f"{where}: attribute '{key}' has unsupported type "
                f"'{type(value).__name__}'; expected a tensor ({kind} "
                f"attribute) or a Python scalar")
    return attrs


def split_hetero(data: HeteroData) -> HeteroInput:
    r"""Validates :obj:`data` and sorts its attributes per node and edge
    type. Errors are one line naming the type and the attribute.

    Args:
        data (torch_geometric.data.HeteroData): The graph.
    """
    node_types = list(data.node_types)
    edge_types = [tuple(edge_type) for edge_type in data.edge_types]
    if not node_types:
        raise ValueError("'data' has no node types; expected at least one "
                         "node type with num_nodes or node attributes")
    graph_attrs: Dict[str, Any] = {}
    for key, value in data._global_store.items():
        if isinstance(value, Tensor) and value.numel() != 1:
            raise ValueError(f"Graph-level attribute '{key}' has shape "
                             f"{list(value.shape)}; expected a single value "
                             f"(store node and edge attributes on their "
                             f"type)")
        graph_attrs[key] = _scalar(value)

    num_nodes: Dict[str, int] = {}
    node_attrs: Dict[str, Dict[str, Tensor]] = {}
    for node_type in node_types:
        _check_type_name(node_type)
        where = f"Node type '{node_type}'"
        store = data[node_type]
        count = store.num_nodes
        if count is None:
            raise ValueError(f"{where} has no num_nodes and no attribute to "
                             f"infer it from; set data['{node_type}']"
                             f".num_nodes")
        num_nodes[node_type] = int(count)
        node_attrs[node_type] = _sort_store(
            store, where, num_nodes[node_type], 'node', ('num_nodes', ),
            graph_attrs, f'{node_type}.')

    edge_index: Dict[EdgeType, Tensor] = {}
    edge_attrs: Dict[EdgeType, Dict[str, Tensor]] = {}
    for edge_type in edge_types:
        src, _, dst = edge_type
        name = edge_type_str(edge_type)
        where = f"Edge type {edge_type}"
        for node_type in (src, dst):
            if node_type not in num_nodes:
                raise ValueError(f"{where} refers to node type "
                                 f"'{node_type}', which 'data' does not "
                                 f"have; set data['{node_type}'].num_nodes")
        index = check_edge_index(data[edge_type].get('edge_index'),
                                  f"data[{edge_type}].edge_index")
        for row, node_type in ((0, src), (1, dst)):
            if index.size(1) == 0:
                break
            count = num_nodes[node_type]
            low, high = int(index[row].min()), int(index[row].max())
            if low < 0 or high >= count:
                bad = low if low < 0 else high
                raise ValueError(
                    f"'data[{edge_type}].edge_index' contains "
                    f"{'source' if row == 0 else 'destination'} node id "
                    f"{bad}, outside the valid range [0, {count - 1}] for "
                    f"num_nodes={count} of node type '{node_type}'")
        edge_index[edge_type] = index
        edge_attrs[edge_type] = _sort_store(
            data[edge_type], where, index.size(1), 'edge', ('edge_index', ),
            graph_attrs, f'{name}.')

    return HeteroInput(node_types, edge_types, num_nodes, edge_index,
                       node_attrs, edge_attrs, graph_attrs)
