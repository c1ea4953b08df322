"""Nothing on disk is trusted, nothing is lost.

Checkpoints record the hash of every file and are verified before anything
is loaded; DCP's ``.metadata`` is read with an allowlist, so a crafted one
runs no code; a corrupt checkpoint is reported and the run resumes from the
newest intact one, all ranks agreeing; ``--keep-last`` keeps the newest K;
every output path (and ``--parts``) is checked before training starts.

Code-execution attempts use a pickle that would create a marker file; each
test asserts that the marker does not exist.
"""
import enum
import io
import json
import os
import os.path as osp
import pickle
import re
import shutil
import subprocess
import sys
import time

import pytest
import torch

import pyg_sar
from pyg_sar import checkpoint, datasets
from pyg_sar.comm import find_free_port
from pyg_sar.train import checkpoint_format, checkpoint_io

# Many multi-process runs: deselect with -m "not slow".
pytestmark = pytest.mark.slow


# Helpers #####################################################################

class _Payload:
    """Unpickling this creates the file ``marker`` (``open(marker, 'w')``):
    proof that a pickle ran code of its author's choosing."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, 'w'))


def _payload(marker) -> bytes:
    return pickle.dumps(_Payload(marker))


def _outcome(call):
    """What ``call()`` raised (None if nothing), DCP's ``BaseException``
    included, so that the marker is checked first."""
    try:
        call()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: B036 (DCP's CheckpointException)
        return e
    return None


def _model(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(6, 4)
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def _step(model, optimizer):
    optimizer.zero_grad()
    model(torch.randn(5, 6)).square().sum().backward()
    optimizer.step()


def _save_epochs(directory, epochs, **kwargs):
    """Checkpoints of epochs 1..epochs of one model; returns the model
    state after each epoch."""
    model, optimizer = _model()
    states = {}
    for epoch in range(1, epochs + 1):
        _step(model, optimizer)
        checkpoint.save(directory, epoch, model, optimizer, **kwargs)
        states[epoch] = {k: v.clone() for k, v in model.state_dict().items()}
    return states


def _data_files(path):
    return sorted(n for n in os.listdir(path) if n.endswith('.distcp'))


def _one_line_errors(err):
    return [line for line in err.splitlines()
            if line.startswith('pyg-sar train: error')]


@pytest.fixture(scope='module')
def one_part(tmp_path_factory):
    root = tmp_path_factory.mktemp('one_part')
    data = datasets.synthetic_graph(200, 6, 8, 3, seed=1)
    parts = str(root / 'parts')
    pyg_sar.partition_graph(data, 1, parts)
    return parts


def _cli(parts, *extra):
    from pyg_sar import cli
    return cli.main(['train', '--parts', parts, '--layers', '2', '--hidden',
                     '8', '--no-progress', *extra])


# 1. Integrity: every file is hashed, verified before loading #################

def test_flipped_bit_in_a_shard_is_caught_and_resume_falls_back(tmp_path,
                                                                capsys):
    directory = str(tmp_path / 'ckpt')
    states = _save_epochs(directory, 2)
    # Bit rot: the lowest mantissa bit of one weight of epoch 2 flips.
    shard = osp.join(directory, 'epoch-2', _data_files(
        osp.join(directory, 'epoch-2'))[0])
    data = bytearray(open(shard, 'rb').read())
    weight = states[2]['weight'].numpy().tobytes()
    assert data.count(weight) == 1
    data[data.index(weight)] ^= 1
    with open(shard, 'wb') as f:
        f.write(data)

    model, optimizer = _model(seed=5)
    info = checkpoint.resume(directory, model, optimizer)
    assert info['epoch'] == 1 and info['path'].endswith('epoch-1')
    for key, value in states[1].items():
        assert torch.equal(model.state_dict()[key], value), key
    err = capsys.readouterr().err
    assert err.count('\n') == 1, err
    assert re.search(r"checkpoint '.*epoch-2' is corrupt \('__0_0\.distcp' "
                     r"does not match the sha256 hash meta\.json records\); "
                     r"moved it to '.*epoch-2\.corrupt'; resuming from "
                     r"'.*epoch-1'", err), err
    # Set aside, out of the way of the next save of epoch 2.
    assert [e for e, _ in checkpoint.checkpoints(directory)] == [1]
    assert osp.isdir(osp.join(directory, 'epoch-2.corrupt'))
    with pytest.raises(checkpoint.CorruptCheckpointError, match='sha256'):
        checkpoint.load(osp.join(directory, 'epoch-2.corrupt'), model,
                        optimizer)


def test_damaged_manifest_or_rank_file_is_corrupt(tmp_path):
    directory = str(tmp_path / 'ckpt')
    _save_epochs(directory, 1)
    path = osp.join(directory, 'epoch-1')
    model, optimizer = _model()
    meta_file = osp.join(path, 'meta.json')
    meta = open(meta_file).read()
    # One digit of the recorded epoch changes: the checksum tells.
    with open(meta_file, 'w') as f:
        f.write(meta.replace('"epoch": 1', '"epoch": 7'))
    with pytest.raises(checkpoint.CorruptCheckpointError,
                       match='meta.json does not match its checksum'):
        checkpoint.load(path, model, optimizer)
    with open(meta_file, 'w') as f:
        f.write(meta)
    rank_file = osp.join(path, 'rank-0.pt')
    os.truncate(rank_file, 100)
    with pytest.raises(checkpoint.CorruptCheckpointError,
                       match=r"'rank-0\.pt' has 100 bytes"):
        checkpoint.load(path, model, optimizer)
    os.remove(rank_file)
    with pytest.raises(checkpoint.CorruptCheckpointError,
                       match=r"'rank-0\.pt' is missing"):
        checkpoint.load(path, model, optimizer)


# 2. No unpickling of what was not just written ###############################

def test_crafted_metadata_runs_no_code_on_resume(tmp_path, capsys):
    directory = str(tmp_path / 'ckpt')
    marker = tmp_path / 'pwned'
    _save_epochs(directory, 1)
    with open(osp.join(directory, 'epoch-1', '.metadata'), 'wb') as f:
        f.write(_payload(marker))
    model, optimizer = _model()
    resumed = []
    error = _outcome(lambda: resumed.append(
        checkpoint.resume(directory, model, optimizer)))
    assert not marker.exists(), 'unpickling .metadata ran code'
    assert error is None and resumed == [None]  # the only one was corrupt
    assert 'no intact checkpoint is left' in capsys.readouterr().err


def test_crafted_metadata_with_a_valid_hash_is_still_refused(tmp_path):
    """An attacker who also rewrites meta.json (hashes and checksum) gets
    past the integrity check but not the allowlist of the reader."""
    from pyg_sar.train.files import HASH_ALGORITHM, file_digest
    directory = str(tmp_path / 'ckpt')
    marker = tmp_path / 'pwned'
    _save_epochs(directory, 2)
    path = osp.join(directory, 'epoch-2')
    with open(osp.join(path, '.metadata'), 'wb') as f:
        f.write(_payload(marker))
    meta_file = osp.join(path, 'meta.json')
    meta = json.load(open(meta_file))
    del meta['checksum']
    size, digest = file_digest(osp.join(path, '.metadata'))
    meta['files']['.metadata'] = {'bytes': size, HASH_ALGORITHM: digest}
    with open(meta_file, 'w') as f:
        f.write(checkpoint_format.seal(meta))
    model, optimizer = _model()
    info = checkpoint.resume(directory, model, optimizer)
    assert not marker.exists(), 'unpickling .metadata ran code'
    assert info['epoch'] == 1
    with pytest.raises(checkpoint.CorruptCheckpointError,
                       match=r"\('\.metadata' is refused: it names "
                       r"'io\.open', which is not part of the checkpoint "
                       r"format\)"):
        checkpoint.load(osp.join(directory, 'epoch-2.corrupt'), model)


def test_reader_refuses_crafted_metadata(tmp_path):
    """The checkpoints' DCP reader: ``.metadata`` naming anything but the
    format's classes is refused before it is constructed."""
    marker = tmp_path / 'pwned'
    folder = tmp_path / 'ckpt'
    folder.mkdir()
    (folder / '.metadata').write_bytes(_payload(marker))
    error = _outcome(lambda: checkpoint_io.replicated_specs(str(folder)))
    assert not marker.exists(), 'replicated_specs ran code'
    assert isinstance(error, ValueError) and \
        "it names 'io.open'" in str(error), error
    error = _outcome(lambda: checkpoint_io.load_replicated(
        {'w': torch.zeros(2)}, str(folder)))
    assert not marker.exists(), 'load_replicated ran code'
    assert isinstance(error, ValueError) and \
        "it names 'io.open'" in str(error), error
    # Truncated: refused in one line, not a traceback of pickle's.
    (folder / '.metadata').write_bytes(_payload(marker)[:10])
    with pytest.raises(ValueError, match='refusing checkpoint metadata'):
        checkpoint_io.replicated_specs(str(folder))


