"""Degenerate inputs on every kernel path, against the closed forms written out here in float64.

The gradient checks run on well-conditioned data (variance well above eps), where a rule that mishandles
a variance below eps, a constant group, or RMSNorm's single value could pass. These tests hold y, dx,
dweight and dbias there, on both backends, with shapes that reach each family of numba loops: rows,
columns (BatchNorm1d), blocks (BatchNorm2d, InstanceNorm, GroupNorm), masked blocks. An audit planted
such mutants (a BatchNorm rstd that took var < eps for 0, a groups forward that did the same, a dropped
mean term for constant groups, an RMSNorm zero row with rstd 0, RMSNorm's one-value dx, a one-pass
masked variance) and the rest of the suite let each of them through. Then: a float64 input far from zero mean
is a shift, for y and every gradient; a zero running variance in evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

import minigrad_norm as mg
from minigrad_norm.norms import batch_norm, group_norm, instance_norm, layer_norm, rms_norm
from minigrad_norm.tensor import Tensor, grad

EPS = 1e-5
GROUPS = 2  # (GroupNorm's)


def closed_form(x, w, b, dy, axes, valid, centered, eps):
    """y, dx and the per-element terms of dweight, dbias of one normalization over ``axes`` (w, b broadcast
    to x; ``valid`` the mask), from docs/derivations.md in float64:

        xhat = (x - mu) * rstd,  rstd = 1 / sqrt(var + eps),  y = xhat * w + b
        dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),  dxhat = dy * w   (no mean term: RMS)
    """
    x, dy = x.astype(np.float64), dy.astype(np.float64)
    valid = np.broadcast_to(valid, x.shape)
    count = valid.sum(axis=axes, keepdims=True)

    def mean(t: np.ndarray) -> np.ndarray:
        return np.where(valid, t, 0).sum(axis=axes, keepdims=True) / count

    xc = np.where(valid, x - (mean(x) if centered else 0.0), 0)
    rstd = 1 / np.sqrt(mean(xc * xc) + eps)
    xhat = xc * rstd
    g = np.where(valid, dy, 0)
    dxhat = g * w
    dx = dxhat - xhat * mean(dxhat * xhat) - (mean(dxhat) if centered else 0)
    return np.where(valid, xhat * w + b, 0), np.where(valid, dx * rstd, 0), g * xhat, g


def norm_and_oracle(kind: str, x, w, b, dy, mask=None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(y, dx, dweight, dbias) of the norm through the Tensor API, and of ``closed_form``."""
    n, c = x.shape[0], w.shape[0]
    spatial = tuple(range(2, x.ndim))
    calls: dict[str, Callable[..., Tensor]] = {
        "layer_norm": lambda t, w_, b_: layer_norm(t, c, w_, b_, EPS),
        "rms_norm": lambda t, w_, b_: rms_norm(t, c, w_, EPS) + b_,
        "batch_norm": lambda t, w_, b_: batch_norm(t, None, None, w_, b_, training=True, eps=EPS, mask=mask),
        "instance_norm": lambda t, w_, b_: instance_norm(t, weight=w_, bias=b_, eps=EPS, mask=mask),
        "group_norm": lambda t, w_, b_: group_norm(t, GROUPS, w_, b_, EPS),
    }
    leaves = [Tensor(a, requires_grad=True) for a in (x, w, b)]
    y = calls[kind](*leaves)
    got = [y.data, *grad(y, leaves, dy)]
    if kind in ("layer_norm", "rms_norm"):  # over the last axis; w per position
        want = closed_form(x, w, b, dy, (-1,), True, kind == "layer_norm", EPS)
        per_param = tuple(range(x.ndim - 1))
    elif kind == "group_norm":  # over (C / G, *spatial) of each group: the (N, G, C / G * S) view
        w_, b_ = (np.broadcast_to(p.reshape(1, c, -1), (1, c, math.prod(x.shape[2:]))) for p in (w, b))
        view = (n, GROUPS, -1)
        want = closed_form(x.reshape(view), w_.reshape(1, GROUPS, -1), b_.reshape(1, GROUPS, -1), dy.reshape(view),
                           (2,), True, True, EPS)  # fmt: skip
        want = tuple(a.reshape(x.shape) for a in want)
        per_param = (0, *spatial)
    else:  # per channel: over (N, *spatial) for BatchNorm, (*spatial) for InstanceNorm
        axes = (0, *spatial) if kind == "batch_norm" else spatial
        valid = True if mask is None else mask[:, None]
        w_, b_ = (p.reshape((1, c) + (1,) * len(spatial)) for p in (w, b))
        want = closed_form(x, w_, b_, dy, axes, valid, True, EPS)
        per_param = (0, *spatial)
    y_want, dx_want, w_terms, b_terms = want
    return got, [y_want, dx_want, w_terms.sum(axis=per_param), b_terms.sum(axis=per_param)]


