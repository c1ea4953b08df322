"""Multi-node ``pyg-sar train``: two "hosts" (Linux network namespaces
joined by a veth pair, no shared loopback) run one torchrun agent each with
the c10d rendezvous, and the trained weights equal, bitwise, those of the
same job on one host.

Each host gets its own copy of only what a rank reads (the top-level
``META.json``, ``pyg_sar.json``, ``node_map.pt``, ``perm.pt`` and its own
``part_<rank>``), which checks the minimum the README states. Needs root
(CAP_NET_ADMIN) and iproute2's ``ip``; skipped otherwise.
"""
import os
import os.path as osp
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

import pyg_sar
from pyg_sar import datasets
from pyg_sar.comm import find_free_port

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow

PID = os.getpid()
NS = (f'pgsar{PID}a', f'pgsar{PID}b')     # network namespaces
IFACE = (f'pgs{PID}a', f'pgs{PID}b')       # veth ends (<= 15 characters)
ADDR = ('10.77.0.1', '10.77.0.2')
RDZV_PORT = 29400  # inside fresh namespaces: nothing else listens there
TOP_LEVEL_FILES = ('META.json', 'pyg_sar.json', 'node_map.pt', 'perm.pt')
TRAIN_ARGS = ['--epochs', '5', '--hidden', '8', '--layers', '2', '--seed',
              '0', '--no-progress', '--timeout', '20']
TIMEOUT_S = 35  # per launch (two launches); the test takes ~20 s on 2 cores


def _ip_binary():
    for candidate in (shutil.which('ip'), '/usr/sbin/ip', '/sbin/ip',
                      '/usr/bin/ip', '/bin/ip'):
        if candidate and osp.exists(candidate):
            return candidate
    return None


