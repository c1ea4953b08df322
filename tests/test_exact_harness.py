"""The exactness harness (tests/_exact.py) fails where it must: rows put back
at the wrong node, a node held twice or by no rank, a parameter gradient
off by more than its tolerance, a rank missing a node type or a parameter;
and each mismatch is one line naming the case and the tensor."""
import pytest
import torch

from _exact import (BY_DTYPE, FLOAT32, FLOAT32_SCALED, Tol, assemble, close,
                    mismatches, report)


def _split_run():
    """A whole-graph result and the same split over two ranks that hold
    the nodes [3, 0] and [1, 4, 2]."""
    gen = torch.Generator().manual_seed(0)
    out, x_grad = torch.randn(5, 3, generator=gen), torch.randn(5, 2,
                                                              generator=gen)
    weight = torch.randn(3, 2, generator=gen)
    ids = [torch.tensor([3, 0]), torch.tensor([1, 4, 2])]
    got = [(out[i], x_grad[i], {'weight': part, 'bias': None})
           for i, part in zip(ids, (weight * 0.25, weight * 0.75))]
    return ids, got, (out, x_grad, {'weight': weight, 'bias': None})


def test_an_exact_split_run_has_no_mismatch():
    ids, got, expected = _split_run()
    assert mismatches('case', ids, got, expected, FLOAT32) == []
    report([])


def test_rows_are_put_back_by_global_id():
    ids, got, expected = _split_run()
    swapped = [ids[0].flip(0), ids[1]]  # rank 0's rows at each other's id
    lines = mismatches('sage mode=sar world=2', swapped, got, expected,
                       FLOAT32)
    assert len(lines) == 2, lines
    assert lines[0].startswith('sage mode=sar world=2 output: ')
    assert lines[1].startswith('sage mode=sar world=2 dL/dx: ')
    assert all('\n' not in line for line in lines)


@pytest.mark.parametrize('ids', [[torch.tensor([3, 0]), torch.tensor([1, 4])],
                                 [torch.tensor([3, 0, 1]),
                                  torch.tensor([1, 4, 2])]])
def test_a_node_missing_or_held_twice_fails(ids):
    rows = [torch.zeros(i.numel(), 2) for i in ids]
    with pytest.raises(AssertionError, match='for a graph of 5 nodes'):
        assemble(ids, rows, 5)


def test_parameter_gradients_are_summed_over_ranks():
    ids, got, expected = _split_run()
    got[1][2]['weight'] = got[1][2]['weight'] + 1e-3
    lines = mismatches('gat', ids, got, expected, FLOAT32)
    assert len(lines) == 1 and lines[0].startswith('gat dL/dweight: '), lines
    # A rank without a gradient adds nothing: the sum is rank 1's alone.
    got[1][2]['weight'] = None
    assert mismatches('gat', ids, got, expected, FLOAT32)[0].startswith(
        'gat dL/dweight: ')


def test_parameters_and_missing_gradients_are_checked():
    ids, got, expected = _split_run()
    del got[0][2]['bias']
    assert mismatches('gin', ids, got, expected, FLOAT32) == [
        "gin: rank 0 has parameters ['weight'], PyG ['bias', 'weight']"]
    assert mismatches('gin', ids, got, expected, FLOAT32, params='some') == []
    got[1][2]['bias'] = torch.zeros(3)  # PyG computes no gradient there
    assert mismatches('gin', ids, got, expected, FLOAT32, params='some') == [
        'gin dL/dbias: PyG has none, ranks [False, True] do']
    assert mismatches('gin', ids, got, expected, FLOAT32, params='some',
                      none_grads='skip') == []


def test_node_types_are_reassembled_one_by_one():
    ids, got, expected = _split_run()
    typed = [({'paper': g[0]}, {'paper': g[1]}, g[2]) for g in got]
    typed_ids = [{'paper': i} for i in ids]
    ref = ({'paper': expected[0]}, {'paper': expected[1]}, expected[2])
    assert mismatches('hgt', typed_ids, typed, ref, FLOAT32) == []
    typed[1][0]['author'] = torch.zeros(0, 3)
    assert mismatches('hgt', typed_ids, typed, ref, FLOAT32) == [
        "hgt output: rank 1 has node types ['author', 'paper'], PyG "
        "['paper']"]


def test_tolerances():
    big = torch.tensor([1000.0, 1.0])
    off = big + torch.tensor([0.0, 5e-3])
    # Absolute 1e-5 on the small entry: a mismatch; relative to the
    # largest entry (1000 x 1e-5 = 1e-2), none.
    assert close(off, big, FLOAT32, 'x')
    assert close(off, big, FLOAT32_SCALED, 'x') == []
    # An explicit scale replaces the tensor's own largest entry.
    assert close(off, big, FLOAT32_SCALED, 'x', scale=1.0)
    assert Tol(0.0, 1e-6, scaled=True, floor=10.0).atol_for(
        torch.zeros(3)) == pytest.approx(1e-5)
    # float64 tolerates only rounding.
    one = torch.ones(2, dtype=torch.float64)
    assert close(one + 1e-8, one, BY_DTYPE[torch.float64], 'x')
    assert close(one + 1e-12, one, BY_DTYPE[torch.float64], 'x') == []
    # A dtype that differs from PyG's is a mismatch.
    assert close(one.float(), one, BY_DTYPE[torch.float32], 'x')


def test_report_names_every_mismatch():
    with pytest.raises(AssertionError, match=r'2 mismatch\(es\):\na\nb'):
        report(['a', 'b'])
