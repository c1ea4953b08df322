"""Reading one part of a heterogeneous partition directory back:
:func:`pyg_sar.load_partition` returns a :class:`HeteroPartition` when
:obj:`META.json` says :obj:`is_hetero` (files read with
``torch.load(weights_only=True)`` and checked against the manifest)."""
import os.path as osp
from typing import Any, Dict, List, Tuple, Union

import torch
from torch import Tensor

from pyg_sar.partition.layout import MANIFEST_FILE, META_FILE, edge_type_str
from pyg_sar.partition.read.part_files import (PartFiles, check_rank,
                                               csc_edge_index, expect,
                                               expect_permutation,
                                               expect_vector, set_fields)

EdgeType = Tuple[str, str, str]


class _Subscript:
    """``part[node_type][attr]`` as PyG's ``data[node_type][attr]``: the
    attribute ``attr`` of the store (a field or a stored attribute)."""

    def __getitem__(self, key: str):
        if not isinstance(key, str) or key.startswith('_') or \
                not hasattr(self, key):
            raise KeyError(
                f"{type(self).__name__} has no attribute {key!r}; stored "
                f"attributes: {sorted(self._stored())}")
        return getattr(self, key)

    def __contains__(self, key: Any) -> bool:
        return isinstance(key, str) and key in self._stored()

    def keys(self) -> List[str]:
        """The stored attribute names (as PyG's ``store.keys()``)."""
        return list(self._stored())

    def _stored(self) -> Dict[str, Tensor]:
        return getattr(self, 'node_attrs', None) or getattr(
            self, 'edge_attrs', {})


class NodePart(_Subscript):
    r"""The local nodes of one node type in a :class:`HeteroPartition`.

    Part :obj:`rank` owns the new per-type ids :obj:`node_ptr[rank]` to
    :obj:`node_ptr[rank + 1] - 1` (:obj:`node_ids`); :obj:`orig_ids` are
    their input ids. Every node attribute of the type is a field (rows in
    local order) and an entry of :obj:`node_attrs`.
    """
    def __init__(self, node_type: str, rank: int, node_ptr: Tensor,
                 orig_ids: Tensor, node_attrs: Dict[str, Tensor]):
        self.node_type = node_type
        self.node_ptr = node_ptr
        self.num_nodes = int(node_ptr[-1])
        self.node_ids = torch.arange(int(node_ptr[rank]),
                                     int(node_ptr[rank + 1]))
        self.orig_ids = orig_ids
        self.node_attrs = node_attrs
        self.node_attr_names = list(node_attrs)
        set_fields(self, node_attrs)

    @property
    def num_local_nodes(self) -> int:
        return self.node_ids.numel()

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}('{self.node_type}', "
                f"num_local_nodes={self.num_local_nodes}, "
                f"num_nodes={self.num_nodes}, "
                f"node_attrs={self.node_attr_names})")


class EdgePart(_Subscript):
    r"""The local edges of one edge type in a :class:`HeteroPartition`: the
    in-edges of the part's destination nodes, in CSC order. The in-edges of
    local destination :obj:`v` (the :obj:`v`-th local node of the
    destination type) are :obj:`csc_src[csc_ptr[v]:csc_ptr[v + 1]]` (new
    per-type ids of the source type, ascending) with new per-type edge ids
    :obj:`csc_eid[...]` (contiguous: :obj:`edge_ptr[rank]` to
    :obj:`edge_ptr[rank + 1] - 1`) and input edge ids :obj:`orig_eids[...]`
    (columns of the input :obj:`edge_index` of the type). Every edge
    attribute is a field (rows in CSC order) and an entry of
    :obj:`edge_attrs`.
    """
    def __init__(self, edge_type: EdgeType, rank: int, edge_ptr: Tensor,
                 dst_ids: Tensor, csc_ptr: Tensor, csc_src: Tensor,
                 csc_eid: Tensor, orig_eids: Tensor,
                 edge_attrs: Dict[str, Tensor]):
        self.edge_type = edge_type
        self.edge_ptr = edge_ptr
        self.num_edges = int(edge_ptr[-1])
        self.dst_ids = dst_ids
        self.csc_ptr = csc_ptr
        self.csc_src = csc_src
        self.csc_eid = csc_eid
        self.orig_eids = orig_eids
        self.edge_attrs = edge_attrs
        self.edge_attr_names = list(edge_attrs)
        set_fields(self, edge_attrs)

    @property
    def num_local_edges(self) -> int:
        return self.csc_src.numel()

    @property
    def edge_index(self) -> Tensor:
        r"""The local edges as :obj:`[2, num_local_edges]` new per-type
        :obj:`(src, dst)` ids in CSC order."""
        return csc_edge_index(self.csc_ptr, self.csc_src, self.dst_ids)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.edge_type}, "
                f"num_local_edges={self.num_local_edges}, "
                f"num_edges={self.num_edges}, "
                f"edge_attrs={self.edge_attr_names})")


