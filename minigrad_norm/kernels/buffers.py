"""Output buffers for the numba kernels, recycled instead of taken fresh from the OS.

Why: glibc serves an allocation of 32 MiB or more (from 128 KiB, while its threshold adapts) with
new ``mmap`` pages and unmaps them on free. The OS zeroes each new page on first touch, so a kernel
that allocates its 32 MiB output on every call also zeroes 32 MiB every call: a float32
LayerNorm (8192, 1024) forward+backward took 16.1 ms allocating against 9.6 ms with ``out=``
(``benchmarks/allocation.py``, 2 threads). PyTorch's CPU allocator sits on the same malloc and
pays the same.

How: ``BufferPool.empty`` hands out a view into a raw byte buffer that the pool keeps. Every
view of that array, however derived, has the raw buffer as its ``base``, so the raw buffer's
reference count tells whether anything outside the pool can still reach it: when only the
pool's own reference is left, the array is gone and the buffer can be handed out again, with
no page to fault in or zero. This is what PyTorch's CUDA caching allocator does with device
memory. A buffer is reused only for a request of exactly its size, and buffers of at most
``capacity`` bytes in all are kept; past that, unused buffers are released oldest first, and a
request that still does not fit gets a plain ``np.empty``.

What a user sees: an array from the numba backend of at least ``min_bytes`` is a view (its
``base`` is the pool's buffer), 64-byte aligned, with undefined contents like ``np.empty``'s.
Memory the program no longer uses stays allocated to the pool (at most ``capacity``), until
``POOL.clear()``. The environment variable ``MINIGRAD_NORM_BUFFER_POOL_MIB`` sets the
capacity when the module is imported (default 1024; 0 turns the pool off).

Not done: 2 MiB pages. With the pool's buffers and the inputs in transparent huge pages (``madvise(MADV_HUGEPAGE)``;
this VM's kernel gives them only where asked), the kernels took, from cold caches on 2 threads (the AMD Zen 4 VM, a
prototype script), a float32 LayerNorm 8192x1024 forward 0.99-1.02 of the time, backward 0.94-1.00, InstanceNorm
32x64x56x56 0.97 and 0.95: about what fewer TLB misses could give, for memory the OS then handles in 2 MiB units.
"""

from __future__ import annotations

import math
import os
import sys
import threading

import numpy as np

_ALIGN = 64  # a cache line: the streaming stores of numba_cpu write whole aligned lines
# glibc's default mmap threshold: from this size on, malloc may serve a request with fresh pages (mmap) or
# hand freed memory back to the OS (a trim of the heap's top), so a request repeated every call can fault
# in and zero its pages every call. The statistics of a LayerNorm over 65536 rows (512 KiB each) did:
# 258 page faults per forward+backward (tests/test_kernels_backend.py pins the threshold to show it).
_MIN_POOLED_BYTES = 128 * 2**10


def _aligned_view(raw: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The C-order array of ``shape`` and ``dtype`` that starts at the first 64-byte boundary in ``raw``
    (raw is a uint8 buffer with at least _ALIGN - 1 spare bytes)."""
    start = -raw.ctypes.data % _ALIGN
    return raw[start : start + math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """Like ``np.empty(shape, dtype)``, but starting on a 64-byte boundary (a cache line), as PyTorch
    aligns its CPU tensors; ``np.empty`` puts a large array 16 bytes past a page boundary. A
    preallocated ``out=`` buffer should be allocated this way: the kernels' streaming stores write
    whole lines, and a row that starts inside a line costs ordinary stores at both its ends."""
    dtype = np.dtype(dtype)
    return _aligned_view(np.empty(math.prod(shape) * dtype.itemsize + _ALIGN - 1, np.uint8), tuple(shape), dtype)


def _refs(entries: list[np.ndarray], i: int) -> int:
    return sys.getrefcount(entries[i])


# What ``_refs`` reads for an object that only the pool's list holds (2 on CPython 3.11: the list
# and the call's argument). Measured through the same call, so it follows the interpreter.
_UNUSED_REFS = _refs([np.empty(0, np.uint8)], 0)


class BufferPool:
    """A cache of raw buffers for kernel outputs of at least ``min_bytes`` (see the module docstring)."""

    def __init__(self, capacity: int, min_bytes: int = _MIN_POOLED_BYTES) -> None:
        if capacity < 0 or min_bytes < 1:
            raise ValueError(f"BufferPool: capacity={capacity} and min_bytes={min_bytes} must be >= 0 and >= 1")
        self.capacity = capacity
        self.min_bytes = min_bytes
        self._entries: list[np.ndarray] = []  # raw uint8 buffers, least recently handed out first
        self._lock = threading.Lock()

    @property
    def cached_bytes(self) -> int:
        """Bytes held by the pool, whether their arrays are alive or not."""
        with self._lock:
            return sum(e.nbytes for e in self._entries)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        """Like ``np.empty(shape, dtype)`` (C order), from the pool when it is big enough (and then
        like ``aligned_empty``)."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self.min_bytes:
            return np.empty(shape, dtype)
        with self._lock:
            raw = self._take(nbytes + _ALIGN - 1)
        if raw is None:
            return np.empty(shape, dtype)
        return _aligned_view(raw, tuple(shape), dtype)

    def owns(self, a: np.ndarray) -> bool:
        """Whether ``a`` is a view of one of the pool's buffers."""
        base = a.base
        with self._lock:
            return any(e is base for e in self._entries)

    def clear(self) -> int:
        """Release every buffer whose array is gone; returns the bytes released."""
        with self._lock:
            return self._release(math.inf)

    def _take(self, size: int) -> np.ndarray | None:
        entries = self._entries
        for i in range(len(entries)):
            if entries[i].nbytes == size and _refs(entries, i) == _UNUSED_REFS:
                entries.append(entries.pop(i))
                return entries[-1]
        held = sum(e.nbytes for e in entries)
        if held + size > self.capacity:
            held -= self._release(held + size - self.capacity)
        if held + size > self.capacity:
            return None
        entries.append(np.empty(size, np.uint8))
        return entries[-1]

    def _release(self, needed: float) -> int:
        """Drop unused buffers, oldest first, until ``needed`` bytes are freed (or none is left)."""
        entries = self._entries
        freed = 0
        i = 0
        while i < len(entries) and freed < needed:
            if _refs(entries, i) == _UNUSED_REFS:
                freed += entries.pop(i).nbytes
            else:
                i += 1
        return freed


def _capacity_from_env() -> int:
    value = os.environ.get("MINIGRAD_NORM_BUFFER_POOL_MIB", "1024")
    try:
        mib = float(value)
    except ValueError:
        mib = -1.0
    if not (mib >= 0 and math.isfinite(mib)):
        raise ValueError(f"MINIGRAD_NORM_BUFFER_POOL_MIB={value!r}: expected a finite MiB >= 0 (0 turns the pool off)")
    return int(mib * 2**20)


POOL = BufferPool(_capacity_from_env())
