"""The invariants and known facts of the norms, as hypothesis properties (float64).

Gradients here come from the hand-derived backward (reverse mode), with a
random upstream gradient; the facts are checked against formulas stated
independently of the implementation (eigen-decompositions by NumPy, explicit
numbers).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minigrad_norm.gradcheck import jacobian
from minigrad_norm.norms import batch_norm, group_norm, instance_norm, layer_norm, rms_norm
from minigrad_norm.tensor import Tensor, grad
from minigrad_norm.testing import arrays, channel_shapes, layer_norm_shapes, spread_arrays


def _dx(fn, x: np.ndarray, g: np.ndarray) -> np.ndarray:
    t = Tensor(x, requires_grad=True)
    return grad(fn(t), [t], g)[0]


def _rows(data: st.DataObject):
    """A well-conditioned x for a norm over trailing dims, its normalized_shape and axes, and an upstream g."""
    shape, ns = data.draw(layer_norm_shapes(max_norm_dims=2, min_group=2))
    axes = tuple(range(len(shape) - len(ns), len(shape)))
    return data.draw(spread_arrays(shape, axes)), ns, axes, data.draw(arrays(shape))


# -- gradient invariants -----------------------------------------------------------------------------
@given(data=st.data())
def test_layer_norm_input_gradient_sums_to_zero_and_is_orthogonal_to_xhat_at_eps_0(data) -> None:
    x, ns, axes, g = _rows(data)
    dx = _dx(lambda t: layer_norm(t, ns), x, g)
    # shift invariance: y(x + c) = y(x), so the gradient has no component along the ones vector
    np.testing.assert_allclose(dx.sum(axis=axes), 0, atol=1e-10)
    # scale invariance (eps = 0): y(a x) = y(x), so dx is orthogonal to x - mu, i.e. to xhat
    dx0 = _dx(lambda t: layer_norm(t, ns, eps=0.0), x, g)
    xhat = layer_norm(Tensor(x), ns, eps=0.0).data
    np.testing.assert_allclose((dx0 * xhat).sum(axis=axes), 0, atol=1e-10)
    np.testing.assert_allclose(dx0.sum(axis=axes), 0, atol=1e-10)


@given(data=st.data())
def test_rms_norm_input_gradient_is_orthogonal_to_x_at_eps_0(data) -> None:
    x, ns, axes, g = _rows(data)
    w = data.draw(arrays(ns))
    dx = _dx(lambda t: rms_norm(t, ns, w, eps=0.0), x, g)
    np.testing.assert_allclose((dx * x).sum(axis=axes), 0, atol=1e-10)


@given(shape=channel_shapes(min_batch=2), data=st.data())
def test_batch_norm_input_gradient_sums_to_zero_over_batch_and_space(shape, data) -> None:
    axes = tuple(ax for ax in range(len(shape)) if ax != 1)
    x = data.draw(spread_arrays(shape, axes))
    w = data.draw(arrays(shape[1:2]))
    g = data.draw(arrays(shape))
    dx = _dx(lambda t: batch_norm(t, None, None, w, training=True), x, g)
    np.testing.assert_allclose(dx.sum(axis=axes), 0, atol=1e-10)
    # with eps -> 0 (batch_norm requires eps > 0) the projection on xhat vanishes like eps / var
    dx = _dx(lambda t: batch_norm(t, None, None, training=True, eps=1e-300), x, g)
    xhat = batch_norm(Tensor(x), None, None, training=True, eps=1e-300).data
    np.testing.assert_allclose((dx * xhat).sum(axis=axes), 0, atol=1e-10)


@given(shape=channel_shapes(min_spatial=2), data=st.data())
def test_instance_and_group_norm_gradients_sum_to_zero_per_group(shape, data) -> None:
    axes = tuple(range(2, len(shape)))
    x = data.draw(spread_arrays(shape, axes))
    g = data.draw(arrays(shape))
    dx = _dx(lambda t: instance_norm(t), x, g)
    np.testing.assert_allclose(dx.sum(axis=axes), 0, atol=1e-10)
    dx = _dx(lambda t: group_norm(t, 1), x, g)
    np.testing.assert_allclose(dx.reshape(shape[0], -1).sum(axis=1), 0, atol=1e-10)


# -- spectra -------------------------------------------------------------------------------------------------
@given(d=st.integers(2, 8), data=st.data(), eps=st.sampled_from([1e-5, 0.1, 1.0]))
def test_layer_norm_jacobian_spectrum(d: int, data, eps: float) -> None:
    x = data.draw(spread_arrays((d,), -1))
    J = jacobian(lambda t: layer_norm(t, d, eps=eps), [Tensor(x, requires_grad=True)])[0]
    var = x.var()
    rstd = 1 / math.sqrt(var + eps)
    xhat = (x - x.mean()) * rstd
    np.testing.assert_allclose(J, J.T, atol=1e-12)
    # eigenvectors: the ones vector (eigenvalue 0), xhat (eps / (var + eps) * rstd), the rest (rstd)
    np.testing.assert_allclose(J @ np.ones(d), 0, atol=1e-12)
    np.testing.assert_allclose(J @ xhat, eps / (var + eps) * rstd * xhat, atol=1e-10)
    expected = np.sort([0.0, eps / (var + eps) * rstd] + [rstd] * (d - 2))
    np.testing.assert_allclose(np.linalg.eigvalsh(J), expected, atol=1e-10)
    if d >= 3:
        assert np.linalg.norm(J, 2) == pytest.approx(rstd, rel=1e-12)


@given(d=st.integers(2, 8), data=st.data(), eps=st.sampled_from([0.0, 1e-5, 0.5]))
def test_rms_norm_spectral_norm_is_one_over_rms(d: int, data, eps: float) -> None:
    x = data.draw(arrays((d,), margin=0.3))  # every |x_i| >= 0.3, so mean(x^2) >= 0.09: rms well away from 0
    J = jacobian(lambda t: rms_norm(t, d, eps=eps), [Tensor(x, requires_grad=True)])[0]
    rms = math.sqrt(np.mean(x * x) + eps)
    assert np.linalg.norm(J, 2) == pytest.approx(1 / rms, rel=1e-10)


# -- known values --------------------------------------------------------------------------------------------
@given(shapes=layer_norm_shapes(max_norm_dims=2, min_group=2), data=st.data(), eps=st.sampled_from([1e-5, 0.5]))
def test_layer_norm_output_has_mean_beta_and_variance_var_over_var_plus_eps(shapes, data, eps: float) -> None:
    shape, ns = shapes
    axes = tuple(range(len(shape) - len(ns), len(shape)))
    x = data.draw(arrays(shape))
    beta = data.draw(st.floats(-3, 3))
    y = layer_norm(Tensor(x), ns, np.ones(ns), np.full(ns, beta), eps=eps).data
    var = x.var(axis=axes, keepdims=True)
    np.testing.assert_allclose(y.mean(axis=axes, keepdims=True), beta, atol=1e-12)
    np.testing.assert_allclose(y.var(axis=axes, keepdims=True), var / (var + eps), atol=1e-12)


def test_layer_norm_of_two_fives_and_six_zeros() -> None:
    x = np.array([5, 5, 0, 0, 0, 0, 0, 0], dtype=np.float64)
    s3 = math.sqrt(3)
    np.testing.assert_allclose(layer_norm(Tensor(x), 8, eps=0.0).data, [s3, s3] + [-s3 / 3] * 6, rtol=1e-15)


@given(data=st.data(), hw=st.tuples(st.integers(1, 3), st.integers(2, 3)))
def test_layer_norm_over_chw_with_one_channel_is_instance_norm(data, hw) -> None:
    shape = (data.draw(st.integers(1, 3)), 1, *hw)
    x = data.draw(spread_arrays(shape, (2, 3)))
    g = data.draw(arrays(shape))
    np.testing.assert_allclose(layer_norm(Tensor(x), shape[1:]).data, instance_norm(Tensor(x)).data, atol=1e-13)
    np.testing.assert_allclose(
        _dx(lambda t: layer_norm(t, shape[1:]), x, g), _dx(lambda t: instance_norm(t), x, g), atol=1e-12
    )


@given(shape=channel_shapes(min_spatial=2), data=st.data())
def test_group_norm_spans_instance_norm_and_layer_norm(shape, data) -> None:
    c = shape[1]
    x = data.draw(spread_arrays(shape, tuple(range(2, len(shape)))))
    w = data.draw(arrays((c,)))
    b = data.draw(arrays((c,)))
    g = data.draw(arrays(shape))
    xt, wt, bt = (Tensor(a, requires_grad=True) for a in (x, w, b))

    def all_grads(y: Tensor) -> list[np.ndarray]:
        return [y.data, *grad(y, [xt, wt, bt], g)]

    # num_groups = C: one channel per group, which is InstanceNorm
    for a, e in zip(all_grads(group_norm(xt, c, wt, bt)), all_grads(instance_norm(xt, weight=wt, bias=bt))):
        np.testing.assert_allclose(a, e, atol=1e-12)
    # num_groups = 1: LayerNorm over (C, *), its per-element affine being the per-channel one broadcast
    per_elem = (c,) + (1,) * (len(shape) - 2)
    we, be = wt.reshape(per_elem) * np.ones(shape[1:]), bt.reshape(per_elem) * np.ones(shape[1:])
    for a, e in zip(all_grads(group_norm(xt, 1, wt, bt)), all_grads(layer_norm(xt, shape[1:], we, be))):
        np.testing.assert_allclose(a, e, atol=1e-12)


@pytest.mark.parametrize("offset", [0.0, 1e6, -3.5])
def test_layer_norm_of_one_value_returns_bias_exactly_with_zero_weight_gradient(offset: float, rng) -> None:
    x = Tensor(offset + rng.standard_normal((4, 1)), requires_grad=True)
    w = Tensor(rng.standard_normal(1), requires_grad=True)
    b = Tensor(rng.standard_normal(1), requires_grad=True)
    y = layer_norm(x, (1,), w, b)
    assert np.array_equal(y.data, np.broadcast_to(b.data, (4, 1)))
    y.backward(rng.standard_normal((4, 1)))
    assert np.array_equal(w.grad, [0.0])
    assert np.array_equal(x.grad, np.zeros((4, 1)))


def test_one_value_per_statistic_in_training_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"instance_norm: Expected more than 1 spatial element when training.*\(2, 3, 1\)"
    ):
        instance_norm(np.ones((2, 3, 1)))
    with pytest.raises(ValueError, match=r"batch_norm: Expected more than 1 value per channel when training.*\(1, 3\)"):
        batch_norm(np.ones((1, 3)), None, None, training=True)
    with pytest.raises(ValueError, match=r"batch_norm: Expected more than 1 value per channel.*mask leaves 1"):
        batch_norm(np.ones((2, 3, 2)), None, None, training=True, mask=np.array([[True, False], [False, False]]))
    # with constant statistics one value is fine: the output then depends on x
    y = instance_norm(np.array([[[2.0]]]), np.zeros(1), np.ones(1), use_input_stats=False, eps=1e-5)
    assert y.data[0, 0, 0] == pytest.approx(2 / math.sqrt(1 + 1e-5))
