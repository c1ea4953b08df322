r"""The work directory of a resumable partition run: the phases of a long
run on a graph directory (input check, symmetrization, KaMinPar, the
repaired assignment) record their output files here with their size and
SHA-256, so that a run that died (out of memory, killed, a full disk) and
is started again with the same arguments skips every phase whose outputs
still verify.

:class:`WorkDir` lives next to the output folder (:func:`work_dir_for`:
``.<name>.work``), is locked by the run using it (a second run into the
same output fails at once), and is removed when the partition is in place.
Nothing in it is trusted: ``state.json`` is JSON checked field by field
(never unpickled), its key (the arguments and the input files' sizes and
modification times) must match the run's, every recorded file is hashed
again before it is reused, and a phase records the digest of the outputs it
was computed from, so a redone phase whose output differs invalidates the
phases after it. File names are fixed here, never read from the state, so
every path stays inside the folder. A state that does not parse or belongs
to other arguments is discarded and the run starts over (with a warning).
"""
import fcntl
import json
import os
import os.path as osp
import shutil
import warnings
from typing import Any, Dict, Iterable, List, Optional

import numpy as np

from pyg_sar.partition.digest import HASH_ALGORITHM, bytes_digest, \
    file_digest

STATE_FILE = 'state.json'
LOCK_FILE = 'lock'
WORK_FORMAT = 'pyg_sar.partition.work'
WORK_VERSION = 1
# The files a phase may record; anything else in the folder (besides their
# '.tmp' and '.part' siblings and the writer's temporary folders) makes the
# folder someone else's, and it is never cleared.
PHASE_FILES = ('graph.parhip', 'kaminpar.part', 'assignment.bin')
_SUFFIXES = ('', '.tmp', '.part', '.part.tmp')
# The writer's temporary output folder inside the work directory starts
# with this (pyg_sar.partition.write.out_dir.write_atomically).
WRITE_TMP_MARK = '.tmp-'


def work_dir_for(out_dir: str) -> str:
    r"""The work directory of the run that writes :obj:`out_dir`:
    ``.<name>.work`` in the same parent folder (so the finished partition is
    renamed into place on the same file system)."""
    out_dir = osp.abspath(os.fspath(out_dir))
    return osp.join(osp.dirname(out_dir), f'.{osp.basename(out_dir)}.work')


def after_phase(name: str) -> None:
    r"""Called once phase :obj:`name` is recorded. Does nothing; tests
    replace it to kill a run right after a given phase."""


def input_fingerprint(paths: Iterable[str]) -> List[List[Any]]:
    r"""Name, size and modification time (ns) of every input file, sorted:
    a changed input makes a recorded run someone else's."""
    out = []
    for path in sorted(set(paths)):
        st = os.stat(path)
        out.append([path, st.st_size, st.st_mtime_ns])
    return out


