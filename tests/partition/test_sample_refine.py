"""KaMinPar on a sample of the edges: the sample is symmetric, a subset of the
graph, about the asked share, reproducible by seed, and a ParHIP file the
KaMinPar child accepts; the rate rule samples only large graphs whose worst
case exceeds the budget; the refinement never raises the cut nor a part
above its cap; assign_parts with a sample gives a valid, balanced,
reproducible assignment whose stated cut is the whole graph's, and resumes
to the same parts."""
import numpy as np
import pytest
import torch

from pyg_sar.partition.assign import sample as sample_mod
from pyg_sar.partition.assign.kaminpar_child import _check_file
from pyg_sar.partition.assign.parts import assign_parts
from pyg_sar.partition.assign.refine import refine_cut
from pyg_sar.partition.assign.repair import max_part_size
from pyg_sar.partition.assign.sample import sample_rate, write_sampled_parhip
from pyg_sar.partition.assign.symmetric import CsrView, symmetric_csr
from pyg_sar.partition.input.edge_source import TensorEdgeSource
from pyg_sar.partition.workdir import WorkDir
from _graphs import hard_graph


def _source(num_nodes=400, seed=0):
    # hard_graph: directed, self loops, duplicates, isolated nodes.
    data = hard_graph(num_nodes, seed=seed)
    return TensorEdgeSource(data.edge_index, data.num_nodes)


def _pairs(view: CsrView):
    deg = view.rowptr[1:] - view.rowptr[:-1]
    row = torch.repeat_interleave(torch.arange(view.num_nodes), deg)
    col = torch.as_tensor(np.asarray(view.col, dtype=np.int64))
    return set(zip(row.tolist(), col.tolist()))


@pytest.mark.parametrize('rate', [0.3, 0.7])
def test_sample_is_a_symmetric_subset(tmp_path, rate):
    csr = symmetric_csr(_source(), chunk_edges=97)
    csr.chunk_edges = 53  # several chunks
    path = str(tmp_path / 's.parhip')
    info = write_sampled_parhip(csr, path, rate, seed=1)
    _check_file(path)  # the size KaMinPar's child checks
    sampled = CsrView.from_parhip(path)
    pairs, whole = _pairs(sampled), _pairs(csr)
    assert info['num_entries'] == len(pairs) == sampled.num_entries
    assert pairs <= whole
    assert all((v, u) in pairs for u, v in pairs)
    share = len(pairs) / len(whole)
    assert abs(share - rate) < 0.1
    # Rows stay sorted (KaMinPar reads sorted neighborhoods).
    for r in range(sampled.num_nodes):
        row = np.asarray(sampled.col[int(sampled.rowptr[r]):
                                     int(sampled.rowptr[r + 1])])
        assert np.all(np.diff(row.astype(np.int64)) > 0)
    # The seed fixes the sample; another seed gives another one.
    again = str(tmp_path / 'again.parhip')
    write_sampled_parhip(csr, again, rate, seed=1)
    assert open(again, 'rb').read() == open(path, 'rb').read()
    other = str(tmp_path / 'other.parhip')
    write_sampled_parhip(csr, other, rate, seed=2)
    assert _pairs(CsrView.from_parhip(other)) != pairs
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        'again.parhip', 'other.parhip', 's.parhip']


def test_whole_sample_is_the_graph(tmp_path):
    csr = symmetric_csr(_source(), chunk_edges=97)
    path = str(tmp_path / 's.parhip')
    write_sampled_parhip(csr, path, 1.0)
    assert _pairs(CsrView.from_parhip(path)) == _pairs(csr)


