"""numba kernels: the reference's functions, with the same signatures, as jitted loops.

The formula is the reference's (``minigrad_norm.kernels.reference``, read its
docstring first): every norm is a 4-D view ``x`` of shape (N, G, K, S), with
statistics per (n, g) block of L = K*S contiguous values, or per channel g over
all N blocks when ``reduce_batch``. Here that view is walked as (N, G, L):

forward, for each group (a block, or the N blocks of a channel):
    pass 1  mean = sum(x) / m                    (0 when not centered)
    pass 2  var  = sum((x - mean)^2) / m         (two passes: no E[x^2] - E[x]^2)
    pass 3  y    = (x - mean) * rstd * w + b     (the reference's operation order)
backward, for each group:
    pass 1  A = sum(dy * w),  B = sum(dy * w * xhat)   (and, per (g, k), sum(dy), sum(dy * xhat))
    pass 2  dx = ((dxhat - xhat * B/m) - A/m) * rstd
(over a run of one finite weight w, A and B as w * sum(dy) and w * sum(dy * xhat): two sums per value, not
four; see ``_run_dy_sums``)
(a row of its own statistics, LayerNorm's and RMSNorm's, adds its dweight/dbias terms dy * xhat and
dy per value in pass 2 instead, from L1, in x's dtype: see ``_dx_row_affine`` and ``_fold_terms``)
Passes 2 and 3 re-read a group that has just been read, from L1/L2 (a LayerNorm row,
an InstanceNorm/GroupNorm block, a BatchNorm channel of N*S values), so DRAM sees x
(and dy) read once and y (dx) written once: the minimal traffic.

Design points, each one tested in ``tests/test_kernels.py``:

* Every sum (mean, variance, A, B, dweight, dbias) accumulates in float64, for float32 and
  float64 data alike, as in the reference (``np.float64(dy[i])``: in numba ``float()`` of a
  float32 stays float32), but one: a row's dweight and dbias terms (LayerNorm, RMSNorm, and
  GroupNorm's blocks of short runs that go as rows, ``_as_rows``) are
  summed in x's dtype over blocks of TERM_BLOCK_ROWS = 8 rows, and those block sums in float64
  (``_fold_terms``; for float32 data, the bound below). (InstanceNorm's blocks that go as rows have one
  weight per row, and sum their terms per row in float64: see ``_backward_rows``.)
* The passes that write an output (y, dx) compute in the data's dtype, in the reference's
  operation order: for float32 data that is twice the lanes per vector register and no
  conversions (``benchmarks/compare_kernels.py a32ff77``, against the float64
  version, 2 threads: float32 forward 0-21 % faster, backward 2-21 %, by view and by the
  machine's state; float64 unchanged). The loops are vectorized with registers of up to 512 bits
  (16 float32 lanes) where the CPU has them, though LLVM's tuning for Intel's AVX-512 cores prefers
  256 (``_WideVectorsLowering``). The mean enters as a
  float32 pair, ``(x - mu_hi) - mu_lo`` (see ``_split``), so a large mean next to a small spread
  costs nothing. For float64
  data this is the reference's arithmetic. For float32,
  with u = 2^-24 and every quantity below the exact (float64) one, each element is off
  from the reference by at most
      y:   8 u (|xhat * w| + |b|)
      dx:  16 u rstd (|dxhat| + |xhat| * mean|dxhat * xhat| + mean|dxhat|)     (means over the group)
  counting the roundings of the float32 operations (about one u per operation, on the
  terms, not on the possibly cancelled result) plus the reference's own final rounding.
  A row's dweight and dbias (LayerNorm, RMSNorm, GroupNorm's blocks as rows; R = TERM_BLOCK_ROWS), sums over n:
      dweight: (R + 8) u sum_n |dy * xhat|        dbias: (R + 2) u sum_n |dy|
  (a term dy * xhat rounds about 5 times, xhat as in y; a block's float32 sum adds R - 1
  roundings of its terms; the float64 sum of the blocks next to nothing; then both results
  are rounded to float32).
  ``tests/test_kernels.py`` holds the kernels to exactly these bounds. They are relative
  to the terms: where y or dx is a small difference of large terms (a bias cancelling
  xhat * w, a group of one value where dx is exactly 0 but dxhat * rstd is large) the
  relative error of the result can be large, as it is in PyTorch's float32 kernels.
  Four assumptions: the float64 statistics agree with the reference's, which holds when
  their float64 sums are exact or nearly so, but not when values of very different sizes
  cancel (254 ones beside 1e30 and -1e30: the sum depends on its order, and the means then
  differ by far more than the bound), nor where the last bit of a statistic decides (eps = 0
  on a constant row: its variance 0 in one backend, NaN out, and a rounding error in the
  other, +-1 out); no result is subnormal (below 2^-126 each rounding adds an absolute
  2^-150, whatever the size of the terms); no float32 intermediate overflows where the
  float64 one does not (rstd, only with eps below about 1e-77; dy * w; proj): it gives inf
  or NaN, as in PyTorch's float32 kernels; and no block sum of dweight/dbias terms exceeds
  float32's range (3.4e38) where the whole sum does not.
* Only the reduction helpers (``@_helper``: one pass over one contiguous run, returning
  sums) carry a fastmath flag, ``reassoc``, which lets LLVM vectorize a sum by splitting
  it into lanes. Reordering a sum cannot turn NaN or +-inf into a finite number (a NaN,
  or inf with -inf, gives NaN in any order); no other flag (``nnan``, ``ninf``, ``nsz``,
  ``contract``...) is used anywhere, and no fused multiply-add, so NaN/inf in the inputs
  propagate as in the reference (tested with NaN/inf in x, dy and the weight; intermediates under the
  assumptions above). ``error_model="numpy"``: 0/0 gives NaN (an
  all-masked group), not ZeroDivisionError.
* Parallel with ``prange`` over 64 runs of consecutive blocks (a channel each with ``reduce_batch``), forward
  and backward alike, or over chunks of rows (the rows' backward), each item's loop a function of its own
  (``_forward_rows``...).
  Blocks that are rows with their own statistics (LayerNorm, RMSNorm) take loops of their own, which LLVM compiles to
  much less per-row work than the general ones (half the time on 64-128 value rows), in kernels of their own (a
  LayerNorm compiles none of the other blocks' loops); so do the blocks of short runs (InstanceNorm and GroupNorm on
  small maps), with the weight repeated over each run (``_as_rows``). A row of at most SHORT_ROW_VALUES values is one
  vector, read and written by masked loads and stores (see "short rows"); where such rows stream their output, they
  prefetch their input 2 KiB ahead (SHORT_ROWS_STREAM, but on Intel CPUs; see "Streamed short rows" in
  ``_forward_rows``). On Intel CPUs the forward row loop prefetches rows of up to 2 KiB (see ``_rows_ahead``; float32
  rows of up to 16 KiB where it streams its output), and takes blocks of up to 2 KiB as rows whatever their runs (for
  an x of 4 MiB or more); the forward of other blocks computes their statistics two blocks at a time (see
  ``_forward_groups``; the backward of a BatchNorm channel's blocks takes its sums so too, ``_backward_sums_pair``),
  blocks too long for L1 a piece at a time, each piece's two passes merged by Chan's update (``_pair_moments``), and,
  when it streams its output, prefetches the next block into L2 while it writes one (``_block_ahead``). The
  dweight/dbias sums over (n, s) go through per-chunk (per-item) float64 partial buffers ``(n_chunks, G, K)``, summed
  at the end in chunk order. ``n_chunks`` depends only on the shape, never on the thread count, so the result is
  bit-identical on 1 or many threads.
* BatchNorm in runs shorter than COLUMNS_MAX_RUN_BYTES (BatchNorm1d on (N, C): runs of one value), without a
  mask or with one of whole rows, takes kernels of its own, ``_columns_forward_kernel`` and
  ``_columns_backward_kernel``, which walk the batch row by row in memory order instead of channel by channel
  (see the section "BatchNorm of short runs" below).
* Every kernel is compiled twice from one Python function: ``parallel=True`` for big
  inputs, serial for small ones (waking the thread pool costs tens of microseconds). Both
  run the same loops, so they give the same bits.
* Outputs the functions allocate come from ``buffers.POOL``: recycled memory, 64-byte aligned,
  rather than fresh pages that the OS must zero (see ``minigrad_norm.kernels.buffers``); so do the
  backward's partial rows and term rows, as long as a row (``_backward_by_groups``).
* Outputs of ``STREAMING_STORE_MIN_BYTES`` or more (``out=`` or the pool's: a quarter of the L3, at
  most 24 MiB), in blocks of at least 2 KiB (or, in the
  backward, of whole cache lines), are written with streaming (non-temporal) stores: each block
  (a long row or run in pieces of 4 KiB, a batch or block of short rows, ``_scratch_len``) is computed into a
  scratch row in L1, then copied out by ``_stream_copy`` without the
  read-for-ownership an ordinary store makes. The values are the same bits either way (tested, at every alignment of
  ``out``). Measured with ``benchmarks/compare_kernels.py`` on 2 threads, against ordinary
  stores, into ``out=`` buffers 16 bytes past a cache line (``np.empty``'s):
  - float32 at about 100 MiB (LayerNorm 32768x1024, BatchNorm/InstanceNorm/GroupNorm
    128x64x56x56): forward 0.77-0.86 of the time, backward 0.81-0.88;
  - at the 24-64 MiB shapes of the benchmark: forward 0.68-0.89 (float32 BatchNorm,
    InstanceNorm, GroupNorm 32x64x56x56: 0.77-0.81), backward 0.89-1.05;
  into 64-byte aligned buffers the gain is larger (float32 LayerNorm 8192x1024: forward 0.76,
  backward 0.83, against 0.94 and 0.96 unaligned; ``benchmarks/streaming_stores.py``).
  Smaller outputs keep ordinary stores: they can stay in the cache for the next layer to read
  (where the line between them lies, and why it depends on the L3, see ``_streams``).
* Compiled on first call (importing this module compiles nothing) and cached on disk: the kernels
  (``_KERNELS``) and the work items' loops they call (``_item``), each item compiled once and called by
  its symbol (``_call_item``), not built into every kernel that calls it, as numba builds a jitted
  callee (that took a third off the cold compile of every kernel: see "one work item's loop" below). A kernel
  loaded from the cache has numba load or compile its items first (``_ItemSymbol``). Entries are written
  and read under a lock across processes (``_cache_locked``): numba's index is not safe against two
  processes adding signatures of one function at once.
* Non-contiguous inputs are made contiguous once; ``out=`` buffers are written in
  place when they are C-contiguous, of x's dtype and overlap no input other than being
  it (``out=x`` is fine: each block is read before it is written), else via one copy.
* The arguments are checked by ``reference.check_args``, the same function the reference
  calls: both backends refuse the same wrong shapes and dtypes with the same messages.
  What the jitted loops do not take (float16, empty arrays, a complex argument of a
  complex step) goes to the reference.
* ``minigrad_norm.backend`` sets ``OMP_WAIT_POLICY=PASSIVE`` (see there for why).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
import os
import platform
import subprocess
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import llvmlite.binding as llvm
import numba
import numpy as np
from llvmlite import ir
from numba import prange
from numba.core import cgutils, lowering
from numba.core import ir as nbir
from numba.core import types as nbtypes
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import register_pass
from numba.core.inline_closurecall import InlineWorker
from numba.core.typed_passes import NativeLowering
from numba.core.untyped_passes import InlineInlinables
from numba.extending import intrinsic, overload

try:
    import fcntl
except ImportError:  # (Windows: see _cache_locked)
    fcntl = None

from minigrad_norm.kernels import reference
from minigrad_norm.kernels.buffers import POOL
from minigrad_norm.kernels.machine import cpu_identity, l3_bytes, usable_cpus

# Two kinds of constant. numba freezes the value of a global that jitted code reads into the machine code when it
# compiles, and into its cache on disk: changed at run time, such a constant changes nothing already compiled, and
# a kernel compiled after the change calls item functions compiled before it, with the old value (a scratch row
# sized by one value, filled by a loop cut by the other, left an output value unwritten). Those are changed in
# the source only. The others are read by the Python functions at each call: PARALLEL_MIN_ELEMENTS (which
# compile), the STREAMING_STORE_* thresholds (whether to stream), ROWS_LARGE_X_BYTES (which backward limits of
# _as_rows) and CACHE_LOCK_WAIT_SECONDS, which tests change at run time, and no jitted code reads
# (tests/test_kernels_backend.py checks).
#
# How long a kernel's load or save from numba's cache waits for another process's lock (see _take_cache_lock).
CACHE_LOCK_WAIT_SECONDS = 60.0
# Below this many elements the serial compile runs: the parallel launch costs more than it saves.
# With OMP_WAIT_POLICY=PASSIVE (see minigrad_norm.backend) a parallel region costs ~35 us on the first 2-core
# VM and 60 on the AMD VM of CPU family 26 (an empty prange of 2 items, back to back). A LayerNorm fwd+bwd (D =
# 1024, hot, 2 threads, serial and parallel alternated call by call) breaks even at about 2^19 elements there:
# parallel/serial 2.1-2.7 at 2^16, 1.11-1.37 at 2^18, 0.94-1.09 at 2^19, 0.68-0.90 at 2^20, float32 and float64.
# On the 2-core Intel Emerald Rapids VM the empty region took 15 us, and the line lies lower: fwd+bwd with out=
# (hot, 2 threads, the threshold switched call by call, 300 rounds), parallel/serial at 2^18 elements float32
# 0.71-0.91 (LayerNorm 256x1024, 2048x128, 16x16384, 1x262144, InstanceNorm 16x16x1024 and on 4x4 maps, GroupNorm
# 16x8x8x256 and 512x8x4x16, BatchNorm2d 16x16x1024 and 64x4x1024, BatchNorm1d 256x1024 and 4096x64), float64
# 0.70-0.84; at 2^17 float32 0.86-1.07, float64 0.73-0.98 but BatchNorm1d 128x1024 1.22; at 2^16 1.16 and 1.04
# (LayerNorm 64x1024). So 2^18 there, on Intel CPUs (the vendor stands for the machines measured, as for the
# prefetches below).
_INTEL = cpu_identity().get("vendor") == "GenuineIntel"
PARALLEL_MIN_ELEMENTS = 1 << 18 if _INTEL else 1 << 19
# rstd's kernel, a square root and a division per value (1.9 ns a value on one thread, from L1), breaks even on
# 2 threads at about 2^14 values (the Intel VM: 30.5 us serial, 29.7 parallel; 2^15: 60 and 46).
RSTD_PARALLEL_MIN_ELEMENTS = 1 << 14
# Outputs of at least this many bytes, in blocks of at least this many (or, in the backward, of whole
# cache lines, at least the aligned minimum), are written with streaming (non-temporal) stores: see _streams.
# A quarter of the L3 (x, y, dy and dx of that size fill it), and at most 24 MiB (a VM may report a whole
# socket's L3, shared with other tenants).
STREAMING_STORE_MIN_BYTES = min(24 * 2**20, l3_bytes() // 4)
STREAMING_STORE_MIN_BLOCK_BYTES = 2048
STREAMING_STORE_MIN_ALIGNED_BLOCK_BYTES = 512
# A streamed block whose runs are at least this many bytes goes out run by run: see _streams_by_runs. (The value
# of STREAMING_STORE_MIN_BLOCK_BYTES, which the Python side reads: a run that long streams on its own.)
STREAMED_RUN_MIN_BYTES = 2048
# The forward row loop (LayerNorm, RMSNorm) prefetches rows of at most this many bytes, this far ahead, on Intel
# CPUs only (on AMD's it measured slower): see _rows_ahead. Float32 rows of up to PREFETCH_MAX_STREAMED_ROW_BYTES
# it prefetches PREFETCH_STREAMED_DISTANCE_BYTES ahead too, when it streams their output out.
PREFETCH_MAX_ROW_BYTES = 2048 if _INTEL else 0
PREFETCH_DISTANCE_BYTES = 2048
PREFETCH_MAX_STREAMED_ROW_BYTES = 16 * 1024 if _INTEL else 0
PREFETCH_STREAMED_DISTANCE_BYTES = 8 * 1024
# BatchNorm in runs shorter than this many bytes walks the batch in memory order: see the columns kernels.
COLUMNS_MAX_RUN_BYTES = 128
# Blocks with statistics of their own in runs of at most this many bytes go to the row loops: see _as_rows. The
# backward's limits are pairs: (for an x smaller than ROWS_LARGE_X_BYTES, for an x that big or bigger).
ROWS_MAX_RUN_BYTES_FORWARD = 64
ROWS_MAX_RUN_BYTES_FORWARD_ONE_RUN = 128
ROWS_MAX_RUN_BYTES_BACKWARD = (128, 64)
ROWS_MAX_RUN_BYTES_BACKWARD_NO_AFFINE_GRADS = (256, 128)
ROWS_MAX_RUN_BYTES_BACKWARD_ONE_RUN = (2048, 256)
ROWS_LARGE_X_BYTES = STREAMING_STORE_MIN_BYTES
# Where the forward row loop prefetches (PREFETCH_MAX_ROW_BYTES), blocks of at most that many bytes go to it
# whatever their runs, for an x of at least this many bytes (more than two cores' L2 hold): see _as_rows.
ROWS_PREFETCHED_MIN_X_BYTES = 4 * 2**20
# The columns forward reads the batch in tiles of rows of at most this many bytes, read twice from L2: see
# _column_moments.
COLUMNS_TILE_BYTES = 256 * 1024
# The columns kernels' sums take rows four at a time where what they keep in L1 for a row (the float64 sums and
# statistics of its positions, and the row read) comes to this many bytes or more, near L1d's 32 KiB: see
# _column_dy_sums.
COLUMNS_FOUR_ROWS_MIN_BYTES = 28 * 1024
# The forward's paired blocks of more than this many bytes each, which do not fit in L1 together, take their
# statistics piece by piece, MOMENTS_PIECE values of each block at a time: see _pair_moments.
MOMENTS_MIN_BLOCK_BYTES = 16 * 1024
MOMENTS_PIECE = 1024
# A streamed output goes through an L1-resident scratch row of at most this many bytes: see _scratch_len.
STREAM_CHUNK_BYTES = 4096
# A row's dweight/dbias terms are summed in x's dtype over blocks of this many rows, then in float64: see _fold_terms.
TERM_BLOCK_ROWS = 8
# Rows of at most this many values go in one (masked) vector each, on CPUs with masked vector loads and stores
# (SHORT_ROWS_AS_VECTORS): see "short rows" below. The backward keeps its loops for rows of at most
# SHORT_ROW_LOOP_BACKWARD_BYTES, and takes float32 rows of at most SHORT_BLOCK_BACKWARD_VALUES values
# SHORT_ROW_VALUES rows at a time: see _backward_rows_lean.
SHORT_ROW_VALUES = 16
SHORT_ROW_LOOP_BACKWARD_BYTES = 32
SHORT_BLOCK_BACKWARD_VALUES = 12
# The forward takes such rows in batches of this many bytes: see _forward_rows.
SHORT_ROWS_BATCH_BYTES = 4096
# Where their output is big enough to stream (_streams), short rows stream it, the forward's batches and the lean
# backward's blocks, prefetching their rows PREFETCH_DISTANCE_BYTES ahead; on CPUs other than Intel's, where that was
# measured (see "Streamed short rows" in _forward_rows).
SHORT_ROWS_STREAM = not _INTEL
# LLVM vectorizes the items' loops and the reduction helpers with registers of up to this many bits where the CPU
# has them, whatever its tuning prefers: see _WideVectorsLowering.
PREFERRED_VECTOR_BITS = 512
# columns of a piece of the few rows' backward (``_backward_few_rows_kernel``); the forward takes rows of at least
# ROW_PIECES_MIN_BYTES in such pieces (``_forward_rows_kernel``)
ROW_PIECE_BYTES = 16 * 1024
ROW_PIECES_MIN_BYTES = 2**20
# dweight/dbias partial buffers: at least this many (n, s) terms per chunk entry, at most this many chunks
# (and at most this many work items in the forward).
_MIN_TERMS_PER_CHUNK = 16
_MIN_ROWS_PER_CHUNK = 32  # (rows: see _n_chunks)
_MIN_ROWS_PER_COLUMN_CHUNK = 16
_TARGET_ITEMS = 64
_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _masked_vector_instructions() -> bool:
    """Whether the CPU numba compiles for (its NUMBA_CPU_FEATURES, else the host's) has masked vector loads and
    stores, which the short rows' vectors need: AVX2 or AVX-512 on x86. Elsewhere LLVM splits each into a test and
    a load or store per lane: with NUMBA_CPU_NAME=generic (no features: SSE2), ``benchmarks/compare_kernels.py``
    took InstanceNorm's 4x4 maps as vectors 2.2-2.6x the loops' time."""
    features = numba.config.CPU_FEATURES
    if features is None:
        features = llvm.get_host_cpu_features().flatten()
    return bool({"+avx2", "+avx512f"} & set(features.split(",")))


SHORT_ROWS_AS_VECTORS = _masked_vector_instructions()


class _WideVectorsLower(lowering.Lower):
    """numba's lowering of a function, which marks the function for LLVM to vectorize with registers of up to
    PREFERRED_VECTOR_BITS (see ``_WideVectorsLowering``)."""

    def pre_lower(self):
        super().pre_lower()
        # (a string attribute, which llvmlite's set of attributes refuses by name: added to the set as set does)
        set.add(self.function.attributes, f'"prefer-vector-width"="{PREFERRED_VECTOR_BITS}"')


@register_pass(mutates_CFG=True, analysis_only=False)
class _WideVectorsLowering(NativeLowering):
    """numba's lowering pass, with ``_WideVectorsLower`` (in the items' and the reduction helpers' pipeline,
    ``_ItemCompiler``).

    LLVM's tuning for Intel's AVX-512 cores prefers 256-bit vectors, as GCC's and Clang's do
    (``-mprefer-vector-width=256``: 512-bit arithmetic lowered the clock of the first such server cores); for AMD's
    Zen 4 and 5 it takes 512-bit ones already. The kernels do a few operations a value on data from memory, and
    with half the instructions a value ``benchmarks/compare_kernels.py --floor`` (the 2-core Intel Emerald Rapids
    VM, new/twin 0.94-1.04) took from cold caches on 2 threads, forward, backward (without dweight/dbias):
    - float32 LayerNorm 8192x1024 0.94, 0.87 (0.95), 65536x128 0.99, 0.85 (0.87), 4096x768 0.96, 0.95;
      InstanceNorm 32x64x56x56 1.00, 0.95; GroupNorm 0.93, 1.00 (0.97); BatchNorm2d 0.98, 0.97; BatchNorm1d
      8192x1024 0.96, 1.02; on 4x4 maps GroupNorm 1.01, 0.93, InstanceNorm (whose rows are one vector each already,
      ``_ShortRow``) 1.00, 1.02;
    - float64 LayerNorm 8192x1024 0.90, 0.93 (0.97), 65536x128 1.04, 0.87 (0.91), 4096x768 0.91, 0.91;
      InstanceNorm 0.92, 0.92; GroupNorm 0.93, 0.91; BatchNorm2d 0.92, 0.95 (0.88); BatchNorm1d 0.94, 1.01; on 4x4
      maps InstanceNorm 1.02, 1.01, GroupNorm 1.03, 1.07 (1.07 in another run too; 0.89 without dweight/dbias);
    - but the backward with dweight/dbias of rows of 16 KiB or more whose dx does not stream: float32 512x4096
      1.04-1.05, 256x8192 1.01-1.20, float64 512x4096 1.10-1.12, 256x8192 0.99-1.12, by run; the loss is the dx
      loop's, which adds the terms (with only the helpers compiled so, float64 512x4096 1.00, but 8192x1024 0.97 and
      65536x128 0.95; the loop in pieces of 4 KiB, 1.12-1.20). Where dx streams (2048x4096) the backward took
      0.89-0.92.
    Hot on 2 threads, LayerNorm rows of 1024 and 4096 values and InstanceNorm 16x64x56x56 took 0.87-1.02 of the
    time; on one thread, rows and blocks in L2, 0.87-1.05 by view, as far apart as the twin read (0.90-1.13). The
    cold compile of every kernel took 0.90 of the time (``benchmarks/compile_time.py HEAD --rounds 2``: 71.2 s
    against 78.9). (Set for the whole process, as ``NUMBA_CPU_FEATURES`` with ``-prefer-256-bit`` sets it, an
    earlier session had measured this in alternated processes, which read 0.6-1.65 apart, and seen nothing; a
    function at a time, in one process, it shows. Where a CPU has no 512-bit registers the attribute changes
    nothing.)"""

    _name = "minigrad_norm_wide_vectors_lowering"

    @property
    def lowering_class(self):
        return _WideVectorsLower


class _CallSiteBlock(nbir.Block):
    """A block of the copy of a function's IR that numba is inlining at one call site (``_InlineWorker``): deep
    copied, it is itself, the call site's copy already."""

    def __deepcopy__(self, memo):
        return self


class _InlineWorker(InlineWorker):
    """numba's inliner of ``inline="always"`` calls, to the same IR with less work.

    numba inlines a call by building the callee's IR anew (its untyped passes, which inline the callee's own calls,
    each callee's IR built anew in turn), copying it block by block, where each block's copy copies the function's
    whole scope of variables again, then copying that copy, which the inlining pass drops (it is kept for callers
    that want the callee's IR unchanged). The items inline functions three or four deep: ``_dx_row_to``, its calls
    inlined, is 863 statements in 68 blocks over 1216 variables, and a copy took 0.30 s, a call site of it 1.6 s.
    Here a function's IR is built once in an inlining pass (the pass that compiles one function, during which no
    module constant changes: ``_untyped``) and copied once at each call site, all its blocks in one deep copy (so
    one copy of the scope, which they all share, as numba's passes check), and numba's two copies of that copy are
    the copy itself (``_CallSiteBlock``; numba's inlining pass drops the second, ``InlineInlinables._do_work``).
    The machine code is the same, function for function (every item and helper of both dtypes, compared; a test
    compares one). The cold compile of every kernel: with the IR built once (numba still copying it twice, one copy
    of the scope per call site), inlining took 7.5 s instead of 19.5 in one process (timed around each inlining,
    the same hour) and the whole 0.92 of the time in two (``benchmarks/compile_time.py HEAD --rounds 3``, the Intel
    VM: 67.6 s against 73.7); with one copy instead of those two, 0.96 again, in one process (92.8 s against 97.0,
    ``--what every_in_one_process --rounds 2``) and in two (50.6 s against 52.7, ``--rounds 3``; a faster hour).
    (What is left: inlining the kernels' own calls, 1.6 s, which go through numba's pass.)"""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._compiler_pipeline = _untyped_pipeline  # (so the callees' own calls are inlined here too)
        self._untyped = {}

    def inline_function(self, caller_ir, block, i, function, arg_typs=None):
        if function not in self._untyped:
            self._untyped[function] = self.run_untyped_passes(function)
        callee_ir = self._untyped[function].copy()
        callee_ir.blocks = copy.deepcopy(callee_ir.blocks)
        blocks = list(callee_ir.blocks.values())  # (numba's inliner keeps them, relabelled, in the caller)
        for b in blocks:
            b.__class__ = _CallSiteBlock  # (only for this call: the caller's IR may be copied later)
        try:
            return self.inline_ir(caller_ir, block, i, callee_ir, function.__code__.co_freevars, arg_typs)
        finally:
            for b in blocks:
                b.__class__ = nbir.Block


@register_pass(mutates_CFG=True, analysis_only=False)
class _InlineOnceInlinables(InlineInlinables):
    """numba's pass inlining ``inline="always"`` calls, through ``_InlineWorker``."""

    _name = "minigrad_norm_inline_inlinables"

    def _do_work(self, state, work_list, block, i, expr, inline_worker):
        # (numba's run_pass makes a worker for the run and hands it to each call: ours stands in for it, one a run)
        key = "minigrad_norm_inline_worker"
        if state.get(key, (None,))[0] is not inline_worker:
            w = inline_worker
            state[key] = w, _InlineWorker(w.typingctx, w.targetctx, w.locals, w.pipeline, w.flags, w.validator)
        return super()._do_work(state, work_list, block, i, expr, state[key][1])


_OUR_PASSES = {NativeLowering: _WideVectorsLowering, InlineInlinables: _InlineOnceInlinables}


def _with_our_passes(pipeline):
    """numba's ``pipeline`` with ``_OUR_PASSES`` in place of numba's."""
    # (numba's own builders assemble a pipeline so, through its list of passes)
    pipeline.passes = [(_OUR_PASSES.get(pass_, pass_), about) for pass_, about in pipeline.passes]
    pipeline.finalize()
    return pipeline


def _untyped_pipeline(state):
    """numba's untyped passes, which it runs on a function before inlining it, with ``_OUR_PASSES``."""
    return _with_our_passes(DefaultPassBuilder.define_untyped_pipeline(state))


class _ItemCompiler(CompilerBase):
    """numba's nopython pipeline with ``_OUR_PASSES``: the compiler of the items (``_item``) and of the reduction
    helpers (``_helper``), which hold the kernels' loops. Their code is numba's; ``_WideVectorsLowering`` marks it
    for wider vectors, and ``_InlineOnceInlinables`` inlines it in less time.

    (Not taken: the items' and helpers' code libraries without the LLVM function passes that numba runs on each
    function as it adds a module, before the module passes at finalize. For a float32 compile of the rows' backward
    and the groups' forward, numba's LLVM pass timings read 4.5 s instead of 7.2, to other machine code (the helpers'
    about 8% longer); ``benchmarks/compile_time.py`` took every kernel 0.91 of the time in one process (98.9 s against
    108.3) but 1.09 in two (53.4 against 48.9), and four alternated pairs of three kernels' compiles 0.82-1.18, the
    Intel VM in a noisy hour; the kernels from cold caches 0.94-1.04 of the time, hot on one thread 0.95-1.07
    (``compare_kernels.py --floor``, new/twin 0.97-1.23): no gain shown, for a second hook into numba's internals.)"""

    def define_pipelines(self):
        return [_with_our_passes(DefaultPassBuilder.define_nopython_pipeline(self.state))]


_sum_flags = {"reassoc"}
_helper = numba.njit(error_model="numpy", fastmath=_sum_flags, inline="never", pipeline_class=_ItemCompiler)


def _in_dtype_of(a, v):
    """``v`` converted to the element type of array ``a`` (jitted code only, see the overload below)."""
    raise NotImplementedError("_in_dtype_of runs inside jitted code only")


@overload(_in_dtype_of, inline="always")
def _in_dtype_of_impl(a, v):
    dtype = a.dtype
    return lambda a, v: dtype(v)


def _split(x, mu):
    """The mean as mu_hi + mu_lo in x's dtype, mu_hi = mu rounded, mu_lo the rounding error rounded:
    (x - mu_hi) - mu_lo is x - mu to a rounding or two of the *result*, however large mu is next to
    x - mu (float32 x = 1e4 + N(0, 1): mu_hi alone would be off by up to 5e-4). An infinite or NaN
    mean has no rounding error to carry: mu_lo = 0, and x - mu gives the reference's inf/NaN. A finite
    mean beyond float32's range has no pair at all; such calls go to the reference (``_mean_fits``).
    For float64 data mu_lo is the constant 0.0 (jitted code only, see the overload below)."""
    raise NotImplementedError("_split runs inside jitted code only")


@overload(_split)
def _split_impl(x, mu):
    if x.dtype == nbtypes.float64:
        # mu is exact: (x - mu) - 0.0 is x - mu, the reference's arithmetic, and LLVM drops the
        # subtraction of a constant +0.0 (exact for every x: no fast-math flag needed)
        return lambda x, mu: (mu, 0.0)

    def split(x, mu):
        hi = _in_dtype_of(x, mu)
        lo = _in_dtype_of(x, mu - hi) if math.isfinite(mu) else _in_dtype_of(x, 0.0)
        return hi, lo

    return split


# ---------------------------------------------------------------------------
# streaming stores: an output written once and not read back soon should bypass the cache


_STREAM_BYTES = 64  # one cache line


@intrinsic
def _stream_store(typingctx, dst, src, i):
    """dst[i : i + W] = src[i : i + W], W = 64 bytes of elements, as one non-temporal vector store.
    dst + i must be 64-byte aligned (``_stream_copy`` sees to it); src needs no alignment."""
    lanes = _STREAM_BYTES // (dst.dtype.bitwidth // 8)

    def codegen(context, builder, sig, args):
        dst_v, src_v, i_v = args
        dst_a = context.make_array(sig.args[0])(context, builder, dst_v)
        src_a = context.make_array(sig.args[1])(context, builder, src_v)
        vec = ir.VectorType(context.get_data_type(sig.args[0].dtype), lanes)
        value = builder.load(builder.bitcast(builder.gep(src_a.data, [i_v]), vec.as_pointer()), align=1)
        store = builder.store(value, builder.bitcast(builder.gep(dst_a.data, [i_v]), vec.as_pointer()), align=64)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return nbtypes.none(dst, src, i), codegen


