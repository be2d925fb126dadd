"""The benchmark harness: the norm kernels against this machine's memory bandwidth and PyTorch.

Everything is timed side by side in one process, because the machine is shared
and noisy: a STREAM-style copy and triad (numba kernels, preallocated float64
arrays, 1 thread and all threads, ordinary stores: see ``_stream_kernels`` for why
not memcpy's) give the bandwidth limit; then for each norm,
shape, dtype and direction (forward, backward, forward+backward) the median time
over repeated runs of

    numpy        the NumPy reference kernels (``minigrad_norm.kernels.reference``)
    numba 1t     the numba kernels on one thread, preallocated outputs (``out=``)
    numba        the numba kernels on all threads, allocating their outputs (from the buffer
                 pool, ``minigrad_norm.kernels.buffers``, which recycles the memory of outputs
                 that are gone: the default path, as a user gets it)
    numba out=   the numba kernels on all threads, preallocated outputs (64-byte aligned by
                 ``aligned_empty``, as PyTorch aligns its tensors and the pool its buffers)
    torch 1t     PyTorch CPU eager on one thread (when torch is installed), allocating
    torch        PyTorch CPU eager on all threads, allocating
    copy x       a plain numba copy of x into a preallocated array, all threads (one where numba's
                 kernels run serially: ``plain_kernel_threads``): the bytes a forward moves, in the
                 same rounds, so in the same cache state as the kernels
    triad x      a plain numba triad out = x + 3 dy, the same way: the bytes a backward moves

Effective GB/s count the minimal bytes: forward reads x and writes y (2 |x|
bytes), backward reads x and dy and writes dx (3 |x|), forward+backward 5 |x|
(statistics and affine parameters are negligible). STREAM counts its bytes the
same way (copy 2 arrays, triad 3 arrays), so "% of copy/triad" compares like
with like. STREAM streams arrays of twice the L3, from DRAM; so that the kernels
are held to it on equal terms, every call on a listed shape is timed from cold
caches (``Stream.evict`` first: x and dy come from DRAM; ``--hot`` times them
in a loop on the same arrays instead), while the size sweep runs hot, to show
the caches at work. ``--shape`` times the user's own shapes instead of the listed
ones, in PyTorch's layout for each norm (``LAYOUTS``).

This VM's memory bandwidth moves with its neighbours' load, by up to 2x within a
minute (a STREAM copy timed before and after one row read 34 GB/s in one row and
79 in another of the same run), so STREAM's copy and triad are timed in every
row's rounds, beside the implementations: the bandwidth of the same moments. (Timed
before and after the row, STREAM could read one state of the machine and the
kernels another: in 30 interleaved rounds of LayerNorm 65536x128 float32, the
triad ran at 45-54 GB/s in the first 21 and at 70-98 in the last 9, while the
forward+backward stayed at 38-44 GB/s: 74-89 % of the triad, then 43-60 %, two
outlying rounds left out.) Each row also times plain kernels that move a
direction's bytes, in the same rounds: "copy x" (a forward's), "triad x" (a
backward's). "% plain x" is the time they take (both for forward+backward) over
the time of numba out=: the kernel against the same bytes moved by ordinary
loads and stores at the same moment and in the same cache state. (For an x under
DRAM_SIZED_BYTES their output can stay in the L3 through their call, while the
kernels stream big outputs to memory: there it flatters the plain kernels.)
The kernels are called at the ndarray level on each norm's 4-D view (see
``minigrad_norm.kernels.reference``), as the norm layers call them. Before the
first row, ``settle_allocator`` puts malloc in the state it keeps for the rest of
the run, so that the allocating implementations' times do not depend on the rows
timed before them.

    minigrad-norm bench [--quick] [--json PATH] [--markdown PATH] [--plot PATH] [--only NAME ...]
                        [--shape SHAPE ...] [--groups G] [--dtype DTYPE ...] [--hot]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import random
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from minigrad_norm import __version__
from minigrad_norm.kernels import reference
from minigrad_norm.kernels.buffers import aligned_empty
from minigrad_norm.kernels.machine import available_memory_bytes, cache_sizes, cpu_identity, l3_bytes, usable_cpus

EPS = 1e-5
DIRECTIONS = ("fwd", "bwd", "fwd+bwd")
BYTES_PER_X = {"fwd": 2, "bwd": 3, "fwd+bwd": 5}
# untimed calls before each timed one: enough to reach a steady state (see interleaved_times)
WARMUP_CALLS = 3
IMPLS = ("numpy", "numba 1t", "numba", "numba out=", "torch 1t", "torch", "copy x", "triad x")
QUICK_IMPLS = tuple(i for i in IMPLS if not i.endswith(" 1t"))  # (--quick: see run)
# the plain kernels each direction's bytes are compared with ("% plain x"), and the bytes each moves, per |x|
PLAIN = {"fwd": ("copy x",), "bwd": ("triad x",), "fwd+bwd": ("copy x", "triad x")}
PLAIN_BYTES_PER_X = {"copy x": 2, "triad x": 3}
# the STREAM kernels timed in every row's rounds, the bandwidth its "% copy" and "% triad" are fractions of
STREAM_KERNELS = ("copy", "triad")
DRAM_SIZED_BYTES = 16 * 2**20
# PyTorch's times on a row spread wider than this (interquartile range over the median, %): its ratio is unsteady
# (``_unsteady_torch``)
TORCH_UNSTEADY_SPREAD = 50.0
RESULTS_COMMAND = (
    "minigrad-norm bench --markdown benchmarks/RESULTS.md --json benchmarks/results.json --plot benchmarks/sweep.png"
)


@dataclasses.dataclass(frozen=True)
class Case:
    """One norm on one input shape: its (N, G, K, S) view and how PyTorch computes it."""

    norm: str
    shape: tuple[int, ...]
    view: tuple[int, int, int, int]
    centered: bool = True
    reduce_batch: bool = False
    has_bias: bool = True

    @property
    def label(self) -> str:
        return f"{self.norm} {tuple(self.shape)}"


def layer_norm_case(rows: int, d: int, rms: bool = False) -> Case:
    return Case("rms_norm" if rms else "layer_norm", (rows, d), (rows, 1, d, 1), centered=not rms, has_bias=not rms)


def channel_case(norm: str, shape: tuple[int, ...], groups: int | None = None) -> Case:
    """A norm over the channels of an (N, C, *) input: view (N, G, C // G, S), S the product of the trailing
    dims (1 for BatchNorm1d on (N, C), whose runs of one value take kernels of their own)."""
    n, c = shape[:2]
    g = groups or c
    return Case(norm, shape, (n, g, c // g, math.prod(shape[2:])), reduce_batch=norm.startswith("batch_norm"))


# the input layouts ``bench --shape`` takes, PyTorch's: norm -> (the numbers of dims it takes, its layout in words)
LAYOUTS: dict[str, tuple[range, str]] = {
    "layer_norm": (range(1, 33), "(*, D), normalized over the last dim D"),
    "rms_norm": (range(1, 33), "(*, D), normalized over the last dim D"),
    "batch_norm2d": (range(4, 5), "(N, C, H, W)"),
    "instance_norm2d": (range(4, 5), "(N, C, H, W)"),
    "group_norm": (range(2, 33), "(N, C, *)"),
    "batch_norm1d": (range(2, 4), "(N, C) or (N, C, L)"),
}
DEFAULT_GROUPS = 8


def parse_shape(text: str) -> tuple[int, ...]:
    """``"32x64x56x56"`` -> (32, 64, 56, 56): ``bench --shape``'s sizes joined by 'x'."""
    if not re.fullmatch(r"\d+(x\d+)*", text):
        raise ValueError(f"--shape {text}: expected sizes joined by 'x', e.g. 8192x1024 or 32x64x56x56")
    return tuple(int(d) for d in text.split("x"))


def shape_case(norm: str, shape: tuple[int, ...], groups: int = DEFAULT_GROUPS) -> Case:
    """``norm`` on an input of ``shape`` in PyTorch's layout (``LAYOUTS``; GroupNorm with ``groups`` groups), or a
    ValueError that says what the norm takes. Training-mode statistics need more than one value each, as in
    PyTorch: BatchNorm's per channel over the batch, InstanceNorm's per map (GroupNorm's groups may hold one
    value, as PyTorch's: y is then the bias)."""
    text = "x".join(map(str, shape))
    dims, layout = LAYOUTS[norm]
    if len(shape) not in dims:
        raise ValueError(f"--shape {text}: {norm} takes {layout}; choose the norms with --only")
    if min(shape) < 1:
        raise ValueError(f"--shape {text}: every size must be at least 1")
    if norm in ("layer_norm", "rms_norm"):
        case = layer_norm_case(math.prod(shape[:-1]), shape[-1], rms=norm == "rms_norm")
        return dataclasses.replace(case, shape=shape)
    if norm == "group_norm" and shape[1] % groups:
        raise ValueError(f"--shape {text}: group_norm's {groups} groups (--groups) must divide C = {shape[1]}")
    case = channel_case(norm, shape, groups if norm == "group_norm" else None)
    n, _, k, s = case.view
    if norm != "group_norm" and (n * k * s if case.reduce_batch else k * s) == 1:
        raise ValueError(f"--shape {text}: {norm} needs more than one value per statistic in training, as PyTorch")
    return case


def _takes(norm: str, shape: tuple[int, ...], groups: int) -> bool:
    """Whether ``shape_case`` takes ``norm`` on ``shape``."""
    try:
        shape_case(norm, shape, groups)
    except ValueError:
        return False
    return True


def listed_cases() -> list[Case]:
    """The shapes of issue 4; BatchNorm1d on (N, C), whose runs of one value take kernels of their own; and
    InstanceNorm and GroupNorm on 4x4 maps, whose blocks of short runs go through the row loops (runs of 64
    bytes in float32: see ``numba_cpu._as_rows``)."""
    rows = [(8192, 1024), (65536, 128), (512, 4096), (4096, 768)]
    image = (32, 64, 56, 56)
    small_maps = (4096, 64, 4, 4)
    return [
        *(layer_norm_case(r, d) for r, d in rows),
        *(layer_norm_case(r, d, rms=True) for r, d in rows),
        channel_case("batch_norm2d", image),
        channel_case("instance_norm2d", image),
        channel_case("group_norm", image, groups=8),
        channel_case("batch_norm1d", (8192, 1024)),
        channel_case("instance_norm2d", small_maps),
        channel_case("group_norm", small_maps, groups=8),
    ]


def quick_cases() -> list[Case]:
    """One shape per norm, smaller images: a smoke-level run under a minute."""
    image = (8, 64, 56, 56)
    return [
        layer_norm_case(4096, 768),
        layer_norm_case(4096, 768, rms=True),
        channel_case("batch_norm2d", image),
        channel_case("instance_norm2d", image),
        channel_case("group_norm", image, groups=8),
        channel_case("batch_norm1d", (4096, 768)),
    ]


def sweep_cases(quick: bool) -> list[Case]:
    """LayerNorm over D = 1024 from L2-resident (64 rows, 256 KiB in float32) to DRAM-sized."""
    top = 12 if quick else 15
    return [layer_norm_case(2**e, 1024) for e in range(6, top + 1)]


# ---------------------------------------------------------------------------
# timing

# Just under glibc's largest dynamic mmap threshold (32 MiB on 64-bit): see settle_allocator.
SETTLE_BYTES = 31 * 2**20


def settle_allocator() -> None:
    """Free a block of SETTLE_BYTES from malloc, so that every row is timed in the allocator state that a
    process keeps once it has freed any array of that size, not in whatever state the rows before left.

    glibc serves a block above its mmap threshold (128 KiB at first) with fresh pages, and on freeing such a
    block raises the threshold to its size (at most 32 MiB) and the heap's trim threshold to twice that. Below
    the trim threshold, memory freed at the top of the heap stays for the next call; above it, it goes back to
    the kernel, and the next call faults it in again, page by page. So the time of an implementation that
    allocates (the NumPy reference, PyTorch) depended on the largest block freed before it in the process:
    a fresh process ran the float32 NumPy reference LayerNorm fwd+bwd of (256, 1024) in 10.1 ms, 2272 page
    faults a call (its float64 temporaries of 2 MiB grew the heap and were trimmed back each call), and in
    2.5 ms without a fault after one free of SETTLE_BYTES; (64, 1024): 3.6 and 0.57 ms. In a run, a row's
    NumPy time had hung on the rows timed before it, PyTorch's calls among them. Blocks of 32 MiB or more
    still come fresh each time (``benchmarks/allocation.py`` times that cost). Other C libraries do not
    work this way; there the free changes nothing."""
    block = np.empty(SETTLE_BYTES, np.uint8)
    del block


def median_time(fn: Callable[[], Any], min_repeats: int, budget_s: float) -> float:
    """Median wall time of ``fn`` after one warm-up call: at least ``min_repeats`` runs, more
    while within ``budget_s`` (at most 100)."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_repeats or (time.perf_counter() - start < budget_s and len(times) < 100):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


class Threads:
    """Runs a block with numba (and torch, when present) on ``n`` threads."""

    def __init__(self, n: int, torch: Any = None):
        self.n, self.torch = n, torch

    def __enter__(self) -> None:
        import numba

        self.saved = numba.get_num_threads(), self.torch.get_num_threads() if self.torch else None
        numba.set_num_threads(self.n)
        if self.torch:
            self.torch.set_num_threads(self.n)

    def __exit__(self, *exc: object) -> None:
        import numba

        numba.set_num_threads(self.saved[0])
        if self.torch:
            self.torch.set_num_threads(self.saved[1])


# ---------------------------------------------------------------------------
# STREAM


def _stream_kernels() -> tuple[Callable, Callable, Callable, Callable]:
    """copy and triad with ordinary stores, as the kernels write all but big outputs; memcpy; and a read of every
    cache line of an array, which writes nothing (``Stream.evict``).

    Written as ``c[i] = a[i]``, a copy loop is replaced by LLVM with a call to ``memcpy``, and
    glibc's memcpy switches to non-temporal stores above a size threshold: those skip the
    read-for-ownership of each destination line, so the copy moves 2 bytes over the memory bus for
    each 2 it counts, where an ordinary store moves 3 (copy) or 4 for 3 (triad). On the 2-core Intel VM
    with 1 GiB arrays, memcpy ran at 49.6 GB/s, the ordinary copy at 28.0 and the triad at 31.7: a
    kernel writing its output with ordinary stores was being held to a rate it cannot reach. On
    the AMD Zen 4 VM memcpy is the slowest of the three: 29, 35 and 34 GB/s. (The
    kernels stream large outputs, ``numba_cpu.STREAMING_STORE_MIN_BYTES`` or more, and can then beat
    the ordinary copy.)
    ``+ 0.0`` keeps the loop (x + 0.0 is not x for x = -0.0, so LLVM cannot drop the add)."""
    import numba

    @numba.njit(parallel=True, cache=True)
    def stream_copy(a, c):
        for i in numba.prange(a.shape[0]):
            c[i] = a[i] + 0.0

    @numba.njit(parallel=True, cache=True)
    def stream_triad(a, b, c, s):
        for i in numba.prange(a.shape[0]):
            a[i] = b[i] + s * c[i]

    @numba.njit(parallel=True, cache=True)
    def stream_memcpy(a, c):
        for i in numba.prange(a.shape[0]):
            c[i] = a[i]

    @numba.njit(parallel=True, cache=True)
    def touch_lines(a):
        # one value of every 64-byte line, which the cache fetches whole: summing every value, each thread's chain
        # of dependent adds (4 cycles each) held a float64 array to 11 GB/s on two threads, 600 MiB in 57 ms
        # (the Intel VM); one a line, 28 ms, and a 64 MiB array read after either took the same time
        s = 0.0
        for i in numba.prange(a.shape[0] // 8):
            s += a[8 * i]
        return s

    return stream_copy, stream_triad, stream_memcpy, touch_lines


class Stream:
    """STREAM copy (c = a) and triad (a = b + s c), with ordinary stores, on float64 arrays of twice
    the L3 size each (once with --quick): allocated and faulted in once, then timed whenever asked.
    "memcpy" is the copy done by memcpy (non-temporal stores at these sizes), reported beside them.
    ``evict`` reads twice the L3 size of them, which leaves nothing else in the caches."""

    def __init__(self, quick: bool):
        n = max(2**22 if quick else 2**23, (1 if quick else 2) * l3_bytes() // 8)
        self.copy_kernel, self.triad_kernel, memcpy_kernel, self.touch_kernel = _stream_kernels()
        self.a, self.b, self.c = np.ones(n), np.full(n, 2.0), np.zeros(n)
        self.bytes = {"copy": 2 * self.a.nbytes, "triad": 3 * self.a.nbytes, "memcpy": 2 * self.a.nbytes}
        self.kernels = {
            "copy": lambda: self.copy_kernel(self.a, self.c),
            "triad": lambda: self.triad_kernel(self.a, self.b, self.c, 3.0),
            "memcpy": lambda: memcpy_kernel(self.a, self.c),
        }
        # b, which STREAM only reads (a is the triad's output): no dirty lines to write back
        self.evicting = (self.b,) if self.b.nbytes >= 2 * l3_bytes() else (self.b, self.a)

    def evict(self) -> None:
        """Empty the caches of anything but STREAM's arrays, whose lines are clean (read, not written): the
        next call finds its data in DRAM, and no dirty lines of earlier calls to write back. On all of numba's
        threads, whatever the caller has set (and then set back): on one, 600 MiB took 44 ms against 28."""
        import numba

        with Threads(numba.config.NUMBA_NUM_THREADS):
            for a in self.evicting:
                self.touch_kernel(a)

    def measure(
        self, n_threads: Sequence[int], budget_s: float, names: Sequence[str] = ("copy", "triad")
    ) -> dict[str, float]:
        """GB/s of each named kernel on each thread count."""
        out = {}
        for t in n_threads:
            for name in names:
                with Threads(t):
                    out[f"{name} {t}t"] = self.bytes[name] / median_time(self.kernels[name], 3, budget_s) / 1e9
        return out


# ---------------------------------------------------------------------------
# the runners: one closure per (implementation, direction)


@dataclasses.dataclass
class Problem:
    """The arrays of one timed case, made once and reused by every implementation."""

    case: Case
    dtype: np.dtype
    x: np.ndarray
    dy: np.ndarray
    weight: np.ndarray
    bias: np.ndarray | None
    mean: np.ndarray
    rstd: np.ndarray

    @classmethod
    def make(cls, case: Case, dtype: np.dtype, seed: int = 0) -> Problem:
        rng = np.random.default_rng(seed)
        x = rng.standard_normal(case.view, dtype=np.float32).astype(dtype)
        dy = rng.standard_normal(case.view, dtype=np.float32).astype(dtype)
        weight = (1 + 0.1 * rng.standard_normal(case.view[1:3])).astype(dtype)
        bias = (0.1 * rng.standard_normal(case.view[1:3])).astype(dtype) if case.has_bias else None
        _, mean, var = reference.norm_forward(
            x, weight, bias, EPS, centered=case.centered, reduce_batch=case.reduce_batch
        )
        return cls(case, np.dtype(dtype), x, dy, weight, bias, mean, reference.rstd(var, EPS))


def kernel_runner(kernels: Any, p: Problem, direction: str, preallocated: bool) -> Callable[[], Any]:
    """Forward/backward of ``kernels`` (a kernel module) on the problem's 4-D view."""
    opts = dict(centered=p.case.centered, reduce_batch=p.case.reduce_batch)
    y_out = aligned_empty(p.x.shape, p.x.dtype) if preallocated else None
    dx_out = aligned_empty(p.x.shape, p.x.dtype) if preallocated else None

    def fwd() -> Any:
        return kernels.norm_forward(p.x, p.weight, p.bias, EPS, out=y_out, **opts)

    def bwd(mean: np.ndarray = p.mean, rstd: np.ndarray = p.rstd) -> Any:
        return kernels.norm_backward(p.dy, p.x, mean, rstd, p.weight, out=dx_out, **opts)

    def fwd_bwd() -> Any:
        _, mean, var = fwd()
        return bwd(mean, kernels.rstd(var, EPS))

    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd_bwd}[direction]


