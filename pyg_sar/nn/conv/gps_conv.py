r"""``GPSConv``: PyG's graph transformer layer over a
:class:`~pyg_sar.DistGraph`, its global attention over all nodes of all
workers, exactly."""
from __future__ import annotations

import inspect
from typing import Optional

import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.nn.attention import PerformerAttention

from pyg_sar import comm
from pyg_sar.graph import DistGraph
from pyg_sar.nn.convert import convert_children, register_composite
from pyg_sar.nn.engine.global_attention import block_rows, global_attention

# PyG's generalized_kernel adds this to every kernel feature.
_PERFORMER_EPS = 0.001


class GPSConv(pyg_nn.GPSConv):
    r"""The GPS graph transformer layer (PyG's
    :class:`torch_geometric.nn.GPSConv`) over a :class:`~pyg_sar.DistGraph`.

    .. math::
        \mathbf{h}^{L} &= \mathrm{norm}_1\left(\mathrm{conv}(\mathbf{X},
        \mathcal{G}) + \mathbf{X}\right), \qquad
        \mathbf{h}^{A} = \mathrm{norm}_2\left(\mathrm{attn}(\mathbf{X})
        + \mathbf{X}\right) \\
        \mathbf{X}^{\prime} &= \mathrm{norm}_3\left(\mathbf{h} +
        \mathrm{MLP}(\mathbf{h})\right), \qquad \mathbf{h} = \mathbf{h}^{L}
        + \mathbf{h}^{A}

    where :math:`\mathrm{attn}` attends from every node to every node of
    its graph, on all workers: ``attn_type="multihead"`` is softmax
    attention (``torch.nn.MultiheadAttention``) computed with a ring of
    key/value blocks and an online softmax
    (:mod:`pyg_sar.nn.engine.global_attention`), ``attn_type="performer"``
    is PyG's ``PerformerAttention`` whose kernel sums
    :math:`\sum_j \phi(\mathbf{k}_j)^{\top}\mathbf{v}_j` and
    :math:`\sum_j \phi(\mathbf{k}_j)` are summed over workers (one
    all-reduce each). The local ``conv`` and the norms are converted by
    :func:`pyg_sar.nn.to_distributed` (``BatchNorm`` then uses whole-graph
    statistics), also when this class is built directly.

    Same constructor, parameters, buffers (the performer's random
    projection matrix included) and ``state_dict`` as PyG's. Attention
    dropout (``attn_kwargs={'dropout': p}``) in training is refused: PyG's
    mask over the :math:`N \times N` weights has no distributed equivalent.

    Args:
        channels (int): Size of each input sample.
        conv (MessagePassing, optional): The local message passing layer.
        heads (int, optional): Number of attention heads. (default: :obj:`1`)
        dropout (float, optional): Dropout probability of intermediate
            embeddings. (default: :obj:`0.`)
        act (str or Callable, optional): The activation of the MLP.
            (default: :obj:`"relu"`)
        act_kwargs (Dict[str, Any], optional): Arguments of :obj:`act`.
        norm (str or Callable, optional): The normalization.
            (default: :obj:`"batch_norm"`)
        norm_kwargs (Dict[str, Any], optional): Arguments of :obj:`norm`.
        attn_type (str): :obj:`"multihead"` or :obj:`"performer"`.
            (default: :obj:`"multihead"`)
        attn_kwargs (Dict[str, Any], optional): Arguments of the attention
            layer.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}_p|, F)` (local
          rows), a :class:`~pyg_sar.DistGraph`, graph of each local node
          ``batch`` :math:`(|\mathcal{V}_p|)` *(optional, sorted as PyG
          requires)*
        - **output:** node features :math:`(|\mathcal{V}_p|, F)`
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _convert_inner(self, '', True)

    def forward(self, x: Tensor, edge_index, batch: Optional[Tensor] = None,
                **kwargs) -> Tensor:
        if not isinstance(edge_index, DistGraph):
            return super().forward(x, edge_index, batch, **kwargs)
        graph = edge_index
        hs = []
        if self.conv is not None:  # Local MPNN.
            h = self.conv(x, graph, **kwargs)
            h = F.dropout(h, p=self.dropout, training=self.training)
            hs.append(self._norm(self.norm1, h + x, batch))
        h = self.global_attention(x, graph, batch)
        h = F.dropout(h, p=self.dropout, training=self.training)
        hs.append(self._norm(self.norm2, h + x, batch))
        out = sum(hs)
        out = out + self.mlp(out)
        return self._norm(self.norm3, out, batch)

    def _norm(self, norm, h: Tensor, batch: Optional[Tensor]) -> Tensor:
        if norm is None:
            return h
        return norm(h, batch=batch) if self.norm_with_batch else norm(h)

    def global_attention(self, x: Tensor, graph: DistGraph,
                         batch: Optional[Tensor]) -> Tensor:
        """The attention of the local rows ``x`` over all nodes of their
        graph on all workers (a collective)."""
        if isinstance(self.attn, PerformerAttention):
            return _performer(self.attn, x, batch)
        return _multihead(self.attn, x, batch, graph)


def _multihead(attn: torch.nn.MultiheadAttention, x: Tensor,
               batch: Optional[Tensor], graph: DistGraph) -> Tensor:
    if attn.training and attn.dropout > 0:
        raise ValueError(
            f"GPSConv: attention dropout {attn.dropout} "
            f"(attn_kwargs['dropout']) in training mode is not supported "
            f"distributed (PyG drops entries of the N x N attention "
            f"weights); use dropout=0 in the attention or model.eval()")
    C, H = attn.embed_dim, attn.num_heads
    d = C // H
    if attn._qkv_same_embed_dim:
        wq, wk, wv = attn.in_proj_weight.chunk(3)
    else:
        wq, wk, wv = attn.q_proj_weight, attn.k_proj_weight, \
            attn.v_proj_weight
    bq = bk = bv = None
    if attn.in_proj_bias is not None:
        bq, bk, bv = attn.in_proj_bias.chunk(3)
    n = x.shape[0]
    q = F.linear(x, wq, bq).view(n, H, d)
    k = F.linear(x, wk, bk).view(n, H, d)
    v = F.linear(x, wv, bv).view(n, H, d)
    extra_k, extra_v = [], []
    if attn.bias_k is not None:
        extra_k.append(attn.bias_k.reshape(1, H, d))
        extra_v.append(attn.bias_v.reshape(1, H, d))
    if attn.add_zero_attn:
        extra_k.append(x.new_zeros(1, H, d))
        extra_v.append(x.new_zeros(1, H, d))
    counts = (graph.node_ptr[1:] - graph.node_ptr[:-1]).tolist()
    block = block_rows(graph.chunk_size)
    o = global_attention(q, k, v, batch, counts, block,
                         torch.cat(extra_k) if extra_k else None,
                         torch.cat(extra_v) if extra_v else None)
    return attn.out_proj(o.reshape(n, C))


def _kernel(attn: PerformerAttention, t: Tensor) -> Tensor:
    """PyG's ``generalized_kernel``: ``kernel(t P^T) + eps``."""
    mat = attn.fast_attn.projection_matrix
    return attn.fast_attn.kernel(t @ mat.t()) + _PERFORMER_EPS


