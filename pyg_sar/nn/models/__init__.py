"""PyG's models (``torch_geometric.nn.models``) that need more than their
layers converted, one per file: :class:`LabelPropagation` (labels one-hot
encoded with the classes of the whole graph, GCN normalization with the
halo's degrees) and :class:`CorrectAndSmooth` (its autoscale over the
training nodes of all workers), and LINKX's :class:`SparseLinear` (one
trainable row per node of the whole graph, read by input-graph id), and
:class:`LightGCN` (its node-embedding table sharded by the partition).
:func:`~pyg_sar.nn.to_distributed` switches
the stock classes to these in place; the paths of every other stock model
(layers converted inside it, or refused by name with the reason) are in
:mod:`pyg_sar.nn.model_paths`."""
from pyg_sar.nn.models.label_propagation import LabelPropagation
from pyg_sar.nn.models.correct_and_smooth import CorrectAndSmooth
from pyg_sar.nn.models.sparse_linear import SparseLinear
from pyg_sar.nn.models.light_gcn import LightGCN

__all__ = ['LabelPropagation', 'CorrectAndSmooth', 'SparseLinear',
           'LightGCN']
