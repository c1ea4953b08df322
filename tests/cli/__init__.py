"""Tests of ``pyg_sar.cli``."""