class HeteroPartition:
    r"""One part of a partitioned heterogeneous graph, as returned by
    :func:`pyg_sar.load_partition`.

    :obj:`part[node_type]` is a :class:`NodePart`, :obj:`part[edge_type]`
    (a :obj:`(src, rel, dst)` tuple or the :obj:`'src__rel__dst'` string)
    an :class:`EdgePart`. Node and edge ids are per type; see
    :func:`pyg_sar.partition.write.heterogeneous.partition_hetero_graph`.
    """
    is_hetero = True

    def __init__(self, root: str, rank: int, num_parts: int,
                 nodes: Dict[str, NodePart], edges: Dict[EdgeType, EdgePart],
                 fingerprint: str, manifest: Dict[str, Any]):
        self.root = root
        self.rank = rank
        self.num_parts = num_parts
        self.node_types: List[str] = list(nodes)
        self.edge_types: List[EdgeType] = list(edges)
        self.fingerprint = fingerprint
        self.manifest = manifest
        self._nodes = nodes
        self._edges = edges
        self._edge_names = {edge_type_str(e): e for e in edges}

    def metadata(self) -> Tuple[List[str], List[EdgeType]]:
        return list(self.node_types), list(self.edge_types)

    def __getitem__(self, key: Union[str, EdgeType]
                    ) -> Union[NodePart, EdgePart]:
        if isinstance(key, tuple):
            if key in self._edges:
                return self._edges[key]
        elif key in self._nodes:
            return self._nodes[key]
        elif key in self._edge_names:
            return self._edges[self._edge_names[key]]
        raise KeyError(f"{key!r} is neither a node type {self.node_types} "
                       f"nor an edge type {self.edge_types} of this "
                       f"partition")

    def __contains__(self, key: Any) -> bool:
        try:
            self[key]
        except (KeyError, TypeError):
            return False
        return True

    def _attr_dict(self, name: str) -> Dict[str, Tensor]:
        return {t: store.node_attrs[name] for t, store in self._nodes.items()
                if name in store.node_attrs}

    @property
    def x_dict(self) -> Dict[str, Tensor]:
        return self._attr_dict('x')

    @property
    def y_dict(self) -> Dict[str, Tensor]:
        return self._attr_dict('y')

    def node_attrs(self, name: str) -> Dict[str, Tensor]:
        r"""The node attribute :obj:`name` of every type that has it."""
        return self._attr_dict(name)

    @property
    def num_nodes_dict(self) -> Dict[str, int]:
        return {t: store.num_nodes for t, store in self._nodes.items()}

    @property
    def num_local_nodes_dict(self) -> Dict[str, int]:
        return {t: store.num_local_nodes for t, store in self._nodes.items()}

    @property
    def num_edges_dict(self) -> Dict[EdgeType, int]:
        return {e: store.num_edges for e, store in self._edges.items()}

    def __repr__(self) -> str:
        nodes = {t: s.num_local_nodes for t, s in self._nodes.items()}
        edges = {edge_type_str(e): s.num_local_edges
                 for e, s in self._edges.items()}
        return (f'{self.__class__.__name__}(rank={self.rank}/'
                f'{self.num_parts}, num_local_nodes={nodes}, '
                f'num_local_edges={edges})')


def _empty_like_info(info: Dict[str, Any]) -> Tensor:
    dtype = getattr(torch, str(info['dtype']).replace('torch.', ''))
    return torch.empty([0, *info['shape'][1:]], dtype=dtype)


