"""Which kernel module runs the norms: ``"numba"`` (default) or ``"numpy"``.

Chosen by ``set_backend``, the ``use_backend`` context manager, or the
environment variable ``MINIGRAD_NORM_BACKEND``. Both backends implement the
same functions with the same signatures (see ``minigrad_norm.kernels``);
everything calls them through ``kernels_for``, the one dispatch point.
Complex arrays (the complex-step method) always take the NumPy reference.

Precedence: ``use_backend`` (per thread / async context), then ``set_backend``
(process-wide), then the environment variable, then ``"numba"``. The numba
kernels are imported on first use, so ``import minigrad_norm`` neither imports
numba nor compiles anything; when numba cannot be imported the NumPy backend
runs instead and a warning says so once.

Importing this module sets ``OMP_WAIT_POLICY=PASSIVE`` unless the user has set it.
numba's parallel kernels run on an OpenMP pool whose idle threads, by default,
spin for milliseconds before sleeping. On a machine whose cores are shared (2
cores here, with PyTorch's own OpenMP pool or another process beside us) a
spinning thread holds the core another thread needs, and a parallel region of
1 ms then takes 4 or 8 ms: whole scheduler ticks. Passive waiting has its own
price, a sleeping thread woken for every parallel region: on the AMD VM of CPU
family 26 an empty region took 60 us instead of 2.5. A float32 LayerNorm
forward of 1024x1024 on 2 threads, in a loop with a NumPy call between, took
0.153 ms a call passive and 0.10-0.12 spinning briefly (``GOMP_SPINCOUNT=10000``,
its threads asleep within a millisecond); but with two such processes
at once, 0.22-0.23 passive and 0.69-0.74 spinning; and ``minigrad-norm bench``
with ``OMP_WAIT_POLICY=ACTIVE`` (PyTorch's pool beside numba's, the kernels
compiled in two processes) compiled every kernel in 85 s instead of 39. Passive
is the default that cannot go that wrong; a program that has the cores to
itself (no other process, no second OpenMP pool) can set
``OMP_WAIT_POLICY=ACTIVE`` (or ``GOMP_SPINCOUNT``) before importing
minigrad_norm. OpenMP reads the variable when its runtime loads, so it is set
here, at ``import minigrad_norm``, before numba's pool (or a later-imported
PyTorch) starts.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
import warnings
from collections.abc import Iterator
from types import ModuleType

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from minigrad_norm.kernels import reference  # noqa: E402

BACKENDS = ("numba", "numpy")
_active: str | None = None  # set_backend
_scoped: contextvars.ContextVar[str | None] = contextvars.ContextVar("minigrad_norm_backend", default=None)
_numba_module: ModuleType | None = None


def _load_numba() -> ModuleType | None:
    """The numba kernels, or None (said once) when numba cannot be imported or its JIT is off
    (``NUMBA_DISABLE_JIT=1``, numba's switch for debugging jitted code as Python: the kernels' intrinsics, such
    as their non-temporal stores, have no Python form)."""
    global _numba_module
    if _numba_module is None:
        try:
            module = importlib.import_module("minigrad_norm.kernels.numba_cpu")
        except ImportError as e:
            unavailable = f"numba is unavailable ({e})"
        else:
            import numba

            unavailable = "numba's JIT is off (NUMBA_DISABLE_JIT)" if numba.config.DISABLE_JIT else None
        if unavailable:
            warnings.warn(f"minigrad_norm: {unavailable}; using the NumPy backend", stacklevel=3)
        _numba_module = reference if unavailable else module
    return None if _numba_module is reference else _numba_module


def _check(op: str, name: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"{op}: unknown backend {name!r}; choose one of {BACKENDS}")
    return name


def set_backend(name: str) -> None:
    """Choose the backend for the whole process: ``"numba"`` or ``"numpy"``."""
    global _active
    _active = _check("set_backend", name)


def get_backend() -> str:
    """The backend in force: numba unless set otherwise or numba is unavailable."""
    name = _scoped.get() or _active
    if not name:  # (the variable read only then: 0.85 us a read, on every norm call; an empty one counts as unset)
        name = _check("MINIGRAD_NORM_BACKEND", os.environ.get("MINIGRAD_NORM_BACKEND") or "numba")
    if name == "numba" and _load_numba() is None:
        return "numpy"
    return name


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """``with use_backend("numpy"): ...`` runs the block on that backend (this thread only)."""
    token = _scoped.set(_check("use_backend", name))
    try:
        yield
    finally:
        _scoped.reset(token)


def kernels_for(*arrays: np.ndarray | None) -> ModuleType:
    """The kernel module for these arrays (None ignored) under the active backend: the reference
    whenever any of them is complex (a complex-step derivative), as the numba kernels are real only."""
    if get_backend() == "numpy" or any(reference.is_complex(a) for a in arrays):
        return reference
    return _load_numba()
