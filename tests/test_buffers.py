"""The output buffer pool: it never hands out memory that an array still uses, and it does reuse
memory that none uses (else it would only cost)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minigrad_norm.kernels.buffers import BufferPool, aligned_empty

SHAPES = [(4, 8), (32,), (2, 3, 5)]
DTYPES = [np.float32, np.float64, np.int16]


class PoolMachine(RuleBasedStateMachine):
    """Random sequences of allocations, views, drops and clears. Each live array (or view that
    outlived its array) is filled with a value of its own when it is made: if the pool ever
    handed its memory to another array, that array's fill would overwrite it."""

    def __init__(self) -> None:
        super().__init__()
        # room for a few buffers only, so that eviction and the plain-np.empty fallback happen too
        self.pool = BufferPool(capacity=1200, min_bytes=16)
        self.live: list[tuple[np.ndarray, float]] = []
        self.next_value = 1.0

    def _fill(self, a: np.ndarray) -> None:
        a[...] = self.next_value
        self.live.append((a, self.next_value))
        self.next_value += 1.0

    @rule(shape=st.sampled_from(SHAPES), dtype=st.sampled_from(DTYPES))
    def allocate(self, shape, dtype):
        a = self.pool.empty(shape, dtype)
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
        if self.pool.owns(a):
            assert a.ctypes.data % 64 == 0
        self._fill(a)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def drop(self, data):
        self.live.pop(data.draw(st.integers(0, len(self.live) - 1)))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def keep_only_a_view(self, data):
        """The array goes, a view of part of it stays (its base is the pool's buffer)."""
        i = data.draw(st.integers(0, len(self.live) - 1))
        a, value = self.live.pop(i)
        self.live.append((a.reshape(-1)[1:], value))

    @rule()
    def clear(self):
        self.pool.clear()

    @invariant()
    def live_arrays_keep_their_values(self):
        for a, value in self.live:
            assert np.all(a == value)

    @invariant()
    def capacity_holds(self):
        assert self.pool.cached_bytes <= self.pool.capacity


TestPoolMachine = PoolMachine.TestCase


def test_a_dropped_array_is_reused_and_a_live_one_is_not():
    pool = BufferPool(capacity=2**20, min_bytes=1)
    a = pool.empty((256,), np.float64)
    address = a.ctypes.data
    b = pool.empty((256,), np.float64)  # a is alive: fresh memory
    assert not np.shares_memory(a, b)
    del a
    c = pool.empty((16, 16), np.float64)  # the same size: a's buffer, free again
    assert pool.owns(c) and c.ctypes.data == address
    view = c[3:]
    del c
    d = pool.empty((256,), np.float64)  # c's buffer is held by its view
    assert not np.shares_memory(d, view) and not np.shares_memory(d, b)
    assert pool.cached_bytes == 3 * (256 * 8 + 63)


def test_small_requests_and_full_pool_get_plain_arrays():
    pool = BufferPool(capacity=3000, min_bytes=1024)
    small = pool.empty((100,), np.float64)  # 800 bytes < min_bytes
    assert not pool.owns(small) and small.base is None
    a = pool.empty((256,), np.float64)
    b = pool.empty((256,), np.float64)  # 2 * 2111 bytes > capacity: not cached
    assert pool.owns(a) and not pool.owns(b) and b.base is None
    del a
    c = pool.empty((300,), np.float64)  # another size: the unused buffer is released to make room
    assert pool.owns(c) and pool.cached_bytes == 300 * 8 + 63


def test_the_boundaries_are_pooled():
    """A request of exactly ``min_bytes``, and one that fills the capacity exactly (its bytes and the 63 that
    alignment may skip), are pooled; a byte less than min_bytes, or one past the capacity, is not."""
    pool = BufferPool(capacity=2**20, min_bytes=4096)
    assert pool.owns(pool.empty((1024,), np.float32))  # exactly min_bytes
    assert not pool.owns(pool.empty((4095,), np.uint8))
    exact, short = BufferPool(capacity=1000 + 63, min_bytes=1), BufferPool(capacity=1000 + 62, min_bytes=1)
    assert exact.owns(exact.empty((1000,), np.uint8))
    assert not short.owns(short.empty((1000,), np.uint8))


