"""Which kernel module runs the norms: ``"numba"`` (default) or ``"numpy"``.

Chosen by ``set_backend``, the ``use_backend`` context manager, or the
environment variable ``MINIGRAD_NORM_BACKEND``. Both backends implement the
same functions with the same signatures (see ``minigrad_norm.kernels``);
everything calls them through ``kernels_for``, the one dispatch point.
Complex arrays (the complex-step method) always take the NumPy reference.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import warnings
from collections.abc import Iterator
from types import ModuleType

import numpy as np

from minigrad_norm.kernels import reference

BACKENDS = ("numba", "numpy")
_active: str | None = None
_numba_module: ModuleType | None = None


def _load_numba() -> ModuleType | None:
    """The numba kernels, or None (said once) when numba cannot be imported."""
    global _numba_module
    if _numba_module is None:
        try:
            _numba_module = importlib.import_module("minigrad_norm.kernels.numba_cpu")
        except ImportError as e:
            warnings.warn(f"minigrad_norm: numba is unavailable ({e}); using the NumPy backend", stacklevel=3)
            _numba_module = reference
    return None if _numba_module is reference else _numba_module


def set_backend(name: str) -> None:
    if name not in BACKENDS:
        raise ValueError(f"set_backend: unknown backend {name!r}; choose one of {BACKENDS}")
    global _active
    _active = name


def get_backend() -> str:
    """The backend in force: numba unless set otherwise or numba is unavailable."""
    name = _active or os.environ.get("MINIGRAD_NORM_BACKEND", "numba")
    if name not in BACKENDS:
        raise ValueError(f"MINIGRAD_NORM_BACKEND={name!r} is not one of {BACKENDS}")
    if name == "numba" and _load_numba() is None:
        return "numpy"
    return name


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    global _active
    previous = _active
    set_backend(name)
    try:
        yield
    finally:
        _active = previous


def kernels_for(*arrays: np.ndarray) -> ModuleType:
    """The kernel module for these arrays under the active backend."""
    if get_backend() == "numpy" or any(np.iscomplexobj(a) for a in arrays):
        return reference
    return _load_numba()
