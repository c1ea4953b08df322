"""Reading one part of a partition directory back: :func:`load_partition`
returns a :class:`Partition` (files read with ``torch.load(weights_only=True)``
and checked against the manifest, their content hashes included)."""
import hashlib
import os
import os.path as osp
from typing import Any, Dict, Optional

import torch
from torch import Tensor

from pyg_sar.partition.layout import MANIFEST_FILE, META_FILE, NODE_MAP_FILE
from pyg_sar.partition.read.heterogeneous import load_hetero_partition
from pyg_sar.partition.read.manifest import (check_format, parse_json,
                                             read_bytes)
from pyg_sar.partition.read.part_files import (PartFiles, check_rank,
                                               csc_edge_index, expect,
                                               expect_permutation,
                                               expect_vector, set_fields)


class Partition:
    r"""One part of a partitioned graph, as returned by
    :func:`load_partition`.

    Part :obj:`rank` owns the new global node ids :obj:`node_ptr[rank]` to
    :obj:`node_ptr[rank + 1] - 1` and all edges pointing into them, stored in
    CSC order by local destination: the incoming edges of local node
    :obj:`v` are :obj:`csc_src[csc_ptr[v]:csc_ptr[v + 1]]` (global new source
    ids, ascending) with global new edge ids :obj:`csc_eid[...]` and input
    edge ids :obj:`orig_eids[...]` (columns of the input :obj:`edge_index`;
    :obj:`None` for a partition written before pyg_sar recorded them), as
    :obj:`orig_ids` are the input ids of the local nodes.

    Every node attribute of the input graph (:obj:`x`, :obj:`y`,
    :obj:`train_mask`, ...) is an attribute with rows in local order (see
    :obj:`node_attr_names`); likewise every edge attribute with rows in CSC
    order (see :obj:`edge_attr_names`). Both are also available through the
    :obj:`node_attrs` and :obj:`edge_attrs` dictionaries.
    """
    is_hetero = False

    def __init__(
        self,
        root: str,
        rank: int,
        num_parts: int,
        num_nodes: int,
        num_edges: int,
        node_ptr: Tensor,
        orig_ids: Tensor,
        node_map: Tensor,
        csc_ptr: Tensor,
        csc_src: Tensor,
        csc_eid: Tensor,
        node_attrs: Dict[str, Tensor],
        edge_attrs: Dict[str, Tensor],
        fingerprint: str,
        manifest: Dict[str, Any],
        orig_eids: Optional[Tensor] = None,
    ):
        self.root = root
        self.rank = rank
        self.num_parts = num_parts
        self.num_nodes = num_nodes
        self.num_edges = num_edges
        self.node_ptr = node_ptr
        self.node_ids = torch.arange(int(node_ptr[rank]),
                                     int(node_ptr[rank + 1]))
        self.orig_ids = orig_ids
        self.node_map = node_map
        self.csc_ptr = csc_ptr
        self.csc_src = csc_src
        self.csc_eid = csc_eid
        self.orig_eids = orig_eids
        self.node_attrs = node_attrs
        self.edge_attrs = edge_attrs
        self.node_attr_names = list(node_attrs)
        self.edge_attr_names = list(edge_attrs)
        self.fingerprint = fingerprint
        self.manifest = manifest
        set_fields(self, {**node_attrs, **edge_attrs})

    @property
    def num_classes(self) -> Optional[int]:
        r"""The class count of the whole graph's labels :obj:`y` (recorded
        by :func:`~pyg_sar.partition_graph`: :obj:`y.max() + 1` of integer
        labels, the width of a multi-label target), or :obj:`None` without
        labels."""
        return self.manifest.get('num_classes')

    @property
    def num_features(self) -> int:
        r"""The width of the node features :obj:`x` (:obj:`0` without
        them), as PyG's :obj:`Data.num_features`."""
        x = self.node_attrs.get('x')
        return 0 if x is None else (1 if x.dim() == 1 else int(x.size(-1)))

    @property
    def num_node_features(self) -> int:
        r"""The same as :obj:`num_features`, as in PyG's :obj:`Data`."""
        return self.num_features

    @property
    def num_local_nodes(self) -> int:
        return self.node_ids.numel()

    @property
    def num_local_edges(self) -> int:
        return self.csc_src.numel()

    @property
    def edge_index(self) -> Tensor:
        r"""The local edges as :obj:`[2, num_local_edges]` global
        :obj:`(src, dst)` ids in CSC order."""
        return csc_edge_index(self.csc_ptr, self.csc_src, self.node_ids)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(rank={self.rank}/'
                f'{self.num_parts}, num_local_nodes={self.num_local_nodes}, '
                f'num_local_edges={self.num_local_edges}, '
                f'num_nodes={self.num_nodes}, num_edges={self.num_edges}, '
                f'node_attrs={self.node_attr_names}, '
                f'edge_attrs={self.edge_attr_names})')