class WorkDir:
    r"""The work directory :obj:`root` of a run identified by :obj:`key`
    (a JSON-serializable dict: the arguments that shape the result and the
    input fingerprint). Use as a context manager: entering creates and
    locks the folder and loads a matching state (or clears a stale one;
    :obj:`resume=False` clears it always); leaving unlocks it.

    Args:
        root (str): The folder (:func:`work_dir_for`).
        key (dict): What a recorded run must match to be resumed.
        resume (bool, optional): Reuse verified phases of a matching
            earlier run. (default: :obj:`True`)
    """

    def __init__(self, root: str, key: Dict[str, Any], resume: bool = True):
        self.root = osp.abspath(root)
        self.key = json.loads(json.dumps(key))  # normalized, JSON-typed
        self.resume = resume
        self.phases: Dict[str, Dict[str, Any]] = {}
        self.resumed: List[str] = []
        self._lock = None

    # -- life cycle ---------------------------------------------------------
    def __enter__(self) -> 'WorkDir':
        os.makedirs(self.root, exist_ok=True)
        self._check_ours()
        self._lock = open(osp.join(self.root, LOCK_FILE), 'a')
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            self._lock = None
            raise RuntimeError(f"Work directory '{self.root}' is in use by "
                               f"another partition run into the same "
                               f"output") from None
        state = self._load() if self.resume else None
        if state is None:
            self._clear()
        else:
            self.phases = state
        self._remove_stale_tmp()
        return self

    def __exit__(self, *exc) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def close(self) -> None:
        r"""Leaves after a failure: unlocks the folder, kept for a new run
        to resume from if a phase was recorded, else removed (a bad input
        leaves nothing behind)."""
        if self.phases:
            self.__exit__()
        else:
            self.remove()

    def remove(self) -> None:
        r"""Deletes the folder (the partition is in place)."""
        self.__exit__()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- files --------------------------------------------------------------
    def path(self, name: str) -> str:
        r"""The path of the phase file :obj:`name` (one of
        :obj:`PHASE_FILES`)."""
        if name not in PHASE_FILES:
            raise ValueError(f"'{name}' is not a work file; expected one of "
                             f"{list(PHASE_FILES)}")
        return osp.join(self.root, name)

    def discard(self, *names: str) -> None:
        r"""Removes phase files that are no longer needed (their phases
        stay recorded but no longer verify)."""
        for name in names:
            path = self.path(name)
            if osp.exists(path):
                os.remove(path)

    def disk_bytes(self) -> int:
        r"""Bytes of the phase files now in the folder."""
        return sum(osp.getsize(self.path(n)) for n in PHASE_FILES
                   if osp.exists(self.path(n)))

    # -- phases -------------------------------------------------------------
    def verified(self, phase: str, depends: Optional[str] = None
                 ) -> Optional[Dict[str, Any]]:
        r"""The record of :obj:`phase` (:obj:`info`, :obj:`digest`,
        :obj:`files`) if it was completed from inputs of digest
        :obj:`depends` and every file it recorded has its recorded size and
        hash; else :obj:`None` (a record that fails is dropped, with a
        warning naming the file)."""
        record = self.phases.get(phase)
        if record is None:
            return None
        if record.get('depends') != depends:
            del self.phases[phase]
            return None
        for name, want in record['files'].items():
            path = self.path(name)
            got = _describe(path) if osp.exists(path) else None
            if got != want:
                what = 'is missing' if got is None else \
                    'differs from the one recorded'
                warnings.warn(f"Partition work file '{path}' {what}; phase "
                              f"'{phase}' is done again", stacklevel=2)
                del self.phases[phase]
                return None
        if phase not in self.resumed:
            self.resumed.append(phase)
        return record

    def digest_of(self, phase: Optional[str]) -> Optional[str]:
        r"""The recorded digest of :obj:`phase`'s outputs (:obj:`None` if
        it is not recorded), without checking its files."""
        record = self.phases.get(phase) if phase is not None else None
        return None if record is None else record['digest']

    def record(self, phase: str, files: Iterable[str] = (),
               info: Optional[Dict[str, Any]] = None,
               depends: Optional[str] = None) -> Dict[str, Any]:
        r"""Records :obj:`phase` as complete: its output :obj:`files`
        (names in :obj:`PHASE_FILES`, hashed now), its :obj:`info` (JSON)
        and the digest of the inputs it was computed from. Returns the
        record; its :obj:`digest` identifies the outputs."""
        described = {name: _describe(self.path(name)) for name in files}
        # The outputs and what they were made from; not the info (timings).
        digest = bytes_digest(json.dumps(
            [phase, described, depends], sort_keys=True).encode())
        record = {'files': described, 'info': info or {}, 'depends': depends,
                  'digest': digest}
        self.phases[phase] = json.loads(json.dumps(record))
        self._save()
        after_phase(phase)
        return self.phases[phase]

    # -- state --------------------------------------------------------------
    def _save(self) -> None:
        path = osp.join(self.root, STATE_FILE)
        with open(path + '.tmp', 'w') as f:
            json.dump({'format': WORK_FORMAT, 'version': WORK_VERSION,
                       'key': self.key, 'phases': self.phases}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + '.tmp', path)

    def _load(self) -> Optional[Dict[str, Dict[str, Any]]]:
        path = osp.join(self.root, STATE_FILE)
        if not osp.exists(path):
            return None
        try:
            if osp.getsize(path) > 1 << 24:
                raise ValueError('too large')
            with open(path, 'rb') as f:
                state = json.loads(f.read().decode('utf-8'))
            phases = _check_state(state)
        except (ValueError, UnicodeDecodeError, OSError) as e:
            warnings.warn(f"Partition work state '{path}' is unreadable "
                          f"({e}); starting over", stacklevel=3)
            return None
        if state['key'] != self.key:
            warnings.warn(f"Partition work directory '{self.root}' belongs "
                          f"to a run with other arguments or another input; "
                          f"starting over", stacklevel=3)
            return None
        return phases

    def _entries(self) -> List[str]:
        return sorted(os.listdir(self.root))

    def _check_ours(self) -> None:
        known = {STATE_FILE, STATE_FILE + '.tmp', LOCK_FILE}
        known |= {n + s for n in PHASE_FILES for s in _SUFFIXES}
        for name in self._entries():
            if name in known or (name.startswith('.') and WRITE_TMP_MARK in
                                 name and osp.isdir(osp.join(self.root,
                                                             name))):
                continue
            raise FileExistsError(
                f"'{self.root}' holds '{name}', which a partition work "
                f"directory never holds; remove it or choose another "
                f"output directory")

    def _clear(self) -> None:
        self.phases = {}
        for name in self._entries():
            if name != LOCK_FILE:
                path = osp.join(self.root, name)
                if osp.isdir(path):
                    shutil.rmtree(path)
                else:
                    os.remove(path)

    def _remove_stale_tmp(self) -> None:
        r"""Half-written files and output folders of a run that died."""
        stale = {n + s for n in PHASE_FILES for s in _SUFFIXES[1:]}
        stale.add(STATE_FILE + '.tmp')
        for name in self._entries():
            path = osp.join(self.root, name)
            if osp.isdir(path):
                shutil.rmtree(path)
            elif name in stale:
                os.remove(path)