def _performer(attn: PerformerAttention, x: Tensor,
               batch: Optional[Tensor]) -> Tensor:
    n, H, c = x.shape[0], attn.heads, attn.head_channels
    q = _kernel(attn, attn.q(x).view(n, H, c))
    k = _kernel(attn, attn.k(x).view(n, H, c))
    v = attn.v(x).view(n, H, c)
    b = (torch.zeros(n, dtype=torch.long, device=x.device) if batch is None
         else batch.to(device=x.device, dtype=torch.long))
    num_graphs = 1
    if batch is not None:
        top = torch.tensor([int(b.max()) + 1 if n else 0])
        num_graphs = int(comm.all_reduce(top, 'max')[0])
    k_sum = k.new_zeros(num_graphs, H, k.shape[-1]).index_add(0, b, k)
    # Runs of equal graph ids (one run per graph when batch is sorted).
    ids, sizes = torch.unique_consecutive(b, return_counts=True)
    runs = list(zip(ids.tolist(), q.split(sizes.tolist()),
                    k.split(sizes.tolist()), v.split(sizes.tolist())))
    kv = k.new_zeros(num_graphs, H, k.shape[-1], c)
    if runs:
        kv = kv.index_add(0, ids, torch.stack(
            [torch.einsum('nhm,nhc->hmc', ks, vs) for _, _, ks, vs in runs]))
    k_sum, kv = comm.global_sum(k_sum), comm.global_sum(kv)
    if batch is not None:
        # to_dense_batch pads every graph to the largest one; PyG zeroes
        # the padded values but the padded keys phi(k(0)) stay in the sums.
        sizes = torch.bincount(b, minlength=num_graphs).cpu()
        sizes = comm.all_reduce(sizes, 'sum').to(x.device)
        pad = (sizes.max() - sizes).to(x.dtype)
        k_pad = _kernel(attn, attn.k(x.new_zeros(1, x.shape[1])).view(
            1, H, c))
        k_sum = k_sum + pad.view(-1, 1, 1) * k_pad
    num = [torch.einsum('nhm,hmc->nhc', qs, kv[g]) for g, qs, _, _ in runs]
    num = torch.cat(num) if num else v.new_zeros(0, H, c)
    den = torch.einsum('nhm,nhm->nh', q, k_sum[b])
    out = (num / den.unsqueeze(-1)).reshape(n, H * c)
    return attn.dropout(attn.attn_out(out))


def _convert_inner(module: pyg_nn.GPSConv, path: str, strict: bool) -> None:
    """Converts the local conv and the norms of ``module`` in place
    (:func:`pyg_sar.nn.to_distributed`; ``BatchNorm`` gets whole-graph
    statistics)."""
    convert_children(module, f'{path}.' if path else '', strict)
    if module.norm1 is not None:
        module.norm_with_batch = 'batch' in inspect.signature(
            module.norm1.forward).parameters


def _from_stock(module: pyg_nn.GPSConv, path: str, strict: bool) -> GPSConv:
    """A stock ``GPSConv`` as :class:`GPSConv`, in place."""
    _convert_inner(module, path, strict)
    module.__class__ = GPSConv
    return module


register_composite(pyg_nn.GPSConv, _from_stock)
