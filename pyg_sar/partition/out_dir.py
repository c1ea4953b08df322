"""Writing a partition directory safely: :func:`_check_out_dir` refuses to
replace anything that is not a partition, :func:`_write_atomically` builds
the new partition in a temporary folder and renames it into place only once
it is complete."""
import json
import os
import os.path as osp
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Optional

from tqdm.auto import tqdm

from pyg_sar.partition.layout import MANIFEST_FILE, META_FILE


def _check_out_dir(out_dir: str, overwrite: bool) -> None:
    if osp.isfile(out_dir):
        raise FileExistsError(f"Output path '{out_dir}' is a file; expected "
                              f"a directory")
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


def _write_atomically(
    out_dir: str,
    write: Callable[[str, tqdm], Dict[str, Any]],
    num_steps: int,
    progress: Optional[bool],
    start_time: float,
    check_time: Optional[float],
) -> Dict[str, Any]:
    r"""Runs :obj:`write(tmp_dir, bar)` in a temporary folder next to
    :obj:`out_dir`, adds the timings to the manifest it returns, writes the
    manifest and renames the folder to :obj:`out_dir` (replacing an old
    partition only once the new one is complete). A failure leaves nothing
    behind."""
    if progress is None:
        progress = sys.stderr.isatty()
    parent = osp.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp_dir = tempfile.mkdtemp(prefix=f'.{osp.basename(out_dir)}.tmp-',
                               dir=parent)
    try:
        # mkdtemp creates the folder private (0700); give the final
        # partition the permissions of a normally created directory.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_dir, 0o777 & ~umask)
        with tqdm(total=num_steps, disable=not progress, desc='partition',
                  unit='step') as bar:
            manifest = write(tmp_dir, bar)
        if check_time is not None:
            manifest['time_s']['check_finite'] = round(check_time, 4)
        manifest['time_s']['total'] = round(time.perf_counter() - start_time,
                                            3)
        _write_json(manifest, osp.join(tmp_dir, MANIFEST_FILE))
        _replace_dir(tmp_dir, out_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return manifest


def _write_json(obj: Any, path: str) -> None:
    with open(path, 'w') as f:
        json.dump(obj, f, indent=2)
        f.write('\n')


def _replace_dir(new_dir: str, out_dir: str) -> None:
    if not osp.exists(out_dir):
        os.rename(new_dir, out_dir)
        return
    # Move the old directory aside first: rename() cannot replace a
    # non-empty directory, and the old one must survive until the new one
    # is in place.
    trash_dir = tempfile.mkdtemp(prefix=f'.{osp.basename(out_dir)}.old-',
                                 dir=osp.dirname(out_dir))
    os.rmdir(trash_dir)
    os.rename(out_dir, trash_dir)
    try:
        os.rename(new_dir, out_dir)
    except BaseException:
        os.rename(trash_dir, out_dir)
        raise
    shutil.rmtree(trash_dir, ignore_errors=True)
