"""One epoch of a loader: its collective rounds, in the training thread
(``num_workers=0``) or run ahead by a background thread
(``num_workers > 0``).

Every round is collective on the loaders' channel
(:func:`pyg_sar.comm.on_channel`): an ``all_reduce`` of the batches the
ranks have left, then the sampling and attribute exchanges of this rank's
next batch (or of none: it answers its peers). The epoch ends on every rank
in the same round, when no rank has batches left.

With ``num_workers > 0`` one background thread runs the rounds (sampling,
attribute fetch, collation, ``transform``, the move to ``device``) up to
``prefetch_factor * num_workers`` batches ahead of the training loop
(PyG's DataLoader keeps as many in flight); the batches are those of
``num_workers=0``, in the same order (the same rounds, the same random
streams). Its collectives run on the loaders' channel, never paired with
the training thread's (default channel); every wait of theirs has the
communication timeout, and a failure (a dead peer, named) is raised in the
training loop. The training thread waits for a batch in short polls that
end as soon as the thread has died. Leaving the loop early (``break``,
``close()``, the iterator collected) stops this rank's batches; the thread
goes on answering the peers' rounds until every rank is done, and the
rank's next operation of :mod:`pyg_sar.comm` (or the loader's next epoch)
waits for it, as in the synchronous case.
"""
from __future__ import annotations

import itertools
import queue
import threading
from typing import Any, Iterator, List, Optional

from pyg_sar import comm

_POLL_S = 0.05
_END = object()


def _deliver(loader: Any, batch: Any) -> Any:
    if loader.device is not None:
        batch = batch.to(loader.device)
    return loader.transform(batch) if loader.transform else batch


def run_epoch(loader: Any, batches: List[Any]) -> Iterator[Any]:
    """The epoch's batches in this thread (``num_workers=0``)."""
    loader._epoch_running = True  # at the first next(), as the rounds
    try:
        for index in itertools.count():
            own = batches[index] if index < len(batches) else None
            batch = loader._round(own, len(batches) - index)
            if batch is None:  # every rank is done
                return
            if own is not None or loader.pad_batches:
                yield _deliver(loader, batch)
    except GeneratorExit:  # left early: the peers' rounds go on
        comm.finish_before_next_operation(loader._finish_epoch)
        raise
    finally:
        loader._epoch_running = False


class Prefetcher:
    """The background thread of one epoch (``num_workers > 0``)."""

    def __init__(self, loader: Any, batches: List[Any]) -> None:
        self.loader = loader
        self.batches = batches
        depth = loader.num_workers * (loader.prefetch_factor or 2)
        self.queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self.stopped = threading.Event()
        self.thread = threading.Thread(
            target=self._run, daemon=True,
            name=f'pyg_sar-{type(loader).__name__}-rank{loader.rank}')

    def _put(self, item: Any) -> None:
        while not self.stopped.is_set():
            try:
                self.queue.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                continue

    def _run(self) -> None:
        loader, batches = self.loader, self.batches
        try:
            with comm.in_background():
                if loader.worker_init_fn is not None:
                    loader.worker_init_fn(0)
                for index in itertools.count():
                    going = not self.stopped.is_set()
                    own = batches[index] if going and \
                        index < len(batches) else None
                    batch = loader._round(
                        own, len(batches) - index if going else 0)
                    if batch is None:
                        break
                    if going and (own is not None or loader.pad_batches):
                        self._put(_deliver(loader, batch))
            self._put(_END)
        except BaseException as error:  # raised in the training loop
            self._put(error)

    def __iter__(self) -> Iterator[Any]:
        self.loader._epoch_running = True
        self.thread.start()  # at the first next(), as the rounds would
        try:
            while True:
                try:
                    item = self.queue.get(timeout=_POLL_S)
                except queue.Empty:
                    if not self.thread.is_alive() and self.queue.empty():
                        raise RuntimeError(
                            f'the background thread of '
                            f'{type(self.loader).__name__} (rank '
                            f'{self.loader.rank}) ended without finishing '
                            f'the epoch') from None
                    continue
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.stopped.set()  # the thread answers the peers' rounds
            self.loader._pending = self
            comm.finish_before_next_operation(self.join)

    def join(self) -> None:
        """Waits until the thread has answered every round of the epoch
        (its own waits have the communication timeout)."""
        self.stopped.set()
        while self.thread.is_alive():
            self.thread.join(timeout=_POLL_S)
        self.loader._epoch_running = False
        if self.loader._pending is self:
            self.loader._pending = None


def start_epoch(loader: Any, batches: List[Any]) -> Iterator[Any]:
    """The epoch's iterator: in this thread or a background one."""
    previous: Optional[Prefetcher] = getattr(loader, '_pending', None)
    if previous is not None:  # the last epoch's thread, still answering
        previous.join()
    if loader.num_workers > 0:
        return iter(Prefetcher(loader, batches))
    return run_epoch(loader, batches)


def uneven_hint(loader: Any, error: BaseException) -> BaseException:
    """The error of a failed round: ``error`` itself, or, when the ranks
    have different numbers of batches (``pad_batches=False``), a
    :class:`~pyg_sar.comm.PeerError` that names them and the setting (a
    collective in the loop body is then the likely cause)."""
    counts = loader.batch_counts
    if len(set(counts)) == 1 or loader.pad_batches:
        return error
    listed = ', '.join(f'rank {r}: {n}' for r, n in enumerate(counts))
    return comm.PeerError(
        f"{error} [{type(loader).__name__} was built with "
        f"pad_batches=False and the ranks have different numbers of "
        f"batches ({listed}): a collective inside the loop (e.g. "
        f"all_reduce_grads) on a rank whose peers have finished their "
        f"batches waits for them; leave pad_batches at its default "
        f"(balanced inputs) or set pad_batches=True]",
        **{k: getattr(error, k, None) for k in (
            'rank', 'operation', 'peer', 'address', 'elapsed', 'timeout',
            'timed_out')})
