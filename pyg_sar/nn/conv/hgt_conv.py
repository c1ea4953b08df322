"""``HGTConv``: the Heterogeneous Graph Transformer operator over a
:class:`~pyg_sar.graph.hetero_graph.HeteroDistGraph`."""
import math
from typing import Dict, Optional

import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch import Tensor

from pyg_sar.graph.hetero_graph import HeteroDistGraph
from pyg_sar.nn.message_passing import DistMessagePassing


class HGTConv(DistMessagePassing, pyg_nn.HGTConv):
    r"""The Heterogeneous Graph Transformer (HGT) operator from the
    `"Heterogeneous Graph Transformer" <https://arxiv.org/abs/2003.01332>`_
    paper, over a :class:`~pyg_sar.graph.hetero_graph.HeteroDistGraph`.

    .. math::
        \mathbf{h}_i = \sum_{r} \sum_{j \in \mathcal{N}_r(i)}
        \mathrm{softmax}_{j}\left( \frac{\mathbf{q}_i^\top
        \mathbf{W}^{K}_{r} \mathbf{k}_j \, \mu_r}{\sqrt{d}} \right)
        \mathbf{W}^{V}_{r} \mathbf{v}_j, \qquad
        \mathbf{x}^{\prime}_i = \beta\, \mathrm{Lin}(\mathrm{GELU}(
        \mathbf{h}_i)) + (1 - \beta)\, \mathbf{x}_i

    per head, with the softmax over every in-edge of :math:`i` across all
    relations and workers (the engine's online softmax over one merged graph
    of all relations, :mod:`pyg_sar.graph.hetero_merge`). Same constructor,
    parameters and ``state_dict`` as :class:`torch_geometric.nn.HGTConv`.

    Args:
        in_channels (int or Dict[str, int]): Size of each input sample of
            every node type, or ``-1`` for lazy initialization.
        out_channels (int): Size of each output sample.
        metadata (Tuple[List[str], List[Tuple[str, str, str]]]): The node
            and edge types (``HeteroData.metadata()``).
        heads (int, optional): Number of attention heads. (default: ``1``)

    Shapes:
        - **input:** node features ``x_dict`` of the local nodes of every
          node type :math:`(|\mathcal{V}_t^{(p)}|, F_t)` and the
          ``HeteroDistGraph``
        - **output:** a dict of node features :math:`(|\mathcal{V}_t^{(p)}|,
          F_{out})` for every node type that receives messages
    """
    attention = True
    message_is_identity = True
    message_parameters = ()

    def forward(self, x_dict: Dict[str, Tensor],
                graph: HeteroDistGraph) -> Dict[str, Optional[Tensor]]:
        if not isinstance(graph, HeteroDistGraph):
            raise TypeError(f"pyg_sar.nn.HGTConv expects a HeteroDistGraph "
                            f"(got {type(graph).__name__}); build one with "
                            f"pyg_sar.DistGraph(part) on a heterogeneous "
                            f"partition")
        C, H = self.out_channels, self.heads
        D = C // H
        kqv_dict = self.kqv_lin(x_dict)
        k_dict, q_dict, v_dict = {}, {}, {}
        for key, val in kqv_dict.items():
            k, q, v = torch.tensor_split(val, 3, dim=1)
            k_dict[key] = k.view(-1, H, D)
            q_dict[key] = q.view(-1, H, D)
            v_dict[key] = v.view(-1, H, D)
        q, _ = self._cat(q_dict)
        edge_types = list(graph.keys())
        k, v, _ = self._construct_src_node_feat(k_dict, v_dict,
                                                dict.fromkeys(edge_types))
        merged, relation, row = graph.merged(list(q_dict), edge_types)
        p_rel = torch.cat([self.p_rel['__'.join(e)] for e in edge_types])
        out = self.propagate(merged, k=k, q=q, v=v,
                             edge_attr=p_rel.index_select(0, relation))
        out = out.reshape(-1, C)
        out_dict = {}
        for node_type, start in row.items():
            if node_type in self.dst_node_types:
                out_dict[node_type] = out[start:start +
                                          q_dict[node_type].size(0)]
        a_dict = self.out_lin({t: F.gelu(h) for t, h in out_dict.items()})
        for node_type in out_dict:
            out = a_dict[node_type]
            if out.size(-1) == x_dict[node_type].size(-1):
                alpha = self.skip[node_type].sigmoid()
                out = alpha * out + (1 - alpha) * x_dict[node_type]
            out_dict[node_type] = out
        return out_dict

    def edge_score(self, k_j: Tensor, q_i: Tensor,
                   edge_attr: Tensor) -> Tensor:
        alpha = (q_i * k_j).sum(dim=-1) * edge_attr
        return alpha / math.sqrt(q_i.size(-1))

    def message(self, v_j: Tensor) -> Tensor:
        return v_j

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(-1, {self.out_channels}, '
                f'heads={self.heads})')