def load_partition(root: str, rank: int) -> Partition:
    r"""Loads part :obj:`rank` of the partition written to :obj:`root` by
    :func:`partition_graph`: a :class:`Partition`, or a
    :class:`~pyg_sar.partition.read.heterogeneous.HeteroPartition` when the
    partition is heterogeneous (:obj:`META.json` says :obj:`is_hetero`).

    Only the files of this part and the shared files it needs are read
    (:obj:`META.json`, :obj:`pyg_sar.json`, the node map and the node
    permutation(s)), each with :obj:`torch.load(weights_only=True)`, from
    inside :obj:`root` only, and checked against :obj:`META.json` and
    :obj:`pyg_sar.json`: its contents, and its bytes against the content
    hash the partitioner recorded. A missing, corrupt, modified or
    inconsistent file raises a one-line error that names it; a partition
    of an older format asks to re-partition.
    """
    root = os.fspath(root)
    if not osp.isdir(root):
        raise FileNotFoundError(f"Partition directory '{root}' does not "
                                f"exist")
    meta_path = osp.join(root, META_FILE)
    manifest_path = osp.join(root, MANIFEST_FILE)
    meta_bytes = read_bytes(meta_path)
    manifest_bytes = read_bytes(manifest_path)
    meta = parse_json(meta_bytes, meta_path)
    manifest = parse_json(manifest_bytes, manifest_path)
    check_format(manifest, manifest_path)
    # The content hashes are part of the manifest, so ranks that agree on
    # the fingerprint agree on every file they read.
    fingerprint = hashlib.sha256(meta_bytes + b'\0' +
                                 manifest_bytes).hexdigest()
    files = PartFiles(root, manifest)
    files.check_bytes(META_FILE, meta_bytes)

    if meta.get('is_hetero') is True:
        part = load_hetero_partition(root, rank, meta, manifest,
                                     fingerprint, files)
    else:
        part = _load_homogeneous(root, rank, meta, manifest, fingerprint,
                                 files)
    files.verify()
    return part