def _ip(ip, *args, check=True):
    result = subprocess.run([ip, *args], capture_output=True, text=True,
                            timeout=15)
    if check and result.returncode != 0:
        raise RuntimeError(f"'ip {' '.join(args)}' failed "
                           f"({result.returncode}): {result.stderr.strip()}")
    return result


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair; always removed."""
    if not sys.platform.startswith('linux'):
        pytest.skip('network namespaces need Linux')
    if os.geteuid() != 0:
        pytest.skip('creating network namespaces needs root')
    ip = _ip_binary()
    if ip is None:
        pytest.skip("iproute2's 'ip' command is not installed")
    created = []
    try:
        for ns in NS:
            result = _ip(ip, 'netns', 'add', ns, check=False)
            if result.returncode != 0:
                pytest.skip(f"cannot create a network namespace (no "
                            f"CAP_NET_ADMIN?): 'ip netns add' said: "
                            f"{result.stderr.strip()}")
            created.append(ns)
        # Both ends are created inside the namespaces: nothing is left in
        # the host's namespace even if a later step fails.
        result = _ip(ip, 'link', 'add', IFACE[0], 'netns', NS[0], 'type',
                     'veth', 'peer', 'name', IFACE[1], 'netns', NS[1],
                     check=False)
        if result.returncode != 0:
            pytest.skip(f"cannot create a veth pair: "
                        f"{result.stderr.strip()}")
        for ns, iface, addr in zip(NS, IFACE, ADDR):
            _ip(ip, '-n', ns, 'link', 'set', 'lo', 'up')
            _ip(ip, '-n', ns, 'addr', 'add', f'{addr}/24', 'dev', iface)
            _ip(ip, '-n', ns, 'link', 'set', iface, 'up')
        yield ip
    finally:
        for ns in created:  # deleting a namespace deletes its veth end
            _ip(ip, 'netns', 'del', ns, check=False)


def _launch(command, env):
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _finish(procs, deadline):
    """Waits for every process until ``deadline``; kills the process groups
    of those still running. Returns ``[(returncode, output)]``."""
    results = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(deadline - time.monotonic(),
                                                  0.1))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, _ = proc.communicate()
            out += f'\n[killed after the {TIMEOUT_S} s timeout]'
        results.append((proc.returncode, out))
    return results


def _report(results, names):
    def tail(out):  # C++ stack frames say little and hide the error
        lines = [line for line in out.splitlines()
                 if not line.lstrip().startswith(('frame #', '<omitting'))]
        return '\n'.join(lines)[-6000:]
    return '\n'.join(f'===== {name} (exit {code}) =====\n{tail(out)}'
                     for name, (code, out) in zip(names, results))


def _host_copy(parts, dest, rank):
    """What one host needs for ``rank``: top-level files + ``part_<rank>``."""
    os.makedirs(dest)
    for name in TOP_LEVEL_FILES:
        shutil.copy2(osp.join(parts, name), dest)
    shutil.copytree(osp.join(parts, f'part_{rank}'),
                    osp.join(dest, f'part_{rank}'))


def _clean_env():
    """The environment without a launcher's variables (torchrun sets its
    own), one thread per worker."""
    env = dict(os.environ, OMP_NUM_THREADS='1')
    for key in ('MASTER_ADDR', 'MASTER_PORT', 'RANK', 'WORLD_SIZE',
                'LOCAL_RANK', 'GLOO_SOCKET_IFNAME'):
        env.pop(key, None)
    return env


def _host_command(ip, r, name, train_args):
    """``pyg-sar train`` under torchrun in namespace ``r``, one worker, the
    c10d rendezvous on host 0. c10d ignores --node-rank and ranks the
    agents by their --local-addr, so 10.77.0.1 gets rank 0; --local-addr is
    also MASTER_ADDR (the hostname here resolves to 127.0.0.1); is_host:
    the endpoint is not the hostname's address, so the store's host must be
    named."""
    return [
        ip, 'netns', 'exec', NS[r], sys.executable, '-m',
        'torch.distributed.run', '--nnodes', '2', '--node-rank', str(r),
        '--nproc-per-node', '1', '--rdzv-backend', 'c10d',
        '--rdzv-endpoint', f'{ADDR[0]}:{RDZV_PORT}',
        '--rdzv-id', f'pyg-sar-{name}-{PID}',
        '--rdzv-conf', f'join_timeout=30,is_host={int(r == 0)}',
        '--local-addr', ADDR[r], '-m', 'pyg_sar.cli', 'train', *train_args
    ]


def test_two_hosts_equal_one_host_bitwise(two_hosts, tmp_path):
    ip = two_hosts
    parts = str(tmp_path / 'parts')
    pyg_sar.partition_graph(datasets.synthetic_graph(300, 5, 8, 3, seed=0),
                            2, parts)
    env = _clean_env()

    # Two hosts, one worker each (see _host_command).
    procs, outs = [], []
    for r in range(2):
        host_parts = str(tmp_path / f'host{r}' / 'parts')
        _host_copy(parts, host_parts, r)
        outs.append(str(tmp_path / f'OUT_{r}.pt'))
        command = _host_command(ip, r, 'test', [
            '--parts', host_parts, *TRAIN_ARGS, '--save-model', outs[r]])
        procs.append(_launch(command,
                             dict(env, GLOO_SOCKET_IFNAME=IFACE[r])))
    multi = _finish(procs, time.monotonic() + TIMEOUT_S)
    names = [f'host {r} ({NS[r]}, {ADDR[r]})' for r in range(2)]
    assert all(code == 0 for code, _ in multi), _report(multi, names)
    # Rank 0 alone writes --save-model, and rank 0 ran on host 0.
    assert [osp.exists(out) for out in outs] == [True, False], \
        _report(multi, names)

    single_out = str(tmp_path / 'SINGLE.pt')
    command = [
        sys.executable, '-m', 'torch.distributed.run', '--nnodes', '1',
        '--nproc-per-node', '2', '--master-addr', '127.0.0.1',
        '--master-port', str(find_free_port()), '-m', 'pyg_sar.cli',
        'train', '--parts', parts, *TRAIN_ARGS, '--save-model', single_out
    ]
    single = _finish([_launch(command, env)], time.monotonic() + TIMEOUT_S)
    assert single[0][0] == 0, _report(single, ['one host, 2 workers'])

    a = torch.load(outs[0], weights_only=True)
    b = torch.load(single_out, weights_only=True)
    assert a.keys() == b.keys()
    # Same reductions in the same order: two ranks' SUM is order-free.
    differ = {k: float((a[k] - b[k]).abs().max()) for k in a
              if not torch.equal(a[k], b[k])}
    assert not differ, f'weights differ (max abs difference): {differ}'
    # Both printed the same final metrics.
    final = [next(line for line in out.splitlines()
                  if line.startswith('final:'))
             for _, out in (multi[0], single[0])]
    assert final[0] == final[1]


def test_two_hosts_stop_fast_when_a_part_is_corrupt(two_hosts, tmp_path):
    """Host 1's part file is truncated: both agents exit with an error long
    before the 300 s wait timeout, and the error names the file and rank."""
    ip = two_hosts
    parts = str(tmp_path / 'parts')
    pyg_sar.partition_graph(datasets.synthetic_graph(300, 5, 8, 3, seed=0),
                            2, parts)
    env = _clean_env()
    procs = []
    args = [a if a != '20' else '300' for a in TRAIN_ARGS]
    for r in range(2):
        host_parts = str(tmp_path / f'host{r}' / 'parts')
        _host_copy(parts, host_parts, r)
        if r == 1:
            path = osp.join(host_parts, 'part_1', 'graph.pt')
            with open(path, 'rb') as f:
                blob = f.read()
            with open(path, 'wb') as f:
                f.write(blob[:len(blob) // 2])
        command = _host_command(ip, r, 'fail',
                                ['--parts', host_parts, *args])
        procs.append(_launch(command,
                             dict(env, GLOO_SOCKET_IFNAME=IFACE[r])))
    start = time.monotonic()
    results = _finish(procs, start + TIMEOUT_S)
    elapsed = time.monotonic() - start
    names = [f'host {r} ({NS[r]}, {ADDR[r]})' for r in range(2)]
    assert all(code != 0 for code, _ in results), _report(results, names)
    assert not any('[killed after' in out for _, out in results), \
        _report(results, names)
    assert "error (rank 1): Partition file" in results[1][1], \
        _report(results, names)
    print(f'\nboth hosts stopped {elapsed:.1f}s after launch')