def torch_runner(torch: Any, p: Problem, direction: str) -> Callable[[], Any]:
    """PyTorch CPU eager on the norm's natural layout (its default, allocating path)."""
    F = torch.nn.functional
    case = p.case
    x = torch.from_numpy(np.ascontiguousarray(p.x).reshape(case.shape))
    dy = torch.from_numpy(np.ascontiguousarray(p.dy).reshape(case.shape))
    w = torch.from_numpy(p.weight.reshape(-1))
    b = torch.from_numpy(p.bias.reshape(-1)) if p.bias is not None else None
    d = case.shape[-1]

    def batch_norm(x: Any, w: Any, b: Any) -> Any:
        return F.batch_norm(x, None, None, w, b, training=True, eps=EPS)

    op = {
        "layer_norm": lambda x, w, b: F.layer_norm(x, (d,), w, b, EPS),
        "rms_norm": lambda x, w, b: F.rms_norm(x, (d,), w, EPS),
        "batch_norm2d": batch_norm,
        "batch_norm1d": batch_norm,
        "instance_norm2d": lambda x, w, b: F.instance_norm(x, weight=w, bias=b, eps=EPS),
        "group_norm": lambda x, w, b: F.group_norm(x, case.view[1], w, b, EPS),
    }[case.norm]
    leaves = [t.requires_grad_(direction != "fwd") for t in (x, w, b) if t is not None]

    def fwd() -> Any:
        with torch.no_grad():
            return op(x, w, b)

    graph = op(x, w, b) if direction == "bwd" else None

    def bwd() -> Any:
        return torch.autograd.grad(graph, leaves, dy, retain_graph=True)

    def fwd_bwd() -> Any:
        return torch.autograd.grad(op(x, w, b), leaves, dy)

    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd_bwd}[direction]