def _typed_feats(path: str, feats: Dict[Any, Any], key: Any, ids: Tensor,
                 names: List[str], infos: Dict[str, Any]
                 ) -> Dict[str, Tensor]:
    r"""The attributes of one type in a loaded ``node_feats.pt`` or
    ``edge_feats.pt``, checked: global ids :obj:`ids`, exactly the
    attributes :obj:`names`. A type without local rows may be absent."""
    if key not in feats:
        expect(ids.numel() == 0, path, f'{key!r} is missing')
        return {name: _empty_like_info(infos[name]) for name in names}
    entry = feats[key]
    expect(isinstance(entry, dict) and 'global_id' in entry
            and isinstance(entry.get('feats'), dict), path,
            f"{key!r} should hold 'global_id' and 'feats'")
    expect_vector(entry['global_id'], ids.numel(), path,
                   f'{key!r} global_id')
    expect(torch.equal(entry['global_id'], ids), path,
            f"{key!r} global_id is not [{int(ids[0])}, {int(ids[-1]) + 1})")
    attrs = entry['feats']
    expect(sorted(attrs) == sorted(names), path,
            f'{key!r}: expected attributes {names}')
    for name, value in attrs.items():
        expect(isinstance(value, Tensor) and value.dim() > 0
                and value.size(0) == ids.numel(), path,
                f"{key!r} '{name}' should have {ids.numel()} rows")
    return {name: attrs[name] for name in names}


