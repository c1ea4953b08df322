"""Tests of ``pyg_sar.loader``."""
