"""The numba kernels against the NumPy reference: same functions, same signatures, same numbers.

Tolerances. The numba kernels use the reference's operation order and accumulate
every sum in float64 too (but a row's dweight and dbias for float32 data, below), so the
statistics, dweight and dbias differ only in the order of their float64 sums (and, for long rows
and blocks, in the merge of their pieces' moments), and so do y and dx for float64 data.
Relative to the largest magnitude in the reference output (``scale``):

* float64: |numba - reference| <= 1e-10 * scale;
* float32 statistics, dweight, dbias: <= 4 ULP(1) * scale = 4.8e-7 * scale (the float64
  result rounded once, so two roundings of nearby float64 values).

For float32 data the kernels compute y and dx in float32 arithmetic; each element is
held to the error bound derived in ``minigrad_norm.kernels.numba_cpu`` (u = 2^-24, the
quantities on the right exact, from the reference in float64):

* y:  |numba - reference| <= 8 u (|xhat * w| + |b|)
* dx: |numba - reference| <= 16 u rstd (|dxhat| + |xhat| mean_g|dxhat * xhat| + mean_g|dxhat|)
* a row's dweight and dbias (LayerNorm, RMSNorm, and blocks of short runs taken as rows, ``_as_rows``: terms
  summed in float32 over blocks of R rows):
  (R + 8) u sum_n |dy * xhat| and (R + 2) u sum_n |dy|

The inputs are drawn as offset + spread * N(0, 1) with |offset| / spread <= 1e3, so
no test depends on cancellation deeper than these bounds allow; the spread from 1e-4 to 10 and
eps 1e-5, 1e-2 or 1, so that the variance falls below eps as well as far above it.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import sys
from fractions import Fraction

import numba
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from minigrad_norm.kernels import numba_cpu, reference
from minigrad_norm.kernels.buffers import BufferPool, aligned_empty

EPS = 1e-5
TOL = {np.float32: 4 * float(np.finfo(np.float32).eps), np.float64: 1e-10}


U32 = 2.0**-24


def assert_close(got, want, dtype, what: str, bound: np.ndarray | None = None) -> None:
    """Same shape, dtype and NaN/inf pattern; then |got - want| <= TOL[dtype] * scale, or with ``bound``
    (an array like ``want``), |got - want| <= bound elementwise wherever the bound is finite."""
    if want is None:
        assert got is None, what
        return
    assert got.shape == want.shape, what
    assert got.dtype == want.dtype, what
    both_finite = np.isfinite(want) & np.isfinite(got)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{what}: NaN pattern")
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want), err_msg=f"{what}: +inf pattern")
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want), err_msg=f"{what}: -inf pattern")
    with np.errstate(invalid="ignore"):  # inf - inf where both are inf: the patterns are compared above
        err = np.abs(got.astype(np.float64) - want)
    if bound is not None:
        where = both_finite & np.isfinite(bound)
        worst = np.argmax(np.where(where, err - bound, -np.inf))
        assert np.all(err[where] <= bound[where]), (
            f"{what}: error {err.flat[worst]:.3e} > bound {bound.flat[worst]:.3e} "
            f"at {np.unravel_index(worst, err.shape)}"
        )
        return
    scale = max(1.0, float(np.max(np.abs(want[both_finite]), initial=0.0)))
    worst = float(np.max(err[both_finite], initial=0.0))
    assert worst <= TOL[dtype] * scale, f"{what}: max abs error {worst:.3e} > {TOL[dtype]:.1e} * {scale:.3e}"


def float32_bounds(case: dict, mean: np.ndarray, var: np.ndarray, fixed: bool) -> dict[str, np.ndarray | None]:
    """The error bounds of the float32 y and dx, and of a row's dweight and dbias (module docstring), by
    output name, from exact float64 quantities: the reference's statistics ``mean``, ``var`` (as the
    forward used them), x, dy and the affine. dweight and dbias of other groups get None: they are float64
    sums, held to TOL."""
    x, dy = case["x"].astype(np.float64), case["dy"].astype(np.float64)
    N, G, K, S = x.shape
    rb = case["reduce_batch"]
    stat4 = (lambda a: a[None, :, None, None]) if rb else (lambda a: a[:, :, None, None])
    rstd = stat4(1.0 / np.sqrt(var + case.get("eps", EPS)))
    w = np.ones((G, K)) if case["weight"] is None else case["weight"].astype(np.float64)
    b = np.zeros((G, K)) if case["bias"] is None else case["bias"].astype(np.float64)
    w, b = w[None, :, :, None], b[None, :, :, None]
    valid = np.ones(x.shape, bool) if case["mask"] is None else np.broadcast_to(case["mask"][:, None, None, :], x.shape)
    axes = (0, 2, 3) if rb else (2, 3)

    def group_mean(t: np.ndarray) -> np.ndarray:
        total = np.where(valid, t, 0.0).sum(axis=axes, keepdims=True)
        return total / np.maximum(valid.sum(axis=axes, keepdims=True), 1)

    # the forward subtracts the mean it used; the backward's xhat is centered only if centered or fixed
    y_bound = 8 * U32 * (np.abs((x - stat4(mean)) * rstd * w) + np.abs(b))
    xhat = (x - (stat4(mean) if case["centered"] or fixed else 0.0)) * rstd
    dxhat = np.abs(dy * w)
    dx_bound = 16 * U32 * rstd * (dxhat + np.abs(xhat) * group_mean(dxhat * np.abs(xhat)) + group_mean(dxhat))
    bounds = {"y": y_bound, "dx": dx_bound, "dweight": None, "dbias": None}
    # rows (LayerNorm, RMSNorm; blocks in short runs, _as_rows): terms summed in float32 blocks
    rows = S == 1 and case["mask"] is None and not rb
    if rows or numba_cpu._as_rows(x.shape, case["x"].itemsize, rb, case["mask"], backward=True, dweight=True):
        R = numba_cpu.TERM_BLOCK_ROWS
        bounds["dweight"] = (R + 8) * U32 * np.abs(dy * xhat).sum(axis=(0, 3))
        bounds["dbias"] = (R + 2) * U32 * np.abs(dy).sum(axis=(0, 3))
    return bounds


@st.composite
def cases(
    draw, max_side: int = 9, long_rows: bool = False, short_run_batch_norm: bool = False, non_finite: bool = False
):
    """A norm problem on the (N, G, K, S) view, with every option of the kernels; with ``long_rows``
    small N, G, K and a spatial extent S of thousands (one long group per (n, g)); with
    ``short_run_batch_norm`` a BatchNorm in runs shorter than COLUMNS_MAX_RUN_BYTES (the columns kernels), of up
    to 80 samples (1 to 5 row chunks), in runs of one value maybe with a mask of whole rows; with ``non_finite``
    one to three NaN, inf or -inf in x, dy or the weight (NaN in the bias alone makes NaN of y alone)."""
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    shape = tuple(draw(st.integers(1, max_side)) for _ in range(3)) + (draw(st.integers(300, 3000)),)
    if not long_rows:
        shape = shape[:3] + (draw(st.integers(1, max_side)),)
    if short_run_batch_norm:
        max_run = (numba_cpu.COLUMNS_MAX_RUN_BYTES - 1) // np.dtype(dtype).itemsize
        shape = (draw(st.integers(1, 80)), draw(st.integers(1, max_side)), 1, draw(st.integers(1, max_run)))
    N, G, K, S = shape
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    spread = 10.0 ** draw(st.integers(-4, 1))  # (down to a variance of 1e-8: below eps = 1e-5)
    offset = spread * draw(st.sampled_from([0.0, 1.0, -30.0, 1e3]))
    x = (offset + spread * rng.standard_normal(shape)).astype(dtype)
    layout = draw(st.sampled_from(["contiguous", "strided", "fortran"]))
    if layout == "strided":  # a view with steps in every axis
        big = np.zeros((2 * N, G, K, 2 * S), dtype=dtype)
        big[::2, :, :, ::2] = x
        x = big[::2, :, :, ::2]
    elif layout == "fortran":
        x = np.asfortranarray(x)
    affine = draw(st.sampled_from(["none", "weight", "both"]))
    weight = None if affine == "none" else rng.standard_normal((G, K)).astype(dtype)
    bias = rng.standard_normal((G, K)).astype(dtype) if affine == "both" else None
    mask = None
    if (not short_run_batch_norm or S == 1) and draw(st.booleans()):
        mask = rng.random((N, S)) < (draw(st.sampled_from([0.7, 0.1])) if short_run_batch_norm else 0.7)
        mask[0, 0] = True  # at least one valid value in the first group
    dy = rng.standard_normal(shape).astype(dtype)
    if non_finite:
        where = draw(st.sampled_from(["x", "dy"] + (["weight"] if weight is not None else [])))
        a = {"x": x, "dy": dy, "weight": weight}[where].copy()  # (a strided x made contiguous: the case is the values)
        values = draw(st.lists(st.sampled_from([np.nan, np.inf, -np.inf]), min_size=1, max_size=min(3, a.size)))
        a.flat[rng.choice(a.size, size=len(values), replace=False)] = values
        x, dy, weight = (a if where == name else v for name, v in (("x", x), ("dy", dy), ("weight", weight)))
    return dict(
        x=x,
        dy=dy,
        weight=weight,
        bias=bias,
        centered=draw(st.booleans()),
        reduce_batch=short_run_batch_norm or draw(st.booleans()),
        mask=mask,
        eval_stats=draw(st.booleans()),
        need_affine_grads=draw(st.booleans()),
        eps=draw(st.sampled_from([EPS, 1e-2, 1.0])),
    )


def run_both(case: dict, **extra) -> list[tuple]:
    """(numba result, reference result, name) for forward, backward and fixed-stats backward."""
    x, w, b, dy, eps = case["x"], case["weight"], case["bias"], case["dy"], case.get("eps", EPS)
    opts = dict(centered=case["centered"], reduce_batch=case["reduce_batch"], mask=case["mask"])
    fwd = {}
    for name, mod in (("numba", numba_cpu), ("reference", reference)):
        y, mean, var = mod.norm_forward(x, w, b, eps, **opts)
        stats = (mean + 0.25, var + 0.5) if case["eval_stats"] else None
        if stats is not None:
            y, mean, var = mod.norm_forward(x, w, b, eps, stats=stats, **opts)
        # both backwards get the reference's statistics: this compares the backward alone
        fwd[name] = (y, mean, var)
    _, mean, var = fwd["reference"]
    rstd = 1.0 / np.sqrt(var + eps)
    float32 = np.result_type(x, dy) == np.float32
    # the float32 bounds for computed (fixed=False) and fixed statistics (None: held to TOL)
    none = dict.fromkeys(("y", "dx", "dweight", "dbias"))
    bounds = {fixed: float32_bounds(case, mean, var, fixed) if float32 else none for fixed in (False, True)}
    out = []
    for fixed in (False, True):
        bwd = [
            mod.norm_backward(
                dy, x, mean, rstd, w, fixed_stats=fixed, need_affine_grads=case["need_affine_grads"], **opts, **extra
            )
            for mod in (numba_cpu, reference)
        ]
        b = bounds[fixed]
        out.append((bwd[0], bwd[1], f"backward fixed_stats={fixed}", (b["dx"], b["dweight"], b["dbias"])))
    return [(fwd["numba"], fwd["reference"], "forward", (bounds[False]["y"], None, None)), *out]


def record_kernel_calls(monkeypatch, streams: bool = False) -> list:
    """The names of the kernels (``numba_cpu._KERNELS``) called from now on, in order; with ``streams``, (name, the
    call's last argument: whether the kernel streams its output) for each."""
    called = []

    def recording(name, kernel):
        def call(*args):
            called.append((name, args[-1]) if streams else name)
            return kernel(*args)

        return call

    kernels = {name: tuple(recording(name, k) for k in pair) for name, pair in numba_cpu._KERNELS.items()}
    monkeypatch.setattr(numba_cpu, "_KERNELS", kernels)
    return called


def check_case(case: dict) -> None:
    """Every output of forward and backward: y, dx (and a row's dweight, dbias) within their bounds, the
    other sums to TOL."""
    dtype = case["x"].dtype.type
    for got, want, what, bounds in run_both(case):
        for name, g, w, bound in zip(("first", "second", "third"), got, want, bounds):
            assert_close(g, w, dtype, f"{what}, output {name}", bound)


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")  # an all-masked group
@given(cases())
def test_numba_equals_reference(case):
    check_case(case)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NumPy on the NaN/inf given
@given(
    st.one_of(
        cases(non_finite=True),
        cases(long_rows=True, non_finite=True),
        cases(max_side=40, short_run_batch_norm=True, non_finite=True),
    )
)
def test_numba_equals_reference_with_non_finite_values(case):
    """NaN, inf and -inf anywhere in x, dy or the weight, beside every option (masks, given statistics, each
    family of loops): the reference's NaN/inf pattern in every output, and its values where both are finite."""
    check_case(case)


@given(cases(max_side=40, short_run_batch_norm=True))
def test_batch_norm_in_short_runs(case):
    """BatchNorm of blocks shorter than COLUMNS_MAX_RUN_BYTES (BatchNorm1d on (N, C): runs of one value) goes
    to the columns kernels, which walk the batch in memory order with a partial row of sums per chunk."""
    assert numba_cpu._by_columns(case["x"].shape, case["x"].itemsize, True, None)
    check_case(case)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("S", [1, 3])
@pytest.mark.parametrize("offset", [0.0, 1e3])
def test_batch_norm_in_short_runs_merges_tiles_and_chunks(dtype, S, offset):
    """A batch big enough that each row chunk of the columns forward is several tiles of rows (the hypothesis
    cases are too small to have more than one): the tiles' moments merged into the chunk's, the chunks' and
    then a channel's positions into the channel's, held to the reference, also far from zero mean."""
    itemsize = np.dtype(dtype).itemsize
    C = numba_cpu.COLUMNS_TILE_BYTES // 2 // (S * itemsize)  # two rows to a tile
    N = 32
    per = -(-N // numba_cpu._column_chunks(N))
    tile_rows = numba_cpu.COLUMNS_TILE_BYTES // (C * S * itemsize)
    assert numba_cpu._column_chunks(N) > 1 and per >= 2 * tile_rows, "the case must merge tiles and chunks"
    rng = np.random.default_rng(7)
    scale = np.linspace(0.5, 3.0, C)[None, :, None, None]
    x = (offset + scale * rng.standard_normal((N, C, 1, S))).astype(dtype)
    case = dict(
        x=x, dy=rng.standard_normal(x.shape).astype(dtype), weight=rng.standard_normal((C, 1)).astype(dtype),
        bias=rng.standard_normal((C, 1)).astype(dtype), centered=True, reduce_batch=True, mask=None,
        eval_stats=False, need_affine_grads=True,
    )  # fmt: skip
    assert numba_cpu._by_columns(x.shape, itemsize, True, None)
    check_case(case)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the reference on no valid row
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batch_norm_in_short_runs_skips_masked_rows(dtype):
    """BatchNorm in runs of one value with a mask of whole rows, on the columns kernels: whole chunks masked
    (80 samples: five chunks of 16, the first two and a half masked), NaN and inf in the masked rows of x and
    dy reaching nothing, as in the reference; and with every row masked, NaN statistics and zero outputs."""
    rng = np.random.default_rng(3)
    N, C = 80, 5
    x = rng.standard_normal((N, C, 1, 1)).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    mask = np.ones((N, 1), bool)
    mask[:40] = False
    mask[50::7] = False
    x[:40:3, 1], dy[:40:5, 2], x[50, 3] = np.nan, np.inf, -np.inf  # in masked rows only
    assert numba_cpu._by_columns(x.shape, x.itemsize, True, mask)
    w, b = rng.standard_normal((C, 1)).astype(dtype), rng.standard_normal((C, 1)).astype(dtype)
    case = dict(x=x, dy=dy, weight=w, bias=b, reduce_batch=True, mask=mask, need_affine_grads=True)
    for centered in (True, False):
        for eval_stats in (False, True):
            check_case({**case, "centered": centered, "eval_stats": eval_stats})
    y, mean, var = numba_cpu.norm_forward(x, w, b, EPS, reduce_batch=True, mask=np.zeros((N, 1), bool))
    want_y, want_mean, want_var = reference.norm_forward(x, w, b, EPS, reduce_batch=True, mask=np.zeros((N, 1), bool))
    assert np.all(y == 0) and np.all(want_y == 0)
    assert np.all(np.isnan(mean)) and np.all(np.isnan(var)) and np.all(np.isnan(want_mean))


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NaN in the reference's sums
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("masked", [False, True])
def test_batch_norm_in_short_runs_sums_wide_rows_four_at_a_time(dtype, masked):
    """Rows wide enough that the columns kernels sum them four at a time (``_four_rows``: the forward's moments and
    the backward's sums), in chunks and runs of valid rows whose lengths are not multiples of four, so that blocks
    of four and the rows left over both run; held to the reference, with NaN and inf in valid rows (inside a block
    of four and in a row left over) spreading as in the reference and, with the mask, NaN and inf in masked rows
    reaching nothing."""
    P, itemsize = 1440, np.dtype(dtype).itemsize
    assert numba_cpu._four_rows(P, 16 + itemsize) and numba_cpu._four_rows(P, 32 + 2 * itemsize)
    N = 39
    assert numba_cpu._column_chunks(N) == 2  # chunks of 20 and 19 rows
    rng = np.random.default_rng(11)
    x = (3.0 + rng.standard_normal((N, P, 1, 1))).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    x[1, 5], dy[2, 9], x[38, 17], dy[37, 33] = np.nan, np.inf, -np.inf, np.nan  # rows 0-3 a block, 36-38 left over
    mask = None
    if masked:
        mask = np.ones((N, 1), bool)
        mask[[6, 16, 17, 29]] = False  # valid runs of 6, 9, 11 (in two chunks), 9 rows
        x[6, :40:3], dy[16, 1:50:7], x[29, 100] = np.nan, np.inf, -np.inf
    assert numba_cpu._by_columns(x.shape, x.itemsize, True, mask)
    w, b = rng.standard_normal((P, 1)).astype(dtype), rng.standard_normal((P, 1)).astype(dtype)
    case = dict(x=x, dy=dy, weight=w, bias=b, reduce_batch=True, mask=mask, need_affine_grads=True)
    for centered in (True, False):
        for eval_stats in (False, True):
            check_case({**case, "centered": centered, "eval_stats": eval_stats})


def test_only_batch_norm_in_short_runs_goes_by_columns():
    """Which calls the columns kernels take: BatchNorm, one run per block, runs under COLUMNS_MAX_RUN_BYTES,
    unmasked or with a mask of whole rows (runs of one value)."""
    by_columns = numba_cpu._by_columns
    for itemsize in (4, 8):
        longest = (numba_cpu.COLUMNS_MAX_RUN_BYTES - 1) // itemsize
        assert by_columns((8, 3, 1, longest), itemsize, True, None)
        assert not by_columns((8, 3, 1, longest + 1), itemsize, True, None)
    assert not by_columns((8, 3, 1, 1), 4, False, None)  # InstanceNorm: statistics per block
    assert not by_columns((8, 3, 2, 1), 4, True, None)  # runs of K per block
    assert by_columns((8, 3, 1, 1), 4, True, np.ones((8, 1), bool))
    assert not by_columns((8, 3, 1, 2), 4, True, np.ones((8, 2), bool))  # a mask inside the rows


@given(cases(max_side=3, long_rows=True))
def test_long_rows(case):
    """Very long groups (a big spatial map; LayerNorm's long rows are K, covered by the transpose)."""
    check_case(case)


def as_layer_norm_rows(case: dict) -> dict:
    """A long-group case as LayerNorm's view (rows, 1, D, 1), D = S in the thousands."""
    N, G, K, S = case["x"].shape
    case = dict(case)
    for key in ("x", "dy"):
        case[key] = np.ascontiguousarray(case[key]).reshape(N * G * K, 1, S, 1)
    w = np.resize(np.linspace(-2, 2, 7), (1, S)).astype(case["x"].dtype)
    case.update(mask=None, weight=w, bias=None if case["bias"] is None else w[:, ::-1] * 0.5)
    return case


@given(cases(max_side=3, long_rows=True).map(as_layer_norm_rows))
def test_long_layer_norm_rows(case):
    """LayerNorm's view (rows, 1, D, 1) with D in the thousands: the S == 1 fast path."""
    check_case(case)


@pytest.mark.parametrize("reduce_batch", [False, True])
def test_float32_large_mean_is_subtracted_exactly(reduce_batch):
    """x = 1e4 + N(0, 1) in float32: the mean rounded to float32 alone is off by up to 5e-4, which the
    y and dx bounds (a few 6e-8 of |xhat * w|) do not allow; the (mu_hi, mu_lo) pair keeps them."""
    rng = np.random.default_rng(7)
    shape = (64, 2, 3, 50)
    x = (1e4 + rng.standard_normal(shape)).astype(np.float32)
    w = rng.standard_normal((2, 3)).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    case = dict(x=x, dy=dy, weight=w, bias=w[:, ::-1].copy(), centered=True, reduce_batch=reduce_batch, mask=None)
    check_case({**case, "eval_stats": False, "need_affine_grads": True})


@pytest.mark.parametrize("mod", [numba_cpu, reference], ids=["numba", "reference"])
@pytest.mark.parametrize("offset", [1e8, 1e12])
@pytest.mark.parametrize(
    ("view", "reduce_batch"),
    [
        ((8, 1, 256, 1), False),  # LayerNorm's rows
        ((3, 2, 4, 64), False),  # GroupNorm's blocks, one to a work item
        ((64, 2, 4, 64), False),  # ... two to an item: statistics in pairs
        ((256, 3, 1, 1), True),  # BatchNorm1d on (N, C): the columns kernels
        ((5, 3, 1, 52), True),  # BatchNorm2d: a channel's blocks, in pairs and one alone
    ],
    ids=["rows", "blocks alone", "blocks in pairs", "columns", "channel of blocks"],
)
def test_float64_variance_far_from_zero_mean_takes_two_passes(mod, offset, view, reduce_batch):
    """float64 x = offset + N(0, 1) with offset 1e8 and 1e12: the mean, variance and y of the two-pass formula on the
    de-meaned data x - offset (exact in float64), in NumPy. A float64 sum of m values near the offset, in any order,
    is off by at most m u offset (u = 2^-53), so the mean is, and the two passes give var and y to about that
    (2.8e-6 and 2.8e-2 here); E[x^2] - E[x]^2, even summed in float64, loses about u offset^2 (1 and 1e8 here, next
    to a variance of 1), and y with it."""
    rng = np.random.default_rng(17)
    x = offset + rng.standard_normal(view)
    d = x - offset  # exact: x is within a factor 2 of the offset
    axes = (0, 2, 3) if reduce_batch else (2, 3)
    m = math.prod(view[a] for a in axes)
    d_mean = d.mean(axis=axes, keepdims=True)
    want_var = ((d - d_mean) ** 2).mean(axis=axes, keepdims=True)
    want_y = (d - d_mean) / np.sqrt(want_var + EPS)
    tol = m * 2.0**-53 * offset
    y, mean, var = mod.norm_forward(x, None, None, EPS, reduce_batch=reduce_batch)
    np.testing.assert_allclose(mean.reshape(-1), (offset + d_mean).reshape(-1), rtol=0, atol=2 * tol)
    np.testing.assert_allclose(var.reshape(-1), want_var.reshape(-1), rtol=tol, atol=0)
    bound = tol * (1 / np.sqrt(want_var + EPS) + np.abs(want_y))  # the mean's error, and var's through rstd
    assert np.all(np.abs(y - want_y) <= bound), f"y off by {np.max(np.abs(y - want_y) / bound):.3g} of its bound"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("centered", [True, False])
@pytest.mark.parametrize("eval_stats", [False, True])
def test_rows_of_several_groups_split_inside_a_sample(dtype, centered, eval_stats):
    """Rows with a weight and bias per group (GroupNorm of an (N, C) input, the view (N, G, C/G, 1)): 65
    samples of 2 groups are 130 rows, 3 per forward work item, so items start at group 0 or 1. With
    given statistics the forward takes the general loop, and the backward gets a mean that is not 0,
    which an uncentered (RMS) backward must ignore."""
    rng = np.random.default_rng(9)
    x = (2.0 + rng.standard_normal((65, 2, 5, 1))).astype(dtype)
    w = rng.standard_normal((2, 5)).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    case = dict(x=x, dy=dy, weight=w, bias=w[::-1].copy(), reduce_batch=False, mask=None, eval_stats=eval_stats)
    check_case({**case, "centered": centered, "need_affine_grads": True})


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("centered", [True, False])
@pytest.mark.parametrize("eval_stats", [False, True])
@pytest.mark.parametrize("reduce_batch", [False, True])
@pytest.mark.parametrize("view", [(65, 2, 5, 520), (65, 2, 1, 520), (47, 7, 3, 520)])
def test_blocks_in_pairs_and_alone(dtype, centered, eval_stats, reduce_batch, view):
    """Blocks (InstanceNorm/GroupNorm, S > 1) go in work items of consecutive blocks: 65 samples of 2 groups are
    130 blocks, 3 to an item (47 samples of 7 groups: 329 blocks, 6 or 5 to an item), so that items straddle
    samples. The forward takes two blocks in pairs and the third alone (with given statistics, no pairs), the
    backward one at a time, with partial rows of every group per item; a BatchNorm channel (reduce_batch) sums
    its 65 blocks in 32 pairs and one alone. Every block has a mean and a spread of its own and every (group,
    run) a weight of its own, so that a block normalized or differentiated with another's statistics, weight or
    partial row fails. (Runs of 520 values: shorter ones are taken as rows.)"""
    assert not numba_cpu._as_rows(view, np.dtype(dtype).itemsize, reduce_batch, None, backward=True, dweight=True)
    rng = np.random.default_rng(10)
    N, G, _, _ = view
    offsets, scales = rng.uniform(-300, 300, (N, G, 1, 1)), rng.uniform(0.5, 4.0, (N, G, 1, 1))
    x = (rng.standard_normal(view) * scales + offsets).astype(dtype)
    w = rng.standard_normal(view[1:3]).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    case = dict(x=x, dy=dy, weight=w, bias=w[::-1].copy(), reduce_batch=reduce_batch, mask=None)
    check_case({**case, "eval_stats": eval_stats, "centered": centered, "need_affine_grads": True})


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NumPy on the NaN/inf given
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("centered", [True, False])
@pytest.mark.parametrize("non_finite", [False, True])
def test_long_blocks_take_their_statistics_piece_by_piece(dtype, centered, non_finite):
    """Paired blocks of more than MOMENTS_MIN_BLOCK_BYTES take their statistics MOMENTS_PIECE values at a time,
    each piece's M2 about the piece's own mean, merged into the block's (Chan's update). Blocks of four and a
    half pieces, 130 of them, 3 per forward work item (a pair and one alone, as in the pairs test above); a
    ramp along each block puts the pieces' means 3-4 of their spreads apart, so that the merge's correction is
    most of M2; the second group sits 300 away from the first; NaN and inf, in some runs, fall in pieces of
    their own. The forward as the reference's (mean, var and y to their bounds), and the backward too."""
    piece, itemsize = numba_cpu.MOMENTS_PIECE, np.dtype(dtype).itemsize
    L = 4 * piece + piece // 2 + 3
    assert L * itemsize > numba_cpu.MOMENTS_MIN_BLOCK_BYTES and numba_cpu._moments_piece(L, itemsize) == piece
    rng = np.random.default_rng(11)
    view = (65, 2, 1, L)
    x = np.linspace(-3.0, 3.0, L) * np.sqrt(L) / 10 + rng.standard_normal(view) + np.array([2.0, -300.0])[:, None, None]
    x = x.astype(dtype)
    if non_finite:
        x[0, 0, 0, [5, piece + 7]] = [np.inf, -np.inf]  # one block's first two pieces: its mean NaN
        x[1, 1, 0, 3 * piece + 1] = np.nan
        x[2, 0, 0, L - 1] = np.inf  # in the last, partial piece
    w = rng.standard_normal(view[1:3]).astype(dtype)
    dy = rng.standard_normal(view).astype(dtype)
    case = dict(x=x, dy=dy, weight=w, bias=w[::-1].copy(), reduce_batch=False, mask=None)
    check_case({**case, "eval_stats": False, "centered": centered, "need_affine_grads": True})


def test_the_work_items_of_the_pairs_test_hold_pairs_and_blocks_alone():
    """What ``test_blocks_in_pairs_and_alone`` relies on: the forward's and the backward's work items over its
    views' N * G blocks hold 3 blocks (and 1: 130 blocks) or 6 (and 5: 329), in runs that straddle samples."""

    def sizes(blocks: int, items: int) -> set[int]:
        per = -(-blocks // items)
        return {min(blocks, first + per) - first for first in range(0, blocks, per)}

    for (N, G), want in [((65, 2), {3, 1}), ((47, 7), {6, 5})]:
        forward_items, _ = numba_cpu._work_items(N * G, False)
        backward_items = numba_cpu._n_chunks(N, G, 520, reduce_batch=False, has_mask=False)
        assert sizes(N * G, forward_items) == sizes(N * G, backward_items) == want


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("centered", [True, False])
@pytest.mark.parametrize("eval_stats", [False, True])
@pytest.mark.parametrize("large_x", [False, True])
@pytest.mark.parametrize(
    "view", [(1000, 3, 4, 3), (2000, 3, 2, 5), (20, 40, 2, 6), (2000, 3, 1, 5), (60, 4, 3, 30), (60, 4, 1, 30)]
)
def test_blocks_of_short_runs_as_rows(monkeypatch, dtype, centered, eval_stats, large_x, view):
    """GroupNorm and InstanceNorm blocks in short runs go to the row loops as rows with a weight and bias per
    value (``_as_rows``), their dweight and dbias summed over each run's positions after. The backward's work
    items: 62 chunks of samples and blocks of two groups and one ((1000, 3, ...)), 64 chunks of all three
    groups, the rows in memory order ((2000, 3, ...)), and one chunk of a group each ((20, 40, ...)); blocks of
    one run (InstanceNorm, (2000, 3, 1, 5)) too. Runs of 30 values go as rows in the forward only in float32
    blocks of one run. In the backward, for an x smaller than ROWS_LARGE_X_BYTES: float32 (120 bytes) with
    dweight/dbias or without, float64 (240 bytes) without, or with them in blocks of one run (InstanceNorm's,
    whose terms are one per row). For an x that large (``large_x``, every x here made so): blocks of one run as
    before, blocks of several runs only float32 without dweight/dbias."""
    monkeypatch.setattr(numba_cpu, "ROWS_LARGE_X_BYTES", 0 if large_x else 2**62)
    itemsize = np.dtype(dtype).itemsize
    forward, backward, backward_no_affine = (
        numba_cpu._as_rows(view, itemsize, False, None, backward=b, dweight=d)
        for b, d in ((False, False), (True, True), (True, False))
    )
    short, one_run = view[3] < 30, view[2] == 1
    assert forward == (short or (one_run and dtype == np.float32))
    if large_x:
        assert backward == (short or one_run)
        assert backward_no_affine == (short or one_run or dtype == np.float32)
    else:
        assert backward == (short or one_run or dtype == np.float32)
        assert backward_no_affine
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(view) + np.array([2.0, -300.0, 0.5] * (view[1] // 3 + 1))[: view[1], None, None]).astype(
        dtype
    )
    w = rng.standard_normal(view[1:3]).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    case = dict(x=x, dy=dy, weight=w, bias=w[::-1].copy(), reduce_batch=False, mask=None, eval_stats=eval_stats)
    for need_affine_grads in (True, False):
        check_case({**case, "centered": centered, "need_affine_grads": need_affine_grads})


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("eval_stats", [False, True])
def test_the_forward_takes_blocks_the_row_loop_prefetches_as_rows(monkeypatch, dtype, eval_stats):
    """Where the forward row loop prefetches rows (PREFETCH_MAX_ROW_BYTES, Intel CPUs), blocks of at most that
    many bytes go to it as rows whatever their runs, for an x of ROWS_PREFETCHED_MIN_X_BYTES or more (an x of
    exactly that size does, one a byte bigger than the x does not); elsewhere, and for longer blocks, BatchNorm
    or a mask, the runs' limits stand. The backward's routing does not change with it. The forward so routed
    keeps the reference's values."""
    itemsize = np.dtype(dtype).itemsize
    prefetches = numba_cpu.PREFETCH_MAX_ROW_BYTES == 2048
    views = {  # view: whether it goes as rows where the row loop prefetches (x of at least the floor)
        (40, 6, 8, 32): True,  # several runs of 128 or 256 bytes, in blocks of 1 or 2 KiB
        (30, 6, 1, 384 // itemsize): True,  # InstanceNorm's one run of 384 bytes
        (8, 3, 2, 1024 // itemsize): True,  # a block of 2 KiB
        (8, 3, 2, 1040 // itemsize): False,  # 2080 bytes
    }
    for view, prefetched in views.items():
        x_bytes = int(np.prod(view)) * itemsize
        backward = [numba_cpu._as_rows(view, itemsize, False, None, backward=True, dweight=d) for d in (True, False)]
        for floor, rows in ((x_bytes, prefetched and prefetches), (x_bytes + 1, False)):
            monkeypatch.setattr(numba_cpu, "ROWS_PREFETCHED_MIN_X_BYTES", floor)
            assert numba_cpu._as_rows(view, itemsize, False, None, backward=False, dweight=False) == rows, view
            assert not numba_cpu._as_rows(view, itemsize, True, None, backward=False, dweight=False)
            assert not numba_cpu._as_rows(view, itemsize, False, np.ones((view[0], 1), bool), False, False)
            assert backward == [
                numba_cpu._as_rows(view, itemsize, False, None, backward=True, dweight=d) for d in (True, False)
            ]
        monkeypatch.setattr(numba_cpu, "ROWS_PREFETCHED_MIN_X_BYTES", 0)
        rng = np.random.default_rng(5)
        x = (rng.standard_normal(view) + np.array([3.0, -200.0, 0.25] * 2)[: view[1], None, None]).astype(dtype)
        w = rng.standard_normal(view[1:3]).astype(dtype)
        dy = rng.standard_normal(view).astype(dtype)
        case = dict(x=x, dy=dy, weight=w, bias=w[::-1].copy(), mask=None, reduce_batch=False, eval_stats=eval_stats)
        check_case({**case, "centered": True, "need_affine_grads": True})


def test_the_forward_row_loop_prefetches_streamed_rows_of_up_to_16_kib():
    """How many rows ahead the forward row loop prefetches (``_rows_ahead``): on Intel CPUs rows of up to 2 KiB
    2 KiB ahead, streamed or not, and float32 rows of up to 16 KiB whose output streams 8 KiB ahead, at least one
    row; rows a value longer, not streamed, or of float64 values, none. Elsewhere none at all."""
    ahead = numba_cpu._rows_ahead.py_func
    intel = numba_cpu.PREFETCH_MAX_ROW_BYTES == 2048
    assert (numba_cpu.PREFETCH_MAX_STREAMED_ROW_BYTES == 16 * 1024) == intel
    for itemsize in (4, 8):
        kib = 1024 // itemsize  # values in 1 KiB
        for L, plain, streamed in (
            (1, 2048 // itemsize, 2048 // itemsize),
            (kib // 2, 4, 4),
            (2 * kib, 1, 1),
            (2 * kib + 1, 0, 3),  # (8 KiB // 2052 or 2056 bytes)
            (4 * kib, 0, 2),
            (8 * kib, 0, 1),
            (12 * kib, 0, 1),
            (16 * kib, 0, 1),
            (16 * kib + 1, 0, 0),
            (0, 0, 0),
        ):
            assert ahead(L, itemsize, False) == (plain if intel else 0), (L, itemsize)
            long_float64 = itemsize == 8 and L * itemsize > 2048
            assert ahead(L, itemsize, True) == (streamed if intel and not long_float64 else 0), (L, itemsize)


def test_the_backward_routes_short_runs_by_the_size_of_x(monkeypatch):
    """The backward's row limits of ``_as_rows`` go by x's bytes, N * G * K * S * itemsize, against
    ROWS_LARGE_X_BYTES: an x of exactly that size takes the lower limits (blocks of several runs of 128 bytes, with
    dweight/dbias, to the blocks' loop), one a byte smaller the higher (to the rows' loop). The forward's do not."""
    view = (3, 5, 4, 32)  # float32 runs of 128 bytes; x of 7680 bytes
    nbytes = 3 * 5 * 4 * 32 * 4
    for limit, rows in ((nbytes, False), (nbytes + 1, True)):
        monkeypatch.setattr(numba_cpu, "ROWS_LARGE_X_BYTES", limit)
        assert numba_cpu._as_rows(view, 4, False, None, backward=True, dweight=True) == rows
        assert not numba_cpu._as_rows(view, 4, False, None, backward=False, dweight=False)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NumPy on the NaN/inf given
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("layer_norm", [False, True])
def test_short_rows_as_vectors(monkeypatch, dtype, parallel, layer_norm):
    """Rows of 1 to SHORT_ROW_VALUES values go each as one masked vector (see "short rows" in numba_cpu): the
    forward's, in batches, and the backward's of more than SHORT_ROW_LOOP_BACKWARD_BYTES; a row of one value more
    takes the loops. y, dx, dweight and dbias within the reference's bounds and of its NaN/inf pattern (a NaN, an
    inf and a -inf in x, an inf in dy), every option in turn, for InstanceNorm's maps taken as rows (a weight a
    row: the lean loop) and LayerNorm's rows (the rows' loop), over batches and work items that end mid-batch
    (5161 rows: 64 items of 81 rows)."""
    monkeypatch.setattr(numba_cpu, "PARALLEL_MIN_ELEMENTS", 0 if parallel else 2**62)
    rng = np.random.default_rng(7)
    for L in range(1, numba_cpu.SHORT_ROW_VALUES + 2):
        view = (5161, 1, L, 1) if layer_norm else (397, 13, 1, L)
        x = (rng.standard_normal(view) * 3 + 5).astype(dtype)
        x.flat[rng.choice(x.size, 3, replace=False)] = [np.nan, np.inf, -np.inf]
        dy = rng.standard_normal(view).astype(dtype)
        dy.flat[rng.integers(dy.size)] = np.inf
        w, b = rng.standard_normal((2, *view[1:3])).astype(dtype)
        case = dict(
            x=x, dy=dy, weight=w, bias=b if L % 2 else None, reduce_batch=False, mask=None, centered=L % 3 != 1,
            eval_stats=L % 4 == 3, need_affine_grads=L % 5 != 2,
        )  # fmt: skip
        check_case(case)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NumPy on the NaN/inf given
@pytest.mark.parametrize("dtype, affine_dtype", [(np.float32,) * 2, (np.float64,) * 2, (np.float32, np.float64)])
def test_short_rows_in_blocks_are_the_rows_one_at_a_time(dtype, affine_dtype):
    """The forward takes short rows SHORT_ROW_VALUES at a time (``_short_block_forward``: their sums together, and
    their rstd and mean splits as vectors) where a work item holds that many, and the others one at a time: both must
    give the same bits. 1200 rows of 3 groups (64 work items of 19 rows: a block of 16, weight rows cycling across
    it, and 3 rows alone) against the same rows in calls of 63 rows (items of one row, none in a block); rows of a
    NaN, of infinities, of a mean 1e4 beside a spread of 1, constant; with and without bias and centering."""
    rng = np.random.default_rng(11)
    N, G = 400, 3
    for L in range(1, numba_cpu.SHORT_ROW_VALUES + 1):
        x = (rng.standard_normal((N, G, 1, L)) * 2 + 1).astype(dtype)
        x[1, 0, 0, 0], x[2, 2, 0, -1], x[3, 1, 0, 0], x[4, 0, 0, :] = np.nan, np.inf, -np.inf, 3.0
        x[5, 1] = (rng.standard_normal(L) + 1e4).astype(dtype).reshape(1, L)
        w, b = (rng.standard_normal((G, 1)).astype(affine_dtype) for _ in range(2))
        for bias, centered in ((b, True), (None, True), (b, False)):
            together = numba_cpu.norm_forward(x, w, bias, EPS, centered=centered)
            for n0 in range(0, N, 21):
                alone = numba_cpu.norm_forward(x[n0 : n0 + 21], w, bias, EPS, centered=centered)
                for name, got, want in zip(("y", "mean", "var"), together, alone):
                    np.testing.assert_array_equal(got[n0 : n0 + 21], want, err_msg=f"{name} {L=} {n0=}")


@numba.njit
def _lean_rows_call(dy3, x3, mean2, rstd2, w2, use_mean, fixed, dx3, affine, pw, pb, blocks):
    """``_lean_rows`` over every row, as one item, its rows as vectors, in blocks or not."""
    N, G, _ = x3.shape
    scratch = np.empty(0, dx3.dtype)
    numba_cpu._lean_rows(
        dy3, x3, mean2, rstd2, w2, use_mean, fixed, dx3, affine, pw, pb, 0, N, 0, G, True, blocks, scratch, False
    )


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NumPy on the NaN/inf given
@pytest.mark.parametrize("affine_dtype", [np.float32, np.float64])
def test_short_rows_backward_in_blocks_are_the_rows_one_at_a_time(affine_dtype):
    """The lean rows' backward takes short rows SHORT_ROW_VALUES at a time (``_short_block_backward``: their sums
    together, their scalars as vectors) where its items hold that many groups, and the others one at a time: both
    must give the same bits, dx and the dweight/dbias partial rows. Rows of 37 groups (two blocks and 5 rows alone
    each n) against the same rows one at a time; NaN, infinities, a zero dy row, constant and 1e4-offset rows;
    dweight/dbias or not (then a weight per value), centered or not, given statistics. An infinite weight makes
    the item take its rows one at a time (its sums then give dy * inf = NaN where dy is 0): run through the
    backward, it must agree with the reference."""
    rng = np.random.default_rng(12)
    N, G = 40, 37
    for L in range(1, numba_cpu.SHORT_ROW_VALUES + 1):
        x = (rng.standard_normal((N, G, L)) * 2 + 1).astype(np.float32)
        dy = rng.standard_normal((N, G, L)).astype(np.float32)
        x[1, 0, 0], x[2, 2, -1], dy[3, 20, 0], x[4, 30, :], dy[6, 5] = np.nan, np.inf, -np.inf, 3.0, 0
        x[5, 1] = rng.standard_normal(L) + 1e4
        mean = x.mean(axis=2, dtype=np.float64)
        rstd = 1 / np.sqrt(x.var(axis=2, dtype=np.float64) + EPS)
        w_row = np.repeat(rng.standard_normal((G, 1)), L, axis=1).astype(affine_dtype)
        w_value = rng.standard_normal((G, L)).astype(affine_dtype)
        for use_mean, fixed in ((True, False), (False, False), (True, True)):
            for affine, w2 in ((True, w_row), (False, w_value)):
                results = []
                for blocks in (True, False):
                    dx = np.full_like(x, 7.0)
                    pw, pb = (np.zeros((G, 1 if affine else 0)) for _ in range(2))
                    _lean_rows_call(dy, x, mean, rstd, w2, use_mean, fixed, dx, affine, pw, pb, blocks)
                    results.append((dx, pw, pb))
                for name, got, want in zip(("dx", "dweight", "dbias"), *results):
                    where = f"{name} {L=} {use_mean=} {fixed=} {affine=}"
                    np.testing.assert_array_equal(got, want, err_msg=where)
    # through the backward, its items in blocks (items of 19 groups), and with an infinite weight (one item without);
    # dx into x or dy themselves (a block reads its rows before it writes them)
    x = (rng.standard_normal((1100, G, 1, 9)) * 2 + 1).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    dy[:, 30, 0, :2] = 0
    _, mean, var = numba_cpu.norm_forward(x, None, None, EPS)
    rstd = numba_cpu.rstd(var, EPS)
    for w in (rng.standard_normal((G, 1)).astype(affine_dtype), np.full((G, 1), np.inf, affine_dtype)):
        w[30] = np.inf
        got = numba_cpu.norm_backward(dy, x, mean, rstd, w)
        want = reference.norm_backward(dy, x, mean, rstd, w)
        for name, g, r in zip(("dx", "dweight", "dbias"), got, want):
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4, err_msg=name)
            np.testing.assert_array_equal(np.isnan(g), np.isnan(r), err_msg=name)
        x_out, dy_out = x.copy(), dy.copy()
        into_x = numba_cpu.norm_backward(dy, x_out, mean, rstd, w, out=x_out)
        into_dy = numba_cpu.norm_backward(dy_out, x, mean, rstd, w, out=dy_out)
        assert into_x[0] is x_out and into_dy[0] is dy_out
        for into in (into_x, into_dy):
            for g, r in zip(into, got):
                np.testing.assert_array_equal(g, r)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NumPy on the NaN/inf given
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("parallel", [False, True])
def test_short_rows_stream_to_the_same_bits(monkeypatch, dtype, parallel):
    """Short rows (at most SHORT_ROW_VALUES values: InstanceNorm's small maps taken as rows) stream their output
    where it is big (``SHORT_ROWS_STREAM``): the forward a batch of rows at a time through its scratch
    (``_forward_rows``), the lean rows' backward a block of SHORT_ROW_VALUES rows at a time (``_lean_rows``; float64
    rows and float32 rows of 13-16 values then take the blocks too, the same bits as their rows one at a time as
    vectors), each prefetching the rows ahead. Forced on for every size and block (and off), into ``out`` at a
    line's start and 5 values into one: the kernels are told to stream, and give the bits of the ordinary stores
    (y, mean, var, dx, dweight, dbias) for rows of 1-16 values with NaN, infinities and 1e4-offset rows among
    them, with and without dweight/dbias, on the serial and the parallel compile; the guard values around ``out``
    stay untouched. With SHORT_ROWS_STREAM off (Intel CPUs), they never stream."""
    told = record_kernel_calls(monkeypatch, streams=True)
    monkeypatch.setattr(numba_cpu, "PARALLEL_MIN_ELEMENTS", 0 if parallel else 2**62)
    monkeypatch.setattr(numba_cpu, "SHORT_ROWS_STREAM", True)  # (off on Intel CPUs, where it was not measured)
    rng = np.random.default_rng(42)
    N, G, guard = 1100, 37, 7.0  # (items of 19 groups on the backward: one block and 3 rows alone each n)
    for L in range(1, numba_cpu.SHORT_ROW_VALUES + 1):
        x = (rng.standard_normal((N, G, 1, L)) * 2 + 1).astype(dtype)
        x[1, 0, 0, 0], x[2, 2, 0, -1], x[5, 1] = np.nan, np.inf, rng.standard_normal((1, L)) + 1e4
        dy = rng.standard_normal(x.shape).astype(dtype)
        w, b = (rng.standard_normal((G, 1)).astype(dtype) for _ in range(2))
        for offset in (0, 5):
            results = {}
            for stream in (True, False):
                monkeypatch.setattr(numba_cpu, "STREAMING_STORE_MIN_BYTES", 0 if stream else 2**62)
                monkeypatch.setattr(numba_cpu, "STREAMING_STORE_MIN_BLOCK_BYTES", 0)
                bufs = [aligned_empty((x.size + 32,), dtype) for _ in range(2)]
                for buf in bufs:
                    buf[:] = guard
                y_out, dx_out = (buf[offset : offset + x.size].reshape(x.shape) for buf in bufs)
                told.clear()
                y, mean, var = numba_cpu.norm_forward(x, w, b, EPS, out=y_out)
                rstd = 1 / np.sqrt(var + EPS)
                grads = numba_cpu.norm_backward(dy, x, mean, rstd, w, out=dx_out)
                no_affine = numba_cpu.norm_backward(dy, x, mean, rstd, w, need_affine_grads=False, out=dx_out.copy())
                assert y is y_out and grads[0] is dx_out
                # (rows of one value are LayerNorm's rows of their own weights, which take the rows' loop)
                assert [name for name, _ in told[:2]] == [
                    "rows forward",
                    "lean rows backward" if L > 1 else "rows backward",
                ]
                assert [flag for _, flag in told] == [stream] * 3, (L, offset, told)
                for buf in bufs:
                    assert np.all(buf[:offset] == guard) and np.all(buf[offset + x.size :] == guard), (L, offset)
                results[stream] = (y.copy(), mean, var, *(g.copy() for g in grads), no_affine[0])
            for name, got, want in zip(
                ("y", "mean", "var", "dx", "dweight", "dbias", "dx, no affine"), *results.values()
            ):
                np.testing.assert_array_equal(got, want, err_msg=f"{name} {L=} {offset=}")
    # off (SHORT_ROWS_STREAM): short rows never stream, however big their output
    monkeypatch.setattr(numba_cpu, "SHORT_ROWS_STREAM", False)
    monkeypatch.setattr(numba_cpu, "STREAMING_STORE_MIN_BYTES", 0)
    told.clear()
    y, mean, var = numba_cpu.norm_forward(x, w, b, EPS, out=aligned_empty(x.shape, dtype))
    numba_cpu.norm_backward(dy, x, mean, 1 / np.sqrt(var + EPS), w, out=aligned_empty(x.shape, dtype))
    assert told == [("rows forward", False), ("lean rows backward", False)]


@numba.njit
def _short_row_calls(x, dy, w, b, y, dx, mu, r, proj, mdx, fixed):
    """Every short-row intrinsic on one row (a view into a padded buffer): its sums, and y and dx in place."""
    numba_cpu._short_normalize_row(x, y, w, b, True, mu, r)
    numba_cpu._short_dx_row(dy, x, dx, w, mu, r, proj, mdx, fixed)
    a, c = numba_cpu._short_row_dy_sums(dy, x, mu, r)
    d, e = numba_cpu._short_row_dx_sums(dy, x, w, mu, r)
    return numba_cpu._short_sum(x), numba_cpu._short_sum_sq_dev(x, mu), a, c, d, e


@numba.njit
def _loop_row_calls(x, dy, w, b, y, dx, mu, r, proj, mdx, fixed):
    """``_short_row_calls`` by the loops the intrinsics stand for."""
    numba_cpu._normalize_row(x, y, w, b, True, mu, r)
    numba_cpu._dx_row(dy, x, dx, w, mu, r, proj, mdx, fixed)
    a, c = numba_cpu._row_dy_sums(dy, x, mu, r)
    d, e = numba_cpu._row_dx_sums(dy, x, w, mu, r)
    return numba_cpu._sum(x), numba_cpu._sum_sq_dev(x, mu), a, c, d, e


@pytest.mark.parametrize("dtype, affine_dtype", [(np.float32,) * 2, (np.float64,) * 2, (np.float32, np.float64)])
def test_short_row_intrinsics_keep_to_their_row(dtype, affine_dtype):
    """Each short-row intrinsic reads and writes its row's values only: the inputs padded with NaN on both sides
    (read as a value, it would make a sum NaN), the outputs with 7 (kept wherever a store was masked). y and dx are
    the loops' to the bit (the same operations per value, float32 data with a float64 weight and bias too, whose
    products numba takes in float64: ``_affine2``), the sums theirs but for the order of addition."""
    rng = np.random.default_rng(3)
    pad = numba_cpu.SHORT_ROW_VALUES
    for L in range(1, numba_cpu.SHORT_ROW_VALUES + 1):
        inputs = []
        for t in (dtype, dtype, affine_dtype, affine_dtype):  # x, dy, w, b
            a = np.full(L + 2 * pad, np.nan, t)
            a[pad : pad + L] = rng.standard_normal(L) * 2 + 1
            inputs.append(a[pad : pad + L])
        x = inputs[0]
        mu, r = float(np.mean(x, dtype=np.float64)), 0.75
        for fixed in (False, True):
            results = []
            for calls in (_short_row_calls, _loop_row_calls):
                y, dx = (np.full(L + 2 * pad, 7.0, dtype) for _ in range(2))
                sums = calls(*inputs, y[pad : pad + L], dx[pad : pad + L], mu, r, 0.3, -0.2, fixed)
                for out in (y, dx):
                    assert np.all(out[:pad] == 7.0) and np.all(out[pad + L :] == 7.0), (L, "written past the row")
                results.append((y, dx, np.array(sums)))
            (y, dx, sums), (y_loop, dx_loop, sums_loop) = results
            np.testing.assert_array_equal(y, y_loop)
            np.testing.assert_array_equal(dx, dx_loop)
            assert np.all(np.isfinite(sums)), (L, sums)
            np.testing.assert_allclose(sums, sums_loop, rtol=1e-14, atol=1e-14 * L)


def _guarded(count: int, dtype) -> np.ndarray:
    """``count`` values of ``dtype`` that end where a page begins that may be neither read nor written."""
    page, itemsize = mmap.PAGESIZE, np.dtype(dtype).itemsize
    pages = -(-count * itemsize // page)
    memory = mmap.mmap(-1, (pages + 1) * page)
    start = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    libc = ctypes.CDLL(None, use_errno=True)
    prot_none = 0
    assert libc.mprotect(ctypes.c_void_p(start + pages * page), ctypes.c_size_t(page), prot_none) == 0
    return np.frombuffer(memory, dtype, count=count, offset=pages * page - count * itemsize)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mprotect through libc: Linux")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("parallel", [False, True])
def test_short_rows_touch_no_memory_past_the_array(monkeypatch, dtype, parallel):
    """The last short row's vector reaches past the end of x, dy, y and dx, into a page that faults when touched
    (a read or write there would end the process): its masked lanes must touch nothing. The results the
    reference's."""
    monkeypatch.setattr(numba_cpu, "PARALLEL_MIN_ELEMENTS", 0 if parallel else 2**62)
    rng = np.random.default_rng(5)
    # (1024 rows: 64 work items of SHORT_ROW_VALUES rows, each one block of ``_short_block_forward``, the last at the
    # page)
    for view in (v for L in (1, 5, 9, 15, 16) for v in ((7, 5, 1, L), (256, 4, 1, L))):
        x, dy, y, dx = (_guarded(int(np.prod(view)), dtype).reshape(view) for _ in range(4))
        x[...] = rng.standard_normal(view)
        dy[...] = rng.standard_normal(view)
        w = rng.standard_normal(view[1:3]).astype(dtype)
        assert numba_cpu.norm_forward(x, w, w, EPS, out=y)[0] is y
        _, mean, var = want = reference.norm_forward(x, w, w, EPS)
        rstd = 1 / np.sqrt(var + EPS)
        got = numba_cpu.norm_backward(dy, x, mean, rstd, w, out=dx)
        assert got[0] is dx
        case = dict(x=x, dy=dy, weight=w, bias=w, centered=True, reduce_batch=False, mask=None)
        bounds = float32_bounds(case, mean, var, False) if dtype == np.float32 else {}
        assert_close(y, want[0], dtype, "y", bounds.get("y"))
        for name, g, v in zip(("dx", "dweight", "dbias"), got, reference.norm_backward(dy, x, mean, rstd, w)):
            assert_close(g, v, dtype, name, bounds.get(name))


def test_instance_norm_rows_sum_their_terms_per_row_in_float64():
    """InstanceNorm's small maps taken as rows have one weight per row, so their dweight/dbias terms are summed per
    row in float64 (``_backward_rows``), not per position in float32 blocks of TERM_BLOCK_ROWS rows. Each block of
    8 rows here has one term of about 1 (the first row's first value) beside 15 of about 0.45 u: a float32 block
    sum would lose the 7 beside the 1 in its position, 3.15 u of every block's 1 + 6.8 u. In float64 the results
    are the reference's to its final rounding."""
    N, S = 4096, 2
    view = (N, 1, 1, S)
    assert numba_cpu._as_rows(view, 4, False, None, backward=True, dweight=True)
    x = np.tile(np.array([1.0, -1.0], dtype=np.float32), (N, 1)).reshape(view)  # xhat = +-1 (almost)
    dy = np.full(view, 0.45 * U32, dtype=np.float32)
    dy[::8, 0, 0, 0] = 1.0
    w = np.ones((1, 1), dtype=np.float32)
    _, mean, var = reference.norm_forward(x, w, None, EPS)
    rstd = 1.0 / np.sqrt(var + EPS)
    got = numba_cpu.norm_backward(dy, x, mean, rstd, w)
    want = reference.norm_backward(dy, x, mean, rstd, w)
    for name, g, v in (("dweight", got[1], want[1]), ("dbias", got[2], want[2])):
        assert abs(float(g[0, 0]) - v[0, 0]) <= 1.5 * U32 * abs(v[0, 0]), (name, g, v)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("eval_stats", [False, True])
@pytest.mark.parametrize(
    ("view", "need_affine_grads", "lean"),
    [
        ((70, 6, 1, 5), True, True),  # InstanceNorm's small maps: one weight, one dweight/dbias term, per row
        ((70, 1, 1, 5), True, True),  # ... of one channel: one group
        ((70, 6, 1, 5), False, "unless streamed"),  # no terms
        ((70, 3, 2, 4), False, "unless streamed"),  # GroupNorm's small maps, without terms
        ((70, 3, 2, 5), False, True),  # ... short rows (40 bytes: as vectors), even where streamed
        ((70, 3, 2, 5), True, False),  # ... with a term per value
        ((70, 1, 8, 1), False, False),  # LayerNorm's rows, one group, have a compile of their own
        ((70, 1, 8, 1), True, False),
    ],
)
def test_rows_of_one_weight_take_the_lean_loop(monkeypatch, view, need_affine_grads, lean, stream, eval_stats):
    """Rows with one dweight/dbias term each go through ``_backward_rows_lean``, which the general rows' loop,
    whose partial rows hold a term per value, must never be given in their place: a partial row of one value
    folded as one of L would be written past its end. They go there even where dx would stream (forced here for
    every size): the lean loop streams only blocks of short rows (``test_short_rows_stream_to_the_same_bits``), and
    longer rows of one weight never are where dx is big enough. Rows of several
    groups without terms take the lean loop unless dx streams and they are not short (``_short_backward_rows``: the
    lean loop's vectors, whose sums the rows' loop does not make); LayerNorm's never. Each result the reference's, and
    the streamed calls' (or the lean loop's) bits the same as the others' where the loop differs."""
    called = record_kernel_calls(monkeypatch)
    monkeypatch.setattr(numba_cpu, "STREAMING_STORE_MIN_BYTES", 0 if stream else 2**62)
    monkeypatch.setattr(numba_cpu, "STREAMING_STORE_MIN_BLOCK_BYTES", 0)
    rng = np.random.default_rng(12)
    x = (rng.standard_normal(view) * 2 + 3).astype(np.float32)
    dy = rng.standard_normal(view).astype(np.float32)
    w = rng.standard_normal(view[1:3]).astype(np.float32)
    w.reshape(-1)[0] = np.inf  # the lean loop's own case of an infinite weight
    _, mean, var = reference.norm_forward(x, w, None, EPS)
    rstd = 1 / np.sqrt(var + EPS)
    opts = dict(fixed_stats=eval_stats, need_affine_grads=need_affine_grads)
    with np.errstate(invalid="ignore"):
        want = reference.norm_backward(dy, x, mean, rstd, w, **opts)
    got = numba_cpu.norm_backward(dy, x, mean, rstd, w, out=aligned_empty(view, np.float32), **opts)
    expected = lean if lean != "unless streamed" else not stream
    assert called == ["lean rows backward" if expected else "rows backward"]
    for name, g, v in zip(("dx", "dweight", "dbias"), got, want):
        if v is None:
            assert g is None
            continue
        assert np.array_equal(np.isnan(g), np.isnan(v)) and np.array_equal(np.isinf(g), np.isinf(v)), name
        finite = np.isfinite(v)
        assert_close(g[finite], v[finite], np.float32, name)
    monkeypatch.setattr(numba_cpu, "STREAMING_STORE_MIN_BYTES", 2**62 if stream else 0)
    other = numba_cpu.norm_backward(dy, x, mean, rstd, w, out=aligned_empty(view, np.float32), **opts)
    for g, o in zip(got, other):
        np.testing.assert_array_equal(g, o)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NumPy on the NaN/inf given
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("pieces, N", [(3.1, 1), (2.1, 9), (0.2, 63), (130.5, 1)])
@pytest.mark.parametrize(
    "option", ["plain", "not centered", "eval stats", "no affine", "non-finite", "parallel", "parallel, no affine"]
)
def test_few_layer_norm_rows_go_in_column_pieces(monkeypatch, dtype, pieces, N, option):
    """Fewer than 64 rows of one group (one chunk of rows, ``_n_chunks``) with dweight/dbias take
    ``_backward_few_rows_kernel``: each row's sums piece by piece, then dx and dweight/dbias piece by piece through
    every row. Without them, the rows' loop, a chunk a row (no partial rows to keep few), but for one row alone of a
    parallel size, which would go on one thread there and takes the pieces, dx only. One row of 3 pieces and
    a ragged end, 9 rows (two blocks of TERM_BLOCK_ROWS terms) of 2 pieces and a ragged end, 63 rows shorter than a
    piece, one row of 131 pieces (two or three to a work item, each starting from terms of 0): the reference's
    values within the bounds, NaN/inf where it has them, on the serial and the parallel
    compile, with computed and given statistics, centered or not (RMSNorm), with and without dweight/dbias."""
    called = record_kernel_calls(monkeypatch)
    if option.startswith("parallel"):
        monkeypatch.setattr(numba_cpu, "PARALLEL_MIN_ELEMENTS", 0)
    rng = np.random.default_rng(N)
    L = int(pieces * numba_cpu.ROW_PIECE_BYTES // np.dtype(dtype).itemsize)
    x = (rng.standard_normal((N, 1, L, 1)) * 2 + 3).astype(dtype)
    if option == "non-finite":
        x = _with_non_finite(x, rng)
    w = rng.standard_normal((1, L)).astype(dtype)
    case = dict(
        x=x, dy=rng.standard_normal(x.shape).astype(dtype), weight=w, bias=w[:, ::-1] * 0.5, reduce_batch=False,
        mask=None, centered=option != "not centered", eval_stats=option == "eval stats",
        need_affine_grads=not option.endswith("no affine"),
    )  # fmt: skip
    check_case(case)
    in_pieces = case["need_affine_grads"] or N == 1 and L >= numba_cpu.PARALLEL_MIN_ELEMENTS
    kernel = "few rows backward" if in_pieces else "rows backward"
    assert [name for name in called if "backward" in name] == [kernel] * 2  # (computed, then fixed statistics)
    assert numba_cpu._n_chunks(N, 1, 1, False, False, affine=case["need_affine_grads"]) == (
        1 if case["need_affine_grads"] else N
    )


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NumPy on the NaN/inf given
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("pieces, N, G", [(130.5, 1, 1), (64.1, 3, 1), (64.5, 1, 3), (64.0, 5, 1)])
@pytest.mark.parametrize("option", ["plain", "not centered", "bias only", "streamed", "non-finite", "serial"])
def test_long_rows_forward_in_pieces_gives_the_bits_of_whole_rows(monkeypatch, dtype, pieces, N, G, option):
    """The rows' forward by pieces (``_forward_by_pieces``: rows of ROW_PIECES_MIN_BYTES (64 pieces of
    ROW_PIECE_BYTES) or more, too few to keep the threads busy) takes each piece's sum and M2, merges them per row
    and normalizes the pieces on any thread; whole rows that long take their statistics from the same pieces,
    merged in the same order. Rows of 130.5 pieces (two or three runs of pieces to a work item), of 64.1 and 64.5
    (a ragged last piece; three groups of their own weights: GroupNorm's rows in (n, g) order), of exactly 64: the
    reference's values within the bounds, NaN/inf where it has them, and the same bits by pieces as by whole rows,
    on the parallel compile (and the serial: "serial"), centered or not (RMSNorm), with a bias and no weight, and
    streamed into ``out``."""
    called = record_kernel_calls(monkeypatch)
    # (these rows hold 2^18 values or more: either compile, whatever the size)
    monkeypatch.setattr(numba_cpu, "PARALLEL_MIN_ELEMENTS", 2**62 if option == "serial" else 0)
    if option == "streamed":
        monkeypatch.setattr(numba_cpu, "STREAMING_STORE_MIN_BYTES", 0)
    rng = np.random.default_rng(N * G)
    L = int(pieces * numba_cpu.ROW_PIECE_BYTES // np.dtype(dtype).itemsize)
    x = (rng.standard_normal((N, G, L, 1)) * 2 + 3).astype(dtype)
    if option == "non-finite":
        x = _with_non_finite(x, rng)
    w = rng.standard_normal((G, L)).astype(dtype)
    w, b = (None, w) if option == "bias only" else (w, w[:, ::-1] * 0.5)
    centered = option != "not centered"
    results = []
    for by_pieces in (True, False):
        monkeypatch.setattr(numba_cpu, "_forward_by_pieces", lambda *_, route=by_pieces: route)
        if by_pieces:
            case = dict(
                x=x, dy=np.ones_like(x), weight=w, bias=b, reduce_batch=False, mask=None, centered=centered,
                eval_stats=False, need_affine_grads=False,
            )  # fmt: skip
            fwd_numba, fwd_reference, _, bounds = run_both(case)[0]
            for name, got, want, bound in zip(("y", "mean", "var"), fwd_numba, fwd_reference, bounds):
                assert_close(got, want, dtype, f"forward {name}", bound)
        out = aligned_empty(x.shape, dtype) if option == "streamed" else None
        results.append(numba_cpu.norm_forward(x, w, b, EPS, centered=centered, out=out))
    assert [name for name in called if "forward" in name] == ["rows forward"] * 3
    for whole, by_pieces in zip(*results):
        np.testing.assert_array_equal(whole, by_pieces)


def test_rows_go_in_pieces_where_whole_rows_would_leave_a_thread_idle(monkeypatch):
    """``_forward_by_pieces``: on 2 threads, 1 and 3 long rows go in pieces (whole rows would keep the second thread
    idle half and a third of the time), 2, 4 and 5 whole (idle a fifth of the time: not above 1.2); never on one
    thread, on the serial compile (x under PARALLEL_MIN_ELEMENTS) or for rows under ROW_PIECES_MIN_BYTES."""
    previous = numba.get_num_threads()
    row = numba_cpu.ROW_PIECES_MIN_BYTES // 4  # float32 values: the shortest row in pieces
    big = numba_cpu.PARALLEL_MIN_ELEMENTS
    try:
        if numba.config.NUMBA_NUM_THREADS >= 2:
            numba.set_num_threads(2)
            routes = [numba_cpu._forward_by_pieces(rows, row, 4, big) for rows in range(1, 6)]
            assert routes == [True, False, True, False, False]
            assert not numba_cpu._forward_by_pieces(1, row, 4, big - 1)
            assert not numba_cpu._forward_by_pieces(1, row - 1, 4, big)
            assert numba_cpu._forward_by_pieces(1, row // 2, 8, big)
        numba.set_num_threads(1)
        assert not numba_cpu._forward_by_pieces(1, row, 4, big)
    finally:
        numba.set_num_threads(previous)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_many_layer_norm_rows_per_chunk(dtype):
    """3000 rows, 47 per dweight/dbias chunk (the last chunk ragged): the partial sums over many rows."""
    rng = np.random.default_rng(8)
    x = (3.0 + rng.standard_normal((3000, 1, 37, 1))).astype(dtype)
    w = rng.standard_normal((1, 37)).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    case = dict(x=x, dy=dy, weight=w, bias=w[:, ::-1].copy(), reduce_batch=False, mask=None, eval_stats=False)
    for centered in (True, False):
        check_case({**case, "centered": centered, "need_affine_grads": True})


@pytest.mark.parametrize(("N", "term", "tightness"), [(16384, 0.45, 20), (16, 0.99, 14)])
def test_float32_row_terms_are_summed_in_blocks_of_term_block_rows(N, term, tightness):
    """A row's dweight/dbias terms are summed in float32 over blocks of TERM_BLOCK_ROWS = 8 rows only. Column 0
    has one term of about 1 and then N - 1 of ``term`` u: in one float32 sum each small term (under half an ulp of
    1) would vanish next to the 1. In blocks of 8 only the 7 beside the 1 vanish. 16384 rows of 0.45 u, in chunks
    of 256: a chunk summed whole would lose 255 * 0.45 u = 115 u, far past the bound (16 u here). 16 rows of
    0.99 u, one chunk: in blocks of 8, 6.9 u off, within the bound of (8 + 2) u; in blocks of 16, 14.9 u, past it
    (which 0.45 u terms cannot tell)."""
    x = np.tile(np.array([1.0, -1.0], dtype=np.float32), (N, 1)).reshape(N, 1, 2, 1)  # xhat = +-1 (almost)
    dy = np.full(x.shape, term * U32, dtype=np.float32)
    dy[0] = 1.0
    w = np.ones((1, 2), dtype=np.float32)
    _, mean, var = reference.norm_forward(x, w, None, EPS)
    rstd = 1.0 / np.sqrt(var + EPS)
    got = numba_cpu.norm_backward(dy, x, mean, rstd, w)
    want = reference.norm_backward(dy, x, mean, rstd, w)
    assert numba_cpu._n_chunks(N, 1, 1, False, False) == max(1, N // 256) and numba_cpu.TERM_BLOCK_ROWS == 8
    bounds = float32_bounds(
        dict(x=x, dy=dy, weight=w, bias=None, mask=None, centered=True, reduce_batch=False), mean, var, False
    )
    assert_close(got[1], want[1], np.float32, "dweight", bounds["dweight"])
    assert_close(got[2], want[2], np.float32, "dbias", bounds["dbias"])
    assert bounds["dbias"][0, 0] < tightness * U32 * want[2][0, 0]  # the bound is tight enough to tell


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batch_norm_by_columns_merges_no_empty_chunk(dtype):
    """BatchNorm1d's columns kernels take the batch in row chunks whose moments are merged by Chan's update
    (``_fold_moments``). An empty chunk (N = 1001: 62 chunks of 17 rows, the last 3 empty) or a chunk whose rows
    are all masked out, merged after one with rows, would be 0/0: NaN statistics. Both equal the reference."""
    rng = np.random.default_rng(0)
    N = 1001
    chunks = numba_cpu._column_chunks(N)
    assert (chunks - 1) * -(-N // chunks) >= N  # (rows per chunk rounded up: the last chunk starts past row N)
    batch = rng.standard_normal((N, 3, 1, 1)).astype(dtype)
    middle_masked = np.ones((48, 1), bool)
    middle_masked[16:32] = False  # (48 rows: 3 chunks of 16, the second all masked)
    for x, mask in ((batch, None), (batch[:48], middle_masked)):
        got, want = (m.norm_forward(x, None, None, EPS, reduce_batch=True, mask=mask) for m in (numba_cpu, reference))
        assert numba_cpu._by_columns(x.shape, x.itemsize, True, mask)
        for name, g, w_ in zip(("y", "mean", "var"), got, want):
            assert np.isfinite(g).all(), name
            assert_close(g, w_, dtype, name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_parallel_path_equals_reference_and_serial(monkeypatch, dtype):
    """The parallel compile (used above PARALLEL_MIN_ELEMENTS) gives the serial compile's bits."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 3, 4, 5)).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    w = rng.standard_normal((3, 4)).astype(dtype)
    b = rng.standard_normal((3, 4)).astype(dtype)
    for reduce_batch in (False, True):
        results = []
        for threshold in (10**9, 0):  # serial, then parallel
            monkeypatch.setattr(numba_cpu, "PARALLEL_MIN_ELEMENTS", threshold)
            y, mean, var = numba_cpu.norm_forward(x, w, b, EPS, reduce_batch=reduce_batch)
            grads = numba_cpu.norm_backward(dy, x, mean, 1 / np.sqrt(var + EPS), w, reduce_batch=reduce_batch)
            results.append((y, mean, var, *grads))
        for serial, parallel in zip(*results):
            np.testing.assert_array_equal(serial, parallel)
        want_y = reference.norm_forward(x, w, b, EPS, reduce_batch=reduce_batch)[0]
        assert_close(results[1][0], want_y, dtype, "parallel forward")


@given(
    st.one_of(
        cases(),
        cases(max_side=3, long_rows=True),
        cases(max_side=3, long_rows=True).map(as_layer_norm_rows),
        cases(max_side=40, short_run_batch_norm=True),
    ),
    st.integers(0, 17),
    st.booleans(),
    st.booleans(),
)
def test_streaming_stores_change_no_bit_and_stay_inside_out(case, offset, parallel, non_finite):
    """Streaming (non-temporal) stores change how y and dx reach memory, never their values: forced
    on for every size and block length, with ``out`` at every alignment (``offset`` elements into a
    buffer), on the serial and the parallel compile, with NaN/inf in x or not, they give the bits of
    the ordinary stores, and leave the guard values around ``out`` untouched. Long groups and long
    LayerNorm rows (hundreds or thousands of values) are streamed in pieces (``_scratch_len``), short-run
    BatchNorm's rows (the columns kernels) whole. The forward with given statistics (eval mode) too:
    streamed, BatchNorm's blocks go in memory order rather than channel by channel, to the same bits."""
    x = case["x"]
    if non_finite and x.size >= 3:
        x = _with_non_finite(x, np.random.default_rng(offset))
    dy, w, b = case["dy"], case["weight"], case["bias"]
    opts = dict(centered=case["centered"], reduce_batch=case["reduce_batch"], mask=case["mask"])
    guard = 7.0

    def run(stream: bool) -> tuple[list, list]:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(numba_cpu, "STREAMING_STORE_MIN_BYTES", 0 if stream else 2**62)
            mp.setattr(numba_cpu, "STREAMING_STORE_MIN_BLOCK_BYTES", 0)
            mp.setattr(numba_cpu, "PARALLEL_MIN_ELEMENTS", 0 if parallel else 2**62)
            bufs = [np.full(x.size + 40, guard, dtype=x.dtype) for _ in range(3)]
            y_out, dx_out, y_eval_out = (buf[offset : offset + x.size].reshape(x.shape) for buf in bufs)
            y, mean, var = numba_cpu.norm_forward(x, w, b, EPS, out=y_out, **opts)
            rstd = 1 / np.sqrt(var + EPS)
            grads = numba_cpu.norm_backward(
                dy, x, mean, rstd, w, need_affine_grads=case["need_affine_grads"], out=dx_out, **opts
            )
            y_eval = numba_cpu.norm_forward(x, w, b, EPS, stats=(mean, var), out=y_eval_out, **opts)[0]
            assert y is y_out and grads[0] is dx_out and y_eval is y_eval_out  # in place, at the drawn alignment
            guards = [part for buf in bufs for part in (buf[:offset], buf[offset + x.size :])]
            return [y, mean, var, *grads, y_eval], guards

    streamed, guards = run(True)
    ordinary, _ = run(False)
    for got, want in zip(streamed, ordinary):
        np.testing.assert_array_equal(got, want)
    for part in guards:
        assert np.all(part == guard)


@given(
    st.one_of(cases(), cases(max_side=3, long_rows=True)).map(lambda case: {**case, "reduce_batch": True}),
    st.booleans(),
    st.booleans(),
)
def test_eval_batch_norm_streamed_goes_in_memory_order_to_the_same_bits(case, parallel, non_finite):
    """BatchNorm's forward with given statistics (eval mode), when its output streams, normalizes the (n, c)
    blocks in memory order, each with its channel's statistics, instead of channel by channel: the same bits
    as the channel walk (streaming off), for every block shape, mask and affine option, NaN/inf included,
    and within the float32 bound of the reference."""
    x = case["x"]
    G = x.shape[1]
    rng = np.random.default_rng(G)
    mean = np.asarray(x, np.float64).mean(axis=(0, 2, 3)) + rng.standard_normal(G)
    if non_finite and x.size >= 3:
        x = _with_non_finite(x, np.random.default_rng(x.size))
    w, b, mask = case["weight"], case["bias"], case["mask"]
    var = rng.random(G) + 0.5
    opts = dict(centered=case["centered"], reduce_batch=True, mask=mask, stats=(mean, var))

    def forward(stream: bool) -> np.ndarray:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(numba_cpu, "STREAMING_STORE_MIN_BYTES", 0 if stream else 2**62)
            mp.setattr(numba_cpu, "STREAMING_STORE_MIN_BLOCK_BYTES", 0)
            mp.setattr(numba_cpu, "PARALLEL_MIN_ELEMENTS", 0 if parallel else 2**62)
            return numba_cpu.norm_forward(x, w, b, EPS, out=np.empty(x.shape, x.dtype), **opts)[0]

    in_memory_order = forward(True)
    np.testing.assert_array_equal(in_memory_order, forward(False))
    want = reference.norm_forward(x, w, b, EPS, **opts)[0]
    bound = float32_bounds({**case, "x": x}, mean, var, fixed=True)["y"] if x.dtype == np.float32 else None
    assert_close(in_memory_order, want, x.dtype.type, "eval forward", bound)


@given(cases(), st.booleans())
def test_pooled_outputs_are_the_same_bits_and_never_alias_a_live_array(case, stream):
    """Outputs the kernels allocate (y, the statistics, dx) come from ``buffers.POOL``. With a pool that
    takes every size (and streaming stores forced on or off), a first call's results, kept alive, are
    not overwritten by a second call; they equal the results written into plain ``out=`` arrays bit
    for bit; and once they are dropped, a third call takes no new memory (its outputs from the buffers of the
    first call's, or of the calls' temporaries, which the pool hands out too: any free buffer of the size)."""
    x, dy, w, b = case["x"], case["dy"], case["weight"], case["bias"]
    opts = dict(centered=case["centered"], reduce_batch=case["reduce_batch"], mask=case["mask"])

    def call(**out) -> list[np.ndarray]:
        y, mean, var = numba_cpu.norm_forward(x, w, b, EPS, out=out.get("y"), **opts)
        rstd = 1 / np.sqrt(var + EPS)
        grads = numba_cpu.norm_backward(dy, x, mean, rstd, w, out=out.get("dx"), **opts)
        return [y, mean, var, *grads]

    want = call(y=np.empty(x.shape, x.dtype), dx=np.empty(x.shape, x.dtype))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu, "POOL", BufferPool(capacity=2**24, min_bytes=1))
        mp.setattr(numba_cpu, "STREAMING_STORE_MIN_BYTES", 0 if stream else 2**62)
        mp.setattr(numba_cpu, "STREAMING_STORE_MIN_BLOCK_BYTES", 0)
        first = call()
        assert all(numba_cpu.POOL.owns(a) for a in first[:4])  # y, mean, var, dx
        second = call()
        assert not any(np.shares_memory(a, b) for a, b in zip(first[:4], second[:4]))
        for got in (first, second):
            for g, w_ in zip(got, want):
                np.testing.assert_array_equal(g, w_)
        del first
        held = numba_cpu.POOL.cached_bytes
        third = call()
        assert numba_cpu.POOL.cached_bytes == held and all(numba_cpu.POOL.owns(a) for a in third[:4])
        for g, w_ in zip(third, want):
            np.testing.assert_array_equal(g, w_)


def test_streaming_is_chosen_for_big_outputs_in_long_or_aligned_blocks():
    """The policy of ``_streams`` (measured in its docstring): streaming stores for a big ``out=`` or pool
    buffer, in blocks that are long, or (backward) whole cache lines; never for small outputs, short
    blocks that start inside a line or come from the forward, or a plain array the kernel allocated."""
    streams = numba_cpu._streams
    big = numba_cpu.STREAMING_STORE_MIN_BYTES // 4  # float32 values
    raw = aligned_empty((big + 16,), np.float32)  # pages are never touched: nothing is written here
    aligned, inside_a_line = raw[:big], raw[4 : big + 4]
    row = numba_cpu.STREAMING_STORE_MIN_ALIGNED_BLOCK_BYTES // 4
    long_row = numba_cpu.STREAMING_STORE_MIN_BLOCK_BYTES // 4
    assert streams(aligned, aligned, row, short_aligned_blocks=True)
    assert not streams(aligned, aligned, row, short_aligned_blocks=False)
    assert not streams(aligned, aligned, row // 2, short_aligned_blocks=True)  # too short, even aligned
    assert not streams(aligned, aligned, row + 4, short_aligned_blocks=True)  # rows start inside lines
    assert not streams(inside_a_line, inside_a_line, row, short_aligned_blocks=True)
    for short_aligned_blocks in (False, True):
        assert streams(aligned, aligned, long_row, short_aligned_blocks)
        assert streams(inside_a_line, inside_a_line, long_row, short_aligned_blocks)
        assert not streams(aligned[:-16], aligned[:-16], long_row, short_aligned_blocks)  # below the size threshold
        assert not streams(aligned, None, long_row, short_aligned_blocks)  # not out=, not the pool's
    pool = BufferPool(capacity=2 * numba_cpu.STREAMING_STORE_MIN_BYTES)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numba_cpu, "POOL", pool)
        pooled = pool.empty((big,), np.float32)
        assert streams(pooled, None, row, short_aligned_blocks=True)
        # a pool temporary for an out= the kernel cannot write into is read back at once: not streamed
        assert not streams(pooled, np.empty(0, np.float32), long_row, short_aligned_blocks=True)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "view, reduce_batch",
    [((70, 1, 256, 1), False), ((4, 3, 2, 50), False), ((8, 3, 1, 400), True), ((40, 600, 1, 1), True)],
)
def test_kernels_free_every_allocation_they_make(monkeypatch, view, reduce_batch, stream):
    """numba's runtime counts its allocations: after repeated calls, every one made (scratch rows) has been
    freed exactly once, on both compiles, streaming or not (the loops work on ``_borrowed`` arrays,
    which must neither keep memory alive nor release it)."""
    from numba.core.runtime import _nrt_python, rtsys

    monkeypatch.setattr(numba_cpu, "STREAMING_STORE_MIN_BYTES", 0 if stream else 2**62)
    monkeypatch.setattr(numba_cpu, "STREAMING_STORE_MIN_BLOCK_BYTES", 0)
    rng = np.random.default_rng(5)
    x = rng.standard_normal(view).astype(np.float32)
    w = rng.standard_normal(view[1:3]).astype(np.float32)
    y, dx = np.empty_like(x), np.empty_like(x)
    for parallel in (False, True):
        monkeypatch.setattr(numba_cpu, "PARALLEL_MIN_ELEMENTS", 0 if parallel else 2**62)

        def call() -> None:
            _, mean, var = numba_cpu.norm_forward(x, w, w, EPS, reduce_batch=reduce_batch, out=y)
            numba_cpu.norm_backward(x, x, mean, 1 / np.sqrt(var + EPS), w, reduce_batch=reduce_batch, out=dx)

        call()  # compiled before counting
        _nrt_python.memsys_enable_stats()
        try:
            before = rtsys.get_allocation_stats()
            for _ in range(5):
                call()
            after = rtsys.get_allocation_stats()
        finally:
            _nrt_python.memsys_disable_stats()
        allocs, frees = after.alloc - before.alloc, after.free - before.free
        assert allocs > 0 and allocs == frees
        assert after.mi_alloc - before.mi_alloc == after.mi_free - before.mi_free


@pytest.mark.parametrize(
    "shape, reduce_batch",
    [
        ((4096, 1, 64, 1), False),
        ((4096, 3, 8, 3), False),
        ((40, 64, 2, 60), False),
        ((8, 16, 2, 2100), False),
        ((4096, 64, 1, 1), True),
        ((300, 40, 1, 24), True),
        ((1001, 1, 100, 1), False),
        ((1001, 7, 1, 1), True),
        ((9, 1, 70001, 1), False),
        ((3, 1, 262147, 1), False),
        ((1, 1, 70001, 1), False),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("option", ["weight", "mask", "eval stats", "bias only"])
def test_bit_identical_across_thread_counts(monkeypatch, shape, reduce_batch, dtype, option):
    """dweight/dbias go through fixed per-chunk partial sums (and BatchNorm's statistics in short runs, the
    columns kernels', too): 1 thread and all threads agree bit for bit. The second and third views are blocks
    of short runs taken as rows (``_as_rows``), the backward's items all three groups of 64 chunks, or two
    groups of 2 chunks; the last two end in uneven chunks (LayerNorm's rows: 30 chunks of 33 rows and one of 11; the
    columns': 58 chunks of 17 rows, one of 15 and three empty); the one after them, 9 long rows, goes in 18 or 35
    column pieces (float32, float64), the last ragged (``_backward_few_rows_kernel``); 3 rows of 1 MiB or more, whose
    forward goes in pieces on 2 threads and in whole rows on one (``_forward_by_pieces``); one long row, whose
    backward without dweight/dbias ("bias only") goes in pieces too. In float64 too, whose
    dweight/dbias keep every bit of the float64 partial sums (rounded to float32, other partial sums mostly give
    the same bits); with a mask, with given (eval) statistics and the fixed-statistics backward, and with a bias but
    no weight (no affine gradients)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal(shape[1:3]).astype(dtype)
    b = mask = stats = None
    N, G, _, S = shape
    if option == "mask":
        mask = rng.random((N, S)) < 0.7
        mask[0, 0] = True
    elif option == "eval stats":
        stat_shape = (G,) if reduce_batch else (N, G)
        stats = (rng.standard_normal(stat_shape), rng.random(stat_shape) + 0.5)
    elif option == "bias only":
        w, b = None, w
    opts = dict(reduce_batch=reduce_batch, mask=mask)
    monkeypatch.setattr(numba_cpu, "PARALLEL_MIN_ELEMENTS", 0)  # the parallel compile, whatever the size
    results = []
    previous = numba.get_num_threads()
    try:
        for threads in (1, numba.config.NUMBA_NUM_THREADS):
            numba.set_num_threads(threads)
            y, mean, var = numba_cpu.norm_forward(x, w, b, EPS, stats=stats, **opts)
            rstd = 1 / np.sqrt(var + EPS)
            grads = numba_cpu.norm_backward(dy, x, mean, rstd, w, fixed_stats=stats is not None, **opts)
            results.append((y, mean, var, *grads))
    finally:
        numba.set_num_threads(previous)
    for one, many in zip(*results):
        np.testing.assert_array_equal(one, many)


def _with_non_finite(a: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    a = a.copy()
    flat = a.reshape(-1)
    idx = rng.choice(flat.size, size=3, replace=False)
    flat[idx] = [np.nan, np.inf, -np.inf]
    return a


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NumPy on the NaN/inf given
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduce_batch", [False, True])
@pytest.mark.parametrize("where", ["x", "dy", "weight"])
@pytest.mark.parametrize("shape", [(5, 4, 3, 7), (40, 4, 1, 7), (6, 3, 1, 600), (4, 2, 3, 600)])
def test_nan_inf_propagate_like_the_reference(dtype, reduce_batch, where, shape):
    """NaN and +-inf in the input give the reference's NaN/inf pattern in every output and gradient,
    with computed statistics and with given (eval) statistics, so no fastmath flag broke them, and no
    sum over a run of one weight taken as the weight times sum(dy) hid the NaN of inf * dy. (With
    ``reduce_batch`` the second view, short runs, takes the columns kernels; the first two views go as rows
    without it, the last two as blocks: InstanceNorm's of one run, GroupNorm's of several, BatchNorm's channels
    in pairs.)"""
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal(shape[1:3]).astype(dtype)
    b = rng.standard_normal(shape[1:3]).astype(dtype)
    if where == "x":
        x = _with_non_finite(x, rng)
    elif where == "dy":
        dy = _with_non_finite(dy, rng)
    else:
        w = _with_non_finite(w, rng)
    case = dict(x=x, dy=dy, weight=w, bias=b, reduce_batch=reduce_batch, mask=None, need_affine_grads=True)
    for centered in (True, False):
        for eval_stats in (False, True):
            check_case({**case, "centered": centered, "eval_stats": eval_stats})


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NumPy on the inf given
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduce_batch", [False, True])
@pytest.mark.parametrize("shape", [(6, 2, 3, 2), (6, 3, 1, 600), (4, 2, 3, 600)])
def test_an_infinite_weight_beside_masked_out_positions_follows_the_reference(dtype, reduce_batch, shape):
    """A masked-out position is no term of any sum: not dy * w = 0 * inf = NaN where the weight is infinite,
    which made NaN of every dx of its group where the reference has +-inf (a group with one valid value of an
    infinite weight's run)."""
    rng = np.random.default_rng(4)
    x, dy = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    w = rng.standard_normal(shape[1:3]).astype(dtype)
    w[0, 0] = np.inf
    mask = rng.random((shape[0], shape[3])) < 0.5
    mask[:, 0] = True  # every block has a valid value
    if shape[3] == 2:
        mask[:, 1] = False  # and one valid value per run: the group's sums are +-inf, not NaN
    case = dict(x=x, dy=dy, weight=w, bias=None, reduce_batch=reduce_batch, mask=mask, need_affine_grads=True)
    check_case({**case, "centered": True, "eval_stats": False})


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NumPy on the NaN/inf given
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduce_batch", [False, True])
@pytest.mark.parametrize("means", ["infinite", 1e39, -1e39])
@pytest.mark.parametrize("view", [(2, 3, 4, 5), (2, 3, 1, 5)])
def test_given_infinite_or_huge_means_follow_the_reference(dtype, reduce_batch, means, view):
    """Given statistics with a mean of +inf and -inf (a finite variance), or a float64 mean of 1e39 or of -1e39,
    beyond float32's range: y and the fixed-statistics gradients have the reference's values and infinities.
    (An infinite mean has no float32 rounding error to carry; +-1e39 has no float32 value at all, and a
    float32 call with it goes to the reference: each alone, since either sends the whole call there.)"""
    rng = np.random.default_rng(3)
    x, dy = (rng.standard_normal(view).astype(dtype) for _ in range(2))
    w, b = (rng.standard_normal(view[1:3]).astype(dtype) for _ in range(2))
    mean, var = np.zeros((3,) if reduce_batch else (2, 3)), np.ones((3,) if reduce_batch else (2, 3))
    if means == "infinite":
        mean.flat[:2] = np.inf, -np.inf
    else:  # (x - mean about -+1e39: y about -+100 w + b)
        mean.flat[0], var.flat[0] = means, 1e74
    rstd = 1.0 / np.sqrt(var + EPS)
    opts = dict(reduce_batch=reduce_batch)
    got, want = (
        (
            mod.norm_forward(x, w, b, EPS, stats=(mean, var), **opts)[0],
            *mod.norm_backward(dy, x, mean, rstd, w, fixed_stats=True, **opts),
        )
        for mod in (numba_cpu, reference)
    )
    assert np.isinf(want[0]).any() == (means == "infinite")
    for name, g, w_ in zip(("y", "dx", "dweight", "dbias"), got, want):
        assert_close(g, w_, dtype, name)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the reference's inf * 0
def test_infinite_weight_of_a_channel_walked_in_pairs_gives_the_references_nan():
    """BatchNorm's channel walk takes its blocks' sums in pairs (``_backward_sums_pair``), over a run of one weight
    as w * sum(dy) and w * sum(dy * xhat) (two sums a value, not four), but only for a finite w: with w = inf the
    reference's sums of inf * dy over values of both signs are NaN, and so is every dx of the channel, where
    inf * sum(dy) would be +-inf. Here each block's sum(dy) and sum(dy * xhat) have one sign, dy values both."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 2, 1, 600))  # N = 2: one pair of blocks a channel; runs of 600 values
    dy = 0.3 + 0.5 * x + rng.standard_normal(x.shape)
    w = np.array([[np.inf], [1.0]])
    _, mean, var = reference.norm_forward(x, w, None, EPS, reduce_batch=True)
    rstd = 1.0 / np.sqrt(var + EPS)
    got, want = (m.norm_backward(dy, x, mean, rstd, w, reduce_batch=True) for m in (numba_cpu, reference))
    assert np.isnan(want[0][:, 0]).all()
    for name, g, w_ in zip(("dx", "dweight", "dbias"), got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w_), err_msg=name)
        np.testing.assert_array_equal(np.isposinf(g), np.isposinf(w_), err_msg=name)
        np.testing.assert_array_equal(np.isneginf(g), np.isneginf(w_), err_msg=name)
    assert_close(got[0][:, 1], want[0][:, 1], np.float64, "dx of the finite channel")


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # the reference's y to float32
def test_float64_weight_float32_cannot_hold_is_not_rounded_to_float32():
    """float32 data with a float64 weight of 1e39, which float32 cannot hold: the kernels take the weight in
    float64 (``_affine2``), as the reference does, and y = xhat * 1e39 is finite where |xhat| < 0.34 and inf
    beyond, as the reference's; a weight rounded to float32 (inf) would give +-inf everywhere."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 1, 5)).astype(np.float32)
    w = np.full((3, 1), 1e39)
    got, want = (m.norm_forward(x, w, None, EPS)[0] for m in (numba_cpu, reference))
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    assert finite.any() and not finite.all()
    np.testing.assert_allclose(got[finite], want[finite], rtol=8 * U32)


def test_fastmath_helpers_keep_nan_inf():
    """The reductions, the only code with a fastmath flag (reassoc), on the cancellation the issue warns about."""
    v = np.array([0.5, -np.inf, np.inf, 1.0])
    assert np.isnan(numba_cpu._sum(v))
    assert np.isnan(numba_cpu._sum_sq_dev(np.array([1.0, np.nan]), 0.0))
    assert numba_cpu._sum(np.array([np.inf, 1.0] * 20)) == np.inf


@pytest.mark.parametrize("fortran_out", [False, True])
def test_out_buffers_are_honoured(fortran_out):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 2, 4, 5))
    dy = rng.standard_normal(x.shape)
    w = rng.standard_normal((2, 4))
    make = np.asfortranarray if fortran_out else np.ascontiguousarray
    y_out, dx_out = make(np.full(x.shape, 7.0)), make(np.full(x.shape, 7.0))
    y, mean, var = numba_cpu.norm_forward(x, w, None, EPS, out=y_out)
    dx, dw, db = numba_cpu.norm_backward(dy, x, mean, 1 / np.sqrt(var + EPS), w, out=dx_out)
    assert y is y_out and dx is dx_out
    np.testing.assert_array_equal(y, numba_cpu.norm_forward(x, w, None, EPS)[0])
    np.testing.assert_array_equal(dx, numba_cpu.norm_backward(dy, x, mean, 1 / np.sqrt(var + EPS), w)[0])
    with pytest.raises(ValueError, match="norm_forward: out has shape"):
        numba_cpu.norm_forward(x, w, None, EPS, out=np.empty((3, 2, 4, 4)))


def test_inputs_are_not_mutated():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 2, 4, 5)).astype(np.float32)
    dy, w, b = rng.standard_normal(x.shape).astype(np.float32), np.ones((2, 4), np.float32), np.zeros((2, 4))
    mask = rng.random((3, 5)) < 0.5
    mean, var = rng.standard_normal((2,)), rng.random((2,))
    before = [a.copy() for a in (x, dy, w, b, mask, mean, var)]
    numba_cpu.norm_forward(x, w, b, EPS, reduce_batch=True, mask=mask, stats=(mean, var))
    numba_cpu.norm_backward(dy, x, mean, var, w, reduce_batch=True, mask=mask)
    for a, original in zip((x, dy, w, b, mask, mean, var), before):
        np.testing.assert_array_equal(a, original)


def _relaid(a: np.ndarray | None, layout: str) -> np.ndarray | None:
    """``a``'s values as a view of another memory layout: reversed along an axis (a negative stride there), or stored
    with its first axis last, then transposed back (axes permuted in memory)."""
    if a is None:
        return None
    if layout == "transposed back":
        return np.moveaxis(np.ascontiguousarray(np.moveaxis(a, 0, -1)), -1, 0)
    axes = {"reversed first axis": (0,), "reversed second axis": (1,), "reversed every axis": tuple(range(a.ndim))}
    flip = tuple(axis for axis in axes[layout] if axis < a.ndim)
    return np.flip(np.ascontiguousarray(np.flip(a, flip)), flip) if flip else a


def _norm_outputs(mod, x, dy, w, b, mask, mean, var, reduce_batch) -> dict[str, np.ndarray | None]:
    """Forward (with computed, then given statistics) and backward (with computed, then fixed statistics), the
    backward with the statistics given (the oracle's), so that it is compared on its own."""
    opts = dict(reduce_batch=reduce_batch, mask=mask)
    y, m, v = mod.norm_forward(x, w, b, EPS, **opts)
    y_eval = mod.norm_forward(x, w, b, EPS, stats=(mean, var), **opts)[0]
    rstd = 1 / np.sqrt(var + EPS)
    out = {"y": y, "mean": m, "var": v, "y eval": y_eval}
    for fixed in (False, True):
        grads = mod.norm_backward(dy, x, mean, rstd, w, fixed_stats=fixed, **opts)
        out.update({f"{name} fixed={fixed}": g for name, g in zip(("dx", "dweight", "dbias"), grads)})
    return out


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the reference on a masked row
@pytest.mark.parametrize(
    "layout", ["reversed first axis", "reversed second axis", "reversed every axis", "transposed back"]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize(
    ("view", "reduce_batch"),
    [((7, 1, 40, 1), False), ((5, 3, 4, 40), False), ((6, 3, 1, 40), True), ((40, 6, 1, 1), True)],
    ids=["rows", "blocks", "channel of blocks", "columns"],
)
def test_negative_strides_and_transposed_views_give_the_contiguous_results(layout, dtype, masked, view, reduce_batch):
    """x, dy, the weight, the bias, the mask and the statistics as views with negative strides (reversed along an
    axis) or of a transposed array transposed back: the numba kernels give the bits they give on contiguous copies,
    and both backends the reference's results on those copies (to the module's bounds). A kernel that took such a
    view's memory for a C-contiguous array's would read the values in the wrong places, or past the array."""
    rng = np.random.default_rng(13)
    N, G, K, S = view
    x = (2.0 + rng.standard_normal(view)).astype(dtype)
    dy = rng.standard_normal(view).astype(dtype)
    w, b = (rng.standard_normal((G, K)).astype(dtype) for _ in range(2))
    mask = None
    if masked:
        mask = rng.random((N, S)) < 0.7
        mask[0] = True  # (every channel and every row of the first sample has valid values)
    _, mean, var = reference.norm_forward(x, w, b, EPS, reduce_batch=reduce_batch, mask=mask)
    contiguous = (x, dy, w, b, mask, mean, var)
    relaid = [_relaid(a, layout) for a in contiguous]
    for a, r in zip(contiguous, relaid):
        np.testing.assert_array_equal(r, a)
    assert any(not r.flags.c_contiguous for r in relaid if r is not None)  # (an axis of 1 relays nothing)
    want = _norm_outputs(reference, *contiguous, reduce_batch)
    case = dict(x=x, dy=dy, weight=w, bias=b, mask=mask, centered=True, reduce_batch=reduce_batch)
    bounds = {fixed: float32_bounds(case, mean, var, fixed) for fixed in (False, True)} if dtype == np.float32 else {}
    same_bits = _norm_outputs(numba_cpu, *contiguous, reduce_batch)
    for mod in (numba_cpu, reference):
        got = _norm_outputs(mod, *relaid, reduce_batch)
        for name, g in got.items():
            what = f"{mod.__name__}: {name}"
            if mod is numba_cpu:
                np.testing.assert_array_equal(g, same_bits[name], err_msg=what)
            # (y and dx to their float32 bounds, "y eval" too: given the same statistics; the rest to TOL)
            bound = bounds[name.endswith("fixed=True")].get(name.split()[0]) if bounds else None
            assert_close(g, want[name], dtype, what, bound)


@pytest.mark.parametrize("dy_dtype, w_dtype", [(np.float64, np.float32), (np.float32, np.float64)])
def test_mixed_dtypes_follow_the_reference(dy_dtype, w_dtype):
    """float32 x with float64 dy (computed in float64) or a float64 weight: dx in x's dtype, dweight and dbias in
    the weight's, like the reference. A float64 weight's dweight/dbias keep the bits of the float64 sums of the
    rows' three blocks of terms, not float32 values widened: few rows in a dtype other than their weight's take
    the rows' loop, not ``_backward_few_rows_kernel``, which writes them in x's dtype."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((20, 1, 6, 1)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(dy_dtype)
    w = rng.standard_normal((1, 6)).astype(w_dtype)
    _, mean, var = reference.norm_forward(x, w, None, EPS)
    rstd = 1 / np.sqrt(var + EPS)
    got = numba_cpu.norm_backward(dy, x, mean, rstd, w)
    for g, r in zip(got, reference.norm_backward(dy, x, mean, rstd, w)):
        assert g.dtype == r.dtype
        assert_close(g, r, np.float32, "mixed dtypes")
    if w_dtype == np.float64:
        assert all(np.any(g.astype(np.float32) != g) for g in got[1:])


@given(st.sampled_from([np.float32, np.float64]), st.integers(0, 2**32 - 1), st.integers(1, 50))
def test_erf_equals_reference(dtype, seed, n):
    x = (3 * np.random.default_rng(seed).standard_normal((n, 3))).astype(dtype)[:, ::2]
    x[0, 0] = np.nan
    got = numba_cpu.erf(x)
    assert got.dtype == x.dtype
    want = reference.erf(x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    # numba's math.erf is its own port of erf, not the C library's: the two differ in the last bit
    # now and then, so the float64 results (and after rounding, the float32 ones) may differ by 1 ULP
    np.testing.assert_array_max_ulp(got[1:], want[1:], maxulp=1)


@pytest.mark.filterwarnings("ignore:invalid value encountered in sqrt:RuntimeWarning")  # NumPy on var + eps < 0
@pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")  # NumPy on var + eps == 0
@given(
    hnp.arrays(
        np.float64,
        hnp.array_shapes(min_dims=1, max_dims=3, max_side=40),
        elements=st.one_of(
            st.floats(0, 1e300),
            st.sampled_from([0.0, -0.0, 5e-324, -1e-5, -1.0, np.inf, -np.inf, np.nan]),
        ),
    ),
    st.sampled_from([1e-5, 0.0, 1e-12, 1, np.float32(1e-3)]),
    st.booleans(),
)
def test_rstd_equals_reference_to_the_bit(var, eps, strided):
    """rstd = 1 / sqrt(var + eps): an addition, a square root and a division, each correctly rounded in both
    backends, so the same bits, NaN and inf in the same places (a negative var + eps gives NaN, a zero one inf);
    var left as it was. A strided view goes through too."""
    var = var[..., ::2] if strided else var
    before = var.copy()
    got = numba_cpu.rstd(var, eps)
    want = reference.rstd(var, eps)
    assert got.shape == want.shape == var.shape and got.dtype == want.dtype == np.float64
    np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))
    np.testing.assert_array_equal(var, before)


@pytest.mark.filterwarnings("ignore:invalid value encountered in sqrt:RuntimeWarning")  # NumPy on var + eps < 0
@pytest.mark.parametrize("n", [numba_cpu.RSTD_PARALLEL_MIN_ELEMENTS - 1, numba_cpu.RSTD_PARALLEL_MIN_ELEMENTS])
def test_rstd_in_parallel_equals_reference_to_the_bit(n):
    """Both sides of RSTD_PARALLEL_MIN_ELEMENTS (the serial and the parallel compile), values over many
    binades, and against the formula written out in Python's own float arithmetic for a few."""
    var = np.random.default_rng(3).uniform(-1, 1, n) ** 3 * 10.0 ** np.random.default_rng(4).integers(-30, 30, n)
    got = numba_cpu.rstd(var.reshape(-1, 1), 1e-5)
    np.testing.assert_array_equal(got.view(np.int64), reference.rstd(var.reshape(-1, 1), 1e-5).view(np.int64))
    for i in np.flatnonzero(var + 1e-5 > 0)[:5]:
        assert got[i, 0] == 1.0 / math.sqrt(float(var[i]) + 1e-5)


@pytest.mark.parametrize("mod", [numba_cpu, reference], ids=["numba", "reference"])
def test_rstd_takes_other_dtypes_and_refuses_bad_arguments(mod):
    """float32 var computes in float32 as NumPy does (the numba backend hands it to the reference), complex var
    (the complex step) in complex; integers and text refused as the norms refuse them."""
    var32 = np.array([0.5, 2.0, 0.0], np.float32)
    assert mod.rstd(var32, 1e-3).dtype == np.float32
    np.testing.assert_array_equal(mod.rstd(var32, 1e-3), np.float32(1) / np.sqrt(var32 + np.float32(1e-3)))
    assert mod.rstd(np.array([4.0 + 0j]), 0.0) == 0.5
    assert type(mod.rstd(np.float64(4.0), 0.0)) is np.float64  # (a scalar in, a scalar out, as NumPy's)
    with pytest.raises(TypeError, match="rstd: var must be a floating-point array, got dtype int64"):
        mod.rstd(np.array([1, 2]), 1e-5)
    with pytest.raises(TypeError, match="rstd: eps must be a real number, got '1e-5'"):
        mod.rstd(np.ones(3), "1e-5")
    with pytest.raises(TypeError, match="rstd: var must be an ndarray, got list"):
        mod.rstd([1.0], 1e-5)


@pytest.mark.parametrize("mod", [numba_cpu, reference], ids=["numba", "reference"])
def test_wrong_arguments_raise_on_both_backends(mod):
    """The jitted loops do no bounds checks, and NumPy would broadcast a wrong shape into a silently
    different result: both backends check every argument first (``reference.check_args``)."""
    x = np.ones((2, 3, 4, 5))
    mean, rstd = np.zeros((2, 3)), np.ones((2, 3))
    cases = [
        (
            lambda: mod.norm_forward(x, np.ones(4), None, EPS),
            ValueError,
            r"norm_forward: weight has shape \(4,\), expected \(3, 4\)",
        ),
        (lambda: mod.norm_forward(x, np.ones((3, 1)), None, EPS), ValueError, r"weight has shape \(3, 1\)"),
        # (numba's float(eps) would read the text; NumPy's var + "1e-5" raises, and PyTorch refuses it)
        (
            lambda: mod.norm_forward(x, None, None, "1e-5"),
            TypeError,
            "norm_forward: eps must be a real number, got '1e-5'",
        ),
        # (numba read eps=1j, [1e-5] and None with float(), NumPy gave a complex y for 1j; a text weight numba read as
        # numbers, NumPy refused without naming the op; flags were read by truth value, "False" as true)
        (lambda: mod.norm_forward(x, None, None, 1j), TypeError, "norm_forward: eps must be a real number, got 1j"),
        (lambda: mod.norm_forward(x, None, None, np.array([EPS])), TypeError, "eps must be a real number"),
        (lambda: mod.norm_forward(x, None, None, None), TypeError, "eps must be a real number, got None"),
        (lambda: mod.norm_forward(x, np.full((3, 4), "2"), None, EPS), TypeError, "weight must be a floating-point"),
        (lambda: mod.norm_forward(x, None, None, EPS, centered=[]), TypeError, "centered must be a bool, got list"),
        (
            lambda: mod.norm_backward(x, x, mean, rstd, None, need_affine_grads="False"),
            TypeError,
            "norm_backward: need_affine_grads must be a bool, got str 'False'",
        ),
        (lambda: mod.norm_backward(x, x, mean, rstd, None, fixed_stats=1), TypeError, "fixed_stats must be a bool"),
        (
            lambda: mod.norm_forward(x.tolist(), None, None, EPS),
            TypeError,
            "norm_forward: x must be an ndarray, got list",
        ),
        (lambda: mod.norm_forward(x, None, None, EPS, out=x.tolist()), TypeError, "out must be an ndarray, got list"),
        (lambda: mod.norm_backward(x, x, mean.tolist(), rstd, None), TypeError, "mean must be an ndarray, got list"),
        (lambda: mod.erf(np.ones(3, complex)), TypeError, "erf: x must be a floating-point array, got dtype complex"),
        (lambda: mod.erf([0.5]), TypeError, "erf: x must be an ndarray, got list"),
        (
            lambda: mod.norm_forward(x, None, None, EPS, mask=np.ones((2, 4), bool)),
            ValueError,
            "norm_forward: mask has shape",
        ),
        (lambda: mod.norm_forward(x, None, None, EPS, mask=np.ones((2, 5))), TypeError, "mask must be a boolean array"),
        (
            lambda: mod.norm_forward(x, None, None, EPS, reduce_batch=True, stats=(np.zeros(2), np.ones(2))),
            ValueError,
            r"norm_forward: mean has shape \(2,\), expected \(3,\)",
        ),
        (lambda: mod.norm_forward(x.astype(np.int64), None, None, EPS), TypeError, "x must be a floating-point array"),
        (lambda: mod.norm_forward(x[0], None, None, EPS), ValueError, "x must be 4-D"),
        (lambda: mod.norm_backward(x, x, mean, np.ones(3), None), ValueError, "norm_backward: rstd has shape"),
        (lambda: mod.norm_backward(x, x, mean[:, :1], rstd, None), ValueError, "norm_backward: mean has shape"),
        (lambda: mod.norm_backward(x[:1], x, mean, rstd, None), ValueError, "norm_backward: dy has shape"),
        (lambda: mod.norm_forward(x, None, None, EPS, out=np.ones((2, 3, 4, 4))), ValueError, "out has shape"),
        (
            lambda: mod.norm_forward(x, None, None, EPS, out=np.ones(x.shape, np.int64)),
            TypeError,
            "out has dtype int64",
        ),
        (lambda: mod.erf(np.array([1, 2])), TypeError, "erf: x must be a floating-point array"),
        # (a Fraction is a Real, which only numba's float() read; stats of one array or of the wrong length
        # failed in unpacking or by truth value; a complex out took a real result)
        (lambda: mod.norm_forward(x, None, None, Fraction(1, 10**5)), TypeError, "eps must be a real number"),
        (
            lambda: mod.norm_forward(x, None, None, EPS, stats=np.zeros(3)),
            TypeError,
            r"norm_forward: stats must be None or a pair of arrays \(mean, var\), got ndarray",
        ),
        (
            lambda: mod.norm_forward(x, None, None, EPS, stats=(mean,)),
            TypeError,
            r"norm_forward: stats must be None or a pair of arrays \(mean, var\), got tuple of length 1",
        ),
        (
            lambda: mod.norm_forward(x, None, None, EPS, out=np.ones(x.shape, complex)),
            TypeError,
            "out has dtype complex128, which the float64 result cannot be cast to",
        ),
    ]
    read_only = np.ones(x.shape)
    read_only.flags.writeable = False
    cases.append((lambda: mod.norm_backward(x, x, mean, rstd, None, out=read_only), ValueError, "out is read-only"))
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()


@pytest.mark.parametrize("mod", [numba_cpu, reference], ids=["numba", "reference"])
@pytest.mark.parametrize("shape", [(4, 3, 2, 5), (6, 1, 8, 1)], ids=["blocks", "rows"])
@pytest.mark.parametrize("fixed_stats", [False, True], ids=["batch stats", "fixed stats"])
@pytest.mark.parametrize("where", ["x itself", "x shifted", "dy itself", "dy shifted", "mean", "rstd"])
def test_out_overlapping_an_input_gives_the_same_results(mod, shape, fixed_stats, where, rng):
    """``out`` may share memory with what the kernel reads (x, dy, or the statistics the backward reads): the
    result is as if it did not (written via a temporary, or a copy of the statistics, where the kernel would read
    what it has written)."""
    size = int(np.prod(shape))
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    w = rng.standard_normal(shape[1:3])
    y_ok, mean, var = reference.norm_forward(x, w, None, EPS)
    rstd = 1 / np.sqrt(var + EPS)
    dx_ok, dw_ok, db_ok = reference.norm_backward(dy, x, mean, rstd, w, fixed_stats=fixed_stats)
    shift = 5 if "shifted" in where else 0
    buf = np.zeros(size + shift)
    src = buf[:size].reshape(shape)
    out = buf[shift:].reshape(shape)
    if where in ("mean", "rstd"):  # (the statistics in out's first values, written first)
        stat = buf[: mean.size].reshape(mean.shape)
        stat[...] = mean if where == "mean" else rstd
        args = (stat, rstd) if where == "mean" else (mean, stat)
        dx, dw, db = mod.norm_backward(dy, x, *args, w, fixed_stats=fixed_stats, out=out)
    elif where.startswith("x"):
        src[...] = x
        y, _, _ = mod.norm_forward(src, w, None, EPS, out=out)
        np.testing.assert_allclose(y, y_ok, rtol=1e-12, atol=1e-12)
        src[...] = x  # (out may have overwritten it)
        dx, dw, db = mod.norm_backward(dy, src, mean, rstd, w, fixed_stats=fixed_stats, out=out)
    else:
        src[...] = dy
        dx, dw, db = mod.norm_backward(src, x, mean, rstd, w, fixed_stats=fixed_stats, out=out)
    assert dx is out
    np.testing.assert_allclose(dx, dx_ok, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dw, dw_ok, rtol=1e-12)
    np.testing.assert_allclose(db, db_ok, rtol=1e-12)


def test_numba_hands_what_it_cannot_take_to_the_reference(rng):
    """Empty groups (G = 0), complex statistics or weights (a complex step) go to the reference, which
    gives empty results or keeps the imaginary part, instead of a crash or a silently real result."""
    x = rng.standard_normal((2, 0, 3, 4))
    for reduce_batch in (False, True):
        stat = np.zeros((0,) if reduce_batch else (2, 0))
        dx, dw, db = numba_cpu.norm_backward(x, x, stat, stat, np.ones((0, 3)), reduce_batch=reduce_batch)
        assert dx.shape == x.shape and dw.shape == db.shape == (0, 3)
    x = rng.standard_normal((2, 3, 2, 5))
    w = rng.standard_normal((3, 2)) + 1e-20j
    y, mean, var = numba_cpu.norm_forward(x, w, None, EPS)
    assert np.iscomplexobj(y)
    np.testing.assert_array_equal(y, reference.norm_forward(x, w, None, EPS)[0])
    stats = (np.zeros(3) + 1e-20j, np.ones(3))
    y = numba_cpu.norm_forward(x, None, None, EPS, reduce_batch=True, stats=stats)[0]
    assert np.iscomplexobj(y)
    np.testing.assert_array_equal(y, reference.norm_forward(x, None, None, EPS, reduce_batch=True, stats=stats)[0])


def test_the_streaming_forward_prefetches_the_block_its_thread_reads_next():
    """``_block_ahead``: the same block of the next channel (BatchNorm: a work item is a channel), else the
    block of the next group in the item; nothing past the item's last group, the last channel, or with
    prefetching off. The prefetch is only a hint (the streaming test above holds the values), so this is
    where a wrong choice would show."""
    x3 = np.arange(4 * 3 * 5, dtype=np.float32).reshape(4, 3, 5)
    ahead = numba_cpu._block_ahead
    np.testing.assert_array_equal(ahead(x3, 2, 0, 99, 1, True, True), x3[2, 1])
    assert ahead(x3, 2, 2, 99, 3, True, True).size == 0  # the last channel
    np.testing.assert_array_equal(ahead(x3, 1, 1, 5, 8, False, True), x3[1, 2])  # group 5 = (n, g) (1, 2)
    np.testing.assert_array_equal(ahead(x3, 1, 1, 6, 8, False, True), x3[2, 0])
    assert ahead(x3, 1, 1, 8, 8, False, True).size == 0  # past the item's last group
    assert ahead(x3, 1, 1, 5, 8, False, False).size == 0
    assert ahead(x3, 2, 0, 99, 1, True, False).size == 0
