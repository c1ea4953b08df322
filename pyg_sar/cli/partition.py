"""``pyg-sar partition`` (a dataset into PyG's distributed format) and
``pyg-sar info`` (the manifest of a partition directory)."""
import argparse
import json
import os.path as osp
import time
from typing import Any, Dict, List

from pyg_sar.cli.registry import register_command


def _configure_partition(parser: argparse.ArgumentParser) -> None:
    from pyg_sar.datasets import SYNTHETIC_DEFAULTS
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        '--dataset',
        help="'synthetic', 'synthetic-hetero', Cora, CiteSeer, PubMed, "
        "Computers, Photo, CS, Physics, DBLP, IMDB (heterogeneous) or ogbn-* "
        "(needs the ogb package)")
    source.add_argument(
        '--input', metavar='DIR',
        help='a graph directory (pyg_sar.partition.input.ondisk: .npy files '
        'read memory-mapped); under torchrun --nproc-per-node K, K processes '
        'write the shards')
    parser.add_argument(
        '--root', default='data',
        help='dataset root; PyG downloads the raw files here when absent '
        '(default: %(default)s)')
    parser.add_argument('--num-parts', type=int, required=True)
    parser.add_argument('--out', required=True, help='output directory')
    from pyg_sar.partition.layout import METHODS
    parser.add_argument('--method', choices=['auto'] + list(METHODS),
                        default='auto',
                        help='kaminpar from 10M edges on, else metis '
                             '(default: auto)')
    parser.add_argument('--threads', type=int, default=None,
                        help="KaMinPar's threads (default: 1, reproducible)")
    parser.add_argument('--no-balance-train', action='store_true',
                        help='do not balance training nodes across parts')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--overwrite', action='store_true',
                        help='replace an existing partition in --out')
    parser.add_argument('--allow-non-finite', action='store_true',
                        help='partition node/edge features that hold NaN '
                        'or inf (refused by default)')
    group = parser.add_argument_group('graph directory (--input)')
    group.add_argument('--assignment', metavar='FILE.npy',
                       help='one part id per node (integer .npy) instead of '
                       'computing the assignment')
    group.add_argument('--max-unit-edges', type=int, default=None,
                       help='in-edges of a part written per pass over the '
                       'edge list (bounds the writer\'s memory)')
    group.add_argument('--no-resume', action='store_true',
                       help='start over instead of resuming a run into '
                       '--out that died (its work directory .<out>.work '
                       'is discarded)')
    group.add_argument('--timeout-min', type=float, default=120.0,
                       help='longest wait of a parallel writer for the '
                       'others, in minutes (default: %(default)s)')
    group = parser.add_argument_group('synthetic dataset')
    for name, value in SYNTHETIC_DEFAULTS.items():
        group.add_argument(f"--{name.replace('_', '-')}", type=type(value),
                           default=None,
                           help=f'(default: {value})')


def _run_partition(args: argparse.Namespace) -> int:
    from pyg_sar import datasets
    from pyg_sar.partition.write.out_dir import check_out_dir
    from pyg_sar.partition import partition_graph

    if args.input is not None:
        return _run_partition_input(args)
    # Fail before the (possibly slow) dataset load, not after it.
    check_out_dir(osp.abspath(args.out), args.overwrite)

    synthetic_options = {
        name: getattr(args, name)
        for name in datasets.SYNTHETIC_DEFAULTS
        if getattr(args, name) is not None
    }
    if args.dataset == 'synthetic-hetero':
        synthetic_options = _hetero_options(synthetic_options)
    elif synthetic_options and args.dataset != 'synthetic':
        raise ValueError(f"Options {sorted(synthetic_options)} only apply to "
                         f"--dataset synthetic or synthetic-hetero")
    for name in ('assignment', 'max_unit_edges', 'no_resume'):
        if getattr(args, name) not in (None, False):
            raise ValueError(f"Option '--{name.replace('_', '-')}' only "
                             f"applies to --input")
    start = time.perf_counter()
    print(f'Loading {args.dataset}...', flush=True)
    data = datasets.load(args.dataset, args.root, seed=args.seed,
                         **synthetic_options)
    load_time = time.perf_counter() - start
    print(f'Loaded {args.dataset}: {data.num_nodes:,} nodes, '
          f'{data.num_edges:,} edges ({load_time:.1f}s); partitioning into '
          f'{args.num_parts} parts ({args.method})...', flush=True)

    manifest = partition_graph(data, args.num_parts, args.out,
                               method=args.method,
                               balance_train=not args.no_balance_train,
                               seed=args.seed, overwrite=args.overwrite,
                               allow_non_finite=args.allow_non_finite,
                               **_threads(args))
    _print_result(args, manifest)
    print(f"time: {manifest['time_s']['total']:.1f}s partition, "
          f"{load_time:.1f}s load")
    if manifest.get('is_hetero'):
        print(_type_table(manifest))
    return 0


