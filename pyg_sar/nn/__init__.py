"""Stage 4, layers: PyG-compatible layers over a :class:`~pyg_sar.DistGraph`.
:class:`DistMessagePassing` subclasses PyG's ``MessagePassing`` and sends its
aggregations through the SAR engine (:mod:`~pyg_sar.nn.engine`: sequential
per-shard aggregation, rematerialized backward, modes ``sar``, ``sa`` and
``one_shot``) or, for layers the engine cannot express, over whole
neighborhoods (:mod:`~pyg_sar.nn.neighborhood`, :mod:`~pyg_sar.nn.adapter`).
The convolutions live one per file in :mod:`~pyg_sar.nn.conv`, the
normalizations with whole-graph statistics in :mod:`~pyg_sar.nn.norm`, and
:func:`to_distributed` converts a stock PyG model or refuses it by name
(:mod:`~pyg_sar.nn.convert`). :class:`DistEmbedding` shards a
node-embedding table by the partition. Layers exchange rows through the graph and the
communication stage; they know nothing of loaders or training.
"""
from pyg_sar.nn.message_passing import DistMessagePassing
from pyg_sar.nn.conv.sage_conv import SAGEConv
from pyg_sar.nn.conv.gcn_conv import GCNConv
from pyg_sar.nn.conv.graph_conv import GraphConv
from pyg_sar.nn.conv.gin_conv import GINConv
from pyg_sar.nn.conv.gat_conv import GATConv
from pyg_sar.nn.conv.gatv2_conv import GATv2Conv
from pyg_sar.nn.conv.transformer_conv import TransformerConv
from pyg_sar.nn.norm import (BatchNorm, BatchNorm1d, GraphNorm, InstanceNorm,
                             LayerNorm, PairNorm)
from pyg_sar.nn.conv.dir_gnn_conv import DistDirGNNConv
from pyg_sar.nn.conv.rgcn_conv import FastRGCNConv, RGCNConv
from pyg_sar.nn.conv.hetero_conv import HeteroConv
from pyg_sar.nn.conv.hgt_conv import HGTConv
from pyg_sar.nn.conv.gps_conv import GPSConv
from pyg_sar.nn.conv import (AntiSymmetricConv, ChebConv, DNAConv, EGConv,
                             HANConv, HEATConv, PDNConv, RGATConv, SignedConv,
                             SuperGATConv, WLConv)
from pyg_sar.nn import models  # registers LabelPropagation, CorrectAndSmooth
from pyg_sar.nn.convert import convertible, to_distributed
from pyg_sar.nn.embedding import DistEmbedding
from pyg_sar.nn.sign import sign_features

__all__ = [
    'DistMessagePassing', 'SAGEConv', 'GCNConv', 'GraphConv', 'GINConv',
    'GATConv', 'GATv2Conv', 'TransformerConv', 'BatchNorm', 'BatchNorm1d',
    'GraphNorm', 'InstanceNorm', 'LayerNorm', 'PairNorm', 'DistDirGNNConv',
    'RGCNConv',
    'FastRGCNConv', 'HeteroConv', 'HGTConv', 'GPSConv',
    'HANConv', 'HEATConv', 'RGATConv', 'AntiSymmetricConv', 'ChebConv',
    'DNAConv', 'EGConv', 'PDNConv', 'SignedConv', 'SuperGATConv', 'WLConv',
    'to_distributed', 'convertible', 'sign_features', 'DistEmbedding'
]
