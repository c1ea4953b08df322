"""Tests of the documentation site (``docs/``)."""