@intrinsic
def _address(typingctx, a):
    """The address of a's first element (``a.ctypes.data`` would touch the array's reference count,
    an atomic operation that two threads writing rows of one array contend for)."""

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        return builder.ptrtoint(data, context.get_value_type(nbtypes.intp))

    return nbtypes.intp(a), codegen


@intrinsic
def _borrowed(typingctx, a):
    """``a`` without its reference to the memory it lives in (a null meminfo), for the caller to keep alive.

    numba counts the references to an array's memory, and a view made in jitted code (``x3[n, g]``) adds
    one and drops it again, each an atomic (``lock``-prefixed) instruction. An atomic instruction waits
    until every streaming store before it has reached memory, so a row loop that makes views after
    streaming each row out serializes the stores: the streaming forward of 128-value float32 rows took
    2.7x as long as with ordinary stores, and 1.1x with borrowed arrays. Every array an item function
    slices must be borrowed, the weight row too: with it left out, the backward of 128-value float32 rows
    made two calls into numba's runtime per row, and borrowing it took that backward 0.87 of the time from
    cold caches (0.79 without affine gradients; BatchNorm 32x64x56x56 0.90-0.94), and in L2 on one thread
    with fixed statistics 22 instead of 41 ns per row (``benchmarks/compare_kernels.py --cold``, the AMD VM)."""

    def codegen(context, builder, sig, args):
        src = context.make_array(sig.args[0])(context, builder, args[0])
        dst = context.make_array(sig.return_type)(context, builder)
        context.populate_array(
            dst, data=src.data, shape=src.shape, strides=src.strides, itemsize=src.itemsize, meminfo=None
        )
        return dst._getvalue()

    return a(a), codegen


@intrinsic(prefer_literal=True)
def _prefetch(typingctx, a, i, level):
    """Ask for the cache line holding a[i] to be brought into L1 (``level`` 1: ``prefetcht0`` on x86) or
    L2 (``level`` 2: ``prefetcht1``), a constant: a hint, so it neither waits for the line nor faults,
    whatever the address."""
    if not isinstance(level, nbtypes.IntegerLiteral) or level.literal_value not in (1, 2):
        return None
    locality = 4 - level.literal_value  # LLVM's temporal locality: 3 keeps the line in L1, 2 in L2

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        ptr = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        # (named by llvmlite for the pointer type: p0i8 in typed-pointer IR, which newer LLVMs rename p0)
        fn = builder.module.declare_intrinsic(
            "llvm.prefetch", [ptr.type], ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
        )
        # (address, read, temporal locality, data cache)
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, locality), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return nbtypes.none(a, i, level), codegen


@numba.njit(inline="always")
def _prefetch_lines(run, level):
    """_prefetch every cache line of a contiguous run into L``level`` (a constant: inlined, it stays one)."""
    for i in range(0, run.shape[0], _STREAM_BYTES // run.itemsize):
        _prefetch(run, i, level)


@numba.njit(inline="always")
def _rows_ahead(L, itemsize, stream):
    """How many rows of L values ahead the forward row loop prefetches: about PREFETCH_DISTANCE_BYTES,
    and none (0) for rows longer than PREFETCH_MAX_ROW_BYTES (0 but on Intel CPUs: see the end); where it
    streams the rows' output (``stream``), float32 rows of up to PREFETCH_MAX_STREAMED_ROW_BYTES about
    PREFETCH_STREAMED_DISTANCE_BYTES ahead (0 but on Intel CPUs: see "Streamed rows" below).

    Between reading one row and the next, the forward does a row's worth of work that depends on the
    whole row (its mean, then its variance, a square root and a division: about 90 ns for 128 float64
    values, in cache), and for short rows the hardware prefetcher does not run far enough ahead to keep
    the memory busy meanwhile. With the row 2 KiB ahead prefetched, ``benchmarks/compare_kernels.py``
    (2 threads, out= buffers, two runs) took of the time without: float64 rows of 64, 128, 256 values
    0.74-0.87, 0.74-0.77, 0.86-0.87; float32 rows of 128 and 256 values 0.82-0.89, 0.73-0.82 (of 64
    values 0.90-1.05). How much depends on the machine's load: two later runs, with every time about
    1.4x as long, gave 0.97-0.99 (float32, 128 values) and 0.85 (float64, 128), and none was slower.
    Rows of 1024 values gained nothing clear (0.90-1.07), so longer rows are left to the hardware; so
    did the backward, prefetching its x and dy rows (0.84-1.08 by view and run), so it does not (on the
    AMD VM of CPU family 26, the next row's x and dy prefetched while dx streams out, whole or only their
    first 512 bytes, took the LayerNorm backward 1.20-1.74 of the time, cold and hot; on the AMD Zen 4 VM, the next
    row's x and dy into L2 before the dx pass of a backward with dweight/dbias: float32 rows of 768 and 1024 values
    0.93-0.98 cold and hot, of 512, 2048 and 4096 values 1.04-1.11, float64 rows 0.98-1.09).
    From cold caches (``compare_kernels.py --cold``), prefetching rows of up to 16 KiB, 8 KiB ahead,
    took float32 rows of 768, 1024 and 4096 values 0.90-0.93, 0.90-0.92 and 0.94 of the time, but hot
    1.04, 1.15 and 1.09; float64 rows gained nothing cold (0.95-1.04). A trade of the hot loop for the cold
    call: taken only where the output streams (see "Streamed rows"). (Nor a BatchNorm forward prefetching the next
    channel into L2 while it normalizes one: 0.95-1.03 cold, 1.09 hot; on the AMD VM it is taken, see
    ``_block_ahead``. Nor, for
    InstanceNorm/GroupNorm/BatchNorm, the first 16 KiB of the next block into L1, and for rows up to 16
    KiB the next row, only for inputs of 16 MiB or more: a pass that only sums float32 blocks of 3136
    values took 1.05 ms instead of 1.56 from cold caches, but the whole forward 0.91-0.99 (InstanceNorm,
    BatchNorm) and 0.97-0.99 (GroupNorm, LayerNorm) by run, and hot, where such an input may still be in
    this VM's L3, 1.03-1.14. Into L2, ``prefetcht1``, the pass that only sums gained nothing. Nor the
    first 8 KiB of the next x and dy blocks in an InstanceNorm/GroupNorm backward: 1.00-1.02 cold,
    1.11-1.13 hot.) Those were measured on the Intel VM. On the AMD EPYC (Zen 4) VM the short-row
    prefetch took float32 rows of 64-256 values 1.05-1.10 of the time hot, 1.03-1.09 cold, float64 rows
    0.97-1.11, and a later session there measured the forward without it (``compare_kernels.py``, 2
    threads) at float32 rows of 16 values 0.84-0.89 of the time (InstanceNorm's 4x4 maps, taken as rows,
    0.78-0.87), of 64-512 values 0.84-1.07, float64 rows of 16 values 0.86-0.87, of 64-512 values
    0.84-1.04, hot and cold: so only Intel CPUs prefetch. Rows of up to 16 KiB, 8 KiB ahead,
    took there float32 rows of 4096, 768 and 1024 values 1.10, 1.29 and 1.15 of the time cold, 1.11,
    1.26, 1.28 hot. Nor, for rows of 16 KiB or more, each 1 KiB piece of the next row into L2
    (``prefetcht1``) as the normalize pass reaches it: 0.88-0.91 of the time on the Intel VM (LayerNorm
    512x4096, cold), but on the AMD VM of CPU family 26 (Zen 5, LLVM's ``znver5``) float32 1.21 cold and
    1.13 hot, float64 1.00 and 0.98; on the Zen 4 VM (family 25), for streamed rows of 8 KiB or more, float64
    rows of 8 and 12 KiB 0.87-0.92 cold, of 16 and 32 KiB 0.95-1.01, but float32 rows of 8, 12 and 16 KiB
    1.05, 1.08 and 0.98-1.08 (and of 4 KiB 1.00-1.03): a gain for one dtype at a few lengths, not taken.
    Measured again on the Intel VM for Intel CPUs only (``compare_kernels.py --floor``, 2 threads, new/twin
    0.99-1.02): not streamed (x of 8-16 MiB), 1 KiB pieces, float32 512x4096, 256x8192, 1024x4096 0.86-0.94 cold
    but 1.06 hot, float64 0.94-0.95 cold and 1.05-1.08 hot; streamed (the next row's piece prefetched after each
    scratch piece streams out), float32 rows of 32 KiB (1024x8192) 0.90-0.92 cold, float64 rows of 16-64 KiB
    0.92-0.94, hot 1.00-1.01. But the rows' forward then took 13.8-17.2 s to compile for both dtypes instead of
    11.2-12.5 (one process, four alternated compiles; with the next row passed as a view or as an index): for
    shapes none of which the benchmark lists, the compile of every kernel near issue 4's 60 s. Not taken.

    Streamed rows: where the loop streams its output (an output of STREAMING_STORE_MIN_BYTES or more, taken not to
    stay in the cache, and so an x as big, most likely streamed to memory by the kernel that wrote it, as in
    ``_block_ahead``), float32 rows of 2-16 KiB are prefetched 8 KiB ahead. ``benchmarks/compare_kernels.py HEAD
    --cold --floor`` (2 threads, the Intel VM, new/twin 0.94-1.05) took the forward of float32 LayerNorm 8192x1024
    0.93, 0.95 and 0.95 of the time in three runs, 16384x1024 0.94 and 0.97; hot (in this VM's large L3) 0.98-0.99.
    Float64 rows are left out: 8192x1024 cold 0.89, 0.96, 1.01, 4096x768 (24 MiB) 0.89-0.94, but hot 1.13 and
    0.97, 1.06-1.07 (float64 rows of 1024 values carry half the arithmetic a byte that float32 rows do, and their
    forward already ran at 94-97% of a copy's rate there). Prefetched ahead of the rows of the unstreamed sizes,
    4-16 MiB, the float32 forward took 1.06-1.12 of the time hot. (Nor the backward, where dx streams, the next rows
    of x and dy prefetched 8 KiB ahead into L1, or the next row into L2 once the row's sums are taken: 1.05-1.20 of
    the time cold, float32 and float64.)"""
    row_bytes = L * itemsize
    if row_bytes == 0:
        return 0
    if row_bytes <= PREFETCH_MAX_ROW_BYTES:
        return max(1, PREFETCH_DISTANCE_BYTES // row_bytes)
    if stream and itemsize == 4 and row_bytes <= PREFETCH_MAX_STREAMED_ROW_BYTES:
        return max(1, PREFETCH_STREAMED_DISTANCE_BYTES // row_bytes)
    return 0


@intrinsic
def _store_fence(typingctx):
    """``sfence`` on x86 (a full fence elsewhere): non-temporal stores are weakly ordered, and must
    be globally visible before another thread (the caller, after the parallel region) reads them."""

    def codegen(context, builder, sig, args):
        if platform.machine().lower() in ("x86_64", "amd64"):
            sfence = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse.sfence"
            )
            builder.call(sfence, [])
        else:
            builder.fence("seq_cst")
        return context.get_dummy_value()

    return nbtypes.none(), codegen


@numba.njit(inline="always")
def _stream_copy(src, dst):
    """dst[:] = src[:], the 64-byte aligned middle of dst with non-temporal stores.

    An ordinary store first reads the line it writes into the cache (read-for-ownership), so a
    kernel that writes an output it does not read moves three bytes over the memory bus for each
    two it counts: STREAM's copy done with ordinary stores reaches at most 2/3 of one done with
    non-temporal ones (``memcpy`` switches to them above a size; 28 against 49.6 GB/s on the
    2-core Intel VM). The kernels compute an output block into a small scratch row that stays in L1 and
    stream it out with this; the caller ends with ``_store_fence``."""
    n = dst.shape[0]
    lanes = _STREAM_BYTES // dst.itemsize
    head = min(n, ((-_address(dst)) % _STREAM_BYTES) // dst.itemsize)
    for i in range(head):
        dst[i] = src[i]
    blocks = (n - head) // lanes
    for j in range(blocks):
        _stream_store(dst, src, head + j * lanes)
    for i in range(head + blocks * lanes, n):
        dst[i] = src[i]


# ---------------------------------------------------------------------------
# short rows: a row of at most SHORT_ROW_VALUES values in one vector, the lanes past its end masked off
#
# LLVM vectorizes a loop over a row for 16-32 values a step (4 vectors of 4-8 lanes) and runs what is left a value
# at a time, so a row of a few values (InstanceNorm's 4x4 maps taken as rows) ran its loops value by value. These
# intrinsics take the whole row as one vector of SHORT_ROW_VALUES lanes, read and written by masked loads and
# stores: a lane past the row's end touches no memory (it reads as 0 and is not written), so there is no fault
# at the end of an array and no write into the next row, which another thread may own. Each does what the loop
# named in its docstring does, value for value the same operations in the same types; only its sums add in an
# order of their own (``_ShortRow.sum``). The forward takes SHORT_ROW_VALUES such rows at a time (``_ShortRows``,
# ``_short_block_forward``), and so does the backward of float32 rows of at most SHORT_BLOCK_BACKWARD_VALUES values
# (``_short_block_backward``). Only where the CPU has masked vector instructions (SHORT_ROWS_AS_VECTORS: x86's AVX2
# and AVX-512); elsewhere the rows take the loops.


class _ShortRow:
    """Builds the LLVM IR of one call of a short-row intrinsic, whose rows (1-D, contiguous) are all of the first
    one's length n <= SHORT_ROW_VALUES: each row a vector of SHORT_ROW_VALUES lanes, ``mask`` marking lanes < n."""

    def __init__(self, context, builder, arraytype, array):
        self.context, self.builder = context, builder
        self.mask_past(builder.extract_value(context.make_array(arraytype)(context, builder, array).shape, 0))

    def mask_past(self, n):
        """Rows of n values: ``n`` and ``mask`` (lanes < n) set."""
        lanes = ir.Constant(ir.VectorType(n.type, SHORT_ROW_VALUES), list(range(SHORT_ROW_VALUES)))
        self.n, self.mask = n, self.builder.icmp_unsigned("<", lanes, self.splat(n))

    def splat(self, value):
        """A vector of ``value`` in every lane."""
        i32 = ir.IntType(32)
        lane0 = self.builder.insert_element(
            ir.Constant(ir.VectorType(value.type, SHORT_ROW_VALUES), ir.Undefined), value, ir.Constant(i32, 0)
        )
        return self.builder.shuffle_vector(lane0, lane0, ir.Constant(ir.VectorType(i32, SHORT_ROW_VALUES), 0))

    def _masked(self, op, dtype, data):
        """(the row's vector type, ``data`` (a pointer to values of ``dtype``) as a pointer to one, the intrinsic
        llvm.masked.``op`` for it)."""
        vector = ir.VectorType(self.context.get_data_type(dtype), SHORT_ROW_VALUES)
        pointer = self.builder.bitcast(data, vector.as_pointer())
        i32 = ir.IntType(32)
        if op == "load":
            signature = ir.FunctionType(vector, [pointer.type, i32, self.mask.type, vector])
        else:
            signature = ir.FunctionType(ir.VoidType(), [vector, pointer.type, i32, self.mask.type])
        # (named for typed pointers, ...p0v16f32, as llvmlite writes them; LLVMs of opaque pointers rename it ...p0)
        kind = f"v{SHORT_ROW_VALUES}f{dtype.bitwidth}"
        return (
            vector,
            pointer,
            cgutils.get_or_insert_function(self.builder.module, signature, f"llvm.masked.{op}.{kind}.p0{kind}"),
        )

    def load(self, arraytype, array):
        """The row, 0 in the lanes past its end (for which no memory is read)."""
        return self.load_at(arraytype.dtype, self.context.make_array(arraytype)(self.context, self.builder, array).data)

    def load_at(self, dtype, data):
        """``load`` of the row of ``dtype`` that starts at ``data``."""
        vector, pointer, load = self._masked("load", dtype, data)
        align = ir.Constant(ir.IntType(32), dtype.bitwidth // 8)
        return self.builder.call(load, [pointer, align, self.mask, ir.Constant(vector, None)])

    def store(self, arraytype, array, value):
        """``value`` into the row, rounded to its dtype if wider (its lanes past the row's end are not written)."""
        data = self.context.make_array(arraytype)(self.context, self.builder, array).data
        self.store_at(arraytype.dtype, data, value)

    def store_at(self, dtype, data, value):
        """``store`` into the row of ``dtype`` that starts at ``data``."""
        vector, pointer, store = self._masked("store", dtype, data)
        if value.type != vector:
            value = self.builder.fptrunc(value, vector)
        align = ir.Constant(ir.IntType(32), dtype.bitwidth // 8)
        self.builder.call(store, [value, pointer, align, self.mask])

    def float64(self, value):
        """``value`` in float64 (each lane converted exactly)."""
        lanes = ir.VectorType(ir.DoubleType(), SHORT_ROW_VALUES)
        return value if value.type == lanes else self.builder.fpext(value, lanes)

    def add(self, a, b):
        """a + b, lane by lane, as numba adds: float32 with float64 in float64 (a float64 weight or bias, which
        float32 data may have: ``_affine2``)."""
        return self.builder.fadd(*self._promoted(a, b))

    def sub(self, a, b):
        """a - b, as ``add``."""
        return self.builder.fsub(*self._promoted(a, b))

    def mul(self, a, b):
        """a * b, as ``add``."""
        return self.builder.fmul(*self._promoted(a, b))

    def choose(self, condition, a, b):
        """a where ``condition`` (a scalar) holds, else b, in the wider type of the two."""
        return self.builder.select(condition, *self._promoted(a, b))

    def _promoted(self, a, b):
        return (a, b) if a.type == b.type else (self.float64(a), self.float64(b))

    def zero_past_end(self, value):
        """``value`` with its lanes past the row's end set to 0."""
        return self.builder.select(self.mask, value, ir.Constant(value.type, None))

    def sum(self, value):
        """The sum of the lanes (0 past the row's end), the halves added pairwise: 8 + 8 lanes, 4 + 4, 2 + 2,
        1 + 1, four dependent additions where a loop's sum makes a chain of 15."""
        i32, lanes = ir.IntType(32), SHORT_ROW_VALUES
        while lanes > 1:
            half = lanes // 2
            low, high = (
                self.builder.shuffle_vector(
                    value, value, ir.Constant(ir.VectorType(i32, half), list(range(k, k + half)))
                )
                for k in (0, half)
            )
            value, lanes = self.builder.fadd(low, high), half
        return self.builder.extract_element(value, ir.Constant(i32, 0))


class _ShortRows(_ShortRow):
    """``_ShortRow`` for a block of SHORT_ROW_VALUES rows of n <= SHORT_ROW_VALUES values each (a 2-D C-contiguous
    array), whose sums it takes together (``sums``)."""

    def __init__(self, context, builder, blocktype, block):
        self.context, self.builder = context, builder
        array = context.make_array(blocktype)(context, builder, block)
        self.data = array.data
        self.mask_past(builder.extract_value(array.shape, 1))

    def row_at(self, data, r):
        """Where row r (an int, or an LLVM integer) of a C-contiguous array of such rows that starts at ``data``
        starts."""
        r = r if isinstance(r, ir.Value) else ir.Constant(self.n.type, r)
        return self.builder.gep(data, [self.builder.mul(r, self.n)])

    def sums(self, rows):
        """The sums of the lanes of each of the SHORT_ROW_VALUES vectors ``rows``, as one vector (lane r: row r's),
        each added as ``_ShortRow.sum`` adds one row, the same bits: halves added pairwise, lane i + lane i + 8,
        then i + 4, i + 2, i + 1. Two rows at a time, each step's halves of both rows gathered into one vector (the
        shuffles that ``sum`` spends on one row move two), so that 16 rows take 15 vector additions where one at a
        time they take 64, on chains of 4 additions that do not wait on each other."""
        i32, lanes = ir.IntType(32), SHORT_ROW_VALUES
        per_row, vectors = lanes, list(rows)  # (each vector: lanes // per_row rows of per_row partial sums)
        while len(vectors) > 1:
            half = per_row // 2
            count = lanes // per_row  # (rows in each vector)
            low = [t * per_row + i for t in range(count) for i in range(half)]
            low = low + [lanes + k for k in low]
            high = [k + half for k in low]
            vectors = [
                self.builder.fadd(
                    *(self.builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(i32, lanes), m)) for m in (low, high))
                )
                for a, b in zip(vectors[0::2], vectors[1::2])
            ]
            per_row = half
        return vectors[0]

    def store_sums(self, arraytype, array, value):
        """The vector ``value`` of SHORT_ROW_VALUES float64 sums into the first SHORT_ROW_VALUES values of ``array``."""
        data = self.context.make_array(arraytype)(self.context, self.builder, array).data
        self.builder.store(value, self.builder.bitcast(data, value.type.as_pointer()), align=8)

    def load_sums(self, arraytype, array):
        """The first SHORT_ROW_VALUES float64 values of ``array`` as one vector (``store_sums``' inverse)."""
        data = self.context.make_array(arraytype)(self.context, self.builder, array).data
        pointer = self.builder.bitcast(data, ir.VectorType(ir.DoubleType(), SHORT_ROW_VALUES).as_pointer())
        return self.builder.load(pointer, align=8)

    def lane(self, value, r):
        """Lane r of the vector ``value``, in every lane."""
        i32 = ir.IntType(32)
        return self.builder.shuffle_vector(value, value, ir.Constant(ir.VectorType(i32, SHORT_ROW_VALUES), r))

    def in_dtype(self, value, dtype):
        """``_in_dtype_of``, lane by lane: the float64 vector ``value`` rounded to ``dtype`` (itself for float64)."""
        data = ir.VectorType(self.context.get_data_type(dtype), SHORT_ROW_VALUES)
        return value if value.type == data else self.builder.fptrunc(value, data)

    def split(self, means, rstd, dtype):
        """``_split`` and ``_in_dtype_of``, lane by lane, of the float64 vectors ``means`` and ``rstd`` for data of
        ``dtype``: (mu_hi, mu_lo, rstd) in it, mu_hi = mu rounded to it, mu_lo = (mu - mu_hi) rounded (0 where mu is
        not finite), rstd rounded; for float64 data (mu, 0, rstd)."""
        builder, lanes = self.builder, SHORT_ROW_VALUES
        f64 = means.type
        mu_hi, r = self.in_dtype(means, dtype), self.in_dtype(rstd, dtype)
        if mu_hi.type == f64:
            return means, ir.Constant(f64, None), rstd
        fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f64, [f64]), f"llvm.fabs.v{lanes}f64")
        finite = builder.fcmp_ordered("<", builder.call(fabs, [means]), ir.Constant(f64, [math.inf] * lanes))
        low = builder.fptrunc(builder.fsub(means, builder.fpext(mu_hi, f64)), mu_hi.type)
        return mu_hi, builder.select(finite, low, ir.Constant(mu_hi.type, None)), r


@intrinsic
def _short_block_forward(typingctx, xb, yb, w2, b2, g, has_b, eps, centered, mean, var):
    """The forward of a block of SHORT_ROW_VALUES rows, xb[r] -> yb[r], row r the weight and bias rows (g + r) % G of
    w2 and b2 (G, n), its mean and variance into mean[r] and var[r]: what the short rows' three passes in
    ``_forward_rows`` do to each row (``_short_sum`` / n, or 0 without ``centered``; ``_short_sum_sq_dev`` / n;
    rstd = 1 / sqrt(var + eps); ``_short_normalize_row``), the same operations and bits, each row loaded once
    and all 16 rows' sums taken together (``_ShortRows.sums``), and their divisions, square roots, and means'
    splits (``_split``) done as vectors of 16 rows."""

    def codegen(context, builder, sig, args):
        rows = _ShortRows(context, builder, sig.args[0], args[0])
        xtype, ytype, wtype, btype = sig.args[:4]
        y_arr, w_arr, b_arr = (context.make_array(t)(context, builder, a) for t, a in zip(sig.args[1:4], args[1:4]))
        y_data, w_data, b_data, G = y_arr.data, w_arr.data, b_arr.data, builder.extract_value(w_arr.shape, 0)
        g, has_b, eps, centered, mean, var = args[4:10]
        lanes, lane = SHORT_ROW_VALUES, rows.lane
        f64 = ir.VectorType(ir.DoubleType(), lanes)
        x = [rows.load_at(xtype.dtype, rows.row_at(rows.data, r)) for r in range(lanes)]
        wide = [rows.float64(v) for v in x]
        n = rows.splat(builder.sitofp(rows.n, ir.DoubleType()))
        means = builder.select(centered, builder.fdiv(rows.sums(wide), n), ir.Constant(f64, None))
        squares = []
        for r in range(lanes):
            d = rows.sub(wide[r], lane(means, r))
            squares.append(rows.zero_past_end(rows.mul(d, d)))
        variances = builder.fdiv(rows.sums(squares), n)
        rows.store_sums(sig.args[8], mean, means)
        rows.store_sums(sig.args[9], var, variances)
        sqrt = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f64, [f64]), f"llvm.sqrt.v{lanes}f64")
        rstd = builder.fdiv(
            ir.Constant(f64, [1.0] * lanes), builder.call(sqrt, [builder.fadd(variances, rows.splat(eps))])
        )
        mu_hi, mu_lo, r_x = rows.split(means, rstd, xtype.dtype)
        for r in range(lanes):
            w = rows.load_at(wtype.dtype, rows.row_at(w_data, g))
            b = rows.load_at(btype.dtype, rows.row_at(b_data, g))
            y = rows.mul(rows.mul(rows.sub(rows.sub(x[r], lane(mu_hi, r)), lane(mu_lo, r)), lane(r_x, r)), w)
            rows.store_at(ytype.dtype, rows.row_at(y_data, r), rows.choose(has_b, rows.add(y, b), y))
            g = builder.add(g, ir.Constant(g.type, 1))
            g = builder.select(builder.icmp_signed("==", g, G), ir.Constant(g.type, 0), g)
        return context.get_dummy_value()

    return nbtypes.none(xb, yb, w2, b2, g, has_b, eps, centered, mean, var), codegen


@intrinsic
def _short_sum(typingctx, v):
    """``_sum(v)`` of a short row: sum(v), in float64."""

    def codegen(context, builder, sig, args):
        row = _ShortRow(context, builder, sig.args[0], args[0])
        return row.sum(row.float64(row.load(sig.args[0], args[0])))

    return nbtypes.float64(v), codegen


@intrinsic
def _short_sum_sq_dev(typingctx, v, mu):
    """``_sum_sq_dev(v, mu)`` of a short row: sum((v - mu)^2), in float64."""

    def codegen(context, builder, sig, args):
        row = _ShortRow(context, builder, sig.args[0], args[0])
        d = row.sub(row.float64(row.load(sig.args[0], args[0])), row.splat(args[1]))
        return row.sum(row.zero_past_end(row.mul(d, d)))

    return nbtypes.float64(v, mu), codegen


@intrinsic
def _short_normalize(typingctx, xb, yb, w, b, has_b, mh, ml, r):
    """``_normalize_row``'s loop over a short row, its mean split (``_split``) and rstd given in x's dtype:
    y = ((x - mu_hi) - mu_lo) * rstd * w + b (without b unless ``has_b``), in x's dtype."""

    def codegen(context, builder, sig, args):
        row = _ShortRow(context, builder, sig.args[0], args[0])
        x, w, b = (row.load(sig.args[k], args[k]) for k in (0, 2, 3))
        mh, ml, r = (row.splat(a) for a in args[5:])
        y = row.mul(row.mul(row.sub(row.sub(x, mh), ml), r), w)
        row.store(sig.args[1], args[1], row.choose(args[4], row.add(y, b), y))
        return context.get_dummy_value()

    return nbtypes.none(xb, yb, w, b, has_b, mh, ml, r), codegen


@intrinsic
def _short_row_dy_sums(typingctx, dy, x, mu, r):
    """``_row_dy_sums(dy, x, mu, r)`` of a short row: (sum(dy), sum(dy * xhat)), xhat = (x - mu) * r, in
    float64."""

    def codegen(context, builder, sig, args):
        row = _ShortRow(context, builder, sig.args[0], args[0])
        dy, x = (row.float64(row.load(sig.args[k], args[k])) for k in (0, 1))
        mu, r = (row.splat(a) for a in args[2:])
        dy_xhat = row.zero_past_end(row.mul(dy, row.mul(row.sub(x, mu), r)))
        return context.make_tuple(builder, sig.return_type, [row.sum(dy), row.sum(dy_xhat)])

    return nbtypes.UniTuple(nbtypes.float64, 2)(dy, x, mu, r), codegen


@intrinsic
def _short_row_dx_sums(typingctx, dy, x, w, mu, r):
    """``_row_dx_sums(dy, x, w, mu, r)`` of a short row: (sum(dxhat), sum(dxhat * xhat)), dxhat = dy * w,
    xhat = (x - mu) * r, in float64."""

    def codegen(context, builder, sig, args):
        row = _ShortRow(context, builder, sig.args[0], args[0])
        dy, x, w = (row.float64(row.load(sig.args[k], args[k])) for k in (0, 1, 2))
        mu, r = (row.splat(a) for a in args[3:])
        dxhat = row.mul(dy, w)
        dxhat_xhat = row.zero_past_end(row.mul(dxhat, row.mul(row.sub(x, mu), r)))
        return context.make_tuple(builder, sig.return_type, [row.sum(dxhat), row.sum(dxhat_xhat)])

    return nbtypes.UniTuple(nbtypes.float64, 2)(dy, x, w, mu, r), codegen


@intrinsic
def _short_dx(typingctx, dyb, xb, dxb, w, mh, ml, r, proj, mdx, fixed):
    """``_dx_row``'s loops over a short row, its scalars given in x's dtype (``_dx_scalars``):
    dx = ((dy * w - xhat * proj) - mdx) * rstd, xhat = ((x - mu_hi) - mu_lo) * rstd, or, with ``fixed``
    statistics, dy * w * rstd, in x's dtype (``_dx``)."""

    def codegen(context, builder, sig, args):
        row = _ShortRow(context, builder, sig.args[0], args[0])
        dy, x, w = (row.load(sig.args[k], args[k]) for k in (0, 1, 3))
        mh, ml, r, proj, mdx = (row.splat(a) for a in args[4:9])
        dxhat = row.mul(dy, w)
        xhat = row.mul(row.sub(row.sub(x, mh), ml), r)
        dx = row.mul(row.sub(row.sub(dxhat, row.mul(xhat, proj)), mdx), r)
        row.store(sig.args[2], args[2], row.choose(args[9], row.mul(dxhat, r), dx))
        return context.get_dummy_value()

    return nbtypes.none(dyb, xb, dxb, w, mh, ml, r, proj, mdx, fixed), codegen


