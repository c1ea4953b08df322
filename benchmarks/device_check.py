"""The device check: pyg_sar against stock PyG where users train, one command.

On one GPU (or, with ``--device cpu``, on the CPU) it measures, side by side
in one run and with the same weights:

* ``layers``: every engine layer (GCN, GraphSAGE, GIN, GraphConv, GAT, GATv2,
  RGCN, HGT) and the whole-neighborhood path (GENConv) as a 3-layer model
  (HGT: 2 layers) on ``synthetic_graph(--nodes, 20, 128, 16)``: epoch time
  and peak device memory above the data, stock PyG in one process against
  pyg_sar with one worker, defaults only; the first losses must agree;
* ``autocast``: GraphSAGE and GAT under ``torch.autocast`` (bf16);
* ``budget``: GAT's epoch over a sweep of ``edge_memory_budget`` against the
  device's default;
* ``sharing``: N = 1, 2, 4 workers started by torchrun on one GPU (the
  backend they pick, per-rank peak memory, epoch time);
* ``cpu``: N workers splitting the machine's cores against one worker and
  stock PyG on all of them, and strong scaling with a fixed thread count
  per worker (GraphSAGE and GAT, ``--cpu-nodes`` nodes);
* ``largest``: the largest graph GraphSAGE trains on with stock PyG and with
  pyg_sar on this device (sizes doubling until one does not fit);
* ``exact``: a subset of the exactness suite with every tensor on the
  device (``PYG_SAR_TEST_DEVICE``).

Every section has a share of ``--budget-s``; what did not fit says so in
the JSON. Writes ``<out>/device_check[_cpu].json`` and ``.png`` and prints
the tables::

    python benchmarks/device_check.py                 # on a GPU machine
    python benchmarks/device_check.py --device cpu --nodes 20000 --quick
"""
from __future__ import annotations

import pyg_sar  # noqa: F401  (before torch: the package's OpenMP policy)

import argparse
import gc
import json
import os
import os.path as osp
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

HERE = osp.dirname(osp.abspath(__file__))
sys.path.insert(0, HERE)
from _common import add_internal_args, reset_hwm, status_mib  # noqa: E402

ROOT = osp.dirname(HERE)
NUM_FEATURES, NUM_CLASSES, DEGREE, RELATIONS = 128, 16, 20, 4
SECTIONS = ('layers', 'attention', 'profile', 'autocast', 'budget',
            'sharing', 'cpu', 'largest', 'exact')


# Models ######################################################################

class Stack(torch.nn.Module):
    """``layers`` convolutions with ReLU between them; extra forward
    arguments (RGCN's ``edge_type``) reach every convolution."""

    def __init__(self, convs) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(convs)

    def forward(self, x, edge_index, *args):
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index, *args)
            if i < len(self.convs) - 1:
                x = x.relu()
        return x


def homogeneous_model(name: str, layers: int = 3) -> torch.nn.Module:
    """The stock PyG model of a layer kind, seeded."""
    from torch_geometric import nn
    from torch_geometric.nn import models
    torch.manual_seed(0)
    c, k = NUM_FEATURES, NUM_CLASSES
    dims = lambda h: [c] + [h] * (layers - 1) + [k]  # noqa: E731
    pairs = lambda h: list(zip(dims(h)[:-1], dims(h)[1:]))  # noqa: E731
    if name == 'GCN':
        return models.GCN(c, 256, layers, k)
    if name == 'GraphSAGE':
        return models.GraphSAGE(c, 256, layers, k)
    if name == 'GIN':
        return models.GIN(c, 256, layers, k)
    if name == 'GraphConv':
        return Stack([nn.GraphConv(a, b) for a, b in pairs(256)])
    if name == 'GAT':
        return models.GAT(c, 128, layers, k, heads=4)
    if name == 'GATv2':
        return models.GAT(c, 128, layers, k, heads=4, v2=True)
    if name == 'Transformer':
        return Stack([nn.TransformerConv(c, 32, heads=4),
                      nn.TransformerConv(128, 32, heads=4),
                      nn.TransformerConv(128, k)][-layers:])
    if name == 'RGCN':
        return Stack([nn.RGCNConv(a, b, RELATIONS) for a, b in pairs(64)])
    if name == 'GEN':
        return Stack([nn.GENConv(a, b, aggr='softmax', learn_t=True)
                      for a, b in pairs(64)])
    raise ValueError(name)


HOMOGENEOUS = ('GCN', 'GraphSAGE', 'GIN', 'GraphConv', 'GAT', 'GATv2',
               'RGCN', 'GEN')


