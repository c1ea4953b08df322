"""Tests of ``pyg_sar.graph``."""
