r"""``HANConv``: the heterogeneous graph attention operator over a
:class:`~pyg_sar.graph.hetero_graph.HeteroDistGraph`."""
from typing import Dict, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch import Tensor

from pyg_sar import comm
from pyg_sar.graph.hetero_graph import HeteroDistGraph
from pyg_sar.nn.convert import register_composite
from pyg_sar.nn.message_passing import DistMessagePassing
from pyg_sar.nn.plain import register_stock


class HANConv(DistMessagePassing, pyg_nn.HANConv):
    r"""The heterogeneous graph attention operator from the
    `"Heterogenous Graph Attention Network"
    <https://arxiv.org/abs/1903.07293>`_ paper, over a
    :class:`~pyg_sar.graph.hetero_graph.HeteroDistGraph`.

    Node-level attention, per relation :math:`r = (s, \cdot, t)` and head:

    .. math::
        \mathbf{z}^{r}_i = \mathrm{ReLU}\Big( \sum_{j \in \mathcal{N}_r(i)}
        \mathrm{softmax}_j\big(\mathrm{LeakyReLU}(
        \mathbf{a}_{r,s}^{\top} \mathbf{W}_s \mathbf{x}_j +
        \mathbf{a}_{r,t}^{\top} \mathbf{W}_t \mathbf{x}_i)\big)
        \mathbf{W}_s \mathbf{x}_j \Big)

    then semantic attention over the relations into each node type
    :math:`t`, with a mean over **all** nodes of :math:`t`:

    .. math::
        \beta_r = \mathrm{softmax}_r \Big( \mathbf{q}^{\top}
        \frac{1}{|\mathcal{V}_t|} \sum_{i \in \mathcal{V}_t}
        \tanh(\mathbf{K} \mathbf{z}^{r}_i + \mathbf{b}) \Big), \qquad
        \mathbf{x}^{\prime}_i = \sum_r \beta_r \, \mathbf{z}^{r}_i

    The node-level softmax is the SAR engine's online softmax over all
    in-edges of :math:`i` across workers (as in
    :class:`~pyg_sar.nn.GATConv`); the mean over :math:`\mathcal{V}_t` sums
    the local rows and adds the sums of all workers
    (:func:`pyg_sar.comm.global_sum`, one ``[R, F_out]`` all-reduce per
    node type, differentiable). Same constructor, parameters and
    ``state_dict`` as :class:`torch_geometric.nn.HANConv` (metapath-free: the
    relations of the graph are its "metapaths").

    Args:
        in_channels (int or Dict[str, int]): Size of each input sample of
            every node type, or ``-1`` for lazy initialization.
        out_channels (int): Size of each output sample.
        metadata (Tuple[List[str], List[Tuple[str, str, str]]]): The node
            and edge types (``HeteroData.metadata()``).
        heads (int, optional): Number of attention heads. (default: ``1``)
        negative_slope (float, optional): LeakyReLU angle of the negative
            slope. (default: ``0.2``)
        dropout (float, optional): Dropout of the node-level attention
            probabilities. (default: ``0``)

    Shapes:
        - **input:** node features ``x_dict`` of the local nodes of every
          node type :math:`(|\mathcal{V}_t^{(p)}|, F_t)` and the
          ``HeteroDistGraph``
        - **output:** a dict of node features :math:`(|\mathcal{V}_t^{(p)}|,
          F_{out})` per node type (``None`` for a type no relation enters);
          with ``return_semantic_attention_weights=True`` also the dict of
          :math:`\beta` per node type (the same on every worker)
    """
    attention = True
    message_is_identity = True
    message_parameters = ()

    @property
    def attention_dropout(self) -> float:
        return self.dropout

    def forward(self, x_dict: Dict[str, Tensor], graph: HeteroDistGraph,
                return_semantic_attention_weights: bool = False
                ) -> Union[Dict[str, Optional[Tensor]],
                           Tuple[Dict[str, Optional[Tensor]],
                                 Dict[str, Optional[Tensor]]]]:
        if not isinstance(graph, HeteroDistGraph):
            raise TypeError(f"pyg_sar.nn.HANConv expects a HeteroDistGraph "
                            f"(got {type(graph).__name__}); build one with "
                            f"pyg_sar.DistGraph(part) on a heterogeneous "
                            f"partition")
        H, D = self.heads, self.out_channels // self.heads
        h_dict, z_dict = {}, {}
        for node_type, x in x_dict.items():
            _check_rows(graph, node_type, x)
            h_dict[node_type] = self.proj[node_type](x).view(-1, H, D)
            z_dict[node_type] = []
        for edge_type, relation in graph.items():
            src, _, dst = edge_type
            key = '__'.join(edge_type)
            h_src, h_dst = h_dict[src], h_dict[dst]
            alpha_src = (h_src * self.lin_src[key]).sum(dim=-1)
            alpha_dst = (h_dst * self.lin_dst[key]).sum(dim=-1)
            z = self.propagate(relation, x=h_src,
                               alpha=(alpha_src, alpha_dst))
            z_dict[dst].append(F.relu(z.reshape(-1, self.out_channels)))
        out_dict, beta_dict = {}, {}
        for node_type, zs in z_dict.items():
            total = int(graph.node_ptr_dict[node_type][-1]) if \
                node_type in graph.node_ptr_dict else 0
            out_dict[node_type], beta_dict[node_type] = semantic_attention(
                zs, self.q, self.k_lin, total)
        if return_semantic_attention_weights:
            return out_dict, beta_dict
        return out_dict

    def edge_score(self, alpha_j: Tensor, alpha_i: Tensor) -> Tensor:
        return F.leaky_relu(alpha_j + alpha_i, self.negative_slope)

    def message(self, x_j: Tensor) -> Tensor:
        return x_j

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.out_channels}, '
                f'heads={self.heads})')


