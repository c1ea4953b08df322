"""Tests of ``pyg_sar.utils``."""