def load_hetero_partition(root: str, rank: int, meta: Dict[str, Any],
                          manifest: Dict[str, Any], fingerprint: str,
                          files: PartFiles) -> HeteroPartition:
    r"""Loads part :obj:`rank` of the heterogeneous partition in
    :obj:`root`; called by :func:`pyg_sar.load_partition` with the parsed
    :obj:`META.json` and manifest, which checks the content hashes of the
    files read (:meth:`PartFiles.verify`) before returning the part.

    Args:
        root (str): The partition directory.
        rank (int): The part to load.
        meta (dict): The parsed :obj:`META.json`.
        manifest (dict): The parsed :obj:`pyg_sar.json`.
        fingerprint (str): The digest of both files.
        files (PartFiles): Reads the files of :obj:`root`.
    """
    meta_path = osp.join(root, META_FILE)
    manifest_path = osp.join(root, MANIFEST_FILE)
    try:
        num_parts = int(manifest['num_parts'])
        node_types = [str(t) for t in manifest['node_types']]
        edge_types = [tuple(e) for e in manifest['edge_types']]
        names = [edge_type_str(e) for e in edge_types]
        node_ptr = {t: torch.tensor(manifest['node_ptr'][t],
                                    dtype=torch.long) for t in node_types}
        edge_ptr = {e: torch.tensor(manifest['edge_ptr'][n],
                                    dtype=torch.long)
                    for e, n in zip(edge_types, names)}
        perm_files = {t: manifest['perm_files'][t] for t in node_types}
        edge_perm_files = {e: manifest['edge_perm_files'][n]
                           for e, n in zip(edge_types, names)}
        node_names = {t: list(manifest['node_attr_names'][t])
                      for t in node_types}
        edge_names = {e: list(manifest['edge_attr_names'][n])
                      for e, n in zip(edge_types, names)}
        node_infos = {t: manifest['source']['node_attrs'][t]
                      for t in node_types}
        edge_infos = {e: manifest['source']['edge_attrs'][n]
                      for e, n in zip(edge_types, names)}
        num_nodes = {t: int(manifest['num_nodes_dict'][t])
                     for t in node_types}
        num_edges = {e: int(manifest['num_edges_dict'][n])
                     for e, n in zip(edge_types, names)}
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"Partition file '{manifest_path}' is corrupt "
                         f"(bad or missing field: {e})") from e
    expect(meta.get('num_parts') == num_parts, meta_path,
            f"num_parts={meta.get('num_parts')} but '{MANIFEST_FILE}' says "
            f"{num_parts}")
    expect(meta.get('node_types') == node_types and [
        tuple(e) for e in meta.get('edge_types') or []
    ] == edge_types, meta_path,
            f"node/edge types differ from those of '{MANIFEST_FILE}'")
    for key, ptr, count in [(t, node_ptr[t], num_nodes[t])
                            for t in node_types] + [
                                (e, edge_ptr[e], num_edges[e])
                                for e in edge_types]:
        expect(ptr.numel() == num_parts + 1 and int(ptr[0]) == 0
                and int(ptr[-1]) == count
                and bool((ptr[1:] >= ptr[:-1]).all()), manifest_path,
                f'node_ptr/edge_ptr of {key!r} do not match num_parts and '
                f'its count {count}')
    part_dir = check_rank(root, rank, num_parts)

    nodes: Dict[str, NodePart] = {}
    node_path = files.path(f'{part_dir}/node_feats.pt')
    node_feats = files.load(f'{part_dir}/node_feats.pt')
    expect(isinstance(node_feats, dict), node_path, 'expected a dictionary')
    for t in node_types:
        start, end = int(node_ptr[t][rank]), int(node_ptr[t][rank + 1])
        perm = files.load(perm_files[t], f'perm_files.{t}')
        expect_permutation(perm, num_nodes[t], files.path(perm_files[t]),
                            'perm')
        attrs = _typed_feats(node_path, node_feats, t,
                             torch.arange(start, end), node_names[t],
                             node_infos[t])
        nodes[t] = NodePart(t, rank, node_ptr[t], perm[start:end].clone(),
                            attrs)
        del perm
    del node_feats

    edges: Dict[EdgeType, EdgePart] = {}
    graph_path = files.path(f'{part_dir}/graph.pt')
    edge_path = files.path(f'{part_dir}/edge_feats.pt')
    graph = files.load(f'{part_dir}/graph.pt')
    expect(isinstance(graph, dict), graph_path, 'expected a dictionary')
    edge_feats = files.load(f'{part_dir}/edge_feats.pt')
    expect(isinstance(edge_feats, dict), edge_path, 'expected a dictionary')
    for e in edge_types:
        src, _, dst = e
        start, end = int(edge_ptr[e][rank]), int(edge_ptr[e][rank + 1])
        count = end - start
        expect(e in graph, graph_path, f'edge type {e} is missing')
        entry = graph[e]
        expect(isinstance(entry, dict) and all(
            k in entry for k in ('edge_id', 'row', 'col')), graph_path,
                f"{e} should hold 'edge_id', 'row' and 'col'")
        for key in ('edge_id', 'row', 'col'):
            expect_vector(entry[key], count, graph_path, f'{e} {key}')
        row, col, eid = entry['row'], entry['col'], entry['edge_id']
        dst_start = int(node_ptr[dst][rank])
        dst_end = int(node_ptr[dst][rank + 1])
        if count > 0:
            expect(int(col.min()) >= dst_start and int(col.max()) < dst_end,
                    graph_path, f'{e} destination ids outside '
                    f'[{dst_start}, {dst_end})')
            expect(int(row.min()) >= 0 and int(row.max()) < num_nodes[src],
                    graph_path, f'{e} source ids outside '
                    f'[0, {num_nodes[src]})')
            key = col * max(num_nodes[src], 1) + row
            expect(bool((key[1:] >= key[:-1]).all()), graph_path,
                    f'{e} edges are not sorted by (destination, source)')
            expect(torch.equal(eid, torch.arange(start, end)), graph_path,
                    f'{e} edge ids are not [{start}, {end})')
        csc_ptr = torch.zeros(dst_end - dst_start + 1, dtype=torch.long)
        torch.cumsum(torch.bincount(col - dst_start,
                                    minlength=dst_end - dst_start), dim=0,
                     out=csc_ptr[1:])
        name = edge_type_str(e)
        perm = files.load(edge_perm_files[e], f'edge_perm_files.{name}')
        expect_permutation(perm, num_edges[e],
                            files.path(edge_perm_files[e]), 'edge_perm')
        attrs = _typed_feats(edge_path, edge_feats, e,
                             torch.arange(start, end), edge_names[e],
                             edge_infos[e])
        edges[e] = EdgePart(e, rank, edge_ptr[e], nodes[dst].node_ids,
                            csc_ptr, row, eid, perm[start:end].clone(),
                            attrs)
        del perm
    return HeteroPartition(root, rank, num_parts, nodes, edges, fingerprint,
                           manifest)
