"""Content hashes of the files of a partition directory: the writer
records one per file in the manifest (:func:`hash_tree`), the reader checks
every file it reads against it (:func:`file_digest`), so a part file swapped
in from another partitioning, or one flipped byte, is refused instead of
training on a different graph."""
import hashlib
import os
import os.path as osp
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO, Dict, Iterable

# SHA-256: faster than BLAKE2b where the CPU has SHA instructions (x86
# SHA-NI, ARMv8), and the standard.
HASH_ALGORITHM = 'sha256'


def file_digest(f: BinaryIO) -> str:
    r"""The hex :obj:`HASH_ALGORITHM` digest of the open binary file
    :obj:`f`, read from its current position to its end in blocks (so the
    memory it needs does not grow with the file). SHA-256 over BLAKE2b:
    CPUs with SHA instructions hash it faster, and hashing a partition
    costs a small fraction of writing it.
    """
    return hashlib.file_digest(f, HASH_ALGORITHM).hexdigest()


def bytes_digest(data: bytes) -> str:
    """The hex :obj:`HASH_ALGORITHM` digest of bytes already in memory."""
    return hashlib.new(HASH_ALGORITHM, data).hexdigest()


def _describe(path: str) -> Dict[str, object]:
    with open(path, 'rb') as f:
        size = os.fstat(f.fileno()).st_size
        return {'bytes': size, HASH_ALGORITHM: file_digest(f)}


def _files_below(root: str, exclude: Iterable[str]) -> Dict[str, str]:
    r"""``{relative posix path: absolute path}`` of every file below
    :obj:`root`, sorted, except the relative paths in :obj:`exclude`."""
    skip = set(exclude)
    found = {}
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = osp.join(folder, name)
            rel = osp.relpath(path, root).replace(os.sep, '/')
            if rel not in skip:
                found[rel] = path
    return found


def hash_tree(root: str, exclude: Iterable[str] = ()) -> Dict[str, Dict]:
    r"""The manifest's :obj:`files` table: for every file below
    :obj:`root` (relative posix path, sorted) its size in bytes and its
    :obj:`HASH_ALGORITHM` digest. Files are hashed on all cores (the hash
    releases the GIL); the bytes are the ones on disk, just written, so
    normally read back from the page cache."""
    files = _files_below(root, exclude)
    workers = max(1, min(len(files), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        described = list(pool.map(_describe, files.values()))
    return dict(zip(files, described))
