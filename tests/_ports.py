"""What the tests of ported PyG example scripts share: a copy of the script
that runs one epoch (the one line changed, checked to be there once) next to
a copy of its dataset, as ``<root>/examples/<script>`` and
``<root>/<dataset folder>``, so that the script's relative paths hold."""
import os
import os.path as osp
import shutil

import pytest


def one_epoch_copy(root, script: str, data: str, data_to: str,
                   epochs: str) -> str:
    """Copies ``data`` to ``root/data_to`` (skipping the test when the
    dataset is absent) and writes ``root/examples/<script name>`` with its
    loop line ``epochs`` (``for epoch in range(1, K):``) running one epoch;
    returns the copy's path."""
    if not osp.isdir(data):
        pytest.skip(f'{osp.basename(data)} not found in {osp.dirname(data)} '
                    f'(the shared datasets folder)')
    shutil.copytree(data, osp.join(str(root), data_to))
    examples = osp.join(str(root), 'examples')
    os.makedirs(examples, exist_ok=True)
    with open(script) as f:
        source = f.read()
    assert source.count(epochs) == 1, f'{script}: expected one {epochs!r}'
    copy = osp.join(examples, osp.basename(script))
    with open(copy, 'w') as f:
        f.write(source.replace(epochs, 'for epoch in range(1, 2):'))
    return copy
