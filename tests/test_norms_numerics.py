"""Numerics of the norms: large offsets in float32, constant groups, dtypes, NaN/inf, inputs left alone.

These run under whatever backend is active (numba or the NumPy reference),
so float32 tolerances allow for a different accumulation order.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minigrad_norm.norms import batch_norm, group_norm, instance_norm, layer_norm, rms_norm
from minigrad_norm.tensor import Tensor, grad
from minigrad_norm.testing import channel_shapes

# Each norm as f(x, weight, bias) on an (N, C, L) input, weight and bias of shape (C,) except where noted.
NORMS: dict[str, Callable[..., Tensor]] = {
    "layer_norm": lambda x, w, b: layer_norm(x, x.shape[-1], _last(w, x), _last(b, x)),
    "rms_norm": lambda x, w, b: rms_norm(x, x.shape[-1], _last(w, x)),
    "batch_norm": lambda x, w, b: batch_norm(x, None, None, w, b, training=True),
    "batch_norm eval": lambda x, w, b: batch_norm(x, np.full(x.shape[1], 1e4), np.full(x.shape[1], 2.0), w, b),
    "instance_norm": lambda x, w, b: instance_norm(x, weight=w, bias=b),
    "group_norm": lambda x, w, b: group_norm(x, 1, w, b),
}


def _last(p: Tensor | None, x: Tensor) -> Tensor | None:
    """A per-channel parameter turned into one over the last axis (LayerNorm's normalized_shape) by a slice."""
    if p is None:
        return None
    return p[np.arange(x.shape[-1]) % p.shape[0]]


def _run(name: str, x: np.ndarray, w: np.ndarray, b: np.ndarray, g: np.ndarray) -> list[np.ndarray]:
    ts = [Tensor(a, requires_grad=True) for a in (x, w, b)]
    y = NORMS[name](*ts)
    return [y.data, *grad(y, ts, g)]


@pytest.mark.parametrize("name", NORMS)
@given(shape=channel_shapes(min_batch=2, min_spatial=3, max_side=5), seed=st.integers(0, 2**16))
def test_float32_with_mean_offset_1e4_matches_float64(name: str, shape, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = (1e4 + rng.standard_normal(shape)).astype(np.float32)  # E[x^2] - E[x]^2 would lose every digit here
    w, b = rng.uniform(0.5, 1.5, shape[1]).astype(np.float32), rng.standard_normal(shape[1]).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    got = _run(name, x, w, b, g)
    want = _run(name, x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), g.astype(np.float64))
    assert all(a.dtype == np.float32 for a in got)
    np.testing.assert_allclose(got[0], want[0], atol=1e-5)  # (the float32 error is about 5e-7)
    for a, e in zip(got[1:], want[1:]):  # gradients: relative to their own scale
        np.testing.assert_allclose(a, e, atol=1e-3 * max(1.0, np.abs(e).max()))


# the axes each norm's statistics run over, on the (N, C, L) inputs of NORMS
GROUP_AXES = {"layer_norm": (2,), "batch_norm": (0, 2), "instance_norm": (2,), "group_norm": (1, 2)}


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("name", list(GROUP_AXES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_constant_groups_give_bias_and_the_closed_form_gradients(name: str, dtype, backend, rng) -> None:
    """A constant group has var = 0, so xhat = 0 and rstd = 1/sqrt(eps): y = bias, and from the backward's
    formula dx = (dxhat - mean_g(dxhat)) / sqrt(eps) (large: 316 |dxhat|), dweight = 0, dbias = sum(dy)."""
    import minigrad_norm as mg

    shape, eps = (3, 2, 4), 1e-5
    x = np.full(shape, 0.1, dtype=dtype)  # 0.1 is not exact: the mean may differ from it by an ulp
    w, b = rng.uniform(0.5, 1.5, 2).astype(dtype), rng.standard_normal(2).astype(dtype)
    g = rng.standard_normal(shape).astype(dtype)
    with mg.use_backend(backend):
        y, dx, dw, db = _run(name, x, w, b, g)
    per_value = (lambda p: p[np.arange(4) % 2]) if name == "layer_norm" else (lambda p: p[:, None])
    np.testing.assert_allclose(y, np.broadcast_to(per_value(b), shape), atol=1e-3 if dtype == np.float32 else 1e-10)
    dxhat = g.astype(np.float64) * per_value(w.astype(np.float64))
    axes = GROUP_AXES[name]
    want_dx = (dxhat - dxhat.mean(axis=axes, keepdims=True)) / np.sqrt(eps)
    tol = 1e-5 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(dx, want_dx, rtol=tol, atol=tol * np.abs(want_dx).max())
    np.testing.assert_allclose(dw, 0.0, atol=tol)
    channel_sums = g.astype(np.float64).sum(axis=(0, 2))
    want_db = g.astype(np.float64).sum(axis=(0, 1)).reshape(2, 2).sum(axis=0) if name == "layer_norm" else channel_sums
    np.testing.assert_allclose(db, want_db, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", NORMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_is_preserved_in_output_and_gradients(name: str, dtype, rng) -> None:
    x = rng.standard_normal((3, 2, 4)).astype(dtype)
    w, b = np.ones(2, dtype), np.zeros(2, dtype)
    y, dx, dw, db = _run(name, x, w, b, rng.standard_normal((3, 2, 4)).astype(dtype))
    assert y.dtype == dx.dtype == dw.dtype == db.dtype == dtype


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_propagate_to_their_group_only(bad: float, rng) -> None:
    x = rng.standard_normal((3, 2, 4))
    x[1, 0, 2] = bad
    g = rng.standard_normal(x.shape)
    # LayerNorm over the last axis: only row (1, 0) is poisoned, in the output and in dx
    y, dx, _, _ = _run("layer_norm", x, np.ones(2), np.zeros(2), g)
    poisoned = np.zeros(x.shape, bool)
    poisoned[1, 0] = True
    assert np.isnan(y[poisoned]).all() and np.isfinite(y[~poisoned]).all()
    assert np.isnan(dx[poisoned]).all() and np.isfinite(dx[~poisoned]).all()
    # BatchNorm: channel 0 of every sample is poisoned, channel 1 is not
    y, dx, dw, _ = _run("batch_norm", x, np.ones(2), np.zeros(2), g)
    assert np.isnan(y[:, 0]).all() and np.isfinite(y[:, 1]).all()
    assert np.isnan(dx[:, 0]).all() and np.isfinite(dx[:, 1]).all()
    assert np.isnan(dw[0]) and np.isfinite(dw[1])


@pytest.mark.parametrize("training", [True, False])
def test_inputs_are_never_written_to(training: bool, rng) -> None:
    x = rng.standard_normal((3, 2, 4))
    w, b = rng.standard_normal(2), rng.standard_normal(2)
    rm, rv = rng.standard_normal(2), rng.uniform(0.5, 2, 2)
    mask = rng.random((3, 4)) < 0.7
    mask[:, :2] = True
    g = rng.standard_normal(x.shape)
    originals = [a.copy() for a in (x, w, b, rm, rv, mask, g)]
    calls = [
        lambda xt, wt, bt: layer_norm(xt, 4, _last(wt, xt), _last(bt, xt)),
        lambda xt, wt, bt: rms_norm(xt, (2, 4), None),
        lambda xt, wt, bt: group_norm(xt, 2, wt, bt),
        lambda xt, wt, bt: batch_norm(xt, None, None, wt, bt, training=True, mask=mask),
        lambda xt, wt, bt: instance_norm(xt, None, None, wt, bt, mask=mask),
    ]
    if not training:  # the running buffers are read, never written, outside training
        calls += [
            lambda xt, wt, bt: batch_norm(xt, rm, rv, wt, bt, training=False, mask=mask),
            lambda xt, wt, bt: instance_norm(xt, rm, rv, wt, bt, use_input_stats=False),
        ]
    for call in calls:
        ts = [Tensor(a, requires_grad=True) for a in (x, w, b)]
        call(*ts).backward(g)
        for a, o in zip((x, w, b, rm, rv, mask, g), originals):
            assert np.array_equal(a, o)
    for frozen in (x, w, b):  # a read-only input must not trip the forward or the backward either
        frozen.flags.writeable = False
    ts = [Tensor(a, requires_grad=True) for a in (x, w, b)]
    batch_norm(ts[0], None, None, ts[1], ts[2], training=True).backward(g)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("op", ["batch_norm", "instance_norm"])
def test_nan_under_the_mask_reaches_nothing(op: str, backend: str, rng) -> None:
    """Masked-out positions are padding: whatever they hold (NaN, inf) must not reach any
    statistic, output or gradient, including the weight and bias gradients."""
    from minigrad_norm import use_backend

    x = rng.standard_normal((3, 2, 6))
    mask = np.ones((3, 6), dtype=bool)
    mask[0, 4:] = mask[2, 5] = False
    x[0, :, 4] = np.nan
    x[0, :, 5] = np.inf
    x[2, 1, 5] = -np.inf
    g = rng.standard_normal(x.shape)
    g[0, 0, 4] = np.nan  # an upstream gradient at padding is ignored too
    fn = {
        "batch_norm": lambda t, w, b: batch_norm(t, None, None, w, b, training=True, mask=mask),
        "instance_norm": lambda t, w, b: instance_norm(t, weight=w, bias=b, mask=mask),
    }[op]
    with use_backend(backend):
        ts = [Tensor(a, requires_grad=True) for a in (x, rng.standard_normal(2), rng.standard_normal(2))]
        y = fn(*ts)
        outs = [y.data, *grad(y, ts, g)]
    for a in outs:
        assert np.isfinite(a).all()
    assert (outs[0][np.broadcast_to(~mask[:, None, :], x.shape)] == 0).all()