def test_rate_rule(monkeypatch):
    limit = sample_mod.SAMPLE_MIN_ENTRIES
    # Small graphs, and graphs whose worst case fits: the whole graph.
    assert sample_rate(limit - 1, (limit - 1) // 2) == 1.0
    assert sample_rate(limit, limit) == 1.0  # input already symmetric
    # A directed graph without reverse edges: about twice the entries.
    rate = sample_rate(2 * limit, limit)
    assert rate == pytest.approx(sample_mod.KAMINPAR_BYTES_PER_EDGE /
                                 (2 * sample_mod.KAMINPAR_BYTES_PER_ENTRY))
    assert 0 < rate < 1


def _cut(view, part):
    return view.edge_cut(part)


@pytest.mark.parametrize('num_parts', [2, 5])
def test_refinement_lowers_the_cut_within_the_cap(num_parts):
    csr = symmetric_csr(_source(600, seed=2), chunk_edges=101)
    n = csr.num_nodes
    part = torch.randint(num_parts, (n, ),
                         generator=torch.Generator().manual_seed(0))
    cap = max_part_size(n, num_parts)
    before, sizes_before = _cut(csr, part), torch.bincount(
        part, minlength=num_parts)
    refined = part.clone()
    moved = refine_cut(csr, refined, num_parts, cap, seed=3)
    assert moved >= int((refined != part).sum()) > 0
    assert _cut(csr, refined) < before
    sizes = torch.bincount(refined, minlength=num_parts)
    # No part grows above the cap (a part above it only shrinks).
    assert bool((sizes <= torch.maximum(sizes_before,
                                        torch.full_like(sizes, cap))).all())
    # Reproducible with the seed.
    again = part.clone()
    refine_cut(csr, again, num_parts, cap, seed=3)
    assert torch.equal(again, refined)


def test_refinement_keeps_a_full_part_from_growing():
    csr = symmetric_csr(_source(300, seed=4), chunk_edges=101)
    n = csr.num_nodes
    part = torch.zeros(n, dtype=torch.long)
    part[n // 2:] = 1
    cap = n - n // 2  # part 1 full, part 0 one below
    refined = part.clone()
    refine_cut(csr, refined, 2, cap, seed=0)
    sizes = torch.bincount(refined, minlength=2)
    assert int(sizes.max()) <= cap


@pytest.fixture
def kaminpar():
    pytest.importorskip('kaminpar')


@pytest.mark.parametrize('num_parts', [3, 4])
def test_assign_parts_with_a_sample(tmp_path, kaminpar, num_parts):
    source = _source(500, seed=5)
    mask = torch.rand(source.num_nodes,
                      generator=torch.Generator().manual_seed(0)) < 0.3
    runs = [assign_parts(source, num_parts, 'kaminpar', seed=7,
                         train_mask=mask, tmp_dir=str(tmp_path),
                         chunk_edges=64, sample=0.5) for _ in range(2)]
    (part, stats), (again, _) = runs
    assert torch.equal(part, again)  # one thread: reproducible
    assert stats['sample_rate'] == 0.5
    assert 'refine' in stats['timings'] and 'sample' in stats['timings']
    sizes = torch.bincount(part, minlength=num_parts)
    assert bool((sizes > 0).all())
    assert int(sizes.max()) <= max_part_size(source.num_nodes, num_parts)
    # The stated cut is the whole graph's.
    csr = symmetric_csr(source, chunk_edges=97)
    assert stats['edge_cut'] == csr.edge_cut(part)
    assert list(tmp_path.iterdir()) == []  # sample and scratch removed
    # The whole graph: no sample, no refinement.
    _, whole = assign_parts(source, num_parts, 'kaminpar', seed=7,
                            tmp_dir=str(tmp_path), chunk_edges=64)
    assert whole['sample_rate'] == 1.0
    assert 'refine' not in whole['timings']


@pytest.mark.parametrize('bad', [0, -0.5, 1.5])
def test_bad_sample(tmp_path, kaminpar, bad):
    with pytest.raises(ValueError, match=r"'sample' must lie in \(0, 1\]"):
        assign_parts(_source(), 2, 'kaminpar', tmp_dir=str(tmp_path),
                     sample=bad)


def test_sampled_run_resumes_to_the_same_parts(tmp_path, kaminpar):
    source = _source(400, seed=6)
    key = {'test': 'sample'}

    def run():
        with WorkDir(str(tmp_path / 'work'), key, resume=True) as work:
            return assign_parts(source, 3, 'kaminpar', seed=2,
                                tmp_dir=str(tmp_path), chunk_edges=64,
                                sample=0.6, work=work)

    first, _ = run()
    again, _ = run()  # every phase reused from the work directory
    assert torch.equal(first, again)


def test_refinement_makes_no_move_without_a_gain():
    # A cycle in runs of two: every node has one neighbor in its part and
    # one in the other, so no move lowers the cut.
    n = 200
    src = torch.arange(n)
    edges = torch.stack([src, (src + 1) % n])
    csr = symmetric_csr(TensorEdgeSource(edges, n), chunk_edges=37)
    part = (src // 2) % 2
    refined = part.clone()
    assert refine_cut(csr, refined, 2, n, seed=0) == 0
    assert torch.equal(refined, part)
