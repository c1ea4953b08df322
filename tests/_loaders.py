"""Loaders in the partition's ids, each rank batching its own inputs: the
checks that compare with references in the partition's ids build them
(``ids='partition'``, ``pad_batches=False`` unless given)."""
from pyg_sar.loader import DistLinkNeighborLoader, DistNeighborLoader


def _old(*args, **kwargs):
    """A :class:`DistNeighborLoader` in the partition's ids."""
    kwargs = {'ids': 'partition', 'pad_batches': False, **kwargs}
    return DistNeighborLoader(*args, **kwargs)


def _old_link(*args, **kwargs):
    """A :class:`DistLinkNeighborLoader` in the partition's ids."""
    kwargs = {'ids': 'partition', 'pad_batches': False, **kwargs}
    return DistLinkNeighborLoader(*args, **kwargs)
