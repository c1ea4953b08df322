"""The loaders' arguments: pyg_sar's own call and PyG's
``torch_geometric.distributed`` call, argument for argument.

``DistNeighborLoader(data, num_neighbors, master_addr, master_port,
current_ctx, input_nodes, ...)`` is how PyG's distributed loaders are called;
``DistNeighborLoader(data, num_neighbors, input_nodes, batch_size, ...)`` is
pyg_sar's. A string in the third position (``master_addr``) selects PyG's
positional order. Arguments that configure PyG's RPC machinery are checked
against the running process group and otherwise have no effect; arguments
that would change which batch comes out are either implemented or refused
with an error naming them. The checks of the options themselves (batching,
sampling, fanouts, seeds) are here too, one for the homogeneous and the
heterogeneous loaders alike.
"""
from __future__ import annotations

import inspect
from typing import Any, Dict, List, Optional, Sequence, Tuple

from pyg_sar.loader.sampling.temporal import STRATEGIES

# PyG's NeighborLoader / LinkNeighborLoader positional order (2.8).
NODE_ORDER = ('input_nodes', 'input_time', 'replace', 'subgraph_type',
              'disjoint', 'temporal_strategy', 'time_attr', 'weight_attr',
              'transform', 'transform_sampler_output', 'is_sorted',
              'filter_per_worker', 'neighbor_sampler', 'directed')
LINK_ORDER = ('edge_label_index', 'edge_label', 'edge_label_time',
              'replace', 'subgraph_type', 'disjoint', 'temporal_strategy',
              'neg_sampling', 'neg_sampling_ratio', 'time_attr',
              'weight_attr', 'transform', 'transform_sampler_output',
              'is_sorted', 'filter_per_worker', 'neighbor_sampler',
              'directed')
PYG_NODE_ORDER = ('master_addr', 'master_port', 'current_ctx', 'input_nodes',
                  'input_time', 'dist_sampler', 'replace', 'subgraph_type',
                  'disjoint', 'temporal_strategy', 'time_attr', 'transform',
                  'concurrency', 'num_rpc_threads', 'filter_per_worker',
                  'async_sampling', 'device')
# PyG's HGTLoader positional order (2.8), after (data, num_samples); PyG has
# no distributed HGTLoader, so this is its one order.
HGT_ORDER = ('input_nodes', 'is_sorted', 'transform',
             'transform_sampler_output', 'filter_per_worker')
PYG_LINK_ORDER = ('master_addr', 'master_port', 'current_ctx',
                  'edge_label_index', 'edge_label', 'edge_label_time',
                  'dist_sampler', 'replace', 'subgraph_type', 'disjoint',
                  'temporal_strategy', 'neg_sampling', 'neg_sampling_ratio',
                  'time_attr', 'transform', 'concurrency', 'num_rpc_threads',
                  'filter_per_worker', 'async_sampling', 'device')
# Keyword-only: torch's DataLoader settings PyG's loaders pass on, then
# pyg_sar's own (seed, pad_batches, device, ids, node_attrs).
KEYWORDS = ('batch_size', 'shuffle', 'drop_last', 'num_workers',
            'prefetch_factor', 'generator', 'worker_init_fn', 'seed',
            'pad_batches', 'device', 'ids', 'node_attrs')

DEFAULTS: Dict[str, Any] = dict(
    input_nodes=None, batch_size=1, shuffle=False, drop_last=False,
    replace=False, seed=None, transform=None, pad_batches=None,
    edge_label_index=None, edge_label=None, edge_label_time=None,
    neg_sampling=None, neg_sampling_ratio=None, subgraph_type='directional',
    device=None, weight_attr=None, disjoint=False, time_attr=None,
    input_time=None, temporal_strategy='uniform',
    transform_sampler_output=None, num_workers=0, prefetch_factor=None,
    generator=None, worker_init_fn=None, ids=None, node_attrs=None,
    is_sorted=False, filter_per_worker=None, neighbor_sampler=None,
    directed=True)

# PyG's RPC settings: checked, then without effect (no RPC here).
_RPC = ('master_addr', 'master_port', 'current_ctx', 'concurrency',
        'num_rpc_threads', 'async_sampling', 'rpc_worker_names')
# Settings without effect on the batches (collate_fn: PyG's NodeLoader and
# LinkLoader drop a user's collate_fn too).
_NO_EFFECT = ('pin_memory', 'persistent_workers', 'filter_per_worker',
              'timeout', 'is_sorted', 'collate_fn', 'multiprocessing_context',
              'pin_memory_device', 'in_order')
