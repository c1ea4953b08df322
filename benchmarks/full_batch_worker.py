"""One worker of ``benchmarks/full_batch.py``, and the analytic memory floor.

A pyg_sar worker trains exactly as the README's snippet does (Python API:
``init_distributed``, ``load_partition``, ``DistGraph``, ``to_distributed``
of :class:`pyg_sar.train.GNN`, ``sync_params``, the local-sum loss over the
global count, ``all_reduce_grads``, Adam); a stock worker trains the same
architecture written with stock ``torch_geometric.nn`` convs, ``F.relu`` and
``F.dropout`` on the whole graph in one process. Neither sets an allocator
option or an environment variable.

Memory, per worker, from ``/proc/self/status``:
  * ``peak_over_loaded_mib``: the peak RSS from the moment the data is
    loaded (after ``load_partition``, or the stock ``torch.load``) to the
    end of the last epoch, minus the RSS right after loading. It includes
    the graph's index state, the model, the optimizer and every epoch;
  * ``graph_mib``: RSS after building the ``DistGraph`` minus after loading;
  * ``epoch_peak_mib``: the largest peak of one epoch over the RSS right
    before it (the kernel's peak mark is reset before every epoch); per
    epoch, ``epoch_peaks_mib``, with the RSS before each epoch over the RSS
    after loading (``rss_before_epochs_mib``) and its file-backed part
    (``rss_file_before_epochs_mib``, over the set-up's: code paged in).
Time: the median epoch after the first one (``epoch_s``), and its CPU
time (user + system, ``cpu_s``; system alone ``sys_s``: page faults and
the loopback transport) and its minor page faults (``minor_faults``).
Bytes: what the worker sent in its last epoch (``sent_mib``), the halo
bytes it received then, before the gradient all-reduce (``exchange_mib``),
and their lower bound (``halo_bound_mib``, :func:`halo_bound_bytes`).
"""
from __future__ import annotations

import gc
import json
import os
import resource
import statistics
import time
from typing import Dict, List, Optional

from _common import reset_hwm, status_mib

BYTES = 4  # float32
ATTENTION = ('gat', 'gatv2', 'transformer')


# Analytic floor ##############################################################

def layer_dims(model: str, in_channels: int, hidden: int, out_channels: int,
               layers: int, heads: int) -> List[dict]:
    """Input and output widths of each layer of :class:`pyg_sar.train.GNN`
    (GAT and Transformer: hidden layers concatenate ``heads`` heads of
    ``hidden // heads`` channels, the last layer averages ``heads`` heads of
    ``out_channels``)."""
    dims, width = [], in_channels
    for layer in range(layers):
        last = layer == layers - 1
        if model in ATTENTION:
            channels = out_channels if last else hidden // heads
            dims.append(dict(inp=width, heads=heads, channels=channels,
                             out=channels if last else heads * channels))
        else:
            dims.append(dict(inp=width, out=out_channels if last else hidden))
        width = dims[-1]['out']
    return dims


def floor_bytes(model: str, num_nodes: int, dims: List[dict]) -> int:
    r"""The activations autograd must keep for one backward, from the model's
    shapes (float32, per worker of ``num_nodes`` nodes); they fall as 1/N.

    Counted once per tensor: the input of every linear map (a layer's input,
    except the first layer's, which is the loaded data; and SAGE's
    neighbour aggregate, the input of ``lin_l``), every ReLU output (the
    next layer's input, so already counted) and the logits. GAT also needs,
    per layer, the projected values ``W x`` (the input of the aggregation),
    the source and destination attention logits (H each) and, to
    differentiate the softmax without per-edge state, the aggregated output
    and the per-node softmax max and sum (H each). Dropout adds nothing when
    its mask is recovered from the output (``pyg_sar.nn.functional``); the
    stock ``F.dropout(F.relu(x))`` keeps two more hidden-sized tensors per
    layer. Not counted: gradients alive during backward, parameters and
    optimizer state (under 1 MiB here), the graph's index tensors.
    """
    per_node = 0
    for layer, d in enumerate(dims):
        kept_input = d['inp'] if layer > 0 else 0
        if model == 'gat':
            width = d['heads'] * d['channels']
            per_node += kept_input + width + 2 * d['heads'] + \
                width + 2 * d['heads']
        elif model in ('gatv2', 'transformer'):
            # Two (GATv2: x_l, x_r) or three (keys, queries, values)
            # projected tables, the aggregated output, the softmax max and
            # sum.
            width = d['heads'] * d['channels']
            tables = 2 if model == 'gatv2' else 3
            per_node += kept_input + tables * width + width + 2 * d['heads']
        else:
            per_node += kept_input + d['inp']
    per_node += dims[-1]['out']  # logits
    return per_node * num_nodes * BYTES


