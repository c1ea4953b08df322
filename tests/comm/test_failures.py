"""Refused inputs (non-finite features) and the reports of failed peers."""
import os
import os.path as osp
import pickle
from datetime import timedelta

import pytest
import torch
from torch_geometric.data import Data

import pyg_sar
from pyg_sar import cli, comm
from _dist import run_workers

NAN, INF = float('nan'), float('inf')


def _graph(num_nodes=40, num_edges=120, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return Data(
        x=torch.randn(num_nodes, 5, generator=gen),
        y=torch.randint(0, 3, (num_nodes, ), generator=gen),
        train_mask=torch.rand(num_nodes, generator=gen) < 0.5,
        edge_index=torch.randint(0, num_nodes, (2, num_edges),
                                 generator=gen),
        edge_attr=torch.randn(num_edges, 2, generator=gen),
    )


# Non-finite features ########################################################


@pytest.mark.parametrize('bad', [NAN, INF, -INF])
def test_non_finite_node_features_are_refused(tmp_path, bad):
    data = _graph()
    data.x[7, 3] = bad
    data.x[29] = bad
    out_dir = str(tmp_path / 'parts')
    with pytest.raises(ValueError) as info:
        pyg_sar.partition_graph(data, 2, out_dir)
    message = str(info.value)
    kind = 'NaN' if bad != bad else 'inf'
    assert '\n' not in message
    assert message.startswith(f"Node attribute 'x' has {kind} values in 2 "
                              f"of 40 rows (first: input node 7)"), message
    assert 'allow_non_finite=True' in message
    assert '--allow-non-finite' in message
    assert not osp.exists(out_dir)  # refused before anything is written


def test_non_finite_features_are_kept_with_the_opt_out(tmp_path):
    data = _graph()
    data.x[7, 3] = NAN
    data.x[29, 0] = INF
    data.edge_attr[5, 1] = NAN
    out_dir = str(tmp_path / 'parts')
    manifest = pyg_sar.partition_graph(data, 2, out_dir,
                                       allow_non_finite=True)
    assert 'check_finite' not in manifest['time_s']  # skipped entirely
    x = torch.empty_like(data.x)
    edge_attr = []
    for rank in range(2):
        part = pyg_sar.load_partition(out_dir, rank)
        x[part.orig_ids] = part.x
        edge_attr.append(part.edge_attr)
    torch.testing.assert_close(x, data.x, equal_nan=True)
    assert int(torch.isnan(torch.cat(edge_attr)).sum()) == 1


def test_non_finite_edge_attribute_is_refused(tmp_path):
    data = _graph()
    data.edge_attr[11, 0] = NAN
    data.edge_attr[90, 1] = NAN
    data.edge_weight = torch.rand(data.num_edges)
    data.edge_weight[3] = INF
    with pytest.raises(ValueError) as info:
        pyg_sar.partition_graph(data, 2, str(tmp_path / 'parts'))
    message = str(info.value)
    assert '\n' not in message
    assert message.startswith("Edge attribute 'edge_attr' has NaN values in "
                              "2 of 120 rows (first: input edge 11); "
                              "'edge_weight' has non-finite values too"), \
        message
    assert 'allow_non_finite=True' in message


def test_finite_features_that_overflow_a_sum_are_accepted(tmp_path):
    # The fast check sums each attribute; an overflowing sum of finite
    # values must fall back to the exact test, not refuse the graph.
    data = _graph()
    data.x = torch.full((40, 5), 3e38)
    data.pos = torch.full((40, 3), 6e4, dtype=torch.float16)
    manifest = pyg_sar.partition_graph(data, 2, str(tmp_path / 'parts'))
    assert manifest['time_s']['check_finite'] >= 0
    data.pos[39, 2] = INF
    with pytest.raises(ValueError, match=r"'pos' has inf values in 1 of 40 "
                       r"rows \(first: input node 39\)"):
        pyg_sar.partition_graph(data, 2, str(tmp_path / 'again'))


def test_cli_refuses_non_finite_features_unless_allowed(tmp_path, capsys,
                                                         monkeypatch):
    from pyg_sar import datasets
    data = _graph()
    data.x[2, 1] = NAN
    monkeypatch.setattr(datasets, 'load', lambda *args, **kwargs: data)
    out_dir = str(tmp_path / 'parts')
    argv = ['partition', '--dataset', 'Cora', '--num-parts', '2', '--out',
            out_dir]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Node attribute 'x' has NaN values in 1 of 40 rows (first: " \
        "input node 2)" in err, err
    assert cli.main(argv + ['--allow-non-finite']) == 0
    assert osp.isdir(out_dir)


# Failed peers ###############################################################


def _peer_exits_at_once(rank, world_size, operation):
    if rank == world_size - 1:
        os._exit(3)  # dies right after joining the process group
    try:
        if operation == 'receive':
            comm.post_exchange({}, {world_size - 1: [((4, ), torch.float32)]
                                    }).wait()
        else:
            comm.all_reduce(torch.ones(4))
    except pyg_sar.PeerError as e:
        return pickle.loads(pickle.dumps(e))  # the fields survive pickling
    return None


@pytest.mark.parametrize('operation,world_size', [('receive', 2),
                                                  ('all_reduce', 2),
                                                  ('all_reduce', 3)])
def test_peer_that_exits_at_once_is_reported_with_real_elapsed_time(
        operation, world_size):
    timeout = 30.0
    results = run_workers(_peer_exits_at_once, world_size, operation,
                          timeout_s=timeout, expect_errors=True)
    dead = world_size - 1
    for rank in range(world_size - 1):
        status, error = results[rank]
        assert status == 'ok', error
        assert isinstance(error, pyg_sar.PeerError), error
        message = str(error)
        assert error.rank == rank and error.timeout == timeout
        assert not error.timed_out, message
        assert error.elapsed < timeout / 6, message
        assert f'failed after {error.elapsed:.2f}s (timeout 30s)' in message
        assert '\n' not in message and 'GLHF' not in message
        if operation == 'receive':
            assert error.operation == 'receive' and error.peer == dead
            assert message.startswith(f'rank {rank}: receive from rank '
                                      f'{dead} failed'), message
        elif world_size == 2:
            assert error.operation == 'all_reduce(sum)'
            assert error.peer == dead
            assert message.startswith(
                f'rank {rank}: all_reduce(sum) with rank {dead} (the only '
                f'other rank) failed'), message
        else:
            assert message.startswith(
                f'rank {rank}: all_reduce(sum) across 3 ranks failed'), message
            if error.address is not None:  # gloo names the broken connection
                assert f'(the one at {error.address})' in message, message


def _peer_reports_then_exits(rank, world_size):
    if rank == 1:
        comm.report_failure("ValueError: Partition file 'p/part_1/graph.pt' "
                            "is corrupt")
        os._exit(2)
    try:
        comm.all_reduce(torch.ones(4))
    except pyg_sar.PeerError as e:
        return pickle.loads(pickle.dumps(e))
    return None


def test_collective_failure_names_the_rank_that_reported_first():
    """With more than two ranks gloo does not say which peer is gone; the
    rank that failed on its own left its reason in the store, and the
    others name it and quote it."""
    results = run_workers(_peer_reports_then_exits, 3, timeout_s=30,
                          expect_errors=True)
    for rank in (0, 2):
        status, error = results[rank]
        assert status == 'ok' and isinstance(error, pyg_sar.PeerError), error
        assert error.peer == 1 and not error.timed_out
        assert str(error).startswith(
            f'rank {rank}: all_reduce(sum) across 3 ranks failed after '), \
            str(error)
        assert str(error).endswith(
            '; rank 1 stopped first: "ValueError: Partition file '
            '\'p/part_1/graph.pt\' is corrupt"'), str(error)


def test_peer_error_message_from_transport_text(monkeypatch):
    from pyg_sar.comm.errors import peer_error
    monkeypatch.setattr(comm.process_group, 'get_rank', lambda: 2)
    monkeypatch.setattr(comm.process_group, 'get_world_size', lambda: 4)
    monkeypatch.setattr(comm.config(), 'timeout', timedelta(seconds=60))
    cause = RuntimeError(
        '[/src/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection '
        'closed by peer [10.0.0.7]:4242. This is typically caused by a '
        'remote worker crashing. Check the logs of the remote worker.')
    error = peer_error('barrier', None, cause, 0.013)
    assert str(error) == (
        'rank 2: barrier across 4 ranks failed after 0.01s (timeout 60s); '
        'a peer rank (the one at 10.0.0.7:4242) has probably died: '
        'Connection closed by peer [10.0.0.7]:4242')
    assert error.address == '10.0.0.7:4242' and error.peer is None

    named = peer_error(
        'all_reduce(sum)', None,
        RuntimeError('[Rank 2]: Rank 3 failed to pass monitoredBarrier'),
        0.5)
    assert named.peer == 3
    assert 'rank 3 has probably died' in str(named)

    hung = peer_error('send', 1, RuntimeError(
        '[/x/unbound_buffer.cc:129] Timed out waiting 60000ms for send '
        'operation to complete'), 60.004)
    assert hung.timed_out and hung.peer == 1
    assert str(hung) == (
        'rank 2: send to rank 1 timed out after 60.00s (timeout 60s); rank 1 '
        'has probably hung or died: Timed out waiting 60000ms for send '
        'operation to complete')


def test_non_finite_loss_stops_training_with_the_epoch(tmp_path):
    """NaN features (partitioned with the opt-out) make the loss NaN:
    ``pyg-sar train`` stops at epoch 1 with a non-zero exit."""
    import subprocess
    import sys
    data = pyg_sar.datasets.synthetic_graph(200, 5, 8, 3, seed=0)
    data.x[7, 2] = float('nan')
    parts = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, 1, parts, allow_non_finite=True)
    command = [sys.executable, '-m', 'pyg_sar.cli', 'train', '--parts', parts,
               '--epochs', '3', '--hidden', '8', '--layers', '2',
               '--no-progress']
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert 'epoch 1: the training loss is nan' in run.stderr
    run = subprocess.run(command + ['--allow-non-finite-loss'],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


def test_corrupt_part_file_stops_every_rank_within_seconds(tmp_path):
    """Rank 1's part file is truncated: under torchrun, rank 1 says so in one
    line naming the file, rank 0 stops too (its peer is gone), and the job
    exits long before the 300 s timeout, each error line first on its rank
    (no traceback unless PYG_SAR_TRACEBACK=1)."""
    import subprocess
    import sys
    import time
    data = pyg_sar.datasets.synthetic_graph(300, 5, 8, 3, seed=0)
    parts = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, 2, parts)
    path = osp.join(parts, 'part_1', 'graph.pt')
    with open(path, 'rb') as f:
        blob = f.read()
    with open(path, 'wb') as f:
        f.write(blob[:len(blob) // 2])
    command = [sys.executable, '-m', 'torch.distributed.run',
               '--nproc-per-node', '2', '--master-port',
               str(comm.find_free_port()), '-m', 'pyg_sar.cli', 'train',
               '--parts', parts, '--epochs', '2', '--hidden', '8',
               '--layers', '2', '--no-progress', '--timeout', '300']
    start = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True, timeout=200)
    elapsed = time.perf_counter() - start
    assert run.returncode != 0
    assert elapsed < 60, f'took {elapsed:.0f}s'
    ours = [line for line in run.stderr.splitlines()
            if line.startswith('pyg-sar train: error')]
    assert ours and ours[0].startswith(
        f"pyg-sar train: error (rank 1): Partition file '{path}' is corrupt"
    ), run.stderr
    # rank 0 either names its dead peer or was stopped by torchrun first.
    for line in ours[1:]:
        assert 'rank 1' in line, line
    # No worker traceback: the only one is torchrun's own, after our lines.
    lines = run.stderr.splitlines()
    tracebacks = [i for i, line in enumerate(lines) if 'Traceback' in line]
    assert len(tracebacks) <= 1, run.stderr
    if tracebacks:
        assert lines.index(ours[-1]) < tracebacks[0]
        assert 'torch/distributed' in lines[tracebacks[0] + 1] or \
            'runpy' in lines[tracebacks[0] + 1], run.stderr


FAILING_SCRIPT = '''
import pyg_sar, torch
from pyg_sar import comm
rank, world_size = pyg_sar.init_distributed()
if rank == 1:
    raise ValueError("rank 1 refuses: x has 3 columns, expected 4")
comm.all_reduce(torch.ones(1))
comm.barrier()
'''


def test_torchrun_names_the_rank_that_failed_first(tmp_path):
    """A user's script raises on rank 1 of 3 while ranks 0 and 2 wait in a
    collective: torchrun's "Root Cause" is rank 1 with its error (it named
    rank 0, the lowest of the tied ranks, before init_distributed recorded
    failures for the launcher), and the peers' errors quote rank 1's line."""
    import re
    import subprocess
    import sys
    script = tmp_path / 'fails.py'
    script.write_text(FAILING_SCRIPT)
    command = [sys.executable, '-m', 'torch.distributed.run',
               '--nproc-per-node', '3', '--master-port',
               str(comm.find_free_port()), str(script)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, OMP_NUM_THREADS='1'))
    assert run.returncode != 0
    root = run.stderr[run.stderr.index('Root Cause'):]
    assert re.search(r'rank\s*: 1 \(local_rank: 1\)', root), root
    assert 'ValueError: rank 1 refuses: x has 3 columns, expected 4' in root
    peers = [line for line in run.stderr.splitlines()
             if 'PeerError: rank ' in line and line.startswith('[rank')]
    assert peers, run.stderr
    for line in peers:
        assert 'rank 1 stopped first: "ValueError: rank 1 refuses' in line, \
            line


def test_a_peer_error_is_recorded_after_the_failure_it_observed(tmp_path):
    # The records torchrun compares: an error of the worker's own is
    # backdated below torchrun's one-second resolution; a PeerError is not.
    import json
    from pyg_sar.comm.errors import PeerError
    from pyg_sar.comm.errors import record_failure
    own = record_failure(ValueError('bad input'),
                         path=str(tmp_path / 'own.json'))
    seen = record_failure(PeerError('rank 0: rank 1 died'),
                          path=str(tmp_path / 'peer.json'))
    stamps = [int(json.load(open(p))['message']['extraInfo']['timestamp'])
              for p in (own, seen)]
    assert stamps[0] < stamps[1]
    # A file the user's own @record wrote is left as it is.
    assert record_failure(ValueError('again'), path=own) is None
