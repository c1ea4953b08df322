"""Stage 0, what every stage may use and nothing of ``pyg_sar`` else: the
package version (importable without torch), the optional accelerated
kernels (:mod:`~pyg_sar.utils.compat`) and the C allocator's policy
(:mod:`~pyg_sar.utils.malloc`)."""
