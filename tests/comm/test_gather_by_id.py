"""``pyg_sar.comm.all_gather_by_id``: every rank's rows in the order of
their ids, on every rank (ranks with no rows, bool and 2-D rows included),
and its refusals: repeated ids over ranks, differing dtypes or row shapes
across ranks (on every rank), malformed input."""
import pytest
import torch

from pyg_sar import comm
from _dist import run_workers

NUM = 11


def _whole():
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(NUM, 3, generator=gen),
            torch.rand(NUM, generator=gen) > 0.5,
            torch.randperm(NUM, generator=gen))


def _shares(world_size):  # rank -> its ids (the last rank of 3 has none)
    order = _whole()[2]
    cuts = {1: [NUM], 2: [4, NUM], 3: [6, NUM, NUM]}[world_size]
    starts = [0] + cuts[:-1]
    return [order[s:e] for s, e in zip(starts, cuts)]


def _worker(rank, world_size):
    x, mask, _ = _whole()
    ids = _shares(world_size)[rank]
    out = {'x': comm.all_gather_by_id(x[ids], ids),
           'mask': comm.all_gather_by_id(mask[ids], ids.int())}
    picked = ids[mask[ids]]  # a subset: sorted by id
    out['subset'] = comm.all_gather_by_id(x[picked], picked)
    return out


@pytest.mark.parametrize('world_size', [1, 2, 3])
def test_rows_come_back_in_id_order_on_every_rank(world_size):
    x, mask, _ = _whole()
    for r in run_workers(_worker, world_size):
        assert torch.equal(r['x'], x)
        assert r['mask'].dtype == torch.bool and torch.equal(r['mask'], mask)
        assert torch.equal(r['subset'], x[mask.nonzero().view(-1)])


def _refusals(rank, world_size, case):
    ids = _shares(world_size)[rank]
    rows = torch.zeros(ids.numel(), 2)
    if case == 'repeated':
        ids = torch.full_like(ids, 5)
    elif case == 'dtype' and rank == 1:
        rows = rows.double()
    elif case == 'shape' and rank == 1:
        rows = torch.zeros(ids.numel(), 3)
    comm.all_gather_by_id(rows, ids)


@pytest.mark.parametrize('case,message', [
    ('repeated', 'id 5 is held by more than one row'),
    ('dtype', 'dtype'), ('shape', 'row shape')])
def test_refusals_reach_every_rank(case, message):
    results = run_workers(_refusals, 2, case, expect_errors=True)
    for status, text in results:
        assert status == 'error' and message in text, text


def test_malformed_input_is_refused():
    with pytest.raises(ValueError, match='expected rows'):
        comm.all_gather_by_id(torch.zeros(3, 2), torch.arange(2))
    with pytest.raises(ValueError, match='expected rows'):
        comm.all_gather_by_id(torch.zeros(3), torch.zeros(3))
