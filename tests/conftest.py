import os
import os.path as osp
import shutil

# Sleeping OpenMP threads, as ``import pyg_sar`` sets them before torch
# loads (pyg_sar/utils/openmp.py); test modules import torch first.
os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')

import pytest

# Test files of many multi-process runs each (20-190 s apiece on 2 cores):
# the exactness sweeps across world sizes, modes and models, the examples
# under torchrun, checkpoint kills and restarts, two-host runs. They carry
# the ``slow`` mark; ``pytest -m "not slow"`` runs the rest in about 4
# minutes (the whole suite takes about 20 on 2 cores).
SLOW_FILES = {
    'test_sar_exact.py', 'test_hetero_exact.py', 'test_memory_paths.py',
    'test_zoo_exact.py', 'test_mfg.py', 'test_quickstart.py',
    'test_engine_behaviour.py', 'test_multinode.py',
    'test_loader_pyg_call.py', 'test_trust_checkpoint.py',
    'test_hetero_loader.py', 'test_models_exact.py', 'test_link_exact.py',
    'test_checkpoint.py', 'test_hetero_zoo_exact.py',
    'test_zoo_refused_exact.py', 'test_pyg_idioms.py',
    'test_gps_exact.py', 'test_partition_kaminpar.py',
    'test_hetero_loader_parity.py', 'test_partition_ondisk.py',
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)

# Real datasets live next to the repository, never inside it.
SHARED_DATA = os.environ.get(
    'PYG_SAR_SHARED_DATA',
    osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), '..', 'shared',
             'data'))


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
