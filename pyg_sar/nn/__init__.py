"""Distributed layers: PyG-compatible convolutions over a ``DistGraph``."""
from pyg_sar.nn.message_passing import DistMessagePassing
from pyg_sar.nn.sage_conv import SAGEConv
from pyg_sar.nn.gcn_conv import GCNConv
from pyg_sar.nn.graph_conv import GraphConv
from pyg_sar.nn.gin_conv import GINConv
from pyg_sar.nn.gat_conv import GATConv
from pyg_sar.nn.gatv2_conv import GATv2Conv
from pyg_sar.nn.norm import (BatchNorm, BatchNorm1d, GraphNorm, InstanceNorm,
                             LayerNorm, PairNorm)
from pyg_sar.nn.dir_gnn_conv import DistDirGNNConv
from pyg_sar.nn.rgcn_conv import FastRGCNConv, RGCNConv
from pyg_sar.nn.hetero_conv import HeteroConv
from pyg_sar.nn.hgt_conv import HGTConv
from pyg_sar.nn.convert import convertible, to_distributed

__all__ = [
    'DistMessagePassing', 'SAGEConv', 'GCNConv', 'GraphConv', 'GINConv',
    'GATConv', 'GATv2Conv', 'BatchNorm', 'BatchNorm1d', 'GraphNorm',
    'InstanceNorm', 'LayerNorm', 'PairNorm', 'DistDirGNNConv', 'RGCNConv',
    'FastRGCNConv', 'HeteroConv', 'HGTConv',
    'to_distributed', 'convertible'
]