def _load_homogeneous(root: str, rank: int, meta: Dict[str, Any],
                      manifest: Dict[str, Any], fingerprint: str,
                      files: PartFiles) -> Partition:
    r""":func:`load_partition` of a homogeneous partition."""
    meta_path = osp.join(root, META_FILE)
    manifest_path = osp.join(root, MANIFEST_FILE)
    try:
        num_parts = int(manifest['num_parts'])
        num_nodes = int(manifest['num_nodes'])
        num_edges = int(manifest['num_edges'])
        node_ptr = torch.tensor(manifest['node_ptr'], dtype=torch.long)
        edge_ptr = torch.tensor(manifest['edge_ptr'], dtype=torch.long)
        perm_file = manifest['perm_file']
        node_attr_names = list(manifest['node_attr_names'])
        edge_attr_names = list(manifest['edge_attr_names'])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"Partition file '{manifest_path}' is corrupt "
                         f"(bad or missing field: {e})") from e
    num_classes = manifest.get('num_classes')
    expect(num_classes is None or (type(num_classes) is int
                                    and num_classes >= 0), manifest_path,
            f"'num_classes' must be a non-negative integer or null (got "
            f"{num_classes!r})")
    expect(meta.get('num_parts') == num_parts, meta_path,
            f"num_parts={meta.get('num_parts')} but '{MANIFEST_FILE}' says "
            f"{num_parts}")
    expect(meta.get('is_hetero') is False, meta_path,
            'expected a homogeneous partition (is_hetero false)')
    expect(node_ptr.numel() == num_parts + 1 and int(node_ptr[-1])
            == num_nodes and edge_ptr.numel() == num_parts + 1
            and int(edge_ptr[-1]) == num_edges, manifest_path,
            'node_ptr/edge_ptr do not match num_parts, num_nodes, num_edges')

    part_dir = check_rank(root, rank, num_parts)

    node_start, node_end = int(node_ptr[rank]), int(node_ptr[rank + 1])
    edge_start, edge_end = int(edge_ptr[rank]), int(edge_ptr[rank + 1])
    num_local_nodes = node_end - node_start
    num_local_edges = edge_end - edge_start

    node_map = files.load(NODE_MAP_FILE)
    expect_vector(node_map, num_nodes, files.path(NODE_MAP_FILE),
                   'node_map')

    perm = files.load(perm_file, 'perm_file')
    expect_permutation(perm, num_nodes, files.path(perm_file), 'perm')
    orig_ids = perm[node_start:node_end].clone()
    del perm

    graph_name = f'{part_dir}/graph.pt'
    graph_path = files.path(graph_name)
    graph = files.load_dict(graph_name, ('edge_id', 'row', 'col', 'size'))
    for key in ('edge_id', 'row', 'col'):
        expect_vector(graph[key], num_local_edges, graph_path, key)
    csc_src, col, csc_eid = graph['row'], graph['col'], graph['edge_id']
    orig_eids = graph.get('orig_edge_id')  # None: written before it was
    if orig_eids is not None:
        expect_vector(orig_eids, num_local_edges, graph_path, 'orig_edge_id')
        expect(num_local_edges == 0 or (int(orig_eids.min()) >= 0 and
                                        int(orig_eids.max()) < num_edges),
               graph_path, f'orig_edge_id outside [0, {num_edges})')
    if num_local_edges > 0:
        expect(
            int(col.min()) >= node_start and int(col.max()) < node_end,
            graph_path, f'destination ids outside [{node_start}, '
            f'{node_end})')
        expect(
            int(csc_src.min()) >= 0 and int(csc_src.max()) < num_nodes,
            graph_path, f'source ids outside [0, {num_nodes})')
        expect(bool((col[1:] >= col[:-1]).all()), graph_path,
                'edges are not sorted by destination')
    csc_ptr = torch.zeros(num_local_nodes + 1, dtype=torch.long)
    torch.cumsum(torch.bincount(col - node_start, minlength=num_local_nodes),
                 dim=0, out=csc_ptr[1:])

    node_attrs = files.load_feats(part_dir, 'node', num_local_nodes,
                                  node_attr_names)
    edge_attrs = files.load_feats(part_dir, 'edge', num_local_edges,
                                  edge_attr_names)

    return Partition(
        root=root,
        rank=rank,
        num_parts=num_parts,
        num_nodes=num_nodes,
        num_edges=num_edges,
        node_ptr=node_ptr,
        orig_ids=orig_ids,
        node_map=node_map,
        csc_ptr=csc_ptr,
        csc_src=csc_src,
        csc_eid=csc_eid,
        orig_eids=orig_eids,
        node_attrs={key: node_attrs[key]
                    for key in node_attr_names},
        edge_attrs={key: edge_attrs[key]
                    for key in edge_attr_names},
        fingerprint=fingerprint,
        manifest=manifest,
    )