def _describe(path: str) -> Dict[str, Any]:
    with open(path, 'rb') as f:
        return {'bytes': os.fstat(f.fileno()).st_size,
                HASH_ALGORITHM: file_digest(f)}


def _check_state(state: Any) -> Dict[str, Dict[str, Any]]:
    r"""The phases of a parsed ``state.json``, every field checked; a
    :class:`ValueError` for anything else."""
    if not isinstance(state, dict) or state.get('format') != WORK_FORMAT \
            or state.get('version') != WORK_VERSION:
        raise ValueError(f"not a '{WORK_FORMAT}' version {WORK_VERSION} "
                         f"state")
    phases = state.get('phases')
    if not isinstance(phases, dict) or 'key' not in state:
        raise ValueError("no 'phases' or 'key'")
    for phase, record in phases.items():
        if not isinstance(record, dict) or not isinstance(
                record.get('files'), dict) or not isinstance(
                    record.get('info'), dict) or not isinstance(
                        record.get('digest'), str) or not isinstance(
                            record.get('depends'), (str, type(None))):
            raise ValueError(f"phase '{phase}' is malformed")
        for name, want in record['files'].items():
            if name not in PHASE_FILES or not isinstance(want, dict) or \
                    set(want) != {'bytes', HASH_ALGORITHM}:
                raise ValueError(f"phase '{phase}' records {name!r}")
    return phases


def write_ints(values, path: str, dtype) -> None:
    r"""Writes integers as a raw array of :obj:`dtype` under a temporary
    name, renamed when complete."""
    with open(path + '.tmp', 'wb') as f:
        np.asarray(values).astype(dtype, copy=False).tofile(f)
    os.replace(path + '.tmp', path)


def read_ints(path: str, dtype, count: int, high: int) -> np.ndarray:
    r"""Reads back :func:`write_ints`'s :obj:`count` integers, each checked
    to lie in :obj:`[0, high)` (a :class:`ValueError` naming the file)."""
    itemsize = np.dtype(dtype).itemsize
    size = osp.getsize(path)
    if size != count * itemsize:
        raise ValueError(f"'{path}' is {size} bytes; expected "
                         f"{count * itemsize}")
    values = np.fromfile(path, dtype=dtype)
    if values.size and (int(values.min()) < 0 or int(values.max()) >= high):
        raise ValueError(f"'{path}' holds values outside [0, {high})")
    return values


__all__ = ['WorkDir', 'work_dir_for', 'after_phase', 'input_fingerprint',
           'write_ints', 'read_ints', 'PHASE_FILES', 'STATE_FILE',
           'WRITE_TMP_MARK']