def _run_partition_input(args: argparse.Namespace) -> int:
    r"""``--input DIR``: a graph directory, written by one process or, under
    ``torchrun``, by every rank
    (:func:`~pyg_sar.partition.partition_graph_parallel`)."""
    import os
    from datetime import timedelta

    import torch

    from pyg_sar.comm import ProcessGroupExchange, init_distributed
    from pyg_sar.partition import partition_graph_parallel
    from pyg_sar.partition.input.ondisk import GraphOnDisk, open_npy

    from pyg_sar.datasets import SYNTHETIC_DEFAULTS
    synthetic = [name for name in SYNTHETIC_DEFAULTS
                 if getattr(args, name, None) is not None]
    if synthetic:
        raise ValueError(f"Options {synthetic} only apply to --dataset "
                         f"synthetic")
    rank = 0
    if int(os.environ.get('WORLD_SIZE', '1')) > 1:
        rank, _ = init_distributed(
            backend='gloo', timeout=timedelta(minutes=args.timeout_min))
    graph = GraphOnDisk(args.input)
    assignment = None
    if args.assignment is not None and rank == 0:
        import numpy as np
        array = open_npy(osp.abspath(args.assignment), 'assignment')
        assignment = torch.from_numpy(np.array(array))
    kwargs = {}
    if args.max_unit_edges is not None:
        kwargs['max_unit_edges'] = args.max_unit_edges
    if args.no_resume:
        kwargs['resume'] = False
    if rank == 0:
        print(f'Partitioning {graph.root}: {graph.num_nodes:,} nodes, '
              f'{graph.num_edges:,} edges into {args.num_parts} parts '
              f'({args.method})...', flush=True)
    manifest = partition_graph_parallel(
        graph, args.num_parts, args.out, method=args.method,
        balance_train=not args.no_balance_train, seed=args.seed,
        overwrite=args.overwrite, allow_non_finite=args.allow_non_finite,
        assignment=assignment, **kwargs, **_threads(args),
        exchange=ProcessGroupExchange())
    if manifest is not None:
        _print_result(args, manifest)
        print(f"time: {manifest['time_s']['total']:.1f}s partition" + (
            f" (resumed after: {', '.join(manifest['resumed'])})"
            if manifest.get('resumed') else ''))
    return 0


def _threads(args: argparse.Namespace) -> Dict[str, Any]:
    return {} if args.threads is None else {'threads': args.threads}


def _print_result(args: argparse.Namespace, manifest: Dict[str, Any]) -> None:
    cut = manifest['edge_cut']
    balance = manifest['balance']
    print(f"Wrote {manifest['num_parts']} parts to {args.out} "
          f"({manifest['method']})")
    print(f"edge cut: {cut['count']:,} edges ({100 * cut['fraction']:.2f}%)")
    print(f"balance (max/mean): nodes {balance['nodes_max_over_mean']:.3f}, "
          f"edges {balance['edges_max_over_mean']:.3f}" +
          (f", train {balance['train_max_over_mean']:.3f}"
           if 'train_max_over_mean' in balance else ''))


def _hetero_options(options: Dict[str, Any]) -> Dict[str, Any]:
    r"""Maps the synthetic options to :func:`synthetic_hetero_graph`'s:
    :obj:`--num-nodes` is the number of papers."""
    if 'avg_degree' in options:
        raise ValueError("Option '--avg-degree' does not apply to --dataset "
                         "synthetic-hetero (its degrees follow ogbn-mag)")
    mapped = dict(options)
    if 'num_nodes' in mapped:
        mapped['num_papers'] = mapped.pop('num_nodes')
    return mapped


def _type_table(manifest: Dict[str, Any]) -> str:
    r"""Per node type and edge type: count, balance over the parts and (for
    edge types) the edge cut."""
    balance = manifest['balance_per_type']
    cut = manifest['edge_cut']['per_type']
    rows = [[t, 'node', f"{manifest['num_nodes_dict'][t]:,}",
             f"{balance['nodes'][t]:.3f}", '-']
            for t in manifest['node_types']]
    for edge_type in manifest['edge_types']:
        name = '__'.join(edge_type)
        rows.append([name, 'edge', f"{manifest['num_edges_dict'][name]:,}",
                     f"{balance['edges'][name]:.3f}",
                     f"{100 * cut[name]['fraction']:.2f}%"])
    return _format_table(['type', 'kind', 'count', 'balance', 'cut'], rows)


# info ########################################################################


