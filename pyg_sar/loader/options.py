"""The loaders' arguments: pyg_sar's own call and PyG's
``torch_geometric.distributed`` call, argument for argument.

``DistNeighborLoader(data, num_neighbors, master_addr, master_port,
current_ctx, input_nodes, ...)`` is how PyG's distributed loaders are called;
``DistNeighborLoader(data, num_neighbors, input_nodes, batch_size, ...)`` is
pyg_sar's. A string in the third position (``master_addr``) selects PyG's
positional order. Arguments that configure PyG's RPC machinery are checked
against the running process group and otherwise have no effect; arguments
that would change which batch comes out are either implemented or refused
with an error naming them.
"""
from __future__ import annotations

from typing import Any, Dict, Sequence, Tuple

NODE_ORDER = ('input_nodes', 'batch_size', 'shuffle', 'drop_last', 'replace',
              'seed', 'transform', 'pad_batches')
LINK_ORDER = ('edge_label_index', 'edge_label', 'edge_label_time',
              'neg_sampling', 'neg_sampling_ratio', 'batch_size', 'shuffle',
              'drop_last', 'replace', 'seed', 'transform', 'pad_batches')
PYG_NODE_ORDER = ('master_addr', 'master_port', 'current_ctx', 'input_nodes',
                  'input_time', 'dist_sampler', 'replace', 'subgraph_type',
                  'disjoint', 'temporal_strategy', 'time_attr', 'transform',
                  'concurrency', 'num_rpc_threads', 'filter_per_worker',
                  'async_sampling', 'device')
PYG_LINK_ORDER = ('master_addr', 'master_port', 'current_ctx',
                  'edge_label_index', 'edge_label', 'edge_label_time',
                  'dist_sampler', 'replace', 'subgraph_type', 'disjoint',
                  'temporal_strategy', 'neg_sampling', 'neg_sampling_ratio',
                  'time_attr', 'transform', 'concurrency', 'num_rpc_threads',
                  'filter_per_worker', 'async_sampling', 'device')

DEFAULTS: Dict[str, Any] = dict(
    input_nodes=None, batch_size=1, shuffle=False, drop_last=False,
    replace=False, seed=None, transform=None, pad_batches=False,
    edge_label_index=None, edge_label=None, edge_label_time=None,
    neg_sampling=None, neg_sampling_ratio=None, subgraph_type='directional',
    device=None, weight_attr=None, disjoint=False, time_attr=None,
    input_time=None, temporal_strategy='uniform')

# PyG's RPC settings: checked, then without effect (no RPC here).
_RPC = ('master_addr', 'master_port', 'current_ctx', 'concurrency',
        'num_rpc_threads', 'async_sampling', 'rpc_worker_names')
# DataLoader settings without effect on the batches.
_NO_EFFECT = ('pin_memory', 'persistent_workers', 'prefetch_factor',
              'filter_per_worker', 'timeout', 'is_sorted')
_SUBGRAPH_TYPES = ('directional', 'bidirectional', 'induced')


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
    _check_unsupported(name, options)
    extra = ('subgraph_type', 'device', 'weight_attr', 'disjoint',
             'time_attr', 'temporal_strategy') + (
        ('input_time', ) if name == 'DistNeighborLoader' else ())
    known = set(order) | set(extra)
    for key in options:
        if key not in known:
            raise TypeError(f"{name} got an unexpected keyword argument "
                            f"'{key}'")
    return {**{k: DEFAULTS[k] for k in order + extra}, **options}


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
    link = name != 'DistNeighborLoader'
    if link and options.get('input_time') is not None:
        raise ValueError(f"{name}: input_time is for node batches; link "
                         f"batches take edge_label_time")
    if link and options.get('edge_label_time') is not None and \
            options.get('time_attr') is None:
        raise ValueError(f"{name}: edge_label_time needs time_attr (the node "
                         f"or edge attribute holding the timestamps)")
    strategy = options.get('temporal_strategy', 'uniform')
    if strategy not in ('uniform', 'last'):
        raise ValueError(f"{name}: temporal_strategy must be 'uniform' or "
                         f"'last' (got {strategy!r})")
    if strategy != 'uniform' and options.get('time_attr') is None:
        raise ValueError(f"{name}: temporal_strategy={strategy!r} needs "
                         f"time_attr")
    if link:
        options.pop('input_time', None)
    if not options.pop('directed', True):
        raise ValueError(f"{name}: directed=False is not supported; use "
                         f"subgraph_type='bidirectional'")
    workers = options.pop('num_workers', 0)
    if workers != 0:
        raise ValueError(f"{name} supports only num_workers=0 (got "
                         f"{workers!r}); sampling is a collective and runs "
                         f"in the training process")
    subgraph = options.get('subgraph_type', 'directional')
    subgraph = getattr(subgraph, 'value', subgraph)
    if subgraph not in _SUBGRAPH_TYPES:
        raise ValueError(f"{name}: subgraph_type={subgraph!r} is not "
                         f"supported (expected one of {_SUBGRAPH_TYPES})")
    options['subgraph_type'] = subgraph
    for key in _NO_EFFECT:
        options.pop(key, None)
