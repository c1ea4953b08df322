"""Restartable runs on a graph directory: a run killed after any phase (or
in the middle of writing the shards) leaves no output, and the same call
resumes it to the files of an uninterrupted run; a forged intermediate file
or state is detected and the phase redone; other arguments, resume=False,
a foreign file in the work directory, a second run at once; the disk check
(with a faked disk_usage) and its estimate against what a run wrote; two
parallel writers resume a run of one."""
import json
import os
import os.path as osp
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from pyg_sar.partition import partition_graph
from pyg_sar.partition import workdir as workdir_mod
from pyg_sar.partition.input.ondisk import GraphOnDisk, save_graph
from pyg_sar.partition.workdir import WorkDir, work_dir_for
from pyg_sar.partition.write import resume as resume_mod
from _graphs import hard_graph

kaminpar = pytest.importorskip('kaminpar')
ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
ARGS = dict(num_parts=3, method='kaminpar', seed=4)


class Died(BaseException):
    pass


@pytest.fixture(scope='module')
def graph(tmp_path_factory):
    data = hard_graph(400, seed=2)
    data.train_mask = torch.rand(data.num_nodes, generator=torch.Generator()
                                 .manual_seed(1)) < 0.3
    return save_graph(data, tmp_path_factory.mktemp('g') / 'graph')


@pytest.fixture(scope='module')
def reference(graph, tmp_path_factory):
    out = tmp_path_factory.mktemp('ref') / 'out'
    manifest = partition_graph(graph, out_dir=str(out), **ARGS)
    assert manifest['resumed'] == []
    assert set(manifest['disk_bytes']) == {'symmetrize', 'kaminpar',
                                           'assign', 'write'}
    assert not osp.exists(work_dir_for(str(out)))
    return manifest


def _same_output(manifest, reference):
    assert manifest['files'] == reference['files']
    assert manifest['node_ptr'] == reference['node_ptr']
    assert manifest['edge_cut'] == reference['edge_cut']


_KILL = r'''
import os, signal, sys
sys.path[:0] = [{root!r}, {tests!r}]
from pyg_sar.partition import partition_graph, workdir
from pyg_sar.partition.write import homogeneous
point = {point!r}
def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
if point == 'write':  # killed while writing the shards
    homogeneous._save_skeleton = die
else:
    workdir.after_phase = lambda name: die() if name == point else None
partition_graph({graph!r}, out_dir={out!r}, **{args!r})
'''


@pytest.mark.parametrize('point,resumed', [
    ('symmetrize', ['check', 'symmetrize']),
    ('kaminpar', ['check', 'symmetrize', 'kaminpar']),
    ('write', ['check', 'assign']),
])
def test_killed_run_resumes(graph, reference, tmp_path, point, resumed):
    out = str(tmp_path / 'out')
    script = _KILL.format(root=ROOT, tests=osp.join(ROOT, 'tests'),
                          point=point, graph=str(graph), out=out, args=ARGS)
    done = subprocess.run([sys.executable, '-c', script],
                          capture_output=True, timeout=600)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    assert sorted(os.listdir(tmp_path)) == ['.out.work']  # no output
    work = work_dir_for(out)
    state = json.load(open(osp.join(work, 'state.json')))
    assert set(resumed) <= set(state['phases'])
    if point == 'write':  # a half-written output folder is left inside
        assert any(n.startswith('.out.tmp-') for n in os.listdir(work))
    manifest = partition_graph(graph, out_dir=out, **ARGS)
    assert manifest['resumed'] == resumed
    _same_output(manifest, reference)
    assert sorted(os.listdir(tmp_path)) == ['out']  # work dir removed


def _die_after(monkeypatch, point):
    def hook(name):
        if name == point:
            raise Died(name)
    monkeypatch.setattr(workdir_mod, 'after_phase', hook)


@pytest.mark.parametrize('forged', ['graph.parhip', 'kaminpar.part'])
def test_forged_file_is_redone(graph, reference, tmp_path, monkeypatch,
                               forged):
    out = str(tmp_path / 'out')
    _die_after(monkeypatch, 'kaminpar')
    with pytest.raises(Died):
        partition_graph(graph, out_dir=out, **ARGS)
    monkeypatch.undo()
    path = osp.join(work_dir_for(out), forged)
    raw = bytearray(open(path, 'rb').read())
    if forged == 'kaminpar.part':  # another valid assignment
        part = np.frombuffer(bytes(raw), dtype=np.int32).copy()
        part[:10] = (part[:10] + 1) % ARGS['num_parts']
        raw = bytearray(part.tobytes())
    else:
        raw[-5] ^= 1
    open(path, 'wb').write(bytes(raw))
    with pytest.warns(UserWarning, match=f"'{path}' differs from the one "
                      f"recorded"):
        manifest = partition_graph(graph, out_dir=out, **ARGS)
    # A redone phase whose file comes out as recorded keeps the phases
    # computed from it (KaMinPar's parts survive a forged ParHIP file).
    assert manifest['resumed'] == (['check', 'kaminpar'] if forged ==
                                   'graph.parhip' else
                                   ['check', 'symmetrize'])
    _same_output(manifest, reference)


