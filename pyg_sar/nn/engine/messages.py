"""Evaluating the layer on one chunk: the keyword arguments of ``message``
and ``edge_score`` gathered for the chunk's edges, and the messages (or
scores and values) computed from them, with or without autograd."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from pyg_sar.graph.blocks import EdgeChunk


class MessageMixin:
    """Owns ``_chunk_args``, ``_compute``, ``_named`` and ``_wants_grad`` of
    the runner: per-chunk argument gathering and message evaluation."""

    def _wants_grad(self, key: Tuple[str, Any]) -> bool:
        kind, ref = key
        slot_idx = self.plan.src_slots[ref] if kind == 'src' else ref
        return self.needs_grad[slot_idx]

    def _chunk_args(self, method: str, chunk: EdgeChunk,
                    tables: Dict[str, Tensor], made: Optional[Dict]
                    ) -> Dict[str, Any]:
        """The keyword arguments of ``method`` for one chunk. With ``made``
        (a dict, shared by the calls of one chunk), the gathered rows that
        need a gradient become autograd leaves recorded there as
        ``key -> (leaf, index)``: their gradients are scattered back with
        ``index``, so no full-size table gradient is built per chunk."""
        plan = self.plan
        args = {}
        for name in plan.sig.params[method]:
            base = name[:-2]
            if name.endswith('_j') and base in tables:
                key, table, index = ('src', base), tables[base], chunk.src
            elif name.endswith('_i') and base in plan.dst_slots:
                slot_idx = plan.dst_slots[base]
                key, table, index = (('dst', slot_idx),
                                     self.tensors[slot_idx], chunk.dst)
            elif name in plan.edge_slots:
                slot_idx = plan.edge_slots[name]
                key, table, index = (('edge', slot_idx),
                                     self.tensors[slot_idx], chunk.edge_pos)
            else:
                # index/ptr/size_i never reach the engine: such layers run
                # over whole neighborhoods (DistMessagePassing.propagate).
                if name in plan.constants:
                    args[name] = plan.constants[name]
                continue
            if made is not None and key in made:
                args[name] = made[key][0]
                continue
            rows = table.index_select(0, index)
            if made is not None and self._wants_grad(key):
                rows.requires_grad_()
                made[key] = (rows, index)
            args[name] = rows
        return args

    def _compute(self, chunk: EdgeChunk, tables: Dict[str, Tensor],
                 grad: bool) -> Tuple[Tuple[Tensor, ...], Dict]:
        """The chunk's messages (or ``(scores, values)`` for attention), and
        the gathered leaves they were computed from when ``grad``."""
        module = self.module
        made: Optional[Dict] = {} if grad else None
        with torch.set_grad_enabled(grad):
            if self.plan.kind == 'attention':
                outputs = (module.edge_score(**self._chunk_args(
                    'edge_score', chunk, tables, made)), )
                if self.plan.value_source is None:
                    outputs += (module.message(**self._chunk_args(
                        'message', chunk, tables, made)), )
            else:
                outputs = (module.message(**self._chunk_args(
                    'message', chunk, tables, made)), )
        return outputs, made

    def _named(self, tables: List[Tensor]) -> Dict[str, Tensor]:
        return dict(zip(self.src_names, tables))
