"""Partitioning a :class:`~torch_geometric.data.HeteroData` into PyG's
heterogeneous on-disk distributed format.

METIS cuts the whole typed graph (node types laid out one after the other,
as :meth:`HeteroData.to_homogeneous` does, symmetrized); then every node
type and the training nodes are balanced across parts. Ids are per type:
part :obj:`p` owns the new ids :obj:`node_ptr[t][p]` to
:obj:`node_ptr[t][p + 1] - 1` of every node type :obj:`t` (stable in the
input order), and the edges of every edge type are sorted by
:obj:`(new dst, new src)`, so each part's incoming edges of a type get
contiguous new edge ids. :func:`pyg_sar.load_partition` reads a part back
as a :class:`pyg_sar.partition.read.heterogeneous.HeteroPartition`.
"""
import os
import os.path as osp
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor
from tqdm.auto import tqdm

from torch_geometric.data import HeteroData

from pyg_sar.partition.assign.in_memory import (
    balance_node_type, balance_training_nodes_in_memory,
    fill_empty_parts_in_memory, symmetric_csr_in_memory)
from pyg_sar.partition.assign.parts import (assign_parts, metis_parts,
                                            random_parts)
from pyg_sar.partition.input.checks import (check_labels, check_method,
                                            check_num_parts)
from pyg_sar.partition.input.edge_source import TensorEdgeSource
from pyg_sar.partition.input.finite import check_finite
from pyg_sar.partition.input.hetero import (EdgeType, HeteroInput,
                                            split_hetero)
from pyg_sar.partition.layout import (EDGE_MAP_DIR, EDGE_PERM_DIR, META_FILE,
                                      NODE_MAP_DIR, PERM_DIR, edge_type_str,
                                      part_path)
from pyg_sar.partition.write.common import (count_per_part, manifest_header,
                                            max_over_mean, save_file,
                                            tensor_info)
from pyg_sar.partition.write.out_dir import (check_out_dir, write_atomically,
                                             write_json)


def _train_masks(graph: HeteroInput) -> Dict[str, Tensor]:
    r"""The usable :obj:`train_mask` (boolean vector) of every node type
    that has one."""
    masks = {}
    for node_type, attrs in graph.node_attrs.items():
        mask = attrs.get('train_mask')
        if mask is not None and mask.dtype == torch.bool and mask.dim() == 1:
            masks[node_type] = mask
    return masks


def partition_hetero_graph(
    data: HeteroData,
    num_parts: int,
    out_dir: str,
    method: str = 'metis',
    balance_train: bool = True,
    seed: int = 0,
    overwrite: bool = False,
    progress: Optional[bool] = None,
    allow_non_finite: bool = False,
) -> Dict[str, Any]:
    r"""Partitions the heterogeneous graph :obj:`data` into :obj:`num_parts`
    parts and writes them to :obj:`out_dir` in PyG's heterogeneous
    distributed format (see the module docs); called by
    :func:`pyg_sar.partition_graph` for a :class:`HeteroData`.

    Every node attribute of every type (first dimension the type's
    :obj:`num_nodes`) and every edge attribute (first dimension the edge
    type's number of edges) is kept; node types without attributes (only
    :obj:`num_nodes`) are fine. :obj:`perm/<node_type>.pt` maps new per-type
    ids to input ids, :obj:`edge_perm/<src__rel__dst>.pt` new per-type edge ids
    to input edge ids (columns of the type's :obj:`edge_index`).

    Args:
        data (torch_geometric.data.HeteroData): The graph.
        num_parts (int): Number of parts, between 1 and the total number of
            nodes.
        out_dir (str): Output directory. Must be empty or absent unless
            :obj:`overwrite` is set.
        method (str, optional): :obj:`"metis"`, :obj:`"kaminpar"` (all node
            types as one graph, then every type balanced as after METIS) or
            :obj:`"random"` (balanced per type). (default: :obj:`"metis"`)
        balance_train (bool, optional): Balance the training nodes
            (:obj:`train_mask`) of every node type that has them.
            (default: :obj:`True`)
        seed (int, optional): Seed of METIS and of the random assignment.
            (default: :obj:`0`)
        overwrite (bool, optional): Replace an existing partition in
            :obj:`out_dir`. (default: :obj:`False`)
        progress (bool, optional): Show a progress bar. (default: when
            standard error is a terminal)
        allow_non_finite (bool, optional): Partition floating attributes
            that hold NaN or inf. (default: :obj:`False`)

    Returns:
        The manifest written to :obj:`out_dir/pyg_sar.json`.
    """
    start_time = time.perf_counter()
    check_method(method)
    out_dir = osp.abspath(os.fspath(out_dir))
    graph = split_hetero(data)
    check_num_parts(num_parts, graph.total_nodes)
    for node_type, attrs in graph.node_attrs.items():
        check_labels(attrs, prefix=f'{node_type}.')
    check_time = None
    if not allow_non_finite:
        check_start = time.perf_counter()
        check_finite(
            {f'{t}.{k}': v for t, attrs in graph.node_attrs.items()
             for k, v in attrs.items()},
            {f'{edge_type_str(e)}.{k}': v
             for e, attrs in graph.edge_attrs.items()
             for k, v in attrs.items()})
        check_time = time.perf_counter() - check_start
    check_out_dir(out_dir, overwrite)

    def write(tmp_dir: str, bar: tqdm) -> Dict[str, Any]:
        return _write_hetero(tmp_dir, graph, num_parts, method,
                             balance_train, seed, bar)

    return write_atomically(out_dir, write, 3 + num_parts, progress,
                             start_time, check_time, overwrite)


