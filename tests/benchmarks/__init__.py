"""Tests of the benchmark helpers (``benchmarks/``)."""
