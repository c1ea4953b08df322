"""Plain DGL beside pyg_sar (``benchmarks/full_batch.py --dgl PYTHON``).

Runs inside a separate DGL venv (``torch==2.2.1``, ``dgl==2.1.0``; see
``docs/benchmarks.rst``), so it imports neither pyg_sar nor
torch_geometric and reads the graph from the ``.npz`` the benchmark writes
(``src``, ``dst``, ``x``, ``y``, ``train_mask``: the very tensors pyg_sar
trains on). The model is the one a DGL user writes for the same
architecture as :class:`pyg_sar.train.GNN`:

* ``sage``: ``dgl.nn.SAGEConv(aggregator_type='mean')`` x layers, hidden 256;
* ``gat``: ``dgl.nn.GATConv`` x layers, hidden layers concatenating
  ``heads`` heads of ``hidden // heads`` channels, the last averaging
  ``heads`` heads; self-loops added as PyG's ``GATConv`` does;
* ``gcn``: ``dgl.nn.GraphConv(norm='both')`` x layers, hidden 256, with
  self-loops: PyG's ``GCNConv``;

ReLU and dropout 0.5 between layers, full-graph cross-entropy on the
training mask, Adam. Writes the same timing and memory fields as
``full_batch_worker.run_worker`` (median epoch after the first, its CPU
seconds, peak RSS over the RSS after loading).

    /work/dglvenv/bin/python benchmarks/dgl_worker.py --data g.npz \
        --model sage --hidden 256 --layers 3 --heads 4 --epochs 2 \
        --result out.json
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import time


def _status_mib(key: str) -> float:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(key + ':'):
                return int(line.split()[1]) / 1024
    return 0.0


def _reset_hwm() -> bool:
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        return True
    except OSError:
        return False


def build_model(model: str, in_dim: int, hidden: int, out_dim: int,
                layers: int, heads: int, dropout: float = 0.5):
    import torch
    import torch.nn.functional as F
    from dgl.nn import GATConv, GraphConv, SAGEConv

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList()
            width = in_dim
            for layer in range(layers):
                last = layer == layers - 1
                if model == 'gat':
                    channels = out_dim if last else hidden // heads
                    self.convs.append(GATConv(width, channels, heads))
                    width = heads * channels
                elif model == 'gcn':  # PyG's GCNConv: D^-1/2 (A+I) D^-1/2
                    dim = out_dim if last else hidden
                    self.convs.append(GraphConv(width, dim, norm='both'))
                    width = dim
                else:
                    dim = out_dim if last else hidden
                    self.convs.append(SAGEConv(width, dim, 'mean'))
                    width = dim

        def forward(self, g, x):
            for layer, conv in enumerate(self.convs):
                x = conv(g, x)
                if model == 'gat':  # [N, H, C]: concat, or mean at the end
                    x = x.mean(1) if layer == len(self.convs) - 1 else \
                        x.flatten(1)
                if layer < len(self.convs) - 1:
                    x = F.dropout(F.relu(x), p=dropout,
                                  training=self.training)
            return x

    return Net()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--data', required=True)
    parser.add_argument('--model', choices=('sage', 'gat', 'gcn'),
                        required=True)
    parser.add_argument('--hidden', type=int, default=256)
    parser.add_argument('--layers', type=int, default=3)
    parser.add_argument('--heads', type=int, default=4)
    parser.add_argument('--epochs', type=int, default=2)
    parser.add_argument('--result', required=True)
    args = parser.parse_args(argv)

    import dgl
    import numpy as np
    import torch
    import torch.nn.functional as F

    arrays = np.load(args.data)
    src = torch.from_numpy(arrays['src'].astype(np.int64))
    dst = torch.from_numpy(arrays['dst'].astype(np.int64))
    x = torch.from_numpy(arrays['x'])
    y = torch.from_numpy(arrays['y'].astype(np.int64))
    mask = torch.from_numpy(arrays['train_mask'].astype(bool))
    del arrays
    g = dgl.graph((src, dst), num_nodes=x.size(0))
    if args.model in ('gat', 'gcn'):  # PyG's GATConv / GCNConv add them
        g = dgl.add_self_loop(dgl.remove_self_loop(g))
    del src, dst
    g.create_formats_()  # built once, before the timed epochs
    rss0 = _status_mib('VmRSS')
    resettable = _reset_hwm()
    model = build_model(args.model, x.size(1), args.hidden,
                        int(y.max()) + 1, args.layers, args.heads)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()

    times, cpu = [], []
    for _ in range(args.epochs + 1):
        usage = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        optimizer.zero_grad()
        out = model(g, x)
        loss = F.cross_entropy(out[mask], y[mask])
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu.append(after.ru_utime + after.ru_stime - usage.ru_utime -
                   usage.ru_stime)
    peak = _status_mib('VmHWM')
    result = dict(
        impl='dgl', model=args.model, world_size=1, rank=0,
        dgl=dgl.__version__, torch=torch.__version__,
        threads=torch.get_num_threads(), num_nodes=int(x.size(0)),
        num_edges=int(g.num_edges()), rss_loaded_mib=rss0,
        peak_over_loaded_mib=peak - rss0, peak_mark_resettable=resettable,
        epoch_times_s=times, epoch_s=statistics.median(times[1:] or times),
        cpu_s=statistics.median(cpu[1:] or cpu), loss=float(loss))
    with open(args.result, 'w') as f:
        json.dump(result, f)


if __name__ == '__main__':
    main()
