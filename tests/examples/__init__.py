"""Tests of the examples (``examples/``) and of the PyG idioms the
tutorials show."""
