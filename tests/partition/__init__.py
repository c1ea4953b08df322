"""Tests of ``pyg_sar.partition``."""