def hgt_model(metadata, hidden: int = 128) -> torch.nn.Module:
    from torch_geometric.nn import HGTConv, Linear

    class HGT(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.conv1 = HGTConv(NUM_FEATURES, hidden, metadata, heads=4)
            self.conv2 = HGTConv(hidden, hidden, metadata, heads=4)
            self.lin = Linear(hidden, NUM_CLASSES)

        def forward(self, x_dict, edge_index_dict):
            h = {t: v.relu() for t, v in
                 self.conv1(x_dict, edge_index_dict).items()
                 if v is not None}
            h = self.conv2(h, edge_index_dict)
            return self.lin(h['paper'])

    return HGT()


# Graphs ######################################################################

def homogeneous_graph(num_nodes: int):
    from pyg_sar.datasets import synthetic_graph
    data = synthetic_graph(num_nodes, DEGREE, NUM_FEATURES, NUM_CLASSES)
    gen = torch.Generator().manual_seed(1)
    data.edge_type = torch.randint(0, RELATIONS, (data.num_edges, ),
                                   generator=gen)
    return data


def hetero_graph(num_papers: int):
    import torch_geometric.transforms as T
    from pyg_sar.datasets.synthetic_hetero import synthetic_hetero_graph
    data = T.ToUndirected()(synthetic_hetero_graph(num_papers))
    gen = torch.Generator().manual_seed(2)
    for node_type in data.node_types:
        if 'x' not in data[node_type]:
            data[node_type].x = torch.randn(data[node_type].num_nodes,
                                            NUM_FEATURES, generator=gen)
    return data


# Measuring ###################################################################

class Meter:
    """Peak memory above a baseline: CUDA's allocator statistics on a GPU,
    the process's peak RSS (``VmHWM``, reset per measurement) on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def start(self) -> None:
        gc.collect()
        if self.device.type == 'cuda':
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            reset_hwm()
            self.base = status_mib('VmRSS')

    def peak_mib(self) -> Optional[float]:
        if self.device.type == 'cuda':
            torch.cuda.synchronize(self.device)
            return (torch.cuda.max_memory_allocated(self.device) -
                    self.base) / 2**20
        peak = status_mib('VmHWM')
        return None if peak is None or self.base is None else \
            peak - self.base

    def sync(self) -> None:
        if self.device.type == 'cuda':
            torch.cuda.synchronize(self.device)


def train_epochs(model, inputs: tuple, y, mask, epochs: int, meter: Meter,
                 amp: Optional[torch.dtype] = None,
                 max_s: float = float('inf')) -> Dict[str, Any]:
    """One untimed epoch (its peak memory and loss), then ``epochs`` timed
    ones: forward, cross-entropy over ``mask``, backward, Adam step. Where
    the first epoch shows that they would not fit in ``max_s``, one timed
    epoch (none if that would not fit either: the first one's time then
    stands, marked ``first_epoch_only``)."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()
    num_train = max(int(mask.sum()), 1)

    def epoch() -> float:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(meter.device.type, dtype=amp,
                            enabled=amp is not None):
            out = model(*inputs)
        loss = F.cross_entropy(out.float()[mask], y[mask],
                               reduction='sum') / num_train
        loss.backward()
        opt.step()
        return float(loss.detach())

    meter.start()
    start = time.perf_counter()
    first_loss = epoch()
    first_s = time.perf_counter() - start
    peak = meter.peak_mib()
    if first_s * epochs > max_s:
        epochs = 1 if first_s < max_s else 0
    if epochs == 0:
        return dict(epoch_s=first_s, peak_mib=peak, first_loss=first_loss,
                    first_epoch_only=True)
    times = []
    for _ in range(epochs):
        meter.sync()
        start = time.perf_counter()
        epoch()
        meter.sync()
        times.append(time.perf_counter() - start)
    return dict(epoch_s=statistics.median(times), peak_mib=peak,
                first_loss=first_loss)


def guarded(fn: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
    """``fn()``, or what stopped it: out of memory, or the error's line."""
    try:
        return fn()
    except torch.cuda.OutOfMemoryError:
        return dict(error='out of memory')
    except Exception as e:  # recorded, the check goes on
        return dict(error=f'{type(e).__name__}: {str(e).splitlines()[0]}'
                    if str(e) else type(e).__name__,
                    traceback=traceback.format_exc()[-2000:])
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# In-process sections ##########################################################

class Homogeneous:
    """The graph on the device, for stock PyG and for one pyg_sar worker
    (partitioned into one part on disk, as a user's script would). Every
    pyg_sar run gets a DistGraph of its own: the views and index caches a
    layer builds on first use (GAT's self-loop view, the transposed chunks)
    then count in the peak of each run that needs them, not only in the
    first one's."""

    def __init__(self, num_nodes: int, device: torch.device, work: str):
        data = homogeneous_graph(num_nodes)
        root = osp.join(work, f'parts-{num_nodes}')
        shutil.rmtree(root, ignore_errors=True)
        pyg_sar.partition_graph(data, 1, root, progress=False)
        part = pyg_sar.load_partition(root, 0)
        self.num_nodes, self.num_edges = data.num_nodes, data.num_edges
        self.device = device
        self.stock = tuple(t.to(device) for t in (
            data.x, data.edge_index, data.edge_type, data.y,
            data.train_mask))
        del data
        self.part = part
        self.ours = tuple(t.to(device) for t in (
            part.x, part.edge_type, part.y, part.train_mask))

    def run(self, name: str, impl: str, epochs: int,
            amp: Optional[torch.dtype] = None,
            max_s: float = float('inf')) -> Dict[str, Any]:
        model = homogeneous_model(name)
        if impl == 'pyg':
            x, edge_index, edge_type, y, mask = self.stock
            model = model.to(self.device)
            inputs = (x, edge_index) + ((edge_type, ) if name == 'RGCN'
                                        else ())
        else:
            x, edge_type, y, mask = self.ours
            model = pyg_sar.nn.to_distributed(model).to(self.device)
            graph = pyg_sar.DistGraph(self.part, device=self.device)
            inputs = (x, graph) + ((edge_type, ) if name == 'RGCN' else ())
        return train_epochs(model, inputs, y.long(), mask.bool(), epochs,
                            Meter(self.device), amp, max_s)


class Hetero:
    """The heterogeneous graph (HGT) on the device, both ways."""

    def __init__(self, num_papers: int, device: torch.device, work: str):
        data = hetero_graph(num_papers)
        self.metadata = data.metadata()
        root = osp.join(work, f'hetero-{num_papers}')
        pyg_sar.partition_graph(data, 1, root, progress=False)
        part = pyg_sar.load_partition(root, 0)
        self.device = device
        self.stock = ({t: v.to(device) for t, v in data.x_dict.items()},
                      {k: v.to(device)
                       for k, v in data.edge_index_dict.items()},
                      data['paper'].y.to(device),
                      data['paper'].train_mask.to(device))
        self.num_nodes = data.num_nodes
        self.num_edges = data.num_edges
        self.graph = pyg_sar.DistGraph(part, device=device)
        self.ours = ({t: v.to(device) for t, v in part.x_dict.items()},
                     part['paper'].y.to(device),
                     part['paper'].train_mask.to(device))

    def run(self, impl: str, epochs: int,
            max_s: float = float('inf')) -> Dict[str, Any]:
        model = hgt_model(self.metadata)
        if impl == 'pyg':
            x_dict, edges, y, mask = self.stock
            inputs = (x_dict, edges)
            model = model.to(self.device)
        else:
            x_dict, y, mask = self.ours
            inputs = (x_dict, self.graph)
            model = pyg_sar.nn.to_distributed(model).to(self.device)
        return train_epochs(model, inputs, y.long(), mask.bool(), epochs,
                            Meter(self.device), max_s=max_s)


def side_by_side(run: Callable[[str], Dict[str, Any]], **info) -> dict:
    """Stock PyG, then pyg_sar, and their ratios."""
    pyg = guarded(lambda: run('pyg'))
    sar = guarded(lambda: run('sar'))
    row = dict(info, pyg=pyg, sar=sar)
    if 'error' not in pyg and 'error' not in sar:
        row['epoch_ratio'] = sar['epoch_s'] / pyg['epoch_s']
        if pyg['peak_mib'] and sar['peak_mib'] is not None:
            row['memory_ratio'] = sar['peak_mib'] / pyg['peak_mib']
        row['loss_rel_diff'] = abs(sar['first_loss'] - pyg['first_loss']) / \
            max(abs(pyg['first_loss']), 1e-12)
    return row


_GRAPHS: Dict[int, Homogeneous] = {}


def homogeneous(num_nodes: int, device: torch.device, work: str,
                keep: bool = True) -> Homogeneous:
    """The graph of ``num_nodes`` on the device, built once (the sections
    that share it do not regenerate and repartition it); ``keep=False``
    drops every other one first."""
    if not keep:
        for n in [n for n in _GRAPHS if n != num_nodes]:
            del _GRAPHS[n]
        gc.collect()
        if device.type == 'cuda':
            torch.cuda.empty_cache()
    if num_nodes not in _GRAPHS:
        _GRAPHS[num_nodes] = Homogeneous(num_nodes, device, work)
    return _GRAPHS[num_nodes]


def section_layers(args, device, work, clock) -> List[dict]:
    graph = homogeneous(args.nodes, device, work)
    rows = []
    for name in HOMOGENEOUS:
        if clock.left() < 20:
            rows.append(dict(layer=name, skipped='time budget'))
            continue
        rows.append(side_by_side(
            lambda impl: graph.run(name, impl, args.epochs,
                                   max_s=clock.left() / 4),
            layer=name, nodes=graph.num_nodes, edges=graph.num_edges))
        _say_layer(rows[-1])
    if clock.left() > 20:
        hetero = guarded(lambda: Hetero(args.nodes // 2, device, work))
        if isinstance(hetero, Hetero):
            rows.append(side_by_side(
                lambda impl: hetero.run(impl, args.epochs,
                                        max_s=clock.left() / 3),
                layer='HGT',
                nodes=hetero.num_nodes, edges=hetero.num_edges))
            _say_layer(rows[-1])
        else:
            rows.append(dict(layer='HGT', sar=hetero, pyg=hetero))
    return rows


def section_attention(args, device, work, clock) -> List[dict]:
    """The attention layers three ways: stock PyG, pyg_sar with its fused
    kernels (the default where they apply) and pyg_sar with them turned off
    (``PYG_SAR_FUSED=0``, the separate-operator path), and which path each
    layer took."""
    from pyg_sar.nn.engine import fused
    graph = homogeneous(args.nodes, device, work)
    rows = []
    for name in ('GAT', 'GATv2', 'Transformer'):
        if clock.left() < 20:
            rows.append(dict(layer=name, skipped='time budget'))
            continue
        fused._SAID.clear()
        row = side_by_side(
            lambda impl: graph.run(name, impl, args.epochs,
                                   max_s=clock.left() / 6),
            layer=name, nodes=graph.num_nodes, edges=graph.num_edges)
        row['paths'] = sorted(' '.join(map(str, said))
                              for said in fused._SAID)
        before = os.environ.get('PYG_SAR_FUSED')
        os.environ['PYG_SAR_FUSED'] = '0'
        try:
            row['sar_unfused'] = guarded(lambda: graph.run(
                name, 'sar', args.epochs, max_s=clock.left() / 6))
        finally:
            if before is None:
                os.environ.pop('PYG_SAR_FUSED')
            else:
                os.environ['PYG_SAR_FUSED'] = before
        unfused = row['sar_unfused']
        if 'error' not in unfused and 'error' not in row['sar']:
            row['fused_vs_unfused'] = row['sar']['epoch_s'] / \
                unfused['epoch_s']
        rows.append(row)
        _say_layer(row)
        print(f"             paths: {row['paths']}; unfused "
              f"{unfused.get('error') or _fmt(unfused.get('epoch_s'), 's')}, "
              f"{_fmt(unfused.get('peak_mib'), 'MiB')}", flush=True)
    return rows


def section_autocast(args, device, work, clock) -> List[dict]:
    graph = homogeneous(args.nodes, device, work)
    rows = []
    runs = [('GraphSAGE', torch.bfloat16), ('GAT', torch.bfloat16)]
    if device.type == 'cuda':
        runs.append(('GAT', torch.float16))
    for name, dtype in runs:
        if clock.left() < 10:
            rows.append(dict(layer=name, dtype=str(dtype)[6:],
                             skipped='time budget'))
            continue
        rows.append(side_by_side(
            lambda impl: graph.run(name, impl, args.epochs, amp=dtype,
                                   max_s=clock.left() / 4),
            layer=name, dtype=str(dtype)[6:]))
        _say_layer(rows[-1])
    return rows


def section_profile(args, device, work, clock) -> List[dict]:
    """Where one pyg_sar epoch of the slowest paths spends its time on
    this device (``torch.profiler``, the top operators by self time), on a
    graph of ``--profile-nodes`` nodes."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if device.type == 'cuda' else [])
    sort = 'self_cuda_time_total' if device.type == 'cuda' else \
        'self_cpu_time_total'
    rows = []
    graph = homogeneous(args.profile_nodes, device, work)
    hetero = None
    for name in ('HGT', 'GEN', 'GATv2', 'GAT'):
        if clock.left() < 10:
            rows.append(dict(layer=name, skipped='time budget'))
            continue
        if name == 'HGT':
            hetero = hetero or Hetero(args.profile_nodes // 2, device, work)
            run = lambda: hetero.run('sar', 0)  # noqa: E731
        else:
            run = lambda: graph.run(name, 'sar', 0)  # noqa: E731
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            result = guarded(run)
            seconds = time.perf_counter() - start
        table = prof.key_averages().table(sort_by=sort, row_limit=12,
                                          max_name_column_width=40)
        rows.append(dict(layer=name, epoch_s=seconds, table=table,
                         error=result.get('error')))
        print(f"  profile {name}: {seconds:.2f} s\n{table}", flush=True)
    return rows


def section_budget(args, device, work, clock) -> List[dict]:
    from pyg_sar import comm
    from pyg_sar.utils.device import default_edge_budget
    graph = homogeneous(args.nodes, device, work)
    rows = []
    default = default_edge_budget(device)
    budgets = sorted({16 << 20, 64 << 20, 256 << 20, 512 << 20, 1 << 30,
                      2 << 30, 4 << 30, 8 << 30, default})
    for budget in budgets:
        if clock.left() < 10:
            break
        comm.configure(edge_memory_budget=budget)
        try:
            result = guarded(lambda: graph.run('GAT', 'sar', args.epochs,
                                               max_s=clock.left() / 2))
        finally:
            comm.configure(edge_memory_budget='auto')
        rows.append(dict(layer='GAT', budget_mib=budget >> 20,
                         default=budget == default, **result))
        print(f"  GAT budget {budget >> 20:>5} MiB"
              f"{' (default)' if budget == default else ''}: "
              f"{_fmt(result.get('epoch_s'), 's')}, "
              f"{_fmt(result.get('peak_mib'), 'MiB')}", flush=True)
    return rows


# Multi-process sections #######################################################

def worker(args) -> None:
    """One torchrun worker (``--worker``): ``--impl sar`` trains the model
    on its part with ``init_distributed``'s own choice of backend; ``--impl
    pyg`` is stock PyG in this one process."""
    torch.set_num_threads(int(args.threads))
    device = torch.device(args.device)
    result: Dict[str, Any] = {}
    if args.impl == 'pyg':
        data = torch.load(osp.join(args.parts, 'data.pt'), weights_only=False)
        model = homogeneous_model(args.model).to(device)
        out = train_epochs(model, (data.x.to(device),
                                   data.edge_index.to(device)),
                           data.y.long().to(device),
                           data.train_mask.to(device), args.epochs,
                           Meter(device))
        result.update(out, backend=None, rank=0)
    else:
        import torch.distributed as dist
        from datetime import timedelta
        rank, world_size = pyg_sar.init_distributed(
            device=args.device, timeout=timedelta(minutes=5))
        if device.type == 'cuda':
            device = torch.device('cuda', torch.cuda.current_device())
        part = pyg_sar.load_partition(args.parts, rank)
        graph = pyg_sar.DistGraph(part, device=device)
        x, y = part.x.to(device), part.y.long().to(device)
        mask = part.train_mask.bool().to(device)
        num_train = pyg_sar.global_count(mask)
        model = pyg_sar.nn.to_distributed(
            homogeneous_model(args.model)).to(device)
        pyg_sar.sync_params(model)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        meter = Meter(device)
        from pyg_sar.train import distributed_loss

        def epoch() -> float:
            opt.zero_grad(set_to_none=True)
            loss = distributed_loss(model(x, graph), y, mask, num_train)
            loss.backward()
            pyg_sar.all_reduce_grads(model)
            opt.step()
            return float(loss.detach())

        meter.start()
        epoch()
        peak = meter.peak_mib()
        times = []
        for _ in range(args.epochs):
            pyg_sar.comm.barrier()
            meter.sync()
            start = time.perf_counter()
            epoch()
            meter.sync()
            times.append(time.perf_counter() - start)
        result.update(epoch_s=statistics.median(times), peak_mib=peak,
                      backend=dist.get_backend() if dist.is_initialized()
                      else None, rank=rank, world_size=world_size)
    with open(args.result, 'w') as f:
        json.dump(result, f)
    if args.impl == 'sar':
        pyg_sar.comm.shutdown()


_PREPARED: Dict[int, 'Prepared'] = {}


def prepared_graph(num_nodes: int, work: str,
                   counts=(1, 2, 4)) -> 'Prepared':
    """The multi-worker graph in ``counts`` parts, prepared once for
    every section."""
    if num_nodes not in _PREPARED:
        _PREPARED[num_nodes] = Prepared(num_nodes, work, counts)
    return _PREPARED[num_nodes]


class Prepared:
    """``--cpu-nodes`` graph partitioned into 1, 2 and 4 parts (METIS), and
    saved whole for the stock baseline."""

    def __init__(self, num_nodes: int, work: str, counts=(1, 2, 4)):
        data = homogeneous_graph(num_nodes)
        self.root = osp.join(work, f'multi-{num_nodes}')
        os.makedirs(self.root, exist_ok=True)
        torch.save(data, osp.join(self.root, 'data.pt'))
        for n in counts:
            pyg_sar.partition_graph(data, n, self.parts(n), progress=False)

    def parts(self, n: int) -> str:
        return osp.join(self.root, f'p{n}') if n else self.root


def launch(args, prepared: Prepared, n: int, model: str, device: str,
           threads: int, timeout: float, impl: str = 'sar') -> dict:
    """Runs ``n`` workers (torchrun; ``impl='pyg'``: one stock process) and
    returns the slowest rank's epoch, the largest per-rank peak and the
    backends they chose."""
    out = tempfile.mkdtemp(dir=args.work)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads),
               PYTHONUNBUFFERED='1')
    results = []
    # Each worker writes <out>/<RANK>.json (see __main__).
    tail = ['--worker', '--impl', impl, '--model', model, '--device',
            device, '--threads', str(threads), '--epochs',
            str(args.cpu_epochs),
            '--parts', prepared.parts(n if impl == 'sar' else 0),
            '--result', out]
    head = [sys.executable] if impl == 'pyg' else \
        [sys.executable, '-m', 'torch.distributed.run', '--standalone',
         '--nproc-per-node', str(n)]
    try:
        proc = subprocess.run(head + [__file__] + tail, env=env,
                              timeout=timeout,
                              capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return dict(error=f'timed out after {timeout:.0f} s')
    for name in sorted(os.listdir(out)):
        with open(osp.join(out, name)) as f:
            results.append(json.load(f))
    if proc.returncode != 0 or not results:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return dict(error=f'exit {proc.returncode}: ' + ' | '.join(tail))
    return dict(workers=n, threads=threads, impl=impl,
                epoch_s=max(r['epoch_s'] for r in results),
                peak_mib_per_rank=max(r['peak_mib'] or 0 for r in results),
                backends=sorted({str(r['backend']) for r in results}))


def section_sharing(args, device, work, clock) -> List[dict]:
    _GRAPHS.clear()  # the one-device graph's memory goes back
    gc.collect()
    torch.cuda.empty_cache()
    if device.type != 'cuda':
        return [dict(skipped='no GPU: ranks sharing a GPU need one')]
    prepared = prepared_graph(args.cpu_nodes, work)
    rows = []
    for n in (1, 2, 4):
        threads = max(1, (os.cpu_count() or 1) // n)
        row = launch(args, prepared, n, 'GraphSAGE', 'cuda', threads,
                     min(120, clock.left()))
        rows.append(dict(row, workers=n, model='GraphSAGE'))
        print(f"  {n} rank(s) on one GPU: {row}", flush=True)
    return rows


def section_cpu(args, device, work, clock) -> List[dict]:
    cores = os.cpu_count() or 1
    prepared = prepared_graph(args.cpu_nodes, work)
    counts = [n for n in (1, 2, 4) if n <= cores]
    per_worker = max(1, cores // max(counts))
    rows = []
    for model in ('GraphSAGE', 'GAT'):
        runs = [('pyg', 1, cores)] + [('sar', n, cores // n)
                                      for n in counts] + \
               [('sar', n, per_worker) for n in counts
                if cores // n != per_worker]
        for impl, n, threads in runs:
            if clock.left() < 15:
                rows.append(dict(model=model, impl=impl, workers=n,
                                 threads=threads, skipped='time budget'))
                continue
            row = launch(args, prepared, n, model, 'cpu', threads,
                         min(240, clock.left()), impl=impl)
            rows.append(dict(row, model=model, impl=impl, workers=n,
                             threads=threads))
            print(f"  cpu {model} {impl} {n}x{threads}: "
                  f"{_fmt(row.get('epoch_s'), 's')} "
                  f"{row.get('error', '')}", flush=True)
    return rows


def cpu_summary(rows: List[dict]) -> List[dict]:
    """Split (N workers x cores/N threads vs one worker on every core) and
    strong scaling (fixed threads per worker: t(1) / (N t(N)))."""
    out = []
    ok = [r for r in rows if 'epoch_s' in r]
    cores = max([r['workers'] * r['threads'] for r in ok] + [1])
    for model in ('GraphSAGE', 'GAT'):
        mine = [r for r in ok if r['model'] == model]
        one = next((r for r in mine if r['impl'] == 'sar' and
                    r['workers'] == 1 and r['threads'] == cores), None)
        stock = next((r for r in mine if r['impl'] == 'pyg'), None)
        for r in mine:
            if r['impl'] != 'sar':
                continue
            entry = dict(model=model, workers=r['workers'],
                         threads=r['threads'], epoch_s=r['epoch_s'])
            if one and r['workers'] * r['threads'] == cores:
                entry['split_ratio'] = r['epoch_s'] / one['epoch_s']
            if stock:
                entry['vs_stock'] = r['epoch_s'] / stock['epoch_s']
            base = next((b for b in mine if b['impl'] == 'sar' and
                         b['workers'] == 1 and
                         b['threads'] == r['threads']), None)
            if base and r['workers'] > 1:
                entry['efficiency'] = base['epoch_s'] / (r['workers'] *
                                                         r['epoch_s'])
            out.append(entry)
    return out


def section_largest(args, device, work, clock) -> List[dict]:
    """GraphSAGE (h256, 3 layers) on graphs doubling in size from
    ``--nodes`` until one does not fit or the time is up; each
    implementation stops at its first failure."""
    rows = []
    alive = {'pyg': True, 'sar': True}
    size = args.nodes
    while any(alive.values()) and clock.left() > 60:
        graph = guarded(lambda: homogeneous(size, device, work, keep=False))
        if not isinstance(graph, Homogeneous):
            rows.append(dict(nodes=size, error=graph.get('error')))
            break
        for impl in ('pyg', 'sar'):
            if alive[impl] and clock.left() > 30:
                result = guarded(lambda: graph.run('GraphSAGE', impl, 1))
                alive[impl] = 'error' not in result
                rows.append(dict(impl=impl, nodes=size,
                                 edges=graph.num_edges, **result))
                print(f"  largest {impl} {size:,} nodes: "
                      f"{result.get('error') or _fmt(result['peak_mib'], 'MiB')}",
                      flush=True)
        del graph
        _GRAPHS.clear()
        shutil.rmtree(osp.join(work, f'parts-{size}'), ignore_errors=True)
        size *= 2
    return rows


def largest_summary(rows: List[dict]) -> Dict[str, Any]:
    out = {}
    for impl in ('pyg', 'sar'):
        ran = [r['nodes'] for r in rows if r.get('impl') == impl and
               'error' not in r]
        failed = [r['nodes'] for r in rows if r.get('impl') == impl and
                  'error' in r]
        out[impl] = dict(largest_nodes=max(ran) if ran else None,
                         first_failed_nodes=min(failed) if failed else None)
    return out


def section_exact(args, device, work, clock) -> List[dict]:
    """The exactness tests that place every tensor on
    ``PYG_SAR_TEST_DEVICE`` (several ranks share the GPU over gloo), for as
    long as the section's time lasts."""
    sar = 'tests/nn/test_sar_exact.py::test_'
    files = [sar + 'conv_equals_single_process_on_synthetic',
             sar + 'loss_curve_equals_single_process',
             sar + 'batch_norm_equals_single_process',
             'tests/nn/conv/test_rgcn_conv.py::test_rgcn_matches_pyg',
             'tests/nn/test_hetero_exact.py::test_hetero_model_matches_pyg',
             'tests/nn/test_hetero_zoo_exact.py::test_rgat_and_heat_match_'
             'pyg']
    env = dict(os.environ, PYG_SAR_TEST_DEVICE=str(device.type))
    timeout = max(30, clock.left() - 5)
    # World size 3 only: the ids start with it ([3-sage_mean], [3]), and
    # each file spawns once for all of its ids.
    cmd = [sys.executable, '-m', 'pytest', '-q', '-rfE', '-p',
           'no:cacheprovider', '-k', '[3- or [3]'] + files
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout,
                              capture_output=True, text=True)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b'')
        out = out.decode() if isinstance(out, bytes) else out
        return [dict(files=files, error=f'timed out after {timeout:.0f} s',
                     tail=out.strip().splitlines()[-3:])]
    lines = proc.stdout.strip().splitlines()
    return [dict(files=files, returncode=proc.returncode,
                 summary=lines[-1] if lines else '',
                 tail=lines[-15:] if proc.returncode else [])]


# Report ######################################################################

def _fmt(value, unit: str) -> str:
    if value is None:
        return '-'
    return f'{value:,.3f} {unit}' if unit == 's' else f'{value:,.0f} {unit}'


def _say_layer(row: dict) -> None:
    pyg, sar = row.get('pyg', {}), row.get('sar', {})
    print(f"  {row['layer']:<10} {row.get('dtype', 'float32'):<9} "
          f"pyg {pyg.get('error') or _fmt(pyg.get('epoch_s'), 's')}, "
          f"{_fmt(pyg.get('peak_mib'), 'MiB')} | "
          f"pyg_sar {sar.get('error') or _fmt(sar.get('epoch_s'), 's')}, "
          f"{_fmt(sar.get('peak_mib'), 'MiB')} | "
          f"epoch x{row.get('epoch_ratio', float('nan')):.2f} "
          f"memory x{row.get('memory_ratio', float('nan')):.2f}",
          flush=True)


def targets(result: dict) -> List[dict]:
    """The issue's targets, each with its value and whether it is met."""
    out = []
    for row in result.get('layers', []):
        if 'epoch_ratio' in row:
            out.append(dict(target=f"{row['layer']}: epoch <= 1.0x stock",
                            value=row['epoch_ratio'],
                            met=row['epoch_ratio'] <= 1.0))
        if 'memory_ratio' in row:
            out.append(dict(target=f"{row['layer']}: memory <= 0.3x stock",
                            value=row['memory_ratio'],
                            met=row['memory_ratio'] <= 0.3))
        if 'loss_rel_diff' in row:
            out.append(dict(target=f"{row['layer']}: same first loss",
                            value=row['loss_rel_diff'],
                            met=row['loss_rel_diff'] <= 1e-3))
    for row in result.get('attention', []):
        if row.get('layer') == 'GAT' and 'epoch_ratio' in row:
            out.append(dict(target='GAT (fused): epoch <= 0.5x stock',
                            value=row['epoch_ratio'],
                            met=row['epoch_ratio'] <= 0.5))
        if row.get('layer') == 'GAT' and 'memory_ratio' in row:
            out.append(dict(target='GAT (fused): memory <= 0.15x stock',
                            value=row['memory_ratio'],
                            met=row['memory_ratio'] <= 0.15))
        if 'loss_rel_diff' in row:
            out.append(dict(target=f"{row['layer']} (attention section): "
                            f"same first loss", value=row['loss_rel_diff'],
                            met=row['loss_rel_diff'] <= 1e-3))
    for row in result.get('cpu_summary', []):
        if 'split_ratio' in row and row['workers'] > 1:
            out.append(dict(target=f"{row['model']}: {row['workers']} "
                            f"workers splitting the cores <= 1.05x one",
                            value=row['split_ratio'],
                            met=row['split_ratio'] <= 1.05))
        if 'efficiency' in row and row['workers'] == 4:
            out.append(dict(target=f"{row['model']}: efficiency at 4 x "
                            f"{row['threads']} threads >= 0.8",
                            value=row['efficiency'],
                            met=row['efficiency'] >= 0.8))
    return out


def plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    device = result['env']['device_name']
    attention = [dict(r, dtype='fused') for r in result.get('attention', [])
                 if r.get('layer') in ('GAT', 'GATv2')]
    layers = [r for r in result.get('layers', []) +
              result.get('autocast', []) + attention if 'epoch_ratio' in r]
    ax = axes[0][0]
    names = [r['layer'] + (f" {r['dtype']}" if r.get('dtype') else '')
             for r in layers]
    xs = range(len(layers))
    ax.bar([x - 0.2 for x in xs], [r['epoch_ratio'] for r in layers], 0.4,
           label='epoch time')
    ax.bar([x + 0.2 for x in xs],
           [r.get('memory_ratio', float('nan')) for r in layers], 0.4,
           label='peak memory')
    ax.axhline(1.0, color='k', lw=0.8, label='stock PyG')
    ax.axhline(0.3, color='gray', ls='--', lw=0.8, label='0.3x')
    ax.set_yscale('log')
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, rotation=45, ha='right')
    ax.set_ylabel('pyg_sar / stock PyG')
    ax.set_title(f'one worker vs stock PyG ({device})')
    ax.legend()
    ax = axes[0][1]
    budget = [r for r in result.get('budget', []) if 'epoch_s' in r]
    if budget:
        ax.plot([r['budget_mib'] for r in budget],
                [r['epoch_s'] for r in budget], 'o-')
        for r in budget:
            if r['default']:
                ax.plot([r['budget_mib']], [r['epoch_s']], 'r*', ms=14,
                        label='default')
        ax.set_xscale('log', base=2)
        ax.set_xlabel('edge_memory_budget (MiB)')
        ax.set_ylabel('GAT epoch (s)')
        ax.legend()
    ax.set_title('GAT epoch over the edge budget')
    ax = axes[1][0]
    share = [r for r in result.get('sharing', []) if 'epoch_s' in r]
    if share:
        ax.plot([r['workers'] for r in share],
                [r['peak_mib_per_rank'] for r in share], 'o-',
                label='peak MiB per rank')
        ax.set_xlabel('ranks on one GPU (1: nccl; more: gloo, shared)')
        ax.set_xticks([r['workers'] for r in share])
        ax.set_ylabel('MiB')
        ax2 = ax.twinx()
        ax2.plot([r['workers'] for r in share],
                 [r['epoch_s'] for r in share], 's--', color='C1',
                 label='epoch (s)')
        ax2.set_ylabel('epoch (s)')
    else:
        ax.text(0.5, 0.5, 'not run (no GPU)', ha='center',
                transform=ax.transAxes)
    ax.set_title('GraphSAGE, several ranks on one GPU')
    ax = axes[1][1]
    for model in ('GraphSAGE', 'GAT'):
        rows = [r for r in result.get('cpu_summary', [])
                if r['model'] == model]
        if rows:
            ax.plot([f"{r['workers']}x{r['threads']}" for r in rows],
                    [r['epoch_s'] for r in rows], 'o-', label=model)
    ax.set_xlabel('workers x threads')
    ax.set_ylabel('epoch (s)')
    ax.set_title(f"CPU ({result['env']['cpu_count']} cores)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


class Clock:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def main(args) -> int:
    device = torch.device(args.device)
    if device.type == 'cuda':
        device = torch.device('cuda', torch.cuda.current_device())
    args.work = tempfile.mkdtemp(prefix='device_check-')
    env = dict(device_name=(torch.cuda.get_device_name(device)
                            if device.type == 'cuda' else
                            platform.processor() or 'cpu'),
               torch=torch.__version__, pyg=_pyg_version(),
               cpu_count=os.cpu_count(),
               gpu_memory_gib=(torch.cuda.get_device_properties(device)
                               .total_memory / 2**30
                               if device.type == 'cuda' else None),
               nodes=args.nodes, cpu_nodes=args.cpu_nodes,
               epochs=args.epochs, date=time.strftime('%Y-%m-%d'))
    print(f"device check on {env['device_name']} (torch {env['torch']}, "
          f"PyG {env['pyg']}, {env['cpu_count']} cores)", flush=True)
    result: Dict[str, Any] = dict(env=env)
    if args.keep:
        # Sections not run now come from an earlier run on the same device.
        with open(args.keep) as f:
            earlier = json.load(f)
        if earlier['env']['device_name'] != env['device_name']:
            raise SystemExit(f"--keep {args.keep}: measured on "
                             f"{earlier['env']['device_name']}, not on "
                             f"{env['device_name']}")
        for name, value in earlier.items():
            if name not in args.sections and name not in (
                    'env', 'targets', 'seconds'):
                result[name] = value
        runs = earlier['env'].get('runs') or [dict(
            earlier['env'], sections=list(earlier.get('seconds', {})))]
        kept = [dict(r, sections=[n for n in r.get('sections', [])
                                  if n not in args.sections]) for r in runs]
        result['env']['runs'] = [r for r in kept if r['sections']] + [
            dict(env, sections=[n for n in SECTIONS if n in args.sections])]
        result['seconds'] = {k: v for k, v in earlier.get(
            'seconds', {}).items() if k not in args.sections}
    clock = Clock(args.budget_s)
    share = dict(layers=0.34, attention=0.2, profile=0.08, autocast=0.07,
                 budget=0.08, sharing=0.12, cpu=0.20, largest=0.09,
                 exact=0.10)
    run = [s for s in SECTIONS if s in args.sections]
    fns = dict(layers=section_layers, attention=section_attention,
               profile=section_profile,
               autocast=section_autocast,
               budget=section_budget, sharing=section_sharing,
               cpu=section_cpu, largest=section_largest,
               exact=section_exact)
    try:
        for k, name in enumerate(run):
            # A section may use its share plus what earlier ones left.
            rest = sum(share[s] for s in run[k:])
            section_clock = Clock(max(clock.left() * share[name] / rest,
                                      0.0))
            print(f"[{name}] {section_clock.left():.0f} s", flush=True)
            start = time.perf_counter()
            try:
                result[name] = fns[name](args, device, args.work,
                                         section_clock)
            except Exception as e:
                result[name] = [dict(error=f'{type(e).__name__}: {e}',
                                     traceback=traceback.format_exc()[-3000:])]
                print(result[name][0]['traceback'], flush=True)
            result.setdefault('seconds', {})[name] = \
                time.perf_counter() - start
            if name == 'cpu':
                result['cpu_summary'] = cpu_summary(result['cpu'])
            if name == 'largest':
                result['largest_summary'] = largest_summary(result['largest'])
            _write(result, args)
    finally:
        shutil.rmtree(args.work, ignore_errors=True)
    result['targets'] = targets(result)
    _write(result, args, with_plot=True)
    print('\ntargets:')
    for t in result['targets']:
        print(f"  {'met    ' if t['met'] else 'NOT met'} {t['target']}: "
              f"{t['value']:.3f}")
    return 0


def merge(paths: List[str], args) -> int:
    """One result from the JSONs of several runs of this check on the same
    device (a later run's sections replace an earlier run's), with the
    summaries, targets and plot made anew; nothing is measured."""
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f))
    devices = {r['env']['device_name'] for r in runs}
    if len(devices) != 1:
        raise SystemExit(f"--merge: runs on different devices {devices}")
    taken = {name: k for k, run in enumerate(runs) for name in SECTIONS
             if name in run.get('seconds', {})}
    result: Dict[str, Any] = dict(env=dict(runs[-1]['env'], runs=[
        dict(r['env'], sections=[n for n in SECTIONS if taken.get(n) == k])
        for k, r in enumerate(runs)]), seconds={})
    for name, k in taken.items():
        result[name] = runs[k][name]
        result['seconds'][name] = runs[k]['seconds'][name]
    if 'cpu' in result:
        result['cpu_summary'] = cpu_summary(result['cpu'])
    if 'largest' in result:
        result['largest_summary'] = largest_summary(result['largest'])
    result['targets'] = targets(result)
    _write(result, args, with_plot=True)
    return 0


