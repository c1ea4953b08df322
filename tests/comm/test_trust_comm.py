"""Trust in the communication layer: a setting that shapes messages agrees
on every rank or is refused on every rank (never a short read), a loader
left early cannot pair its traffic with a later collective (never a wrong
number), and a run that never calls ``comm.shutdown()`` still exits cleanly.

Every test reproduces a failure reported against the package: ranks with
different settings exchanged messages of different sizes (garbage, or a
SIGABRT in gloo); ``global_count`` after ``for b in loader: break`` on one
rank returned 106 instead of 200; torchrun reported an abort after the work
finished. Two gloo ranks, a graph of a few hundred nodes."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from pyg_sar import datasets, partition_graph
from tests._dist import run_workers

FEATURES = 16
HALF = 100  # nodes of each rank counted by global_count: 200 in all
SMALL_CAP = 1024  # bytes per message on rank 0 only (the setting)


@pytest.fixture(scope='module')
def parts(tmp_path_factory):
    data = datasets.synthetic_graph(300, 6, FEATURES, 3, seed=4)
    root = str(tmp_path_factory.mktemp('trust_comm') / 'two')
    partition_graph(data, 2, root)
    return root


def _propagate(part, graph):
    """One SAGE layer forward and backward on ``graph``: every rank's output
    and input gradient."""
    import pyg_sar
    torch.manual_seed(0)
    conv = pyg_sar.nn.SAGEConv(FEATURES, 4)
    x = part.x.clone().requires_grad_()
    out = conv(x, graph)
    (out * out).sum().backward()
    return out.detach(), x.grad


def _refused(fn):
    """The one-line message of the ``SettingsMismatchError`` that ``fn()``
    raises, or what happened instead."""
    from pyg_sar import comm
    try:
        result = fn()
    except comm.SettingsMismatchError as e:
        return str(e)
    return f'not refused: {result!r}'


# 1. Settings that shape messages ############################################

def _one_rank_settings(rank, world_size, root):
    """Every refusal that comes at once, in one process group: each check
    restores the settings, and a refused check leaves the group usable (the
    ranks compared their settings in a gather that completed)."""
    import pyg_sar
    from pyg_sar import comm
    from pyg_sar.comm.state import CommConfig
    from pyg_sar.loader import DistNeighborLoader
    default = CommConfig()
    part = pyg_sar.load_partition(root, rank)
    found = {}

    def on_rank_0(**settings):
        comm.configure(**(settings if rank == 0 else {
            k: getattr(default, k) for k in settings}))

    def restore():
        comm.configure(max_bytes_per_message=default.max_bytes_per_message,
                       halo_slice_bytes=default.halo_slice_bytes)

    # The issue: a message cap on rank 0 only, then a graph and a layer.
    on_rank_0(max_bytes_per_message=SMALL_CAP)
    found['graph'] = _refused(
        lambda: _propagate(part, pyg_sar.DistGraph(part)))
    restore()
    on_rank_0(halo_slice_bytes=100)
    found['halo slices'] = _refused(
        lambda: _propagate(part, pyg_sar.DistGraph(part)))
    restore()
    # DistGraph options that decide which exchanges run.
    found['mode'] = _refused(lambda: _propagate(part, pyg_sar.DistGraph(
        part, mode='sar' if rank == 0 else 'one_shot')))
    found['chunk_size'] = _refused(lambda: _propagate(part, pyg_sar.DistGraph(
        part, chunk_size=None if rank == 0 else 64)))
    # Loaders: their options and the message cap of their attribute fetch.
    found['num_neighbors'] = _refused(lambda: list(DistNeighborLoader(
        part, [3, 2] if rank == 0 else [2, 2], batch_size=32)))
    on_rank_0(max_bytes_per_message=SMALL_CAP)
    found['loader'] = _refused(lambda: [b.x.sum() for b in DistNeighborLoader(
        part, [3, 2], batch_size=32, seed=0)])
    restore()
    # No refusal left the group unusable: the ranks go on.
    found['after'] = comm.global_count(torch.ones(HALF, dtype=torch.bool))
    return found


def test_a_setting_changed_on_one_rank_is_refused_on_every_rank(parts):
    cap = f'rank 0 has {SMALL_CAP}, rank 1 has {256 * 1024 * 1024}'
    expected = {
        'graph': f'max_bytes_per_message differs across ranks: {cap}',
        'halo slices': f'halo_slice_bytes differs across ranks: rank 0 has '
                       f'100, rank 1 has {8 * 1024 * 1024}',
        'mode': "mode differs across ranks: rank 0 has 'sar', rank 1 has "
                "'one_shot'",
        'chunk_size': 'chunk_size differs across ranks: rank 0 has None, '
                      'rank 1 has 64',
        'num_neighbors': 'num_neighbors differs across ranks: rank 0 has '
                         '(3, 2), rank 1 has (2, 2)',
        'loader': f'max_bytes_per_message differs across ranks: {cap}',
    }
    reports = run_workers(_one_rank_settings, 2, parts, timeout_s=20)
    for rank, found in enumerate(reports):
        assert found.pop('after') == 2 * HALF
        assert set(found) == set(expected)
        for check, message in found.items():
            assert expected[check] in message, (rank, check, message)
            assert message.startswith(f'rank {rank}: '), message
            assert '\n' not in message


def _changed_after_agreement(rank, world_size, root, alone):
    """Rank 0 (``alone``) or every rank changes the halo slices after the
    graph was built (the ranks agreed there); then a layer runs. Returns
    both runs and the messages each sent."""
    import time

    import pyg_sar
    from pyg_sar import comm
    part = pyg_sar.load_partition(root, rank)
    graph = pyg_sar.DistGraph(part)
    runs = []
    for halo_slice_bytes in (None, 100):
        if halo_slice_bytes is not None and (rank == 0 or not alone):
            comm.configure(halo_slice_bytes=halo_slice_bytes)
        comm.reset_comm_stats()
        try:
            runs.append((_propagate(part, graph),
                         comm.comm_stats()['messages_sent']))
        except comm.SettingsMismatchError:
            if rank == 0:  # rank 0 hosts the rendezvous store (torchrun's
                time.sleep(2)  # agent would): let rank 1 read it first
            raise
    return runs


def test_a_change_on_every_rank_takes_effect_at_once(parts):
    for (reference, messages), (sliced, sliced_messages) in run_workers(
            _changed_after_agreement, 2, parts, False, timeout_s=20):
        for a, b in zip(reference, sliced):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        assert sliced_messages > messages  # slices of one row each


def test_a_change_on_one_rank_after_agreement_is_never_paired(parts):
    """Its peer cannot know of it: both wait (rank 0 to agree, rank 1 on
    rank 0's messages, which are never posted) until the timeout, then both
    report the setting; no message of a different size is ever exchanged
    (which gloo answers with garbage or SIGABRT)."""
    results = run_workers(_changed_after_agreement, 2, parts, True,
                          timeout_s=4, expect_errors=True)
    for rank, (status, text) in enumerate(results):
        assert status == 'error', (rank, text)
        last = text.strip().splitlines()[-1]
        assert 'SettingsMismatchError' in last, text
        assert 'halo_slice_bytes differs across ranks: rank 0 has 100, ' \
               f'rank 1 has {8 * 1024 * 1024}' in last, text


# 2. A loader left early ######################################################

def _leave_early(rank, world_size, root, who_breaks):
    import pyg_sar
    from pyg_sar.loader import DistNeighborLoader
    part = pyg_sar.load_partition(root, rank)
    loader = DistNeighborLoader(part, [3, 2], batch_size=16, seed=0)
    seen = 0
    for batch in loader:
        seen += 1
        if rank in who_breaks:
            break
    report = dict(seen=seen, num_batches=loader.num_batches,
                  total=pyg_sar.global_count(torch.ones(HALF,
                                                        dtype=torch.bool)))
    try:
        report['again'] = sum(1 for _ in loader)  # the next epoch, in full
    except RuntimeError as e:  # e.g. the previous epoch is still open
        report['again'] = str(e)
    return report


@pytest.mark.parametrize('who_breaks', [(0, ), (0, 1)])
def test_a_loop_left_early_finishes_its_epoch_collectively(parts,
                                                           who_breaks):
    """``for b in loader: break`` on rank 0 (or on both), then
    ``global_count``: 200, never the peer's sampling traffic (106); a rank
    that goes on iterating gets every batch; the next epoch runs."""
    results = run_workers(_leave_early, 2, parts, who_breaks, timeout_s=20,
                          expect_errors=True)
    for rank, (status, report) in enumerate(results):
        assert status == 'ok', report
        assert report['total'] == 2 * HALF, report
        assert report['num_batches'] > 1
        assert report['seen'] == (1 if rank in who_breaks else
                                  report['num_batches'])
        assert report['again'] == report['num_batches']


def _fails_in_the_loop(rank, world_size, root):
    import time

    import pyg_sar
    from pyg_sar import comm
    from pyg_sar.loader import DistNeighborLoader
    part = pyg_sar.load_partition(root, rank)
    loader = DistNeighborLoader(part, [3, 2], batch_size=16, seed=0,
                                pad_batches=True)
    start = time.perf_counter()
    try:
        for step, batch in enumerate(loader):
            comm.global_count(batch.batch_size)  # a collective per step
            if rank == 0 and step == 1:
                raise RuntimeError('rank 0 fails in its loop body')
    except comm.PeerError as e:
        return e.peer, e.timed_out, time.perf_counter() - start
    return None


def test_a_rank_failing_in_the_loop_does_not_hold_its_peers(parts):
    """The epoch left by an exception is not finished then (only at the
    rank's next operation, which a failing rank never reaches): rank 0
    exits at once and rank 1 fails fast, naming it, instead of both waiting
    for the timeout."""
    results = run_workers(_fails_in_the_loop, 2, parts, timeout_s=30,
                          expect_errors=True)
    assert results[0][0] == 'error' and 'fails in its loop' in results[0][1]
    status, (peer, timed_out, elapsed) = results[1]
    assert status == 'ok' and peer == 0 and not timed_out
    assert elapsed < 15


def _iterator_left_open(rank, world_size, root):
    import pyg_sar
    from pyg_sar.loader import DistNeighborLoader
    part = pyg_sar.load_partition(root, rank)
    loader = DistNeighborLoader(part, [3, 2], batch_size=16, seed=0)
    it = iter(loader)
    next(it)
    if rank == 0:  # keeps the epoch open, and calls a collective
        return pyg_sar.global_count(torch.ones(HALF, dtype=torch.bool))
    return sum(1 for _ in it)


def test_an_iterator_left_open_is_an_error_never_a_wrong_number(parts):
    """The loader's traffic runs on its own channel: rank 0's collective
    cannot pair with rank 1's sampling rounds; both wait until the timeout
    and report it."""
    results = run_workers(_iterator_left_open, 2, parts, timeout_s=4,
                          expect_errors=True)
    for rank, (status, text) in enumerate(results):
        assert status == 'error', (rank, text)
        last = text.strip().splitlines()[-1]
        assert 'PeerError' in last and f'rank {1 - rank}' in last, text


# 3. No shutdown() ############################################################

_NO_SHUTDOWN = textwrap.dedent('''
    import sys
    from datetime import timedelta

    import torch
    import pyg_sar
    from pyg_sar import comm

    rank, world_size = comm.init_distributed(timeout=timedelta(seconds=30))
    comm.ensure_channels()
    total = comm.global_count(torch.ones(100, dtype=torch.bool))
    if sys.argv[1] != '-':
        from pyg_sar.loader import DistNeighborLoader
        part = pyg_sar.load_partition(sys.argv[1], rank)
        loader = DistNeighborLoader(part, [3, 2], batch_size=32, seed=0)
        total += sum(b.batch_size for b in loader)
    print(f'rank {rank} done {total}', flush=True)
    # No comm.shutdown(): the process groups are torn down at exit.
''')


def test_a_run_without_shutdown_exits_cleanly(parts, tmp_path):
    from pyg_sar.comm import find_free_port
    script = tmp_path / 'no_shutdown.py'
    script.write_text(_NO_SHUTDOWN)
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(
        [os.path.abspath(os.path.join(os.path.dirname(__file__), '..',
                                      '..'))] +  # the repository
        [p for p in [os.environ.get('PYTHONPATH')] if p])}
    # Without the exit teardown, about every second run of the light script
    # aborted ("terminate called without an active exception").
    for argument in ['-'] * 5 + [parts]:
        run = subprocess.run(
            [sys.executable, '-m', 'torch.distributed.run',
             '--nproc-per-node', '2', '--master-port', str(find_free_port()),
             str(script), argument],
            capture_output=True, text=True, timeout=180, env=env)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
        assert 'terminate called' not in run.stderr
        assert run.stdout.count(' done ') == 2, run.stdout
