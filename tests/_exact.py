"""The exactness harness: what the ranks of a distributed run computed,
reassembled by global node id, against single-process PyG on the whole
graph.

Rank ``r`` of a run holds the rows of its own nodes (input ids ``ids[r]``)
of an output and of the input gradient, and a partial sum of every
parameter gradient. :func:`mismatches` puts the rows back in input order
(checking that the ranks hold every node exactly once), sums the parameter
gradients over the ranks and compares every tensor with the single-process
one under a named tolerance (:class:`Tol`). It returns one line per
mismatch, naming the case (layer, mode, chunk size, world size: the
caller's ``what``) and the tensor; :func:`report` fails a test with all of
them, so that a mismatch in one tensor does not hide the others.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Union

import torch
from torch import Tensor


@dataclass(frozen=True)
class Tol:
    """``rtol`` and ``atol`` of :func:`torch.testing.assert_close`. With
    ``scaled``, ``atol`` is relative to the expected tensor's largest
    absolute entry (at least ``floor``): sums taken in another order differ
    by a few ulps of the largest term, not of each entry."""
    rtol: float
    atol: float
    scaled: bool = False
    floor: float = 1.0

    def atol_for(self, expected: Tensor,
                 scale: Optional[float] = None) -> float:
        if not self.scaled:
            return self.atol
        if scale is None:
            scale = float(expected.abs().max()) if expected.numel() else 0.
        return self.atol * max(self.floor, scale)


# float32 on the test graphs: only the order of the sums differs.
FLOAT32 = Tol(rtol=1e-4, atol=1e-5)
# The same, absolute errors relative to the tensor's largest entry.
FLOAT32_SCALED = Tol(rtol=1e-4, atol=1e-5, scaled=True)
# Per dtype, relative to the tensor's largest entry: float64 shows any
# error that is not rounding.
BY_DTYPE = {torch.float32: Tol(rtol=1e-4, atol=1e-4, scaled=True),
            torch.float64: Tol(rtol=1e-10, atol=1e-10, scaled=True)}


def one_line(what: str, error: BaseException) -> str:
    """``what: message`` on one line."""
    return f'{what}: ' + ' '.join(
        line.strip() for line in str(error).splitlines() if line.strip())


def close(actual: Tensor, expected: Tensor, tol: Tol, what: str,
          scale: Optional[float] = None) -> List[str]:
    """``[]`` when ``actual`` equals ``expected`` within ``tol`` (same
    shape and dtype), else the one line that says how they differ.
    ``scale``: the largest entry a scaled tolerance is relative to, where
    it is not the expected tensor's own."""
    try:
        torch.testing.assert_close(actual, expected, rtol=tol.rtol,
                                   atol=tol.atol_for(expected, scale))
    except AssertionError as e:
        return [one_line(what, e)]
    return []


def assemble(ids: Sequence[Tensor], rows: Sequence[Tensor],
             num_nodes: int) -> Tensor:
    """The rows ``rows[r]`` of the nodes ``ids[r]`` of every rank ``r``, in
    input order. Fails unless the ranks hold every node exactly once."""
    order = torch.cat([i.reshape(-1).long().cpu() for i in ids])
    if not torch.equal(order.sort().values, torch.arange(num_nodes)):
        raise AssertionError(
            f'the ranks hold {order.numel()} rows, {order.unique().numel()} '
            f'distinct nodes, for a graph of {num_nodes} nodes')
    values = torch.cat(list(rows))
    full = values.new_empty(values.shape)
    full[order] = values
    return full


def sum_over_ranks(grads: Sequence[Optional[Tensor]], like: Tensor) -> Tensor:
    """The sum of the ranks' partial gradients, in their dtype; a rank
    without one (none of its nodes reach the parameter) adds nothing, and
    no rank with one gives zeros like ``like``."""
    present = [g for g in grads if g is not None]
    if not present:
        return torch.zeros_like(like)
    total = present[0].clone()
    for g in present[1:]:
        total += g
    return total


Rows = Union[Tensor, Dict[str, Tensor]]


