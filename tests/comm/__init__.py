"""Tests of ``pyg_sar.comm``."""
