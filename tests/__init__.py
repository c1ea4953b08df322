"""The test suite, one folder per stage of ``pyg_sar`` (``tests/partition``
tests ``pyg_sar/partition``, ``tests/nn/conv`` tests ``pyg_sar/nn/conv``...),
plus ``tests/docs``, ``tests/examples`` and ``tests/benchmarks``; here, the
tests of the package as a whole (its layout, what a new user meets first)
and of the exactness harness.

Every folder is a package, so every test module has a dotted name of its own
(``tests.nn.test_sar_exact``): two folders may hold files of the same name,
and spawned workers import a test module's worker function by that name. The
shared helpers (``_dist``, ``_graphs``, ``_hetero``, ``_exact``) stay here and
are imported by their short names (``tests/conftest.py`` puts this folder on
``sys.path``)."""
