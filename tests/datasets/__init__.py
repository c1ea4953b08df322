"""Tests of ``pyg_sar.datasets``."""
