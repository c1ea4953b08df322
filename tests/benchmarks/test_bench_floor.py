"""benchmarks/floor.py: the compute floor and the profiler breakdown."""
import os.path as osp
import sys

import pytest
import torch

sys.path.insert(0, osp.join(osp.dirname(__file__), '..', '..',
                            'benchmarks'))  # from tests/benchmarks/
from floor import breakdown, category, measure_floor  # noqa: E402
from full_batch_worker import layer_dims  # noqa: E402


@pytest.mark.parametrize('model', ['sage', 'gat'])
def test_floor_counts_every_kernel(model):
    gen = torch.Generator().manual_seed(0)
    n, e = 300, 3000
    dst = torch.randint(0, n, (e,), generator=gen)
    src = torch.randint(0, n + 50, (e,), generator=gen)
    dims = layer_dims(model, 32, 64 if model == 'sage' else 32, 8, 2, 4)
    floor = measure_floor(model, dims, n, n + 50, dst, src, repeat=1)
    assert floor['dense'] > 0 and floor['sparse'] > 0
    assert (floor['attention'] > 0) == (model == 'gat')
    assert floor['total'] == pytest.approx(
        floor['dense'] + floor['sparse'] + floor['attention'])


def test_categories():
    assert category('aten::mm') == 'dense'
    assert category('aten::addmm') == 'dense'
    assert category('aten::sparse_sampled_addmm') == 'sparse'
    assert category('aten::index_add_') == 'sparse'
    assert category('gloo:all_to_all') == 'exchange'
    assert category('aten::mul') == 'elementwise'


def test_breakdown_adds_up_to_the_wall():
    x = torch.randn(200, 200, requires_grad=True)

    def epoch():
        (x @ x).relu().sum().backward()

    parts = breakdown(epoch)
    total = sum(parts[k] for k in ('dense', 'sparse', 'exchange',
                                   'elementwise', 'python_alloc'))
    assert parts['dense'] > 0 and parts['op_calls'] > 0
    assert total == pytest.approx(parts['profiled_s'], rel=1e-6)