def _rows(what: str, label: str, ids, got_rows, expected: Rows,
          tol: Tol) -> List[str]:
    """Outputs or input gradients: one tensor, or one per node type."""
    if not isinstance(expected, dict):
        return close(assemble(ids, got_rows, expected.size(0)), expected,
                     tol, f'{what} {label}')
    failures = []
    for rank, rows in enumerate(got_rows):
        if set(rows) != set(expected):
            failures.append(f'{what} {label}: rank {rank} has node types '
                            f'{sorted(rows)}, PyG {sorted(expected)}')
    if failures:
        return failures
    for t, ref in expected.items():
        failures += close(assemble([i[t] for i in ids],
                                   [rows[t] for rows in got_rows],
                                   ref.size(0)), ref, tol,
                          f'{what} {label} {t}')
    return failures


def mismatches(what: str, ids: Sequence, got: Sequence, expected,
               tol: Tol, *, grad_scale: Optional[float] = None,
               params: str = 'every', none_grads: str = 'match'
               ) -> List[str]:
    """One line per tensor of a distributed run that differs from PyG's.

    ``expected``: ``(output, dL/dx, {parameter: dL/dparameter})`` of the
    single-process run on the whole graph; ``got[r]`` the same of rank
    ``r``, whose rows are those of the nodes ``ids[r]`` (outputs, inputs
    and ids may be dicts by node type). Parameter gradients are summed
    over the ranks (``grad_scale``: the largest entry a scaled tolerance is
    relative to, e.g. the largest of all parameter gradients, where
    gradients that are zero in exact arithmetic carry the rounding noise of
    the whole backward).

    ``params``: ``'every'``, every rank reports every parameter of the
    model (``None`` where it has no gradient); ``'some'``, ranks report the
    parameters they have gradients for. ``none_grads``: where PyG's
    gradient is ``None``, every rank's must be too (``'match'``) or the
    parameter is not compared (``'skip'``).
    """
    failures = _rows(what, 'output', ids, [g[0] for g in got], expected[0],
                     tol)
    failures += _rows(what, 'dL/dx', ids, [g[1] for g in got], expected[1],
                      tol)
    ref_grads = expected[2]
    if params == 'every':
        for rank, g in enumerate(got):
            if set(g[2]) != set(ref_grads):
                failures.append(
                    f'{what}: rank {rank} has parameters {sorted(g[2])}, '
                    f'PyG {sorted(ref_grads)}')
    for name, ref in ref_grads.items():
        grads = [g[2].get(name) for g in got]
        if ref is None:
            if none_grads == 'match' and any(g is not None for g in grads):
                failures.append(f'{what} dL/d{name}: PyG has none, ranks '
                                f'{[g is not None for g in grads]} do')
            continue
        failures += close(sum_over_ranks(grads, ref), ref, tol,
                          f'{what} dL/d{name}', grad_scale)
    return failures


def report(failures: Sequence[str]) -> None:
    """Fails with every mismatch, one line each."""
    assert not failures, (f'{len(failures)} mismatch(es):\n' +
                          '\n'.join(failures))


def train_curve(make_net, inputs: Sequence, y: Tensor, mask: Tensor,
               total: int, epochs: int, dist: bool = False,
               lr: float = 0.02, seed: int = 7) -> List[float]:
    """The loss of each of ``epochs`` Adam steps of ``make_net()`` (built
    after seeding, so every rank starts from the same weights) on
    ``net(*inputs)``: cross-entropy summed over ``mask`` over ``total``
    (the global count of ``mask`` nodes). With ``dist``, the net is
    converted by :func:`pyg_sar.nn.to_distributed`, its gradients are
    all-reduced and the loss is the global one."""
    import pyg_sar
    torch.manual_seed(seed)
    net = make_net()
    if dist:
        net = pyg_sar.nn.to_distributed(net)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    losses = []
    for _ in range(epochs):
        opt.zero_grad()
        out = net(*inputs)
        loss = torch.nn.functional.cross_entropy(
            out[mask], y[mask], reduction='sum') / max(total, 1)
        loss.backward()
        if dist:
            pyg_sar.all_reduce_grads(net)
            loss = pyg_sar.comm.all_reduce(loss.detach().clone())
        opt.step()
        losses.append(float(loss))
    return losses
