"""The out-of-core symmetrization: the ParHIP file written a node range at a
time is byte for byte the in-memory one's, whatever the budget (ranges cut
mid-way, one row per range, one range), with duplicates, self loops,
isolated nodes and both directions present; the offsets are right when
deduplication brings the file under the 32-bit limit; and KaMinPar's
assignment is the same."""
import random

import pytest
import torch

from pyg_sar.partition.assign import symmetric as symmetric_mod
from pyg_sar.partition.assign.parts import assign_parts
from pyg_sar.partition.assign.symmetric import (CsrView, parhip_format,
                                                symmetric_csr, write_parhip)
from pyg_sar.partition.assign.symmetric_file import (BYTES_PER_ROW,
                                                     row_ranges,
                                                     write_symmetric_parhip)
from pyg_sar.partition.input.edge_source import TensorEdgeSource
from _graphs import hard_graph


def _messy(seed: int):
    # hard_graph: directed, self loops, duplicates, isolated nodes; plus
    # both directions of a third of the edges and trailing isolated nodes.
    data = hard_graph(150, seed=seed)
    ei = data.edge_index
    ei = torch.cat([ei, ei.flip(0)[:, ::3], ei[:, ::5]], dim=1)
    return TensorEdgeSource(ei, data.num_nodes + 4)


def _reference(source, path) -> bytes:
    write_parhip(symmetric_csr(source, chunk_edges=11), path)
    return open(path, 'rb').read()


@pytest.mark.parametrize('seed', [0, 1])
@pytest.mark.parametrize('budget', [1, 300, 2000, 10**9])
def test_file_is_the_in_memory_one(tmp_path, seed, budget):
    source = _messy(seed)
    expected = _reference(source, str(tmp_path / 'a'))
    info = write_symmetric_parhip(source, str(tmp_path / 'b'), budget,
                                  chunk_edges=13)
    assert open(tmp_path / 'b', 'rb').read() == expected
    assert not (tmp_path / 'b.tmp').exists()
    if budget == 1:  # every row a range of its own
        assert info['num_ranges'] == source.num_nodes
    elif budget == 10**9:
        assert info['num_ranges'] == 1
    else:
        assert 1 < info['num_ranges'] < source.num_nodes
    csr = CsrView.from_parhip(str(tmp_path / 'b'))
    assert csr.num_entries == info['num_entries']


def test_offsets_shrink_to_32_bit(tmp_path, monkeypatch):
    # Counted with its duplicates the file needs 64-bit offsets, without
    # them it does not: the neighbors written at the 64-bit position move.
    source = _messy(2)
    csr = symmetric_csr(source)
    n, m = csr.num_nodes, csr.num_entries
    upper = 2 * int((source.edge_index[0] != source.edge_index[1]).sum())
    limit = 24 + (n + 1) * 4 + (m + upper) * 2  # between the two sizes
    monkeypatch.setattr(symmetric_mod, 'PARHIP_32BIT_LIMIT', limit)
    assert parhip_format(n, upper)[2] == 8 and parhip_format(n, m)[2] == 4
    expected = _reference(source, str(tmp_path / 'a'))
    for budget in (500, 10**9):
        write_symmetric_parhip(source, str(tmp_path / 'b'), budget, 17)
        assert open(tmp_path / 'b', 'rb').read() == expected


def test_row_ranges_cover_within_budget():
    rng = random.Random(0)
    for _ in range(200):
        deg = torch.tensor([rng.choice([0, 1, 5, 40]) for _ in
                            range(rng.randint(1, 60))])
        budget = rng.randint(1, 400)
        ranges = list(row_ranges(deg, budget))
        assert ranges[0][0] == 0 and ranges[-1][1] == deg.numel()
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        for r0, r1 in ranges:
            cost = int(deg[r0:r1].sum()) * 4 + BYTES_PER_ROW * (r1 - r0)
            assert r1 > r0 and (cost <= budget or r1 == r0 + 1)
            if r1 < deg.numel():  # greedy: the next row would not fit
                assert cost + int(deg[r1]) * 4 + BYTES_PER_ROW > budget


def test_bad_budget(tmp_path):
    with pytest.raises(ValueError, match="'budget_bytes' must be a positive"):
        write_symmetric_parhip(_messy(0), str(tmp_path / 'b'), 0)


def test_kaminpar_assignment_is_the_same(tmp_path):
    pytest.importorskip('kaminpar')
    source = _messy(3)
    mask = torch.rand(source.num_nodes,
                      generator=torch.Generator().manual_seed(0)) < 0.3
    parts = [assign_parts(source, 3, 'kaminpar', seed=5, train_mask=mask,
                          tmp_dir=str(tmp_path), chunk_edges=19,
                          symmetrize_budget=budget)
             for budget in (1, 400, None)]
    for part, stats in parts[1:]:
        assert torch.equal(part, parts[0][0])
        assert stats['edge_cut'] == parts[0][1]['edge_cut']
    assert list(tmp_path.iterdir()) == []  # temporary files removed