_SUBGRAPH_TYPES = ('directional', 'bidirectional', 'induced')
EdgeType = Tuple[str, str, str]


def resolve(name: str, args: Sequence[Any], kwargs: Dict[str, Any],
            order: Tuple[str, ...], pyg_order: Tuple[str, ...]
            ) -> Dict[str, Any]:
    """The loader's options from a call in either form (see module docs),
    with defaults filled in; RPC and no-effect arguments checked and
    dropped. ``name`` is the loader's class name, for messages."""
    pyg_form = bool(args) and isinstance(args[0], str)
    names = pyg_order if pyg_form else order
    if len(args) > len(names):
        raise TypeError(f"{name} takes at most {len(names) + 2} positional "
                        f"arguments in this form (got {len(args) + 2})")
    options = dict(zip(names, args))
    for key, value in kwargs.items():
        if key in options:
            raise TypeError(f"{name} got multiple values for argument "
                            f"'{key}'")
        options[key] = value
    _check_rpc(name, options)
    for key in ('input_time', 'edge_label_time', 'replace'):
        value = options.get(key)
        if key == 'replace' and value is not None and not isinstance(
                value, (bool, int)) or key != 'replace' and isinstance(
                    value, (bool, int, float)):
            raise TypeError(
                f"{name}: {value!r} was passed as {key!r}, which it cannot "
                f"be (PyG's positional order applies: "
                f"{', '.join(order[:4])}, ...; batch_size, shuffle and "
                f"pyg_sar's options are keyword-only)")
    _check_unsupported(name, options)
    link = 'Link' in name
    known = [k for k in order + KEYWORDS if k not in (
        'is_sorted', 'filter_per_worker', 'neighbor_sampler', 'directed')]
    if not link:
        known += [k for k in ('input_time', ) if k not in known]
    for key in options:
        if key not in known:
            raise TypeError(f"{name} got an unexpected keyword argument "
                            f"'{key}'")
    return {**{k: DEFAULTS[k] for k in known}, **options}


def _check_rpc(name: str, options: Dict[str, Any]) -> None:
    from pyg_sar import comm
    ctx = options.pop('current_ctx', None)
    if ctx is not None:
        rank, world_size = comm.get_rank(), comm.get_world_size()
        theirs = (int(getattr(ctx, 'rank', -1)),
                  int(getattr(ctx, 'world_size', -1)))
        if theirs != (rank, world_size):
            raise ValueError(
                f"{name}: current_ctx says rank {theirs[0]} of "
                f"{theirs[1]}, but this process is rank {rank} of "
                f"{world_size} in the process group (pyg_sar samples on the "
                f"process group; its rank and world size must agree)")
    for key in ('concurrency', 'num_rpc_threads'):
        value = options.pop(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: {key} must be a positive int (got "
                             f"{value!r})")
    port = options.pop('master_port', None)
    if port is not None:
        try:
            int(port)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{name}: master_port must be a port number "
                             f"(got {port!r})") from e
    for key in ('master_addr', 'async_sampling', 'rpc_worker_names'):
        options.pop(key, None)


def _check_unsupported(name: str, options: Dict[str, Any]) -> None:
    """Refuses what would change the batches and is not implemented."""
    if options.pop('dist_sampler', None) is not None:
        raise ValueError(f"{name}: dist_sampler is not supported (pyg_sar "
                         f"samples with its own collective sampler)")
    link = 'Link' in name
    if link and options.get('input_time') is not None:
        raise ValueError(f"{name}: input_time is for node batches; link "
                         f"batches take edge_label_time")
    if link and options.get('edge_label_time') is not None and \
            options.get('time_attr') is None:
        raise ValueError(f"{name}: edge_label_time needs time_attr (the node "
                         f"or edge attribute holding the timestamps)")
    strategy = options.get('temporal_strategy', 'uniform')
    if strategy not in STRATEGIES:
        raise ValueError(f"{name}: temporal_strategy must be 'uniform' or "
                         f"'last' (got {strategy!r})")
    if strategy != 'uniform' and options.get('time_attr') is None:
        raise ValueError(f"{name}: temporal_strategy={strategy!r} needs "
                         f"time_attr")
    if link:
        options.pop('input_time', None)
    if not options.pop('directed', True):  # PyG's deprecated spelling
        import warnings
        warnings.warn(f"The usage of the 'directed' argument in '{name}' is "
                      f"deprecated. Use `subgraph_type='induced'` instead.",
                      stacklevel=4)
        options['subgraph_type'] = 'induced'
    if options.pop('neighbor_sampler', None) is not None:
        raise ValueError(f"{name}: neighbor_sampler is not supported (pyg_sar "
                         f"samples with its own collective sampler)")
    for key in ('sampler', 'batch_sampler'):
        if options.pop(key, None) is not None:
            raise ValueError(f"{name}: a custom {key} is not supported (PyG's "
                             f"loaders batch their input ids themselves; "
                             f"pyg_sar's ranks agree on the batches)")
    if options.get('dataset') is not None:
        raise ValueError(f"{name}: 'dataset' is not an argument (the inputs "
                         f"are input_nodes / edge_label_index)")
    options.pop('dataset', None)
    subgraph = options.get('subgraph_type', 'directional')
    subgraph = getattr(subgraph, 'value', subgraph)
    if subgraph not in _SUBGRAPH_TYPES:
        raise ValueError(f"{name}: subgraph_type={subgraph!r} is not "
                         f"supported (expected one of {_SUBGRAPH_TYPES})")
    if 'subgraph_type' in options:  # a loader without it refuses it
        options['subgraph_type'] = subgraph
    for key in _NO_EFFECT:
        options.pop(key, None)