def _node_offsets(graph: HeteroInput) -> Dict[str, int]:
    offsets, offset = {}, 0
    for node_type in graph.node_types:
        offsets[node_type] = offset
        offset += graph.num_nodes[node_type]
    return offsets


def _assign(graph: HeteroInput, num_parts: int, method: str,
            train_masks: Dict[str, Tensor], seed: int,
            timings: Dict[str, float]) -> Tuple[Dict[str, Tensor], int, int]:
    r"""The part of every node, per node type; also returns the number of
    nodes moved to balance node types and of swapped training pairs."""
    generator = torch.Generator().manual_seed(seed)
    offsets = _node_offsets(graph)
    total = graph.total_nodes

    def per_type(part: Tensor) -> Dict[str, Tensor]:
        return {t: part[offsets[t]:offsets[t] + graph.num_nodes[t]]
                for t in graph.node_types}

    def random_per_type() -> Dict[str, Tensor]:
        # Balanced per type by construction (sizes differ by at most one).
        return {
            t: random_parts(graph.num_nodes[t], num_parts, generator,
                             train_masks.get(t))
            for t in graph.node_types
        }

    if method == 'random' or num_parts == 1:
        return random_per_type(), 0, 0

    stage_start = time.perf_counter()
    edge_index = torch.cat([
        graph.edge_index[e] + torch.tensor(
            [[offsets[e[0]]], [offsets[e[2]]]]) for e in graph.edge_types
    ], dim=1) if graph.edge_types else torch.empty(2, 0, dtype=torch.long)
    rowptr, row, col = symmetric_csr_in_memory(edge_index, total)
    timings['symmetrize'] = round(time.perf_counter() - stage_start, 3)
    if col.numel() == 0:
        return random_per_type(), 0, 0  # nothing to cut

    stage_start = time.perf_counter()
    if method == 'kaminpar':
        # All node types as one graph, as METIS sees it; the structure
        # above stays for the per-type and training-node balancing.
        part, _ = assign_parts(TensorEdgeSource(edge_index, total),
                               num_parts, 'kaminpar', seed=seed)
    else:
        part = metis_parts(rowptr, col, num_parts, seed)
    del rowptr, edge_index
    fill_empty_parts_in_memory(part, row, col, num_parts)
    timings['metis'] = round(time.perf_counter() - stage_start, 3)

    stage_start = time.perf_counter()
    type_masks = {}
    num_moved = 0
    for node_type in graph.node_types:
        start = offsets[node_type]
        end = start + graph.num_nodes[node_type]
        mask = torch.zeros(total, dtype=torch.bool)
        mask[start:end] = True
        type_masks[node_type] = mask
        # Only the neighbors of this type's nodes matter for its moves: the
        # rows of the type are one slice of the row-sorted adjacency.
        lo, hi = torch.searchsorted(row, torch.tensor([start, end])).tolist()
        num_moved += balance_node_type(part, row[lo:hi], col[lo:hi], mask,
                                        num_parts)
    num_swapped = 0
    for node_type, train_mask in train_masks.items():
        if int(train_mask.sum()) == 0:
            continue
        mask = torch.zeros(total, dtype=torch.bool)
        mask[offsets[node_type]:offsets[node_type] +
             graph.num_nodes[node_type]] = train_mask
        num_swapped += balance_training_nodes_in_memory(
            part, row, col, mask, num_parts, pool=type_masks[node_type])
    timings['balance'] = round(time.perf_counter() - stage_start, 3)
    return per_type(part), num_moved, num_swapped


