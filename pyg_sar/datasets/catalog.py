"""Datasets: a scalable synthetic graph generator and loaders for real graphs.

Real graphs are loaded through PyG's own dataset classes, which download their
raw files on connected machines. Offline, point ``root`` at a folder that holds
the raw files in PyG's layout (for example a copy of ``../shared/data``).
"""
import os.path as osp
from typing import Any, Callable, Dict

import torch

from torch_geometric.data import Data

from pyg_sar.datasets.synthetic import SYNTHETIC_DEFAULTS, synthetic_graph
from pyg_sar.datasets.synthetic_hetero import synthetic_hetero_graph

PLANETOID_NAMES = ('Cora', 'CiteSeer', 'PubMed')
AMAZON_NAMES = ('Computers', 'Photo')
COAUTHOR_NAMES = ('CS', 'Physics')
HETERO_NAMES = ('DBLP', 'IMDB')

def random_planetoid_split(
    data: Data,
    num_classes: int,
    num_train_per_class: int = 20,
    num_val_per_class: int = 30,
    seed: int = 0,
) -> Data:
    r"""Adds the standard random split of Shchur et al. (2018) to
    :obj:`data`: :obj:`num_train_per_class` training and
    :obj:`num_val_per_class` validation nodes per class, the rest is test.
    """
    generator = torch.Generator().manual_seed(seed)
    num_nodes = data.num_nodes
    train_mask = torch.zeros(num_nodes, dtype=torch.bool)
    val_mask = torch.zeros(num_nodes, dtype=torch.bool)
    for c in range(num_classes):
        index = (data.y == c).nonzero().view(-1)
        index = index[torch.randperm(index.numel(), generator=generator)]
        train_mask[index[:num_train_per_class]] = True
        val_mask[index[num_train_per_class:num_train_per_class +
                       num_val_per_class]] = True
    data.train_mask = train_mask
    data.val_mask = val_mask
    data.test_mask = ~(train_mask | val_mask)
    return data


def _load_ogb(name: str, root: str) -> Data:
    try:
        from ogb.nodeproppred import PygNodePropPredDataset
    except ImportError as e:
        raise ImportError(
            f"Dataset '{name}' needs the 'ogb' package, which is not "
            f"installed; install it with 'pip install ogb'") from e
    dataset = PygNodePropPredDataset(name, root=root)
    data = dataset[0]
    split = dataset.get_idx_split()
    num_nodes = data.num_nodes
    for key, split_key in [('train_mask', 'train'), ('val_mask', 'valid'),
                           ('test_mask', 'test')]:
        mask = torch.zeros(num_nodes, dtype=torch.bool)
        mask[split[split_key]] = True
        data[key] = mask
    data.y = data.y.view(-1)
    return data


def available() -> list:
    """Names accepted by :func:`load` (``ogbn-*`` needs the ``ogb`` package).
    """
    return ['synthetic', 'synthetic-hetero', *PLANETOID_NAMES, *AMAZON_NAMES,
            *COAUTHOR_NAMES, *HETERO_NAMES, 'ogbn-<name>']


def _layout(name: str, root: str) -> str:
    """Where PyG's class looks for the raw files of ``name``."""
    if name in PLANETOID_NAMES:
        return (f"{root}/{name}/raw/ind.{name.lower()}."
                f"{{x,tx,allx,y,ty,ally,graph,test.index}}")
    if name in AMAZON_NAMES:
        return f"{root}/{name}/raw/amazon_electronics_{name.lower()}.npz"
    if name in HETERO_NAMES:
        return (f"{root}/{name}/raw/{{adjM.npz,features_*.np[yz],labels.npy,"
                f"node_types.npy,train_val_test_idx.npz}}")
    return f"{root}/{name}/raw/ms_academic_{name.lower()[:3]}.npz"


def load(name: str, root: str = 'data', seed: int = 0, **kwargs: Any) -> Data:
    r"""Loads a node classification graph as a single
    :class:`~torch_geometric.data.Data` with train/val/test masks.

    Args:
        name (str): :obj:`"synthetic"`, :obj:`"synthetic-hetero"` (an
            ogbn-mag-shaped :class:`HeteroData`, see
            :mod:`pyg_sar.datasets.synthetic_hetero`), :obj:`"DBLP"` or
            :obj:`"IMDB"` (heterogeneous, MAGNN's files; a
            :class:`HeteroData` with the given masks), a Planetoid name
            (:obj:`"Cora"`,
            :obj:`"CiteSeer"`, :obj:`"PubMed"`), an Amazon name
            (:obj:`"Computers"`, :obj:`"Photo"`), a Coauthor name
            (:obj:`"CS"`, :obj:`"Physics"`) or :obj:`"ogbn-*"` (needs the
            :obj:`ogb` package).
        root (str, optional): Dataset root. PyG writes a :obj:`processed/`
            folder below it and downloads the raw files when absent.
            (default: :obj:`"data"`)
        seed (int, optional): Seed of the synthetic graph and of the random
            Amazon/Coauthor split. (default: :obj:`0`)
        **kwargs: Overrides of :func:`synthetic_graph`'s arguments for
            :obj:`"synthetic"` (of ``synthetic_hetero_graph``'s for
            :obj:`"synthetic-hetero"`); must be empty otherwise.
    """
    if name == 'synthetic':
        options = {**SYNTHETIC_DEFAULTS, **kwargs}
        return synthetic_graph(seed=seed, **options)
    if name == 'synthetic-hetero':
        options = {'num_papers': 100_000, **kwargs}
        return synthetic_hetero_graph(seed=seed, **options)

    if kwargs:
        raise ValueError(f"Dataset '{name}' takes no extra options "
                         f"(got {sorted(kwargs)})")

    if name.startswith('ogbn-'):
        return _load_ogb(name, root)

    from torch_geometric.datasets import (DBLP, IMDB, Amazon, Coauthor,
                                          Planetoid)

    loaders: Dict[str, Callable[[], Any]] = {
        # These two take the dataset's own folder as their root.
        'DBLP': lambda: DBLP(osp.join(root, 'DBLP')),
        'IMDB': lambda: IMDB(osp.join(root, 'IMDB')),
    }
    for planetoid_name in PLANETOID_NAMES:
        loaders[planetoid_name] = (
            lambda n=planetoid_name: Planetoid(root, n))
    for amazon_name in AMAZON_NAMES:
        loaders[amazon_name] = lambda n=amazon_name: Amazon(root, n)
    for coauthor_name in COAUTHOR_NAMES:
        loaders[coauthor_name] = lambda n=coauthor_name: Coauthor(root, n)

    if name not in loaders:
        raise ValueError(f"Unknown dataset '{name}'; expected one of "
                         f"{available()}")
    try:
        dataset = loaders[name]()
    except OSError as e:  # URLError, DNS and connection failures included
        raise RuntimeError(
            f"could not download '{name}' into '{root}' ({type(e).__name__}:"
            f" {e}); offline, provide its raw files as {_layout(name, root)}"
        ) from None
    data = dataset[0]
    if name in AMAZON_NAMES or name in COAUTHOR_NAMES:
        random_planetoid_split(data, dataset.num_classes, seed=seed)
    return data
