"""The convolutions, one per file as in PyG's ``torch_geometric/nn/conv``.
Engine twins of stock layers (``SAGEConv``, ``GCNConv``, ``GraphConv``,
``GINConv``, ``GATConv``, ``GATv2Conv``, ``TransformerConv``, ``RGCNConv``,
``HGTConv``) run on the SAR engine; ``ChebConv`` and ``DirGNNConv`` are adapted over whole
neighborhoods; ``HeteroConv`` runs one converted conv per relation."""
from pyg_sar.nn.conv.sage_conv import SAGEConv
from pyg_sar.nn.conv.gcn_conv import GCNConv
from pyg_sar.nn.conv.graph_conv import GraphConv
from pyg_sar.nn.conv.gin_conv import GINConv
from pyg_sar.nn.conv.gat_conv import GATConv
from pyg_sar.nn.conv.gatv2_conv import GATv2Conv
from pyg_sar.nn.conv.transformer_conv import TransformerConv
from pyg_sar.nn.conv.rgcn_conv import FastRGCNConv, RGCNConv
from pyg_sar.nn.conv.hgt_conv import HGTConv
from pyg_sar.nn.conv.cheb_conv import ChebConv
from pyg_sar.nn.conv.dir_gnn_conv import DistDirGNNConv
from pyg_sar.nn.conv.hetero_conv import HeteroConv
from pyg_sar.nn.conv.gps_conv import GPSConv
from pyg_sar.nn.conv.han_conv import HANConv
from pyg_sar.nn.conv.rgat_conv import RGATConv
from pyg_sar.nn.conv.heat_conv import HEATConv
from pyg_sar.nn.conv.eg_conv import EGConv
from pyg_sar.nn.conv.pdn_conv import PDNConv
from pyg_sar.nn.conv.dna_conv import DNAConv
from pyg_sar.nn.conv.antisymmetric_conv import AntiSymmetricConv
from pyg_sar.nn.conv.signed_conv import SignedConv
from pyg_sar.nn.conv.wl_conv import WLConv
from pyg_sar.nn.conv.supergat_conv import SuperGATConv

__all__ = ['SAGEConv', 'GCNConv', 'GraphConv', 'GINConv', 'GATConv',
           'GATv2Conv', 'TransformerConv', 'RGCNConv', 'FastRGCNConv',
           'HGTConv', 'ChebConv', 'DistDirGNNConv', 'HeteroConv', 'GPSConv', 'HANConv', 'RGATConv',
           'HEATConv', 'EGConv', 'PDNConv', 'DNAConv', 'AntiSymmetricConv',
           'SignedConv', 'WLConv', 'SuperGATConv']