def _ptr(counts: Tensor) -> Tensor:
    ptr = torch.zeros(counts.numel() + 1, dtype=torch.long)
    torch.cumsum(counts, dim=0, out=ptr[1:])
    return ptr


def _write_hetero(root: str, graph: HeteroInput, num_parts: int,
                  method: str, balance_train: bool, seed: int,
                  bar: tqdm) -> Dict[str, Any]:
    timings: Dict[str, float] = {}
    train_masks = _train_masks(graph)
    balance_masks = train_masks if balance_train else {}

    # 1. Assign every node to a part.
    stage_start = time.perf_counter()
    bar.set_postfix_str(f'assign ({method})')
    parts, num_moved, num_swapped = _assign(graph, num_parts, method,
                                            balance_masks, seed, timings)
    bar.update(1)
    timings['assign'] = round(time.perf_counter() - stage_start, 3)

    # 2. Relabel nodes per type (stable by part) and edges per type (by new
    # (dst, src)).
    stage_start = time.perf_counter()
    bar.set_postfix_str('relabel')
    node_ptr, perm, new_id, node_sizes = {}, {}, {}, {}
    for t in graph.node_types:
        node_sizes[t] = count_per_part(parts[t], num_parts)
        node_ptr[t] = _ptr(node_sizes[t])
        perm[t] = torch.sort(parts[t], stable=True).indices
        new_id[t] = torch.empty_like(perm[t])
        new_id[t][perm[t]] = torch.arange(perm[t].numel())

    edges: Dict[EdgeType, Dict[str, Any]] = {}
    for e in graph.edge_types:
        src, _, dst = e
        index = graph.edge_index[e]
        num_src = max(graph.num_nodes[src], 1)
        is_cut = parts[src][index[0]] != parts[dst][index[1]]
        sort_key = new_id[dst][index[1]] * num_src + new_id[src][index[0]]
        sort_key, edge_perm = torch.sort(sort_key, stable=True)
        new_dst = sort_key // num_src
        edge_ptr = torch.searchsorted(new_dst, node_ptr[dst])
        edges[e] = dict(
            perm=edge_perm, dst=new_dst, src=sort_key - new_dst * num_src,
            ptr=edge_ptr, sizes=edge_ptr[1:] - edge_ptr[:-1],
            num_cut=int(is_cut.sum()),
            remote=count_per_part(parts[dst][index[1]][is_cut], num_parts))
    bar.update(1)
    timings['relabel'] = round(time.perf_counter() - stage_start, 3)

    # 3. Write the parts in PyG's heterogeneous layout.
    stage_start = time.perf_counter()
    part_stats = []
    for i in range(num_parts):
        bar.set_postfix_str(f'write part {i}')
        part_stats.append(_write_part(root, i, graph, node_ptr, perm, edges,
                                      train_masks))
        bar.update(1)

    bar.set_postfix_str('write maps')
    part_ids = torch.arange(num_parts)
    for folder in (NODE_MAP_DIR, EDGE_MAP_DIR, PERM_DIR, EDGE_PERM_DIR):
        os.makedirs(osp.join(root, folder))
    for t in graph.node_types:
        save_file(torch.repeat_interleave(part_ids, node_sizes[t]),
              osp.join(root, NODE_MAP_DIR, f'{t}.pt'))
        save_file(perm[t], osp.join(root, PERM_DIR, f'{t}.pt'))
    for e in graph.edge_types:
        save_file(torch.repeat_interleave(part_ids, edges[e]['sizes']),
              osp.join(root, EDGE_MAP_DIR, f'{edge_type_str(e)}.pt'))
        save_file(edges[e]['perm'],
              osp.join(root, EDGE_PERM_DIR, f'{edge_type_str(e)}.pt'))
    write_json(
        {
            'num_parts': num_parts,
            'node_types': graph.node_types,
            'edge_types': [list(e) for e in graph.edge_types],
            'node_offset': list(_node_offsets(graph).values()),
            'is_hetero': True,
            'is_sorted': True,
        }, osp.join(root, META_FILE))
    bar.update(1)
    timings['write'] = round(time.perf_counter() - stage_start, 3)

    return _manifest(graph, num_parts, method, seed,
                     bool(balance_train and train_masks), num_moved,
                     num_swapped, node_ptr, node_sizes, edges, part_stats,
                     timings)


