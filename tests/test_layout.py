"""The package layout, read from the source: one folder per stage, no import
circles, no import from a later stage into an earlier one, every
``torch.distributed`` import in the communication stage, no module reaching
into another's private names, the partitioner and the loaders split by
concern, a small public surface (each stage's ``__all__`` pinned, no private
name in any ``__all__``), and the fast paths (``import pyg_sar``,
``pyg-sar --help``) free of torch."""
import ast
import os
import os.path as osp
import subprocess
import sys

import pytest

import pyg_sar

ROOT = osp.dirname(pyg_sar.__file__)
# The pipeline, in order: a stage may import itself and earlier stages.
STAGES = ['utils', 'partition', 'comm', 'graph', 'nn', 'loader', 'train',
          'datasets', 'cli']


def _modules():
    """``{dotted name: path}`` of every module of the package."""
    found = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if not name.endswith('.py'):
                continue
            path = osp.join(folder, name)
            rel = osp.relpath(path, osp.dirname(ROOT))[:-3].split(os.sep)
            if rel[-1] == '__init__':
                rel = rel[:-1]
            found['.'.join(rel)] = path
    return found


MODULES = _modules()


def _package_of(module: str, path: str) -> str:
    return module if path.endswith('__init__.py') else \
        module.rsplit('.', 1)[0]


