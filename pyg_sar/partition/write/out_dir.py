"""Writing a partition directory safely: :func:`check_out_dir` refuses to
replace anything that is not a partition (and an output folder that cannot
be created), :func:`write_atomically` builds the new partition in a
temporary folder, records the content hash of every file in the manifest
and renames the folder into place only once it is complete, never over the
output of a run that finished meanwhile (unless told to overwrite)."""
import errno
import json
import os
import os.path as osp
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Optional

from tqdm.auto import tqdm

from pyg_sar.partition.digest import hash_tree
from pyg_sar.partition.layout import MANIFEST_FILE, META_FILE


def _existing_ancestor(path: str) -> str:
    r"""The nearest existing folder (or file) at or above :obj:`path`."""
    while not osp.exists(path) and osp.dirname(path) != path:
        path = osp.dirname(path)
    return path


def _check_creatable(out_dir: str) -> None:
    r"""Checks that :obj:`out_dir` and the temporary folder next to it can be
    created: the nearest existing folder above it is a writable folder."""
    ancestor = _existing_ancestor(osp.dirname(out_dir))
    if not osp.isdir(ancestor):
        raise FileExistsError(f"Cannot create output directory '{out_dir}': "
                              f"'{ancestor}' is a file, not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"Cannot create output directory '{out_dir}': "
                         f"'{ancestor}' is not writable")


def check_out_dir(out_dir: str, overwrite: bool) -> None:
    r"""Refuses :obj:`out_dir` unless it is absent or empty, or (with
    :obj:`overwrite`) a partition directory, and unless it can be written;
    a one-line error says which. Run before the slow steps (loading and
    partitioning), so that a bad output path fails at once."""
    if osp.isfile(out_dir):
        raise FileExistsError(f"Output path '{out_dir}' is a file; expected "
                              f"a directory")
    _check_creatable(out_dir)
    if not osp.isdir(out_dir) or not os.listdir(out_dir):
        return
    if not overwrite:
        raise FileExistsError(
            f"Output directory '{out_dir}' is not empty; pass "
            f"overwrite=True (--overwrite) to replace it")
    # Never delete a folder that does not look like a partition.
    if not (osp.exists(osp.join(out_dir, MANIFEST_FILE))
            or osp.exists(osp.join(out_dir, META_FILE))):
        raise FileExistsError(
            f"Refusing to overwrite '{out_dir}': it is not empty and holds "
            f"no '{MANIFEST_FILE}' or '{META_FILE}', so it is not a "
            f"partition directory")


def write_atomically(
    out_dir: str,
    write: Callable[[str, tqdm], Dict[str, Any]],
    num_steps: int,
    progress: Optional[bool],
    start_time: float,
    check_time: Optional[float],
    overwrite: bool,
    tmp_parent: Optional[str] = None,
) -> Dict[str, Any]:
    r"""Runs :obj:`write(tmp_dir, bar)` in a temporary folder next to
    :obj:`out_dir` (or in :obj:`tmp_parent`, a folder on the same file
    system: a resumable run's work directory, which clears what a killed
    run left there), adds the timings and the content hash of every written
    file (:obj:`files`, see :func:`~pyg_sar.partition.digest.hash_tree`) to
    the manifest it returns, writes the manifest and renames the folder to
    :obj:`out_dir` (:func:`_replace_dir`). A failure leaves nothing
    behind."""
    if progress is None:
        progress = sys.stderr.isatty()
    parent = osp.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp_dir = tempfile.mkdtemp(prefix=f'.{osp.basename(out_dir)}.tmp-',
                               dir=tmp_parent or parent)
    try:
        # mkdtemp creates the folder private (0700); give the final
        # partition the permissions of a normally created directory.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_dir, 0o777 & ~umask)
        # disable=None: no bar where stderr is not a terminal (a log file).
        with tqdm(total=num_steps, disable=None if progress else True,
                  desc='partition', unit='step') as bar:
            manifest = write(tmp_dir, bar)
        hash_start = time.perf_counter()
        manifest['files'] = hash_tree(tmp_dir, exclude=(MANIFEST_FILE, ))
        if 'disk_bytes' in manifest:
            manifest['disk_bytes']['write'] = sum(
                f['bytes'] for f in manifest['files'].values())
        manifest['time_s']['hash'] = round(time.perf_counter() - hash_start,
                                           3)
        if check_time is not None:
            manifest['time_s']['check_finite'] = round(check_time, 4)
        manifest['time_s']['total'] = round(time.perf_counter() - start_time,
                                            3)
        write_json(manifest, osp.join(tmp_dir, MANIFEST_FILE))
        _replace_dir(tmp_dir, out_dir, overwrite)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return manifest


def write_json(obj: Any, path: str) -> None:
    r""":obj:`obj` as indented JSON, with a final newline."""
    with open(path, 'w') as f:
        json.dump(obj, f, indent=2)
        f.write('\n')


def _rename_into_empty(new_dir: str, out_dir: str) -> bool:
    r"""Renames :obj:`new_dir` to :obj:`out_dir` if that is absent or an
    empty folder (one atomic :obj:`rename()`, which replaces an empty folder
    and fails on a non-empty one); :obj:`False` if something is there."""
    try:
        os.rename(new_dir, out_dir)
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR,
                       errno.EISDIR):
            return False
        raise
    return True


def _replace_dir(new_dir: str, out_dir: str, overwrite: bool) -> None:
    r"""Puts the complete partition :obj:`new_dir` in place at
    :obj:`out_dir`.

    Without :obj:`overwrite`, :obj:`out_dir` must still be absent or empty:
    the rename is atomic, so of two runs into the same folder the second to
    finish fails (a :class:`FileExistsError`) instead of replacing the
    first's output. With :obj:`overwrite`, an old partition is moved aside,
    the new one renamed in, and only then the old one removed.
    """
    if _rename_into_empty(new_dir, out_dir):
        return
    if not overwrite:
        raise FileExistsError(
            f"Output directory '{out_dir}' is no longer empty: another run "
            f"wrote to it while this one was partitioning, and this run's "
            f"result was discarded; pass overwrite=True (--overwrite) to "
            f"replace it")
    check_out_dir(out_dir, overwrite)  # still a partition directory?
    # Move the old directory aside first: the old one must survive until the
    # new one is in place.
    trash_dir = tempfile.mkdtemp(prefix=f'.{osp.basename(out_dir)}.old-',
                                 dir=osp.dirname(out_dir))
    os.rmdir(trash_dir)
    os.rename(out_dir, trash_dir)
    try:
        if not _rename_into_empty(new_dir, out_dir):
            raise FileExistsError(
                f"Output directory '{out_dir}' was replaced by another run "
                f"while this one was replacing it; this run's result was "
                f"discarded")
    except BaseException:
        if not _rename_into_empty(trash_dir, out_dir):
            # Another run's complete partition took the place of the old
            # one, which was to be replaced anyway.
            shutil.rmtree(trash_dir, ignore_errors=True)
        raise
    shutil.rmtree(trash_dir, ignore_errors=True)