# Options both node loaders (homogeneous and heterogeneous) share ###########

def store_batch_options(loader: Any, batch_size: Any, shuffle: Any,
                        drop_last: Any, replace: Any, transform: Any,
                        pad_batches: Any, device: Any,
                        transform_sampler_output: Any = None,
                        num_workers: Any = 0, prefetch_factor: Any = None,
                        worker_init_fn: Any = None) -> None:
    """Checks the batching options and sets them on ``loader``:
    ``pad_batches`` ``None`` (balanced inputs, :mod:`pyg_sar.loader.balance`)
    sets ``balanced``; ``pad_mode`` keeps the value given."""
    import torch
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) \
            or batch_size < 1:
        raise ValueError(f"'batch_size' must be a positive int (got "
                         f"{batch_size!r})")
    for name, value in (('transform', transform),
                        ('transform_sampler_output', transform_sampler_output),
                        ('worker_init_fn', worker_init_fn)):
        if value is not None and not callable(value):
            raise TypeError(f"'{name}' must be callable (got "
                            f"{type(value).__name__})")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) \
            or num_workers < 0:
        raise ValueError(f"'num_workers' must be an int >= 0 (got "
                         f"{num_workers!r})")
    if prefetch_factor is not None and (
            isinstance(prefetch_factor, bool) or
            not isinstance(prefetch_factor, int) or prefetch_factor < 1):
        raise ValueError(f"'prefetch_factor' must be a positive int (got "
                         f"{prefetch_factor!r})")
    if prefetch_factor is not None and num_workers == 0:
        raise ValueError("prefetch_factor option could only be specified in "
                         "multiprocessing (num_workers > 0), as torch's "
                         "DataLoader says")
    if pad_batches not in (None, True, False):
        raise ValueError(f"'pad_batches' must be None (balanced inputs), "
                         f"True or False (got {pad_batches!r})")
    loader.batch_size = batch_size
    loader.shuffle = bool(shuffle)
    loader.drop_last = bool(drop_last)
    loader.replace = bool(replace)
    loader.transform = transform
    loader.transform_sampler_output = transform_sampler_output
    loader.pad_mode = pad_batches
    loader.balanced = pad_batches is None
    loader.pad_batches = pad_batches is not False
    loader.device = None if device is None else torch.device(device)
    loader.num_workers = num_workers
    loader.prefetch_factor = prefetch_factor
    loader.worker_init_fn = worker_init_fn


def store_sampling_options(loader: Any, subgraph_type: str, disjoint: bool,
                           time_attr: Optional[str], input_time: Any,
                           temporal_strategy: str) -> None:
    """Checks the options that choose how neighborhoods are sampled
    (:func:`resolve` checked each alone) and sets them on ``loader``,
    after its batching options: ``subgraph_type`` and its flags
    ``bidirectional`` and ``induced``, ``disjoint`` (always with
    ``time_attr``, as in PyG), ``time_attr``, ``temporal_strategy``."""
    if time_attr is not None:
        disjoint = True  # as in PyG: temporal sampling is disjoint
        if loader.replace and temporal_strategy == 'last':
            raise ValueError("temporal_strategy='last' takes the most "
                             "recent edges; it cannot sample with "
                             "replacement")
    elif input_time is not None:
        raise ValueError("input_time needs time_attr (the node or edge "
                         "attribute holding the timestamps)")
    if subgraph_type == 'induced' and disjoint:
        raise ValueError("subgraph_type='induced' cannot be combined with "
                         "disjoint=True" + (" (time_attr makes sampling "
                                            "disjoint)" if time_attr else ""))
    loader.subgraph_type = subgraph_type
    loader.bidirectional = subgraph_type == 'bidirectional'
    loader.induced = subgraph_type == 'induced'
    loader.disjoint = bool(disjoint)
    loader.time_attr = time_attr
    loader.temporal_strategy = temporal_strategy