def halo_bound_bytes(graph, model: str, dims: List[dict]) -> Optional[int]:
    r"""Lower bound of the halo bytes this worker receives in one training
    epoch (``None`` for the models over whole neighborhoods).

    A layer brings every halo source's exchanged row here once in forward,
    and the rows' gradients go back once in backward; summed over the
    workers the two directions are equal, so a layer counts
    ``directions * graph.halo_bytes(width)``, with ``width`` what crosses
    the wire:

    * SAGE (:class:`pyg_sar.train.GNN` sets ``transform_first``): a layer
      that does not widen its input exchanges ``lin_l(x)`` (its output
      width; it needs a gradient: 2 directions); a widening one exchanges
      its input, whose gradient the first layer does not need (the input
      features: 1 direction).
    * GAT exchanges the projected values ``W x`` (``heads * channels``) and
      the source attention logits (``heads``), both with gradients. Its
      messages are not linear in them, so ``"sar"`` mode fetches them again
      in backward: expect about 1.5x this bound (1.0x in ``"sa"``).
    """
    if model not in ('sage', 'gat'):
        return None
    total = 0
    for layer, d in enumerate(dims):
        if model == 'gat':
            width, directions = d['heads'] * d['channels'] + d['heads'], 2
        elif d['inp'] >= d['out']:
            width, directions = d['out'], 2
        else:
            width, directions = d['inp'], 1 if layer == 0 else 2
        total += directions * graph.halo_bytes(width)
    return total


def halo_refetch_bytes(graph, model: str, dims: List[dict]) -> int:
    """Halo bytes the engine fetches again in backward by design, beyond
    :func:`halo_bound_bytes`: SAGE's widening first layer recomputes its
    aggregate instead of keeping it (``linear_of_aggregate``: the input
    features' rows are fetched once more, one node-sized tensor less held
    through the epoch); GAT's ``"sar"`` mode fetches every layer's rows
    again (``0`` in the other modes and for the other models)."""
    total = 0
    for layer, d in enumerate(dims):
        if model == 'gat' and graph.mode == 'sar':
            total += graph.halo_bytes(d['heads'] * d['channels'] + d['heads'])
        elif model == 'sage' and layer == 0 and d['inp'] < d['out']:
            total += graph.halo_bytes(d['inp'])
    return total


# Probes ######################################################################

class _Peak:
    """The peak RSS since :meth:`start`, across resets of the kernel mark."""

    def start(self) -> None:
        gc.collect()
        self.base = status_mib('VmRSS')
        self.resettable = reset_hwm()
        self.peak = self.base
        self.maxrss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def fold(self) -> float:
        """Folds the current mark in; returns the peak since the last
        reset (or since the start without resets)."""
        hwm = status_mib('VmHWM')
        self.peak = max(self.peak, hwm)
        return hwm

    def reset(self) -> float:
        self.fold()
        gc.collect()
        rss = status_mib('VmRSS')
        if self.resettable:
            reset_hwm()
        return rss


# Models ######################################################################

