"""Full-batch link prediction equals single-process PyG.

A GCN encoder with a dot-product decoder, trained with PyG's
``negative_sampling`` every epoch (the link_pred example's loop), on one
process against pyg_sar at world sizes 1-3: the negatives of every epoch,
the loss curve, the embeddings, the feature gradient and every parameter
gradient. Graphs: the synthetic hard graph (directed, self loops, duplicate
edges, isolated nodes) and Cora split by ``RandomLinkSplit`` (when the real
data is present)."""
import random

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import GCNConv
from torch_geometric.utils import negative_sampling

import pyg_sar
from pyg_sar import comm, link
from _dist import run_workers
from _exact import FLOAT32, Tol, assemble, close, report
from _graphs import hard_graph

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow

EPOCHS = 4
# The feature gradient and the (all-reduced) parameter gradients.
GRADS = Tol(rtol=1e-4, atol=1e-6)


class Encoder(torch.nn.Module):
    def __init__(self, in_channels):
        super().__init__()
        self.conv1 = GCNConv(in_channels, 16)
        self.conv2 = GCNConv(16, 8)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def _labels(label_index, neg):
    index = torch.cat([label_index, neg], dim=1)
    label = torch.cat([torch.ones(label_index.size(1)),
                       torch.zeros(neg.size(1))])
    return index, label


def _reference(data, label_index, force_undirected):
    torch.manual_seed(0)
    model = Encoder(data.num_features)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    random.seed(5)
    x = data.x.clone().requires_grad_()
    history = []
    for epoch in range(EPOCHS):
        optimizer.zero_grad()
        x.grad = None
        z = model(x, data.edge_index)
        neg = negative_sampling(data.edge_index, num_nodes=data.num_nodes,
                                num_neg_samples=label_index.size(1),
                                method='sparse',
                                force_undirected=force_undirected)
        index, label = _labels(label_index, neg)
        out = (z[index[0]] * z[index[1]]).sum(dim=-1)
        loss = F.binary_cross_entropy_with_logits(out, label)
        loss.backward()
        history.append({
            'loss': float(loss), 'neg': neg.clone(), 'z': z.detach().clone(),
            'x_grad': x.grad.clone(),
            'grads': {n: p.grad.clone()
                      for n, p in model.named_parameters()}})
        optimizer.step()
    return history


