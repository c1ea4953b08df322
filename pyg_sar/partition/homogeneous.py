"""Graph partitioning into PyG's on-disk distributed format, and loading.

:func:`partition_graph` splits a :class:`~torch_geometric.data.Data` into
:obj:`num_parts` parts (METIS or random), relabels nodes and edges so that
every part owns one contiguous range of new ids, and writes the layout of
:class:`torch_geometric.distributed.Partitioner` (readable by
:class:`~torch_geometric.distributed.LocalGraphStore` and
:class:`~torch_geometric.distributed.LocalFeatureStore`) plus a
``pyg_sar.json`` manifest and the node permutation ``perm.pt``.

:func:`load_partition` (:mod:`pyg_sar.partition.load`) reads one part back
as a :class:`Partition`.
"""
import os
import os.path as osp
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor
from tqdm.auto import tqdm

from torch_geometric.data import Data

from pyg_sar.partition.assign import (_balance_training_nodes,
                                      _fill_empty_parts, _metis_parts,
                                      _random_parts, _symmetric_csr)
from pyg_sar.partition.finite import check_finite
from pyg_sar.partition.layout import (EDGE_MAP_FILE, META_FILE,
                                      NODE_MAP_FILE, PERM_FILE, _part_dir)
from pyg_sar.partition.common import (_check_edge_index, _check_labels,
                                      _check_method, _check_num_parts,
                                      _count_per_part, _is_node_attr_name,
                                      _manifest_header, _num_classes, _ratio,
                                      _save, _tensor_info)
from pyg_sar.partition.out_dir import (_check_out_dir, _write_atomically,
                                       _write_json)



