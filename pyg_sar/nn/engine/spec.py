"""What one propagation is: the arguments a layer's message reads
(:class:`Signature`) and everything the engine needs besides the
differentiable inputs (:class:`Plan`). Built by :mod:`.plan`, run by
:mod:`.function` and the aggregator the plan names; this module imports
none of them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from torch import Tensor

from pyg_sar.graph import DistGraph


@dataclass
class Signature:
    """Which arguments a layer's message (and attention score) reads."""
    j_names: List[str]                 # ``x`` for an argument ``x_j``
    i_names: List[str]
    params: Dict[str, List[str]]       # method name -> its parameter names
    defaults: Dict[str, Any]


@dataclass
class Plan:
    """Everything one propagation needs besides its differentiable inputs,
    which the Function receives as a flat list and the plan names by slot."""
    module: Any
    graph: DistGraph
    aggr: str
    sig: Signature
    src_slots: Dict[str, int]
    dst_slots: Dict[str, int]
    edge_slots: Dict[str, int]
    param_slots: List[int]
    constants: Dict[str, Any]
    kind: str = 'general'          # 'general' | 'linear' | 'spmm' | 'attention'
    linear_weight: Optional[Tensor] = None
    # Attention whose values are the rows of this source tensor, unchanged:
    # aggregated with one sparse product per head, never gathered per edge.
    value_source: Optional[str] = None
    dropout: float = 0.0
    seed: int = 0
    # The spmm kind's output buffer, when the caller passed ``add_to``: the
    # aggregate is added into it in place (the Function marks it dirty).
    init_slot: Optional[int] = None
    # The aggregator class that runs it (picked by the plan's factory,
    # :func:`pyg_sar.nn.engine.plan.propagate`), called with the plan and
    # its inputs.
    aggregator: Any = None
    # ``(FusedScore, kernels)`` when the fused attention kernels run it.
    fused: Any = None


@dataclass
class FusedScore:
    """How an attention layer's ``edge_score`` decomposes, for the fused
    kernels (:mod:`.kernels`): returned by the layer's ``fused_score()``
    (``None``: not fusable as configured).

    ``kind`` ``'gat'``: ``lrelu(score_j + score_i [+ edge term])`` with
    ``[N, H]`` terms; ``'gatv2'``: ``att . lrelu(score_j + score_i [+ edge
    term])`` with ``[N, H, C]`` terms; ``'dot'``: ``(score_j [+ edge term])
    . score_dst_i / param`` with ``[N, H, C]`` terms (TransformerConv's keys
    and queries). ``param`` is the leaky ReLU's negative slope (``'gat'``,
    ``'gatv2'``) or the divisor (``'dot'``). ``score`` names the propagate
    argument read as ``<score>_j``, ``score_dst`` the one read as ``<...>_i``
    (``None``: ``score`` too); the values are the rows of the message's
    source argument. The layer's ``fused_edge_term(edge_rows)`` gives a
    chunk's edge term from the gathered rows of the ``edge`` argument
    (``None`` when there is none)."""
    kind: str
    score: str
    param: float
    att: Optional[Tensor] = None
    edge: Optional[str] = None
    score_dst: Optional[str] = None

    @property
    def dst(self) -> str:
        """The argument read as ``<dst>_i``."""
        return self.score_dst or self.score
