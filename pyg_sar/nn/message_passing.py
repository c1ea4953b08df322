"""``DistMessagePassing``: PyG's ``MessagePassing`` over a ``DistGraph``."""
from __future__ import annotations

from typing import Any, Optional, Sequence

from torch import Tensor
from torch_geometric.nn import MessagePassing

from pyg_sar.graph import DistGraph
from pyg_sar.nn import engine


class DistMessagePassing(MessagePassing):
    r"""Base class for message passing layers whose edges span workers.

    Subclasses write :meth:`message` (and :meth:`update`) exactly as for
    :class:`torch_geometric.nn.MessagePassing` and call
    ``self.propagate(graph, x=..., ...)`` with a :class:`pyg_sar.DistGraph`
    in place of ``edge_index``. Arguments read as ``*_j`` are fetched from the
    owners of the source nodes; ``*_i`` arguments are local; tensor arguments
    whose name starts with ``edge_`` are per-edge, in the graph's edge order;
    ``index`` and ``dim_size``/``size_i`` are filled in as in PyG. The
    aggregation is ``self.aggr`` (``"sum"``/``"add"``, ``"mean"``, ``"max"``
    or ``"min"``), exact across workers, over the first dimension of the
    messages (PyG's ``node_dim=0``).

    Class attributes that tell the engine what it may skip:

    * ``linear_message``: the message is linear in its ``*_j`` inputs with
      coefficients that need no gradient (no trainable parameter inside
      ``message``). The backward then sends ``A^T g`` back without
      re-fetching or recomputing anything. Define :meth:`message_weight`
      too when the message is ``w_e * x_j``: both directions then run as
      sparse matrix products.
    * ``message_parameters``: names of the parameters read inside
      ``message``/``edge_score`` (``None``: all of the module's). The
      rematerialized backward produces their gradients.
    * ``attention``: softmax aggregation. The subclass defines
      :meth:`edge_score` (pre-softmax logits ``[E, H]``) and ``message``
      returns values ``[E, H, C]``; the output is
      ``sum_j softmax_j(score) * value`` per destination and head, with the
      softmax taken over all in-edges across workers, and
      ``attention_dropout`` applied to the probabilities. With
      ``message_is_identity`` (``message(x_j)`` returns ``x_j`` of shape
      ``[N, H, C]``), values are aggregated by one sparse product per head
      and never gathered per edge.
    """
    linear_message: bool = False
    message_parameters: Optional[Sequence[str]] = None
    attention: bool = False
    attention_dropout: float = 0.0
    message_is_identity: bool = False

    def _set_jittable_templates(self, raise_on_error: bool = False) -> None:
        # PyG would render a propagate() template onto the concrete class,
        # replacing ours; distributed propagation is not template-generated.
        pass

    def propagate(self, graph: DistGraph, **kwargs: Any) -> Tensor:
        """Aggregates messages into every local node (see class docs)."""
        out = engine.propagate(self, graph, kwargs)
        return self.update(out)

    def message_weight(self, **kwargs: Any):
        """For a ``linear_message`` of the form ``w_e * x_j``: the per-edge
        weight ``w`` (``[E]`` in graph edge order), or ``None`` for all ones.
        Arguments are taken by name from ``propagate``'s keyword arguments.
        ``NotImplemented`` (the default) selects the generic linear path."""
        return NotImplemented

    def edge_score(self, *args: Any, **kwargs: Any) -> Tensor:
        """Attention logits ``[E, H]`` (only for ``attention = True``)."""
        raise NotImplementedError(
            f"{type(self).__name__} sets attention = True but does not "
            f"define edge_score()")