def _write(result: dict, args, with_plot: bool = False) -> None:
    name = args.name or ('device_check' if args.device != 'cpu'
                         else 'device_check_cpu')
    os.makedirs(args.out, exist_ok=True)
    path = osp.join(args.out, name)
    with open(path + '.json.tmp', 'w') as f:
        json.dump(result, f, indent=1)
    os.replace(path + '.json.tmp', path + '.json')
    if with_plot:
        plot(result, path + '.png')
        print(f"wrote {path}.json/.png")


def _pyg_version() -> str:
    import torch_geometric
    return torch_geometric.__version__


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--device', default='cuda' if torch.cuda.is_available()
                   else 'cpu')
    p.add_argument('--nodes', type=int, default=1_000_000,
                   help='nodes of the one-device graph (20 edges each)')
    p.add_argument('--cpu-nodes', type=int, default=200_000,
                   help='nodes of the multi-worker graph')
    p.add_argument('--epochs', type=int, default=3, help='timed epochs')
    p.add_argument('--cpu-epochs', type=int, default=2,
                   help='timed epochs of the multi-worker runs')
    p.add_argument('--profile-nodes', type=int, default=200_000,
                   help='nodes of the profiled graph')
    p.add_argument('--keep', default=None,
                   help='an earlier JSON of this check on the same device: '
                   'the sections not run now are taken from it')
    p.add_argument('--merge', nargs='+', default=None, metavar='JSON',
                   help='measure nothing: merge the JSONs of runs on one '
                   'device (later sections win) into <out>/<name>.json')
    p.add_argument('--budget-s', type=float, default=420,
                   help='seconds for the whole check')
    p.add_argument('--sections', nargs='+', default=list(SECTIONS),
                   choices=SECTIONS)
    p.add_argument('--out', default=osp.join(HERE, 'results'))
    p.add_argument('--name', default=None)
    # A worker's own flags (set by launch()).
    add_internal_args(p, '--model', '--threads')
    return p.parse_args(argv)


if __name__ == '__main__':
    arguments = parse_args()
    if arguments.worker:
        arguments.result = osp.join(arguments.result,
                                    f"{os.environ.get('RANK', '0')}.json")
        worker(arguments)
    elif arguments.merge:
        sys.exit(merge(arguments.merge, arguments))
    else:
        sys.exit(main(arguments))
