"""Datasets: a scalable synthetic graph generator and loaders for real graphs.

Real graphs are loaded through PyG's own dataset classes, which download their
raw files on connected machines. Offline, point ``root`` at a folder that holds
the raw files in PyG's layout (for example a copy of ``../shared/data``).

Nothing found under ``root`` is trusted to be harmless: PyG unpickles its
processed files with ``torch.load(weights_only=False)`` when the safe load
fails (and ``pre_transform.pt``/``pre_filter.pt`` always), and Planetoid's raw
files with :mod:`pickle`, either of which runs any code a crafted file holds.
:func:`load` first checks every processed file with
``torch.load(weights_only=True)`` and every Planetoid raw file with an
unpickler that only builds the NumPy/SciPy objects such a file holds, and
refuses, in one line naming the file, what does not pass.
"""
import os
import os.path as osp
import pickle
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


# The globals a Planetoid raw file (``ind.<name>.<part>``, pickled SciPy
# matrices, NumPy arrays and a defaultdict of lists) refers to, under their
# Python 2 and 3 names; anything else is refused.
_PLANETOID_GLOBALS = frozenset([
    ('numpy', 'ndarray'), ('numpy', 'dtype'),
    ('numpy.core.multiarray', '_reconstruct'),
    ('numpy._core.multiarray', '_reconstruct'),
    ('scipy.sparse.csr', 'csr_matrix'), ('scipy.sparse._csr', 'csr_matrix'),
    ('collections', 'defaultdict'),
    ('__builtin__', 'list'), ('builtins', 'list'),
])
_PLANETOID_RAW = ('x', 'tx', 'allx', 'y', 'ty', 'ally', 'graph')


class _PlanetoidUnpickler(pickle.Unpickler):
    r"""Builds only the objects of :obj:`_PLANETOID_GLOBALS`: unpickling
    cannot call anything else."""
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _PLANETOID_GLOBALS:
            raise pickle.UnpicklingError(f"refers to '{module}.{name}'")
        if module.startswith('scipy.sparse'):
            module = 'scipy.sparse'  # the public name, without a warning
        return super().find_class(module, name)


def _refuse(path: str, reason: str, fix: str) -> ValueError:
    return ValueError(f"Dataset file '{path}' {reason}; refusing to load it "
                      f"(it could run code when unpickled): {fix}")


def _first_line(error: BaseException) -> str:
    for line in str(error).splitlines():
        if 'Unsupported global' in line:
            return line.strip()
    lines = [line.strip() for line in str(error).splitlines()
             if line.strip()]
    return lines[0] if lines else type(error).__name__


def _check_processed(dataset_dir: str) -> None:
    r"""Checks that every :obj:`.pt` file below :obj:`dataset_dir` loads
    with :obj:`torch.load(weights_only=True)` (PyG's data classes are
    allowed: PyG registers them as safe globals), memory-mapped, so that
    the check reads the pickled structure only, not the tensor data. PyG
    would unpickle a file that fails without that restriction."""
    for folder, dirs, files in os.walk(dataset_dir):
        dirs.sort()
        for name in sorted(files):
            if not name.endswith('.pt'):
                continue
            path = osp.join(folder, name)
            try:
                try:
                    torch.load(path, map_location='cpu', weights_only=True,
                               mmap=True)
                except pickle.UnpicklingError:
                    raise
                except Exception:  # e.g. a legacy (non-zip) file: no mmap
                    torch.load(path, map_location='cpu', weights_only=True)
            except Exception as e:
                raise _refuse(
                    path, f"does not load with torch.load(weights_only=True) "
                    f"({type(e).__name__}: {_first_line(e)})",
                    f"delete the folder '{folder}' so that PyG processes the "
                    f"raw files again") from None


def _check_planetoid_raw(dataset_dir: str, name: str) -> None:
    r"""Checks that the raw Planetoid files of :obj:`name` (pickles, which
    PyG reads with :func:`pickle.load`) hold only NumPy/SciPy objects."""
    for part in _PLANETOID_RAW:
        path = osp.join(dataset_dir, 'raw', f'ind.{name.lower()}.{part}')
        if not osp.isfile(path):
            continue
        try:
            with open(path, 'rb') as f:
                _PlanetoidUnpickler(f, encoding='latin1').load()
        except Exception as e:
            raise _refuse(
                path, f"is not a Planetoid file of NumPy/SciPy objects "
                f"({type(e).__name__}: {_first_line(e)})",
                "replace it with the original file (or delete it to "
                "download it again)") from None


def _check_dataset_files(name: str, dataset_dir: str) -> None:
    r"""Refuses the dataset folder :obj:`dataset_dir` of :obj:`name` if a
    file PyG would unpickle from it could run code."""
    if not osp.isdir(dataset_dir):
        return  # PyG creates it: downloaded and processed now
    if name in PLANETOID_NAMES:
        _check_planetoid_raw(dataset_dir, name)
    _check_processed(dataset_dir)


def _load_ogb(name: str, root: str) -> Data:
    try:
        from ogb.nodeproppred import PygNodePropPredDataset
    except ImportError as e:
        raise ImportError(
            f"Dataset '{name}' needs the 'ogb' package, which is not "
            f"installed; install it with 'pip install ogb'") from e
    _check_dataset_files(name, osp.join(root, name.replace('-', '_')))
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
            folder below it and downloads the raw files when absent. Files
            already there that could run code when PyG unpickles them are
            refused (see the module docs). (default: :obj:`"data"`)
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
    # Every class keeps its raw/ and processed/ folders in root/name.
    _check_dataset_files(name, osp.join(root, name))
    try:
        dataset = loaders[name]()
    except OSError as e:  # URLError, DNS and connection failures included
        raise ConnectionError(
            f"could not download '{name}' into '{root}' ({type(e).__name__}:"
            f" {e}); offline, provide its raw files as {_layout(name, root)}"
        ) from None
    data = dataset[0]
    if name in AMAZON_NAMES or name in COAUTHOR_NAMES:
        random_planetoid_split(data, dataset.num_classes, seed=seed)
    return data
