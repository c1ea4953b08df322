"""Where every model of ``torch_geometric.nn.models`` stands under
:func:`~pyg_sar.nn.to_distributed` (the cheatsheet's models table is
generated from these tables, and a test checks that every class of
``torch_geometric.nn.models.__all__`` is in exactly one of them, or has a
distributed class of its own in :mod:`pyg_sar.nn.models`):

- :data:`MODELS_WITH_LAYERS_CONVERTED`: containers whose layers
  ``to_distributed`` converts, each with the test that checks the converted
  model against single-process PyG;
- :data:`MODELS_PER_NODE`: models that never read the graph, exact as
  they are (a batch norm inside, in training mode, is converted like any
  other: its statistics span all nodes), each with its test;
- LightGCN and the other models with a distributed class of their own in
  :mod:`pyg_sar.nn.models` (its node-embedding table sharded by
  :class:`~pyg_sar.nn.DistEmbedding`);
- :data:`MODEL_REFUSALS`: models refused by name, with the reason, because
  what they compute spans the whole graph in a way that a partition does
  not hold (random walks over the whole graph, radius graphs built inside
  ``forward``, graph-level pooling, node pairs across workers, global
  attention).
"""
import torch_geometric.nn.models as pyg_models

_MODELS_EXACT = 'tests/nn/test_models_exact.py'
_MORE_EXACT = 'tests/nn/test_more_models_exact.py'
MODELS_WITH_LAYERS_CONVERTED = {
    pyg_models.GCN: _MODELS_EXACT,
    pyg_models.GraphSAGE: _MODELS_EXACT,
    pyg_models.GIN: _MODELS_EXACT,
    pyg_models.GAT: _MODELS_EXACT,
    pyg_models.PNA: _MODELS_EXACT,
    pyg_models.EdgeCNN: _MODELS_EXACT,
    pyg_models.DeepGCNLayer: _MORE_EXACT,
    pyg_models.PMLP: _MORE_EXACT,
    pyg_models.RECT_L: _MORE_EXACT,
    pyg_models.GroupAddRev: _MORE_EXACT,
    pyg_models.LINKX: _MORE_EXACT,  # its SparseLinear: pyg_sar.nn.models
}

MODELS_PER_NODE = {
    pyg_models.MLP: _MORE_EXACT,
    pyg_models.JumpingKnowledge: _MORE_EXACT,
    pyg_models.HeteroJumpingKnowledge: _MORE_EXACT,
    pyg_models.MaskLabel: _MORE_EXACT,
    pyg_models.GPSENodeEncoder: _MORE_EXACT,
}

_WALKS = ('samples random walks over the whole graph inside the model '
          '(its node-embedding table alone can be sharded: '
          'pyg_sar.nn.DistEmbedding)')
_MOLECULAR = ('a molecular model: builds a radius graph{} from positions '
              'inside forward and pools per molecule')
_TRIPLETS = _MOLECULAR.format(' and its triplets')
_PAIRS = ('decodes node pairs whose rows live on different workers; encode '
          'with the converted encoder and score pairs with '
          'pyg_sar.graph.link (fetch_nodes, negative_sampling)')
_GLOBAL_ATTENTION = ('attends over all nodes of the graph inside forward '
                     '(global attention sums over every node)')

# Stock models refused by name: the reason is part of the error.
MODEL_REFUSALS = {
    pyg_models.Node2Vec: _WALKS,
    pyg_models.MetaPath2Vec: _WALKS,
    pyg_models.TGNMemory: ('keeps a memory row per node of a temporal '
                           'graph, updated from events'),
    pyg_models.RENet: ('a temporal knowledge-graph model over event '
                       'histories, not one partitioned graph'),
    pyg_models.SchNet: _MOLECULAR.format(''),
    pyg_models.DimeNet: _TRIPLETS,
    pyg_models.DimeNetPlusPlus: _TRIPLETS,
    pyg_models.ViSNet: _MOLECULAR.format(''),
    pyg_models.GNNFF: ('a molecular model: builds a radius graph and its '
                       'triplets from positions inside forward'),
    pyg_models.AttentiveFP: ('a molecular model: attention readout over '
                             'each molecule (graph-level pooling)'),
    pyg_models.NeuralFingerprint: 'graph-level pooling (one vector per graph)',
    pyg_models.GraphUNet: ('pools nodes (TopKPooling) and squares the whole '
                           'adjacency inside forward'),
    pyg_models.GPSE: ('a pretrained positional encoder over whole graphs '
                      '(virtual node, graph-level heads)'),
    pyg_models.MetaLayer: ('hands edge_index rows and a per-graph batch to '
                           'user edge, node and global models'),
    pyg_models.DeepGraphInfomax: (
        'its summary (e.g. z.mean(dim=0)) and corruption (a node '
        'permutation) are user functions over all nodes'),
    pyg_models.InnerProductDecoder: _PAIRS,
    pyg_models.GAE: _PAIRS,
    pyg_models.VGAE: _PAIRS,
    pyg_models.ARGA: _PAIRS,
    pyg_models.ARGVA: _PAIRS,
    pyg_models.ARLinkPredictor: _PAIRS,
    pyg_models.SignedGCN: ('spectral features from an SVD of the whole signed '
                           'adjacency, losses over node pairs of the whole '
                           'graph'),
    pyg_models.LPFormer: ('personalized PageRank over the whole graph and '
                          'node pairs across workers'),
    pyg_models.SGFormer: _GLOBAL_ATTENTION,
    pyg_models.Polynormer: _GLOBAL_ATTENTION,
}
