"""The manifest of a partition directory (``pyg_sar.json``), read and
checked: :func:`read_bytes` and :func:`parse_json` read it (the loader
hashes the bytes), :func:`check_format` refuses another format or version,
and :func:`check_schema` checks fields against a spec, such as the fields
a summary of the partition reads (:func:`check_summary`, what ``pyg-sar
info`` prints), so that a corrupt manifest is a one-line error naming the
field."""
import json
import os.path as osp
from typing import Any, Dict

from pyg_sar.partition.layout import FORMAT_NAME, FORMAT_VERSION


def read_bytes(path: str) -> bytes:
    r"""The bytes of the partition file :obj:`path` (missing: a one-line
    :class:`FileNotFoundError`)."""
    if not osp.isfile(path):
        raise FileNotFoundError(f"Partition file '{path}' is missing")
    with open(path, 'rb') as f:
        return f.read()


def parse_json(raw: bytes, path: str) -> Dict[str, Any]:
    r"""The JSON object in :obj:`raw`, read from :obj:`path` (anything else:
    a one-line :class:`ValueError` naming the file)."""
    try:
        obj = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"Partition file '{path}' is corrupt (invalid "
                         f"JSON: {e})") from e
    if not isinstance(obj, dict):
        raise ValueError(f"Partition file '{path}' is corrupt (expected a "
                         f"JSON object)")
    return obj


NUMBER = (int, float)


def check_schema(value: Any, spec: Any, path: str, where: str = '') -> None:
    r"""Checks the parsed JSON :obj:`value` (read from :obj:`path`; at field
    :obj:`where`) against :obj:`spec`: a type or a tuple of types (a bool is
    no number), a :obj:`dict` of required fields (the key :obj:`'*'`: every
    field), or a one-element :obj:`list` (every element). A mismatch is a
    one-line :class:`ValueError` naming the field."""
    name = where or 'the manifest'
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            raise ValueError(f"Partition file '{path}' is corrupt: field "
                             f"'{name}' should be an object (got "
                             f"{_short(value)})")
        for key, item in spec.items():
            keys = list(value) if key == '*' else [key]
            for k in keys:
                field = f'{where}.{k}' if where else str(k)
                if k not in value:
                    raise ValueError(f"Partition file '{path}' is corrupt: "
                                     f"field '{field}' is missing")
                check_schema(value[k], item, path, field)
    elif isinstance(spec, list):
        if not isinstance(value, list):
            raise ValueError(f"Partition file '{path}' is corrupt: field "
                             f"'{name}' should be a list (got "
                             f"{_short(value)})")
        for i, item in enumerate(value):
            check_schema(item, spec[0], path, f'{where}[{i}]')
    else:
        types = spec if isinstance(spec, tuple) else (spec, )
        if not isinstance(value, types) or (isinstance(value, bool)
                                            and bool not in types):
            expected = ' or '.join('null' if t is type(None) else t.__name__
                                   for t in types)
            raise ValueError(f"Partition file '{path}' is corrupt: field "
                             f"'{name}' should be {expected} (got "
                             f"{_short(value)})")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + '...'


def check_format(manifest: Dict[str, Any], path: str) -> None:
    r"""Checks that the parsed manifest (read from :obj:`path`) is a
    partition manifest of this version of the format; an older one must be
    re-partitioned."""
    name, version = manifest.get('format'), manifest.get('format_version')
    if name != FORMAT_NAME:
        raise ValueError(f"Partition file '{path}' is not a partition "
                         f"manifest: 'format' is {name!r}, expected "
                         f"'{FORMAT_NAME}'")
    if version == FORMAT_VERSION:
        return
    written = f"pyg-sar {manifest.get('pyg_sar_version', '?')}"
    if type(version) is not int:
        raise ValueError(f"Partition file '{path}' is corrupt: "
                         f"'format_version' is {version!r}, expected "
                         f"{FORMAT_VERSION}")
    if version < FORMAT_VERSION:
        raise ValueError(
            f"Partition '{osp.dirname(path)}' has format version {version} "
            f"(written by {written}); this pyg-sar reads version "
            f"{FORMAT_VERSION} only: re-partition the graph (pyg-sar "
            f"partition / partition_graph)")
    raise ValueError(
        f"Partition '{osp.dirname(path)}' has format version {version} "
        f"(written by {written}), newer than this pyg-sar reads "
        f"({FORMAT_VERSION}): upgrade pyg-sar or re-partition the graph")


# The fields a summary of a partition reads, per kind (check_summary).
_ATTR_INFO = {'shape': list, 'dtype': str}
_SUMMARY_COMMON = {
    'pyg_sar_version': str, 'method': str, 'num_parts': int,
    'num_nodes': int, 'num_edges': int,
    'edge_cut': {'count': int, 'fraction': NUMBER},
    'balance': {'*': NUMBER}, 'time_s': {'*': NUMBER},
}
SUMMARY_HOMOGENEOUS = {
    **_SUMMARY_COMMON,
    'perm_file': str,
    'source': {'node_attrs': {'*': _ATTR_INFO},
               'edge_attrs': {'*': _ATTR_INFO}},
    'parts': [{'num_nodes': int, 'num_edges': int,
               'num_train_nodes': (int, type(None)),
               'num_remote_edges': int, 'num_halo_nodes': int}],
}
SUMMARY_HETERO = {
    **_SUMMARY_COMMON,
    'node_types': [str], 'edge_types': [[str]],
    'num_nodes_dict': {'*': int}, 'num_edges_dict': {'*': int},
    'edge_cut': {'count': int, 'fraction': NUMBER,
                 'per_type': {'*': {'fraction': NUMBER}}},
    'balance_per_type': {'nodes': {'*': NUMBER}, 'edges': {'*': NUMBER}},
    'source': {'node_attrs': {'*': {'*': _ATTR_INFO}},
               'edge_attrs': {'*': {'*': _ATTR_INFO}}},
    'parts': [{'num_nodes_dict': {'*': int}, 'num_edges_dict': {'*': int},
               'num_train_nodes': (dict, type(None)),
               'num_remote_edges': int, 'num_halo_nodes': {'*': int}}],
}


def check_summary(manifest: Dict[str, Any], path: str) -> bool:
    r"""Checks that the parsed manifest (read from :obj:`path`) is of this
    format and holds every field a summary of the partition reads, of the
    right type (:obj:`SUMMARY_HETERO` or :obj:`SUMMARY_HOMOGENEOUS`);
    returns whether the partition is heterogeneous."""
    check_format(manifest, path)
    hetero = manifest.get('is_hetero') is True
    check_schema(manifest, SUMMARY_HETERO if hetero else SUMMARY_HOMOGENEOUS,
                 path)
    return hetero