def _configure_info(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('dir', help='partition directory')
    parser.add_argument('--json', action='store_true',
                        help='print the raw manifest')


def _format_table(header: List[str], rows: List[List[str]]) -> str:
    widths = [
        max(len(str(cell)) for cell in column)
        for column in zip(header, *rows)
    ]
    lines = [
        '  '.join(str(cell).rjust(width) for cell, width in zip(row, widths))
        for row in [header, ['-' * w for w in widths], *rows]
    ]
    return '\n'.join(lines)


def _run_info(args: argparse.Namespace) -> int:
    from pyg_sar.partition.layout import MANIFEST_FILE
    from pyg_sar.partition.read.manifest import (check_summary, parse_json,
                                                 read_bytes)
    path = osp.join(args.dir, MANIFEST_FILE)
    if not osp.isfile(path):
        raise FileNotFoundError(f"'{path}' not found; is '{args.dir}' a "
                                f"partition written by pyg-sar?")
    manifest = parse_json(read_bytes(path), path)
    if args.json:  # as it is, whatever its version
        print(json.dumps(manifest, indent=2))
        return 0

    hetero = check_summary(manifest, path)
    try:  # fields that refer to each other (types, parts) may still clash
        text = (_hetero_info(args.dir, manifest) if hetero else
                _homogeneous_info(args.dir, manifest))
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise ValueError(f"Partition file '{path}' is inconsistent "
                         f"({type(e).__name__}: {e})") from None
    print(text)
    return 0


def _summary(rows: List[List[Any]]) -> str:
    width = max(len(key) for key, _ in rows)
    return '\n'.join(f'{key.ljust(width)}  {value}' for key, value in rows)


def _homogeneous_info(directory: str, manifest: Dict[str, Any]) -> str:
    r"""``pyg-sar info`` of a homogeneous partition: a summary and one row
    per part."""
    cut = manifest['edge_cut']
    source = manifest['source']
    summary = [
        ['directory', directory],
        ['pyg_sar version', manifest['pyg_sar_version']],
        ['method', manifest['method']],
        ['parts', manifest['num_parts']],
        ['nodes', f"{manifest['num_nodes']:,}"],
        ['edges', f"{manifest['num_edges']:,}"],
        ['edge cut', f"{cut['count']:,} ({100 * cut['fraction']:.2f}%)"],
        *[[f'balance {key}', value]
          for key, value in manifest['balance'].items()],
        ['node attributes', _attr_list(source['node_attrs'])],
        ['edge attributes', _attr_list(source['edge_attrs'])],
        ['permutation', manifest['perm_file']],
        ['partition time', f"{manifest['time_s'].get('total', 0):.1f}s"],
    ]
    header = ['part', 'nodes', 'edges', 'train', 'remote edges', 'halo nodes']
    rows = []
    for i, part in enumerate(manifest['parts']):
        train = part['num_train_nodes']
        rows.append([
            i, f"{part['num_nodes']:,}", f"{part['num_edges']:,}",
            '-' if train is None else f'{train:,}',
            f"{part['num_remote_edges']:,}", f"{part['num_halo_nodes']:,}"
        ])
    return f'{_summary(summary)}\n\n{_format_table(header, rows)}'


def _attr_list(infos: Dict[str, Any]) -> str:
    return ', '.join(f"{k}{v['shape']}:{v['dtype'].replace('torch.', '')}"
                     for k, v in infos.items()) or '-'


def _hetero_info(directory: str, manifest: Dict[str, Any]) -> str:
    r"""``pyg-sar info`` of a heterogeneous partition: a summary, one row
    per node and edge type, and per part the node and edge counts of every
    type."""
    cut = manifest['edge_cut']
    source = manifest['source']
    summary = [
        ['directory', directory],
        ['pyg_sar version', manifest['pyg_sar_version']],
        ['method', manifest['method']],
        ['parts', manifest['num_parts']],
        ['node types', len(manifest['node_types'])],
        ['edge types', len(manifest['edge_types'])],
        ['nodes', f"{manifest['num_nodes']:,}"],
        ['edges', f"{manifest['num_edges']:,}"],
        ['edge cut', f"{cut['count']:,} ({100 * cut['fraction']:.2f}%)"],
        *[[f'balance {key}', value]
          for key, value in manifest['balance'].items()],
        *[[f'attributes {t}', _attr_list(infos)]
          for t, infos in source['node_attrs'].items()],
        *[[f'attributes {e}', _attr_list(infos)]
          for e, infos in source['edge_attrs'].items()],
        ['partition time', f"{manifest['time_s'].get('total', 0):.1f}s"],
    ]
    names = ['__'.join(e) for e in manifest['edge_types']]
    header = ['part', *manifest['node_types'], *names, 'train',
              'remote edges', 'halo nodes']
    rows = []
    for i, part in enumerate(manifest['parts']):
        train = part['num_train_nodes']
        rows.append([
            i, *[f"{part['num_nodes_dict'][t]:,}"
                 for t in manifest['node_types']],
            *[f"{part['num_edges_dict'][n]:,}" for n in names],
            '-' if train is None else f'{sum(train.values()):,}',
            f"{part['num_remote_edges']:,}",
            f"{sum(part['num_halo_nodes'].values()):,}"
        ])
    return '\n\n'.join([_summary(summary), _type_table(manifest),
                        _format_table(header, rows)])


register_command('partition', 'Partition a dataset into PyG\'s '
                 'distributed format', _configure_partition, _run_partition)
register_command('info', 'Show the manifest of a partition directory',
                 _configure_info, _run_info)