def _imports(module: str, path: str):
    """Modules of the package that ``module`` imports, anywhere in its body
    (function-level imports included, ``TYPE_CHECKING`` blocks not): the
    most specific module named."""
    tree = ast.parse(open(path).read(), path)
    # Imports for type checkers only never run.
    typing_only = {id(n) for block in ast.walk(tree)
                   if isinstance(block, ast.If)
                   and getattr(block.test, 'id', None) == 'TYPE_CHECKING'
                   for stmt in block.body for n in ast.walk(stmt)}
    targets = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                parts = _package_of(module, path).split('.')
                parts = parts[:len(parts) - node.level + 1]
                base = '.'.join(parts + ([base] if base else []))
            names = [f'{base}.{alias.name}' if f'{base}.{alias.name}' in
                     MODULES else base for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition('.')[0]
            if name.startswith('pyg_sar'):
                targets.add(name)
    targets.discard(module)
    return targets


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _stage(module: str):
    parts = module.split('.')
    return parts[1] if len(parts) > 1 else None


def test_one_folder_per_stage_with_a_docstring():
    top = sorted(n for n in os.listdir(ROOT) if not n.startswith(('.', '_'))
                 and n != '__pycache__')
    assert top == sorted(STAGES), top
    loose = [n for n in os.listdir(ROOT) if n.endswith('.py')]
    assert loose == ['__init__.py'], loose
    # Every package, the stages and the folders inside them.
    for module, path in MODULES.items():
        if not path.endswith('__init__.py') or module == 'pyg_sar':
            continue
        doc = ast.get_docstring(ast.parse(open(path).read()))
        assert doc and len(doc.split()) >= 25, \
            f'{module} needs a one-paragraph docstring'




def test_no_import_circles():
    # Tarjan's strongly connected components over the module graph.
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not cycles, f'import circles: {cycles}'


def test_no_stage_imports_a_later_one():
    upward = []
    for module, targets in GRAPH.items():
        stage = _stage(module)
        if stage is None:  # the package facade imports lazily, by name
            continue
        for target in targets:
            other = _stage(target)
            if other is None:
                upward.append(f'{module} -> {target} (the package facade)')
            elif STAGES.index(other) > STAGES.index(stage):
                upward.append(f'{module} -> {target}')
    assert not upward, 'imports from a later stage: ' + '; '.join(upward)


def test_torch_distributed_only_in_comm():
    outside = []
    for module, path in MODULES.items():
        if _stage(module) == 'comm':
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            names = ([a.name for a in node.names]
                     if isinstance(node, ast.Import) else
                     [node.module or ''] if isinstance(node, ast.ImportFrom)
                     else [])
            if any(n.startswith('torch.distributed') for n in names):
                outside.append(module)
    assert not outside, outside


# The stages whose modules use only each other's public names: all.
PUBLIC_NAMES_ONLY = STAGES


def _private_uses(module: str, path: str):
    """``target._name`` and ``from target import _name`` in ``module``,
    where ``target`` is another module of the package."""
    tree = ast.parse(open(path).read(), path)
    imported, found = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and \
                node.module.startswith('pyg_sar'):
            for alias in node.names:
                target = f'{node.module}.{alias.name}'
                if target in MODULES:  # a module: its attributes count
                    imported[alias.asname or alias.name] = target
                elif alias.name.startswith('_') and \
                        not alias.name.startswith('__') and \
                        node.module != module:
                    found.append(f'{module}: from {node.module} import '
                                 f'{alias.name}')
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in MODULES:
                    imported[alias.asname] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and \
                isinstance(node.value, ast.Name) and \
                node.value.id in imported and \
                node.attr.startswith('_') and \
                not node.attr.startswith('__') and \
                imported[node.value.id] != module:
            found.append(f'{module}: {imported[node.value.id]}.{node.attr}')
    return found


def test_no_module_uses_another_modules_private_names():
    found = [use for module, path in MODULES.items()
             if _stage(module) in PUBLIC_NAMES_ONLY
             for use in _private_uses(module, path)]
    assert not found, 'private names used across modules: ' + \
        '; '.join(found)


# The partitioner's subpackages, one per step, and the ones each may import
# (besides the modules at the top of pyg_sar.partition).
PARTITION_STEPS = {
    'input': set(),
    'assign': {'input'},
    'write': {'input', 'assign'},
    'read': set(),
}
MAX_MODULES_PER_FOLDER = 12


def test_partition_is_split_by_concern():
    root = osp.join(ROOT, 'partition')
    steps = sorted(n for n in os.listdir(root)
                   if osp.isdir(osp.join(root, n)) and n != '__pycache__')
    assert steps == sorted(PARTITION_STEPS), steps
    for folder, names, files in os.walk(root):
        names[:] = [n for n in names if n != '__pycache__']
        modules = [f for f in files
                   if f.endswith('.py') and f != '__init__.py']
        assert len(modules) <= MAX_MODULES_PER_FOLDER, \
            f'{folder} holds {len(modules)} modules'
    for step in PARTITION_STEPS:
        init = osp.join(root, step, '__init__.py')
        doc = ast.get_docstring(ast.parse(open(init).read()))
        assert doc and len(doc.split()) >= 25, \
            f'pyg_sar.partition.{step} needs a one-paragraph docstring'
    wrong = []
    for module, targets in GRAPH.items():
        parts = module.split('.')
        if parts[:2] != ['pyg_sar', 'partition'] or len(parts) < 4:
            continue
        for target in targets:
            other = target.split('.')
            if other[:2] == ['pyg_sar', 'partition'] and len(other) >= 4 \
                    and other[2] != parts[2] and \
                    other[2] not in PARTITION_STEPS[parts[2]]:
                wrong.append(f'{module} -> {target}')
    assert not wrong, 'partition steps out of order: ' + '; '.join(wrong)


# The loaders' subpackages, one per concern, and the ones each may import:
# what a loader reads of its part, how neighborhoods are drawn, what a batch
# is made of.
LOADER_CONCERNS = {
    'shards': set(),
    'sampling': {'shards'},
    'batches': {'shards', 'sampling'},
}


def test_loader_is_split_by_concern():
    root = osp.join(ROOT, 'loader')
    concerns = sorted(n for n in os.listdir(root)
                      if osp.isdir(osp.join(root, n)) and n != '__pycache__')
    assert concerns == sorted(LOADER_CONCERNS), concerns
    for folder, names, files in os.walk(root):
        names[:] = [n for n in names if n != '__pycache__']
        modules = [f for f in files
                   if f.endswith('.py') and f != '__init__.py']
        assert len(modules) <= MAX_MODULES_PER_FOLDER, \
            f'{folder} holds {len(modules)} modules'
    wrong = []
    for module, targets in GRAPH.items():
        parts = module.split('.')
        if parts[:2] != ['pyg_sar', 'loader'] or len(parts) < 4:
            continue
        for target in targets:
            other = target.split('.')
            if other[:2] == ['pyg_sar', 'loader'] and (
                    len(other) < 4 or other[2] != parts[2] and
                    other[2] not in LOADER_CONCERNS[parts[2]]):
                wrong.append(f'{module} -> {target}')
    assert not wrong, 'loader concerns out of order: ' + '; '.join(wrong)


@pytest.mark.parametrize('code', [
    'import pyg_sar; pyg_sar.__version__',
    'import sys; sys.argv = ["pyg-sar", "--help"]\n'
    'from pyg_sar.cli.main import main\n'
    'try:\n    main()\nexcept SystemExit:\n    pass',
])
def test_fast_paths_do_not_import_torch(code):
    out = subprocess.run(
        [sys.executable, '-c', code + '\nimport sys\n'
         'print("TORCH" if "torch" in sys.modules else "NO TORCH")'],
        capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().endswith('NO TORCH'), out.stdout + out.stderr


def test_public_names_stay_where_users_import_them():
    from pyg_sar import checkpoint, link  # noqa: F401
    from pyg_sar.graph import DistGraph, HeteroDistGraph  # noqa: F401
    from pyg_sar.loader import (DistHeteroNeighborLoader,  # noqa: F401
                                DistLinkNeighborLoader, DistNeighborLoader)
    from pyg_sar.nn import (DistMessagePassing, SAGEConv,  # noqa: F401
                            to_distributed)
    from pyg_sar.train import distributed_loss, evaluate  # noqa: F401
    for name in pyg_sar.__all__:
        assert getattr(pyg_sar, name) is not None, name


def test_every_convolution_is_public_in_pyg_sar_nn():
    import pyg_sar.nn
    import pyg_sar.nn.conv
    missing = sorted(set(pyg_sar.nn.conv.__all__) - set(pyg_sar.nn.__all__))
    assert not missing, f'pyg_sar.nn.__all__ lacks {missing}'
    for name in pyg_sar.nn.conv.__all__:
        assert getattr(pyg_sar.nn, name) is getattr(pyg_sar.nn.conv, name)


# What users call, stage by stage: growing a stage's __all__ is a deliberate
# act (edit this list too); internals stay importable from the module that
# defines them.
PUBLIC_API = {
    'pyg_sar': [
        'partition_graph', 'load_partition', 'Partition', 'HeteroPartition',
        'init_distributed', 'sync_params', 'all_reduce_grads', 'comm_stats',
        'reset_comm_stats', 'global_count', 'global_mean', 'global_totals',
        'distribute', 'configure', 'PeerError', 'DistGraph', 'HeteroDistGraph', 'comm', 'nn', 'loader', 'train',
        'datasets', 'cli', 'link', 'checkpoint', '__version__'],
    'pyg_sar.utils': [],
    'pyg_sar.partition': [
        'partition_graph', 'partition_graph_parallel', 'load_partition',
        'Partition', 'HeteroPartition', 'NodePart', 'EdgePart'],
    'pyg_sar.comm': [
        'init_distributed', 'get_rank', 'get_world_size', 'find_free_port',
        'shutdown', 'CommConfig', 'configure', 'config', 'comm_stats',
        'reset_comm_stats', 'PeerError', 'SettingsMismatchError',
        'report_failure', 'barrier', 'all_reduce', 'broadcast_',
        'all_gather_object', 'all_gather_by_id', 'global_sum', 'global_mean',
        'global_count',
        'global_totals', 'sync_params', 'all_reduce_grads', 'ddp_sum_hook',
        'ProcessGroupExchange'],
    'pyg_sar.graph': ['DistGraph', 'HeteroDistGraph'],
    'pyg_sar.nn': [
        'DistMessagePassing', 'SAGEConv', 'GCNConv', 'GraphConv', 'GINConv',
        'GATConv', 'GATv2Conv', 'TransformerConv', 'BatchNorm',
        'BatchNorm1d', 'GraphNorm', 'InstanceNorm', 'LayerNorm', 'PairNorm',
        'DistDirGNNConv',
        'RGCNConv', 'FastRGCNConv', 'HeteroConv', 'HGTConv', 'GPSConv',
        'HANConv', 'HEATConv', 'RGATConv', 'AntiSymmetricConv', 'ChebConv',
        'DNAConv', 'EGConv', 'PDNConv', 'SignedConv', 'SuperGATConv',
        'WLConv', 'to_distributed', 'convertible', 'sign_features',
        'DistEmbedding'],
    'pyg_sar.loader': [
        'DistNeighborLoader', 'DistHeteroNeighborLoader',
        'DistLinkNeighborLoader', 'DistHeteroLinkNeighborLoader',
        'DistHGTLoader', 'sample_neighbors'],
    'pyg_sar.train': [
        'train', 'GNN', 'MODELS', 'distributed_loss', 'evaluate',
        'limit_heap_retention', 'resolve_device', 'checkpoint', 'RunLog',
        'inference', 'gather_nodes'],
    'pyg_sar.datasets': [
        'load', 'available', 'synthetic_graph', 'synthetic_hetero_graph',
        'random_planetoid_split', 'SYNTHETIC_DEFAULTS', 'distribute'],
    'pyg_sar.cli': ['main', 'build_parser', 'register_command', 'COMMANDS'],
}


def test_each_stage_exports_exactly_its_public_api():
    import importlib
    assert sorted(PUBLIC_API) == sorted(['pyg_sar'] + [f'pyg_sar.{s}'
                                                       for s in STAGES])
    for name, expected in PUBLIC_API.items():
        module = importlib.import_module(name)
        found = list(getattr(module, '__all__', []))
        assert len(found) == len(set(found)), f'{name}.__all__ repeats names'
        added = sorted(set(found) - set(expected))
        missing = sorted(set(expected) - set(found))
        assert not added and not missing, (
            f'{name}.__all__ gained {added} and lost {missing}; update '
            f'PUBLIC_API in tests/test_layout.py if that is meant')
        for public in found:
            assert getattr(module, public, None) is not None, \
                f'{name}.__all__ names {public!r}, which it lacks'


def _all_of(module: str, path: str):
    """``__all__`` of ``module``: its literal list, else (built at import)
    the imported module's."""
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, ast.Assign) and any(
                getattr(t, 'id', None) == '__all__' for t in node.targets):
            try:
                return list(ast.literal_eval(node.value))
            except ValueError:
                import importlib
                return list(importlib.import_module(module).__all__)
    return []


def test_no_all_holds_a_private_name():
    private = [f'{module}: {name}' for module, path in MODULES.items()
               for name in _all_of(module, path)
               if name.startswith('_') and not
               (name.startswith('__') and name.endswith('__'))]
    assert not private, f'private names in __all__: {private}'


# One layer per file: the convolutions' folder may hold many.
MANY_MODULES_ALLOWED = {osp.join(ROOT, 'nn', 'conv')}


def test_small_folders_and_modules():
    crowded, long = [], []
    for folder, _, files in os.walk(ROOT):
        modules = [n for n in files if n.endswith('.py') and
                   n != '__init__.py']
        if len(modules) > 12 and folder not in MANY_MODULES_ALLOWED:
            crowded.append(f'{osp.relpath(folder, ROOT)} ({len(modules)})')
        for name in files:
            if name.endswith('.py'):
                with open(osp.join(folder, name)) as f:
                    lines = sum(1 for _ in f)
                if lines > 600:
                    long.append(f'{osp.relpath(osp.join(folder, name), ROOT)}'
                                f' ({lines} lines)')
    assert not crowded, f'folders over 12 modules: {crowded}'
    assert not long, f'modules over 600 lines: {long}'
