"""The report of the examples that train beside one process: the
distributed run and the single-process run side by side, epoch by epoch.

Not an example itself; ``appnp_cora.py``, ``sign_cora.py``,
``hetero_dblp.py`` and ``correct_and_smooth_cora.py`` import it (it sits next to them).
"""


def print_epochs(history, single) -> None:
    """Prints ``(loss, val acc, test acc)`` per epoch (the first and every
    tenth) of the distributed run and, when ``single`` is given, the
    single-process run beside it."""
    header = 'epoch  loss      val    test'
    if single:
        header += '   | one process: loss      val    test'
    print(header)
    for epoch, row in enumerate(history, 1):
        if epoch % 10 and epoch != 1:
            continue
        line = f'{epoch:5d}  {row[0]:.6f}  {row[1]:.4f} {row[2]:.4f}'
        if single:
            s = single[epoch - 1]
            line += f'   |              {s[0]:.6f}  {s[1]:.4f} {s[2]:.4f}'
        print(line)


def print_side_by_side(history, single, world_size: int) -> None:
    """Prints :func:`print_epochs` (rows ``(loss, val acc, test acc,
    seconds)``), then the final accuracies and the largest loss
    difference."""
    print_epochs(history, single)
    epoch_s = sorted(r[-1] for r in history)[len(history) // 2]
    print(f'test accuracy {history[-1][2]:.4f} ({world_size} workers, '
          f'median epoch {epoch_s:.3f}s)')
    if single:
        gap = max(abs(a[0] - b[0]) for a, b in zip(history, single))
        print(f'test accuracy {single[-1][2]:.4f} (one process); largest '
              f'loss difference over {len(history)} epochs: {gap:.2e}')