def _split_attributes(
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

    edge_index = _check_edge_index(data.get('edge_index'), 'data.edge_index')

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
            elif value.size(0) == num_edges and _is_node_attr_name(key):
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


def write_homogeneous(
    data: Data,
    num_parts: int,
    out_dir: str,
    method: str = 'metis',
    balance_train: bool = True,
    seed: int = 0,
    overwrite: bool = False,
    progress: Optional[bool] = None,
    allow_non_finite: bool = False,
) -> Dict[str, Any]:
    """:func:`pyg_sar.partition.partition_graph` for a homogeneous
    :class:`~torch_geometric.data.Data`."""
    start_time = time.perf_counter()
    _check_method(method)
    out_dir = osp.abspath(os.fspath(out_dir))
    num_nodes, edge_index, node_attrs, edge_attrs, graph_attrs = \
        _split_attributes(data)
    _check_num_parts(num_parts, num_nodes)
    _check_labels(node_attrs)
    check_time = None
    if not allow_non_finite:
        check_start = time.perf_counter()
        check_finite(node_attrs, edge_attrs)
        check_time = time.perf_counter() - check_start
    _check_out_dir(out_dir, overwrite)

    train_mask = node_attrs.get('train_mask')
    if train_mask is not None and (train_mask.dtype != torch.bool
                                   or train_mask.dim() != 1):
        train_mask = None  # not a usable mask: skip the train statistics

    def write(tmp_dir: str, bar: tqdm) -> Dict[str, Any]:
        return _write_partition(tmp_dir, num_nodes, edge_index, node_attrs,
                                edge_attrs, graph_attrs, num_parts, method,
                                balance_train, seed, train_mask, bar)

    return _write_atomically(out_dir, write, 4 + num_parts, progress,
                             start_time, check_time, overwrite)



def _write_partition(
    root: str,
    num_nodes: int,
    edge_index: Tensor,
    node_attrs: Dict[str, Tensor],
    edge_attrs: Dict[str, Tensor],
    graph_attrs: Dict[str, Any],
    num_parts: int,
    method: str,
    balance_train: bool,
    seed: int,
    train_mask: Optional[Tensor],
    bar: tqdm,
) -> Dict[str, Any]:
    timings: Dict[str, float] = {}
    num_edges = edge_index.size(1)
    generator = torch.Generator().manual_seed(seed)
    balance_mask = train_mask if balance_train else None

    # 1. Assign every node to a part.
    stage_start = time.perf_counter()
    num_swapped = 0
    if method == 'random' or num_parts == 1:
        bar.set_postfix_str('random assignment')
        part = _random_parts(num_nodes, num_parts, generator, balance_mask)
        bar.update(2)
    else:
        bar.set_postfix_str('symmetrize')
        rowptr, row, col = _symmetric_csr(edge_index, num_nodes)
        bar.update(1)
        timings['symmetrize'] = round(time.perf_counter() - stage_start, 3)
        metis_start = time.perf_counter()
        bar.set_postfix_str('METIS')
        if col.numel() == 0:
            # Nothing to cut: any balanced assignment is optimal.
            part = _random_parts(num_nodes, num_parts, generator,
                                 balance_mask)
        else:
            part = _metis_parts(rowptr, col, num_parts, seed)
            _fill_empty_parts(part, row, col, num_parts)
        del rowptr
        timings['metis'] = round(time.perf_counter() - metis_start, 3)
        if balance_mask is not None and int(balance_mask.sum()) > 0:
            bar.set_postfix_str('balance training nodes')
            num_swapped = _balance_training_nodes(part, row, col,
                                                  balance_mask, num_parts)
        del row, col
        bar.update(1)
    timings['assign'] = round(time.perf_counter() - stage_start, 3)

    # 2. Relabel nodes (stable by part) and edges (by new (dst, src)).
    stage_start = time.perf_counter()
    bar.set_postfix_str('relabel')
    part_sizes = _count_per_part(part, num_parts)
    node_ptr = torch.zeros(num_parts + 1, dtype=torch.long)
    torch.cumsum(part_sizes, dim=0, out=node_ptr[1:])
    perm = torch.sort(part, stable=True).indices  # new id -> input id
    new_id = torch.empty_like(perm)
    new_id[perm] = torch.arange(num_nodes)

    src_part = part[edge_index[0]]
    dst_part = part[edge_index[1]]
    is_cut = src_part != dst_part
    num_cut = int(is_cut.sum())
    remote_edges = _count_per_part(dst_part[is_cut], num_parts)
    del src_part, dst_part

    sort_key = new_id[edge_index[1]] * num_nodes + new_id[edge_index[0]]
    sort_key, edge_perm = torch.sort(sort_key, stable=True)
    new_dst = sort_key // num_nodes
    new_src = sort_key - new_dst * num_nodes
    del sort_key, new_id
    edge_ptr = torch.searchsorted(new_dst, node_ptr)
    edge_sizes = edge_ptr[1:] - edge_ptr[:-1]
    bar.update(1)
    timings['relabel'] = round(time.perf_counter() - stage_start, 3)

    # 3. Write the parts in PyG's homogeneous layout.
    stage_start = time.perf_counter()
    halo_nodes: List[int] = []
    train_counts: List[int] = []
    for i in range(num_parts):
        bar.set_postfix_str(f'write part {i}')
        part_dir = _part_dir(root, i)
        os.makedirs(part_dir)
        node_start, node_end = int(node_ptr[i]), int(node_ptr[i + 1])
        edge_start, edge_end = int(edge_ptr[i]), int(edge_ptr[i + 1])
        # Clone slices: torch.save of a view writes its whole storage.
        row = new_src[edge_start:edge_end].clone()
        col = new_dst[edge_start:edge_end].clone()
        edge_id = torch.arange(edge_start, edge_end)
        _save(
            {
                'edge_id': edge_id,
                'row': row,
                'col': col,
                'size': (num_nodes, num_nodes),
            }, osp.join(part_dir, 'graph.pt'))
        is_remote = (row < node_start) | (row >= node_end)
        halo_nodes.append(int(torch.unique(row[is_remote]).numel()))
        del row, col, is_remote

        input_node_ids = perm[node_start:node_end]
        node_feats = {
            key: value[input_node_ids]
            for key, value in node_attrs.items()
        }
        if train_mask is not None:
            train_counts.append(int(node_feats['train_mask'].sum()))
        _save(
            {
                'global_id': torch.arange(node_start, node_end),
                'feats': node_feats,
            }, osp.join(part_dir, 'node_feats.pt'))
        del node_feats

        input_edge_ids = edge_perm[edge_start:edge_end]
        edge_feats = {
            key: value[input_edge_ids]
            for key, value in edge_attrs.items()
        }
        _save({
            'global_id': edge_id,
            'feats': edge_feats
        }, osp.join(part_dir, 'edge_feats.pt'))
        del edge_feats
        bar.update(1)

    bar.set_postfix_str('write maps')
    _save(torch.repeat_interleave(torch.arange(num_parts), part_sizes),
          osp.join(root, NODE_MAP_FILE))
    _save(torch.repeat_interleave(torch.arange(num_parts), edge_sizes),
          osp.join(root, EDGE_MAP_FILE))
    _save(perm, osp.join(root, PERM_FILE))
    _write_json(
        {
            'num_parts': num_parts,
            'node_types': None,
            'edge_types': None,
            'node_offset': None,
            'is_hetero': False,
            'is_sorted': True,
        }, osp.join(root, META_FILE))
    bar.update(1)
    timings['write'] = round(time.perf_counter() - stage_start, 3)

    parts = []
    for i in range(num_parts):
        parts.append({
            'num_nodes': int(part_sizes[i]),
            'num_edges': int(edge_sizes[i]),
            'num_train_nodes': train_counts[i] if train_counts else None,
            'num_remote_edges': int(remote_edges[i]),
            'num_halo_nodes': halo_nodes[i],
        })
    balance = {
        'nodes_max_over_mean': round(_ratio(part_sizes), 4),
        'edges_max_over_mean': round(_ratio(edge_sizes), 4),
    }
    if train_counts:
        balance['train_max_over_mean'] = round(
            _ratio(torch.tensor(train_counts)), 4)

    return {
        **_manifest_header(),
        'num_parts': num_parts,
        'method': method,
        'balance_train': bool(balance_train and train_mask is not None),
        'train_swaps': num_swapped,
        'seed': seed,
        'num_nodes': num_nodes,
        'num_edges': num_edges,
        'node_ptr': node_ptr.tolist(),
        'edge_ptr': edge_ptr.tolist(),
        'parts': parts,
        'edge_cut': {
            'count': num_cut,
            'fraction': round(num_cut / num_edges, 6) if num_edges else 0.0,
        },
        'balance': balance,
        'perm_file': PERM_FILE,
        'node_attr_names': list(node_attrs),
        'edge_attr_names': list(edge_attrs),
        'num_classes': _num_classes(node_attrs.get('y')),
        'source': {
            'num_nodes': num_nodes,
            'num_edges': num_edges,
            'node_attrs': {k: _tensor_info(v)
                           for k, v in node_attrs.items()},
            'edge_attrs': {k: _tensor_info(v)
                           for k, v in edge_attrs.items()},
            'graph_attrs': graph_attrs,
        },
        'time_s': timings,
    }
