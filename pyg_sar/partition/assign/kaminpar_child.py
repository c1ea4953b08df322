r"""The child process that runs KaMinPar (see
:func:`pyg_sar.partition.assign.kaminpar.run_kaminpar`): reads a ParHIP file,
partitions it and writes one int32 part id per node to a raw file.

Usage: ``python -m pyg_sar.partition.assign.kaminpar_child GRAPH OUT K SEED
THREADS MAX_BLOCK_WEIGHT CONTEXT``. KaMinPar's bindings hold the GIL and a
malformed file can crash the interpreter, which is why this runs apart from
the caller."""
import os
import sys

import numpy as np


def _check_file(path: str) -> None:
    # A truncated file crashes KaMinPar's reader: check its size first.
    header = np.fromfile(path, dtype=np.uint64, count=3)
    if header.size < 3:
        raise SystemExit(f"ParHIP file '{path}' has no complete header")
    version, n, m = (int(v) for v in header)
    edge_bytes = 4 if version & 4 else 8
    node_bytes = 4 if version & 8 else 8
    expected = 24 + (n + 1) * edge_bytes + m * node_bytes
    size = os.path.getsize(path)
    if size != expected:
        raise SystemExit(f"ParHIP file '{path}' is {size} bytes; its header "
                         f"(n={n}, m={m}) needs {expected}")


def main(argv) -> None:
    graph, out, k, seed, threads, max_weight, context = argv
    _check_file(graph)
    # Run as a script, this folder is first on sys.path, and its
    # kaminpar.py would shadow the kaminpar package.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path
                   if os.path.abspath(p or os.curdir) != here]
    import kaminpar

    kaminpar.reseed(int(seed))
    ctx = getattr(kaminpar, f'{context}_context')()
    compress = context.startswith('terapart')
    g = kaminpar.load_graph(graph, kaminpar.GraphFileFormat.PARHIP,
                            compress=compress)
    solver = kaminpar.KaMinPar(int(threads), ctx)
    part = solver.compute_partition(g, [int(max_weight)] * int(k))
    del g
    np.asarray(part, dtype=np.int32).tofile(out + '.tmp')
    os.replace(out + '.tmp', out)
    # This process's peak resident set, for the parent's statistics.
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmHWM:'):
                print(f'peak_bytes {int(line.split()[1]) * 1024}')


if __name__ == '__main__':
    main(sys.argv[1:])
