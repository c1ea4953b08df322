"""A seeded heterogeneous graph shaped like ogbn-mag: papers, authors,
institutions and fields of study, with paper features and labels.

Relations and their sizes per paper follow ogbn-mag (736k papers, 1.13M
authors, 8.7k institutions, 60k fields; 7.1M writes, 5.4M cites, 1.0M
affiliations, 7.5M topics):

- ``('paper', 'cites', 'paper')``: the homophilous DC-SBM graph of
  :func:`pyg_sar.datasets.synthetic_graph` (both directions);
- ``('author', 'writes', 'paper')``: each paper has ``1 + Poisson`` authors,
  most of them working on the paper's class, drawn by power-law
  productivity;
- ``('author', 'affiliated_with', 'institution')``: one institution per
  author, power-law sized;
- ``('paper', 'has_topic', 'field_of_study')``: ``1 + Poisson`` fields per
  paper, most from its class's block of fields.

Generation is vectorized (no loop over nodes or edges), so millions of edges
take seconds. Only papers have features and labels, as in ogbn-mag.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor
from torch_geometric.data import HeteroData

from pyg_sar.datasets.synthetic import synthetic_graph

RELATIONS = (('author', 'writes', 'paper'), ('paper', 'cites', 'paper'),
             ('author', 'affiliated_with', 'institution'),
             ('paper', 'has_topic', 'field_of_study'))


def _power_law(num: int, generator: torch.Generator,
               exponent: float = 2.5) -> Tensor:
    uniform = torch.rand(num, generator=generator, dtype=torch.float64)
    return (1.0 - uniform).pow(-1.0 / (exponent - 1.0)).clamp_(
        max=math.sqrt(num) + 1)


def _draw(weight: Tensor, group_ptr: Tensor, group: Tensor,
          generator: torch.Generator) -> Tensor:
    """One member per entry of ``group``, drawn in proportion to ``weight``
    among the members of that group (members sorted by group,
    ``group_ptr`` their CSR pointer)."""
    cumsum = torch.cumsum(weight, 0)
    before = torch.cat([cumsum.new_zeros(1), cumsum])
    lower, upper = before[group_ptr[group]], before[group_ptr[group + 1]]
    target = lower + torch.rand(group.numel(), generator=generator,
                                dtype=torch.float64) * (upper - lower)
    return torch.searchsorted(cumsum, target, right=True).clamp_(
        max=weight.numel() - 1)


def _membership(num: int, num_groups: int, generator: torch.Generator
                ) -> Tensor:
    """CSR pointer of ``num`` members split into ``num_groups`` non-empty
    groups of random sizes (members are numbered group by group)."""
    proportions = torch.rand(num_groups, generator=generator) + 0.5
    sizes = (proportions / proportions.sum() *
             (num - num_groups)).floor().long() + 1
    sizes[:num - int(sizes.sum())] += 1
    ptr = torch.zeros(num_groups + 1, dtype=torch.long)
    torch.cumsum(sizes, 0, out=ptr[1:])
    return ptr


def _unique_pairs(src: Tensor, dst: Tensor, num_dst: int) -> Tensor:
    codes = torch.unique(src * num_dst + dst)
    return torch.stack([codes // num_dst, codes % num_dst])


def synthetic_hetero_graph(num_papers: int, num_features: int = 128,
                           num_classes: int = 16, seed: int = 0,
                           cites_per_paper: float = 7.3,
                           authors_per_paper: float = 2.6,
                           topics_per_paper: float = 10.2,
                           same_class: float = 0.8) -> HeteroData:
    r"""Generates the ogbn-mag-shaped :class:`HeteroData` described in the
    module docs.

    Args:
        num_papers (int): Papers; the other node types scale with it
            (authors 1.54x, institutions 1/85, fields 1/12).
        num_features (int): Paper feature dimension.
        num_classes (int): Paper classes (ogbn-mag: 349 venues).
        seed (int): Equal seeds give identical graphs.
        cites_per_paper, authors_per_paper, topics_per_paper (float): Mean
            edges per paper of each relation (ogbn-mag's by default).
        same_class (float): Fraction of a paper's authors and topics drawn
            from its own class.

    Returns:
        :class:`HeteroData` with ``paper.x``, ``paper.y``, paper train/val/
        test masks, ``num_nodes`` of every type and the four relations of
        :data:`RELATIONS` (no duplicate edges).
    """
    if num_papers < 2 or num_classes < 1:
        raise ValueError(f"'num_papers' must be >= 2 and 'num_classes' >= 1 "
                         f"(got {num_papers}, {num_classes})")
    generator = torch.Generator().manual_seed(seed)
    papers = synthetic_graph(num_papers, cites_per_paper, num_features,
                             num_classes, seed=seed)
    y = papers.y
    num_authors = max(num_classes, round(1.54 * num_papers))
    num_institutions = max(1, num_papers // 85)
    num_fields = max(num_classes, num_papers // 12)

    def per_paper(mean: float) -> Tensor:
        rate = torch.full((num_papers, ), max(mean - 1.0, 0.0),
                          dtype=torch.float64)
        return 1 + torch.poisson(rate, generator=generator).long()

    def class_edges(counts: Tensor, num_members: int) -> Tensor:
        """``(paper, member)`` pairs: ``counts[p]`` members per paper, a
        ``same_class`` share from the paper's class block of members."""
        ptr = _membership(num_members, num_classes, generator)
        weight = _power_law(num_members, generator)
        paper = torch.repeat_interleave(torch.arange(num_papers), counts)
        group = y[paper]
        member = _draw(weight, ptr, group, generator)
        anywhere = torch.rand(paper.numel(), generator=generator) >= \
            same_class
        member[anywhere] = _draw(weight, torch.tensor([0, num_members]),
                                 torch.zeros(int(anywhere.sum()),
                                             dtype=torch.long), generator)
        return _unique_pairs(paper, member, num_members)

    writes = class_edges(per_paper(authors_per_paper), num_authors).flip(0)
    topics = class_edges(per_paper(topics_per_paper), num_fields)
    institution = _draw(_power_law(num_institutions, generator),
                        torch.tensor([0, num_institutions]),
                        torch.zeros(num_authors, dtype=torch.long),
                        generator)
    affiliated = torch.stack([torch.arange(num_authors), institution])

    data = HeteroData()
    data['paper'].x = papers.x
    data['paper'].y = y
    for key in ('train_mask', 'val_mask', 'test_mask'):
        data['paper'][key] = papers[key]
    data['paper'].num_nodes = num_papers
    data['author'].num_nodes = num_authors
    data['institution'].num_nodes = num_institutions
    data['field_of_study'].num_nodes = num_fields
    for relation, edge_index in zip(RELATIONS, (writes, papers.edge_index,
                                                affiliated, topics)):
        data[relation].edge_index = edge_index
    return data