@intrinsic
def _short_block_backward(typingctx, dyb, xb, dxb, w2, g, mean, rstd, use_mean, fixed, affine, pw, pb):
    """The backward of a block of SHORT_ROW_VALUES rows dyb[r], xb[r] -> dxb[r], row r's weight row g + r of w2, its
    mean and rstd mean[r] and rstd[r]: what ``_lean_rows`` does to each row, the same operations and bits, the 16
    rows' sums taken together (``_ShortRows.sums``) and their scalars as vectors of 16 rows. The rows are read again
    for dx, from L1, rather than kept through the sums (float32 the same time; float64 rows, which do not come here,
    1.22 of the rows' time one at a time instead of 1.32).

    The sums, in float64, xhat = (x - mu) * rstd (mu = 0 without ``use_mean``): with ``affine`` (each weight row one
    finite value w repeated) a = sum(dy) and b = sum(dy * xhat) (``_short_row_dy_sums``), added to pb[r, 0] and
    pw[r, 0], and A = w * a, B = w * b; without, A = sum(dy * w), B = sum(dy * w * xhat) (``_short_row_dx_sums``).
    A = B = 0 with ``fixed``. Then proj = B / n, mdx = A / n (0 without ``use_mean``), and dx as ``_short_dx`` takes
    it, in x's dtype: ((dy * w - xhat * proj) - mdx) * rstd, xhat = ((x - mu_hi) - mu_lo) * rstd, or dy * w * rstd
    with ``fixed``."""

    def codegen(context, builder, sig, args):
        rows = _ShortRows(context, builder, sig.args[1], args[1])
        dytype, xtype, dxtype, wtype = sig.args[:4]
        dy_data, dx_data, w_data = (context.make_array(sig.args[k])(context, builder, args[k]).data for k in (0, 2, 3))
        g, use_mean, fixed, affine = args[4], args[7], args[8], args[9]
        lanes, lane = SHORT_ROW_VALUES, rows.lane
        f64 = ir.VectorType(ir.DoubleType(), lanes)
        zero = ir.Constant(f64, None)

        def row(r):
            """(dy, x, w) of row r, in their dtypes."""
            w_row = rows.row_at(w_data, builder.add(g, ir.Constant(g.type, r)))
            return (
                rows.load_at(dytype.dtype, rows.row_at(dy_data, r)),
                rows.load_at(xtype.dtype, rows.row_at(rows.data, r)),
                rows.load_at(wtype.dtype, w_row),
            )

        mu = builder.select(use_mean, rows.load_sums(sig.args[5], args[5]), zero)
        rstd = rows.load_sums(sig.args[6], args[6])
        terms, term_xhats, first_weights = [], [], zero
        for r in range(lanes):
            dy_r, x_r, w_r = (rows.float64(v) for v in row(r))
            term = builder.select(affine, dy_r, rows.mul(dy_r, w_r))
            xhat = rows.mul(rows.sub(x_r, lane(mu, r)), lane(rstd, r))
            terms.append(term)
            term_xhats.append(rows.zero_past_end(rows.mul(term, xhat)))
            first_weights = builder.insert_element(
                first_weights,
                builder.extract_element(w_r, ir.Constant(ir.IntType(32), 0)),
                ir.Constant(ir.IntType(32), r),
            )
        a, b = rows.sums(terms), rows.sums(term_xhats)
        with builder.if_then(affine):
            rows.store_sums(sig.args[10], args[10], builder.fadd(rows.load_sums(sig.args[10], args[10]), b))
            rows.store_sums(sig.args[11], args[11], builder.fadd(rows.load_sums(sig.args[11], args[11]), a))
        A = builder.select(affine, builder.fmul(first_weights, a), a)
        B = builder.select(affine, builder.fmul(first_weights, b), b)
        n = rows.splat(builder.sitofp(rows.n, ir.DoubleType()))
        proj = builder.select(fixed, zero, builder.fdiv(B, n))
        mdx = builder.select(builder.and_(use_mean, builder.not_(fixed)), builder.fdiv(A, n), zero)
        mu_hi, mu_lo, r_x = rows.split(mu, rstd, xtype.dtype)
        proj, mdx = rows.in_dtype(proj, xtype.dtype), rows.in_dtype(mdx, xtype.dtype)
        for r in range(lanes):
            dy_r, x_r, w_r = row(r)  # (again, from L1: see above)
            dxhat = rows.mul(dy_r, w_r)
            xhat = rows.mul(rows.sub(rows.sub(x_r, lane(mu_hi, r)), lane(mu_lo, r)), lane(r_x, r))
            dx = rows.mul(rows.sub(rows.sub(dxhat, rows.mul(xhat, lane(proj, r))), lane(mdx, r)), lane(r_x, r))
            rows.store_at(dxtype.dtype, rows.row_at(dx_data, r), rows.choose(fixed, rows.mul(dxhat, lane(r_x, r)), dx))
        return context.get_dummy_value()

    return nbtypes.none(dyb, xb, dxb, w2, g, mean, rstd, use_mean, fixed, affine, pw, pb), codegen


# ---------------------------------------------------------------------------
# reductions over one contiguous run (the only code with a fastmath flag)


@_helper
def _sum(v):
    s = 0.0
    for i in range(v.shape[0]):
        s += v[i]
    return s


@_helper
def _sum_sq_dev(v, mu):
    """sum((v - mu)^2), in float64.

    Summed in float32 for float32 data (the deviations (v - mu_hi) - mu_lo, ``_split``, squared and summed over
    pieces of P values, the pieces' sums in float64), it took the float32 forward from cold caches on 2 threads
    (``benchmarks/compare_kernels.py --cold --floor``, the AMD Zen 4 VM), with P = 128, 0.92 of the time on
    InstanceNorm 32x64x56x56, 0.94 on GroupNorm, 0.93-0.97 on BatchNorm, 0.96 on LayerNorm 4096x768, 1.03 on
    rows of 128 values; with P = 32, 0.97 and 1.18. Not taken: a reassociated float32 sum of P positive terms
    is off by up to (P - 1) u of it, in whatever order LLVM adds them, so the bound on y (module docstring)
    would grow from 8 u to about (8 + (P + 4) / 2) u, 74 u for P = 128, for 4-8 % of the time."""
    s = 0.0
    for i in range(v.shape[0]):
        d = v[i] - mu
        s += d * d
    return s


@_helper
def _sum_pair(a, b):
    """(_sum(a), _sum(b)) for runs of equal length, in one loop: two read streams at once."""
    s = 0.0
    t = 0.0
    for i in range(a.shape[0]):
        s += a[i]
        t += b[i]
    return s, t


@_helper
def _sum_sq_dev_pair(a, mu_a, b, mu_b):
    """(_sum_sq_dev(a, mu_a), _sum_sq_dev(b, mu_b)) for runs of equal length, in one loop."""
    s = 0.0
    t = 0.0
    for i in range(a.shape[0]):
        d = a[i] - mu_a
        e = b[i] - mu_b
        s += d * d
        t += e * e
    return s, t


@_helper
def _count(m):
    c = 0.0
    for i in range(m.shape[0]):
        c += 1.0 if m[i] else 0.0
    return c


@_helper
def _masked_sum(v, m):
    s = 0.0
    for i in range(v.shape[0]):
        if m[i]:
            s += v[i]
    return s


@_helper
def _masked_sum_sq_dev(v, m, mu):
    s = 0.0
    for i in range(v.shape[0]):
        if m[i]:
            d = v[i] - mu
            s += d * d
    return s


@_helper
def _row_dx_sums(dy, x, w, mu, r):
    """The sums pass of a row's backward (S == 1, no mask; LayerNorm, RMSNorm): sum(dxhat) and
    sum(dxhat * xhat), dxhat = dy * w. The row's dweight/dbias terms are added in its dx pass
    (``_dx_row_affine``), so this pass, which reads the row from DRAM, does little else. Its arithmetic is
    hidden behind the memory: with the products in x's dtype (still summed in float64), a quarter less work
    per value in L1, the float32 LayerNorm backward took 0.97-1.01 of the time from cold caches on 2 threads
    (0.92-0.98 on one; the AMD Zen 4 VM). Two rows' sums in one loop (four read streams, as the blocks'
    ``_dy_sums_pair``) took it 0.94 on rows of 1024 values but 1.15 on 768, and without dweight/dbias 1.36-1.44
    (``compare_kernels.py --cold``, 2 threads): not taken. Nor a float64 copy of the weight, made once per work
    item, in place of w here (one conversion fewer per value, the same bits): float32 rows of 1024 values 1.02 of
    the time on one thread and 1.06 on two, of 128 values 0.95 (cold)."""
    a = 0.0
    b = 0.0
    for i in range(dy.shape[0]):
        dxh = np.float64(dy[i]) * w[i]
        a += dxh
        b += dxh * ((x[i] - mu) * r)
    return a, b


@_helper
def _dy_sums(dy, x, m, has_mask, wk, mu, r):
    """Over a run of S values sharing the weight wk: sum(dy) and sum(dy * xhat) for dbias/dweight,
    sum(dxhat) and sum(dxhat * xhat) for dx (dxhat = dy * wk), like the reference: a masked-out
    position is no term, so whatever it holds (even NaN) reaches no sum. (Not a term dy = 0: that made
    dxhat = 0 * wk NaN for an infinite weight, and NaN every dx of its group where the reference has +-inf.)"""
    a = b = c = d = 0.0
    for i in range(dy.shape[0]):
        if not has_mask or m[i]:
            dyi = np.float64(dy[i])
            xh = (x[i] - mu) * r
            dxh = dyi * wk
            a += dyi
            b += dyi * xh
            c += dxh
            d += dxh * xh
    return a, b, c, d


@_helper
def _row_dy_sums(dy, x, mu, r):
    """sum(dy) and sum(dy * xhat) over a row whose weight is one value w (InstanceNorm's small maps taken as
    rows; and the runs of ``_run_dy_sums``): the row's dbias and dweight terms, and, times w, the sums of dxhat
    and dxhat * xhat that dx needs.
    Two sums per value where ``_dy_sums`` takes four, and no mask: ``benchmarks/compare_kernels.py`` (the AMD
    Zen 4 VM) took the float32 backward on 4x4 maps (4096, 64, 1, 16) and on maps of 8 values 0.82-0.83 of the
    time from cold caches on 1 and 2 threads (0.84-0.88 hot); float64, whose rows there move twice the bytes,
    0.95-0.97 hot and 1.02-1.06 cold, where two copies of the same loops read up to 1.08 apart. (The same two sums
    inside ``_dy_sums``, behind a test of the weight there, took those rows 1.04-1.44 of the time. LLVM inlines
    this small function into the rows' loop, and leaves ``_dy_sums`` a call: likely the difference.)"""
    a = 0.0
    b = 0.0
    for i in range(dy.shape[0]):
        d = np.float64(dy[i])
        a += d
        b += d * ((x[i] - mu) * r)
    return a, b


@_helper
def _row_dy_sums_pair(dya, xa, mu_a, r_a, dyb, xb, mu_b, r_b):
    """(_row_dy_sums(dya, xa, mu_a, r_a), _row_dy_sums(dyb, xb, mu_b, r_b)) for runs of equal length, in one
    loop: four read streams at once.

    (Summed in float32 over pieces of 64 values, xhat in float32 as in dx, the pieces' sums in float64: float32
    InstanceNorm 32x64x56x56 backward 1.03-1.04 of the time cold, BatchNorm 1.07, twin 0.99-1.01 (2 threads, the
    AMD VM of CPU family 26). Not taken: slower, and it would widen dx's bound.)"""
    a = b = c = d = 0.0
    for i in range(dya.shape[0]):
        p = np.float64(dya[i])
        q = np.float64(dyb[i])
        a += p
        b += p * ((xa[i] - mu_a) * r_a)
        c += q
        d += q * ((xb[i] - mu_b) * r_b)
    return (a, b), (c, d)


@numba.njit(inline="always")
def _run_dy_sums(dy, x, m, has_mask, wk, mu, r):
    """``_dy_sums`` of a run of one weight wk: where the run is unmasked and wk finite, its two sums
    (``_row_dy_sums``) and, times wk, the two that dx needs (a product that would hide the NaN the terms
    make, inf * 0 and inf + -inf, is left to ``_dy_sums``, as in ``_column_dxhat_sums``). Each run of a block
    has one weight (a GroupNorm run, an InstanceNorm block, a BatchNorm channel's block; the pairs of blocks
    take the same two sums, ``_row_dy_sums_pair``).

    Against the four sums per value of ``_dy_sums``, ``benchmarks/compare_kernels.py --floor`` (2 threads, the
    AMD VM of CPU family 26, 32x64x56x56; two copies of the same code 0.95-1.04 apart) took the backward from
    cold caches: float32 InstanceNorm 0.90, BatchNorm 0.80-0.82, GroupNorm (8 groups) 0.98-1.00, float64 0.94,
    0.90-0.91 and 0.94-0.97; hot, float32 0.80-0.81, 0.78 and 0.90; and the cold compile of every kernel 0.99x
    (``benchmarks/compile_time.py``, medians of 3 rounds). The rows' loop (``_backward_rows``) keeps its own
    test of the weight: this function in its place took InstanceNorm's 4x4 maps 1.47-1.49 of the time. (A block's
    runs two at a time, as the pairs of blocks, ``_row_dy_sums_pair`` on runs k and k + 1: float32 GroupNorm
    backward with 8 groups of 32x64x56x56 1.16-1.22 of the time cold, of 16x32x4x196 (maps of 14x14) 1.10-1.12;
    32x64x2x1568, runs of 1568 values, 0.94-0.95: not taken.)"""
    if has_mask or not math.isfinite(wk):
        return _dy_sums(dy, x, m, has_mask, wk, mu, r)
    a, b = _row_dy_sums(dy, x, mu, r)
    return a, b, wk * a, wk * b


# ---------------------------------------------------------------------------
# per-group pieces (plain flags: exact IEEE semantics)


@numba.njit(error_model="numpy", inline="always")
def _group_count(mask2, has_mask, n0, n1, K, S):
    """How many valid values the group over blocks n0..n1 has: K * S per block, or K * (valid s)."""
    count = 0.0
    for n in range(n0, n1):
        count += K * (_count(mask2[n]) if has_mask else S)
    return count


@numba.njit(error_model="numpy", inline="always")
def _group_sum(x3, mask2, has_mask, n0, n1, g, K, S, mu, square):
    """sum(x) (or, with ``square``, sum((x - mu)^2)) over the valid values of x3[n0:n1, g].

    Unmasked blocks go two at a time (``_sum_pair``): two read streams, as ``_forward_groups`` pairs its
    blocks. ``benchmarks/compare_kernels.py`` (2 threads, the AMD Zen 4 VM) took the BatchNorm forward of
    float32 32x64x56x56 0.92-0.96 of the time cold (four runs), 0.91 hot, float64 0.96 cold; of 32x64x14x14
    0.96-0.97. (Each pair's variance from its own mean, in L1, merged with Chan's update instead of a second
    pass over the channel in L2: no clearer, 0.93 of the time before either change, and 1.07 on 32x64x14x14.)"""
    total = 0.0
    if not has_mask:
        for n in range(n0, n1 - 1, 2):
            xa, xb = x3[n, g], x3[n + 1, g]
            a, b = _sum_sq_dev_pair(xa, mu, xb, mu) if square else _sum_pair(xa, xb)
            total += a
            total += b
        if (n1 - n0) % 2:
            xb = x3[n1 - 1, g]
            total += _sum_sq_dev(xb, mu) if square else _sum(xb)
        return total
    for n in range(n0, n1):
        xb = x3[n, g]
        for k in range(K):
            xs = xb[k * S : (k + 1) * S]
            total += _masked_sum_sq_dev(xs, mask2[n], mu) if square else _masked_sum(xs, mask2[n])
    return total


@numba.njit(error_model="numpy", inline="always")
def _group_stats(x3, mask2, has_mask, centered, n0, n1, g, K, S):
    """(mean, var) of x3[n0:n1, g] over the valid values, in two passes."""
    if n1 == n0 + 1 and not has_mask:
        # one contiguous block (an InstanceNorm/GroupNorm block): the two passes directly, without the
        # per-block loops and counts below
        xb = x3[n0, g]
        mu = _sum(xb) / xb.shape[0] if centered else 0.0
        return mu, _sum_sq_dev(xb, mu) / xb.shape[0]
    count = _group_count(mask2, has_mask, n0, n1, K, S)
    mu = _group_sum(x3, mask2, has_mask, n0, n1, g, K, S, 0.0, False) / count if centered else 0.0
    return mu, _group_sum(x3, mask2, has_mask, n0, n1, g, K, S, mu, True) / count


@numba.njit(error_model="numpy", inline="always")
def _normalize_row(xb, yb, w, b, has_b, mu, r):
    """y = (x - mean) * rstd * w + b over a contiguous run sharing one (mean, rstd), with one weight
    and bias per value (a LayerNorm row), in x's dtype."""
    mh, ml = _split(xb, mu)
    r = _in_dtype_of(xb, r)
    if has_b:
        for i in range(xb.shape[0]):
            yb[i] = ((xb[i] - mh) - ml) * r * w[i] + b[i]
    else:
        for i in range(xb.shape[0]):
            yb[i] = ((xb[i] - mh) - ml) * r * w[i]


@numba.njit(error_model="numpy", inline="always")
def _short_normalize_row(xb, yb, w, b, has_b, mu, r):
    """``_normalize_row`` of a short row: one vector (``_short_normalize``)."""
    mh, ml = _split(xb, mu)
    _short_normalize(xb, yb, w, b, has_b, mh, ml, _in_dtype_of(xb, r))


@numba.njit(error_model="numpy", inline="always")
def _normalize_block(xb, yb, w, b, has_b, mrow, has_mask, mu, r, K, S):
    """``_normalize_row`` on one (n, g) block of K runs of S values, the weight and bias per run; 0
    where masked out.

    (With rstd * w taken once per run, in float64 and rounded, one multiplication a value fewer: float32
    InstanceNorm, BatchNorm and GroupNorm 32x64x56x56 forward 0.98 of the time cold on 2 threads, 8x64x56x56
    0.99-1.00 hot on one, where the twin read 0.99-1.01 (the AMD VM of CPU family 26): not taken.)"""
    if S == 1:
        _normalize_row(xb, yb, w, b, has_b, mu, r)
    else:
        mh, ml = _split(xb, mu)
        rs = _in_dtype_of(xb, r)
        for k in range(K):
            xs = xb[k * S : (k + 1) * S]
            ys = yb[k * S : (k + 1) * S]
            wk = w[k]
            if has_b:
                bk = b[k]
                for s in range(S):
                    ys[s] = ((xs[s] - mh) - ml) * rs * wk + bk
            else:
                for s in range(S):
                    ys[s] = ((xs[s] - mh) - ml) * rs * wk
    if has_mask:
        for k in range(K):
            ys = yb[k * S : (k + 1) * S]
            for s in range(S):
                if not mrow[s]:
                    ys[s] = 0.0


@numba.njit(inline="always")
def _streams_by_runs(S, itemsize):
    """Whether a streamed (n, g) block of K runs of S values goes out run by run, each in pieces of at most
    the scratch row (``_scratch_len``), rather than whole through a scratch row of the block's size: when
    a run is long enough to stream on its own (STREAMED_RUN_MIN_BYTES)."""
    return S * itemsize >= STREAMED_RUN_MIN_BYTES


@numba.njit(inline="always")
def _stream_pieces(K, S, scratch):
    """(runs, values of a run) in each piece a streamed block is computed and streamed in: (1, up to the
    scratch row's length) by runs (``_streams_by_runs``), else (K, S), the whole block."""
    if _streams_by_runs(S, scratch.itemsize):
        return 1, max(1, scratch.shape[0])  # (the scratch row is empty when nothing is streamed)
    return K, S