def check_num_neighbors(num_neighbors: Sequence[int]) -> List[int]:
    """The fanouts of a homogeneous graph, one per hop."""
    if isinstance(num_neighbors, dict):
        raise ValueError("'num_neighbors' must be a list of ints (one fanout "
                         "per hop); per-edge-type dictionaries need a "
                         "heterogeneous graph (this one is homogeneous)")
    if not isinstance(num_neighbors, (list, tuple)):
        raise TypeError(f"'num_neighbors' must be a list of ints, one fanout "
                        f"per hop (got {type(num_neighbors).__name__})")
    out = []
    for hop, fanout in enumerate(num_neighbors):
        if isinstance(fanout, bool) or not isinstance(fanout, int) or \
                fanout < -1:
            raise ValueError(f"'num_neighbors[{hop}]' must be an int >= 0, "
                             f"or -1 for all neighbors (got {fanout!r})")
        out.append(int(fanout))
    return out


def typed_num_neighbors(num_neighbors: Any, edge_types: List[EdgeType]
                        ) -> Dict[EdgeType, List[int]]:
    """The fanouts of every edge type, per hop, from a list (the same for
    every edge type), a per-edge-type dict or PyG's ``NumNeighbors``."""
    try:
        from torch_geometric.sampler.base import NumNeighbors
        if isinstance(num_neighbors, NumNeighbors):
            num_neighbors = num_neighbors.get_values(edge_types)
    except ImportError:  # pragma: no cover
        pass
    if not isinstance(num_neighbors, dict):
        fanouts = check_num_neighbors(num_neighbors)
        return {e: list(fanouts) for e in edge_types}
    names = {'__'.join(e): e for e in edge_types}
    out: Dict[EdgeType, List[int]] = {}
    for key, value in num_neighbors.items():
        edge_type = tuple(key) if isinstance(key, (tuple, list)) else \
            names.get(key)
        if edge_type not in edge_types:
            raise ValueError(f"'num_neighbors' names edge type {key!r}, "
                             f"which the graph lacks (edge types: "
                             f"{edge_types})")
        try:
            out[edge_type] = check_num_neighbors(value)
        except (TypeError, ValueError) as err:
            raise type(err)(f"'num_neighbors[{key!r}]': {err}") from None
    missing = [e for e in edge_types if e not in out]
    if missing:
        raise ValueError(f"'num_neighbors' misses edge types {missing}; give "
                         f"a fanout list for every edge type (or one list "
                         f"for all)")
    hops = {len(v) for v in out.values()}
    if len(hops) > 1:
        raise ValueError(f"'num_neighbors' must give every edge type the "
                         f"same number of hops (got {sorted(hops)})")
    return {e: out[e] for e in edge_types}


def typed_num_samples(num_samples: Any, node_types: List[str]
                      ) -> Dict[str, List[int]]:
    """HGT's nodes to sample per iteration for every node type, from a list
    (the same for every type) or a dict ``{node type: list}`` naming every
    node type, all lists as long (the number of iterations)."""
    if not isinstance(num_samples, dict):
        if not isinstance(num_samples, (list, tuple)):
            raise TypeError(f"'num_samples' must be a list of ints (nodes per "
                            f"iteration) or a dict node type -> list (got "
                            f"{type(num_samples).__name__})")
        num_samples = {t: num_samples for t in node_types}
    unknown = [t for t in num_samples if t not in node_types]
    missing = [t for t in node_types if t not in num_samples]
    if unknown or missing:
        raise ValueError(f"'num_samples' must give every node type a list "
                         f"(node types: {node_types}; unknown: {unknown}, "
                         f"missing: {missing})")
    out: Dict[str, List[int]] = {}
    for t in node_types:
        values = num_samples[t]
        if not isinstance(values, (list, tuple)) or any(
                isinstance(n, bool) or not isinstance(n, int) or n < 0
                for n in values):
            raise ValueError(f"'num_samples[{t!r}]' must be a list of ints "
                             f">= 0, one per iteration (got {values!r})")
        out[t] = [int(n) for n in values]
    lengths = {len(v) for v in out.values()}
    if len(lengths) > 1:
        raise ValueError(f"'num_samples' must give every node type the same "
                         f"number of iterations (got lengths "
                         f"{sorted(lengths)})")
    return out


