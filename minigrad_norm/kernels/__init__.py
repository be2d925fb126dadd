"""Kernels behind the norms and the hot elementwise ops, one module per backend.

``reference`` is NumPy, written to be read; ``numba_cpu`` implements the same
functions with the same signatures as jitted loops. ``minigrad_norm.backend``
picks one.
"""
