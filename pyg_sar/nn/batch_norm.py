"""Old import path; the implementation lives in :mod:`pyg_sar.nn.norm`."""
from pyg_sar.nn.norm.batch_norm import BatchNorm

__all__ = ['BatchNorm']
