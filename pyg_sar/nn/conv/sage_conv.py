from typing import Tuple, Union

import torch.nn.functional as F
from torch import Tensor
from torch.nn.parameter import UninitializedParameter
from torch_geometric.nn.dense.linear import Linear

from pyg_sar.graph import DistGraph
from pyg_sar.nn.message_passing import (DistMessagePassing, add_linear_,
                                        linear_of_aggregate)


class SAGEConv(DistMessagePassing):
    r"""The GraphSAGE operator from the `"Inductive Representation Learning on
    Large Graphs" <https://arxiv.org/abs/1706.02216>`_ paper, over a
    :class:`~pyg_sar.DistGraph`.

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{W}_1 \mathbf{x}_i + \mathbf{W}_2 \cdot
        \mathrm{aggr}_{j \in \mathcal{N}(i)} \mathbf{x}_j

    Same constructor, parameters and ``state_dict`` as
    :class:`torch_geometric.nn.SAGEConv`; ``aggr`` is ``"mean"``, ``"sum"``,
    ``"max"`` or ``"min"``. With ``project=True``, :math:`\mathbf{x}_j` is
    first mapped by :math:`\sigma(\mathbf{W}_3 \mathbf{x}_j + \mathbf{b})`.
    Mean and sum run on the engine's sparse linear path; max and min are
    exact across workers, ties included.
    """
    linear_message = True
    # Opt-in (pyg_sar.train.GNN sets it): where the layer does not widen its
    # input, aggregate lin_l(x) instead of applying lin_l to the aggregate.
    # Fewer columns are exchanged and multiplied, and no node-sized
    # aggregate is kept for backward. Off by default: PyG's order, and its
    # exchange of x itself.
    transform_first = False

    def __init__(self, in_channels: Union[int, Tuple[int, int]],
                 out_channels: int, aggr: str = 'mean',
                 normalize: bool = False, root_weight: bool = True,
                 project: bool = False, bias: bool = True, **kwargs) -> None:
        super().__init__(aggr=aggr, **kwargs)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.normalize = normalize
        self.root_weight = root_weight
        self.project = project
        if isinstance(in_channels, int):
            in_channels = (in_channels, in_channels)
        if project:
            self.lin = Linear(in_channels[0], in_channels[0], bias=True)
        self.lin_l = Linear(in_channels[0], out_channels, bias=bias)
        if root_weight:
            self.lin_r = Linear(in_channels[1], out_channels, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.project:
            self.lin.reset_parameters()
        self.lin_l.reset_parameters()
        if self.root_weight:
            self.lin_r.reset_parameters()

    def forward(self, x: Union[Tensor, Tuple[Tensor, Tensor]],
                graph: DistGraph) -> Tensor:
        x_src, x_dst = (x, x) if isinstance(x, Tensor) else x
        if self.project:
            x_src = self.lin(x_src).relu()
        if self._transform_first(x_src):
            # W_l mean_j x_j + b + W_r x_i == mean_j (W_l x_j) + (W_r x_i + b):
            # aggregating the narrower side moves and multiplies fewer
            # columns, no aggregate of x is kept for lin_l's backward (x
            # itself is), and the propagation adds into the root term's
            # memory (add_to): one node-sized output buffer in all.
            bias = self.lin_l.bias
            root = None
            if self.root_weight:
                root = F.linear(x_dst, self.lin_r.weight, bias)
                bias = None
            out = self.propagate(graph, x=F.linear(x_src, self.lin_l.weight),
                                 add_to=root)
            if bias is not None:
                out = out + bias
        else:
            # No copy of the aggregate kept for lin_l's backward where it
            # can be recomputed (an input that needs no gradient).
            out = linear_of_aggregate(
                self.lin_l, lambda: self.propagate(graph, x=x_src), (x_src, ))
            if self.root_weight:
                out = add_linear_(out, x_dst, self.lin_r)
        if self.normalize:
            out = F.normalize(out, p=2., dim=-1)
        return out

    def _transform_first(self, x_src: Tensor) -> bool:
        """Apply ``lin_l`` before aggregating (``transform_first``): equal
        up to float rounding for the linear aggregations, and no wider than
        aggregating first when the layer does not widen its input."""
        return (self.transform_first
                and self.aggr in ('mean', 'sum', 'add')
                and x_src.size(-1) >= self.out_channels
                and not isinstance(self.lin_l.weight,
                                   UninitializedParameter))

    def message(self, x_j: Tensor) -> Tensor:
        return x_j

    def message_weight(self):
        return None

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.in_channels}, '
                f'{self.out_channels}, aggr={self.aggr})')
