"""Streaming (non-temporal) stores against ordinary ones, by row length and by the alignment of ``out``.

    python benchmarks/streaming_stores.py [--views 65536x1x128x1 ...] [--dtype float32] [--threads N] [--rounds 25]

For each (N, G, K, S) view (LayerNorm rows by default), times the numba forward and
backward into preallocated ``out=`` buffers four ways, interleaved call by call: ordinary
stores and streaming stores, each into a buffer whose first element sits on a 64-byte
cache line boundary and into one 16 bytes past it (where ``np.empty`` puts a large
array: glibc's ``mmap``-ed blocks start 16 bytes into a page). Streaming is forced on or
off through the thresholds of ``numba_cpu._streams``; the sizes should be well past
``STREAMING_STORE_MIN_BYTES``, so that the output does not stay in the cache. Reports
median ms and the ratio to ordinary stores into the aligned buffer.

What it shows on the 2-core VM: a block of contiguous output that does not start and end
on a line boundary writes its first and last line with ordinary stores, and a line
shared by two blocks is written by both; for 128-value rows at offset 16 that made the
streaming forward 1.5x and the backward 1.5-1.6x as slow as ordinary stores, while with
aligned rows of 128-256 values the backward took 0.83-0.88 of the time (the forward,
which does less work per value, 1.14-1.21: it streams only blocks of 2 KiB or more).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numba
import numpy as np

from minigrad_norm import bench
from minigrad_norm.kernels import numba_cpu

EPS = 1e-5
VIEWS = ("131072x1x64x1", "65536x1x128x1", "32768x1x256x1", "8192x1x1024x1")
THRESHOLDS = ("STREAMING_STORE_MIN_BYTES", "STREAMING_STORE_MIN_BLOCK_BYTES", "STREAMING_STORE_MIN_ALIGNED_BLOCK_BYTES")


def buffer_at(shape: tuple[int, ...], dtype: np.dtype, offset: int) -> np.ndarray:
    """An uninitialised C-contiguous array whose data start ``offset`` bytes past a 64-byte boundary."""
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + 128, np.uint8)
    start = -raw.ctypes.data % 64 + offset
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--views", nargs="+", type=bench.view_spec, default=VIEWS, help=f"NxGxKxS (default {' '.join(VIEWS)})"
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"], help="(default float32)")
    parser.add_argument(
        "--threads", type=bench.thread_count, default=numba.config.NUMBA_NUM_THREADS, help="(default all of numba's)"
    )
    parser.add_argument("--rounds", type=bench.positive_int, default=25, help="timed calls per way (default 25)")
    args = parser.parse_args()
    numba.set_num_threads(args.threads)
    dtype = np.dtype(args.dtype)
    ways = [(offset, stream) for offset in (0, 16) for stream in (False, True)]
    print(f"{args.dtype}, {args.threads} threads; median ms (ratio to ordinary stores at offset 0)")
    print(f"{'view':>16} {'dir':>4}" + "".join(f"{f'+{o} ' + ('stream' if s else 'ordinary'):>22}" for o, s in ways))
    for view in args.views:
        shape = tuple(int(v) for v in view.split("x"))
        rng = np.random.default_rng(0)
        x, dy = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
        w, b = (rng.standard_normal(shape[1:3]).astype(dtype) for _ in range(2))
        _, mean, var = numba_cpu.norm_forward(x, w, b, EPS)
        rstd = 1 / np.sqrt(var + EPS)
        outs = {offset: (buffer_at(shape, dtype, offset), buffer_at(shape, dtype, offset)) for offset in (0, 16)}
        times = {(way, d): [] for way in ways for d in ("fwd", "bwd")}
        saved = [getattr(numba_cpu, name) for name in THRESHOLDS]
        try:
            for r in range(args.rounds + 1):
                for way in ways if r % 2 else ways[::-1]:
                    y, dx = outs[way[0]]
                    for name in THRESHOLDS:
                        setattr(numba_cpu, name, 0 if way[1] else 2**62)
                    t0 = time.perf_counter()
                    numba_cpu.norm_forward(x, w, b, EPS, out=y)
                    t1 = time.perf_counter()
                    numba_cpu.norm_backward(dy, x, mean, rstd, w, out=dx)
                    t2 = time.perf_counter()
                    if r:  # round 0 compiles and warms up
                        times[way, "fwd"].append(t1 - t0)
                        times[way, "bwd"].append(t2 - t1)
        finally:
            for name, value in zip(THRESHOLDS, saved):
                setattr(numba_cpu, name, value)
        for d in ("fwd", "bwd"):
            base = statistics.median(times[ways[0], d])
            cells = [statistics.median(times[way, d]) for way in ways]
            print(f"{view:>16} {d:>4}" + "".join(f"{1e3 * t:>14.2f} ({t / base:.2f})" for t in cells))


if __name__ == "__main__":
    main()
