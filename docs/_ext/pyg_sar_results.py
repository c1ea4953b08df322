"""Benchmark result tables, generated from the results' JSON.

``.. pyg-sar-device-check:: layers`` (or ``attention``, ``autocast``, ``budget``,
``sharing``, ``cpu``, ``largest``, ``exact``, ``targets``, ``device``)
renders one section of ``benchmarks/results/device_check.json`` (the output
of ``benchmarks/device_check.py``) as a table, so the page shows the last
committed run and cannot drift from it. A section the run did not reach
says so. ``.. pyg-sar-scaling::`` does the same for ``scaling.json``,
``.. pyg-sar-sampling::`` for ``sampling.json``,
``.. pyg-sar-fused-attention:: NAME`` for ``NAME.json`` of
``fused_attention.py``, ``.. pyg-sar-full-batch:: NAME`` for that of
``full_batch.py``.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.util.docutils import SphinxDirective
from sphinx.util.parsing import nested_parse_to_nodes

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'benchmarks', 'results')


def _num(value: Optional[float], digits: int = 3) -> str:
    if value is None:
        return '-'
    if abs(value) >= 100:
        return f'{value:,.0f}'
    return f'{value:.{digits}f}'


def _table(header: List[str], rows: List[List[str]]) -> List[str]:
    lines = ['.. list-table::', '   :header-rows: 1', '']
    for row in [header] + rows:
        lines.append(f'   * - {row[0]}')
        lines.extend(f'     - {cell}' for cell in row[1:])
    return lines + ['']


def _outcome(entry: Dict[str, Any]) -> Optional[str]:
    for key in ('skipped', 'error'):
        if entry.get(key):
            return f'{key}: {entry[key]}'
    return None


def _layers(result: dict, name: str) -> List[str]:
    rows = []
    for r in result.get(name, []):
        pyg, sar = r.get('pyg', {}), r.get('sar', {})
        missing = _outcome(r) or _outcome(pyg) or _outcome(sar)
        label = r.get('layer', '?') + (f" ({r['dtype']})" if r.get('dtype')
                                       else '')
        if missing and 'epoch_ratio' not in r:
            rows.append([label, missing, '', '', '', '', '', ''])
            continue
        rows.append([label, _num(pyg.get('epoch_s')),
                     _num(sar.get('epoch_s')), _num(r.get('epoch_ratio'), 2),
                     _num(pyg.get('peak_mib')), _num(sar.get('peak_mib')),
                     _num(r.get('memory_ratio'), 2),
                     f"{r.get('loss_rel_diff', 0):.0e}"])
    return _table(['layer', 'stock epoch (s)', 'pyg_sar epoch (s)', 'ratio',
                   'stock peak (MiB)', 'pyg_sar peak (MiB)', 'ratio',
                   'first loss, rel. diff.'], rows)


def _attention(result: dict) -> List[str]:
    rows = []
    for r in result.get('attention', []):
        pyg, sar = r.get('pyg', {}), r.get('sar', {})
        unfused = r.get('sar_unfused', {})
        missing = _outcome(r) or _outcome(pyg) or _outcome(sar)
        if missing and 'epoch_ratio' not in r:
            rows.append([r.get('layer', '?'), missing] + [''] * 8)
            continue
        fused = any(' True ' in p for p in r.get('paths', []))
        rows.append([r['layer'], 'fused kernels' if fused else
                     'separate operators', _num(pyg.get('epoch_s')),
                     _num(sar.get('epoch_s')), _num(r.get('epoch_ratio'), 2),
                     _outcome(unfused) or _num(unfused.get('epoch_s')),
                     _num(pyg.get('peak_mib')), _num(sar.get('peak_mib')),
                     _num(r.get('memory_ratio'), 2),
                     _outcome(unfused) or _num(unfused.get('peak_mib'))])
    return _table(['layer', 'pyg_sar path', 'stock epoch (s)',
                   'pyg_sar epoch (s)', 'ratio',
                   'pyg_sar, PYG_SAR_FUSED=0 (s)', 'stock peak (MiB)',
                   'pyg_sar peak (MiB)', 'ratio',
                   'pyg_sar, PYG_SAR_FUSED=0 peak (MiB)'], rows)


def _budget(result: dict) -> List[str]:
    rows = [[f"{r['budget_mib']:,}" + (' (default)' if r.get('default')
                                       else ''),
             _outcome(r) or _num(r.get('epoch_s')), _num(r.get('peak_mib'))]
            for r in result.get('budget', [])]
    return _table(['edge_memory_budget (MiB)', 'GAT epoch (s)',
                   'peak (MiB)'], rows)


def _sharing(result: dict) -> List[str]:
    rows = [[str(r.get('workers')), ', '.join(r.get('backends', [])) or '-',
             _outcome(r) or _num(r.get('epoch_s')),
             _num(r.get('peak_mib_per_rank'))]
            for r in result.get('sharing', [])]
    return _table(['ranks on one GPU', 'backend chosen', 'epoch (s)',
                   'peak per rank (MiB)'], rows)


def _cpu(result: dict) -> List[str]:
    rows = []
    for r in result.get('cpu', []):
        rows.append([r.get('model', '?'),
                     'stock PyG' if r.get('impl') == 'pyg' else 'pyg_sar',
                     f"{r.get('workers')} x {r.get('threads')}",
                     _outcome(r) or _num(r.get('epoch_s')),
                     _num(r.get('peak_mib_per_rank'))])
    return _table(['model', 'run', 'workers x threads', 'epoch (s)',
                   'peak per worker (MiB)'], rows)


def _largest(result: dict) -> List[str]:
    rows = [[r.get('impl', '-'), f"{r.get('nodes', 0):,}",
             _outcome(r) or 'trained', _num(r.get('peak_mib'))]
            for r in result.get('largest', [])]
    return _table(['run', 'nodes', 'outcome', 'peak (MiB)'], rows)


def _exact(result: dict) -> List[str]:
    rows = []
    for r in result.get('exact', []):
        rows.append([', '.join(f'``{f}``' for f in r.get('files', [])),
                     _outcome(r) or r.get('summary', '-'),
                     ' '.join(r.get('tail', []))[-200:] or '-'])
    return _table(['tests', 'outcome', 'last output'], rows)


def _targets(result: dict) -> List[str]:
    rows = [[t['target'], _num(t['value']), 'met' if t['met'] else
             '**not met**'] for t in result.get('targets', [])]
    return _table(['target', 'value', ''], rows)


def _device(result: dict) -> List[str]:
    env = result['env']
    runs = env.get('runs', [env])
    lines = [f"Measured on **{env['device_name']}** "
             f"({env.get('gpu_memory_gib') or 0:.0f} GiB) with "
             f"{env['cpu_count']} CPU cores, torch {env['torch']}, PyG "
             f"{env['pyg']}; {env['nodes']:,} nodes for one device, "
             f"{env['cpu_nodes']:,} for several workers, "
             f"{len(runs)} run(s) of the check merged:", '']
    for k, run in enumerate(runs, 1):
        sections = ', '.join(run.get('sections', [])) or 'all'
        date = f" ({run['date']})" if run.get('date') else ''
        lines.append(f'- run {k}{date}: {sections}')
    return lines + ['']


_SECTIONS = {
    'layers': lambda r: _layers(r, 'layers'),
    'attention': _attention,
    'autocast': lambda r: _layers(r, 'autocast'),
    'budget': _budget, 'sharing': _sharing, 'cpu': _cpu,
    'largest': _largest, 'exact': _exact, 'targets': _targets,
    'device': _device,
}


class DeviceCheck(SphinxDirective):
    required_arguments = 1

    def run(self):
        section = self.arguments[0]
        if section not in _SECTIONS:
            raise ExtensionError(f"pyg-sar-device-check: unknown section "
                                 f"{section!r} (expected one of "
                                 f"{sorted(_SECTIONS)})")
        path = os.path.join(RESULTS, 'device_check.json')
        self.env.note_dependency(path)
        with open(path) as f:
            result = json.load(f)
        if section not in ('device', 'targets') and section not in result:
            lines = [f'*Not measured in the last run* ({section}).', '']
        else:
            lines = _SECTIONS[section](result)
        return nested_parse_to_nodes(self.state, StringList(lines),
                                     source=path)


class Scaling(SphinxDirective):
    """``.. pyg-sar-scaling::``: ``benchmarks/results/scaling.json``
    (``benchmarks/scaling.py``) as a table."""

    def run(self):
        path = os.path.join(RESULTS, 'scaling.json')
        self.env.note_dependency(path)
        with open(path) as f:
            result = json.load(f)
        rows = [[r['model'], f"{r['workers']} x {r['threads']}",
                 _num(r['epoch_s']), _num(r.get('vs_stock'), 2),
                 _num(r.get('efficiency'), 2),
                 _num(r.get('split_ratio'), 2)] for r in result['table']]
        lines = [f"{result['nodes']:,} nodes, {result['cores']} cores, "
                 f"{result['epochs']} timed epochs per run:", ''] + _table(
            ['model', 'workers x threads', 'epoch (s)', 'vs stock PyG',
             'efficiency t(1) / (N t(N))', 'split t(N) / t(1)'], rows)
        return nested_parse_to_nodes(self.state, StringList(lines),
                                     source=path)


class Sampling(SphinxDirective):
    """``.. pyg-sar-sampling::``: ``benchmarks/results/sampling.json``
    (``benchmarks/sampling.py``) as a table, with the run's graph,
    machine, load and PyG baseline."""

    def run(self):
        path = os.path.join(RESULTS, 'sampling.json')
        self.env.note_dependency(path)
        with open(path) as f:
            result = json.load(f)
        rows = []
        for r in result['results']:
            ratios = r.get('ratios_per_round')
            rows.append([r['name'], _num(r['seeds_per_s_per_process']),
                         f"{r['nodes_per_seed']:.1f}",
                         f"{r['edges_per_seed']:.1f}",
                         _num(r.get('ratio_to_pyg'), 2),
                         ', '.join(f'{x:.2f}' for x in ratios)
                         if ratios else '-'])
        baseline = (f"PyG's sampler: ``{result['baseline_backend']}``"
                    if result['baseline_available'] else
                    f"PyG baseline not run: {result['baseline_reason']}")
        lines = [
            f"{result['num_nodes']:,} nodes, {result['num_edges']:,} edges, "
            f"fanouts ``{result['fanouts']}``, batches of "
            f"{result['batch_size']:,} seeds ({result['num_batches']} timed "
            f"per process after {result['num_warmup']}), "
            f"{result['threads_per_process']} thread per process, "
            f"{result['cpu_count']} CPU cores, torch {result['torch']}, "
            f"PyG {result['pyg']}; {baseline}. Medians of "
            f"{result['rounds']} interleaved rounds; load average "
            f"{result['load_average_before'][0]} before, "
            f"{result['load_average_after'][0]} after"
            + (f"; {result['note']}" if result.get('note') else '') + '.',
            ''] + _table(['loader', 'seeds/s per process', 'nodes per seed',
                          'edges per seed', 'vs PyG (median)',
                          'vs PyG per round'], rows)
        return nested_parse_to_nodes(self.state, StringList(lines),
                                     source=path)


class TestCount(SphinxDirective):
    """``.. pyg-sar-test-count::``: how many tests the suite has and how
    many are quick (not marked ``slow``), counted by pytest's own
    collection when the docs are built."""

    def run(self):
        import re
        import subprocess
        import sys
        root = os.path.dirname(os.path.dirname(RESULTS))
        counts = []
        for extra in ([], ['-m', 'not slow']):
            run = subprocess.run(
                [sys.executable, '-m', 'pytest', '--collect-only', '-q',
                 '-p', 'no:cacheprovider', 'tests'] + extra, cwd=root,
                capture_output=True, text=True, timeout=300)
            match = re.search(r'(\d+)(?:/\d+)? tests? collected',
                              run.stdout)
            if match is None:
                raise ExtensionError(f"pyg-sar-test-count: pytest collected "
                                     f"nothing: {run.stdout[-300:]}"
                                     f"{run.stderr[-300:]}")
            counts.append(int(match.group(1)))
        lines = [f'The suite has **{counts[0]} tests**, {counts[1]} of them '
                 f'quick (not marked ``slow``); counted by pytest when '
                 f'this page was built.', '']
        return nested_parse_to_nodes(self.state, StringList(lines),
                                     source='tests')


def _load(directive: SphinxDirective, name: str):
    """``benchmarks/results/<name>.json``: its path (a dependency of the
    page) and content."""
    path = os.path.join(RESULTS, f'{name}.json')
    directive.env.note_dependency(path)
    with open(path) as f:
        return path, json.load(f)


class FullBatch(SphinxDirective):
    """``.. pyg-sar-full-batch:: NAME``: the rows and targets of
    ``benchmarks/results/NAME.json`` (``benchmarks/full_batch.py``)."""
    required_arguments = 1

    def run(self):
        path, result = _load(self, self.arguments[0])
        rows = result['rows']
        stock = {(r['model'], r.get('threads')): r for r in rows
                 if r['name'] == 'stock PyG'}
        dgl = {(r['model'], r.get('threads')): r for r in rows
               if r['name'] == 'DGL'}
        table = []
        for r in rows:
            key = (r['model'], r.get('threads'))
            vs = lambda other: _num(r['epoch_s'] / other[key]['epoch_s'], 2) \
                if key in other and r['name'] == 'pyg_sar' else '-'  # noqa
            floor = r.get('floor_s')
            table.append([
                r['model'], r['name'], str(r['workers']),
                str(r.get('threads', '-')), _num(r['mem_mib'], 0),
                _num(r['epoch_s'], 2), _num(floor, 2) if floor else '-',
                _num(r['epoch_s'] / floor, 2) if floor else '-',
                vs(stock), vs(dgl)])
        nodes = result.get('nodes') or rows[0].get('num_nodes')
        lines = [f"{result.get('cores', '?')} cores, {result['layers']} "
                 f"layers, {result['heads']} heads, {result['epochs']} timed "
                 f"epochs" + (f", {nodes:,} nodes" if nodes else '') + ':',
                 ''] + _table(['model', 'system', 'N', 'threads',
                               'MiB per worker', 'epoch (s)', 'floor (s)',
                               'epoch / floor', 'vs stock PyG', 'vs DGL'],
                              table)
        targets = [[t['target'], _num(t['value']), 'met' if t['ok'] else
                    '**not met**'] for t in result.get('targets', [])]
        if targets:
            lines += ['Targets:', ''] + _table(['target', 'value', ''],
                                               targets)
        return nested_parse_to_nodes(self.state, StringList(lines),
                                     source=path)


class FusedAttention(SphinxDirective):
    """``.. pyg-sar-fused-attention:: NAME``: ``benchmarks/results/NAME.json``
    (``benchmarks/fused_attention.py``) as a table: one chunk forward and
    backward, torch operators against the fused kernels."""
    required_arguments = 1

    def run(self):
        path, result = _load(self, self.arguments[0])
        env, rows = result['env'], []
        for r in result['rows']:
            best = r.get('best')
            rows.append([r['kind'], _num(r['torch_eager_s'] * 1e3, 1),
                         _num(r['torch_compile_s'] * 1e3, 1)
                         if 'torch_compile_s' in r else '-',
                         _num(r['fused_s'] * 1e3, 1),
                         _num(r['default_s'] * 1e3, 1)
                         if 'default_s' in r else '-',
                         _num(r['fused_vs_eager'], 2),
                         f"{best['block_e']} edges, {best['num_warps']} "
                         f"warp(s)" if best else '-'])
        first = result['rows'][0]
        lines = [f"{env['device_name']}, {first['rows']:,} rows, "
                 f"{first['edges']:,} edges, {first['heads']} heads x "
                 f"{first['channels']} channels, median of {env['repeat']}:",
                 ''] + _table(['score', 'torch operators (ms)',
                               'torch.compile (ms)',
                               'fused (ms; CUDA: fastest launch)',
                               'fused, default launch (ms)',
                               'fused / operators', 'best launch'], rows)
        return nested_parse_to_nodes(self.state, StringList(lines),
                                     source=path)


def setup(app: Sphinx) -> Dict[str, Any]:
    app.add_directive('pyg-sar-fused-attention', FusedAttention)
    app.add_directive('pyg-sar-full-batch', FullBatch)
    app.add_directive('pyg-sar-test-count', TestCount)
    app.add_directive('pyg-sar-device-check', DeviceCheck)
    app.add_directive('pyg-sar-scaling', Scaling)
    app.add_directive('pyg-sar-sampling', Sampling)
    return {'parallel_read_safe': True}