@numba.njit(inline="always")
def _scratch_len(L, S, rows, itemsize):
    """Values in the scratch row a streamed block goes through: a batch of short rows (``rows`` of at most
    SHORT_ROW_VALUES values, ``_short_rows_batch``) whole, a longer row or a run of a
    block (``_streams_by_runs``) in pieces of STREAM_CHUNK_BYTES, else a whole block of L values.

    Computed whole into the scratch row and then streamed out, a long row or block leaves L1 (32 KiB
    here, which also holds the input row and, for a row, its weight and bias) and makes the round trip
    through L2. In pieces of 4 KiB, ``benchmarks/compare_kernels.py`` (2 threads, the AMD VM) took
    LayerNorm 512x4096 (float32 rows of 16 KiB) 0.91-0.99 of the time forward, 0.94-0.96 backward,
    float64 0.84-0.92 and 0.94; in pieces of 2 KiB, rows of 768 and 1024 float32 values took 1.01-1.04.
    A GroupNorm block of 8 channels of 3136 float32 values (98 KiB) run by run, whole runs: forward
    0.91-0.97, backward 0.86-0.92, float32 and float64, cold and hot. Those runs (12 KiB) and the blocks
    of InstanceNorm and BatchNorm (one such run) in pieces of 4 KiB: float32 0.96-1.04 of the time,
    float64 (runs of 24 KiB) 0.89-0.95 cold. In pieces of 8 KiB, LayerNorm rows of 768, 1024 and 4096 values
    took 0.96-1.06 of the time cold, float32 and float64 (``--floor``, the AMD VM of CPU family 26)."""
    if rows and L <= SHORT_ROW_VALUES:
        return _short_rows_batch(L, itemsize) * L
    if rows or _streams_by_runs(S, itemsize):
        return min(L, STREAM_CHUNK_BYTES // itemsize)
    return L


@numba.njit(error_model="numpy", inline="always")
def _backward_sums(dy3, x3, w, mask2, has_mask, mu, r, n0, n1, g, K, S, pdw, pdb, affine):
    """A = sum(dxhat), B = sum(dxhat * xhat) over x3[n0:n1, g] (valid positions), adding (with
    ``affine``) sum(dy * xhat) and sum(dy) per k into the partial buffers pdw, pdb. Unmasked blocks of
    one run each with a finite weight (a BatchNorm channel's) go two at a time (``_backward_sums_pair``), other
    runs one at a time (``_run_dy_sums``)."""
    A = 0.0
    B = 0.0
    n = n0
    while n < n1:
        if K == 1 and not has_mask and math.isfinite(w[0]) and n + 1 < n1:
            (wa, wb), (wc, wd) = _backward_sums_pair(dy3, x3, w, mu, r, n, g, pdw, pdb, affine)
            A, B = A + wa + wc, B + wb + wd
            n += 2
            continue
        xb = x3[n, g]
        dyb = dy3[n, g]
        for k in range(K):
            a, b, wa, wb = _run_dy_sums(
                dyb[k * S : (k + 1) * S], xb[k * S : (k + 1) * S], mask2[n], has_mask, np.float64(w[k]), mu, r
            )
            A += wa
            B += wb
            if affine:
                pdw[k] += b
                pdb[k] += a
        n += 1
    return A, B


@numba.njit(error_model="numpy", inline="always")
def _backward_sums_pair(dy3, x3, w, mu, r, n, g, pdw, pdb, affine):
    """The sums of ``_backward_sums`` for the unmasked blocks (n, g) and (n + 1, g) of one run each, a BatchNorm
    channel's two blocks with its statistics (mu, r), in one pass over both (``_row_dy_sums_pair``; A and B as the
    blocks' finite weight w[0] times their sums, see ``_run_dy_sums``): ((A, B) of the one, (A, B) of the
    other).

    From DRAM, a pass over one block's x and dy waits at each block's start for the hardware prefetcher
    to catch up, and a channel's blocks lie C*S values apart, each a fresh start; over two blocks it has four
    streams in flight. ``benchmarks/compare_kernels.py --cold`` (2 threads, the AMD VM of CPU family 26,
    32x64x56x56, against one block at a time, five runs) took the float32 BatchNorm backward 0.94-0.99 of the
    time, float64 0.92-0.94 (the least gained where the memory was slowest), and InstanceNorm's, when it walked
    each channel's blocks so, 0.90-0.99 and 0.94-0.95; hot 0.97-0.99 (8x64x56x56, inside the L3: 1.03-1.04).

    (InstanceNorm's blocks, in that channel walk, paired with their neighbours in memory instead, (n, g) and
    (n, g + 1), in work items of two channels, so that each pass reads one stretch of 2 L values of x and of dy:
    float32 32x64x56x56 1.01 of the time cold (1.07 without dweight/dbias), 8x64x56x56 1.03-1.06, 32x32x28x28
    1.06, where the twin read 0.97-1.03. In the rows' loop, one at a time in memory order but with that loop's
    own costs per row: slower too, see ``_as_rows``. Walked in memory order by a loop
    of their own, one at a time, they gained: see ``_backward_groups``.)"""
    (a, b), (c, d) = _row_dy_sums_pair(dy3[n, g], x3[n, g], mu, r, dy3[n + 1, g], x3[n + 1, g], mu, r)
    if affine:
        pdw[0] += b
        pdb[0] += a
        pdw[0] += d
        pdb[0] += c
    wk = np.float64(w[0])
    return (wk * a, wk * b), (wk * c, wk * d)


@numba.njit(error_model="numpy", inline="always")
def _dx_scalars(xb, mu, r, proj, mdx):
    """What ``_dx`` takes of a run's statistics, in x's dtype: (mu_hi, mu_lo) (``_split``), rstd, proj, mdx."""
    mh, ml = _split(xb, mu)
    return mh, ml, _in_dtype_of(xb, r), _in_dtype_of(xb, proj), _in_dtype_of(xb, mdx)


@numba.njit(error_model="numpy", inline="always")
def _xhat(x, mh, ml, r):
    """One value of xhat, in x's dtype: ((x - mu_hi) - mu_lo) * rstd (``_split``)."""
    return ((x - mh) - ml) * r


@numba.njit(error_model="numpy", inline="always")
def _dx(dy, wv, xh, r, proj, mdx):
    """One value of dx, in x's dtype: ((dxhat - xhat * proj) - mdx) * rstd, dxhat = dy * w, xhat from
    ``_xhat``; the reference's operation order. (With the products of a run's constants taken once, (dy * (w *
    rstd) - ((x - mu_hi) - mu_lo) * (proj * rstd * rstd)) - mdx * rstd, three operations a value fewer and another
    order, ``benchmarks/compare_kernels.py --cold`` took the float32 InstanceNorm and GroupNorm (8 groups)
    backward of 32x64x56x56 1.02-1.06 of the time on 2 threads, the AMD VM of CPU family 26: not taken.)"""
    return ((dy * wv - xh * proj) - mdx) * r


@numba.njit(error_model="numpy", inline="always")
def _dx_row(dyb, xb, dxb, w, mu, r, proj, mdx, fixed):
    """dx = ((dxhat - xhat * proj) - mdx) * rstd  (or dxhat * rstd with fixed statistics) over a
    contiguous run sharing one (mean, rstd), one weight per value (a LayerNorm row), in x's dtype."""
    mh, ml, r, proj, mdx = _dx_scalars(xb, mu, r, proj, mdx)
    if fixed:
        for i in range(xb.shape[0]):
            dxb[i] = dyb[i] * w[i] * r
    else:
        for i in range(xb.shape[0]):
            dxb[i] = _dx(dyb[i], w[i], _xhat(xb[i], mh, ml, r), r, proj, mdx)


@numba.njit(error_model="numpy", inline="always")
def _short_dx_row(dyb, xb, dxb, w, mu, r, proj, mdx, fixed):
    """``_dx_row`` of a short row: one vector (``_short_dx``)."""
    mh, ml, r, proj, mdx = _dx_scalars(xb, mu, r, proj, mdx)
    _short_dx(dyb, xb, dxb, w, mh, ml, r, proj, mdx, fixed)


@numba.njit(error_model="numpy", inline="always")
def _dx_row_affine(dyb, xb, dxb, w, mu, r, proj, mdx, fixed, tw, tb):
    """``_dx_row``, adding in the same loop the row's dweight and dbias terms, dy * xhat and dy, in x's dtype,
    into the term rows tw, tb (x's dtype: see ``_fold_terms``).

    Here, in the pass that re-reads the row from L1, rather than in the pass that reads it from DRAM
    (``_row_dx_sums``): that pass then has the little work per value that keeps the memory busy.
    ``benchmarks/compare_kernels.py --cold`` (2 threads, the AMD VM, two runs) took the LayerNorm backward,
    against the terms (then in float64) added in the sums pass, float32 rows of 768, 1024 and 4096 values
    0.86-0.91, 0.85-0.92 and 1.03-1.04 of the time, float64 0.93, 0.93 and 0.86-0.87; rows of 128 values
    1.05-1.09, inside what two copies of the same code read there (up to 1.34: see
    ``benchmarks/compare_kernels.py``). (The terms in a loop of their own after the dx loop, both on the
    piece in L1: float32 1.07-1.11 on rows of 768-4096 values. A pipeline one row deep, the terms of row n
    in the loop that reads row n + 1 from DRAM for its sums, so that the one's loads overlap the other's
    arithmetic: float32 rows of 1024 and 4096 values 0.99-1.20 and 1.09-1.22, and rows of 128 values 0.98
    in one process, 1.81 in the next. In the sums pass again, now in x's dtype, each term dy * xhat from that pass's
    float64 xhat, rounded: float32 rows of 768, 1024 and 4096 values 0.94-1.01 of the time cold, of 128 values 1.19,
    where two copies of the same code read 1.00-1.09 apart. Four rows' terms at a time, in a loop of their own after
    the four rows' dx, each term value loaded and stored once for four rows, as the columns' sums take BatchNorm1d's
    rows (``_column_dy_sums``): float32 rows of 128-4096 values 1.55-1.64 of the time cold.)

    What the terms cost, on the AMD Zen 4 VM: the float32 LayerNorm backward of (8192, 1024) took 4.3-4.6 ms from
    cold caches on 2 threads, 2.7-2.9 without dweight/dbias, about the time of a triad over the same bytes
    (2.5-2.8). Taken apart by editing this module (one process, interleaved, 2 threads, cold): without the two term
    updates in this loop 1.0-1.6 ms less (keeping dbias's, 0.1-0.7 less); without ``_fold_terms`` 0.2-0.5 less
    (TERM_BLOCK_ROWS 16 and 32, a fold half or a quarter as often: 0.94-0.98 and 0.92-0.97 of the time, for a
    float32 bound 1.5 and 2.5 times as wide); the terms in a loop of their own before the sums pass, as PyTorch's
    kernel has them: 1.10-1.14 of the time. The two updates cost a third to a quarter as much per value hot, on one
    thread in the L3. On one row in L1 this loop took 0.15-0.17 ns per value, the dx loop alone 0.08-0.09 (float64
    0.44 and 0.15): each value stores three results instead of one. On one thread from cold caches, timed phase by
    phase (``llvm.readcyclecounter`` around each call, in a row loop built of these functions; a prototype script),
    a float32 row of 1024 values took 1450-1550 cycles in its sums pass (about 1050 with the rows in the L3), this
    loop 710-1050 (320-340 without the two updates), the stream copy of dx 180-250 and its share of the fold
    160-230: the updates cost 0.4-0.7 cycles per value there, against about 0.2 on a row in L1. On rows of a few
    values a call also costs about 12 ns more than ``_dx_row``'s, whatever the length. (The terms in a loop of their
    own for rows of up to 512 bytes: alone, float32 rows of 16 values 10 ns instead of 17, but the backward of
    InstanceNorm's 4x4 maps taken as rows 0.94-0.99 of the time from cold caches, 0.99-1.00 hot, and rows of 128
    values 0.98: not taken. Two rows n, n + 1 in one dx loop, their terms added in pairs, one load and store of
    tw[i] and tb[i] for both, each row's sums taken first: in the cache 0.91-0.95 of the time, but from cold caches
    float32 rows of 1024 and 128 values, not streamed, 1.12-1.30 on one thread and 0.98-1.16 on two; streamed,
    through two scratch rows, against this loop streamed, ``compare_kernels.py --cold --floor`` took float32 rows of
    128, 256, 512, 768, 1024 and 4096 values 0.90-0.92, 0.97, 1.13, 1.05-1.10, 0.96-0.97 and 1.00 of the time on two
    threads (128, 768 and 1024 on one: 0.88, 1.06, 0.94), float64 rows 1.00-1.03, where the twin read 0.99-1.01:
    not taken.)"""
    mh, ml, r, proj, mdx = _dx_scalars(xb, mu, r, proj, mdx)
    if fixed:
        for i in range(xb.shape[0]):
            d = dyb[i]
            xh = _xhat(xb[i], mh, ml, r)  # (read before dx is written: out may be x itself)
            dxb[i] = d * w[i] * r
            tw[i] += d * xh
            tb[i] += d
    else:
        for i in range(xb.shape[0]):
            d = dyb[i]
            xh = _xhat(xb[i], mh, ml, r)
            dxb[i] = _dx(d, w[i], xh, r, proj, mdx)
            tw[i] += d * xh
            tb[i] += d


@numba.njit(error_model="numpy", inline="always")
def _fold_terms(tw, tb, pw, pb):
    """pw += tw and pb += tb in float64, then tw = tb = 0: the term sums of a block of up to TERM_BLOCK_ROWS
    rows into the float64 partial rows.

    For float32 data the terms and their sums over the block are float32 (16 lanes per 512-bit register,
    and no conversions): ``benchmarks/compare_kernels.py --cold`` (2 threads, the AMD VM) took the float32
    LayerNorm backward of rows of 1024 and 4096 values 0.86 of the time against float64 terms, of 128 and
    768 values 0.97, float64 data (the same arithmetic, in blocks) 0.94-0.98. The price is the float32
    error bound on dweight and dbias in the module docstring: (TERM_BLOCK_ROWS + 8) u sum|dy * xhat|."""
    for i in range(tw.shape[0]):
        pw[i] += np.float64(tw[i])
        pb[i] += np.float64(tb[i])
        tw[i] = 0.0
        tb[i] = 0.0


@numba.njit(error_model="numpy", inline="always")
def _fold_terms_to(tw, tb, pw, pb, ow, ob):
    """``_fold_terms`` of the last block of terms, its float64 sums then rounded into ow and ob (in x's dtype)
    instead of kept: the same bits as a fold and a copy, in one pass (``_backward_row_pieces``)."""
    for i in range(tw.shape[0]):
        ow[i] = pw[i] + np.float64(tw[i])
        ob[i] = pb[i] + np.float64(tb[i])
        tw[i] = 0.0
        tb[i] = 0.0


@numba.njit(error_model="numpy", inline="always")
def _dx_row_to(dyb, xb, dxb, scratch, stream, w, mu, r, proj, mdx, fixed, affine, tw, tb, whole_rows):
    """``_dx_row`` (with ``affine``, ``_dx_row_affine``) into dxb, streamed through ``scratch`` with ``stream``.

    Each row function is called twice, into ``scratch`` and into dxb, rather than once into a destination chosen at
    run time (``scratch[...] if stream else dxb[...]``): with that choice the backward of rows of 16 float32 values
    (InstanceNorm's 4x4 maps taken as rows), which never stream, took 14 ns a row in the item's loop instead of 7 (1
    thread, hot, fixed statistics, no dweight/dbias). The affine direct call takes the rows sliced to their length,
    as the streamed calls do: on the whole rows it took those rows 42 ns each instead of 31 (why is not known; the
    plain one sliced so took 19 instead of 17). Against the destination chosen at run time,
    ``benchmarks/compare_kernels.py`` (2 threads, the AMD Zen 4 VM) took the backward of InstanceNorm's 4x4 maps
    (4096, 64, 1, 16) 0.88 of the time (float64 0.91), without dweight/dbias 0.74 (0.77), of rows of 8 float64
    values 0.84 and 0.70, of 64 float32 values 0.91 and 0.90; LayerNorm's rows of 128 values or more 0.99-1.04, cold
    and hot.

    ``whole_rows`` (a constant: LayerNorm's and RMSNorm's rows, one group, which ``_backward_rows_kernel`` compiles
    apart) takes the affine direct call on the whole rows after all: there the slices went the other way. Whole
    rows against sliced, ``benchmarks/compare_kernels.py --floor`` (the AMD Zen 4 VM, float32, rows not streamed):
    rows of 32 values 0.85 of the time hot on one thread, 0.89 cold on two, of 64 values 0.90, of 256 and 1024
    0.97-0.99 (two copies of the same code 0.97-1.01 apart); GroupNorm's 4x4 maps as rows (1024, 8, 8, 16) on the
    whole rows 1.98 hot and 1.39 cold: those stay sliced."""
    if stream:
        c = scratch.shape[0]
        for j0 in range(0, xb.shape[0], c):
            j1 = min(xb.shape[0], j0 + c)
            out = scratch[: j1 - j0]
            if affine:
                _dx_row_affine(dyb[j0:j1], xb[j0:j1], out, w[j0:j1], mu, r, proj, mdx, fixed, tw[j0:j1], tb[j0:j1])
            else:
                _dx_row(dyb[j0:j1], xb[j0:j1], out, w[j0:j1], mu, r, proj, mdx, fixed)
            _stream_copy(out, dxb[j0:j1])
    elif affine and whole_rows:
        _dx_row_affine(dyb, xb, dxb, w, mu, r, proj, mdx, fixed, tw, tb)
    elif affine:
        L = xb.shape[0]
        _dx_row_affine(dyb[:L], xb[:L], dxb[:L], w[:L], mu, r, proj, mdx, fixed, tw[:L], tb[:L])
    else:
        _dx_row(dyb, xb, dxb, w, mu, r, proj, mdx, fixed)


@numba.njit(error_model="numpy", inline="always")
def _dx_block(dyb, xb, dxb, w, mrow, has_mask, mu, r, proj, mdx, fixed, K, S):
    """``_dx_row`` on one (n, g) block of K runs of S values, the weight per run; 0 where masked out."""
    if S == 1 and not has_mask:
        _dx_row(dyb, xb, dxb, w, mu, r, proj, mdx, fixed)
        return
    mh, ml, r, proj, mdx = _dx_scalars(xb, mu, r, proj, mdx)
    for k in range(K):
        xs = xb[k * S : (k + 1) * S]
        dys = dyb[k * S : (k + 1) * S]
        dxs = dxb[k * S : (k + 1) * S]
        wk = w[k]
        if fixed:
            for s in range(S):
                dxs[s] = dys[s] * wk * r
        else:
            for s in range(S):
                dxs[s] = _dx(dys[s], wk, _xhat(xs[s], mh, ml, r), r, proj, mdx)
        if has_mask:
            for s in range(S):
                if not mrow[s]:
                    dxs[s] = 0.0


@numba.njit(error_model="numpy", inline="always")
def _dx_block_to(dyb, xb, dxb, scratch, stream, w, mrow, has_mask, mu, r, proj, mdx, fixed, K, S, kp, sp):
    """``_dx_block`` into dxb, or with ``stream`` through ``scratch`` piece by piece, kp runs of sp values at a
    time (``_stream_pieces``), each piece streamed out, as ``_forward_groups`` streams y."""
    if stream:
        for k in range(0, K, kp):
            for j0 in range(0, S, sp):
                j1 = min(S, j0 + sp)
                lo, part = k * S + j0, scratch[: kp * (j1 - j0)]
                hi = lo + part.shape[0]
                wk, mk = w[k : k + kp], mrow[j0:j1]
                _dx_block(dyb[lo:hi], xb[lo:hi], part, wk, mk, has_mask, mu, r, proj, mdx, fixed, kp, j1 - j0)
                _stream_copy(part, dxb[lo:hi])
    else:
        _dx_block(dyb, xb, dxb, w, mrow, has_mask, mu, r, proj, mdx, fixed, K, S)


# ---------------------------------------------------------------------------
# numba's cache on disk, shared by processes

_uncached_warned = False


def _warn_uncached(error: RuntimeError) -> None:
    """Says once that numba cannot cache the kernels on disk. It caches in the first of ``NUMBA_CACHE_DIR`` (where
    that is set), ``__pycache__`` beside the sources and the user's cache directory that it can write to; with none
    (a read-only install, in a container whose user has no writable home) ``cache=True`` raises at the decoration,
    and the kernels are compiled without it: each process compiles what it calls, once."""
    global _uncached_warned
    if not _uncached_warned:
        _uncached_warned = True
        warnings.warn(
            f"minigrad_norm: numba cannot cache the kernels on disk ({error}); each process compiles the ones it "
            "calls. Set NUMBA_CACHE_DIR to a writable directory to keep them.",
            stacklevel=2,
        )


def _cache_locked(kernel: Callable) -> Callable:
    """``kernel``, its entries in numba's cache on disk written under an exclusive lock and read under a shared one,
    held across processes.

    numba saves a compiled signature in steps (``IndexDataCacheFile.save``): it reads the function's cache index,
    adds the entry with the first data file name the index does not use, writes the index back, then writes the data
    file. Two processes that compile different signatures of one kernel at once (a float32 and a float64 call in two
    scripts, two test workers, on a fresh cache) can both read the index before either writes it. Both then take data
    file 1, the index keeps one of the two entries, and when it is one process's and the data file the other's,
    every later process loads the one signature's machine code for the other's calls, which fail ("can't unbox
    array") until the cache is deleted. And a process loading between the two writes can find the index's new entry
    beside a data file of that name from an older version of this module.

    The lock is a POSIX record lock (``fcntl.lockf``) on a file beside the index: held by the process, so a child
    forked while another thread holds it does not hold it too. Without ``fcntl`` (Windows), or where the file system
    refuses the lock, the cache is read and written unlocked, as numba's own is; so it is, with a warning, after
    CACHE_LOCK_WAIT_SECONDS waiting for a process that holds the lock (``_take_cache_lock``)."""
    cache_file = getattr(getattr(kernel, "_cache", None), "_cache_file", None)
    if fcntl is None or cache_file is None:  # (no cache: numba's JIT is off, or it found no place to cache)
        return kernel
    lock_path = cache_file._index_path + ".lock"

    def locked(method: Callable, mode: int) -> Callable:
        def call(*args: object, **kwargs: object) -> object:
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError:  # (no cache directory: a load finds nothing, and a save makes the directory first)
                return method(*args, **kwargs)
            try:
                _take_cache_lock(fd, mode, lock_path)
                return method(*args, **kwargs)
            finally:
                os.close(fd)  # (which releases the lock)

        return call

    cache_file.save = locked(cache_file.save, fcntl.LOCK_EX)
    cache_file.load = locked(cache_file.load, fcntl.LOCK_SH)
    return kernel


def _take_cache_lock(fd: int, mode: int, path: str) -> None:
    """``fcntl.lockf(fd, mode)``, but not forever: a save or load holds the lock for milliseconds, and a process
    stopped while it holds it (in a debugger, by SIGSTOP) must not hang every other process that uses the cache.
    After CACHE_LOCK_WAIT_SECONDS of asking, or where the file system refuses POSIX locks (ENOLCK: NFS without its
    lock daemon), the caller goes on unlocked, as numba's own cache is."""
    deadline = time.monotonic() + CACHE_LOCK_WAIT_SECONDS
    while True:
        try:
            fcntl.lockf(fd, mode | fcntl.LOCK_NB)
            return
        except (BlockingIOError, PermissionError):  # (EAGAIN or EACCES: another process holds it)
            if time.monotonic() >= deadline:
                warnings.warn(
                    f"minigrad_norm: another process has held {path} for {CACHE_LOCK_WAIT_SECONDS} s; reading or "
                    "writing numba's cache of the kernels without it",
                    stacklevel=4,
                )
                return
            time.sleep(0.01)
        except OSError:  # (ENOLCK and the like: no POSIX locks on this file system)
            return


def _jit_cached(py_func: Callable, **options: object) -> Callable:
    """``py_func`` jitted with ``options``, cached on disk under the cache lock (``_cache_locked``), or, where numba
    finds no place to cache, uncached (``_warn_uncached``)."""
    try:
        return _cache_locked(numba.njit(cache=True, error_model="numpy", **options)(py_func))
    except RuntimeError as e:  # ("cannot cache function ...: no locator available")
        _warn_uncached(e)
        return numba.njit(error_model="numpy", **options)(py_func)


# ---------------------------------------------------------------------------
# one work item's loop: a run of rows, or of general groups. Compiled on its own (``_item``), cached, and called
# by both compiles of a kernel through its symbol (``_call_item``). numba builds a jitted callee's code into its
# caller's, where LLVM optimizes it and generates its machine code again: each item's code went through that six
# times (its own compile, the serial kernel, the parallel kernel's prange body, the two wrappers numba builds
# around that body, the parallel kernel). Of the 12.1 s of the GroupNorm forward's two float32 compiles, 8.1 were
# LLVM's, 1.6 of them in the item's own compile; called by symbol, 7.3 s, 2.8 in LLVM. Every kernel's cold compile
# in two processes took 58.5 s against 85.5, a first float32 LayerNorm forward+backward 15.5 s against 25.0
# (``benchmarks/compile_time.py HEAD --rounds 2``, the Intel VM), and the kernels' times did not move
# (``compare_kernels.py --floor``: 0.99-1.02, twin 0.97-1.02, LayerNorm, GroupNorm, BatchNorm, small and large).
# The arguments go as to any jitted function, each array as its fields, borrowed: passed as one tuple instead,
# which takes a reference on each array, they cost 80 ns a call (LayerNorm 64x128 forward, 64 items of a row,
# 1.15x the time). (Inlined into the parallel kernel's prange body, the same loops had made the cold compile of
# every kernel take 61-64 s instead of 34: items have always been calls.)
#
# The functions these loops call per block or per row are inlined by numba (``inline="always"``, through the items' own
# inlining pass, ``_InlineWorker``), each call site a copy to type and optimize: without that on any helper the cold
# compile of every kernel took 62 s instead of 81, but rows of 16 values 2-2.6x the time (LLVM left the row functions as
# calls); without it on the block functions only (``_normalize_block``, ``_dx_block``, ``_backward_sums``...), 72 s, but
# the forward of InstanceNorm's 8x8 maps 1.41x and 16x16 maps 1.12x (``compare_kernels.py --cold``, 2 threads, the AMD
# Zen 4 VM); with ``_stream_copy`` and ``_block_ahead`` left as calls as well (even where the branch to them is not
# taken), the rows' backward and the blocks' forward 1.28-1.45x.
#
# Rows (S == 1, no mask, statistics per block: LayerNorm, RMSNorm) take loops of their own, which LLVM
# compiles to much less per-row work than the general loops: serial, in cache, the forward took 0.6-0.8x
# the time on rows of 64-128 values (0.9-1.0x on 1024), the backward 0.4-0.6x (0.85x on 1024).
#
# Each loop calls its block function twice, once into ``scratch`` (then streamed out) and once into the
# output, rather than once on ``scratch if stream else y3[n, g]``: with a destination chosen at run time
# the streaming forward took 1.5x as long (LayerNorm 8192x1024, float32). And each borrows its array
# arguments (``_borrowed``), so that the views it makes per block touch no reference count.
#
# (LLVM's ``noalias`` on the items' array arguments, through the dispatcher's hook ``_customize_flags``: numba has no
# option for it, and its parfor lowering sets it only on prange bodies in which it finds no aliasing. The promise
# drops the run-time overlap checks before each vector loop: ``benchmarks/compare_kernels.py`` took, on one thread
# hot, with a twin of the same code at 0.97-1.01, InstanceNorm's 4x4 maps forward 0.96 of the time, backward 0.90,
# LayerNorm rows of 128 values 0.96 and 0.91; on two threads cold 0.78-1.00. Not taken: the promise would hold only
# as long as no written array shares memory with another argument (``out=x`` would have to go through a copy) and no
# kernel passes one array, or two views of it, to two arguments of an item: numba puts the flag on each array's
# reference-counted header too, which the items incref and decref, and LLVM could then move one's decref before the
# other's incref. (Arrays from Python are safe there: each kernel argument gets a header of its own, even two that
# are one array.) A rule every later call site must keep, and no test can check, for a tenth of short rows' time.)


def _item(py_func: Callable) -> Callable:
    """A work item's loop, compiled (and cached) on its own and called by symbol (``_call_item``), with vectors of
    up to PREFERRED_VECTOR_BITS (``_ItemCompiler``)."""
    return _jit_cached(py_func, pipeline_class=_ItemCompiler)


_item_symbols: dict[tuple[str, tuple], tuple[str, nbtypes.Type]] = {}


@dataclasses.dataclass(frozen=True)
class _ItemSymbol:
    """Item function ``item`` of this module compiled for ``argtypes``, its machine code's address given to LLVM's
    symbol table under a name of its own (this module's, the item's, and a digest of this file's path and of the
    types: the same in every process, and another in a copy of this module loaded from another file). Called
    when a kernel's compile types a call to it, and again by numba before it loads a kernel that calls it from the
    cache (the kernel's library keeps it among its ``_reload_init``): the kernel's machine code names the symbol and
    does not hold it. Returns the symbol and the item's return type. (Both callers hold numba's compiler lock.)"""

    item: str
    argtypes: tuple

    def __call__(self) -> tuple[str, nbtypes.Type]:
        key = (self.item, self.argtypes)
        if key not in _item_symbols:
            dispatcher = globals()[self.item]
            dispatcher.compile(self.argtypes)  # (from numba's cache where it is there)
            compiled = dispatcher.overloads[self.argtypes]
            digest = hashlib.sha256(f"{__file__} {self.argtypes!r}".encode()).hexdigest()[:16]
            symbol = f"{__name__}.{self.item}.{digest}"
            address = compiled.library.get_pointer_to_function(compiled.fndesc.llvm_func_name)
            if not address:  # (a call to address 0 would crash the process)
                raise RuntimeError(f"minigrad_norm: numba gave no address for {self.item}{self.argtypes}")
            llvm.add_symbol(symbol, address)
            _item_symbols[key] = symbol, compiled.signature.return_type
        return _item_symbols[key]


@intrinsic(prefer_literal=True)
def _call_item(typingctx, item, *args):
    """``item(*args)`` for an item function (``_item``), through its own compile's symbol (``_ItemSymbol``) rather
    than with its code built into the caller's (numba's way with a call to a jitted function). Otherwise as numba's
    call: the same calling convention, an error raised in the item raised on in the caller, and literal arguments
    typed as literals (``_backward_rows``'s constant group bounds compile a specialization of their own)."""
    argtypes = tuple(args)
    symbol = _ItemSymbol(item.dispatcher.py_func.__name__, argtypes)
    name, restype = symbol()

    def codegen(context, builder, signature, llargs):
        context.active_code_library._reload_init.add(symbol)
        function = cgutils.get_or_insert_function(
            builder.module, context.call_conv.get_function_type(restype, argtypes), name
        )
        values = cgutils.unpack_tuple(builder, llargs[1], len(argtypes))
        status, result = context.call_conv.call_function(builder, function, restype, argtypes, values)
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        return result

    return restype(item, nbtypes.StarArgTuple.from_types(args)), codegen


@_item
def _forward_rows(x, w2, b2, has_b, eps, centered, mean, var, y, by_pieces, first, last, scratch, stream):
    """Forward of the rows q = first..last-1 of x (N * G, L), row q the block (n, g) = divmod(q, G) of G = len(w2),
    each with its own statistics; ``by_pieces``, y of the pieces first..last-1 of the rows (``_row_pieces``: piece i
    of row i // pieces), their statistics given in mean and var (``_forward_rows_kernel``)."""
    # (rows as the rows of 2-D arrays, not indexed by (n, g): that took an integer division per row, and the forward
    # of 65536 float32 rows 1.08-1.10x the time on rows of 128 values, 1.18x on 64 (benchmarks/compare_kernels.py,
    # 1 and 2 threads); and so from the caller, not reshaped here: four reshapes took 140 ns an item, of 600 for an
    # item of one float32 row of 1024 values in L2, and ``compare_kernels.py --floor`` (hot, the Intel VM, new/twin
    # 0.93-1.00) the float32 forward of 64x1024, 512x256, 256x1024 and 2048x128 0.82, 0.89, 0.85-0.92 and 0.94 of
    # the time on 1 and 2 threads)
    G, L = w2.shape
    x, y, w2, b2, scratch = _borrowed(x), _borrowed(y), _borrowed(w2), _borrowed(b2), _borrowed(scratch)
    ahead = _rows_ahead(L, x.itemsize, stream)
    g = first % G
    # Rows of at most SHORT_ROW_VALUES values (InstanceNorm's small maps taken as rows, tiny LayerNorms) go in
    # batches of SHORT_ROWS_BATCH_BYTES, a step at a time over the whole batch: the means, then the variances,
    # then rstd and the normalization, each row one masked vector (see "short rows"). Row by row, each short row
    # waits on its chain of dependent steps (a sum, a division, a second sum, a division, a square root and a
    # division); over a batch the chains of many rows overlap. ``benchmarks/compare_kernels.py --cold`` (2
    # threads, the AMD Zen 4 VM) took the forward of InstanceNorm's blocks as rows of 16 and 8 float32 values
    # 0.67 and 0.71 of the time in batches, when each row still went through the loops (``_sum``...), of 8
    # float64 values 0.73 (rstd in a loop of its own, into an array of the batch's: 0.70-0.79). Each row one
    # vector then took (``--cold --floor``, 2 threads, the Intel VM, two or three runs; new/twin 0.97-1.05):
    # float32 rows of 16, 9, 8, 4 and 2 values (InstanceNorm's maps, (N, 64, 1, S), 16-32 MiB) 0.73-0.75,
    # 0.64-0.66, 0.74-0.77, 0.79-0.80 and 0.86 of the time, LayerNorm 65536x16 0.77-0.78; float64 rows of 16, 9,
    # 8, 5, 4 and 2 values 0.74-0.78, 0.56-0.57, 0.73-0.89, 0.70, 0.73-0.76 and 0.89 (float64 rows of 9-16 values
    # went one at a time before, prefetched on Intel CPUs), LayerNorm 0.72; hot, float32 rows of 16 values
    # 0.62-0.70; and the cold compile of every kernel 0.92 (``benchmarks/compile_time.py``, both items' loops in
    # the rows' forward now one call each). The same vectors row by row took float32 rows of 16 and 9 values
    # 0.85-0.86, of 8 1.04; with the next rows prefetched 2 KiB ahead 0.91-1.14; the batch's divisions and
    # square roots in loops of their own (vectorized) 1.01-1.04 of the batches' time. In batches, the next batch's x
    # prefetched into L1 at the start of each took float32 rows of 16 values (InstanceNorm 4096x64x4x4, 2048x64x4x4,
    # cold) 1.01 and 0.97, and its y too, with write intent (``prefetchw``), 1.18-1.21.
    # Then blocks of SHORT_ROW_VALUES rows in one step each (``_short_block_forward``: each row loaded once, the
    # block's sums together, its rstd and splits as vectors; the same bits): ``compare_kernels.py --cold --floor``
    # (the Intel VM, 2 threads, new/twin 0.93-1.04, two runs) took float32 rows of 16, 9 and 4 values (InstanceNorm's
    # maps, (N, 64, 1, S), 16-32 MiB) 0.75-0.77, 0.71-0.76 and 0.65-0.70 of the time, LayerNorm 65536x16 0.82-0.86;
    # float64 rows of 16, 9, 7 and 4 values 0.87-0.92, 0.84-0.89, 0.81 and 0.72-0.76, LayerNorm 0.86-0.93; hot, on
    # one thread, float32 rows of 16 and 5 values 0.70 and 0.77, float64 0.89 and 0.85; the cold compile of every
    # kernel 49.3 s against 47.6 (``benchmarks/compile_time.py``, three rounds). Its sums alone, the rest row by row
    # as before, had taken float32 rows of 16 values 0.95-0.96, of 9 and 4 1.02-1.06: the rows' scalar steps between
    # vectors were the cost.
    # (Rows in pairs, as the blocks of _forward_groups, took float32 rows of 1024 values 0.91-0.92 of the time
    # (hot and cold), but rows of 128 values 1.00-1.11, of 768 0.94-1.06, float64 rows 0.96-1.06
    # (compare_kernels.py, 2 threads, the Intel VM); on the AMD VM, rows of 4 KiB or more in pairs took float32
    # rows of 4096 values 1.01 (cold) and 1.09 (hot), of 1024 1.27 and 1.25, float64 rows 0.91-1.14.)
    # (Nor, on the AMD VM of CPU family 26, from cold caches on 2 threads, compare_kernels.py --floor: the next
    # row's sum taken piece by piece between this row's streamed pieces, so that its reads run amid the writes,
    # float64 rows of 128, 768, 1024 and 4096 values 0.99, 1.06, 1.09 and 1.35 of the time; the next row's sum in
    # the loop of this row's squared deviations, so that its reads overlap that pass from L1, float64 0.98, 1.04,
    # 1.10, 1.02, float32 0.95-1.03; a batch of short rows computed into a scratch of the batch and streamed out
    # whole, 4 KiB at a time, float32 rows of 16 values 1.11-1.15, float64 rows of 8 values 1.12.)
    # Streamed short rows: where y is big enough to stream (``_streams``, for the batch's SHORT_ROWS_BATCH_BYTES, with
    # SHORT_ROWS_STREAM), a batch is computed into the scratch, which stays in L1, and streamed out whole
    # (``_stream_copy``), and each block first prefetches the rows PREFETCH_DISTANCE_BYTES ahead of it into L1. Either
    # alone did little on the AMD VM of CPU family 26 (the streamed batches 1.11-1.15, above; a first prototype, float32
    # rows of 16 values from cold caches on 2 threads: the prefetch alone 0.81-0.82 of the time, each row's vector
    # streamed from the block alone 0.85); together, 0.35-0.40: with ordinary stores each line of y is read before it
    # is written, and those reads and x's wait in line behind the block's arithmetic, where the prefetched x arrives
    # meanwhile and y goes out without being read. ``benchmarks/compare_kernels.py 6c7afdf --cold --floor`` (that VM,
    # 2 threads, (N, 64, 1, L) of 16-32 MiB, new/twin 0.96-1.02): float32 rows of 16, 9, 8, 4 and 2 values 0.46, 0.57,
    # 0.49, 0.68 and 0.75 of the time, float64 0.71, 0.54, 0.48, 0.50 and 0.68. (The batch's rows streamed block by
    # block, 0.43-0.44 and 0.71-0.75 for 16 and 9 values; prefetched 4 KiB ahead, 0.44-0.46 and 0.57. Rows that are
    # whole cache lines, 16 values into an aligned y, streamed straight from the block's vectors, without the scratch:
    # float32 4x4 maps 0.87-0.94 of this time forward and 0.92-0.94 backward, float64 forward 0.69-0.82, but the
    # forward of small maps hot on one thread, (256, 64, 1, 16) and (512, 64, 1, 9), 1.08-1.13, whether the block
    # tested its flag once or came in two copies, one for each value; not kept.) Not measured on an Intel CPU, where
    # the streamed batches alone had taken 1.12 (4x4 maps) and 1.48 (rows of 9 values): there SHORT_ROWS_STREAM is
    # off.
    # (longer rows of 128 bytes or less: never in pieces, and not streamed, as _streams streams the forward's blocks of
    # STREAMING_STORE_MIN_BLOCK_BYTES or more: where a test sets that to 0, they are written with ordinary stores)
    if L <= SHORT_ROW_VALUES:
        batch = _short_rows_batch(L, x.itemsize)
        x_flat, y_flat = x.reshape(x.size), y.reshape(y.size)
        ahead = PREFETCH_DISTANCE_BYTES // x.itemsize  # (values)
        for q0 in range(first, last, batch):
            nb = min(batch, last - q0)
            means, variances = mean[q0 : q0 + nb], var[q0 : q0 + nb]
            xb, yb = x[q0 : q0 + nb], scratch[: nb * L].reshape(nb, L) if stream else y[q0 : q0 + nb]
            # (SHORT_ROWS_AS_VECTORS, a constant: LLVM drops the other branch.) Blocks of SHORT_ROW_VALUES rows in
            # one step each (``_short_block_forward``), the rows after the last whole block in the three passes.
            blocks = nb // SHORT_ROW_VALUES * SHORT_ROW_VALUES if SHORT_ROWS_AS_VECTORS else 0
            for j in range(0, blocks, SHORT_ROW_VALUES):
                k = j + SHORT_ROW_VALUES
                if stream:
                    _prefetch_lines(x_flat[(q0 + j) * L + ahead : (q0 + k) * L + ahead], 1)
                _short_block_forward(xb[j:k], yb[j:k], w2, b2, g, has_b, eps, centered, means[j:k], variances[j:k])
                g = (g + SHORT_ROW_VALUES) % G
            for j in range(blocks, nb):
                means[j] = (_short_sum(xb[j]) if SHORT_ROWS_AS_VECTORS else _sum(xb[j])) / L if centered else 0.0
            for j in range(blocks, nb):
                xj, mu = xb[j], means[j]
                variances[j] = (_short_sum_sq_dev(xj, mu) if SHORT_ROWS_AS_VECTORS else _sum_sq_dev(xj, mu)) / L
            for j in range(blocks, nb):
                rstd = 1.0 / math.sqrt(variances[j] + eps)
                if SHORT_ROWS_AS_VECTORS:
                    _short_normalize_row(xb[j], yb[j], w2[g], b2[g], has_b, means[j], rstd)
                else:
                    _normalize_row(xb[j], yb[j], w2[g], b2[g], has_b, means[j], rstd)
                g = g + 1 if g + 1 < G else 0
            if stream:
                _stream_copy(scratch[: nb * L], y_flat[q0 * L : (q0 + nb) * L])
        return
    pieces, piece = _row_pieces(L, x.itemsize)
    # (one call of _normalize_row_to for both: each inlined copy of its loops costs compile time)
    for i in range(first, last):
        if by_pieces:
            q, j0 = i // pieces, (i % pieces) * piece
            g, j1 = q % G, min(L, j0 + piece)
            xb, yb, wb, bb = x[q, j0:j1], y[q, j0:j1], w2[g, j0:j1], b2[g, j0:j1]
            mu, v = mean[q], var[q]
        else:
            xb, yb, wb, bb = x[i], y[i], w2[g], b2[g]
            if ahead and i + ahead < last:
                _prefetch_lines(x[i + ahead], 1)
            if pieces == 1:  # (_piece_moments' arithmetic, without its slice: rows of 32 float32 values took 1.15x)
                mu = _sum(xb) / L if centered else 0.0
                v = _sum_sq_dev(xb, mu) / L
            else:
                moments = np.empty((pieces, 2))  # (for a row of 1 MiB or more)
                for p in range(pieces):
                    moments[p, 0], moments[p, 1] = _piece_moments(xb, p, centered)
                t, m2 = _merged_pieces(moments, L, piece)
                mu, v = t / L, m2 / L
            mean[i] = mu
            var[i] = v
            g = g + 1 if g + 1 < G else 0
        _normalize_row_to(xb, yb, wb, bb, has_b, mu, 1.0 / math.sqrt(v + eps), scratch, stream)


@numba.njit(inline="always")
def _short_rows_batch(L, itemsize):
    """How many rows of L <= SHORT_ROW_VALUES values the rows' forward takes a step at a time (``_forward_rows``):
    SHORT_ROWS_BATCH_BYTES of them."""
    return max(1, SHORT_ROWS_BATCH_BYTES // max(1, L * itemsize))


@numba.njit(inline="always")
def _row_pieces(L, itemsize):
    """(pieces, values in a piece) of a row of L values: pieces of ROW_PIECE_BYTES, the last maybe shorter, for rows
    of ROW_PIECES_MIN_BYTES or more; else one piece, the whole row."""
    if L * itemsize < ROW_PIECES_MIN_BYTES:
        return 1, L
    piece = ROW_PIECE_BYTES // itemsize
    return (L + piece - 1) // piece, piece


@numba.njit(error_model="numpy", inline="always")
def _piece_moments(xb, p, centered):
    """(sum, M2) of piece p of row xb (``_row_pieces``): its sum, then the sum of its squared deviations from its own
    mean (0 if not centered), re-read from L1: two passes, never E[x^2] - E[x]^2."""
    piece = _row_pieces(xb.shape[0], xb.itemsize)[1]
    xp = xb[p * piece : (p + 1) * piece]
    t = _sum(xp) if centered else 0.0
    return t, _sum_sq_dev(xp, t / xp.shape[0])


@numba.njit(error_model="numpy", inline="always")
def _merged_pieces(moments, L, piece):
    """(sum, M2) of a row of L values from its pieces' in moments (pieces, 2), merged in piece order
    (``_merged_moments``; one piece's own, as they are)."""
    total = m2 = 0.0
    for p in range(moments.shape[0]):
        n_b = min(L, (p + 1) * piece) - p * piece
        total, m2 = _merged_moments(total, m2, float(p * piece), moments[p, 0], moments[p, 1], float(n_b))
    return total, m2


@numba.njit(error_model="numpy", inline="always")
def _normalize_row_to(xb, yb, w, b, has_b, mu, r, scratch, stream):
    """``_normalize_row`` into yb, streamed (computed into the scratch row a piece at a time, and streamed out) or
    not."""
    if stream:
        c = scratch.shape[0]
        for j0 in range(0, xb.shape[0], c):
            j1 = min(xb.shape[0], j0 + c)
            _normalize_row(xb[j0:j1], scratch[: j1 - j0], w[j0:j1], b[j0:j1], has_b, mu, r)
            _stream_copy(scratch[: j1 - j0], yb[j0:j1])
    else:
        _normalize_row(xb, yb, w, b, has_b, mu, r)


@numba.njit(inline="always")
def _block_ahead(x3, n, g, p_next, last, reduce_batch, prefetch):
    """The block a streaming ``_forward_groups`` prefetches into L2, piece by piece, while it normalizes and
    streams out block (n, g): the block whose statistics its thread reads next. That is block n of the next
    channel (with ``reduce_batch`` a work item is one channel, and numba's prange gives each thread a run of
    consecutive items), else the block of group ``p_next`` (the next pair's, or the next one's); empty when
    there is none in the item, or without ``prefetch``.

    The statistics pass of a block reads it from DRAM with nothing written meanwhile, and the normalize pass
    writes it with nothing read: with the next block's lines requested while this one is streamed out, reads
    and writes overlap, as in a copy. ``benchmarks/compare_kernels.py`` (2 threads, the AMD VM of CPU family
    26, 32x64x56x56, against no prefetch) took from cold caches float32 BatchNorm 0.89-0.92 of the time
    (three runs), InstanceNorm 0.94-1.01, float64 0.99 both; hot float32 BatchNorm 1.06-1.09, InstanceNorm
    0.94-0.96, float64 BatchNorm 1.03, InstanceNorm 0.95. Unlike the long rows' prefetch (``_rows_ahead``),
    taken despite the cost hot: it runs only where the output streams, and in a network an x that big was
    streamed to memory by the kernel that wrote it, so cold is the usual case. An earlier version that also
    prefetched GroupNorm's blocks (8 channels, K > 1) took its float32 forward 1.10-1.15 of the time cold
    and 1.07 hot (float64 0.93), so GroupNorm goes without (its float32 forward already ran at about the
    rate of a copy there; on the AMD Zen 4 VM, 1.07 cold and 1.00 hot); and so does eval-mode BatchNorm, which
    has no statistics pass to overlap. (A BatchNorm item of 8 or 32 channels that sums the next channel's blocks
    piece by piece in this loop instead of prefetching them, each block's M2 then taken from L1 and merged with
    Chan's update, so that no statistics pass is left to read L2: float32 32x64x56x56 1.10-1.11 of the time cold,
    2 threads; with the prefetch kept in such items, 0.97-1.00.)"""
    none = x3[n, g][:0]
    if not prefetch:
        return none
    G = x3.shape[1]
    if reduce_batch:
        return x3[n, g + 1] if g + 1 < G else none
    return x3[p_next // G, p_next % G] if p_next < last else none


@numba.njit(error_model="numpy", inline="always")
def _pair_moments(xa, xb, centered, piece):
    """(sum, M2) of each of two runs of equal length, M2 = sum((x - mean)^2), a piece of ``piece`` values of
    each at a time: the piece's sums (``_sum_pair``), then its M2 about its own means, re-read from L1
    (``_sum_sq_dev_pair``), merged into the runs' (``_merged_moments``). With piece >= the runs' length, the
    plain two passes over the runs. (Not centered, the sums are left 0 and M2 = sum(x^2).)

    The two passes over blocks too long for L1 read the block twice from L2; piece by piece, the second
    pass re-reads each piece from L1 right after the first read it from DRAM, while the prefetcher fetches
    the next. ``benchmarks/compare_kernels.py --cold --floor`` (2 threads, the AMD Zen 4 VM) took the forward
    of GroupNorm 32x64x56x56 with 8 groups, blocks of 25088 values, in pieces of 1024 values 0.84-0.90 of the
    time in float32 (pieces of 256, 512, 2048: 0.95, 0.86, 0.90), 0.88-0.94 in float64 (of 512: 0.98);
    InstanceNorm's blocks of 3136 values, whose pairs fit in L1 in float32, 0.96-1.01, and GroupNorm's blocks
    of 1568 values (1024x64x14x14), in two pieces, 1.05: such blocks keep the two passes
    (MOMENTS_MIN_BLOCK_BYTES). (LayerNorm's rows piece by piece, one row at a time in ``_forward_rows``: rows of
    768-4096 values 0.99-1.02, float32 and float64. A row's second pass already reads L1, or mostly.)"""
    sum_a = m2_a = sum_b = m2_b = n = 0.0
    for j0 in range(0, xa.shape[0], piece):
        pa, pb = xa[j0 : j0 + piece], xb[j0 : j0 + piece]
        k = float(pa.shape[0])
        ta, tb = _sum_pair(pa, pb) if centered else (0.0, 0.0)
        va, vb = _sum_sq_dev_pair(pa, ta / k, pb, tb / k)
        sum_a, m2_a = _merged_moments(sum_a, m2_a, n, ta, va, k)
        sum_b, m2_b = _merged_moments(sum_b, m2_b, n, tb, vb, k)
        n += k
    return sum_a, m2_a, sum_b, m2_b


@_item
def _forward_groups(
    x3, w2, b2, has_b, eps, centered, reduce_batch, mask2, has_mask, stats_given, mean2, var2, y3, K, S, piece,
    first, last, scratch, stream,
):  # fmt: skip
    """Forward of the groups q = first..last-1: channels (reduce_batch) or (n, g) blocks in order.

    Unmasked blocks with statistics to compute (InstanceNorm, GroupNorm) go in pairs: the statistics of
    two consecutive blocks in one pass over both (``_sum_pair``), then each block normalized. From DRAM
    one read stream per core is latency-bound (a pass that only sums float32 blocks of 3136 values
    took 1.26 ms, two blocks per loop 1.05), and ``benchmarks/compare_kernels.py --cold`` (32x64x56x56,
    2 threads, two runs) took float32 InstanceNorm 0.94-0.95 of the time, GroupNorm 0.84-0.92; hot
    0.96-0.98 and 0.95-0.97; float64 0.97-0.99 cold, 0.92-0.96 hot. (The statistics of all an item's
    blocks first, one stream, then all the normalizations, took 1.01-1.09: the gain is the second
    stream.) A pair of blocks longer than L1 holds goes ``piece`` values at a time (``_pair_moments``); a block
    alone, the last of an odd item, takes the two passes whole (``_group_stats``).

    (Measured again on the AMD VM of CPU family 26, 2 threads, cold, against pairs of neighbours with the next
    pair prefetched (``_block_ahead``), since the backward gained from reading its blocks in memory order
    (``_backward_groups``): one block at a time, without the prefetch, float32 InstanceNorm 32x64x56x56 1.01 of the
    time, 16x64x32x32 0.86, GroupNorm 1.01; pairs half an item apart, so that each stream runs on into the next
    block, without the prefetch: 0.95, 0.98-1.02, 0.90-0.96 (float64 0.99-1.01; hot 0.96-0.98), and against one
    block at a time 0.94, 1.08, 0.93, 32x32x28x28 1.12. A gain for some sizes and a loss for others: not taken.)"""
    x3, w2, b2, y3, scratch = _borrowed(x3), _borrowed(w2), _borrowed(b2), _borrowed(y3), _borrowed(scratch)
    mask2 = _borrowed(mask2)
    N, G, L = x3.shape
    pairs = not reduce_batch and not has_mask and not stats_given
    prefetch = K == 1 and not stats_given
    kp, sp = _stream_pieces(K, S, scratch)
    q = first
    while q < last:
        paired = pairs and q + 1 < last
        step = 2 if paired else 1
        if paired:
            xa, xb = x3[q // G, q % G], x3[(q + 1) // G, (q + 1) % G]
            sum_a, va, sum_b, vb = _pair_moments(xa, xb, centered, piece)
            mu_a, mu_b = sum_a / L, sum_b / L
            mean2[q // G, q % G], var2[q // G, q % G] = mu_a, va / L
            mean2[(q + 1) // G, (q + 1) % G], var2[(q + 1) // G, (q + 1) % G] = mu_b, vb / L
        for p in range(q, q + 2 if paired else q + 1):
            g = p if reduce_batch else p % G
            n0 = 0 if reduce_batch else p // G
            n1 = N if reduce_batch else n0 + 1
            if not stats_given and not paired:
                mu, var = _group_stats(x3, mask2, has_mask, centered, n0, n1, g, K, S)
                mean2[n0, g] = mu
                var2[n0, g] = var
            mu = mean2[n0, g]
            r = 1.0 / math.sqrt(var2[n0, g] + eps)
            for n in range(n0, n1):
                if stream:  # piece by piece (one call site: each inlined copy of the loops costs compile time)
                    xs, ys, mrow = x3[n, g], y3[n, g], mask2[n]
                    xn = _block_ahead(x3, n, g, p + step, last, reduce_batch, prefetch)
                    for k in range(0, K, kp):
                        wk, bk = w2[g, k : k + kp], b2[g, k : k + kp]
                        for j0 in range(0, S, sp):
                            j1 = min(S, j0 + sp)
                            lo, part = k * S + j0, scratch[: kp * (j1 - j0)]
                            hi = lo + part.shape[0]
                            _normalize_block(xs[lo:hi], part, wk, bk, has_b, mrow[j0:j1], has_mask, mu, r, kp, j1 - j0)
                            _stream_copy(part, ys[lo:hi])
                            # guarded, though xn is empty without prefetch: unguarded, the call slowed the
                            # blocks of short runs (K > 1) around it tens of times over, float32 LayerNorm-shaped
                            # blocks (K = 2048, S = 1) with given statistics 113 ms against 2.6 on one thread,
                            # GroupNorm-shaped ones (K = 1024, S = 2) 71 against 7.9 (why is not known)
                            if prefetch:
                                _prefetch_lines(xn[lo:hi], 2)
                else:
                    _normalize_block(x3[n, g], y3[n, g], w2[g], b2[g], has_b, mask2[n], has_mask, mu, r, K, S)
        q += step


@numba.njit(inline="always")
def _short_backward_rows(L, itemsize):
    """Whether the backward takes rows of L values as vectors (``_short_row_dx_sums``...): rows of at most
    SHORT_ROW_VALUES values and more than SHORT_ROW_LOOP_BACKWARD_BYTES (see ``_backward_rows_lean``), on a CPU
    with masked vector instructions (SHORT_ROWS_AS_VECTORS)."""
    return SHORT_ROWS_AS_VECTORS and L <= SHORT_ROW_VALUES and L * itemsize > SHORT_ROW_LOOP_BACKWARD_BYTES


@_item
def _backward_rows(
    dy3, x3, mean2, rstd2, w2, use_mean, fixed, dx3, affine, pw, pb, terms, n_first, n_last, g_first, g_last,
    one_group, scratch, stream,
):  # fmt: skip
    """Backward of the rows (n, g), n = n_first..n_last-1, g = g_first..g_last-1, in memory order, each with its
    own statistics; dweight and dbias terms into the partial rows pw[g], pb[g], summed first over blocks of
    TERM_BLOCK_ROWS rows n in the zeroed rows ``terms[g - g_first]`` (2, L) of x's dtype (``_fold_terms``).
    ``one_group``: the rows are LayerNorm's or RMSNorm's, G = 1, g_first = 0 and g_last = 1, all three constants
    (see ``_backward_rows_kernel``; ``_dx_row_to`` for what changes with it).

    Rows whose weight is one value repeated, with dweight and dbias (InstanceNorm's small maps), go through
    ``_backward_rows_lean`` instead, and so do rows of several groups without them unless their dx streams and
    they are not short (``_backward_by_groups``): here the terms are per value.

    Short rows go one at a time, unlike the forward's (``_forward_rows``): each n's rows as a batch, the sums of
    all, then the dx of all, took the float32 backward on 4x4 maps (4096, 64, 1, 16) 1.08-1.09 of the time hot
    on 1 and 2 threads, 0.98-1.09 cold, and without dweight/dbias 1.09-1.17; only (1024, 64, 1, 16), in the L3,
    gained (0.95-0.98; ``benchmarks/compare_kernels.py``). Likely why: a row's backward waits on a shorter chain
    of dependent steps than its forward (one pass of sums, two divisions that do not wait on each other, no
    square root), so there is less to overlap. Multiplying by 1/L in place of the row's two divisions by L (proj,
    mdx) did not show either: those maps 0.92-0.94 of the time hot and 0.96-1.02 cold, where two copies of the
    same code read 0.98-1.04 apart in the same hour; nor did a dx loop taking the rows' one weight as a scalar
    rather than as a row of repeated values (0.97-1.02 hot). (Those were measured in this loop, before the rows
    of one weight had a loop of their own.)

    (Rows of 8 KiB or more, where the float64 backward of 512x4096 moved 17-24 GB/s against 31-35 on rows of 1024
    values, in a pipeline one row deep, a piece of 4 KiB at a time: the sums of row n's piece from DRAM, then the dx
    of row n - 1's piece from L2, so that DRAM is read while dx is written. ``compare_kernels.py --cold`` (2 threads,
    the AMD Zen 4 VM) took float64 rows of 1024 and 4096 values 1.11-1.14 of the time, 1.08-1.12 without
    dweight/dbias, float32 rows of 4096 and 8192 values 1.06-1.12: not taken.)"""
    dy3, x3, dx3, scratch = _borrowed(dy3), _borrowed(x3), _borrowed(dx3), _borrowed(scratch)
    w2, pw, pb, terms = _borrowed(w2), _borrowed(pw), _borrowed(pb), _borrowed(terms)
    L = x3.shape[2]
    for n in range(n_first, n_last):
        fold = affine and ((n + 1 - n_first) % TERM_BLOCK_ROWS == 0 or n == n_last - 1)
        for g in range(g_first, g_last):
            mu = mean2[n, g] if use_mean else 0.0
            r = rstd2[n, g]
            wg, tw, tb = w2[g], terms[g - g_first, 0], terms[g - g_first, 1]
            A, B = (0.0, 0.0) if fixed else _row_dx_sums(dy3[n, g], x3[n, g], wg, mu, r)
            mdx = A / L if use_mean else 0.0
            _dx_row_to(
                dy3[n, g], x3[n, g], dx3[n, g], scratch, stream, wg, mu, r, B / L, mdx, fixed, affine, tw, tb,
                one_group,
            )  # fmt: skip
            if fold:
                _fold_terms(tw, tb, pw[g], pb[g])


@_item
def _backward_rows_lean(
    dy3, x3, mean2, rstd2, w2, use_mean, fixed, dx3, affine, pw, pb, n_first, n_last, g_first, g_last, blocks, scratch,
    stream,
):  # fmt: skip
    """``_backward_rows`` of rows with one dweight and one dbias term each (``affine``: rows whose weight is one value
    repeated, InstanceNorm's small maps taken as rows by ``_as_rows``), into the partial rows of one value
    pw[g] = [dweight[g]], pb[g]; or of rows without terms. dx streams only from blocks of short rows (see below,
    "Streamed"), through ``scratch``, SHORT_ROW_VALUES rows of L values. InstanceNorm's rows always
    come here; rows without terms when they are of several groups (not LayerNorm's or RMSNorm's) and their dx does
    not stream (``_backward_by_groups``).

    The terms of a row are sum(dy) and sum(dy * xhat), in float64 (``_row_dy_sums``): times the weight they are the
    two sums dx needs, so the dx pass carries no terms. Against the terms per value, which cost each value two more
    stores and each row's call a fixed 12 ns (``_dx_row_affine``), ``benchmarks/compare_kernels.py`` (2 threads,
    the AMD Zen 4 VM) took the InstanceNorm backward on 4x4 maps (4096, 64, 1, 16) 0.77-0.79 of the time from cold
    caches (0.75-0.80 hot), float64 0.61; maps of 8 values 0.73 (float64 0.72), of 32 float32 values 0.76.

    Rows of more than SHORT_ROW_LOOP_BACKWARD_BYTES and at most SHORT_ROW_VALUES values take their sums and dx each
    as one vector (see "short rows"). ``benchmarks/compare_kernels.py --cold --floor`` (2 threads, the Intel VM,
    three runs; new/twin 0.98-1.04) took the backward, with dweight/dbias or without, of float32 rows of 16 and 9
    values ((N, 64, 1, S): InstanceNorm's maps) 0.83-0.96 and 0.76-0.88 of the time, of float64 rows of 16, 9, 8
    and 5 values 0.93-0.98, 0.87-0.89, 0.89-1.02 and 0.83-0.90; hot, float32 rows of 16 values 0.84 and
    0.88-0.96. Rows of 32 bytes or less keep the
    loops: as vectors, float32 rows of 8, 4 and 2 values took 1.00-1.04, 1.07-1.13 and 1.18, float64 rows of 4
    and 2 values 1.08 and 1.20-1.21 (a vector's fixed work outweighs a loop over so few values). In batches (the
    sums of each n's rows, then their dx), the vectors took 1.05-1.26 of the time of the rows one at a time.

    Float32 rows of at most SHORT_BLOCK_BACKWARD_VALUES values go SHORT_ROW_VALUES rows (n, g..g+15) at a time
    where the call's items hold that many groups (``_short_block_backward``: the block's sums added together, its
    scalars as vectors, dx from the rows re-read in L1; the same bits as the rows one at a time as vectors), the
    rest one at a time as vectors however short, so that all the call's sums add in one order. Against the rows one
    at a time, ``benchmarks/compare_kernels.py --cold --floor`` (the Intel VM, 2 threads, (N, 64, 1, L) of
    16-32 MiB, two to four runs; new/twin 0.94-1.04) took float32 rows of 2, 4, 8, 9, 12 and 14 values 0.79,
    0.75-0.77, 0.68-0.76, 0.78-0.91, 0.91-0.95 and 0.95 of the time with dweight/dbias, 0.85, 0.83-0.84, 0.81-0.82,
    0.85-0.93, 1.00-1.03 and 1.02 without; rows of 16 values (InstanceNorm's 4x4 maps) 0.96-1.15 and 1.02-1.15,
    though hot, on one thread (1024, 64, 1, 16), 0.85-0.86 and 0.85-0.89. Float64 rows took 0.98-1.08 (4 and 5
    values) to 1.04-1.32 (9 and 16), hot 1.17: they stay one at a time. Likely why the longer rows gain nothing from
    DRAM: a block is some 800 instructions, all its loads first, more than the CPU keeps in flight, so the next
    block's loads wait for this one's arithmetic, where rows one at a time have the next rows' loads under way; the
    block pays where the rows' work is the cost, not their bytes. (With the block after next prefetched into L1,
    float32 rows of 16 values still took 1.08 and 1.15.)

    Streamed: where dx is big enough to stream in blocks of SHORT_ROW_VALUES rows (``_streams``: whole cache lines
    of 512 bytes or more, float32 rows of 8 values or more, float64 of 4; with SHORT_ROWS_STREAM), each block's dx
    goes through ``scratch`` (in L1) and out with non-temporal stores (``_stream_copy``), after the x and dy rows
    PREFETCH_DISTANCE_BYTES ahead are prefetched into L1, and the rows that would otherwise go one at a time as
    vectors take blocks too, float64 rows among them (``_short_backward_blocks``), as in the forward's "Streamed
    short rows" (``_forward_rows``). ``benchmarks/compare_kernels.py 6c7afdf --cold --floor`` (the AMD VM of CPU
    family 26, 2 threads, (N, 64, 1, L) of 16-32 MiB, new/twin 0.98-1.02) took the backward with dweight/dbias, and
    without, of float32 rows of 16, 9 and 8 values 0.53 and 0.54, 0.72 and 0.71, 0.69 and 0.70 of the time, of
    float64 rows 0.57 and 0.59, 0.59 and 0.61, 0.60 and 0.64; hot on one thread, float32 rows of 16 and 9 values
    0.52-0.55 and 0.64-0.65. (A first prototype, float32 rows of 16 values: blocks with the prefetch alone 0.76-0.81,
    with their rows' vectors streamed alone 0.94, both 0.47-0.53.)

    A loop of its own, rather than a case of ``_backward_rows``'s: numba compiles the flags of that loop (stream,
    fixed, the kind of terms) as run-time values, and their branches cost these short rows more than their
    arithmetic. Against them inside that loop, ``benchmarks/compare_kernels.py --floor`` (the AMD VM of CPU family
    26; a twin of the same code 0.98-1.04 apart; two runs) took the float32 backward on 4x4 maps (4096, 64, 1, 16)
    0.85-0.88 of the time from cold caches on 2 threads, without dweight/dbias 0.85-0.89, (1024, 64, 1, 16)
    0.86-0.91 and 0.92, float64 maps of 8 values (4096, 64, 1, 8) 0.85-0.87 and 0.85-0.88 (of 16 values, 128 bytes,
    0.93 and 0.96); hot on one thread (256, 64, 1, 16) 0.75-0.79 and 0.62-0.80, GroupNorm's 4x4 maps as rows
    without dweight/dbias (128, 8, 8, 16) 0.85-0.93, maps of 64 values 0.92-0.95. The price is its compile: see
    ``_backward_rows_lean_kernel``. (Inside ``_backward_rows``, as a call before its loop, the cold compile of a
    first LayerNorm forward and backward took 17.0 s instead of 14.4, which LayerNorm's rows, each its own group,
    do not repay: 1.00 of the time there.)"""
    dy3, x3, dx3, w2 = _borrowed(dy3), _borrowed(x3), _borrowed(dx3), _borrowed(w2)
    pw, pb, scratch = _borrowed(pw), _borrowed(pb), _borrowed(scratch)
    # (a copy of the loop for each, its ``short`` a constant: with one loop testing a run-time flag, rows of 2-8
    # values took 1.03-1.07 of the time. With ``blocks``, the rows outside them go as vectors too, whatever their
    # length, so that all the rows' sums add in one order, a block's)
    if _short_backward_rows(x3.shape[2], x3.itemsize) or blocks:
        _lean_rows(
            dy3, x3, mean2, rstd2, w2, use_mean, fixed, dx3, affine, pw, pb, n_first, n_last, g_first, g_last, True,
            blocks, scratch, stream,
        )  # fmt: skip
    else:
        _lean_rows(
            dy3, x3, mean2, rstd2, w2, use_mean, fixed, dx3, affine, pw, pb, n_first, n_last, g_first, g_last, False,
            False, scratch, False,
        )  # fmt: skip


@numba.njit(inline="always")
def _short_backward_blocks(L, itemsize, stream):
    """Whether the lean rows' backward takes rows of L values SHORT_ROW_VALUES at a time (``_short_block_backward``)
    where its items hold that many groups: float32 rows of at most SHORT_BLOCK_BACKWARD_VALUES values, and where dx
    ``stream``s, any rows that would otherwise go one at a time as vectors (``_short_backward_rows``: the same bits),
    on a CPU with masked vector instructions (SHORT_ROWS_AS_VECTORS). See ``_backward_rows_lean``."""
    return SHORT_ROWS_AS_VECTORS and (
        itemsize == 4 and L <= SHORT_BLOCK_BACKWARD_VALUES or stream and _short_backward_rows(L, itemsize)
    )


@numba.njit(inline="always")
def _any_infinite(v):
    """Whether a value of v is +-inf."""
    for i in range(v.shape[0]):
        if math.isinf(v[i]):
            return True
    return False


@numba.njit(error_model="numpy", inline="always")
def _lean_rows(
    dy3, x3, mean2, rstd2, w2, use_mean, fixed, dx3, affine, pw, pb, n_first, n_last, g_first, g_last, short, blocks,
    scratch, stream,
):  # fmt: skip
    """``_backward_rows_lean``'s loop, ``short`` rows (at most SHORT_ROW_VALUES values) as vectors, and, with
    ``blocks`` (such rows too), SHORT_ROW_VALUES rows of one n at a time (``_short_block_backward``)."""
    L = x3.shape[2]
    no_mask = np.empty(0, np.bool_)
    # (an item with an infinite weight takes its rows one at a time: their sums then make dy * inf NaN where dy is 0)
    blocks = blocks and not (affine and _any_infinite(w2[g_first:g_last, 0]))
    groups = max(0, g_last - g_first)  # (the items past G are empty)
    whole = g_first + groups // SHORT_ROW_VALUES * SHORT_ROW_VALUES if blocks else g_first
    G = x3.shape[1]
    x_flat, dy_flat, dx_flat = x3.reshape(x3.size), dy3.reshape(dy3.size), dx3.reshape(dx3.size)
    ahead = PREFETCH_DISTANCE_BYTES // x3.itemsize  # (values)
    for n in range(n_first, n_last):
        for g in range(g_first, whole, SHORT_ROW_VALUES):
            k = g + SHORT_ROW_VALUES
            at, end = (n * G + g) * L, (n * G + k) * L
            if stream:
                _prefetch_lines(x_flat[at + ahead : end + ahead], 1)
                _prefetch_lines(dy_flat[at + ahead : end + ahead], 1)
            dxb = scratch.reshape(SHORT_ROW_VALUES, L) if stream else dx3[n, g:k]
            _short_block_backward(
                dy3[n, g:k], x3[n, g:k], dxb, w2, g, mean2[n, g:k], rstd2[n, g:k], use_mean, fixed, affine, pw[g:k],
                pb[g:k],
            )  # fmt: skip
            if stream:
                _stream_copy(scratch, dx_flat[at:end])
        for g in range(whole, g_last):
            mu = mean2[n, g] if use_mean else 0.0
            r, wg = rstd2[n, g], w2[g]
            if affine:
                if math.isinf(wg[0]):  # dxhat = dy * inf is NaN where dy is 0, as in the reference
                    a, b, A, B = _dy_sums(dy3[n, g], x3[n, g], no_mask, False, wg[0], mu, r)
                else:
                    # (with _run_dy_sums in place of this test, LLVM leaves the sums a call: 1.27 of the time)
                    if short:
                        a, b = _short_row_dy_sums(dy3[n, g], x3[n, g], mu, r)
                    else:
                        a, b = _row_dy_sums(dy3[n, g], x3[n, g], mu, r)
                    A, B = wg[0] * a, wg[0] * b
                pw[g, 0] += b
                pb[g, 0] += a
                if fixed:
                    A, B = 0.0, 0.0
            elif fixed:  # (no sums to take: with given statistics dx needs none)
                A, B = 0.0, 0.0
            elif short:
                A, B = _short_row_dx_sums(dy3[n, g], x3[n, g], wg, mu, r)
            else:
                A, B = _row_dx_sums(dy3[n, g], x3[n, g], wg, mu, r)
            proj, mdx = B / L, A / L if use_mean else 0.0
            if short:
                _short_dx_row(dy3[n, g], x3[n, g], dx3[n, g], wg, mu, r, proj, mdx, fixed)
            else:
                _dx_row(dy3[n, g], x3[n, g], dx3[n, g], wg, mu, r, proj, mdx, fixed)


@_item
def _backward_row_pieces(
    dy3, x3, mean2, rstd2, w2, use_mean, fixed, dx3, proj, mdx, piece, first, last, affine, dw, db, scratch, stream
):
    """``_backward_rows`` of the pieces p = first..last-1 of ``piece`` columns of every row of one group (LayerNorm's,
    RMSNorm's), each row's proj = B/L and mdx = A/L given (``_backward_few_rows_kernel``): dx, and, with ``affine``,
    each piece's own dweight and dbias columns in dw, db (in x's dtype), its rows' terms summed as ``_backward_rows``
    sums them, in blocks of TERM_BLOCK_ROWS rows, in float64, then rounded once (the same bits)."""
    N, _, L = x3.shape
    terms = np.zeros((2, piece), dx3.dtype)
    sums = np.empty((2, piece))
    for p in range(first, last):
        j0 = p * piece
        j1 = min(L, j0 + piece)
        tw, tb, pw, pb = terms[0, : j1 - j0], terms[1, : j1 - j0], sums[0, : j1 - j0], sums[1, : j1 - j0]
        pw[:] = 0.0
        pb[:] = 0.0
        for n in range(N):
            mu = mean2[n, 0] if use_mean else 0.0
            _dx_row_to(
                dy3[n, 0, j0:j1], x3[n, 0, j0:j1], dx3[n, 0, j0:j1], scratch, stream, w2[0, j0:j1], mu, rstd2[n, 0],
                proj[n], mdx[n], fixed, True, tw, tb, True,
            )  # fmt: skip
            if not affine:  # (its terms, made in L1 all the same: a choice of loops made the affine pieces slower)
                continue
            if n == N - 1:
                _fold_terms_to(tw, tb, pw, pb, dw[j0:j1], db[j0:j1])
            elif (n + 1) % TERM_BLOCK_ROWS == 0:
                _fold_terms(tw, tb, pw, pb)


@_item
def _backward_groups(
    dy3, x3, mean2, rstd2, w2, use_mean, reduce_batch, mask2, has_mask, fixed, dx3, affine, pw2, pb2, K, S, first,
    last, scratch, stream,
):  # fmt: skip
    """Backward of the groups q = first..last-1, as ``_forward_groups`` walks them: channels (reduce_batch:
    BatchNorm, all N blocks as one) or (n, g) blocks one at a time in memory order; dweight and dbias terms into
    the partial rows pw2[g], pb2[g].

    From DRAM, the sums pass reads a block's x and dy right after the last block's, so that its two read streams run
    on from block to block, as a copy's do, and the hardware prefetcher with them. Walked channel by channel instead
    (a work item per chunk of samples and group), each block was a fresh start, C*S values after the
    last, and pairs of blocks (two streams each, ``_backward_sums_pair``, as BatchNorm's channels still take them)
    won back only part of that: a pass that only sums x and dy of float32 InstanceNorm 32x64x56x56
    (``_row_dy_sums_pair``) took 1.25 ms so from cold caches on 2 threads, 1.11 over pairs of neighbours in memory,
    0.93 over pairs half an item apart, 0.85 over each item's memory in one stream (the AMD VM of CPU family 26).
    Against the channel walk (InstanceNorm's blocks in pairs), ``benchmarks/compare_kernels.py --cold --floor`` (2
    threads, the same VM, the twin 0.96-1.05) took the float32 InstanceNorm backward of 32x64x56x56 0.84-0.89 of the
    time, 8x64x56x56 0.85-0.86, 16x64x32x32 0.80-0.82, 32x32x28x28 0.94-1.01, GroupNorm (8 groups) 32x64x56x56
    0.95-1.06, 16x32x4x784 (groups of 4 channels of 28x28) 0.78-0.86; float64 0.92-0.97 and 0.95-1.01; hot on one
    thread 0.81-1.00; BatchNorm's channels, unchanged, 1.00-1.01. The cold compile of the kernel, both dtypes, 13.3
    and 15.3 s against 15.5 and 13.6. (Pairs half an item apart here, each pair's sums in one pass: InstanceNorm
    float32 32x64x56x56 0.88-0.93 of the channel walk's time, GroupNorm float64 1.04-1.07, a pair of its 200 KiB
    blocks too big for L2 (1 MiB) to hold until the dx pass: not taken. The same walk in an item function of its own
    beside the channels': the cold compile of every kernel 1.24x, numba generating the items again for each parallel
    loop.)

    (A streamed BatchNorm backward prefetching the next channel's blocks into L2 while it writes this one's dx,
    as ``_block_ahead`` in the forward: ``benchmarks/compare_kernels.py --cold`` (2 threads, the AMD Zen 4 VM,
    32x64x56x56) took float32 1.07 of the time with x and dy prefetched, 1.03 with x alone; float64 1.00. Walked in
    memory order, each block's dx streamed out while the next block's x and dy were prefetched piece by piece, into L2
    or into L1, on the AMD VM of CPU family 26: float32 InstanceNorm 32x64x56x56 1.14-1.15 of the time cold on 2
    threads, 16x64x32x32 0.98-1.01.)"""
    dy3, x3, dx3, scratch = _borrowed(dy3), _borrowed(x3), _borrowed(dx3), _borrowed(scratch)
    w2, mask2, pw2, pb2 = _borrowed(w2), _borrowed(mask2), _borrowed(pw2), _borrowed(pb2)
    N, G, _ = x3.shape
    kp, sp = _stream_pieces(K, S, scratch)
    for q in range(first, last):
        g = q if reduce_batch else q % G
        n0 = 0 if reduce_batch else q // G
        n1 = N if reduce_batch else n0 + 1
        wg, pw, pb = w2[g], pw2[g], pb2[g]
        mu = mean2[n0, g] if use_mean else 0.0
        r = rstd2[n0, g]
        proj = 0.0
        mdx = 0.0
        if not fixed:
            A, B = _backward_sums(dy3, x3, wg, mask2, has_mask, mu, r, n0, n1, g, K, S, pw, pb, affine)
            count = _group_count(mask2, has_mask, n0, n1, K, S)
            proj = B / count
            mdx = A / count if use_mean else 0.0
        elif affine:  # only the dweight/dbias sums
            _backward_sums(dy3, x3, wg, mask2, has_mask, mu, r, n0, n1, g, K, S, pw, pb, True)
        for n in range(n0, n1):
            dyb, xb, dxb = dy3[n, g], x3[n, g], dx3[n, g]
            _dx_block_to(dyb, xb, dxb, scratch, stream, wg, mask2[n], has_mask, mu, r, proj, mdx, fixed, K, S, kp, sp)


# ---------------------------------------------------------------------------
# BatchNorm of short runs, the batch in memory order (the "columns" kernels)
#
# With S values per (n, c) block, BatchNorm's channel c is N runs of S values, one in each row n of the
# (N, C*S) view, C*S values apart. The kernels above walk a channel run by run; for short runs (BatchNorm1d
# on (N, C): S = 1) that is a strided walk that fetches a whole cache line per run and pays a call per run:
# on (8192, 512) float32 the forward ran at 1.6 GB/s, no faster than the NumPy reference. These kernels walk
# the rows in memory order instead and keep one float64 accumulator per position p = c*S + s of a row, added
# to one row at a time (a loop that vectorizes whatever S is), the channel's statistic expanded to its S
# positions where a pass needs it. Each pass over the batch is a parallel loop over row chunks, each
# summing into its own partial row; the partial rows are added in chunk order and then the S positions of
# each channel, so that the result is the same bits on any number of threads. The price is a pass over x
# for the statistics (the squared deviations of a tile of rows read again from L2, _column_moments) and one
# for y (one for the sums of dy and one for dx), where the channel walk reads a channel once from DRAM and
# again from L2, and rows of the weight and statistics, repeated per position, beside each row.
#
# Measured against the channel walk (2 threads, cold caches, out= buffers, the AMD VM; forward, backward):
# float32 (8192, 512) 1.3 ms against 18.8 (0.07 of the time), 2.6 against 25.4 (0.10); (65536, 64) 0.05 and
# 0.07; eval mode (given statistics, fixed-statistics backward) 0.05-0.09. Runs of S values, float32 S = 8
# and 16: 0.38-0.40 and 0.50-0.57; S = 32 (128 bytes) 0.92 and 0.97; S = 49 and 64: 1.4-1.7 and 1.5-1.8;
# float64 S = 8: 0.39 and 0.57; S = 16 (128 bytes) 0.68 and 1.07; S = 32: 1.40 and 1.77. Hence runs of
# fewer than COLUMNS_MAX_RUN_BYTES = 128 bytes. (The backward was measured with four accumulators per position,
# since two: see _column_dy_sums.)
#
# A mask of BatchNorm in runs of one value marks whole rows (samples), which these kernels skip (_row_valid):
# float32 (8192, 1024) with a fifth of the rows masked, hot, 2 threads: forward 2.6 ms and backward 4.1, where
# the channel walk took 75 and 165 and the NumPy reference 83 and 137 (float64: 4.7 and 7.6, the reference 77
# and 136). A mask inside the rows (runs of S > 1 values) keeps the channel walk.
#
# (The batch walked in tiles of columns instead, all N rows of T positions, so that the second and third reads of
# a tile find it in the cache and x comes from DRAM once: float32 (8192, 1024) forward 2.0-2.7 times the time from
# cold caches with T = 64, 128, 256, and 1.8-4.2 hot with T = 16, 64, 256; only a batch that fits in the L3
# gained, (1024, 1024) 0.57 and 0.67 (T = 256, 64). Each row of a tile lies in a page of its own, 4 KiB after
# the last: likely a walk that the TLB and the hardware prefetcher follow poorly. With each row's run of the tile
# prefetched 16 rows ahead into L2 (``_prefetch``; a prototype, 2 threads, cold caches, float32 (8192, 1024), the AMD
# Zen 4 VM), the forward took 0.97-0.99 of the time with T = 128 and 256, 1.09-1.12 with T = 64 and 512, where
# without it 2.36: the prefetcher was the cause. But the tiles' statistics pass alone took 2.0-2.5 ms (13-17 GB/s
# over x's 32 MiB, in runs of 256 bytes to 2 KiB per row), and the normalize pass after it as long as from DRAM
# (the two passes timed alone added up to the whole): a tile of 4-8 MiB per thread did not stay in this VM's
# share of the L3. Not taken.)


@numba.njit(inline="always")
def _row_valid(valid, has_mask, n):
    """Whether row n of the batch counts: without a mask every row; with one (a mask (N, 1) of BatchNorm in runs
    of one value marks whole rows), valid[n]. Masked rows reach no sum, whatever they hold (even NaN), and get
    y = dx = 0, as in the reference."""
    return not has_mask or valid[n]


@numba.njit(inline="always")
def _valid_run(valid, has_mask, n, end):
    """(first, stop) of the next run of consecutive valid rows at or after row n, before row ``end``: (n, end)
    without a mask. The statistics loop over runs: a test of each row in their loops took the forward of float32
    rows of 64 values 1.08-1.10x the time unmasked."""
    if not has_mask:
        return n, end
    while n < end and not valid[n]:
        n += 1
    stop = n
    while stop < end and valid[stop]:
        stop += 1
    return n, stop


@_item
def _valid_rows(valid, has_mask, N):
    """How many of the N rows count (``_row_valid``)."""
    if not has_mask:
        return N
    count = 0
    for n in range(N):
        count += 1 if valid[n] else 0
    return count


@_item
def _column_squares(x2, valid, has_mask, n_first, n_last, acc):
    """acc[p] = the sum of x2[n, p]^2 over the valid rows n = n_first..n_last-1 (``_row_valid``), in float64 (the
    uncentered statistic)."""
    x2, acc = _borrowed(x2), _borrowed(acc)
    acc[:] = 0.0
    for n in range(n_first, n_last):
        if not _row_valid(valid, has_mask, n):
            continue
        xr = x2[n]
        for p in range(acc.shape[0]):
            d = np.float64(xr[p])
            acc[p] += d * d


@numba.njit(error_model="numpy", inline="always")
def _merged_moments(sum_a, m2_a, n_a, sum_b, m2_b, n_b):
    """(sum, M2) of two sets of n_a and n_b > 0 values from theirs (Chan, Golub and LeVeque's update):
    sum = sum_a + sum_b, M2 = M2_a + M2_b + (sum_b / n_b - sum_a / n_a)^2 * n_a * n_b / (n_a + n_b); the second
    set's own if the first is empty (n_a = 0)."""
    if n_a == 0:
        return sum_b, m2_b
    delta = sum_b / n_b - sum_a / n_a
    return sum_a + sum_b, m2_a + m2_b + delta * delta * (n_a * n_b / (n_a + n_b))


@numba.njit(inline="always")
def _four_rows(P, bytes_per_position):
    """Whether a columns pass keeping ``bytes_per_position`` in L1 for each of a row's P positions takes the rows
    four at a time (COLUMNS_FOUR_ROWS_MIN_BYTES; see ``_column_dy_sums``)."""
    return P * bytes_per_position >= COLUMNS_FOUR_ROWS_MIN_BYTES


@_item
def _column_moments(x2, valid, has_mask, n_first, n_last, out):
    """out[0, p] = the sum of x2[n, p] over the valid rows n = n_first..n_last-1 (``_row_valid``), and out[1, p]
    = the sum of squared deviations from their mean (M2), in float64, with one read of the rows from memory;
    returns how many rows counted.

    The rows go in tiles of at most COLUMNS_TILE_BYTES, which stay in L2: a tile's sums, then its squared
    deviations from the tile's mean c = sum / n_b (the second read, from L2: two passes, never E[x^2] - E[x]^2),
    then the tile merged into the moments of the rows before it (``_merged_moments``).

    Against a second pass over the batch for the squared deviations, as the forward had, ``compare_kernels.py
    --cold`` (2 threads, the AMD VM, two runs) took the forward of float32 (8192, 1024) 0.96-0.99 of the time
    (32 MiB: the second pass had found much of it in L3), (65536, 64) 0.83-0.88, float64 (8192, 1024) 0.86-0.89,
    (65536, 64) 0.83-0.91; hot, float32 (1024, 1024) 0.89, and small batches, where the merges are a larger
    share, up to 1.11 ((256, 512): 62 against 55 microseconds); those with tiles of 64 KiB. Against those,
    tiles of 256 KiB took the same time (0.96-1.01) but for rows so long that a tile of 64 KiB held few of them,
    merged after every other row: float32 (512, 16384) 0.79, (256, 512 * 16) 0.87, float64 (512, 8192) 0.84.
    Tiles of 16 KiB took float32 (8192, 1024) 1.03-1.14.

    Rows for which the tile's loops keep nearly L1's 32 KiB there (COLUMNS_FOUR_ROWS_MIN_BYTES: tile_sum and
    tile_m2, 16 bytes per position, and the row; float32 rows of 1434 values or more, float64 of 1195) go four at
    a time, as in ``_column_dy_sums``: ``compare_kernels.py --cold`` took the float32 forward of (4096, 2048) 0.85
    and 0.96 of the time in two runs, (2048, 4096) 0.84, float64 (4096, 2048) 0.88-0.94 (two copies of the same
    code 1.00-1.02); but rows of 1024 float32 values, 20 KiB of sums and row, 1.09 (8192, 1024). That measured
    both passes so; the second, which reads the tile from L2 and does more per value, now takes rows of any length
    four at a time (one load and store of tile_m2[p] and one c for four rows): ``compare_kernels.py --cold``
    (the Intel VM, 2 threads, new/twin 0.94-1.03) took the forward of float32 (8192, 1024) 0.93, (65536, 64),
    (16384, 512) and (32768, 96) 0.95-0.96, float64 0.95-0.96; hot 0.93-1.01 ((256, 512): 1.00). (Alone, with
    x from DRAM, this pass took 1.5-1.6x the time of a pass that only sums the columns; the next tile prefetched
    into L2 while the second pass runs did not close that: the forward 1.00-1.03; nor the same rows of the next tile
    prefetched four at a time as the second pass takes them, into L2 or L1, float32 (8192, 1024) and (65536, 64):
    0.96-1.04.)"""
    x2, out = _borrowed(x2), _borrowed(out)
    P = x2.shape[1]
    total, m2 = out[0], out[1]
    tile_sum, tile_m2 = np.empty(P), np.empty(P)
    rows = max(1, COLUMNS_TILE_BYTES // max(1, P * x2.itemsize))
    by_four = _four_rows(P, 16 + x2.itemsize)  # (the first pass; tile_sum, tile_m2 and the row)
    total[:] = 0.0
    m2[:] = 0.0
    n_a = 0
    for t0 in range(n_first, n_last, rows):
        t1 = min(n_last, t0 + rows)
        n_b = 0
        tile_sum[:] = 0.0
        first, stop = _valid_run(valid, has_mask, t0, t1)
        while first < stop:
            n_b += stop - first
            n = first
            while by_four and n + 4 <= stop:
                xa, xb, xc, xd = x2[n], x2[n + 1], x2[n + 2], x2[n + 3]
                for p in range(P):
                    tile_sum[p] += (np.float64(xa[p]) + xb[p]) + (np.float64(xc[p]) + xd[p])
                n += 4
            for q in range(n, stop):
                xr = x2[q]
                for p in range(P):
                    tile_sum[p] += xr[p]
            first, stop = _valid_run(valid, has_mask, stop, t1)
        if n_b == 0:
            continue
        tile_m2[:] = 0.0
        inv_b = 1.0 / n_b
        first, stop = _valid_run(valid, has_mask, t0, t1)
        while first < stop:
            n = first
            while n + 4 <= stop:
                xa, xb, xc, xd = x2[n], x2[n + 1], x2[n + 2], x2[n + 3]
                for p in range(P):
                    c = tile_sum[p] * inv_b
                    da, db, dc, dd = xa[p] - c, xb[p] - c, xc[p] - c, xd[p] - c
                    tile_m2[p] += (da * da + db * db) + (dc * dc + dd * dd)
                n += 4
            for q in range(n, stop):
                xr = x2[q]
                for p in range(P):
                    d = xr[p] - tile_sum[p] * inv_b
                    tile_m2[p] += d * d
            first, stop = _valid_run(valid, has_mask, stop, t1)
        for p in range(P):
            total[p], m2[p] = _merged_moments(total[p], m2[p], n_a, tile_sum[p], tile_m2[p], n_b)
        n_a += n_b
    return n_a


@_item
def _fold_moments(part, counts, S, var1):
    """var1[c] = M2 / (n * S) of channel c, from the chunks' (sum, M2) per position in part (n_chunks, 2, P) over
    counts[k] rows each (n in all): the chunks merged in chunk order, then the S positions of the channel (n
    values each), by ``_merged_moments``; returns n. No row at all gives 0/0, NaN, as in the reference."""
    n_chunks, _, P = part.shape
    total, m2 = np.zeros(P), np.zeros(P)
    n_a = 0
    for k in range(n_chunks):
        n_b = counts[k]
        if n_b == 0:  # (the last chunks of some N are empty, a chunk may be all masked)
            continue
        for p in range(P):
            total[p], m2[p] = _merged_moments(total[p], m2[p], n_a, part[k, 0, p], part[k, 1, p], n_b)
        n_a += n_b
    for c in range(var1.shape[0]):
        t, m = total[c * S], m2[c * S]
        for s in range(1, S):
            t, m = _merged_moments(t, m, s * n_a, total[c * S + s], m2[c * S + s], n_a)
        var1[c] = m / (n_a * S)
    return n_a


@_item
def _column_dy_sums(dy2, x2, valid, has_mask, mu, r, n_first, n_last, acc):
    """Position by position over the valid rows n = n_first..n_last-1 (``_row_valid``), in float64:
    acc[0, p] = the sum of dy and acc[1, p] = the sum of dy * xhat (xhat = (x - mu[p]) * r[p]). Of the four
    sums of ``_dy_sums`` these two are all a position needs: its weight w[p] is its channel's, the same in
    every row, so the sums of dxhat = dy * w[p] and dxhat * xhat are w[p] times them (``_column_dxhat_sums``,
    after the fold). Four accumulators per position, as the sums were first formed here, took the backward
    of float32 (8192, 1024) 1.5x the time of these two (float64 1.25x; compare_kernels.py --cold, 2 threads):
    a row of them left L1. (Rows of 64 float64 values alone went the other way, four taking 0.90x the time of
    two: too little work per row to hide the latency of adding into the same accumulators row after row. The
    rows in blocks of 16 and the positions in tiles of 256, so that the sums and factors of a tile stay in L1
    whatever the row's length, in the same order of additions: float32 (8192, 1024) 1.03-1.04x the time from
    cold caches, (4096, 2048) 1.05-1.13x; the AMD Zen 4 VM.)

    Rows for which this pass keeps in L1 nearly L1's 32 KiB (COLUMNS_FOUR_ROWS_MIN_BYTES: a0, a1, mu and r, 32
    bytes per position, and the rows of dy and x; float32 rows of 717 values or more, float64 of 598) go four at a
    time within each run of valid rows, their terms added in pairs before they reach the accumulators: one load and
    store of a0[p] and a1[p], and one load of mu[p] and r[p], for four rows instead of one, and eight read streams
    instead of two. This pass alone, from cold caches on 2 threads (the AMD Zen 4 VM), took float32 (8192, 1024)
    and (4096, 2048) 0.65-0.67 of the time (2.3-2.8 ms against 3.5-4.2: about the time of a pass that only reads x
    and dy, 2.35 ms), (16384, 768) 0.75-0.78, float64 (8192, 1024) 0.76, (2048, 2048) 0.81, (8192, 768) 0.82;
    ``benchmarks/compare_kernels.py --cold`` took the whole float32 backward of rows of 1024 and 2048 values 0.82-0.88
    of the time (two copies of the same code 1.00-1.02), of 768 values 0.94-0.97, float64 0.91-0.98 and 0.94-0.95.
    Narrower rows stay one at a time: four at a time took this pass on float32 rows of 640 values 1.00 of the time,
    of 128, 256 and 512 values 2.0, 2.2 and 1.2-1.7, float64 rows of 256 and 512 values 1.5 and 1.1-1.3 (likely
    because several rows read in turn, parts of one 4 KiB page, are a pattern the hardware prefetcher follows less
    well than one row after the other, and a row's sums that stay in L1 gain little from fewer loads).
    (The dx pass four rows at a time, each position's six factors loaded once for four rows: float32 (8192, 1024)
    1.01-1.02 of the time cold, (1024, 1024) 1.12-1.14 hot; in pieces of 1 KiB, so that the factors' slices and the
    four rows' pieces stay in L1 together, 1.02-1.03 cold, 1.06-1.09 hot: not taken.)"""
    dy2, x2, mu, r = _borrowed(dy2), _borrowed(x2), _borrowed(mu), _borrowed(r)
    a0, a1 = _borrowed(acc[0]), _borrowed(acc[1])
    acc[:] = 0.0
    by_four = _four_rows(a0.shape[0], 32 + 2 * x2.itemsize)  # (a0, a1, mu, r and the rows of dy and x)
    first, stop = _valid_run(valid, has_mask, n_first, n_last)
    while first < stop:
        n = first
        while by_four and n + 4 <= stop:
            dya, dyb, dyc, dyd = dy2[n], dy2[n + 1], dy2[n + 2], dy2[n + 3]
            xa, xb, xc, xd = x2[n], x2[n + 1], x2[n + 2], x2[n + 3]
            for p in range(a0.shape[0]):
                m, rp = mu[p], r[p]
                ea, eb, ec, ed = np.float64(dya[p]), np.float64(dyb[p]), np.float64(dyc[p]), np.float64(dyd[p])
                a0[p] += (ea + eb) + (ec + ed)
                a1[p] += (ea * ((xa[p] - m) * rp) + eb * ((xb[p] - m) * rp)) + (
                    ec * ((xc[p] - m) * rp) + ed * ((xd[p] - m) * rp)
                )
            n += 4
        for q in range(n, stop):
            dyr, xr = dy2[q], x2[q]
            for p in range(a0.shape[0]):
                d = np.float64(dyr[p])
                a0[p] += d
                a1[p] += d * ((xr[p] - mu[p]) * r[p])
        first, stop = _valid_run(valid, has_mask, stop, n_last)


@_item
def _column_dxhat_sums(dy2, x2, valid, has_mask, mean1, rstd1, w1, S, sums):
    """sums[2, c] and sums[3, c], the sums of dxhat = dy * w[c] and dxhat * xhat over channel c, from its sums of
    dy and dy * xhat in sums[0, c] and sums[1, c]: w[c] times them. Where w[c] is inf or NaN that product would
    hide the NaN that the terms themselves make (inf * 0, inf + -inf), so the channel is summed term by term
    (``_dy_sums``): the reference's NaN/inf pattern, on a path taken by no finite weight. The blocks' runs of one
    weight do the same (``_run_dy_sums``)."""
    no_mask = np.empty(0, np.bool_)
    for c in range(w1.shape[0]):
        wc = np.float64(w1[c])
        if math.isfinite(wc):
            sums[2, c] = wc * sums[0, c]
            sums[3, c] = wc * sums[1, c]
        else:
            sums[2, c] = sums[3, c] = 0.0
            for n in range(x2.shape[0]):
                if not _row_valid(valid, has_mask, n):
                    continue
                run = slice(c * S, (c + 1) * S)
                t = _dy_sums(dy2[n, run], x2[n, run], no_mask, False, wc, mean1[c], rstd1[c])
                sums[2, c] += t[2]
                sums[3, c] += t[3]


@_item
def _fold_chunks(part, S, m, out):
    """out[c] = (the sum of part[:, p] over the chunks, in chunk order, then over the S positions p of
    channel c) / m."""
    total = part[0].copy()
    for k in range(1, part.shape[0]):
        total += part[k]
    for c in range(out.shape[0]):
        out[c] = (_sum(total[c * S : (c + 1) * S]) if S > 1 else total[c]) / m


@_item
def _per_position(a, S):
    """a[p // S] for each position p of a row: a channel's value repeated over its S positions."""
    out = np.empty(a.shape[0] * S, a.dtype)
    for c in range(a.shape[0]):
        out[c * S : (c + 1) * S] = a[c]
    return out


@_item
def _xhat_factors(x2, mean1, rstd1, S):
    """Per position, in x's dtype: (mu_hi, mu_lo, rstd) of the position's channel (``_split``)."""
    P = x2.shape[1]
    mh, ml, r = np.empty(P, x2.dtype), np.empty(P, x2.dtype), np.empty(P, x2.dtype)
    for c in range(mean1.shape[0]):
        hi, lo = _split(x2, mean1[c])
        mh[c * S : (c + 1) * S] = hi
        ml[c * S : (c + 1) * S] = lo
        r[c * S : (c + 1) * S] = _in_dtype_of(x2, rstd1[c])
    return mh, ml, r


@_item
def _column_normalize(x2, y2, valid, has_mask, mh, ml, r, w, b, has_b, n_first, n_last, scratch, stream):
    """y = ((x - mu_hi) - mu_lo) * rstd * w + b for the rows n_first..n_last-1, every factor per position
    (``_normalize_row``'s arithmetic), 0 in a masked row; a row streamed out in pieces of the scratch row with
    ``stream``."""
    x2, y2, scratch = _borrowed(x2), _borrowed(y2), _borrowed(scratch)
    mh, ml, r, w, b = _borrowed(mh), _borrowed(ml), _borrowed(r), _borrowed(w), _borrowed(b)
    P = x2.shape[1]
    c = scratch.shape[0] if stream else P
    for n in range(n_first, n_last):
        row_counts = _row_valid(valid, has_mask, n)
        for j0 in range(0, P, c):
            j1 = min(P, j0 + c)
            xs, out = x2[n, j0:j1], scratch[: j1 - j0] if stream else y2[n, j0:j1]
            mhs, mls, rs, ws, bs = mh[j0:j1], ml[j0:j1], r[j0:j1], w[j0:j1], b[j0:j1]
            if not row_counts:
                out[:] = 0.0
            elif has_b:
                for p in range(xs.shape[0]):
                    out[p] = _xhat(xs[p], mhs[p], mls[p], rs[p]) * ws[p] + bs[p]
            else:
                for p in range(xs.shape[0]):
                    out[p] = _xhat(xs[p], mhs[p], mls[p], rs[p]) * ws[p]
            if stream:
                _stream_copy(out, y2[n, j0:j1])


@_item
def _column_dx(dy2, x2, dx2, valid, has_mask, mh, ml, r, w, proj, mdx, fixed, n_first, n_last, scratch, stream):
    """dx = ((dxhat - xhat * proj) - mdx) * rstd (or dxhat * rstd with fixed statistics) for the rows
    n_first..n_last-1, every factor per position (``_dx``), 0 in a masked row; streamed out as in
    ``_column_normalize``."""
    dy2, x2, dx2, scratch = _borrowed(dy2), _borrowed(x2), _borrowed(dx2), _borrowed(scratch)
    mh, ml, r, w = _borrowed(mh), _borrowed(ml), _borrowed(r), _borrowed(w)
    proj, mdx = _borrowed(proj), _borrowed(mdx)
    P = x2.shape[1]
    c = scratch.shape[0] if stream else P
    for n in range(n_first, n_last):
        row_counts = _row_valid(valid, has_mask, n)
        for j0 in range(0, P, c):
            j1 = min(P, j0 + c)
            dys, xs, out = dy2[n, j0:j1], x2[n, j0:j1], scratch[: j1 - j0] if stream else dx2[n, j0:j1]
            mhs, mls, rs, ws, ps, ms = mh[j0:j1], ml[j0:j1], r[j0:j1], w[j0:j1], proj[j0:j1], mdx[j0:j1]
            if not row_counts:
                out[:] = 0.0
            elif fixed:
                for p in range(xs.shape[0]):
                    out[p] = dys[p] * ws[p] * rs[p]
            else:
                for p in range(xs.shape[0]):
                    out[p] = _dx(dys[p], ws[p], _xhat(xs[p], mhs[p], mls[p], rs[p]), rs[p], ps[p], ms[p])
            if stream:
                _stream_copy(out, dx2[n, j0:j1])


# The two kernels below hold only their prange loops over row chunks and calls: compiled with parallel=True,
# an array expression (a slice assignment, np.zeros) becomes a parallel region of its own, which wakes the
# threads; one inside a loop over the channels made the forward of (8192, 512) take 140 ms.


def _columns_forward_kernel(
    x2, w1, b1, has_b, eps, centered, valid, has_mask, stats_given, mean1, var1, y2, S, n_chunks, stream
):
    """BatchNorm's forward on the (N, C*S) view x2 of runs of S values (weight, bias, mean, var per channel c),
    with ``has_mask`` over the rows n where valid[n] (S = 1).

    (A batch bigger than the caches is read twice. The normalize pass in reverse row order, to start on the
    rows the statistics pass read last, took a prototype of the two passes over float32 (8192, 1024) and
    (16384, 1024) 1.12-1.17 of the time from cold caches on 2 threads, float64 1.12: not taken. Nor the chunks in
    reverse order, each walked forward, so that each thread starts on the chunk read last and the hardware
    prefetcher keeps its ascending streams (forward and backward): float32 (8192, 1024), (16384, 1024) and (4096,
    2048) 0.99-1.06 of the time, twin 0.93-1.00, on the AMD VM of CPU family 26, whose L3 holds 32 MiB.)"""
    N, P = x2.shape
    G = mean1.shape[0]
    per = (N + n_chunks - 1) // n_chunks
    if not stats_given and centered:
        part = np.empty((n_chunks, 2, P))
        counts = np.empty(n_chunks, np.int64)
        for i in prange(n_chunks):
            counts[i] = _call_item(_column_moments, x2, valid, has_mask, i * per, min(N, (i + 1) * per), part[i])
        n = _call_item(_fold_moments, part, counts, S, var1)
        _call_item(_fold_chunks, part[:, 0], S, n * S, mean1)
    elif not stats_given:
        part = np.empty((n_chunks, P))
        for c in range(G):
            mean1[c] = 0.0
        for i in prange(n_chunks):
            _call_item(_column_squares, x2, valid, has_mask, i * per, min(N, (i + 1) * per), part[i])
        _call_item(_fold_chunks, part, S, _call_item(_valid_rows, valid, has_mask, N) * S, var1)
    rstd1 = np.empty(G)
    for c in range(G):
        rstd1[c] = 1.0 / math.sqrt(var1[c] + eps)
    mh, ml, r = _call_item(_xhat_factors, x2, mean1, rstd1, S)
    w, b = _call_item(_per_position, w1, S), _call_item(_per_position, b1, S)
    for i in prange(n_chunks):
        scratch = np.empty(min(P, STREAM_CHUNK_BYTES // y2.itemsize) if stream else 0, dtype=y2.dtype)
        n_first, n_last = i * per, min(N, (i + 1) * per)
        _call_item(_column_normalize, x2, y2, valid, has_mask, mh, ml, r, w, b, has_b, n_first, n_last, scratch, stream)
        if stream:
            _store_fence()


def _columns_backward_kernel(
    dy2, x2, valid, has_mask, mean1, rstd1, w1, use_mean, fixed, dx2, sums, S, n_chunks, stream
):
    """BatchNorm's backward on the (N, C*S) views (over the valid rows, as the forward); ``sums`` (4, C) receives
    the channels' sums of dy, dy * xhat (dbias, dweight), dxhat and dxhat * xhat, unless it is empty (fixed
    statistics, no affine gradients)."""
    N, P = x2.shape
    G = mean1.shape[0]
    per = (N + n_chunks - 1) // n_chunks
    mean_used, proj, mdx = np.empty(G), np.empty(G), np.empty(G)
    for c in range(G):
        mean_used[c] = mean1[c] if use_mean else 0.0
        proj[c] = 0.0
        mdx[c] = 0.0
    if sums.shape[1] > 0:
        mu, r64 = _call_item(_per_position, mean_used, S), _call_item(_per_position, rstd1, S)
        part = np.empty((n_chunks, 2, P))
        for i in prange(n_chunks):
            _call_item(_column_dy_sums, dy2, x2, valid, has_mask, mu, r64, i * per, min(N, (i + 1) * per), part[i])
        for k in range(2):
            _call_item(_fold_chunks, part[:, k], S, 1.0, sums[k])
        _call_item(_column_dxhat_sums, dy2, x2, valid, has_mask, mean_used, rstd1, w1, S, sums)
        if not fixed:
            m = _call_item(_valid_rows, valid, has_mask, N) * S
            for c in range(G):
                proj[c] = sums[3, c] / m
                mdx[c] = sums[2, c] / m if use_mean else 0.0
    mh, ml, r = _call_item(_xhat_factors, x2, mean_used, rstd1, S)
    w = _call_item(_per_position, w1, S)
    proj_x, mdx_x = (
        _call_item(_per_position, proj.astype(dx2.dtype), S),
        _call_item(_per_position, mdx.astype(dx2.dtype), S),
    )
    for i in prange(n_chunks):
        scratch = np.empty(min(P, STREAM_CHUNK_BYTES // dx2.itemsize) if stream else 0, dtype=dx2.dtype)
        _call_item(
            _column_dx,
            dy2, x2, dx2, valid, has_mask, mh, ml, r, w, proj_x, mdx_x, fixed, i * per, min(N, (i + 1) * per), scratch,
            stream,
        )  # fmt: skip
        if stream:
            _store_fence()


# ---------------------------------------------------------------------------
# the kernels of the blocks (each compiled serial and parallel, see _compile)
#
# Rows (S == 1, no mask, statistics of their own: LayerNorm, RMSNorm, and the blocks that _as_rows takes as
# rows) and the other blocks have kernels of their own, though one kernel could branch between their items:
# a kernel compiles every item it calls, and the first float32 LayerNorm forward and backward (rows of 768
# values, serial) compiled in 5.5-5.8 s instead of 13.9 with the blocks' items left out (through the Tensor API,
# (4096, 768), in a fresh process: 11.2-12.2 s instead of 26.7).


@numba.njit(inline="always")
def _work_items(groups, reduce_batch):
    """(items, groups per item) of a forward: a channel each (reduce_batch), else runs of consecutive (n, g)
    blocks in memory order, at most _TARGET_ITEMS of them.

    (With _TARGET_ITEMS blocks or fewer each item holds one, which ``_forward_groups`` cannot pair. Items of two
    blocks there took the forward from cold caches on 2 threads (``benchmarks/compare_kernels.py --cold
    --floor``) of GroupNorm 8x64x56x56 with 8 groups 0.93-0.99 of the time, of 16x64x56x56 with 4 groups 0.90
    (float64 0.99), but of InstanceNorm 8x8x56x56 1.04-1.15; items of an even number of blocks always took
    InstanceNorm 33x64x56x56, then in 63 items, 1.02-1.03. Not taken.)"""
    items = groups if reduce_batch else min(groups, _TARGET_ITEMS)
    return items, (groups + items - 1) // max(items, 1)


@numba.njit(inline="always")
def _chunk(c, N, n_chunks):
    """(n_first, n_last) of row chunk c of the N rows (``_n_chunks``)."""
    per_chunk = (N + n_chunks - 1) // n_chunks
    return c * per_chunk, min(N, (c + 1) * per_chunk)


def _forward_rows_kernel(x, w2, b2, has_b, eps, centered, mean, var, y, by_pieces, stream):
    """The rows' forward of x (N * G, L), into y, mean and var (N * G): work items of whole rows (``_forward_rows``),
    or, ``by_pieces``, of pieces of rows (``_row_pieces``): each piece's sum and M2 (``_piece_moments``), merged per
    row in piece order (``_merged_pieces``), then runs of consecutive pieces normalized (``_forward_rows``,
    by_pieces). A whole row takes its statistics from the same pieces in the same order: the same bits either way.

    Why: a row of ROW_PIECES_MIN_BYTES (1 MiB) or more had its two passes for the statistics and its normalize
    pass each read it from memory, and a row went on one thread, so that one long row ran on one thread only.
    Pieces re-read their second pass from L1: x comes from memory twice. ``benchmarks/compare_kernels.py HEAD
    --cold --floor`` (2 threads, the Intel Emerald Rapids VM, L2 2 MiB a core), the forward of float32 rows: 1 of
    2^23 values (by pieces) 0.49 of the time, 3 of 2^20 (by pieces) 0.76, 2 of 2^22 0.86, 4 of 2^21 0.87, 16 of
    2^19 0.92, 5 of 2^18 (rows of 1 MiB) 1.01, 64 of 2^17 (512 KiB, whole as before) 1.01; float64 0.48, 0.84,
    0.88, 0.85, 0.92; hot, float32 0.50, 0.92, 0.97, 0.94, 0.98, 1.02, 1.00; shorter rows 0.96-1.03 (twin
    0.97-1.03). Pieces for rows of 64 KiB-1 MiB took 1.03-1.07 of the time hot (in L2 the third pass cost
    little): the threshold. The price, in compile time: this kernel's two compiles for float32 12.9 s against 9.6
    (one process), a first float32 LayerNorm forward+backward on an empty cache 27.8 s against 23.0
    (``benchmarks/compile_time.py HEAD --what layer_norm --rounds 3``). The pieces normalized by an item and in a
    prange loop of their own, rather than by the rows' item in its work items, had taken 17.5 s and 30.3 s."""
    rows, L = x.shape
    units = rows
    if by_pieces:
        pieces, piece = _row_pieces(L, x.itemsize)
        moments = np.empty((rows, pieces, 2))
        for i in prange(rows * pieces):
            q, p = i // pieces, i % pieces
            moments[q, p, 0], moments[q, p, 1] = _piece_moments(x[q], p, centered)
        for q in range(rows):
            t, m2 = _merged_pieces(moments[q], L, piece)
            mean[q], var[q] = t / L, m2 / L
        units = rows * pieces
    items, per_item = _work_items(units, False)
    for i in prange(items):
        first = i * per_item
        last = min(units, first + per_item)
        scratch = np.empty(_scratch_len(L, 1, True, y.itemsize) if stream else 0, dtype=y.dtype)
        _call_item(
            _forward_rows, x, w2, b2, has_b, eps, centered, mean, var, y, by_pieces, first, last, scratch, stream
        )
        if stream:
            _store_fence()


def _forward_groups_kernel(
    x3, w2, b2, has_b, eps, centered, reduce_batch, mask2, has_mask, stats_given, mean2, var2, y3, K, S, piece,
    stream,
):  # fmt: skip
    N, G, L = x3.shape
    # (No ``i if reduce_batch else ...`` below: prange's index is unsigned, and unified with a signed
    # integer it becomes a float64, which compiled a float64 copy of each item function.)
    groups = G if reduce_batch else N * G
    items, per_item = _work_items(groups, reduce_batch)
    for i in prange(items):
        first = i * per_item
        last = min(groups, first + per_item)
        scratch = np.empty(_scratch_len(L, S, False, y3.itemsize) if stream else 0, dtype=y3.dtype)
        _call_item(
            _forward_groups,
            x3, w2, b2, has_b, eps, centered, reduce_batch, mask2, has_mask, stats_given, mean2, var2, y3, K, S,
            piece, first, last, scratch, stream,
        )  # fmt: skip
        if stream:
            _store_fence()


@numba.njit(inline="always")
def _row_blocks(G, n_chunks):
    """(blocks, groups per block) of the rows' backward, whose work items are (chunk of rows n, block of groups g)
    pairs, each block's partial sums of a chunk the work of one item: the blocks as many groups as leave about
    _TARGET_ITEMS items, all of them when there are that many chunks; rows then go in memory order (``_n_chunks``)."""
    g_blocks = min(G, (_TARGET_ITEMS + n_chunks - 1) // n_chunks)
    return g_blocks, (G + g_blocks - 1) // g_blocks


@numba.njit(inline="always")
def _row_item(i, N, G, n_chunks, g_blocks, per_block, pdw, pdb):
    """Work item i of the rows' backward (``_row_blocks``): (chunk, n_first, n_last, g_first, g_last), its partial
    rows of dweight/dbias zeroed."""
    c = i // g_blocks
    g_first = (i % g_blocks) * per_block
    g_last = min(G, g_first + per_block)
    pdw[c, g_first:g_last] = 0.0
    pdb[c, g_first:g_last] = 0.0
    n_first, n_last = _chunk(c, N, n_chunks)
    return c, n_first, n_last, g_first, g_last


@_item
def _sum_chunks(pdw, pdb):
    """pdw[0] and pdb[0] = the sums of the chunks' partial rows pdw[c] and pdb[c] (pdw is (n_chunks, G, K)), added in
    chunk order, (pdw[0] + pdw[1]) + pdw[2] ...: the same bits on any number of threads.

    In the kernel, after its parallel loop, rather than by NumPy after the call (``p.sum(axis=0)`` on each, the same
    additions and the same bits): NumPy's two reductions took 90 microseconds of a hot float32 LayerNorm backward
    of 512x4096 (1 MiB of partial rows), and from cold caches about 110 even on a few columns, their instructions
    fetched from memory too. ``benchmarks/compare_kernels.py HEAD --floor`` (the Intel VM, float32, 2 threads, hot)
    took the backward of LayerNorm 256x1024 0.95 of the time, 1024x1024 0.96, 512x4096, 2048x2048 and 4096x768
    0.98-0.99 (twin 0.99-1.01; without dweight/dbias, which has no partial rows, 1.00); from cold caches (float32
    and float64 views of every norm) 0.94-1.02 (twin 0.96-1.03), but the float64 GroupNorm 32x8x8x3136 1.05-1.09
    in two runs, where the two copies of the new code read 1.01-1.05 apart (its partial rows are 4 KiB)."""
    pdw, pdb = _borrowed(pdw), _borrowed(pdb)
    total_w, total_b = pdw[0], pdb[0]
    for c in range(1, pdw.shape[0]):
        pw, pb = pdw[c], pdb[c]
        for g in range(pw.shape[0]):
            for k in range(pw.shape[1]):
                total_w[g, k] += pw[g, k]
                total_b[g, k] += pb[g, k]


def _backward_rows_kernel(dy3, x3, mean2, rstd2, w2, use_mean, fixed, dx3, affine, pdw, pdb, terms_all, stream):
    """The rows' backward; item i's term rows are terms_all[i] (the caller's, from the buffer pool: see
    ``_backward_by_groups``), zeroed here."""
    N, G, L = x3.shape
    n_chunks = pdw.shape[0]
    g_blocks, per_block = _row_blocks(G, n_chunks)
    for i in prange(n_chunks * g_blocks):
        c, n_first, n_last, g_first, g_last = _row_item(i, N, G, n_chunks, g_blocks, per_block, pdw, pdb)
        scratch = np.empty(_scratch_len(L, 1, True, dx3.itemsize) if stream else 0, dtype=dx3.dtype)
        terms = terms_all[i, : max(0, g_last - g_first)]
        terms[:] = 0.0
        # LayerNorm and RMSNorm have one group, passed as the constants 0 and 1 (and one_group), for which numba
        # compiles the item again, its loop over the groups gone. With that loop (of one group) inside the loop
        # over rows, the float32 backward of rows of 32 values took 1.4x the time on one thread, hot (44-46 ns a
        # row against 31-33; rows of 128 values 85-88 against 73-79; several compiles of each in one process, the
        # same bits), and of (65536, 128) from cold caches on 2 threads 1.13-1.20x (``benchmarks/compare_kernels.py
        # --cold --floor``). In the one compile: the group's slices taken once, before the loop over rows, 37-38
        # ns; one loop over (row, group) pairs, 40; a loop over rows alone where there is one group, beside the
        # loop over both (the row's work an inlined function called in each), 35-36 and 77-78. The price of the
        # second compile (``benchmarks/compile_time.py``): that of every kernel, 92.5 s of CPU time in one
        # process, took 101; a first float32 LayerNorm forward+backward on an empty cache 19.1 s instead of 12.9
        # (once: numba caches the kernel). (The one-group rows in a kernel of their own, which a LayerNorm would
        # compile alone: its first call 12.6 s against 13.1, but every kernel in two processes 59.6 s against 54.2,
        # at the 60 s that issue 4 allows: not taken.)
        if G == 1:
            _call_item(
                _backward_rows,
                dy3, x3, mean2, rstd2, w2, use_mean, fixed, dx3, affine, pdw[c], pdb[c], terms, n_first, n_last,
                0, 1, True, scratch, stream,
            )  # fmt: skip
        else:
            _call_item(
                _backward_rows,
                dy3, x3, mean2, rstd2, w2, use_mean, fixed, dx3, affine, pdw[c], pdb[c], terms, n_first, n_last,
                g_first, g_last, False, scratch, stream,
            )  # fmt: skip
        if stream:
            _store_fence()
    _call_item(_sum_chunks, pdw, pdb)


def _backward_rows_lean_kernel(dy3, x3, mean2, rstd2, w2, use_mean, fixed, dx3, affine, pdw, pdb, stream):
    """``_backward_rows_kernel`` for the rows of ``_backward_rows_lean``, in a kernel of its own so that a first
    LayerNorm, whose rows never go there, does not compile that loop too.

    Its price (``benchmarks/compile_time.py``, the AMD VM of CPU family 26, medians of 3 rounds): the cold compile
    of every kernel took 52.5 s instead of 48.4 (rounds of 49.4-52.8 against 46.2-50.8), against the 60 s that
    issue 4 allows; a first LayerNorm forward and backward 14.7 s instead of 15.8, its rows' loop now without the
    case of one weight. (On the AMD Zen 4 VM, whose compiles were slower, an earlier session measured the same loop
    inside ``_backward_rows``, where it took every kernel from 55.2 s to 58.3, and as an item of its own there, from
    58.0 to 60.8, and left it out.)"""
    N, G, L = x3.shape
    n_chunks = pdw.shape[0]
    g_blocks, per_block = _row_blocks(G, n_chunks)
    # (decided for the call, from its shape: the rows' sums then add in one order whatever the items, see
    # _backward_rows_lean)
    blocks = _short_backward_blocks(L, x3.itemsize, stream) and per_block >= SHORT_ROW_VALUES
    for i in prange(n_chunks * g_blocks):
        c, n_first, n_last, g_first, g_last = _row_item(i, N, G, n_chunks, g_blocks, per_block, pdw, pdb)
        scratch = np.empty(SHORT_ROW_VALUES * L if stream and blocks else 0, dtype=dx3.dtype)
        _call_item(
            _backward_rows_lean, dy3, x3, mean2, rstd2, w2, use_mean, fixed, dx3, affine, pdw[c], pdb[c], n_first,
            n_last, g_first, g_last, blocks, scratch, stream and blocks,
        )  # fmt: skip
        if stream and blocks:
            _store_fence()
    _call_item(_sum_chunks, pdw, pdb)


def _backward_few_rows_kernel(dy3, x3, mean2, rstd2, w2, use_mean, fixed, dx3, affine, dw, db, sums, piece, stream):
    """The backward of rows of one group (LayerNorm's, RMSNorm's) too few to share out in chunks of rows
    (``_n_chunks``: one chunk), with dweight/dbias, in pieces of ``piece`` columns: first each row's sums A and B
    piece by piece (work items (row, piece), into ``sums`` (N, pieces, 2), the caller's), added up per row in piece
    order; then runs of consecutive pieces (work items) through every row, each piece with its own dweight and
    dbias columns dw, db (in x's dtype, the caller's; a piece's sums in float64 until they are written): no partial
    rows to add, and the same bits on any number of threads.

    Why: in one chunk the rows' loop runs on one thread, and a long row's dweight/dbias terms go through term rows
    and float64 partial rows as long as the row, from memory. Pieces read x and dy twice from where they are (a
    row of the rows' loop comes back from L2 for its dx when it fits there), but on every thread, their terms in
    L1. ``benchmarks/compare_kernels.py HEAD --rounds 10`` (2 threads, hot, the AMD Zen 4 VM, one noisy run)
    took the float32 backward of 1 row of 2^23 values 0.44 of the time (67 ms against 30), 16 rows of 2^19 0.87,
    32 of 200704 0.74, 48 of 65536 0.86, 8 of 65536 0.76, 63 of 16384 0.73; float64 16 rows of 2^18 0.83, 48 of
    2^15 1.02; rows of up to 4096 values in the cache (serial) 0.80-1.02. Without dweight/dbias (this kernel then
    taking them too), float32 0.80-1.04 but float64 1.25-1.27: those stay in the rows' loop.
    Pieces of 16 KiB against 4 KiB: 0.90-0.92 of the time (one row of 2^23 float32 values, 16 rows of 2^19),
    32 KiB 0.97-1.00 of 16.
    dweight/dbias are written in x's dtype, each piece's float64 sums rounded as its last block of terms is folded
    in (``_fold_terms_to``), rather than in float64 and cast after the kernel: for float32 data that wrote,
    read back and cast 16 bytes a column where 8 are written now. ``compare_kernels.py HEAD --floor`` (the same
    VM, hot): float32 one row of 2^23 values 0.57 of the time (26.3 ms against 15.0), 16 rows of 2^19 0.92, 8 of
    65536 0.86, 48 of 65536 0.93, 63 of 16384 0.91, 32 of 4096 0.89, 2 of 768 0.87 (copies of the same code
    1.00-1.04); float64 (then a copy, a pass over the piece, where the old code folded into dw itself: a row of
    2^22 1.07-1.16, and so folded in as it is written, 1.03) 0.98-1.03.

    Without dweight/dbias, one row alone of PARALLEL_MIN_ELEMENTS values or more comes here too (``affine`` False),
    where the rows' loop ran it on one thread: its pieces make their terms in L1 all the same and fold none (with
    the flag choosing the loops instead, the pieces with dweight/dbias took 1.05-1.11x the time). ``benchmarks/
    compare_kernels.py HEAD --floor`` (2 threads, the Intel VM): float32 one row of 2^23 values 0.76 of the time
    hot, 0.65 cold, of 2^20 0.83; float64 2^22 0.70, 2^19 0.74; the rows with dweight/dbias 0.99-1.02 (copies of
    the same code 0.97-1.03). Shorter rows stay in the rows' loop: in pieces (serial), one row of 2^18 float32
    values took 1.42x the time, of 2^14 1.18x.

    Its price, a kernel as big to compile as the rows' (one dtype's two compiles 18.5 s against 20.9, the AMD
    Zen 4 VM): the cold compile of every kernel took 104.5 s instead of 87.7 there (``benchmarks/compile_time.py
    HEAD --rounds 1``), against the 60 s that issue 4 allows and that VM already missed."""
    N, _, L = x3.shape
    pieces = sums.shape[1]
    proj = np.zeros(N)
    mdx = np.zeros(N)
    if not fixed:
        for i in prange(N * pieces):
            n, q = i // pieces, i % pieces
            j0 = q * piece
            j1 = min(L, j0 + piece)
            mu = mean2[n, 0] if use_mean else 0.0
            sums[n, q] = _row_dx_sums(dy3[n, 0, j0:j1], x3[n, 0, j0:j1], w2[0, j0:j1], mu, rstd2[n, 0])
        for n in range(N):
            A = 0.0
            B = 0.0
            for p in range(pieces):
                A += sums[n, p, 0]
                B += sums[n, p, 1]
            proj[n] = B / L
            mdx[n] = A / L if use_mean else 0.0
    items, per_item = _work_items(pieces, False)
    for i in prange(items):
        first = i * per_item
        last = min(pieces, first + per_item)
        scratch = np.empty(_scratch_len(piece, 1, True, dx3.itemsize) if stream else 0, dtype=dx3.dtype)
        _call_item(
            _backward_row_pieces, dy3, x3, mean2, rstd2, w2, use_mean, fixed, dx3, proj, mdx, piece, first, last,
            affine, dw, db, scratch, stream,
        )  # fmt: skip
        if stream:
            _store_fence()


def _backward_groups_kernel(
    dy3, x3, mean2, rstd2, w2, use_mean, reduce_batch, mask2, has_mask, fixed, dx3, affine, pdw, pdb, K, S, stream
):
    N, G, L = x3.shape
    # work items as the forward's: a channel each (reduce_batch; one chunk of partial rows, a row per channel), else
    # runs of consecutive (n, g) blocks in memory order, each with partial rows of its own for all G groups
    groups = G if reduce_batch else N * G
    items = G if reduce_batch else pdw.shape[0]
    per = (groups + items - 1) // max(items, 1)
    for i in prange(items):
        first = i * per
        last = min(groups, first + per)
        # (no ``0 if reduce_batch else i``: prange's index is unsigned, see _forward_groups_kernel)
        if reduce_batch:
            pw2, pb2 = pdw[0], pdb[0]
            pw2[i] = 0.0
            pb2[i] = 0.0
        else:
            pw2, pb2 = pdw[i], pdb[i]
            pw2[:] = 0.0
            pb2[:] = 0.0
        scratch = np.empty(_scratch_len(L, S, False, dx3.itemsize) if stream else 0, dtype=dx3.dtype)
        _call_item(
            _backward_groups,
            dy3, x3, mean2, rstd2, w2, use_mean, reduce_batch, mask2, has_mask, fixed, dx3, affine, pw2, pb2, K, S,
            first, last, scratch, stream,
        )  # fmt: skip
        if stream:
            _store_fence()
    _call_item(_sum_chunks, pdw, pdb)


def _rstd_kernel(var, eps, r):
    for i in prange(var.shape[0]):
        r[i] = 1.0 / math.sqrt(var[i] + eps)


def _erf_kernel(x, y):
    for i in prange(x.shape[0]):
        # in x's dtype, as PyTorch computes GELU (for float32 numba calls erff: within 1 ULP of the
        # reference's float64 erf rounded to float32, and much faster than a float64 loop)
        y[i] = math.erf(x[i])


def _compile(py_func: Callable, parallel: bool) -> Callable:
    """``py_func`` jitted; the serial and parallel versions get distinct names, because numba's
    cache keys an entry by the function's name and bytecode, not by its compile flags.

    Before the items were called by symbol (``_call_item``), the serial compiles were 11 s of the cold compile of
    every kernel (78-91 s, ``compile_every_kernel``; 81-88 s since rows and blocks have kernels of their own, 1.05x
    the code before, ``benchmarks/compile_time.py``): numba linked the item functions into each kernel and
    generated their code again there, and again in the parallel kernel's prange body and in the two wrappers numba
    builds around it (of one such compile, 84 s, 53
    in LLVM: 8 in the prange bodies, 7 in each kind of wrapper, 19 in the kernels, 9 in the items' own
    compiles). One parallel compile run on one thread for small inputs instead (``numba.set_num_threads(1)``
    around the call, and back) took that to 70 s, but every small call 1.06-1.24 of the time (a float32
    LayerNorm forward of (64, 128) 31 against 36 microseconds, its backward 64 against 74; GroupNorm's and
    BatchNorm's alike, rows of 512 values 1.06-1.09; ``benchmarks/compare_kernels.py``, hot), and with numba's
    workqueue threading layer (where it finds no OpenMP or TBB runtime) a one-thread launch still wakes the
    pool, about 60 microseconds. Not taken: a one-time cost traded for one paid on every small call. (Set
    inside the kernel, the thread count makes numba refuse to cache it: the setter is a pointer into the
    threading layer.)"""
    name = f"{py_func.__name__}_{'parallel' if parallel else 'serial'}"
    clone = types.FunctionType(py_func.__code__, py_func.__globals__, name, py_func.__defaults__, py_func.__closure__)
    clone.__qualname__ = name
    return _jit_cached(clone, parallel=parallel)


_KERNELS = {
    name: (_compile(f, False), _compile(f, True))
    for name, f in (
        ("rows forward", _forward_rows_kernel),
        ("groups forward", _forward_groups_kernel),
        ("rows backward", _backward_rows_kernel),
        ("lean rows backward", _backward_rows_lean_kernel),
        ("few rows backward", _backward_few_rows_kernel),
        ("groups backward", _backward_groups_kernel),
        ("columns forward", _columns_forward_kernel),
        ("columns backward", _columns_backward_kernel),
        ("rstd", _rstd_kernel),
        ("erf", _erf_kernel),
    )
}


def _kernel(name: str, size: int, parallel_min: int | None = None) -> Callable:
    """Kernel ``name``'s serial compile for inputs of fewer than ``parallel_min`` elements (PARALLEL_MIN_ELEMENTS
    unless given), else its parallel one, launched as numba's threading layer allows (``_parallel_launch``)."""
    serial, parallel = _KERNELS[name]
    if size < (PARALLEL_MIN_ELEMENTS if parallel_min is None else parallel_min):
        return serial
    return _parallel_launch(serial, parallel)


# numba runs a parallel kernel on the threading layer it picks at the first launch: OpenMP ("omp"), TBB, or, where it
# finds neither runtime, its own "workqueue". Two of them end the process where a program may not expect it:
# * GNU's OpenMP is not fork-safe: a process fork()ed after a parallel launch (multiprocessing's default start on
#   Linux) is terminated at its own first one ("fork() called from a process already using GNU OpenMP"). Such a
#   child runs the serial kernels: the same loops, the same bits, on one thread (PyTorch's DataLoader sets its
#   worker processes to one thread too, torch.utils.data._utils.worker).
# * The workqueue layer aborts the process when two threads launch at once. Its launches, and every launch before
#   the layer is known, take a lock: a parallel kernel uses every core anyway.
_launch_lock = threading.Lock()
_forked_after_gnu_openmp = False


def threading_layer() -> str | None:
    """The threading layer numba's parallel kernels run on: "tbb", "workqueue", or "omp" with its vendor ("omp
    (GNU)", "omp (Intel)"); None before the first parallel launch picks it."""
    try:
        layer = numba.threading_layer()
    except ValueError:
        return None
    if layer == "omp":
        from numba.np.ufunc import omppool

        layer = f"omp ({omppool.openmp_vendor})"
    return layer


def _after_fork_in_child() -> None:
    """In a fork()ed child: no parallel launch after GNU OpenMP's, and a lock of its own (the parent's may have
    been held by another thread, which the child does not have)."""
    global _forked_after_gnu_openmp, _launch_lock
    _forked_after_gnu_openmp = _forked_after_gnu_openmp or threading_layer() == "omp (GNU)"
    _launch_lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # (POSIX only: Windows has no fork)
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _parallel_launch(serial: Callable, parallel: Callable) -> Callable:
    """How a parallel-sized call runs (see above): the serial kernel in a child forked after GNU OpenMP started, the
    parallel one under the lock on the workqueue layer (or before the first launch), else the parallel one."""
    if _forked_after_gnu_openmp:
        return serial
    if threading_layer() in (None, "workqueue"):

        def locked(*args: object) -> object:
            with _launch_lock:
                return parallel(*args)

        return locked
    return parallel


# ---------------------------------------------------------------------------
# the public functions: the reference's signatures and return conventions


def _for_kernels(x: np.ndarray, *others: np.ndarray | None) -> bool:
    """Whether the jitted kernels take this call: float32/float64 data with something in it, and no complex
    argument (a complex step); the reference takes the rest (integers it refuses, float16, empty arrays)."""
    return x.dtype in _KERNEL_DTYPES and x.size > 0 and not any(reference.is_complex(a) for a in others)


def _mean_fits(dtype: np.dtype, mean: np.ndarray) -> bool:
    """Whether the kernels can carry every finite mean as a pair of ``dtype`` values (``_split``): not a
    given float64 mean beyond float32's range for float32 data, whose float32 half would be inf (then
    (x - inf) - (-inf) is NaN where the reference has a finite y). The mean of float32 data always fits."""
    if dtype != np.float32:
        return True
    m = np.asarray(mean, dtype=np.float64)
    # the common case in two reductions and no temporary (NaN compares False: a NaN mean fits), the ufuncs'
    # own (``m.max()`` goes through a Python wrapper: 4.1 us against 2.3 for the pair on a small mean)
    high, low = np.maximum.reduce(m, axis=None, initial=0.0), np.minimum.reduce(m, axis=None, initial=0.0)
    if not (high > _FLOAT32_MAX or low < -_FLOAT32_MAX):
        return True
    with np.errstate(over="ignore"):
        return not np.any(np.isinf(m.astype(np.float32)) & np.isfinite(m))


def _affine2(a: np.ndarray | None, G: int, K: int, fill: float, dtype: np.dtype) -> np.ndarray:
    """weight or bias as a contiguous (G, K) array: in the data's dtype when that holds it exactly (half
    the cache footprint of float64 for float32 data: it stays in L1 beside the streamed rows), else float64.
    Either way the kernels widen it to float64 exactly, as the reference does. A missing one is ``fill`` in an
    array of the buffer pool (as long as a row: see ``_backward_by_groups``)."""
    if a is None:
        stand_in = POOL.empty((G, K), dtype)
        stand_in.fill(fill)
        return stand_in
    return np.ascontiguousarray(a, dtype=dtype if np.can_cast(a.dtype, dtype, "safe") else np.float64)


def _mask2(mask: np.ndarray | None, N: int) -> np.ndarray:
    # no mask: an (N, 0) stand-in, so that mask2[n] is still a valid (empty) row
    if mask is None:
        return np.empty((N, 0), dtype=np.bool_)
    return np.ascontiguousarray(mask)


def _stat2(stat: np.ndarray, G: int) -> np.ndarray:
    """A statistic of shape (G,) (``reduce_batch``) or (N, G), as a float64 (1, G) or (N, G) array."""
    return np.ascontiguousarray(stat, dtype=np.float64).reshape(-1, G)


def _out_buffer(
    out: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype, reads: tuple[np.ndarray | None, ...]
) -> np.ndarray:
    """Where the kernel writes: ``out`` itself when it can (C-contiguous, of the result's dtype, and not
    overlapping what the kernel reads, unless it is that very array: each block is read before it is
    written), else a C-contiguous array from the pool, copied into ``out`` at the end."""
    if (
        out is not None
        and out.dtype == dtype
        and out.flags.c_contiguous
        and not any(_overlaps(out, a) for a in reads if a is not None)
    ):
        return out
    return POOL.empty(shape, dtype)


def _overlaps(out: np.ndarray, a: np.ndarray) -> bool:
    # (the cheap bounds test first: ``.ctypes.data`` takes 1.5 us, ``np.may_share_memory`` 0.2)
    if not np.may_share_memory(out, a):
        return False
    return (out.ctypes.data, out.shape, out.strides, out.dtype) != (a.ctypes.data, a.shape, a.strides, a.dtype)


def _finish(buf: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is None or buf is out:
        return buf
    out[...] = buf
    return out


def _streams(buf: np.ndarray, out: np.ndarray | None, block: int, short_aligned_blocks: bool) -> bool:
    """Whether the kernel writing ``buf`` in contiguous blocks of ``block`` values should stream them
    (``_stream_copy``): only into the caller's ``out``, or a buffer of the pool that is returned in its
    place (not a temporary copied into an unusable ``out`` right after), big, in long blocks, or with
    ``short_aligned_blocks`` (the backward) in shorter blocks made of whole cache lines.

    Only an output too big to stay in the cache gains, and what that means depends on the machine:
    ``STREAMING_STORE_MIN_BYTES`` is a quarter of the L3 (where x, y, dy and dx of a forward+backward
    no longer fit in it together), and at most 24 MiB, because a VM may report a whole socket's L3
    (260 MiB on our Intel VM), of which it holds an unknown share.

    On the 2-core AMD EPYC (Zen 4) VM, 32 MiB of L3: a threshold of 8 MiB; streaming into ``out`` took,
    of the time with ordinary stores (2 threads, hot and cold, float32 unless said), LayerNorm 512x4096
    (8 MiB) forward 0.91-0.92, backward 0.89-0.90; 1024x4096 (16 MiB) 0.80-0.92 and 0.88-0.91; 4096x768
    (12 MiB) 0.92-0.99 and 0.83-0.87; BatchNorm 16x64x56x56 (12 MiB) 0.86-0.90 and 0.87-0.88;
    GroupNorm 16x64x56x56 0.97-1.10 and 1.01; float64 LayerNorm 512x4096 (16 MiB) 0.90-0.95 and 0.95-0.96.
    At 4 MiB (float32 LayerNorm 256x4096) it still gained a little (0.89-0.93, backward 0.98-0.99).
    On the AMD VM of CPU family 26 (Zen 5, 32 MiB of L3, the same threshold), from cold caches, into aligned
    ``out``: float32 InstanceNorm, BatchNorm and GroupNorm 32x64x56x56 forward 0.84-0.86, backward 0.85-0.91,
    LayerNorm 8192x1024 0.86 and 0.90 (one process, the threshold switched call by call).

    On the 2-core Intel (Emerald Rapids) VM, 260 MiB of L3 reported: a threshold of 24 MiB, the
    smallest size at which streaming gained there. Streaming into ``out`` took, of the time with
    ordinary stores: float32 BatchNorm/InstanceNorm/GroupNorm 32x64x56x56 (24.5 MiB) forward
    0.77-0.81, backward 0.91-1.05; float64 LayerNorm 4096x768 (24 MiB) 0.79 and 0.92; but LayerNorm
    512x4096 at 16 MiB (float64) 0.98 and 1.17, and at 8 MiB (float32) 1.04 and 1.16. From cold
    caches (``compare_kernels.py --cold``, two runs) streaming the 16 MiB float64 outputs took the
    forward 0.85-0.86 and the backward 0.92 of the time, but hot 1.15-1.31 and 1.04-1.12: at that size
    it depends on whether the arrays are still in the cache, and the threshold stays above it.

    A block that does not start and end on a cache line writes its first and last line with ordinary
    stores, and a line shared by two blocks is written by both. ``benchmarks/streaming_stores.py``
    (float32, 2 threads, two runs): into ``out`` 16 bytes past a line (where ``np.empty`` puts a large
    array), streaming made rows of 64-256 values 1.2-2.2x as slow; into a 64-byte aligned ``out`` (as
    the pool's buffers are), the backward of rows of 128-256 values took 0.83-0.88 of the time (64
    values: 0.94-1.13), but the forward, which does less per value, 1.14-1.32; rows of 1024 values:
    forward 0.76-0.83, backward 0.80-0.83 (aligned), 0.86-0.94 and 0.96 (16 bytes past a line).

    Fresh memory loses too: the OS zeroes a new page on first touch, which leaves it in the cache,
    and streaming past it then cost 1.3-1.6x (LayerNorm 8192x1024 forward, float32 and float64).
    A buffer from a plain ``np.empty`` is such memory on every call (glibc unmaps it on free); one
    from the pool is only on its first use, and is streamed into (``benchmarks/allocation.py``:
    float32 LayerNorm 8192x1024 fwd+bwd allocating from the pool, 8.4 ms with ordinary stores, 7.7
    streamed, 7.8 into ``out=``)."""
    if buf.nbytes < STREAMING_STORE_MIN_BYTES or not (buf is out or (out is None and POOL.owns(buf))):
        return False
    block_bytes = block * buf.itemsize
    if block_bytes >= STREAMING_STORE_MIN_BLOCK_BYTES:
        return True
    # (the address last: ``.ctypes.data`` takes 1.5 us, as long as a small call's kernel)
    whole_lines = block_bytes % _STREAM_BYTES == 0 and buf.ctypes.data % _STREAM_BYTES == 0
    return short_aligned_blocks and whole_lines and block_bytes >= STREAMING_STORE_MIN_ALIGNED_BLOCK_BYTES


def _by_columns(shape: tuple[int, ...], itemsize: int, reduce_batch: bool, mask: np.ndarray | None) -> bool:
    """Whether a call goes to the columns kernels: BatchNorm (``reduce_batch``, one run per block) in runs
    shorter than COLUMNS_MAX_RUN_BYTES, without a mask or with one that marks whole rows (runs of one value)."""
    _, _, K, S = shape
    return reduce_batch and (mask is None or S == 1) and K == 1 and S * itemsize < COLUMNS_MAX_RUN_BYTES


def _as_rows(
    shape: tuple[int, ...], itemsize: int, reduce_batch: bool, mask: np.ndarray | None, backward: bool, dweight: bool
) -> bool:
    """Whether the kernels see blocks of K runs of S > 1 values as rows of L = K*S values (K = L, S = 1), with the
    weight and bias repeated over each run's positions: blocks with statistics of their own, without a mask, in
    runs of at most ROWS_MAX_RUN_BYTES_FORWARD (forward; ROWS_MAX_RUN_BYTES_FORWARD_ONE_RUN for blocks of one
    run, InstanceNorm's), ROWS_MAX_RUN_BYTES_BACKWARD (backward with dweight and dbias) or
    ROWS_MAX_RUN_BYTES_BACKWARD_NO_AFFINE_GRADS bytes (without them; ROWS_MAX_RUN_BYTES_BACKWARD_ONE_RUN for
    blocks of one run, whose terms are one per row, see ``_backward_rows``), the backward's limits by x's size (see
    the end): InstanceNorm and GroupNorm on small maps. The
    rows' loops (``_forward_rows``, ``_backward_rows``) do the blocks' arithmetic with a weight per value, in
    less time per block than the blocks' loops, which pay for each run (a normalize loop per run in the
    forward, a sum call per run in the backward). A row's dweight and dbias terms are then summed per position
    over blocks of rows in x's dtype (``_fold_terms``, with its float32 bound), and the positions of a run added
    after; but for blocks of one run, whose weight is one value per row, per row in float64 (``_backward_rows``).

    Where the lines lie, measured against the blocks' loops in one process (the same compiled code, the
    routing alternated call by call; 2 threads, cold caches, out= buffers, the AMD VM; K = 1, 4, 16 with
    G = 64, 32, 8; x of 16 MiB and of 2 MiB), rows/blocks:
    - runs of 16-32 bytes: forward 0.39-0.84, backward 0.18-0.91, without dweight/dbias 0.11-0.69;
    - 64 bytes (float32 S = 16, float64 S = 8): forward 0.77-1.06, backward 0.26-1.05, without 0.19-0.83;
    - 128 bytes: forward 0.82-1.21 (blocks of one run 0.82-0.92, of 4 and 16 runs 0.93-1.21), backward
      0.38-1.07, without 0.24-0.85;
    - 256 bytes: forward 0.95-1.29, backward 0.50-1.31, without 0.34-0.95;
    - 512 bytes: backward 0.74-1.33, without 0.56-1.03; 1024 bytes: without 0.71-1.16.
    A block of float32 InstanceNorm on 4x4 maps (8192, 64, 1, 16): forward 0.77, backward 0.38, without
    dweight/dbias 0.31 of the time; GroupNorm (1024, 32, 16, 4): 0.45, 0.30, 0.20.
    Blocks of one run (InstanceNorm's), once their terms went per row, against the blocks' loops
    (``compare_kernels.py --cold``, the AMD Zen 4 VM; backward, backward without dweight/dbias): runs of 256
    bytes, float32 (1024, 64, 1, 64) 0.53 with them, (512, 64, 1, 64) 0.60, float64 (2048, 64, 1, 32) 0.29, (512,
    64, 1, 32) 0.53; of 512 bytes float32 0.69 and 0.57, float64 0.62 and 0.54; of 1 KiB 0.71-0.81; of 2 KiB
    0.71-0.88; of 4 KiB 0.93-1.05; on the AMD VM of CPU family 26, against the blocks then walked channel by
    channel (see ``_backward_groups``), float32 (16, 64, 1, 1024) 1.10-1.15, (32,
    32, 1, 784) 1.06-1.08 and (32, 64, 1, 3136) 1.09-1.11. Their forward as rows took runs of 256 bytes to 1 KiB
    1.14-1.46 of the time.

    Those backward limits were measured against the blocks walked channel by channel. Walked in memory order
    (``_backward_groups``), the blocks read DRAM faster, and for an x of ROWS_LARGE_X_BYTES or more (a quarter of
    the L3, 8 MiB here: x, dy and dx do not all stay there, so x comes from DRAM) the backward's limits are the
    second, lower ones. rows/blocks, the routing alternated call by call in one process (2 threads, cold caches,
    out= buffers, x of 16 MiB, the AMD VM of CPU family 26; G = 8, 32, 4 for K = 8, 2, 16, and G = 64 for K = 1):
    - several runs, with dweight/dbias: runs of 32 bytes 0.64-0.71, 64 bytes 0.82-0.88, 128 bytes 1.17-1.97;
    - without them: 64 bytes 0.50-0.59, 128 bytes 0.64-1.04, 256 bytes 1.46-1.83;
    - one run (InstanceNorm's): 256 bytes 0.84-0.89 in float32 and 1.06-1.17 in float64, 512 bytes 1.18-1.50,
      1 KiB 1.72-2.15, 2 KiB 1.65-1.80, 4 KiB 1.35-1.55.
    On one thread, the same lines. Hot, with the whole x in the L3, the rows' loops kept their lead for x of 512 KiB
    to 8 MiB: one run of 512 bytes 0.76-0.98, several runs of 128 bytes with dweight/dbias 0.70-1.03 (at 8 MiB on
    2 threads, 1.32); at 16 MiB the blocks won hot too (1.09-1.77). So a smaller x keeps the first limits, though
    from cold caches the blocks won at those sizes as well (1.11-1.26 and 1.17-1.72): such an x, if it does come
    from DRAM, pays for the choice.

    The forward's limits were measured on the AMD VM, where the row loop does not prefetch. On Intel CPUs it
    prefetches rows of up to PREFETCH_MAX_ROW_BYTES (``_rows_ahead``), which the blocks' loop does not, and there
    blocks that short go as rows whatever their runs, for an x of ROWS_PREFETCHED_MIN_X_BYTES or more.
    ``compare_kernels.py --cold`` (2 threads, the Intel VM, the routing of HEAD against this one, new/twin
    0.96-1.05), rows/blocks: GroupNorm float64 (4096, 8, 8, 16) (runs of 128 bytes, rows of 1 KiB, the
    benchmark's 4x4 maps) 0.66 of the time, (1024, 32, 2, 16) 0.76, (2048, 8, 8, 32) 0.84; float32 (2048, 8, 8,
    32) 0.64-0.66, (512, 16, 8, 32) 0.69, (1024, 8, 8, 64) 0.82-0.85; InstanceNorm float32 rows of 256 bytes to 2
    KiB 0.74-0.88, float64 of 512 bytes and 1 KiB 0.84, of 2 KiB 0.91 and 1.04. Rows longer than 2 KiB lost:
    float32 (256, 8, 8, 128) 1.12, float64 (1024, 8, 8, 64) 1.08, (256, 8, 8, 128) 1.10. Hot, x of 4-16 MiB:
    0.69-0.97 but InstanceNorm float64 rows of 2 KiB (8 MiB) 1.08 and (16 MiB) 1.00; x of 1-2 MiB, whose x and y
    stay in the two L2s: float64 InstanceNorm rows of 2 KiB 1.07-1.10, GroupNorm (64, 8, 8, 32) 1.06-1.08, (512,
    8, 8, 16) 0.80 and 1.08 in two runs, float32 0.77-1.05: hence the floor on x's size. With statistics given
    (eval mode), such blocks go to the blocks' loop as runs of one value (``norm_forward``): 0.94-1.05 of the time
    from cold caches (GroupNorm float64 (4096, 8, 8, 16) 0.94, InstanceNorm float32 (128, 64, 1, 256) 1.05)."""
    N, G, K, S = shape
    x_bytes = N * G * K * S * itemsize
    large = x_bytes >= ROWS_LARGE_X_BYTES
    prefetched = not backward and x_bytes >= ROWS_PREFETCHED_MIN_X_BYTES and K * S * itemsize <= PREFETCH_MAX_ROW_BYTES
    if not backward:
        max_run = ROWS_MAX_RUN_BYTES_FORWARD_ONE_RUN if K == 1 else ROWS_MAX_RUN_BYTES_FORWARD
    elif K == 1:
        max_run = ROWS_MAX_RUN_BYTES_BACKWARD_ONE_RUN[large]
    else:
        max_run = (ROWS_MAX_RUN_BYTES_BACKWARD if dweight else ROWS_MAX_RUN_BYTES_BACKWARD_NO_AFFINE_GRADS)[large]
    return not reduce_batch and mask is None and S > 1 and (prefetched or S * itemsize <= max_run)


def _valid_rows_of(mask: np.ndarray | None, N: int) -> np.ndarray:
    """The columns kernels' row mask: mask (N, 1) as (N,), or an empty stand-in without one."""
    return np.empty(0, dtype=np.bool_) if mask is None else np.ascontiguousarray(mask).reshape(N)


def _column_rows_stream(P: int, itemsize: int) -> bool:
    """Whether the columns kernels stream out their rows of P values where ``_streams`` says an output should
    stream: only rows shorter than the scratch row (STREAM_CHUNK_BYTES), each computed into it whole.

    Streamed, wider rows took more time than with ordinary stores, narrower ones less (cold caches, 2 threads,
    out= buffers, the AMD VM, several runs in both of its memory states; streamed against ordinary stores):
    float32 (8192, 1024), rows of 4 KiB, forward 1.05-1.10x, eval-mode forward 1.12-1.20x, backward
    1.01-1.13x; float64 (8192, 1024) 1.06-1.35x, 1.35-1.40x and 1.03-1.13x; (4096, 2048) float32 1.06-1.20x
    forward, 1.02-1.12x backward, float64 1.12x forward. Rows of 256 and 512 bytes ((65536, 64)): the backward
    0.86-0.90x, float32 and float64, the forward 0.93-1.0x; (16384, 64 * 8) float32, rows of 2 KiB, forward
    0.91-0.95x, eval 0.85-0.88x."""
    return P * itemsize < STREAM_CHUNK_BYTES


def _column_chunks(N: int) -> int:
    """How many row chunks, each with its partial row of sums, the columns kernels split the batch into: a
    function of N only (never of the thread count), at least _MIN_ROWS_PER_COLUMN_CHUNK rows each."""
    return max(1, min(_TARGET_ITEMS, N // _MIN_ROWS_PER_COLUMN_CHUNK))


def _rows(S: int, has_mask: bool, reduce_batch: bool) -> bool:
    """Whether the (n, g) blocks are rows with statistics of their own (S == 1, no mask, not BatchNorm): they take
    the rows' kernels (but a forward with given statistics, which takes the blocks' loops) and chunking."""
    return S == 1 and not has_mask and not reduce_batch


def _forward_by_pieces(rows: int, L: int, itemsize: int, size: int) -> bool:
    """Whether the rows' forward shares out pieces of rows rather than whole rows (``_forward_rows_kernel``): rows of
    ROW_PIECES_MIN_BYTES or more, on the parallel compile (``_kernel``), where whole rows would leave a thread idle
    a fifth of the time or more (the slowest thread's rows, over the mean, above 1.2): one row, or three on two
    threads, but not two, four or five. Either way the same bits: the route may depend on the thread count.
    (Pieces for 2, 5 and 6 rows on 2 threads took 0.86-1.10, 0.98-1.04 and 1.06-1.07 of the time of whole rows
    whose statistics were not yet taken by pieces; 3 rows 0.80-0.96, 7 rows 0.96-1.01: compare_kernels.py.)"""
    if size < PARALLEL_MIN_ELEMENTS or L * itemsize < ROW_PIECES_MIN_BYTES:
        return False
    threads = numba.get_num_threads()
    return -(-rows // threads) * threads > 1.2 * rows


def _moments_piece(L: int, itemsize: int) -> int:
    """How many values of each of a pair of blocks of L values the forward takes its statistics on at a time
    (``_pair_moments``): MOMENTS_PIECE for blocks of more than MOMENTS_MIN_BLOCK_BYTES, else the whole block."""
    return MOMENTS_PIECE if L * itemsize > MOMENTS_MIN_BLOCK_BYTES else max(L, 1)


def _n_chunks(N: int, G: int, S: int, reduce_batch: bool, has_mask: bool, affine: bool = True) -> int:
    """How many row chunks (or work items) the backward and its dweight/dbias partial sums use: a function of the
    shape only (never of the thread count), enough items to balance the threads, and few enough that
    the partial buffers (n_chunks * G * K) stay small next to the data (N * G * K * S).

    Blocks take up to _TARGET_ITEMS work items of consecutive blocks in memory order, as the forward's
    (``_backward_groups``), each with partial rows of all G groups, and at most N * S // _MIN_TERMS_PER_CHUNK of
    them, so that the partial buffers stay a sixteenth of the data or less. Rows (S = 1, no mask) take
    up to _TARGET_ITEMS chunks, and items of several groups (``_backward_rows_kernel``): with all G groups to an item
    they walk the rows in memory order. In items of one group, rows of one sample G * L values apart, a cache
    line held rows of two or more items, fetched once for each: the backward of InstanceNorm's blocks of 8
    values as rows ((8192, 64, 1, 8), float32 and float64) took 1.5-2x the time of the blocks' own loops.

    Rows take at least _MIN_ROWS_PER_CHUNK rows a chunk. Each chunk's float64 partial rows (16 bytes a column,
    where a float32 row of x, dy and dx moves 12) are zeroed, added into every TERM_BLOCK_ROWS rows and summed at
    the end, from memory when the rows are long: with 16 rows a chunk, of 4096 float32 values, they added a third
    to the bytes the chunk moved. The float32 backward with chunks of at least 16, 32, 64 and 128 rows (2 threads,
    cold caches; the AMD Zen 4 VM): (512, 4096) 1.00, 0.94, 0.93, 0.90 of the time (on one thread, hot: 1.00,
    0.92, 0.89, 0.87), (1024, 1024) 1.00, 0.94, 0.94, 0.96, (2048, 2048) 1.00, 1.01, 0.97, 0.93; float64 (512,
    4096) 1.00, 0.96, 0.93, 0.98; (8192, 1024) 64 chunks in each case but the last (32): 0.99. Rows of one group
    too few for two chunks (fewer than 64) go in pieces of columns instead (``_backward_few_rows_kernel``).

    Without ``affine`` (no dweight/dbias) there are no partial rows, and rows take a chunk each, up to
    _TARGET_ITEMS: fewer than 64 rows had gone on one thread (one row alone, long enough, goes in pieces instead,
    ``_backward_few_rows_kernel``). ``benchmarks/compare_kernels.py HEAD`` ("bwd, no
    affine grads", 2 threads, hot, the AMD Zen 4 VM) took float32 8 rows of 65536 values 0.74 of the time, 48 of
    them 0.62, 63 of 16384 0.66, 16 of 2^19 (from DRAM) 0.94; float64 16 rows of 2^18 0.56, 48 of 2^15 0.74; from
    64 to 1024 rows (4-32 chunks before, 64 now) 0.95-1.03, where two copies of the same code read 0.86-1.06."""
    if reduce_batch:
        return 1
    if _rows(S, has_mask, reduce_batch):
        return max(1, min(_TARGET_ITEMS, N // _MIN_ROWS_PER_CHUNK if affine else N))
    return max(1, min(N * G, _TARGET_ITEMS, N * S // _MIN_TERMS_PER_CHUNK))


def norm_forward(
    x: np.ndarray,
    weight: np.ndarray | None,
    bias: np.ndarray | None,
    eps: float,
    *,
    centered: bool = True,
    reduce_batch: bool = False,
    mask: np.ndarray | None = None,
    stats: tuple[np.ndarray, np.ndarray] | None = None,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Same contract as ``reference.norm_forward``."""
    reference.check_args(
        "norm_forward", x, reduce_batch=reduce_batch, flags={"centered": centered}, weight=weight, bias=bias,
        mask=mask, stats=stats, out=out, eps=eps,
    )  # fmt: skip
    if not _for_kernels(x, weight, bias, *(stats or ())) or (stats is not None and not _mean_fits(x.dtype, stats[0])):
        return reference.norm_forward(
            x, weight, bias, eps, centered=centered, reduce_batch=reduce_batch, mask=mask, stats=stats, out=out
        )
    N, G, K, S = x.shape
    xc = np.ascontiguousarray(x)
    w2, b2 = _affine2(weight, G, K, 1.0, x.dtype), _affine2(bias, G, K, 0.0, x.dtype)
    y = _out_buffer(out, x.shape, x.dtype, reads=(xc, w2, b2, mask))
    if stats is None:
        mean2 = POOL.empty((1 if reduce_batch else N, G), np.float64)
        var2 = POOL.empty(mean2.shape, np.float64)
    else:
        mean2, var2 = (_stat2(s, G).copy() for s in stats)
    stat_shape = (G,) if reduce_batch else (N, G)
    if _by_columns(x.shape, x.itemsize, reduce_batch, mask):
        _kernel("columns forward", x.size)(
            xc.reshape(N, G * S), w2.reshape(G), b2.reshape(G), bias is not None, float(eps), centered,
            _valid_rows_of(mask, N), mask is not None, stats is not None, mean2.reshape(G), var2.reshape(G),
            y.reshape(N, G * S), S, _column_chunks(N),
            _streams(y, out, G * S, short_aligned_blocks=False) and _column_rows_stream(G * S, x.itemsize),
        )  # fmt: skip
        return _finish(y, out), mean2.reshape(stat_shape), var2.reshape(stat_shape)
    if _as_rows(x.shape, x.itemsize, reduce_batch, mask, backward=False, dweight=False):
        w2, b2, K, S = np.repeat(w2, S, axis=1), np.repeat(b2, S, axis=1), K * S, 1
    x3, y3 = xc.reshape(N, G, K * S), y.reshape(N, G, K * S)
    by_rows = _rows(S, mask is not None, reduce_batch) and stats is None
    if by_rows and K * S <= SHORT_ROW_VALUES:  # (written a batch of rows at a time: see _forward_rows)
        batch_values = _short_rows_batch.py_func(K * S, x.itemsize) * K * S
        stream = SHORT_ROWS_STREAM and _streams(y, out, batch_values, short_aligned_blocks=False)
    else:
        stream = _streams(y, out, K * S, short_aligned_blocks=False)
    if by_rows:
        by_pieces = _forward_by_pieces(N * G, K * S, x.itemsize, x.size)
        _kernel("rows forward", x.size)(
            x3.reshape(N * G, K * S), w2, b2, bias is not None, float(eps), centered, mean2.reshape(N * G),
            var2.reshape(N * G), y3.reshape(N * G, K * S), by_pieces, stream,
        )  # fmt: skip
    else:
        # Eval-mode BatchNorm with a streamed output: with its statistics given, each (n, c) block is normalized on
        # its own, so the blocks go in memory order, as InstanceNorm's, each with its channel's statistics, rather
        # than channel by channel, a block from each of the N samples in turn. ``benchmarks/compare_kernels.py``
        # ("fwd, eval", 2 threads, the AMD Zen 4 VM) took from cold caches float32 32x64x56x56 0.69 of the time,
        # 16x64x56x56 0.72, 64x64x28x28 0.77, float64 32x64x56x56 0.87; hot 0.90 and 1.02. Smaller inputs, whose
        # outputs stay in the cache, stay channel by channel: in memory order float32 blocks of 100-512 values
        # took 0.94-1.24 hot (each block then computes its rstd, a square root and a division, on the way).
        by_blocks = reduce_batch and stats is not None and stream
        mean_k, var_k = (np.repeat(mean2, N, axis=0), np.repeat(var2, N, axis=0)) if by_blocks else (mean2, var2)
        _kernel("groups forward", x.size)(
            x3, w2, b2, bias is not None, float(eps), centered, reduce_batch and not by_blocks, _mask2(mask, N),
            mask is not None, stats is not None, mean_k, var_k, y3, K, S, _moments_piece(K * S, x.itemsize), stream,
        )  # fmt: skip
    return _finish(y, out), mean2.reshape(stat_shape), var2.reshape(stat_shape)


def norm_backward(
    dy: np.ndarray,
    x: np.ndarray,
    mean: np.ndarray,
    rstd: np.ndarray,
    weight: np.ndarray | None,
    *,
    centered: bool = True,
    reduce_batch: bool = False,
    mask: np.ndarray | None = None,
    fixed_stats: bool = False,
    need_affine_grads: bool = True,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Same contract as ``reference.norm_backward``."""
    reference.check_args(
        "norm_backward", x, reduce_batch=reduce_batch,
        flags={"centered": centered, "fixed_stats": fixed_stats, "need_affine_grads": need_affine_grads},
        weight=weight, mask=mask, stats=(mean, rstd), dy=dy, out=out,
    )  # fmt: skip
    common = x.dtype if dy.dtype == x.dtype else np.result_type(x.dtype, dy.dtype)
    if common not in _KERNEL_DTYPES or not _for_kernels(x, dy, mean, rstd, weight) or not _mean_fits(common, mean):
        return reference.norm_backward(
            dy, x, mean, rstd, weight, centered=centered, reduce_batch=reduce_batch, mask=mask,
            fixed_stats=fixed_stats, need_affine_grads=need_affine_grads, out=out,
        )  # fmt: skip
    N, G, K, S = x.shape
    L = K * S
    affine = weight is not None and need_affine_grads
    dy3 = np.ascontiguousarray(dy, dtype=common).reshape(N, G, L)
    x3 = np.ascontiguousarray(x, dtype=common).reshape(N, G, L)
    mean2, rstd2, w2 = _stat2(mean, G), _stat2(rstd, G), _affine2(weight, G, K, 1.0, common)
    if common == x.dtype:
        reads = (dy3.reshape(x.shape), x3.reshape(x.shape), w2, mean2, rstd2, mask)
        dx = _out_buffer(out, x.shape, common, reads=reads)
    else:
        dx = POOL.empty(x.shape, common)

    def stream(block: int) -> bool:
        # (a dx in the common dtype is a temporary, read back at once by the cast to x's dtype)
        return common == x.dtype and _streams(dx, out, block, short_aligned_blocks=True)

    if _by_columns(x.shape, common.itemsize, reduce_batch, mask):
        sums = np.empty((4, G if affine or not fixed_stats else 0))
        _kernel("columns backward", x.size)(
            dy3.reshape(N, G * L), x3.reshape(N, G * L), _valid_rows_of(mask, N), mask is not None, mean2.reshape(G),
            rstd2.reshape(G), w2.reshape(G), centered or fixed_stats, fixed_stats, dx.reshape(N, G * L), sums, S,
            _column_chunks(N),
            stream(G * L) and _column_rows_stream(G * L, dx.itemsize),
        )  # fmt: skip
        dweight, dbias = (sums[1].reshape(G, K), sums[0].reshape(G, K)) if affine else (None, None)
    elif _as_rows(x.shape, common.itemsize, reduce_batch, mask, backward=True, dweight=affine):
        dweight, dbias = _backward_by_groups(
            dy3, x3, mean2, rstd2, np.repeat(w2, S, axis=1), centered, reduce_batch, mask, fixed_stats, dx, affine,
            stream, terms_per_row=K == 1,
        )  # fmt: skip
        if affine and K > 1:  # (per position: each run's positions added)
            dweight, dbias = dweight.reshape(G, K, S).sum(axis=2), dbias.reshape(G, K, S).sum(axis=2)
    else:
        dweight, dbias = _backward_by_groups(
            dy3, x3, mean2, rstd2, w2, centered, reduce_batch, mask, fixed_stats, dx, affine, stream,
            dweight_dtype=weight.dtype if affine else None,
        )  # fmt: skip
    dx = _finish(dx.astype(x.dtype) if common != x.dtype else dx, out)
    if not affine:
        return dx, None, None
    return dx, _pooled_copy(dweight, weight.dtype), _pooled_copy(dbias, weight.dtype)


def _pooled_copy(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``a`` (the backward's own sums) in ``dtype``: itself if it is in it already, else cast into an array
    of the buffer pool. dweight and dbias are as long as a row (or a block's positions): for long ones a fresh
    array faults in its pages every call (see ``_backward_by_groups``)."""
    if a.dtype == dtype:
        return a
    b = POOL.empty(a.shape, dtype)
    np.copyto(b, a)
    return b


def _backward_by_groups(
    dy3, x3, mean2, rstd2, w2, centered, reduce_batch, mask, fixed_stats, dx, affine, stream, terms_per_row=False,
    dweight_dtype=np.float64,
):  # fmt: skip
    """The backward of the blocks (``_backward_rows_kernel``, ``_backward_groups_kernel``): dx into ``dx``,
    streamed where ``stream(block)`` says for the kernel's blocks of ``block`` values (``_streams``);
    returns (dweight, dbias), or (None, None) without ``affine``; with ``terms_per_row`` (rows whose
    weight is one value repeated) one value per group, (G, 1). They come in float64, or, where the few rows' kernel
    takes the rows and ``dweight_dtype`` (the dtype the caller wants them in) is x's, in x's dtype."""
    N, G, L = x3.shape
    K = w2.shape[1]
    S = L // K
    n_chunks = _n_chunks(N, G, S, reduce_batch, mask is not None, affine)
    use_mean, dx3 = centered or fixed_stats, dx.reshape(N, G, L)
    streamed = stream(L)
    rows = _rows(S, mask is not None, reduce_batch)
    # (rows in another dtype than their weight's, rare, take the rows' loop: the few rows' kernel compiles for
    # dweight/dbias in x's dtype only, rounded so from its float64 sums; see the kernel for why. Without dweight and
    # dbias, one row alone of a parallel size: see the kernel.)
    in_pieces = not terms_per_row and dweight_dtype == x3.dtype if affine else N == 1 and L >= PARALLEL_MIN_ELEMENTS
    if rows and G == 1 and n_chunks == 1 and in_pieces:
        piece = min(L, ROW_PIECE_BYTES // x3.itemsize)
        sums = POOL.empty((N, (L + piece - 1) // piece, 2), np.float64)
        dw, db = (POOL.empty((G, L if affine else 0), x3.dtype) for _ in range(2))
        _kernel("few rows backward", x3.size)(
            dy3, x3, mean2, rstd2, w2, use_mean, fixed_stats, dx3, affine, dw[0], db[0], sums, piece, streamed
        )
        return (dw, db) if affine else (None, None)
    # without affine gradients the partial buffers are empty (K = 0) and the kernel never touches them. From the
    # pool, as the rows' term rows, their sums and dweight and dbias (``_pooled_copy``): for long rows they reach
    # glibc's mmap threshold, and fresh pages every call (zeroed by the OS on first touch) took a float32 LayerNorm
    # backward of one row of 2^23 values 145-165 ms instead of 51-60 (one thread, glibc's threshold raised to keep
    # its memory instead)
    pdw = POOL.empty((n_chunks, G, (1 if terms_per_row else K) if affine else 0), np.float64)
    pdb = POOL.empty(pdw.shape, np.float64)
    # Rows with a dweight/dbias term per row take the lean loop, which streams dx only for short rows in blocks of
    # SHORT_ROW_VALUES rows (SHORT_ROWS_STREAM; see _backward_rows_lean); so do rows of several groups without terms,
    # unless streamed (LayerNorm's and RMSNorm's rows, one group, have a compile of their own there) and not short
    # (the lean loop's vectors sum in an order of their own, and the bits must not depend on streaming)
    short = _short_backward_rows.py_func(L, x3.itemsize)
    if rows and (affine and terms_per_row or not affine and G > 1 and (short or not streamed)):
        _kernel("lean rows backward", x3.size)(
            dy3, x3, mean2, rstd2, w2, use_mean, fixed_stats, dx3, affine, pdw, pdb,
            SHORT_ROWS_STREAM and stream(SHORT_ROW_VALUES * L),
        )  # fmt: skip
    elif rows:
        g_blocks, per_block = _row_blocks.py_func(G, n_chunks)
        terms = POOL.empty((n_chunks * g_blocks, per_block, 2, L if affine else 0), x3.dtype)
        _kernel("rows backward", x3.size)(
            dy3, x3, mean2, rstd2, w2, use_mean, fixed_stats, dx3, affine, pdw, pdb, terms, streamed
        )  # fmt: skip
    else:
        _kernel("groups backward", x3.size)(
            dy3, x3, mean2, rstd2, w2, use_mean, reduce_batch, _mask2(mask, N), mask is not None, fixed_stats, dx3,
            affine, pdw, pdb, K, S, streamed,
        )  # fmt: skip
    return (pdw[0], pdb[0]) if affine else (None, None)


def rstd(var: np.ndarray, eps: float) -> np.ndarray:
    """Same contract as ``reference.rstd``, and the same bits: each operation is IEEE's, correctly rounded, in
    float64 (other dtypes, scalars and empty arrays take the reference).

    Why a kernel for one line of NumPy: a square root and a division cost about 1.9 ns a value on one thread, and
    NumPy's ``1 / np.sqrt(var + eps)`` makes two temporaries as big as var, which glibc may serve with fresh
    pages. For InstanceNorm on 4x4 maps, float32 (4096, 64, 4, 4), 262144 statistics, that took 2.4-3.1 ms
    between forward and backward, against the forward's 3.2 ms; here 0.43 ms (2 threads, cold caches, the Intel
    VM), and the fwd+bwd took 7.2 ms instead of 9.7."""
    reference.check_numeric("rstd", "var", var)
    reference.check_eps_type("rstd", eps)
    if var.dtype != np.float64 or var.ndim == 0 or var.size == 0:
        return reference.rstd(var, eps)
    flat = np.ascontiguousarray(var).reshape(-1)
    r = POOL.empty(flat.shape, np.float64)
    _kernel("rstd", flat.size, RSTD_PARALLEL_MIN_ELEMENTS)(flat, float(eps), r)
    return r.reshape(var.shape)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, elementwise, in x's dtype (the reference's, to 1 ULP)."""
    reference.check_numeric("erf", "x", x, kinds="f")
    if not _for_kernels(x):
        return reference.erf(x)
    flat = np.ascontiguousarray(x).reshape(-1)
    y = POOL.empty(flat.shape, x.dtype)
    _kernel("erf", flat.size)(flat, y)
    return y.reshape(x.shape)


def compile_every_kernel(
    dtypes: Sequence[str] = ("float32", "float64"), progress: bool = False, processes: int | None = None
) -> None:
    """Compiles every kernel (``_KERNELS``) in its serial and its parallel compile, for each of ``dtypes``,
    into numba's cache, which later processes then load (``minigrad-norm compile``, and what
    ``bench.startup_seconds(True, every_kernel=True)`` times); where numba cannot cache them (``cache_path()`` is
    None), into this process only.

    numba compiles one function at a time in a process, so the kernels are shared out among ``processes``
    fresh Python processes at once (by default one per CPU this process may use; 1: in this process), one
    kernel to a process. Each kernel's two compiles are functions of their own, and so is each item they call
    (``_item``): two processes may compile an item that two kernels call (BatchNorm's columns forward and
    backward share four small ones), and ``_cache_locked`` keeps its index whole. A process that fails raises a
    RuntimeError with its error output; then, as on Ctrl-C, the other processes are stopped and no more are
    started. On the 2-core Intel Emerald Rapids VM, with the items called by symbol (``_call_item``), both dtypes
    took 58.5 s in two processes (85.5 before; ``benchmarks/compile_time.py``, medians of 2 rounds), a kernel
    with its items alone in a fresh process (s): rows forward 14.0, groups forward 15.2, rows backward 16.9, lean
    rows backward 5.8, few rows backward 16.0, groups backward 16.0, columns forward 12.1, columns backward 12.3,
    erf 1.5. On the 2-core AMD Zen 4 VM, before that, both dtypes took 46 s in two processes against 83 s in one
    (the code before this, which cached the functions the kernels call too and compiled in one process, 83-85 s;
    ``benchmarks/compile_time.py``, medians of 2 rounds). Handed out longest compile first (one process each:
    19.6, 16.3, 15.4, 14.5, 12.5, 11.2 and 1.0 s, which in ``_KERNELS``'s order should leave one process working
    3 s after the other is done), the kernels took 58.5-63.4 s against 54.6-62.0 in three alternated rounds: not
    taken. Nor two long-lived processes taking a kernel and a dtype at a time from a queue (each imports once, and
    the last task is half as long): 56.2-66.1 s against 56.0-70.6 (three rounds; in two more, 65.8-71.4 against
    61.6-64.6). Compile times quoted elsewhere in this module are of one process."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from tqdm import tqdm

    dtypes = [np.dtype(d).name for d in dtypes]
    unknown = [d for d in dtypes if np.dtype(d) not in _KERNEL_DTYPES]
    if unknown:
        raise ValueError(f"compile_every_kernel: dtypes {unknown}: the kernels take float32 and float64 only")
    if processes is not None and processes < 1:
        raise ValueError(f"compile_every_kernel: processes must be positive, got {processes}")
    processes = processes or usable_cpus()
    if processes == 1 or cache_path() is None:  # (where numba cannot cache, another process's compile is lost)
        for name in tqdm(_KERNELS, desc="compile", unit="kernel", disable=not progress):
            _compile_kernel(name, dtypes)
        return
    # the package this one was imported from, first on the child's path
    root = str(Path(__file__).resolve().parents[2])
    children: list[subprocess.Popen] = []
    lock = threading.Lock()  # (no child started once the others are stopped)
    stopped = False

    def in_a_process(name: str) -> None:
        code = (
            f"import sys; sys.path.insert(0, {root!r})\n"
            "from minigrad_norm.kernels.numba_cpu import _compile_kernel\n"
            f"_compile_kernel({name!r}, {dtypes!r})\n"
        )
        with lock:
            if stopped:
                return
            # (its error output kept for the error this raises: on Ctrl-C, which reaches every process of the
            # terminal's group, the children would each print a traceback of their own beside this process's)
            child = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
            children.append(child)
        _, err = child.communicate()
        if child.returncode != 0 and not stopped:
            raise RuntimeError(f"compile_every_kernel: the process compiling {name!r} failed:\n{err}")

    with ThreadPoolExecutor(processes) as pool:
        futures = [pool.submit(in_a_process, name) for name in _KERNELS]
        try:
            done = as_completed(futures)
            for compiled in tqdm(done, desc="compile", unit="kernel", total=len(_KERNELS), disable=not progress):
                compiled.result()
        except BaseException:  # (Ctrl-C, or a failed compile: the other processes stopped, and no more started)
            with lock:
                stopped = True
                for child in children:
                    child.terminate()
            for future in futures:
                future.cancel()
            raise


def _compile_kernel(name: str, dtypes: Sequence[str]) -> None:
    """Calls kernel ``name`` of ``_KERNELS`` in its serial and its parallel compile on data of each of ``dtypes``,
    through the public functions, on shapes they send to it; a backward's statistics come from the reference,
    so that it compiles no forward."""
    run = 1024  # a block of one run of 4 KiB or more: the blocks' own loops, not rows (_as_rows)
    for dtype in map(np.dtype, dtypes):
        for n in (run, 4 * PARALLEL_MIN_ELEMENTS):  # serial, parallel
            if name == "erf":
                erf(np.ones(n, dtype))
                continue
            if name == "rstd":  # (of the statistics: float64 whatever the data)
                rstd(np.ones(n), 1e-5)
                continue
            blocks, direction = name.rsplit(" ", 1)
            shape = {
                "rows": (n // 2, 1, 2, 1),
                "lean rows": (n // 2, 1, 1, 2),  # (a block of one run of 2 values: a row of one weight)
                "few rows": (2, 1, n // 2, 1),
                "groups": (n // run, 1, 1, run),
                "columns": (n // 2, 2, 1, 1),
            }[blocks]
            reduce_batch = blocks == "columns"
            x = np.ones(shape, dtype)
            if direction == "forward":
                norm_forward(x, None, None, 1e-5, reduce_batch=reduce_batch)
            else:
                _, mean, var = reference.norm_forward(x, None, None, 1e-5, reduce_batch=reduce_batch)
                w = np.ones(shape[1:3], dtype)
                norm_backward(x, x, mean, reference.rstd(var, 1e-5), w, reduce_batch=reduce_batch)


def cache_path() -> str | None:
    """The directory numba caches the kernels in: ``NUMBA_CACHE_DIR``, else ``__pycache__`` beside this file
    where that is writable, else a directory of the user's (numba's choice); None where none is writable
    (``_warn_uncached``)."""
    return _KERNELS["erf"][0]._cache.cache_path