def test_forged_state_starts_over(graph, reference, tmp_path, monkeypatch):
    out = str(tmp_path / 'out')
    _die_after(monkeypatch, 'symmetrize')
    with pytest.raises(Died):
        partition_graph(graph, out_dir=out, **ARGS)
    monkeypatch.undo()
    state_path = osp.join(work_dir_for(out), 'state.json')
    state = json.load(open(state_path))
    # A file name from the state is never used as a path.
    state['phases']['symmetrize']['files'] = {'../../x': {}}
    json.dump(state, open(state_path, 'w'))
    with pytest.warns(UserWarning, match='unreadable'):
        manifest = partition_graph(graph, out_dir=out, **ARGS)
    assert manifest['resumed'] == []
    _same_output(manifest, reference)


def test_other_arguments_or_no_resume_start_over(graph, tmp_path,
                                                 monkeypatch):
    out = str(tmp_path / 'out')
    _die_after(monkeypatch, 'kaminpar')
    with pytest.raises(Died):
        partition_graph(graph, out_dir=out, **ARGS)
    with pytest.raises(Died):  # resume=False: every phase done again
        partition_graph(graph, out_dir=out, resume=False, **ARGS)
    monkeypatch.undo()
    with pytest.warns(UserWarning, match='other arguments'):
        manifest = partition_graph(graph, out_dir=out,
                                   **dict(ARGS, seed=5))
    assert manifest['resumed'] == [] and manifest['seed'] == 5


def test_foreign_or_busy_work_dir_is_refused(graph, tmp_path):
    out = str(tmp_path / 'out')
    work = work_dir_for(out)
    os.makedirs(work)
    open(osp.join(work, 'notes.txt'), 'w').write('mine')
    with pytest.raises(FileExistsError, match="holds 'notes.txt'"):
        partition_graph(graph, out_dir=out, **ARGS)
    os.remove(osp.join(work, 'notes.txt'))
    with WorkDir(work, {'other': 1}):
        with pytest.raises(RuntimeError, match='in use by another'):
            partition_graph(graph, out_dir=out, **ARGS)
    assert not osp.exists(out)


def test_disk_check(graph, reference, tmp_path, monkeypatch):
    out = str(tmp_path / 'out')
    source = GraphOnDisk(graph).source()
    need = resume_mod.disk_needed(source, 3, 'kaminpar')
    # The estimate holds what the reference run wrote in every phase.
    for phase, used in reference['disk_bytes'].items():
        assert used <= need[phase], phase
    # ... and not wildly more (the per-file allowance aside).
    assert need['write'] <= 2 * reference['disk_bytes']['write'] + \
        resume_mod.SHARD_BYTES_PER_FILE * (4 * 3 + 4)

    usage = resume_mod.shutil.disk_usage(str(tmp_path))
    monkeypatch.setattr(resume_mod.shutil, 'disk_usage',
                        lambda path: usage._replace(free=need['peak'] - 1))
    with pytest.raises(OSError) as info:
        partition_graph(graph, out_dir=out, **ARGS)
    message = str(info.value)
    assert '\n' not in message
    assert f"'{tmp_path}'" in message and f"{need['peak']:,} bytes" in \
        message and f"{need['peak'] - 1:,} are free" in message
    assert os.listdir(tmp_path) == []  # checked before anything is written


def _writer(rank, world_size, graph_dir, out_dir):
    from pyg_sar.comm import ProcessGroupExchange
    from pyg_sar.partition import partition_graph_parallel
    manifest = partition_graph_parallel(graph_dir, out_dir=out_dir,
                                        exchange=ProcessGroupExchange(),
                                        **ARGS)
    return None if manifest is None else manifest['resumed']


def test_parallel_writers_resume(graph, reference, tmp_path, monkeypatch):
    from _dist import run_workers
    out = str(tmp_path / 'out')
    _die_after(monkeypatch, 'kaminpar')
    with pytest.raises(Died):
        partition_graph(graph, out_dir=out, **ARGS)
    monkeypatch.undo()
    results = run_workers(_writer, 2, str(graph), out, timeout_s=120)
    assert results == [['check', 'symmetrize', 'kaminpar'], None]
    with open(osp.join(out, 'pyg_sar.json')) as f:
        _same_output(json.load(f), reference)
    assert sorted(os.listdir(tmp_path)) == ['out']