# ---------------------------------------------------------------------------
# the run


@dataclasses.dataclass
class Row:
    norm: str
    shape: tuple[int, ...]
    dtype: str
    direction: str
    bytes: int
    ms: dict[str, float]  # implementation -> median milliseconds
    stream: dict[str, float]  # STREAM copy and triad GB/s (all threads), timed in this row's rounds
    cold: bool = True  # each call timed from empty caches (else hot, in a loop)
    quartiles: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)  # impl -> (p25, p75) ms

    def spread(self, impl: str) -> float | None:
        """The interquartile range of an implementation's times over its median, in percent."""
        q, t = self.quartiles.get(impl), self.ms.get(impl)
        return None if q is None or t is None else 100 * (q[1] - q[0]) / t

    def gbps(self, impl: str) -> float | None:
        t = self.ms.get(impl)
        if t is None:
            return None
        # the plain kernels move the same bytes whatever the direction
        per_x = PLAIN_BYTES_PER_X.get(impl, BYTES_PER_X[self.direction])
        moved = per_x * self.bytes // BYTES_PER_X[self.direction]
        return moved / (t * 1e-3) / 1e9


def machine_description() -> dict[str, Any]:
    import llvmlite.binding
    import numba

    from minigrad_norm.kernels import numba_cpu

    info = {
        "cpu": platform.processor() or platform.machine(),
        **cpu_identity(),
        # the CPU LLVM compiles the kernels for: it picks their vector width and instructions
        "llvm_cpu": llvmlite.binding.get_host_cpu_name(),
        "cores": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "caches": cache_sizes(),
        "l3_bytes": l3_bytes(),
        "streaming_store_min_bytes": numba_cpu.STREAMING_STORE_MIN_BYTES,
        "numba_threads": numba.config.NUMBA_NUM_THREADS,
        # the layer the run's parallel kernels ran on (the one asked for, if none ran)
        "threading_layer": numba_cpu.threading_layer()
        or os.environ.get("NUMBA_THREADING_LAYER", numba.config.THREADING_LAYER),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
        # (GNU OpenMP's spin count, where set, overrides the policy's: see minigrad_norm.backend)
        **({"gomp_spincount": os.environ["GOMP_SPINCOUNT"]} if "GOMP_SPINCOUNT" in os.environ else {}),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "minigrad_norm": __version__,
        # (they change the allocating path's times: the buffer pool's size, and which backend the Tensor API takes)
        "buffer_pool_mib": os.environ.get("MINIGRAD_NORM_BUFFER_POOL_MIB", "(unset)"),
        "backend": os.environ.get("MINIGRAD_NORM_BACKEND", "(unset)"),
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    torch = _torch()
    info["torch"] = torch.__version__ if torch else None
    return info


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def interleaved_medians(
    plan: dict[str, tuple[int, Callable[[], Any]]], torch: Any, min_rounds: int, budget_s: float, **options: Any
) -> dict[str, float]:
    """Median seconds per implementation, timed by ``interleaved_times`` (with its ``options``)."""
    times = interleaved_times(plan, torch, min_rounds, budget_s, **options)
    return {name: statistics.median(v) for name, v in times.items()}


def interleaved_times(
    plan: dict[str, tuple[int, Callable[[], Any]]],
    torch: Any,
    min_rounds: int,
    budget_s: float,
    warmup_calls: int = 1,
    before_timed: Callable[[], Any] | None = None,
    one_warmup: Sequence[str] = (),
) -> dict[str, list[float]]:
    """Seconds of every timed call per implementation, timed in rounds (one timed call of each per round, each on its
    own thread count) so that a change in the machine's load hits all of them alike.

    Each timed call comes right after ``warmup_calls`` untimed calls of the same implementation, so that
    it runs in its own steady state (its thread pool awake, its memory where its own last call left it),
    as in a loop that repeats it, not in the state the previous implementation left behind. Timed right
    after the other library, a LayerNorm 64x1024 float32 fwd+bwd took PyTorch 0.155 ms instead of 0.091
    (after numba's copy), and numba 0.124 ms instead of 0.096 (after PyTorch). One untimed call is not
    always enough: after PyTorch's allocating calls have churned through fresh pages, numba's float32
    BatchNorm 32x64x56x56 fwd+bwd took 1.25x its steady time on the first call, 1.15x on the second,
    and was steady from about the fourth; a float64 LayerNorm 512x4096 fwd+bwd (64 MiB of arrays, which
    the Intel VM's L3 of 260 MiB held across calls) took 3.9 ms after one untimed call and 2.7 ms after
    three.

    The order of the implementations is shuffled every round (with a fixed seed), so that none always
    follows the same one: in a fixed order the one after a 1-thread implementation was timed 5-19 %
    slower than its twin elsewhere in the round (numba allocating vs ``out=``, identical work).

    ``before_timed`` (untimed) runs between the warm-up calls and the timed one: ``Stream.evict``, for
    a timing from cold caches. The implementations named in ``one_warmup`` get one untimed call: the NumPy
    reference, which is slow and has no thread pool or compiled state to settle."""
    import numba

    def on_threads(n: int) -> None:
        numba.set_num_threads(n)
        if torch is not None:
            torch.set_num_threads(n)

    saved = numba.get_num_threads(), torch.get_num_threads() if torch is not None else None
    times: dict[str, list[float]] = {name: [] for name in plan}
    order, shuffle = list(plan), random.Random(0).shuffle
    try:
        start = time.perf_counter()
        rounds = 0
        while rounds < min_rounds or (time.perf_counter() - start < budget_s and rounds < 100):
            shuffle(order)
            for name in order:
                threads, fn = plan[name]
                on_threads(threads)
                for _ in range(1 if name in one_warmup else warmup_calls):
                    fn()
                if before_timed is not None:
                    before_timed()
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
            rounds += 1
    finally:
        numba.set_num_threads(saved[0])
        if torch is not None:
            torch.set_num_threads(saved[1])
    return times


def plain_kernel_threads(size: int, all_threads: int) -> int:
    """The threads the plain kernels (copy x, triad x) run on for an x of ``size`` elements: one where numba's
    kernels run their serial compile (fewer than ``numba_cpu.PARALLEL_MIN_ELEMENTS`` elements), else all, so
    that both move the bytes the same way. On all threads a parallel launch costs tens of microseconds: a copy of
    65536 float32 values took 58 us on two threads and 6 on one. The float32 LayerNorm fwd+bwd of the sweep's two
    smallest rows, 64 and 128 rows of 1024 values, read 82 and 64 % of plain kernels on two threads, and 16 and 21 %
    of plain kernels on one (hot, one run each)."""
    from minigrad_norm.kernels import numba_cpu

    return 1 if size < numba_cpu.PARALLEL_MIN_ELEMENTS else all_threads


def time_case(
    p: Problem,
    direction: str,
    torch: Any,
    stream: Stream,
    all_threads: int,
    quick: bool,
    impls: Sequence[str],
    cold: bool = True,
) -> Row:
    """One row: every implementation, and STREAM copy and triad on all threads, interleaved round by round
    (the bandwidth and the other implementations of the same moments: the machine is shared). ``cold``:
    each timed call starts from empty caches (``Stream.evict``), so that x and dy come from DRAM, as the
    bandwidth fractions assume; else each runs hot, as in a loop that repeats it on the same arrays."""
    from minigrad_norm.kernels import numba_cpu

    # (--quick: two rounds, the median their mean; with three a --quick run took 58 s instead of 42 on the Intel VM,
    # whose evictions read 600 MiB each: see run)
    reps, budget = (2, 0.05) if quick else (7, 1.5)
    x_flat, dy_flat, plain_out = p.x.reshape(-1), p.dy.reshape(-1), np.empty(p.x.size, p.x.dtype)
    plain_threads = plain_kernel_threads(p.x.size, all_threads)
    plan: dict[str, tuple[int, Callable[[], Any]]] = {
        "numba 1t": (1, kernel_runner(numba_cpu, p, direction, True)),
        "numba": (all_threads, kernel_runner(numba_cpu, p, direction, False)),
        "numba out=": (all_threads, kernel_runner(numba_cpu, p, direction, True)),
        "copy x": (plain_threads, lambda: stream.copy_kernel(x_flat, plain_out)),
        "triad x": (plain_threads, lambda: stream.triad_kernel(plain_out, x_flat, dy_flat, 3.0)),
    }
    if torch is not None:
        plan["torch 1t"] = (1, torch_runner(torch, p, direction))
        plan["torch"] = (all_threads, torch_runner(torch, p, direction))
    plan["numpy"] = (1, kernel_runner(reference, p, direction, False))
    plan = {k: v for k, v in plan.items() if k in impls}
    for name in STREAM_KERNELS:
        plan[f"STREAM {name}"] = (all_threads, stream.kernels[name])
    evict = stream.evict if cold else None
    # (the NumPy reference and STREAM's kernels, slow or on arrays far beyond the caches, with no allocator churn or
    # cached state to settle, one untimed call each: STREAM's on twice the L3, 60-80 ms a call on the Intel VM)
    one_warmup = ("numpy", *(f"STREAM {name}" for name in STREAM_KERNELS))
    times = interleaved_times(plan, torch, reps, budget, WARMUP_CALLS, evict, one_warmup=one_warmup)
    cuts = {impl: [1e3 * q for q in statistics.quantiles(t, n=4, method="inclusive")] for impl, t in times.items()}
    ms = {impl: c[1] for impl, c in cuts.items()}  # the medians
    bandwidth = {name: stream.bytes[name] / (1e-3 * ms.pop(f"STREAM {name}")) / 1e9 for name in STREAM_KERNELS}
    quartiles = {impl: (cuts[impl][0], cuts[impl][2]) for impl in ms}
    nbytes = BYTES_PER_X[direction] * p.x.nbytes
    return Row(p.case.norm, p.case.shape, p.dtype.name, direction, nbytes, ms, bandwidth, cold, quartiles)


# A user's first call: one float32 LayerNorm forward+backward of (4096, 768) through the Tensor API.
FIRST_LAYER_NORM_SCRIPT = (
    "import numpy as np, minigrad_norm as mg\n"
    "from minigrad_norm.norms import layer_norm\n"
    "x = mg.Tensor(np.random.default_rng(0).standard_normal((4096, 768), dtype=np.float32), requires_grad=True)\n"
    "w = mg.Tensor(np.ones(768, np.float32), requires_grad=True)\n"
    "layer_norm(x, 768, w).sum().backward()\n"
)
EVERY_KERNEL_SCRIPT = "from minigrad_norm.kernels.numba_cpu import compile_every_kernel\ncompile_every_kernel()\n"


def startup_seconds(cold: bool, every_kernel: bool = False) -> float:
    """Wall time of a fresh process that imports minigrad_norm and runs ``FIRST_LAYER_NORM_SCRIPT`` (with
    ``every_kernel``, ``numba_cpu.compile_every_kernel`` instead): on numba's own cache as a first such
    process left it, or with ``cold`` on an empty one, so that it compiles what it runs. (Warm on a cache of
    its own, the first process compiled the LayerNorm's kernels again: 12 s of a 28 s --quick run.)"""
    script = EVERY_KERNEL_SCRIPT if every_kernel else FIRST_LAYER_NORM_SCRIPT

    def timed(env: dict[str, str]) -> float:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", script], check=True, env=env)
        return time.perf_counter() - t

    # the numba kernels' start-up, whatever backend this process's environment asks for
    env = dict(os.environ, MINIGRAD_NORM_BACKEND="numba")
    if cold:
        with tempfile.TemporaryDirectory() as empty:
            return timed(dict(env, NUMBA_CACHE_DIR=empty))
    timed(env)  # a first process, which leaves the cache warm
    return timed(env)


def _processes() -> str:
    """How many processes ``numba_cpu.compile_every_kernel`` compiles in here, in words."""
    n = usable_cpus()
    return f"{n} processes at once" if n > 1 else "1 process"


@dataclasses.dataclass
class Report:
    machine: dict[str, Any]
    stream: dict[str, float]
    rows: list[Row]
    sweep: list[Row]
    startup: dict[str, float]
    quick: bool
    seconds: float = 0.0
    command: str = RESULTS_COMMAND  # what made it

    def to_json(self) -> dict[str, Any]:
        return {"units": JSON_UNITS, **dataclasses.asdict(self)}


#: what the numbers of ``Report.to_json`` count in
JSON_UNITS = {
    "stream": "GB/s; each key names its kernel and its threads ('copy 2t': STREAM copy on 2 threads)",
    "rows.bytes": "bytes: the minimal traffic (forward x and y, backward x, dy and dx)",
    "rows.ms": "milliseconds, the median per implementation",
    "rows.quartiles": "milliseconds, the 25th and 75th percentiles",
    "rows.stream": "GB/s, STREAM copy and triad timed in the row's own rounds",
    "startup": "seconds, as each key says",
    "seconds": "seconds, the whole run",
    "command": "the command that made the report",
}


def run(
    quick: bool = False,
    cases: Sequence[Case] | None = None,
    sweep: Sequence[Case] | None = None,
    dtypes: Sequence[str] | None = None,
    impls: Sequence[str] | None = None,
    startup: bool = True,
    progress: bool = True,
    compile_first: bool = False,
    cold: bool = True,
) -> Report:
    """Run the whole benchmark (``quick``: float32 only, fewer shapes and repeats, and unless ``impls`` says
    otherwise no one-thread columns: under a minute. Each timed call from cold caches reads twice the L3 size
    first, 600 MiB on the Intel VM, which reports 300 MiB: there, with the one-thread columns, a --quick run took
    61 s, without them 58, in two rounds 42; before the evictions ran on every thread and STREAM's kernels took one
    untimed call, 90.)

    ``cold``: the cases (not the sweep, always hot) are timed from cold caches (see ``time_case``).

    ``compile_first``: compile every kernel for the run's dtypes before anything is timed
    (``numba_cpu.compile_every_kernel``: in as many processes at once as there are usable CPUs), rather
    than one at a time by the first calls. On the 2-core AMD Zen 4 VM with an empty numba cache, the
    --quick run took 69 s the first way; in 2 processes its float32 kernels compile in 25 s, and load
    from a warm cache in 2.5 s."""
    import numba
    from tqdm import tqdm

    t0 = time.perf_counter()
    times = {}
    impls = impls or (QUICK_IMPLS if quick else IMPLS)
    torch = _torch() if any(i.startswith("torch") for i in impls) else None
    all_threads = numba.config.NUMBA_NUM_THREADS
    if cases is None:
        cases = quick_cases() if quick else listed_cases()
    if sweep is None:
        sweep = sweep_cases(quick)
    dtypes = dtypes or (("float32",) if quick else ("float32", "float64"))
    if compile_first:
        from minigrad_norm.kernels import numba_cpu

        # (the size sweep runs float32)
        compiled = [d for d in ("float32", "float64") if d in dtypes or (d == "float32" and sweep)]
        t = time.perf_counter()
        numba_cpu.compile_every_kernel(compiled, progress=progress)
        label = f"compile (or load from the cache) of every kernel for {' and '.join(compiled)}, before the timings"
        times[f"{label}, {_processes()}, wall time (s)"] = time.perf_counter() - t
    jobs = [(c, d, direction, False) for c in cases for d in dtypes for direction in DIRECTIONS]
    jobs += [(c, "float32", "fwd+bwd", True) for c in sweep]
    settle_allocator()
    stream = Stream(quick)
    bandwidth = stream.measure(sorted({1, all_threads}), 0.3 if quick else 1.0, ("copy", "triad", "memcpy"))
    rows: list[Row] = []
    sweep_rows: list[Row] = []
    problem: Problem | None = None
    for case, dtype, direction, in_sweep in tqdm(jobs, desc="bench", unit="case", disable=not progress):
        if problem is None or problem.case != case or problem.dtype != np.dtype(dtype):
            problem = None  # free the previous arrays first
            problem = Problem.make(case, np.dtype(dtype))
        sweep_impls = [i for i in impls if i in ("numpy", "numba", "numba out=", "torch", "copy x", "triad x")]
        timed = sweep_impls if in_sweep else impls
        row = time_case(problem, direction, torch, stream, all_threads, quick, timed, cold and not in_sweep)
        (sweep_rows if in_sweep else rows).append(row)
    if startup:
        times["warm first LayerNorm fwd+bwd, process wall time (s)"] = startup_seconds(cold=False)
        if not quick:
            first = "cold first LayerNorm fwd+bwd, compiling its kernels, process wall time (s)"
            times[first] = startup_seconds(cold=True)
            every = f"cold compile of every kernel, both dtypes, {_processes()}, wall time (s)"
            times[every] = startup_seconds(cold=True, every_kernel=True)
    return Report(machine_description(), bandwidth, rows, sweep_rows, times, quick, time.perf_counter() - t0)


# ---------------------------------------------------------------------------
# reports


def _f(v: float | None, fmt: str = ".2f") -> str:
    return "-" if v is None or not math.isfinite(v) else format(v, fmt)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def _percent(row: Row, impl: str, stream: str) -> float | None:
    """GB/s of ``impl`` as a percentage of the STREAM kernel timed alongside this row."""
    gbps = row.gbps(impl)
    return None if gbps is None else 100 * gbps / row.stream[stream]


def _plain_percent(row: Row) -> float | None:
    """The time the plain kernels moving the row's bytes took (copy x, triad x, or both: ``PLAIN``), timed
    in the same rounds, as a percentage of the time numba out= took."""
    times = [row.ms.get(impl) for impl in (*PLAIN[row.direction], "numba out=")]
    return None if None in times else 100 * sum(times[:-1]) / times[-1]


def format_table(report: Report, markdown: bool = False) -> str:
    """The results as two tables of the same rows, each narrow enough for a terminal: the median times of every
    implementation (ms) and the spread of numba out='s; then numba out='s GB/s, its fraction of STREAM and of the
    plain kernels, and the ratios."""
    rows = report.rows + report.sweep
    key = [[r.norm, "x".join(map(str, r.shape)), r.dtype, r.direction] for r in rows]
    times = [[_f(r.ms.get(i), ".3g") for i in IMPLS] + [_f(r.spread("numba out="), ".0f")] for r in rows]
    rates = [
        [
            _f(r.stream["copy"], ".1f"),
            _f(r.gbps("numba out="), ".1f"),
            _f(_percent(r, "numba out=", "copy"), ".0f"),
            _f(_percent(r, "numba out=", "triad"), ".0f"),
            _f(_plain_percent(r), ".0f"),
            _f(_ratio(r.ms.get("numpy"), r.ms.get("numba out=")), ".1f"),
            _f(_ratio(r.ms.get("torch"), r.ms.get("numba")), ".1f"),
        ]
        for r in rows
    ]
    head = ["norm", "shape", "dtype", "dir"]
    rates_head = ["copy GB/s", "out= GB/s", "% copy", "% triad", "% plain x", "x numpy", "x torch"]
    return "\n\n".join(
        [
            "Median ms per call:",
            _table(head + list(IMPLS) + ["out= IQR %"], [k + t for k, t in zip(key, times)], markdown),
            "numba out='s rate, and the ratios:",
            _table(head + rates_head, [k + r for k, r in zip(key, rates)], markdown),
        ]
    )


def _table(head: list[str], lines: list[list[str]], markdown: bool) -> str:
    """``lines`` under ``head``, right-aligned columns, as text or as a markdown table."""
    widths = [max(len(str(c)) for c in col) for col in zip(head, *lines)]
    sep = " | " if markdown else "  "
    fmt_line = (
        (lambda cells: "| " + sep.join(c.rjust(w) for c, w in zip(cells, widths)) + " |")
        if markdown
        else (lambda cells: sep.join(c.rjust(w) for c, w in zip(cells, widths)))
    )
    out = [fmt_line(head)]
    out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|" if markdown else "-" * len(out[0]))
    out += [fmt_line(cells) for cells in lines]
    return "\n".join(out)


# BatchNorm with its channels strided across the rows (BatchNorm1d on (N, C)): its training statistics need
# the whole batch before the first output, and a batch bigger than the caches is read again from DRAM
TWO_PASS_NORMS = ("batch_norm1d",)


def _two_pass_note(fb: list[Row], fwd: list[Row]) -> list[str]:
    """The fractions of the summary without the norms that must read x twice at DRAM sizes, and their ceiling:
    forward 2R+1W where the minimal bytes are 1R+1W (2/3), forward+backward 2R+1W + 4R+1W (x, dy twice)
    where they are 5 (5/8)."""
    if not any(r.norm in TWO_PASS_NORMS for r in fb + fwd):
        return []
    fb_rest = [_percent(r, "numba out=", "triad") for r in fb if r.norm not in TWO_PASS_NORMS]
    fwd_rest = [_percent(r, "numba out=", "copy") for r in fwd if r.norm not in TWO_PASS_NORMS]
    pct = [_span(v, "%") for v in (fb_rest, fwd_rest)]
    return [
        f"  ({', '.join(TWO_PASS_NORMS)} read x twice at these sizes (its statistics need the whole batch first): "
        "at most 5/8 of the triad's rate fwd+bwd, 2/3 of the copy's fwd, in the bytes counted here; without it, "
        f"fwd+bwd {pct[0]} of triad, fwd {pct[1]} of copy)"
    ]


def _span(values: list[float | None], unit: str) -> str:
    """'low .. high' of the values given (None left out), as printed: % to a unit, else to a tenth; one value
    where both print alike."""
    v = [x for x in values if x is not None]
    if not v:
        return "-"
    low, high = (f"{a:.{0 if unit == '%' else 1}f}{unit}" for a in (min(v), max(v)))
    return low if low == high else f"{low} .. {high}"


def _name(row: Row) -> str:
    return f"{row.norm} {'x'.join(map(str, row.shape))} {row.dtype}"


def _below(rows: list[Row], stream: str, target: float) -> str:
    """The rows whose numba out= rate is below ``target`` % of the STREAM kernel ``stream`` timed with them, each
    with that percentage and, beside it, the plain kernels' (``_plain_percent``): the second does not move with the
    machine's memory between rounds as the first can."""
    below = []
    for r in rows:
        percent = _percent(r, "numba out=", stream)
        if percent is not None and round(percent) < target:  # (as printed: 69.6% reads 70%, on target)
            below.append(f"{_name(r)} {percent:.0f}% ({_f(_plain_percent(r), '.0f')}% of plain x)")
    return ", ".join(below) or "none"


def _unsteady_torch(rows: list[Row]) -> list[str]:
    """The rows whose PyTorch times spread over TORCH_UNSTEADY_SPREAD % of their median or more, with its quartiles
    and the ratio at its lower quartile: a median that falls between two modes makes an unsteady ratio.

    Such modes come from PyTorch's allocations: glibc serves a large block from fresh ``mmap`` pages on some
    calls and from freed memory on others. Timed on its own (float64 LayerNorm 4096x768 fwd+bwd, 2 threads,
    cold caches), PyTorch's calls took 3.8-4.5 ms with no page fault, and 8.1-13.7 ms with 6,100-12,300 minor
    faults (one or two 24 MiB buffers of fresh pages), in no steady order."""
    unsteady = []
    for r in rows:
        spread = r.spread("torch")
        if spread is not None and spread >= TORCH_UNSTEADY_SPREAD and "numba" in r.ms:
            low, high = r.quartiles["torch"]
            unsteady.append(f"{_name(r)} {low:.3g}-{high:.3g} ms ({low / r.ms['numba']:.1f}x at its lower quartile)")
    return unsteady


def target_summary(report: Report) -> list[str]:
    """The issue's targets, read off this run. DRAM-sized: x alone is at least ``DRAM_SIZED_BYTES`` (x, y,
    dy and dx together 64 MiB or more: twice the 32 MiB L3 of a typical server core complex). Not the
    reported L3 size: a VM may report a whole socket's (480 MiB on one of ours), of which it holds an
    unknown share."""
    dram = [r for r in report.rows if r.cold and _x_bytes(r) >= DRAM_SIZED_BYTES]

    fb = [r for r in dram if r.direction == "fwd+bwd"]
    fwd = [r for r in dram if r.direction == "fwd"]
    # what 2x PyTorch would take where it is not reached: twice PyTorch's own rate, against the triad timed
    # with the row and against memcpy on all threads (non-temporal stores, as the kernels' big outputs)
    memcpy_keys = sorted((k for k in report.stream if k.startswith("memcpy ")), key=lambda k: int(k[7:-1]))
    memcpy = report.stream[memcpy_keys[-1]] if memcpy_keys else None
    below_2x = [
        f"{_name(r)} {200 * r.gbps('torch') / r.stream['triad']:.0f}%"
        + (f" ({200 * r.gbps('torch') / memcpy:.0f}% of memcpy)" if memcpy else "")
        for r in fb
        if _below_2x(r)
    ]
    numpy_ratios = [(r, _ratio(r.ms.get("numpy"), r.ms.get("numba out="))) for r in report.rows]
    below_5x = [f"{_name(r)} {r.direction} {x:.1f}x" for r, x in numpy_ratios if x is not None and round(x, 1) < 5]
    numpy_line = (
        f"numpy / numba out=, every shape and direction timed: {_span([x for _, x in numpy_ratios], 'x')}; "
        f"target >= 5x" + (f" (below 5x: {', '.join(below_5x)})" if below_5x else "")
    )
    # the other rows timed from cold caches (listed shapes whose x fits in a large L3): outside the targets, but
    # where a reader comparing with PyTorch at those shapes should see how they stand
    smaller = [r for r in report.rows if r.cold and r.direction == "fwd+bwd" and _x_bytes(r) < DRAM_SIZED_BYTES]
    missed = ", ".join(f"{_name(r)} {r.ms['torch'] / r.ms['numba']:.1f}x" for r in smaller if _below_2x(r))
    unsteady_smaller = ", ".join(_unsteady_torch(smaller))
    smaller_line = [
        f"fwd+bwd from cold caches with x under {DRAM_SIZED_BYTES >> 20} MiB (outside the targets): numba out= "
        f"{_span([_percent(r, 'numba out=', 'triad') for r in smaller], '%')} of triad, torch / numba "
        f"{_span([_ratio(r.ms.get('torch'), r.ms.get('numba')) for r in smaller], 'x')} (below 2x: {missed or 'none'})"
        + (f"; PyTorch's times spread over half their median: {unsteady_smaller}" if unsteady_smaller else "")
    ]
    if not smaller:
        smaller_line = []
    if not dram:  # (--quick, or --shape of small inputs: an empty "below" list would read as on target)
        return [
            f"no DRAM-sized shape in this run (x of {DRAM_SIZED_BYTES >> 20} MiB or more, from cold caches): the "
            "bandwidth and PyTorch targets are not measured here",
            *smaller_line,
            numpy_line,
        ]
    unsteady = ", ".join(_unsteady_torch(fb))
    return [
        f"fwd+bwd at DRAM sizes, numba out=, % of triad (copy): "
        f"{_span([_percent(r, 'numba out=', 'triad') for r in fb], '%')} "
        f"({_span([_percent(r, 'numba out=', 'copy') for r in fb], '%')}); target >= 70%",
        f"  (below 70% of triad: {_below(fb, 'triad', 70)})",
        f"  (the same rows in GB/s: numba out= {_span([r.gbps('numba out=') for r in fb], '')}, "
        f"STREAM triad in their rounds {_span([r.stream['triad'] for r in fb], '')}: the fraction moves with "
        "the machine's memory, the kernels' rate much less)",
        f"fwd+bwd at DRAM sizes, torch / numba, both allocating, all threads: "
        f"{_span([_ratio(r.ms.get('torch'), r.ms.get('numba')) for r in fb], 'x')}; target >= 2x",
        f"  (where below 2x, twice PyTorch's own rate, in % of triad: {', '.join(below_2x) or 'none'})",
        *([f"  (PyTorch's times spread over half their median, interquartile: {unsteady})"] if unsteady else []),
        f"  (on one thread, torch 1t / numba 1t, numba with out=: "
        f"{_span([_ratio(r.ms.get('torch 1t'), r.ms.get('numba 1t')) for r in fb], 'x')})",
        f"fwd at DRAM sizes, numba out=, % of copy: {_span([_percent(r, 'numba out=', 'copy') for r in fwd], '%')}; "
        "target >= 80%",
        f"  (below 80% of copy: {_below(fwd, 'copy', 80)})",
        f"  (against plain kernels moving the same bytes in the same rounds, copy x for fwd, copy x and "
        f"triad x for fwd+bwd: fwd {_span([_plain_percent(r) for r in fwd], '%')}, "
        f"fwd+bwd {_span([_plain_percent(r) for r in fb], '%')})",
        *_two_pass_note(fb, fwd),
        *smaller_line,
        numpy_line,
    ]


def _x_bytes(row: Row) -> float:
    return row.bytes / BYTES_PER_X[row.direction]


def _below_2x(row: Row) -> bool:
    """Whether numba (allocating) is less than twice as fast as PyTorch on ``row``, where PyTorch was timed, as the
    ratio is printed (1.996x reads 2.0x: on target, as ``_below``'s percentages)."""
    return "torch" in row.ms and round(row.ms["torch"] / row.ms["numba"], 1) < 2


def format_report(report: Report, markdown: bool = False) -> str:
    m = report.machine
    bullet = "- " if markdown else "  "
    parts = [
        "# minigrad_norm kernel benchmark" if markdown else "minigrad_norm kernel benchmark",
        "",
        f"Generated by `{report.command}`. The machine is shared with other jobs, so absolute numbers move "
        "from run to run; the ratios are measured side by side in one process.",
        "",
        "Machine:",
        *(f"{bullet}{k}: {v}" for k, v in m.items()),
        "",
        "STREAM (numba, float64, GB/s; copy and triad with ordinary stores; memcpy with the non-temporal "
        "stores glibc uses at this size, for reference only; the kernels use such stores for outputs "
        "of streaming_store_min_bytes or more, and can then exceed 100% of copy): "
        + ", ".join(f"{k} {v:.1f}" for k, v in report.stream.items()),
        "",
        "Columns: median ms per call (numpy = reference; numba = allocating outputs (from the buffer pool, "
        "minigrad_norm.kernels.buffers), 'out=' = preallocated (64-byte aligned); torch = PyTorch CPU eager, "
        "allocating; '1t' = on one thread: 'numba 1t' with out=, 'torch 1t' allocating). 'out= GB/s' counts the "
        "minimal bytes "
        "(fwd 2|x|, bwd 3|x|, fwd+bwd 5|x|), and 'out= IQR %' (in the first table) the spread of its calls' "
        "times (the interquartile range over the median: how far one run's figures can be trusted; every "
        "implementation's quartiles are in the JSON); '% copy'/'% triad' compare it with STREAM copy/triad on all "
        "threads ('copy GB/s'), timed in the same rounds as the implementations: round-robin, "
        f"in a shuffled order, each call right after {WARMUP_CALLS} untimed ones of its own (numpy and STREAM: 1); "
        "'% plain x' is the time of plain kernels moving the same bytes, timed in the same rounds ('copy x' "
        "= a copy of x, a forward's bytes; 'triad x' = x + 3 dy, a backward's; both for fwd+bwd; on one thread where "
        "x is small enough for numba's kernels to run serially), over the time "
        "of numba out= (for an x smaller than DRAM_SIZED_BYTES the plain kernels' output can stay in the L3 "
        "through their call, while the kernels stream theirs to memory: there it is a harsh yardstick, and "
        "the target lines leave such rows out); "
        "'x numpy' = numpy / numba out=, 'x torch' = torch / numba (both allocating, "
        "all threads). "
        + (
            "The shapes are timed from cold caches: before each timed call, a read of twice the L3 size "
            "evicts everything, so x and dy come from DRAM."
            if all(r.cold for r in report.rows)
            else "The shapes are timed hot (--hot): in a loop on the same arrays, which stay in the caches "
            "where they fit; the target lines, which need x and dy from DRAM, leave them out."
        )
        + (
            " The LayerNorm D=1024 rows at the end are the size sweep, timed hot (in a loop on the same arrays, "
            "which stay in the caches where they fit)."
            if report.sweep
            else ""
        ),
        "",
        format_table(report, markdown),
        "",
    ]
    if any(r.cold for r in report.rows):  # (the targets are of x and dy from DRAM)
        # (a line that starts indented is a note on the one above it: in Markdown, a nested item)
        targets = [f"  - {t[2:]}" if markdown and t.startswith("  ") else bullet + t for t in target_summary(report)]
        parts += ["Targets (issue 4), as measured in this run:", *targets, ""]
    if report.startup:
        parts += ["Process start-up:", *(f"{bullet}{k}: {v:.2f}" for k, v in report.startup.items()), ""]
    parts.append(f"Total run time: {report.seconds:.0f} s{' (--quick)' if report.quick else ''}")
    return "\n".join(parts)


PLAIN_LABEL = "plain kernels, same bytes"
STREAM_LABEL = "STREAM triad"


def sweep_lines(report: Report) -> tuple[list[float], dict[str, list[float]], dict[str, list[float]]]:
    """What ``plot`` draws of the size sweep: MiB moved per row, and by label the median ms and the GB/s of each
    implementation timed at every size; beside them the yardsticks, per size as timed in that size's rounds:
    the plain kernels moving the same bytes (``PLAIN``; in the L2 and L3 they run faster than from DRAM, as
    the norms do) and STREAM's triad on all threads (GB/s only)."""
    sweep = report.sweep
    sizes = [r.bytes / 2**20 for r in sweep]
    ms, gbps = {}, {}
    for impl in ("numpy", "numba", "numba out=", "torch"):
        if sweep and all(impl in r.ms for r in sweep):
            ms[impl] = [r.ms[impl] for r in sweep]
            gbps[impl] = [r.gbps(impl) for r in sweep]
    if sweep and all(impl in r.ms for r in sweep for impl in PLAIN[r.direction]):
        ms[PLAIN_LABEL] = [sum(r.ms[impl] for impl in PLAIN[r.direction]) for r in sweep]
        gbps[PLAIN_LABEL] = [r.bytes / (t * 1e-3) / 1e9 for r, t in zip(sweep, ms[PLAIN_LABEL])]
    if sweep and all("triad" in r.stream for r in sweep):
        gbps[STREAM_LABEL] = [r.stream["triad"] for r in sweep]
    return sizes, ms, gbps


def plot(report: Report, path: str) -> None:
    """Time and GB/s against bytes moved, for the size sweep (``sweep_lines``; matplotlib, optional)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError as e:
        raise RuntimeError("bench --plot needs matplotlib (pip install minigrad_norm[plot])") from e
    fig, (ax_t, ax_bw) = plt.subplots(1, 2, figsize=(11, 4))
    sizes, ms, gbps = sweep_lines(report)
    style = {PLAIN_LABEL: dict(ls="--", color="gray"), STREAM_LABEL: dict(ls=":", color="black")}
    for label, values in ms.items():
        ax_t.loglog(sizes, values, **style.get(label, dict(marker="o")), label=label)
    for label, values in gbps.items():
        ax_bw.semilogx(sizes, values, **style.get(label, dict(marker="o")), label=label)
    ax_t.set(xlabel="MiB moved (fwd+bwd, 5 |x|)", ylabel="median ms", title="LayerNorm D=1024 fwd+bwd, float32")
    ax_bw.set(xlabel="MiB moved", ylabel="effective GB/s", title="bandwidth (yardsticks timed in the same rounds)")
    for ax in (ax_t, ax_bw):  # sizes at 1, 2, 5 x 10^k MiB, in plain numbers (matplotlib's own labels of a short
        # span, as --quick's, put every minor tick's 2x10^0, 3x10^0... over each other)
        ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    # one legend for both panels, below them: inside, it hid the lines at one size or another
    fig.legend(*ax_bw.get_legend_handles_labels(), loc="lower center", ncol=len(gbps), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


NORMS = ("layer_norm", "rms_norm", "batch_norm2d", "instance_norm2d", "group_norm", "batch_norm1d")


def selected_cases(
    quick: bool,
    only: Sequence[str] | None = None,
    shapes: Sequence[tuple[int, ...]] | None = None,
    groups: int | None = None,
) -> tuple[list[Case], list[Case]]:
    """The cases to time and the size sweep, of the norms named in ``only`` (all if None): with ``shapes``,
    each of those norms on each shape (``shape_case``; without ``only``, the norms that take every shape) and no
    sweep; else the listed (or quick) cases and the sweep. A ValueError says what is wrong with a selection."""
    keep = set(only or NORMS)
    if keep - set(NORMS):
        unknown = " ".join(sorted(keep - set(NORMS)))
        raise ValueError(f"--only: unknown norm {unknown}; the norms are {', '.join(NORMS)}")
    if groups is not None and groups < 1:
        raise ValueError(f"--groups must be positive, got {groups}")
    if groups is not None and not shapes:
        raise ValueError(f"--groups {groups} is for --shape (the listed GroupNorm shapes have {DEFAULT_GROUPS} groups)")
    if groups is not None and "group_norm" not in keep:
        raise ValueError(f"--groups {groups} is GroupNorm's, and --only leaves group_norm out")
    if shapes and only is None:
        keep = {n for n in NORMS if all(_takes(n, s, groups or DEFAULT_GROUPS) for s in shapes)}
        if not keep:  # (LayerNorm takes every rank: its error says what is wrong with the shapes)
            for s in shapes:
                shape_case("layer_norm", s)
    if shapes:
        return [shape_case(n, s, groups or DEFAULT_GROUPS) for s in shapes for n in NORMS if n in keep], []
    cases = quick_cases() if quick else listed_cases()
    return [c for c in cases if c.norm in keep], [c for c in sweep_cases(quick) if c.norm in keep]


# A run holds about this many arrays of x's size in float64 at once (x, dy, the outputs of numba and PyTorch,
# and the NumPy reference's temporaries, float64 whatever x's dtype), besides what it holds whatever the shape
# (the STREAM arrays, PyTorch). Peak resident memory (``/usr/bin/time``, ``bench --quick --hot --only N --shape S
# --dtype D``), x of 2^23 and 2^25 values: float64 LayerNorm 1.41 and 4.16 GB (13.7 float64 arrays more for
# 2^25 - 2^23 values), RMSNorm 4.42 GB at 2^25 (PyTorch's composite), BatchNorm1d, BatchNorm2d, InstanceNorm2d,
# GroupNorm 4.14-4.15 GB; float32 LayerNorm 1.14 and 3.10 GB (9.7): about 14.6 arrays at most, and 0.5 GB.
ARRAYS_OF_X_SIZE = 16
FIXED_BYTES = 2**30


def memory_error(cases: Sequence[Case], available: int | None) -> str | None:
    """Why the largest of ``cases`` would not fit in the ``available`` bytes, found before anything is allocated
    (an allocation that fails part-way through a run, or the OS's out-of-memory killer, loses the run)."""
    if not cases or available is None:
        return None
    case = max(cases, key=lambda c: math.prod(c.shape))
    need = ARRAYS_OF_X_SIZE * math.prod(case.shape) * 8 + FIXED_BYTES
    if need <= available:
        return None
    return (
        f"--shape {'x'.join(map(str, case.shape))}: a run holds about {ARRAYS_OF_X_SIZE} arrays of x's size in "
        f"float64 (the NumPy reference's, whatever the dtype) and {FIXED_BYTES / 2**30:.0f} GiB besides, "
        f"{need / 2**30:.1f} GiB, but {available / 2**30:.1f} GiB of memory is available"
    )


def selection(args: Any) -> tuple[list[Case], list[Case]]:
    """``minigrad-norm bench``'s cases and sweep from its options (``selected_cases``), checked before any work."""
    shapes = list(dict.fromkeys(parse_shape(s) for s in args.shape or ()))  # (a shape given twice, timed once)
    cases, sweep = selected_cases(args.quick, args.only, shapes, args.groups)
    if args.plot and not sweep:
        raise ValueError(f"--plot {args.plot}: the plot is of the LayerNorm size sweep, left out by --shape or --only")
    error = memory_error(cases, available_memory_bytes())
    if error:
        raise ValueError(error)
    return cases, sweep


# -- argparse types of the scripts in benchmarks/: a bad value is a usage error, before any work


def output_problem(path: str) -> str | None:
    """Why the file ``path`` could not be written, found before the run it would hold.

    The file is opened for appending and closed (``os.access`` says yes to root everywhere, /sys included), and
    removed again if it was not there: a run that fails or is interrupted leaves no empty results file behind.
    """
    if os.path.isdir(path):
        return "is a directory"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(parent):
        return f"directory {parent} does not exist"
    if not os.path.isdir(parent):
        return f"{parent} is not a directory"
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        return f"not writable ({e.strerror})"
    if not existed:
        os.remove(path)
    return None


def output_path(text: str) -> str:
    """A file the script can write (``output_problem``): probed when the options are read, not after the run."""
    if not text:
        raise argparse.ArgumentTypeError("the path is empty")
    if problem := output_problem(text):
        raise argparse.ArgumentTypeError(f"{text}: {problem}")
    return text


def positive_int(text: str) -> int:
    """An int >= 1 (rounds, rows, repeats)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {value}")
    return value


def thread_count(text: str) -> int:
    """An int from 1 to numba's thread count (``numba.set_num_threads`` refuses the rest)."""
    import numba

    value = positive_int(text)
    if value > numba.config.NUMBA_NUM_THREADS:
        raise argparse.ArgumentTypeError(f"numba has {numba.config.NUMBA_NUM_THREADS} threads here, got {value}")
    return value


def view_spec(text: str) -> str:
    """A view ``NxGxKxS`` (sizes >= 1), with ``bn`` after it for BatchNorm's statistics per channel."""
    if not re.fullmatch(r"[1-9]\d*(x[1-9]\d*){3}(bn)?", text):
        raise argparse.ArgumentTypeError(
            f"expected a view NxGxKxS (sizes >= 1, 'bn' after for BatchNorm), got {text!r}"
        )
    return text


def git_output(args: Sequence[str], cwd: Any) -> bytes:
    """``git`` run in ``cwd``; its own message, not a CalledProcessError, when it fails (an unknown revision)."""
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True)
    if done.returncode:
        raise SystemExit(f"git {' '.join(args)}: {done.stderr.decode().strip()}")
    return done.stdout


def main(args: Any, cases: list[Case], sweep: list[Case]) -> int:
    """``minigrad-norm bench``: run ``cases`` and ``sweep`` (``selection(args)``), print the table, write the
    requested files."""
    report = run(
        quick=args.quick,
        cases=cases,
        sweep=sweep,
        dtypes=args.dtype and list(dict.fromkeys(args.dtype)),  # (a dtype given twice, timed once)
        progress=not args.no_progress,
        startup=not args.no_startup and not args.shape,  # (a fresh process's first LayerNorm: no shape of yours)
        compile_first=True,
        cold=not args.hot,
    )
    report = dataclasses.replace(report, command=shlex.join(["minigrad-norm", *args.argv]))
    print(format_report(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(), f, indent=2)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(format_report(report, markdown=True) + "\n")
    if args.plot:
        plot(report, args.plot)
        print(f"plot written to {args.plot}")
    return 0
