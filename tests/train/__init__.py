"""Tests of ``pyg_sar.train``."""