def stock_model(model: str, dims: List[dict], dropout: float = 0.5):
    """The GNN's architecture with stock PyG convs, as a user writes it."""
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import (GATConv, GATv2Conv, GCNConv, GENConv,
                                    SAGEConv, TransformerConv)

    class Stock(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList()
            for layer, d in enumerate(dims):
                concat = layer < len(dims) - 1
                if model in ('gat', 'gatv2'):
                    layer_cls = GATv2Conv if model == 'gatv2' else GATConv
                    conv = layer_cls(d['inp'], d['channels'],
                                     heads=d['heads'], concat=concat)
                elif model == 'transformer':
                    conv = TransformerConv(d['inp'], d['channels'],
                                           heads=d['heads'], concat=concat)
                elif model == 'gcn':
                    conv = GCNConv(d['inp'], d['out'])
                elif model == 'gen':
                    conv = GENConv(d['inp'], d['out'], aggr='softmax',
                                   learn_t=True)
                else:
                    conv = SAGEConv(d['inp'], d['out'])
                self.convs.append(conv)

        def forward(self, x, edge_index):
            for layer, conv in enumerate(self.convs):
                x = conv(x, edge_index)
                if layer < len(self.convs) - 1:
                    x = F.relu(x)
                    x = F.dropout(x, p=dropout, training=self.training)
            return x

    return Stock()


# Worker ######################################################################

def run_worker(args) -> None:
    if args.impl == 'sar':
        # As a pyg_sar script starts: the package before torch, so that its
        # OpenMP wait policy applies (pyg_sar/utils/openmp.py).
        __import__('pyg_sar')
    import torch
    import torch.nn.functional as F
    from datetime import timedelta

    peak = _Peak()
    info: Dict = {}
    if args.impl == 'pyg':
        rank, world_size = 0, 1
        data = torch.load(args.data, weights_only=False)
        x, y, mask = data.x, data.y, data.train_mask
        edge_index = data.edge_index
        del data
        peak.start()
        num_classes = int(y.max()) + 1
        dims = layer_dims(args.model, x.size(1), args.hidden, num_classes,
                          args.layers, args.heads)
        model = stock_model(args.model, dims)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

        def epoch() -> None:
            optimizer.zero_grad()
            out = model(x, edge_index)
            loss = F.cross_entropy(out[mask], y[mask])
            loss.backward()
            optimizer.step()

        def barrier() -> None:
            pass
        num_nodes = x.size(0)
        rss_graph = peak.base
    else:
        import pyg_sar
        from pyg_sar.train import GNN
        import torch.distributed as dist
        rank, world_size = pyg_sar.init_distributed(
            timeout=timedelta(seconds=args.timeout))
        if getattr(args, 'edge_memory_budget', None):
            pyg_sar.comm.configure(
                edge_memory_budget=args.edge_memory_budget)
        if getattr(args, 'pipeline_depth', None):
            pyg_sar.comm.configure(pipeline_depth=args.pipeline_depth)
        part = pyg_sar.load_partition(args.parts, rank)
        num_classes = args.num_classes
        peak.start()
        # The README's snippet, line by line (mode and chunks: the flags).
        graph = pyg_sar.DistGraph(part, mode=getattr(args, 'mode', 'sar'),
                                  chunk_size=getattr(args, 'chunk_size',
                                                     None))
        rss_graph = status_mib('VmRSS')
        model = pyg_sar.nn.to_distributed(GNN(
            args.model, part.x.size(1), args.hidden, num_classes,
            num_layers=args.layers, heads=args.heads))
        pyg_sar.sync_params(model)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        num_train = pyg_sar.global_count(part.train_mask)
        halo = {}

        def epoch() -> None:
            optimizer.zero_grad()
            out = model(part.x, graph)
            loss = F.cross_entropy(out[part.train_mask],
                                   part.y[part.train_mask],
                                   reduction='sum') / num_train
            loss.backward()
            halo.update(pyg_sar.comm.comm_stats())  # before the all-reduce
            pyg_sar.all_reduce_grads(model)
            optimizer.step()

        def barrier() -> None:
            if dist.is_available() and dist.is_initialized():
                dist.barrier()
        num_nodes = graph.num_nodes
        dims = layer_dims(args.model, part.x.size(1), args.hidden,
                          num_classes, args.layers, args.heads)
        bound = halo_bound_bytes(graph, args.model, dims)
        refetch = halo_refetch_bytes(graph, args.model, dims) if bound \
            else None
        info.update(local_edges=graph.num_edges,
                    halo_nodes=graph.num_halo_nodes,
                    halo_bound_mib=bound / 2**20 if bound else None,
                    halo_refetch_mib=(refetch / 2**20 if refetch is not None
                                      else None))
    model.train()
    times, epoch_peaks, cpu, sys_cpu, faults = [], [], [], [], []
    befores, files, files0 = [], [], status_mib('RssFile')
    sent = 0
    for k in range(args.epochs + 1):
        barrier()
        before = peak.reset()
        befores.append(before - peak.base)
        files.append(status_mib('RssFile'))
        if args.impl == 'sar':
            pyg_sar.comm.reset_comm_stats()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        epoch()
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu.append(after.ru_utime + after.ru_stime - usage.ru_utime -
                   usage.ru_stime)
        sys_cpu.append(after.ru_stime - usage.ru_stime)
        faults.append(after.ru_minflt - usage.ru_minflt)
        if args.impl == 'sar' and k == args.epochs:
            sent = pyg_sar.comm.comm_stats()['bytes_sent']
            info['exchange_mib'] = halo['bytes_received'] / 2**20
        epoch_peaks.append(peak.fold() - before)
    peak.fold()
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if args.impl == 'sar' and not args.no_floor:
        # In the same process, after the epochs (memory already taken):
        # one profiled epoch, then the floor at this worker's shapes.
        from floor import breakdown, measure_floor
        barrier()
        info['breakdown'] = breakdown(epoch)
        barrier()
        dst = torch.repeat_interleave(
            torch.arange(part.csc_ptr.numel() - 1),
            part.csc_ptr[1:] - part.csc_ptr[:-1])
        _, src = torch.unique(part.csc_src.long(), return_inverse=True)
        num_src = int(src.max()) + 1 if src.numel() else num_nodes
        if args.model in ('gat', 'gatv2'):  # GAT(v2)Conv's self-loops
            loops = torch.arange(num_nodes)
            dst, src = torch.cat([dst, loops]), torch.cat([src, loops])
            num_src = max(num_src, num_nodes)
        info['floor'] = measure_floor(args.model, dims, num_nodes, num_src,
                                      dst, src)
        barrier()
    result = dict(
        rank=rank, world_size=world_size, impl=args.impl, model=args.model,
        code=os.environ.get('PYG_SAR_BENCH_CODE', 'this tree'),
        threads=torch.get_num_threads(), num_nodes=num_nodes,
        rss_loaded_mib=peak.base,
        peak_over_loaded_mib=peak.peak - peak.base,
        peak_mark_resettable=peak.resettable,
        maxrss_over_loaded_mib=(maxrss - peak.maxrss0) / 1024,
        graph_mib=rss_graph - peak.base,
        epoch_peak_mib=max(epoch_peaks),
        epoch_peaks_mib=epoch_peaks, rss_before_epochs_mib=befores,
        rss_file_before_epochs_mib=[f - files0 for f in files],
        epoch_times_s=times, epoch_s=statistics.median(times[1:] or times),
        cpu_s=statistics.median(cpu[1:] or cpu),
        sys_s=statistics.median(sys_cpu[1:] or sys_cpu),
        minor_faults=statistics.median(faults[1:] or faults),
        sent_mib=sent / 2**20,
        floor_mib=floor_bytes(args.model, num_nodes, dims) / 2**20,
        dims=dims, **info)
    with open(args.result, 'w') as f:
        json.dump(result, f)
    if args.impl == 'sar':
        import torch.distributed
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