def test_room_is_made_from_the_least_recently_used_and_no_more():
    """To fit a new size, unused buffers are released least recently handed out first (a buffer reused moves to
    the end), and only as many as the request needs."""
    pool = BufferPool(capacity=(1000 + 63) + (2000 + 63), min_bytes=1)
    for n in (1000, 2000, 1000):  # (dropped at once: the 1000's buffer handed out again, after the 2000's)
        pool.empty((n,), np.uint8)
    kept = pool.empty((1500,), np.uint8)  # room for it: the 2000's buffer, the least recently used, goes
    assert pool.owns(kept) and pool.cached_bytes == (1000 + 63) + (1500 + 63)
    pool = BufferPool(capacity=(1000 + 63) + (2000 + 63) + (500 + 63), min_bytes=1)
    for n in (1000, 2000, 500):
        pool.empty((n,), np.uint8)
    kept = pool.empty((3063,), np.uint8)  # needs exactly the two oldest freed: the 500's stays
    assert pool.owns(kept) and pool.cached_bytes == (500 + 63) + (3063 + 63)


def test_clear_releases_only_unused_buffers():
    pool = BufferPool(capacity=2**20, min_bytes=1)
    kept = pool.empty((64,), np.float32)
    pool.empty((128,), np.float32)  # dropped at once
    assert pool.clear() == 128 * 4 + 63
    assert pool.owns(kept) and pool.cached_bytes == 64 * 4 + 63


def test_threads_never_share_a_buffer():
    pool = BufferPool(capacity=2**22, min_bytes=1)
    errors = []

    def work(tag: int) -> None:
        rng = np.random.default_rng(tag)
        mine = []
        for _ in range(300):
            a = pool.empty((int(rng.integers(1, 4)) * 64,), np.float64)
            a[...] = tag
            mine.append(a)
            if len(mine) > 3:
                mine.pop(int(rng.integers(0, len(mine))))
            if any(np.any(m != tag) for m in mine):
                errors.append(tag)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.parametrize(("value", "capacity"), [("0", 0), ("1.5", 3 * 2**19), (None, 1024 * 2**20)])
def test_capacity_in_the_environment(monkeypatch, value, capacity):
    """MINIGRAD_NORM_BUFFER_POOL_MIB in MiB (fractions too), 1024 unset, and 0 turns the pool off."""
    from minigrad_norm.kernels import buffers

    if value is None:
        monkeypatch.delenv("MINIGRAD_NORM_BUFFER_POOL_MIB", raising=False)
    else:
        monkeypatch.setenv("MINIGRAD_NORM_BUFFER_POOL_MIB", value)
    assert buffers._capacity_from_env() == capacity


@pytest.mark.parametrize("value", ["-1", "lots", "nan", "inf"])
def test_bad_capacity_in_the_environment_is_a_clear_error(monkeypatch, value):
    from minigrad_norm.kernels import buffers

    monkeypatch.setenv("MINIGRAD_NORM_BUFFER_POOL_MIB", value)
    with pytest.raises(ValueError, match="MINIGRAD_NORM_BUFFER_POOL_MIB"):
        buffers._capacity_from_env()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8])
@pytest.mark.parametrize("shape", [(0,), (1,), (3, 5), (7, 1, 9)])
def test_aligned_empty_is_a_writable_c_array_on_a_cache_line(shape, dtype):
    arrays = [aligned_empty(shape, dtype) for _ in range(8)]  # 8 allocations, not one lucky address
    for a in arrays:
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
        assert a.size == 0 or a.ctypes.data % 64 == 0  # (numpy does not advance an empty slice's pointer)
        a[...] = 3
    for a in arrays:
        assert np.all(a == 3)
