import os
import os.path as osp
import shutil
import sys

# Sleeping OpenMP threads, as ``import pyg_sar`` sets them before torch
# loads (pyg_sar/utils/openmp.py); test modules import torch first.
os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')

import pytest

# The shared helpers next to this file (_dist, _graphs, _hetero, _exact) are
# imported by their short names from every folder, and by the workers that
# run_workers spawns (they inherit sys.path). Appended, not prepended: the
# stage folders here (datasets, nn, ...) are packages, and must never hide
# an installed module of the same name.
TESTS = osp.dirname(osp.abspath(__file__))
if TESTS not in sys.path:
    sys.path.append(TESTS)

# Real datasets live next to the repository, never inside it.
SHARED_DATA = os.environ.get(
    'PYG_SAR_SHARED_DATA',
    osp.join(osp.dirname(TESTS), '..', 'shared', 'data'))


@pytest.fixture(scope='session')
def shared_data_root(tmp_path_factory) -> str:
    r"""A writable copy of ``../shared/data`` (PyG writes ``processed/``
    folders next to the raw files), made once per session. Skips the test
    when the folder is absent."""
    source = osp.normpath(SHARED_DATA)
    if not osp.isdir(source):
        pytest.skip(f"real datasets not available: '{source}' is absent "
                    f"(set PYG_SAR_SHARED_DATA to their folder)")
    root = tmp_path_factory.mktemp('shared_data') / 'data'
    shutil.copytree(source, root)
    return str(root)


@pytest.fixture(scope='module')
def hard_part(tmp_path_factory):
    r"""``(data, part)``: :func:`_graphs.hard_graph` (directed, self loops,
    duplicate edges, isolated nodes) partitioned into one part, for tests
    that need a :class:`~pyg_sar.DistGraph` without a process group."""
    import pyg_sar
    from _graphs import hard_graph
    data = hard_graph()
    root = str(tmp_path_factory.mktemp('parts'))
    pyg_sar.partition_graph(data, 1, root)
    return data, pyg_sar.load_partition(root, 0)
