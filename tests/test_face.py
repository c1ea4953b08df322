"""What a new user meets first: the version, a fast ``--help``, real
signatures in ``help()``, the class count of a partition, and refusals that
name the fix (a stock layer given a ``DistGraph``; a layer of one's own that
subclasses ``MessagePassing``)."""
import inspect
import subprocess
import sys
import time

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric.nn import MessagePassing

import pyg_sar
from pyg_sar import cli, datasets, load_partition, partition_graph
from pyg_sar.nn import to_distributed


def test_version_and_help_are_fast_and_torch_free(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(['--version'])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f'pyg-sar {pyg_sar.__version__}'
    start = time.perf_counter()
    out = subprocess.run([sys.executable, '-m', 'pyg_sar.cli', '--help'],
                         capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - start
    assert out.returncode == 0, out.stderr
    for command in ('partition', 'info', 'train', 'demo'):
        assert command in out.stdout
    assert elapsed < 5.0, elapsed  # it imported torch before: 13.8 s


def test_public_constructors_show_their_real_signatures():
    from pyg_sar.loader import (DistHeteroNeighborLoader,
                                DistLinkNeighborLoader, DistNeighborLoader)
    graph = inspect.signature(pyg_sar.DistGraph)
    assert list(graph.parameters) == ['part', 'mode', 'chunk_size', 'device']
    from torch_geometric.loader import LinkNeighborLoader, NeighborLoader

    def positional(cls):
        return [name for name, p in inspect.signature(cls).parameters.items()
                if p.kind == p.POSITIONAL_OR_KEYWORD]
    # PyG's loaders' positional order, then pyg_sar's keyword-only extras.
    for cls in (DistNeighborLoader, DistHeteroNeighborLoader):
        assert positional(cls) == positional(NeighborLoader)
        keywords = inspect.signature(cls).parameters
        for name in ('batch_size', 'shuffle', 'num_workers', 'seed',
                     'pad_batches', 'ids', 'node_attrs'):
            assert keywords[name].kind == inspect.Parameter.KEYWORD_ONLY
    assert positional(DistLinkNeighborLoader) == \
        positional(LinkNeighborLoader)


@pytest.fixture(scope='module')
def one_part(tmp_path_factory):
    data = datasets.synthetic_graph(300, 5.0, 8, 3, seed=0)
    out = str(tmp_path_factory.mktemp('face') / 'parts')
    partition_graph(data, 1, out)
    return data, load_partition(out, 0)


def test_partition_knows_its_class_count(one_part):
    data, part = one_part
    assert part.num_classes == int(data.y.max()) + 1 == 3


def _with_graph(fn):
    """Calls ``fn()`` in a one-rank process group (the environment of
    ``torchrun`` set for the call only)."""
    import os
    from pyg_sar import comm
    saved = dict(os.environ)
    os.environ.update(RANK='0', WORLD_SIZE='1', LOCAL_RANK='0',
                      MASTER_ADDR='127.0.0.1',
                      MASTER_PORT=str(comm.find_free_port()))
    comm.init_distributed(backend='gloo')
    try:
        return fn()
    finally:
        comm.shutdown()
        os.environ.clear()
        os.environ.update(saved)


@pytest.mark.parametrize('make', [
    lambda: pyg_nn.GCNConv(8, 4),
    lambda: pyg_nn.SAGEConv(8, 4),
    lambda: pyg_nn.TransformerConv(8, 4),
    lambda: pyg_nn.ChebConv(8, 4, K=2),
])
def test_a_stock_layer_given_a_dist_graph_says_to_convert(one_part, make):
    _, part = one_part

    def run():
        graph = pyg_sar.DistGraph(part)
        conv = make()
        # The model meets pyg_sar (sync_params), which guards its stock
        # layers; no global hook (tests/nn/test_conversion.py).
        pyg_sar.sync_params(conv)
        with pytest.raises(TypeError) as error:
            conv(part.x, graph)
        message = str(error.value)
        assert message.startswith(f'{type(conv).__name__} is a stock PyG '
                                  f'layer and got a DistGraph')
        assert 'pyg_sar.nn.to_distributed(model)' in message
        # Converted, the same layer runs.
        out = to_distributed(conv)(part.x, graph)
        assert out.shape == (part.num_local_nodes, 4)

    _with_graph(run)


class _OwnLayer(MessagePassing):
    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)


def test_an_own_message_passing_layer_is_pointed_at_dist_message_passing():
    with pytest.raises(ValueError) as error:
        to_distributed(torch.nn.Sequential(_OwnLayer()))
    message = str(error.value)
    assert message.startswith("to_distributed: _OwnLayer at '0' has no "
                              "distributed version in pyg_sar")
    assert 'subclasses pyg_sar.nn.DistMessagePassing' in message


def test_a_dataset_that_cannot_be_downloaded_is_one_line(tmp_path, capsys,
                                                         monkeypatch):
    from torch_geometric.datasets import Planetoid

    def offline(self):  # what a machine without network gets
        raise OSError('[Errno -2] Name or service not known')

    monkeypatch.setattr(Planetoid, 'download', offline)
    code = cli.main(['partition', '--dataset', 'Cora', '--root',
                     str(tmp_path / 'data'), '--num-parts', '2', '--out',
                     str(tmp_path / 'parts')])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("pyg-sar partition: error: could not download "
                             "'Cora'"), err
    assert 'raw/ind.cora.' in err[0]


def test_training_a_graph_without_x_is_one_line(tmp_path):
    from pyg_sar.train import train
    data = datasets.synthetic_graph(200, 5.0, 8, 3, seed=0)
    del data.x
    out = str(tmp_path / 'parts')
    partition_graph(data, 1, out)

    def run():
        with pytest.raises(ValueError) as error:
            train(out, epochs=1, progress=False)
        assert str(error.value).startswith(
            f"partition {out!r} has no node attribute 'x'")

    _with_graph(run)