def test_reader_refuses_values_stored_as_pickles(tmp_path):
    """Metadata made only of DCP's own classes may still declare a value as
    bytes, which DCP reads with ``torch.load(weights_only=False)``: such
    metadata is refused too."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata,
                                                       Metadata,
                                                       MetadataIndex)
    marker = tmp_path / 'pwned'
    folder = tmp_path / 'ckpt'
    folder.mkdir()
    payload = _payload(marker)
    (folder / '__0_0.distcp').write_bytes(payload)
    metadata = Metadata(
        state_dict_metadata={'w': BytesStorageMetadata()},
        storage_data={MetadataIndex('w'): _StorageInfo(
            relative_path='__0_0.distcp', offset=0, length=len(payload))})
    (folder / '.metadata').write_bytes(pickle.dumps(metadata))
    error = _outcome(lambda: checkpoint_io.load_replicated(
        {'w': torch.zeros(2)}, str(folder)))
    assert not marker.exists(), 'load_replicated unpickled a stored value'
    assert isinstance(error, ValueError) and "it names 'torch.distributed." \
        "checkpoint.metadata.BytesStorageMetadata'" in str(error), error


# 4. --keep-last ##############################################################

def test_keep_last_keeps_the_newest(tmp_path, one_part, capsys):
    ckpt = str(tmp_path / 'ckpt')
    assert _cli(one_part, '--epochs', '4', '--checkpoint-dir', ckpt,
                '--keep-last', '2') == 0
    assert [e for e, _ in checkpoint.checkpoints(ckpt)] == [3, 4]
    assert _cli(one_part, '--epochs', '5', '--checkpoint-dir', ckpt,
                '--keep-last', '1') == 0
    assert 'resuming from epoch 4' in capsys.readouterr().out
    assert os.listdir(ckpt) == ['epoch-5']
    for extra, message in [
            (['--checkpoint-dir', ckpt, '--keep-last', '0'],
             '--keep-last must be >= 1 (got 0)'),
            (['--keep-last', '2'], '--keep-last 2 needs --checkpoint-dir')]:
        assert _cli(one_part, '--epochs', '6', *extra) == 2
        err = capsys.readouterr().err
        assert message in err and err.count('\n') == 1, err
    assert os.listdir(ckpt) == ['epoch-5']


def test_keep_last_never_deletes_the_new_checkpoint(tmp_path):
    directory = str(tmp_path / 'ckpt')
    _save_epochs(directory, 3)
    model, optimizer = _model()
    with pytest.raises(ValueError, match='keep_last must be an integer >= 1'):
        checkpoint.save(directory, 4, model, optimizer, keep_last=0)
    assert [e for e, _ in checkpoint.checkpoints(directory)] == [1, 2, 3]
    # Epoch 2 written again next to a newer epoch 3: both stay.
    shutil.rmtree(osp.join(directory, 'epoch-2'))
    os.makedirs(osp.join(directory, '.epoch-1.old'))  # a crashed prune
    checkpoint.save(directory, 2, model, optimizer, keep_last=1)
    assert sorted(os.listdir(directory)) == ['epoch-2', 'epoch-3']


# 3. Corrupt checkpoints under torchrun: one line, every rank agrees ##########

EPOCHS = 4


def _train_command(parts, ckpt, weights, *extra):
    return [sys.executable, '-m', 'torch.distributed.run', '--nnodes', '1',
            '--nproc-per-node', '2', '--master-addr', '127.0.0.1',
            '--master-port', str(find_free_port()), '-m', 'pyg_sar.cli',
            'train', '--parts', parts, '--model', 'sage', '--layers', '2',
            '--hidden', '16', '--epochs', str(EPOCHS), '--dropout', '0.5',
            '--no-progress', '--timeout', '60', '--checkpoint-dir', ckpt,
            '--save-model', weights, *extra]


def _run(command, timeout=180):
    return subprocess.run(command, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
    """Two workers, a checkpoint every epoch, the final weights."""
    root = tmp_path_factory.mktemp('uninterrupted')
    data = datasets.synthetic_graph(300, 6, 8, 3, seed=1)
    parts = str(root / 'parts')
    pyg_sar.partition_graph(data, 2, parts)
    ckpt, weights = str(root / 'ckpt'), str(root / 'B.pt')
    start = time.perf_counter()
    result = _run(_train_command(parts, ckpt, weights))
    assert result.returncode == 0, result.stdout + result.stderr
    print(f'\nuninterrupted run: {time.perf_counter() - start:.1f}s')
    return parts, ckpt, torch.load(weights, weights_only=True)


def _resume_damaged(tmp_path, uninterrupted, damage):
    """Copies the uninterrupted run's checkpoints, ``damage(ckpt)``s them,
    and trains to the end from them; returns the run and its weights."""
    parts, ckpt_b, _ = uninterrupted
    ckpt = str(tmp_path / 'ckpt')
    shutil.copytree(ckpt_b, ckpt)
    damage(ckpt)
    weights = str(tmp_path / 'A.pt')
    result = _run(_train_command(parts, ckpt, weights))
    return ckpt, result, weights


def _assert_same_weights(weights, expected):
    got = torch.load(weights, weights_only=True)
    assert got.keys() == expected.keys()
    for key in got:
        assert torch.equal(got[key], expected[key]), key


def test_cli_copied_shard_falls_back_to_the_intact_checkpoint(
        tmp_path, uninterrupted):
    def damage(ckpt):
        # Interrupted after epoch 2; epoch 2's shards replaced by epoch 1's.
        for epoch in (3, 4):
            shutil.rmtree(osp.join(ckpt, f'epoch-{epoch}'))
        one, two = osp.join(ckpt, 'epoch-1'), osp.join(ckpt, 'epoch-2')
        assert _data_files(one) == _data_files(two) != []
        for name in _data_files(one):
            shutil.copy(osp.join(one, name), osp.join(two, name))

    ckpt, result, weights = _resume_damaged(tmp_path, uninterrupted, damage)
    assert result.returncode == 0, result.stdout + result.stderr
    _assert_same_weights(weights, uninterrupted[2])
    assert re.search(r"checkpoint '.*epoch-2' is corrupt \('__\d_0\.distcp' "
                     r"does not match .*\); moved it to '.*epoch-2\.corrupt'"
                     r"; resuming from '.*epoch-1'", result.stderr), \
        result.stderr
    assert 'resuming from epoch 1' in result.stdout
    assert [e for e, _ in checkpoint.checkpoints(ckpt)] == [1, 2, 3, 4]


def test_cli_truncated_newest_and_one_ranks_damage_fall_back(
        tmp_path, uninterrupted):
    def damage(ckpt):
        # The newest checkpoint truncated (a crash of the file system, a
        # full disk), and the next one damaged in a file only rank 1 reads.
        metadata = osp.join(ckpt, 'epoch-4', '.metadata')
        os.truncate(metadata, os.path.getsize(metadata) // 2)
        rank_file = osp.join(ckpt, 'epoch-3', 'rank-1.pt')
        os.truncate(rank_file, os.path.getsize(rank_file) - 1)

    ckpt, result, weights = _resume_damaged(tmp_path, uninterrupted, damage)
    assert result.returncode == 0, result.stdout + result.stderr
    warnings = [line for line in result.stderr.splitlines()
                if 'is corrupt' in line]
    assert len(warnings) == 2, result.stderr
    assert re.search(r"'.*epoch-4' is corrupt \('\.metadata' has \d+ bytes"
                     r".*; resuming from '.*epoch-2'$", warnings[0])
    assert re.search(r"'.*epoch-3' is corrupt \('rank-1\.pt' has \d+ bytes"
                     r".*; resuming from '.*epoch-2'$", warnings[1])
    assert 'Traceback' not in result.stderr
    assert 'resuming from epoch 2' in result.stdout
    _assert_same_weights(weights, uninterrupted[2])
    assert sorted(os.listdir(ckpt)) == [
        'epoch-1', 'epoch-2', 'epoch-3', 'epoch-3.corrupt', 'epoch-4',
        'epoch-4.corrupt']


def test_cli_crafted_metadata_runs_no_code(tmp_path, uninterrupted):
    marker = tmp_path / 'pwned'

    def damage(ckpt):
        shutil.rmtree(osp.join(ckpt, 'epoch-4'))
        with open(osp.join(ckpt, 'epoch-3', '.metadata'), 'wb') as f:
            f.write(_payload(marker))

    ckpt, result, weights = _resume_damaged(tmp_path, uninterrupted, damage)
    assert not marker.exists(), 'a worker unpickled the crafted .metadata'
    assert result.returncode == 0, result.stdout + result.stderr
    assert 'resuming from epoch 2' in result.stdout
    _assert_same_weights(weights, uninterrupted[2])


# 5. Output paths are checked before training ################################

@pytest.mark.parametrize('option,path,message', [
    ('--history', 'missing/h.json', r"--history '.*missing/h\.json': "
     r"directory '.*missing' does not exist"),
    ('--history', 'folder', r"--history '.*folder' is a directory"),
    ('--checkpoint-dir', 'file/ckpt', r"checkpoint_dir '.*file/ckpt' is "
     r"inside '.*file', which is a file"),
    ('--log-dir', 'file/log', r"log_dir '.*file/log' is inside '.*file', "
     r"which is a file; expected a directory"),
    ('--save-model', 'folder', r"save_model '.*folder' is a directory"),
])
def test_unwritable_output_is_refused_before_training(
        tmp_path, one_part, capsys, option, path, message):
    (tmp_path / 'file').write_text('not a directory')
    (tmp_path / 'folder').mkdir()
    assert _cli(one_part, '--epochs', '2', option,
                str(tmp_path / path)) == 2
    captured = capsys.readouterr()
    assert 'epoch   1' not in captured.out, 'trained before refusing'
    assert captured.err.count('\n') == 1, captured.err
    assert re.search(message, captured.err), captured.err


def test_history_is_written_atomically(tmp_path, one_part):
    history = tmp_path / 'h.json'
    history.write_text('an earlier run')
    assert _cli(one_part, '--epochs', '2', '--history', str(history)) == 0
    assert [e['epoch'] for e in json.loads(history.read_text())] == [1, 2]
    assert os.listdir(tmp_path) == ['h.json']  # no temporary file left


def test_unwritable_checkpoint_dir_is_one_line_per_rank(tmp_path):
    data = datasets.synthetic_graph(200, 6, 8, 3, seed=1)
    parts = str(tmp_path / 'parts')
    pyg_sar.partition_graph(data, 2, parts)
    (tmp_path / 'file').write_text('not a directory')
    result = _run(_train_command(parts, str(tmp_path / 'file' / 'ckpt'),
                                 str(tmp_path / 'w.pt')))
    assert result.returncode != 0
    errors = _one_line_errors(result.stderr)
    assert sorted(re.match(r'pyg-sar train: error \(rank (\d)\)', line)
                  .group(1) for line in errors) == ['0', '1'], result.stderr
    assert all("is inside '" in line and 'which is a file' in line
               for line in errors), result.stderr
    assert 'epoch   1' not in result.stdout
    assert not re.search(r'File ".*pyg_sar', result.stderr), result.stderr


def test_missing_parts_fails_fast_before_joining(tmp_path):
    """A worker whose peer never comes: the wrong ``--parts`` is reported
    at once, not after the rendezvous times out."""
    missing = str(tmp_path / 'nowhere')
    env = dict(os.environ, RANK='0', LOCAL_RANK='0', WORLD_SIZE='2',
               LOCAL_WORLD_SIZE='2', MASTER_ADDR='127.0.0.1',
               MASTER_PORT=str(find_free_port()))
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, '-m', 'pyg_sar.cli', 'train', '--parts', missing,
         '--no-progress', '--timeout', '30'], env=env, capture_output=True,
        text=True, timeout=120)
    elapsed = time.perf_counter() - start
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"pyg-sar train: error (rank 0): parts "
                             f"'{missing}': no such directory; expected a "
                             f"partition directory written by pyg-sar "
                             f"partition\n")
    assert elapsed < 20
    (tmp_path / 'empty').mkdir()
    env['MASTER_PORT'] = str(find_free_port())
    result = subprocess.run(
        [sys.executable, '-m', 'pyg_sar.cli', 'train', '--parts',
         str(tmp_path / 'empty'), '--timeout', '30'], env=env,
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert 'holds no pyg_sar.json' in result.stderr
    assert result.stderr.count('\n') == 1, result.stderr


# The CLI's torch-free copy of the model names ################################

def test_cli_models_match_the_training_loop():
    from pyg_sar.cli.main import build_parser
    from pyg_sar.cli.train import MODELS as CLI_MODELS
    from pyg_sar.train import MODELS
    assert CLI_MODELS == MODELS
    train = build_parser('train')._subparsers._group_actions[0].choices[
        'train']
    model = next(a for a in train._actions if a.dest == 'model')
    assert tuple(model.choices) == MODELS


class _Lookup:
    """Pickles as ``getattr(target, name)``: how Python pickles an enum
    member by name (3.11.2 here; 3.12)."""

    def __init__(self, target, name):
        self.target, self.name = target, name

    def __reduce__(self):
        return getattr, (self.target, self.name)


def test_enum_members_by_name_are_read_and_nothing_else():
    """A metadata file may name ``getattr`` for an enum member of the
    format's own classes; any other lookup is refused before it runs."""
    from pyg_sar.comm import dcp
    enums = [c for c in dcp.format_classes().values()
             if isinstance(c, type) and issubclass(c, enum.Enum)]
    assert enums, 'the format has no enum class to check'
    member = next(iter(enums[0]))
    data = pickle.dumps(_Lookup(enums[0], member.name), protocol=4)
    assert checkpoint_io._SafeUnpickler(io.BytesIO(data)).load() is member
    for target, name in ((subprocess.Popen, '__init__'),
                         (enums[0], '__class__'), (enums[0], 'mro')):
        data = pickle.dumps(_Lookup(target, name), protocol=4)
        with pytest.raises(pickle.UnpicklingError, match='not a member|'
                           'not part of the checkpoint format'):
            checkpoint_io._SafeUnpickler(io.BytesIO(data)).load()