def _write_part(root: str, i: int, graph: HeteroInput,
                node_ptr: Dict[str, Tensor], perm: Dict[str, Tensor],
                edges: Dict[EdgeType, Dict[str, Any]],
                train_masks: Dict[str, Tensor]) -> Dict[str, Any]:
    r"""Writes :obj:`part_{i}` (:obj:`graph.pt`, :obj:`node_feats.pt`,
    :obj:`edge_feats.pt`, keyed by type as PyG's
    :class:`~torch_geometric.distributed.Partitioner` writes them) and
    returns its statistics. Types without local nodes or edges are left out
    of the feature files: PyG's :class:`LocalFeatureStore` cannot index an
    empty id vector."""
    part_dir = part_path(root, i)
    os.makedirs(part_dir)
    graph_file: Dict[EdgeType, Dict[str, Any]] = {}
    edge_feats: Dict[EdgeType, Dict[str, Any]] = {}
    halo: Dict[str, List[Tensor]] = {t: [] for t in graph.node_types}
    for e in graph.edge_types:
        src, _, dst = e
        info = edges[e]
        start, end = int(info['ptr'][i]), int(info['ptr'][i + 1])
        edge_id = torch.arange(start, end)
        # Clone slices: torch.save of a view writes its whole storage.
        row = info['src'][start:end].clone()
        graph_file[e] = {
            'edge_id': edge_id,
            'row': row,
            'col': info['dst'][start:end].clone(),
            'size': (graph.num_nodes[src], graph.num_nodes[dst]),
        }
        is_remote = (row < node_ptr[src][i]) | (row >= node_ptr[src][i + 1])
        halo[src].append(row[is_remote])
        if end > start:
            input_ids = info['perm'][start:end]
            edge_feats[e] = {
                'global_id': edge_id,
                'feats': {k: v[input_ids]
                          for k, v in graph.edge_attrs[e].items()},
            }
    save_file(graph_file, osp.join(part_dir, 'graph.pt'))
    save_file(edge_feats, osp.join(part_dir, 'edge_feats.pt'))
    del graph_file, edge_feats

    node_feats: Dict[str, Dict[str, Any]] = {}
    train: Dict[str, int] = {}
    for t in graph.node_types:
        start, end = int(node_ptr[t][i]), int(node_ptr[t][i + 1])
        input_ids = perm[t][start:end]
        if t in train_masks:
            train[t] = int(train_masks[t][input_ids].sum())
        if end == start:
            continue
        ids = torch.arange(start, end)
        node_feats[t] = {
            'global_id': ids,
            'id': ids.clone(),
            'feats': {k: v[input_ids]
                      for k, v in graph.node_attrs[t].items()},
        }
    save_file(node_feats, osp.join(part_dir, 'node_feats.pt'))
    return {
        'num_train_nodes': train or None,
        'num_halo_nodes': {
            t: int(torch.unique(torch.cat(rows)).numel()) if rows else 0
            for t, rows in halo.items()
        },
    }


