"""The files of a run, trusted no further than they were checked.

One place for what every writer and reader of :mod:`pyg_sar.train` shares:

- :func:`write_atomically`: a file is written to a temporary file next to
  it, flushed to disk and renamed into place, so that a reader (or a crash)
  sees the old file or the complete new one, never a half-written one.
- :func:`file_digest` and :func:`bytes_digest`: the content hash that
  checkpoints record for each of their files, the one partition
  directories record (:mod:`pyg_sar.partition.digest`).
- :func:`check_output_dir` and :func:`check_output_file`: an output path is
  found writable before training starts instead of after the last epoch.
"""
from __future__ import annotations

import os
import os.path as osp
import tempfile
from typing import BinaryIO, Callable, Tuple

from pyg_sar.partition import digest
from pyg_sar.partition.digest import HASH_ALGORITHM, bytes_digest, hash_tree

__all__ = ['HASH_ALGORITHM', 'hash_tree', 'file_digest', 'bytes_digest',
           'fsync_dir', 'write_atomically', 'write_text_atomically',
           'check_output_dir', 'check_output_file']


# Atomic writes ###############################################################

def fsync_dir(path: str) -> None:
    """Flushes the directory entry changes of ``path`` (a rename into it) to
    disk. Best effort: a file system without directory fsync is ignored."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomically(path: str, write: Callable[[BinaryIO], None]) -> None:
    """Writes the file ``path`` with ``write(f)`` (``f`` a binary file) into
    a hidden temporary file in the same folder, fsyncs it and renames it to
    ``path`` (``os.replace`` is atomic). On any error the temporary file is
    removed and ``path`` is left as it was."""
    path = os.fspath(path)
    folder = osp.dirname(osp.abspath(path))
    if not osp.isdir(folder):
        raise FileNotFoundError(f"cannot write '{path}': directory "
                                f"'{folder}' does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f'.{osp.basename(path)}.',
                               suffix='.tmp', dir=folder)
    try:
        with os.fdopen(fd, 'wb') as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates the file private (0600); give it the permissions
        # of a normally created file.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if osp.lexists(tmp):
            os.remove(tmp)
        raise
    fsync_dir(folder)


def write_text_atomically(path: str, text: str) -> None:
    """:func:`write_atomically` of a UTF-8 text."""
    data = text.encode()
    write_atomically(path, lambda f: f.write(data))


# Content hashes ##############################################################

def file_digest(path: str) -> Tuple[int, str]:
    """``(size in bytes, HASH_ALGORITHM hex digest)`` of the file
    ``path``, read in blocks
    (:func:`pyg_sar.partition.digest.file_digest`)."""
    with open(path, 'rb') as f:
        return os.fstat(f.fileno()).st_size, digest.file_digest(f)


# Output paths ################################################################

def _probe(folder: str, what: str, path: str) -> None:
    """Creates and removes a file in ``folder``: the one test of
    writability that permissions, ACLs, read-only mounts and root squash
    all answer truthfully."""
    try:
        fd, probe = tempfile.mkstemp(prefix='.pyg-sar-probe-', dir=folder)
    except OSError as e:
        raise ValueError(f"{what} '{path}': cannot create files in "
                         f"'{folder}' ({e.strerror or e}); expected a "
                         f"writable directory") from None
    os.close(fd)
    os.remove(probe)


def check_output_dir(path: str, what: str) -> None:
    """Refuses (``ValueError``) an output directory ``path`` that cannot be
    written: a file is in the way, or the directory (or, when it does not
    exist yet, its nearest existing ancestor, where it will be created) does
    not let this process create files. ``what`` names the option in the
    message. Creates nothing."""
    path = os.fspath(path)
    existing = osp.abspath(path)
    while not osp.exists(existing):
        if osp.lexists(existing):
            raise ValueError(f"{what} '{path}': '{existing}' is a broken "
                             f"symbolic link; expected a directory")
        existing = osp.dirname(existing)
    if not osp.isdir(existing):
        where = 'is' if existing == osp.abspath(path) else \
            f"is inside '{existing}', which is"
        raise ValueError(f"{what} '{path}' {where} a file; expected a "
                         f"directory")
    _probe(existing, what, path)


def check_output_file(path: str, what: str) -> None:
    """Refuses an output file ``path`` whose directory does not exist
    (``FileNotFoundError``), is not writable, or that names a directory
    (``ValueError``). ``what`` names the option in the message. Creates
    nothing."""
    path = os.fspath(path)
    folder = osp.dirname(osp.abspath(path))
    if not osp.isdir(folder):
        raise FileNotFoundError(f"{what} '{path}': directory '{folder}' does "
                                f"not exist")
    if osp.isdir(path):
        raise ValueError(f"{what} '{path}' is a directory; expected the path "
                         f"of a file")
    _probe(folder, what, path)
