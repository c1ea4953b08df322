"""The on-disk layout of a partition directory: file names shared by the
writer (:mod:`pyg_sar.partition`) and the reader
(:mod:`pyg_sar.partition_load`)."""
import os.path as osp

MANIFEST_FILE = 'pyg_sar.json'
META_FILE = 'META.json'
PERM_FILE = 'perm.pt'
NODE_MAP_FILE = 'node_map.pt'
EDGE_MAP_FILE = 'edge_map.pt'
FORMAT_VERSION = 1
METHODS = ('metis', 'random')


def _part_dir(root: str, part: int) -> str:
    return osp.join(root, f'part_{part}')