def _distributed(rank, world_size, root, label_index, force_undirected,
                 mode):
    part = pyg_sar.load_partition(root, rank)
    graph = pyg_sar.DistGraph(part, mode=mode)
    torch.manual_seed(0)
    model = pyg_sar.nn.to_distributed(Encoder(part.x.size(1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    random.seed(5)
    x = part.x.clone().requires_grad_()
    history = []
    for epoch in range(EPOCHS):
        optimizer.zero_grad()
        x.grad = None
        z = model(x, graph)
        neg = link.negative_sampling(graph,
                                     num_neg_samples=label_index.size(1),
                                     force_undirected=force_undirected)
        index, label = _labels(label_index, neg)
        share = link.local_share(index.size(1))
        ends = graph.global_ids(index[:, share])
        rows = graph.fetch_nodes(z, ends.reshape(-1))
        rows = rows.view(2, -1, rows.size(-1))
        out = (rows[0] * rows[1]).sum(dim=-1)
        loss = F.binary_cross_entropy_with_logits(
            out, label[share], reduction='sum') / index.size(1)
        loss.backward()
        pyg_sar.all_reduce_grads(model)
        history.append({
            'loss': float(comm.all_reduce(loss.detach().clone(), 'sum')),
            'neg': neg.clone(), 'z': z.detach().clone(),
            'x_grad': x.grad.clone(), 'orig_ids': part.orig_ids.clone(),
            'grads': {n: p.grad.clone()
                      for n, p in model.named_parameters()}})
        optimizer.step()
    return history


def _compare(reference, per_rank, num_nodes):
    failures = []
    ids = [history[0]['orig_ids'] for history in per_rank]
    for epoch, expected in enumerate(reference):
        got = [history[epoch] for history in per_rank]
        for rank, g in enumerate(got):
            where = f'epoch {epoch} rank {rank}'
            if not torch.equal(g['neg'], expected['neg']):
                failures.append(f'{where}: other negatives than PyG')
            if g['loss'] != pytest.approx(expected['loss'], rel=1e-5,
                                          abs=1e-6):
                failures.append(f'{where}: loss {g["loss"]} != PyG '
                                f'{expected["loss"]}')
            # Every rank holds the all-reduced gradients.
            for name, grad in expected['grads'].items():
                failures += close(g['grads'][name], grad, GRADS,
                                  f'{where} dL/d{name}')
        failures += close(assemble(ids, [g['z'] for g in got], num_nodes),
                          expected['z'], FLOAT32, f'epoch {epoch} z')
        failures += close(assemble(ids, [g['x_grad'] for g in got],
                                   num_nodes), expected['x_grad'], GRADS,
                          f'epoch {epoch} dL/dx')
    report(failures)


def _positive_labels(data, count, seed=1):
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randperm(data.edge_index.size(1), generator=gen)[:count]
    return data.edge_index[:, pick]


@pytest.mark.parametrize('world_size,mode,force_undirected', [
    (1, 'sar', False), (2, 'sar', True), (3, 'sar', False),
    (3, 'one_shot', True)])
def test_link_prediction_equals_single_process(tmp_path, world_size, mode,
                                               force_undirected):
    data = hard_graph()
    label_index = _positive_labels(data, 90)
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, world_size, root)
    reference = _reference(data, label_index, force_undirected)
    per_rank = run_workers(_distributed, world_size, root, label_index,
                           force_undirected, mode, timeout_s=60)
    _compare(reference, per_rank, data.num_nodes)


def test_link_prediction_on_cora_with_random_link_split(shared_data_root,
                                                        tmp_path):
    from torch_geometric.transforms import RandomLinkSplit
    data = pyg_sar.datasets.load('Cora', shared_data_root)
    torch.manual_seed(0)
    train_data, _, _ = RandomLinkSplit(
        num_val=0.05, num_test=0.1, is_undirected=True,
        add_negative_train_samples=False)(data)
    root = str(tmp_path / 'parts')
    # The labels are not per node or per edge: every rank gets them whole.
    label_index = train_data.edge_label_index
    graph_data = train_data.clone()
    del graph_data.edge_label, graph_data.edge_label_index
    pyg_sar.partition_graph(graph_data, 3, root)
    reference = _reference(train_data, label_index, False)
    per_rank = run_workers(_distributed, 3, root, label_index, False, 'sar',
                           timeout_s=120)
    _compare(reference, per_rank, train_data.num_nodes)


def _fetch_and_lookup(rank, world_size, root):
    part = pyg_sar.load_partition(root, rank)
    graph = pyg_sar.DistGraph(part)
    # Every rank asks for different nodes, with repeats and in any order.
    gen = torch.Generator().manual_seed(rank)
    wanted = torch.randint(0, part.num_nodes, (25 + 10 * rank, ),
                           generator=gen)
    ids = graph.global_ids(wanted)
    x = part.x.clone().requires_grad_()
    rows = graph.fetch_nodes(x * 2, ids)
    weights = torch.arange(rows.numel(), dtype=rows.dtype).view_as(rows)
    (rows * weights).sum().backward()
    errors = []
    for bad in (torch.tensor([part.num_nodes]), torch.tensor([-1])):
        try:
            graph.global_ids(bad if rank == 0 else wanted[:3])
        except ValueError as e:
            errors.append(str(e))
    return wanted, rows.detach(), weights, x.grad, part.orig_ids, errors


def test_fetch_nodes_and_global_ids(tmp_path):
    data = hard_graph()
    root = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, 3, root)
    results = run_workers(_fetch_and_lookup, 3, root, timeout_s=60)
    expected_grad = torch.zeros_like(data.x)
    for wanted, rows, weights, _, _, errors in results:
        torch.testing.assert_close(rows, data.x[wanted] * 2)
        expected_grad.index_add_(0, wanted, weights * 2)
        # An unknown id fails on every rank, not only on the asking one.
        assert len(errors) == 2, errors
        assert all('are not nodes of the partitioned graph' in e
                   for e in errors), errors
    x_grad = assemble([r[4] for r in results], [r[3] for r in results],
                      data.num_nodes)
    torch.testing.assert_close(x_grad, expected_grad)