def count_batches_and_seed(loader: Any, seed: Optional[int],
                           generator: Any, counts: List[int]) -> None:
    """Sets ``loader.num_batches`` (this rank's batches),
    ``num_global_batches`` (the most of any rank) from every rank's number
    of inputs ``counts`` (:func:`~pyg_sar.loader.seeds.num_epoch_batches`),
    ``seed`` and ``generator``: one stream per rank, which shuffles this
    rank's seeds and samples the requests this rank answers, so (seed,
    world size) fixes everything. A ``generator`` (PyG's DataLoader
    argument) draws the seed; ``None`` for both draws it from torch's
    global generator."""
    import torch
    from pyg_sar.loader.seeds import num_epoch_batches
    batches = num_epoch_batches(counts, loader.batch_size, loader.drop_last,
                                loader.balanced)
    loader.batch_counts = batches
    loader.num_batches = batches[loader.rank]
    loader.num_global_batches = max(batches)
    if generator is not None:
        if seed is not None:
            raise ValueError("pass either 'seed' or 'generator', not both")
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"'generator' must be a torch.Generator (got "
                            f"{type(generator).__name__})")
        seed = int(torch.randint(2**62, (), dtype=torch.long,
                                 generator=generator))
    if seed is None:
        seed = int(torch.randint(2**62, (), dtype=torch.long))
    loader.seed = int(seed)
    loader.generator = torch.Generator().manual_seed(
        (loader.seed * 1_000_003 + loader.rank) % (2**63 - 1))


def check_world(shard: Any) -> None:
    """This rank holds part ``rank`` of as many parts as there are ranks
    (checked before the first collective)."""
    from pyg_sar import comm
    world_size, rank = comm.get_world_size(), comm.get_rank()
    if world_size != shard.num_parts or rank != shard.rank:
        raise ValueError(
            f"rank {rank} of {world_size} was given part {shard.rank} of "
            f"{shard.num_parts}; launch one worker per part and load "
            f"part r on rank r")


def agree_with_peers(shard: Any, options: Dict[str, Any], num_inputs: int,
                     what: str = 'DistNeighborLoader') -> List[int]:
    """Checks (collectively) that every rank built its loader (``what``)
    with the same ``options`` (``{name: value}``: the partition and every
    option that decides which messages a round exchanges) and the same
    shared communication settings; a difference is a
    :class:`~pyg_sar.comm.SettingsMismatchError` naming it, on every rank.
    Prepares the loaders' channel and returns every rank's number of
    inputs (``num_inputs`` here)."""
    from pyg_sar import comm
    check_world(shard)
    everyone = comm.agree(f'building a {what}', options, num_inputs)
    comm.ensure_channels(('loader', ))
    return [int(n) for n in everyone]


def constructor_signature(cls: type, order: Sequence[str],
                          pyg_order: Sequence[str],
                          second: str = 'num_neighbors'
                          ) -> inspect.Signature:
    """The signature ``help()`` and the docs show for a loader class.

    The loaders take ``(data, num_neighbors, *args, **kwargs)`` (``second``
    names ``num_neighbors``: HGT's ``num_samples``) because they
    accept two positional orders (pyg_sar's ``order`` and PyG's
    ``pyg_order``, see :func:`resolve`) and ``__new__`` picks the
    heterogeneous loader for a heterogeneous part. This is pyg_sar's order
    with its defaults, then every other accepted option keyword-only, with
    the annotations of ``cls._setup``.
    """
    accepted = {**{k: DEFAULTS[k] for k in order},
                **resolve(cls.__name__, (), {}, order, pyg_order)}
    setup = inspect.signature(cls._setup).parameters

    def param(name: str, kind: Any) -> inspect.Parameter:
        typed = setup.get(name)
        return inspect.Parameter(
            name, kind, default=accepted.get(name, inspect.Parameter.empty),
            annotation=inspect.Parameter.empty if typed is None
            else typed.annotation)

    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return inspect.Signature(
        [param(name, positional) for name in ('data', second)]
        + [param(name, positional) for name in order]
        + [param(name, inspect.Parameter.KEYWORD_ONLY)
           for name in accepted if name not in order])

