"""The on-disk layout of a partition directory: file names shared by the
writer (:mod:`pyg_sar.partition.write`) and the reader
(:mod:`pyg_sar.partition.read`), homogeneous and heterogeneous."""
import os.path as osp

MANIFEST_FILE = 'pyg_sar.json'
META_FILE = 'META.json'
PERM_FILE = 'perm.pt'
NODE_MAP_FILE = 'node_map.pt'
EDGE_MAP_FILE = 'edge_map.pt'
# The manifest's 'format' and 'format_version': version 2 added the content
# hash of every file ('files'); a partition of another version is refused.
FORMAT_NAME = 'pyg_sar.partition'
FORMAT_VERSION = 2
METHODS = ('metis', 'kaminpar', 'random')


def part_path(root: str, part: int) -> str:
    """The folder of part ``part`` in the partition directory ``root``."""
    return osp.join(root, f'part_{part}')


# Heterogeneous partitions: one file per node type or edge type in these
# folders (PyG's names for the maps; ours for the node and edge
# permutations, new per-type id -> input id).
NODE_MAP_DIR = 'node_map'
EDGE_MAP_DIR = 'edge_map'
PERM_DIR = 'perm'
EDGE_PERM_DIR = 'edge_perm'


def edge_type_str(edge_type) -> str:
    r"""PyG's name of an edge type in file names and dictionary keys:
    :obj:`'src__rel__dst'`."""
    return '__'.join(edge_type)
