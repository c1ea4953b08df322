r"""PyG's :class:`~torch_geometric.nn.conv.WLConv` over a
:class:`~pyg_sar.DistGraph`: one Weisfeiler-Lehman refinement with a color
table agreed over the workers.

.. math::
    \mathbf{x}^{\prime}_i = \textrm{hash} \left( \mathbf{x}_i, \{
    \mathbf{x}_j \colon j \in \mathcal{N}(i) \} \right)

PyG numbers the new colors in order of first appearance over the nodes in
node order, and keeps the table (``hashmap``) from call to call. Each
worker computes the signatures of its local nodes (own color and the sorted
colors of all in-neighbors, the halo's colors fetched from their owners);
the signatures not yet in the table are gathered over the workers, each
with the smallest input-graph id of a node that has it, and every worker
appends them in order of that id. The table, and so every color, is then
the single-process one, on every worker.

``histogram`` counts the colors of the local nodes; the whole graph's
histogram (``norm=False``) is the sum over workers
(:func:`pyg_sar.comm.all_reduce`).
"""
from typing import Dict

import torch
import torch_geometric.nn as pyg_nn
from torch import Tensor

from pyg_sar import comm
from pyg_sar.graph import DistGraph
from pyg_sar.nn.conv._dist_edges import run_edges
from pyg_sar.nn.zoo_extra import register_switch


class WLConv(pyg_nn.WLConv):
    r"""The Weisfeiler Lehman operator from the `"A Reduction of a Graph to
    a Canonical Form and an Algebra Arising During this Reduction"
    <https://www.iti.zcu.cz/wl2018/pdf/wl_paper_translation.pdf>`_ paper,
    over a :class:`~pyg_sar.DistGraph` (see the module docs). Same
    constructor and state (``hashmap``) as
    :class:`torch_geometric.nn.WLConv`; with a plain ``edge_index`` it is
    PyG's layer. Collective over a ``DistGraph``.

    Shapes:
        - **input:** node colors :math:`(|\mathcal{V}^{(p)}|)` (``long``) or
          one-hot :math:`(|\mathcal{V}^{(p)}|, C)` of the local nodes, the
          graph
        - **output:** :math:`(|\mathcal{V}^{(p)}|)` (``long``)
    """

    # Called with a DistGraph by design (pyg_sar/utils/layer_guard.py).
    accepts_dist_graph = True
    flow = 'source_to_target'  # in-neighbors, as PyG's WLConv reads them

    @torch.no_grad()
    def forward(self, x: Tensor, edge_index) -> Tensor:
        if not isinstance(edge_index, DistGraph):
            return super().forward(x, edge_index)
        graph = edge_index
        if x.dim() > 1:
            if int((x.sum(dim=-1) == 1).sum()) != x.size(0):
                raise ValueError("WLConv: x has more than one dimension but "
                                 "is not one-hot (every row must sum to 1)")
            x = x.argmax(dim=-1)
        if x.dtype != torch.long or x.numel() != graph.num_nodes:
            raise ValueError(
                f"WLConv over a DistGraph: x has dtype {x.dtype} and "
                f"{x.numel()} rows; expected torch.long colors of the "
                f"{graph.num_nodes} local nodes")
        _, ei, _ = run_edges(self, graph, device=x.device)
        colors = graph.fetch_halo(x)
        order = torch.argsort(ei[1], stable=True)
        deg = torch.bincount(ei[1], minlength=graph.num_nodes).tolist()
        keys = [hash(tuple([node] + nbrs.sort()[0].tolist()))
                for node, nbrs in zip(x.tolist(),
                                      colors[ei[0][order]].split(deg))]
        self._agree(keys, graph)
        return torch.tensor([self.hashmap[k] for k in keys],
                            device=x.device)

    def _agree(self, keys, graph: DistGraph) -> None:
        """Appends the new signatures of all workers to ``hashmap`` in order
        of the first node (input-graph id) that has each."""
        ids = graph.orig_ids
        ids = (ids.tolist() if ids is not None else
               range(graph.node_offset, graph.node_offset + graph.num_nodes))
        first: Dict[int, int] = {}
        for key, node in zip(keys, ids):
            if key not in self.hashmap and node < first.get(key, node + 1):
                first[key] = node
        merged: Dict[int, int] = {}
        for part in comm.all_gather_object(first):
            for key, node in part.items():
                if node < merged.get(key, node + 1):
                    merged[key] = node
        for key in sorted(merged, key=merged.__getitem__):
            self.hashmap[key] = len(self.hashmap)
register_switch(pyg_nn.WLConv, WLConv)