# shapes that reach each family of numba loops: rows (short, long), columns, blocks, groups
SHAPES = [
    ("layer_norm", (5, 7)),
    ("layer_norm", (3, 300)),
    ("rms_norm", (5, 7)),
    ("rms_norm", (3, 300)),
    ("batch_norm", (3, 2, 4)),
    ("batch_norm", (4, 3, 20)),
    ("batch_norm", (64, 3)),
    ("instance_norm", (3, 2, 4)),
    ("instance_norm", (2, 3, 300)),
    ("group_norm", (3, 4, 4)),
    ("group_norm", (3, 4, 40)),
]
MASKED = [("batch_norm", (4, 3, 20)), ("instance_norm", (2, 3, 20)), ("batch_norm", (16, 3))]


def some_mask(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """About 70% valid, and at least the first two positions of each sample (no statistic left empty)."""
    mask = rng.random((shape[0], *shape[2:])) < 0.7
    mask.reshape(shape[0], -1)[:, :2] = True
    return mask


def params(kind: str, shape: tuple[int, ...], rng: np.random.Generator, dtype=np.float64):
    c = shape[-1] if kind in ("layer_norm", "rms_norm") else shape[1]
    w, b = rng.uniform(0.5, 1.5, c).astype(dtype), rng.standard_normal(c).astype(dtype)
    return w, b, rng.standard_normal(shape).astype(dtype)


def assert_close(got: list[np.ndarray], want: list[np.ndarray], rel: float) -> None:
    for name, g, e in zip(("y", "dx", "dweight", "dbias"), got, want, strict=True):
        np.testing.assert_allclose(g, e, rtol=0, atol=rel * max(1.0, float(np.abs(e).max())), err_msg=name)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("ratio", [1e-3, 0.1, 1.0])
@pytest.mark.parametrize(("kind", "shape"), SHAPES + MASKED)
def test_variance_near_and_below_eps(kind, shape, ratio, backend):
    """var = ratio * eps, a spread of 1e-4 down to 3e-6 around 3: rstd is about 1 / sqrt(eps), not 1 / sqrt(var)
    (a kernel that took a variance below eps for 0, or eps for the variance, is off by far more than 1e-8)."""
    rng = np.random.default_rng(0)
    z = rng.standard_normal(shape)
    x = (0.0 if kind == "rms_norm" else 3.0) + math.sqrt(ratio * EPS) * z / z.std()
    mask = some_mask(shape, rng) if (kind, shape) in MASKED else None
    with mg.use_backend(backend):
        got, want = norm_and_oracle(kind, x, *params(kind, shape, rng), mask)
    assert_close(got, want, 1e-8)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("kind", "shape"), SHAPES + MASKED)
def test_constant_groups_on_every_kernel_path(kind, shape, dtype, backend):
    """Every group constant (0.25, whose mean and variance are exact; 0 for RMSNorm): y = bias, and dx keeps its
    mean term dxhat - mean(dxhat) over sqrt(eps) (RMSNorm: dxhat / sqrt(eps)), dweight = 0, dbias = sum dy."""
    rng = np.random.default_rng(1)
    x = np.full(shape, 0.0 if kind == "rms_norm" else 0.25, dtype)
    mask = some_mask(shape, rng) if (kind, shape) in MASKED else None
    with mg.use_backend(backend):
        got, want = norm_and_oracle(kind, x, *params(kind, shape, rng, dtype), mask)
    assert_close(got, want, 1e-5 if dtype == np.float32 else 1e-10)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("eps", [1e-2, 1.0])