def _manifest(graph: HeteroInput, num_parts: int, method: str, seed: int,
              balance_train: bool, num_moved: int, num_swapped: int,
              node_ptr: Dict[str, Tensor], node_sizes: Dict[str, Tensor],
              edges: Dict[EdgeType, Dict[str, Any]],
              part_stats: List[Dict[str, Any]],
              timings: Dict[str, float]) -> Dict[str, Any]:
    names = {e: edge_type_str(e) for e in graph.edge_types}
    total_nodes = sum(node_sizes.values(), torch.zeros(num_parts,
                                                       dtype=torch.long))
    total_edges = sum((edges[e]['sizes'] for e in graph.edge_types),
                      torch.zeros(num_parts, dtype=torch.long))
    num_edges = int(total_edges.sum())
    num_cut = sum(edges[e]['num_cut'] for e in graph.edge_types)
    parts = []
    for i, stats in enumerate(part_stats):
        train = stats['num_train_nodes']
        parts.append({
            'num_nodes': int(total_nodes[i]),
            'num_edges': int(total_edges[i]),
            'num_nodes_dict': {t: int(node_sizes[t][i])
                               for t in graph.node_types},
            'num_edges_dict': {names[e]: int(edges[e]['sizes'][i])
                               for e in graph.edge_types},
            'num_train_nodes': train,
            'num_remote_edges': sum(int(edges[e]['remote'][i])
                                    for e in graph.edge_types),
            'num_halo_nodes': stats['num_halo_nodes'],
        })
    balance = {
        'nodes_max_over_mean': round(max_over_mean(total_nodes), 4),
        'edges_max_over_mean': round(max_over_mean(total_edges), 4),
    }
    train_types = [t for t in graph.node_types
                   if parts[0]['num_train_nodes'] is not None
                   and t in parts[0]['num_train_nodes']]
    if train_types:
        train_counts = torch.tensor([
            sum(p['num_train_nodes'][t] for t in train_types) for p in parts
        ])
        balance['train_max_over_mean'] = round(max_over_mean(train_counts), 4)
    return {
        **manifest_header(),
        'is_hetero': True,
        'num_parts': num_parts,
        'method': method,
        'balance_train': balance_train,
        'train_swaps': num_swapped,
        'type_moves': num_moved,
        'seed': seed,
        'node_types': graph.node_types,
        'edge_types': [list(e) for e in graph.edge_types],
        'num_nodes': graph.total_nodes,
        'num_edges': num_edges,
        'num_nodes_dict': dict(graph.num_nodes),
        'num_edges_dict': {names[e]: graph.num_edges(e)
                           for e in graph.edge_types},
        'node_ptr': {t: node_ptr[t].tolist() for t in graph.node_types},
        'edge_ptr': {names[e]: edges[e]['ptr'].tolist()
                     for e in graph.edge_types},
        'parts': parts,
        'edge_cut': {
            'count': num_cut,
            'fraction': round(num_cut / num_edges, 6) if num_edges else 0.0,
            'per_type': {
                names[e]: {
                    'count': edges[e]['num_cut'],
                    'fraction': round(edges[e]['num_cut'] / graph.num_edges(
                        e), 6) if graph.num_edges(e) else 0.0,
                } for e in graph.edge_types
            },
        },
        'balance': balance,
        'balance_per_type': {
            'nodes': {t: round(max_over_mean(node_sizes[t]), 4)
                      for t in graph.node_types},
            'edges': {names[e]: round(max_over_mean(edges[e]['sizes']), 4)
                      for e in graph.edge_types},
        },
        'perm_files': {t: f'{PERM_DIR}/{t}.pt' for t in graph.node_types},
        'edge_perm_files': {names[e]: f'{EDGE_PERM_DIR}/{names[e]}.pt'
                            for e in graph.edge_types},
        'node_attr_names': {t: list(graph.node_attrs[t])
                            for t in graph.node_types},
        'edge_attr_names': {names[e]: list(graph.edge_attrs[e])
                            for e in graph.edge_types},
        'source': {
            'num_nodes': graph.total_nodes,
            'num_edges': num_edges,
            'node_attrs': {t: {k: tensor_info(v) for k, v in a.items()}
                           for t, a in graph.node_attrs.items()},
            'edge_attrs': {names[e]: {k: tensor_info(v)
                                      for k, v in a.items()}
                           for e, a in graph.edge_attrs.items()},
            'graph_attrs': graph.graph_attrs,
        },
        'time_s': timings,
    }
