"""Tests of ``pyg_sar.nn.norm``."""