def test_rms_norm_of_one_value(eps, backend):
    """y = w x / sqrt(x^2 + eps): dy/dx = w eps / (x^2 + eps)^(3/2), which the general rule's projection term
    gives only if it is kept for a group of one (its xhat * mean(dxhat * xhat) is not 0 there)."""
    rng = np.random.default_rng(2)
    x = rng.uniform(0.1, 2.0, (6, 1)) * rng.choice([-1, 1], (6, 1))
    w, dy = np.array([1.3]), rng.standard_normal((6, 1))
    xt, wt = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    with mg.use_backend(backend):
        y = rms_norm(xt, 1, wt, eps)
        dx, dw = grad(y, [xt, wt], dy)
    np.testing.assert_allclose(y.data, w * x / np.sqrt(x * x + eps), rtol=1e-13)
    np.testing.assert_allclose(dx, dy * w * eps / (x * x + eps) ** 1.5, rtol=1e-12)
    np.testing.assert_allclose(dw, (dy * x / np.sqrt(x * x + eps)).sum(axis=0), rtol=1e-12)


CENTERED = [(kind, shape) for kind, shape in SHAPES if kind != "rms_norm"] + MASKED


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("offset", [1e8, 1e12])
@pytest.mark.parametrize(("kind", "shape"), CENTERED)
def test_float64_far_from_zero_mean_is_a_shift(kind, shape, offset, backend):
    """A centered norm does not see a shift: float64 x = offset + N(0, 1) gives what x - offset (exact) gives, y and
    every gradient, within 2 m u offset (u = 2^-53, m = x.size, more than any statistic's count): what the mean's sum
    of m values near the offset can be off by, in any order. A one-pass E[x^2] - mean^2 is off by about u offset^2
    in the variance. (Measured: at most 2.5 u offset.)"""
    rng = np.random.default_rng(3)
    x = offset + rng.standard_normal(shape)
    mask = some_mask(shape, rng) if (kind, shape) in MASKED else None
    w, b, dy = params(kind, shape, rng)
    with mg.use_backend(backend):
        got, _ = norm_and_oracle(kind, x, w, b, dy, mask)
        want, _ = norm_and_oracle(kind, x - offset, w, b, dy, mask)
    assert_close(got, want, 2 * x.size * 2.0**-53 * offset)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("kind", ["batch_norm", "instance_norm"])
def test_zero_running_variance_normalizes_by_sqrt_eps(kind, backend):
    """Evaluation with a running_var of 0 (a channel that never varied): rstd = 1 / sqrt(eps),
    y = (x - mean) / sqrt(eps) * w + b, dx = dy * w / sqrt(eps), dweight = sum dy * xhat, dbias = sum dy."""
    rng = np.random.default_rng(4)
    x, dy = rng.standard_normal((2, 3, 5)), rng.standard_normal((2, 3, 5))
    w, b = rng.uniform(0.5, 1.5, 3), rng.standard_normal(3)
    rm, rv = rng.standard_normal(3), np.zeros(3)
    leaves = [Tensor(a, requires_grad=True) for a in (x, w, b)]
    with mg.use_backend(backend):
        if kind == "batch_norm":
            y = batch_norm(leaves[0], rm, rv, leaves[1], leaves[2], training=False, eps=EPS)
        else:
            y = instance_norm(leaves[0], rm, rv, leaves[1], leaves[2], use_input_stats=False, eps=EPS)
        got = [y.data, *grad(y, leaves, dy)]
    xhat = (x - rm[:, None]) / math.sqrt(EPS)
    want = [xhat * w[:, None] + b[:, None], dy * w[:, None] / math.sqrt(EPS)]
    want += [(dy * xhat).sum(axis=(0, 2)), dy.sum(axis=(0, 2))]
    assert_close(got, want, 1e-12)