def semantic_attention(zs: List[Tensor], q: Tensor, k_lin: torch.nn.Module,
                       num_nodes: int) -> Tuple[Optional[Tensor],
                                                Optional[Tensor]]:
    """PyG's ``group`` of ``HANConv`` with the mean over the ``num_nodes``
    nodes of the type on all workers (``zs``: one ``[N_local, F]`` tensor
    per relation). Collective whenever ``zs`` is not empty."""
    if len(zs) == 0:
        return None, None
    z = torch.stack(zs)
    if num_nodes == 0:
        return z.view(0, z.size(-1)), None
    mean = comm.global_sum(torch.tanh(k_lin(z)).sum(dim=1)) / num_nodes
    beta = F.softmax((q * mean).sum(dim=-1), dim=0)
    return torch.sum(beta.view(len(zs), 1, -1) * z, dim=0), beta


def _check_rows(graph: HeteroDistGraph, node_type: str, x: Tensor) -> None:
    n = graph.num_nodes_dict.get(node_type)
    if n is not None and x.size(0) != n:
        raise ValueError(f"HANConv: x_dict[{node_type!r}] has {x.size(0)} "
                         f"rows; expected {n} (the local {node_type!r} "
                         f"nodes of this worker)")


def _from_stock(module: pyg_nn.HANConv, path: str, strict: bool) -> HANConv:
    """A stock ``HANConv`` as :class:`HANConv`, holding the stock module's
    own submodules and parameters (lazy ones included)."""
    new = HANConv(module.in_channels, module.out_channels, module.metadata,
                  heads=module.heads, negative_slope=module.negative_slope,
                  dropout=module.dropout)
    for name in ('proj', 'lin_src', 'lin_dst', 'k_lin'):
        setattr(new, name, getattr(module, name))
    new.q = module.q
    return new.train(module.training)


register_composite(pyg_nn.HANConv, _from_stock)
# On a plain edge_index_dict: stock HANConv (pyg_sar.nn.plain).
register_stock(HANConv, pyg_nn.HANConv, lambda m: dict(
    in_channels=m.in_channels, out_channels=m.out_channels,
    metadata=m.metadata, heads=m.heads, negative_slope=m.negative_slope,
    dropout=m.dropout))
