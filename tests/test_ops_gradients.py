"""Every primitive op's backward against central finite differences (float64), over
hypothesis-drawn shapes: broadcasting pairs, scalars, size-1 dims, every axis/keepdims."""

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given

import minigrad_norm.functional as F
from minigrad_norm import Tensor, concatenate, gradcheck, stack
from minigrad_norm.testing import arrays, axes, broadcastable_shapes, shapes

TOL = {"atol": 1e-6, "rtol": 1e-5}


def leaf(a):
    return Tensor(np.asarray(a, dtype=np.float64), requires_grad=True)


def weighted(fn):
    """fn followed by a contraction with fixed random weights: a loss whose gradient is never trivially 0."""

    def loss(*ts):
        y = fn(*ts)
        w = np.random.default_rng(y.size).standard_normal(y.shape)
        return (y * w).sum()

    return loss


# values kept away from 0 so that no Jacobian is all zeros (gradcheck warns such a check is vacuous)
pairs = broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=3).flatmap(
    lambda s: st.tuples(arrays(s[0], margin=0.1), arrays(s[1], margin=0.1))
)


@pytest.mark.parametrize(
    "name, fn",
    [("add", lambda a, b: a + b), ("sub", lambda a, b: a - b), ("mul", lambda a, b: a * b)],
)
@given(ab=pairs)
def test_binary_ops_with_broadcasting(name, fn, ab):
    a, b = ab
    assert gradcheck(fn, (leaf(a), leaf(b)), **TOL)
    assert gradcheck(weighted(fn), (leaf(a), leaf(b)), **TOL)


@given(
    ab=broadcastable_shapes(num_shapes=2, max_dims=3, max_side=3).flatmap(
        lambda s: st.tuples(arrays(s[0]), arrays(s[1], margin=0.5))
    )
)
@pytest.mark.filterwarnings("ignore:gradcheck. every Jacobian entry")  # a drawn a of zeros: d(a/b)/db = 0
def test_div_with_broadcasting(ab):
    a, b = ab
    assert gradcheck(lambda x, y: x / y, (leaf(a), leaf(b)), **TOL)


@given(
    ab=broadcastable_shapes(num_shapes=2, max_dims=3, max_side=3).flatmap(
        lambda s: st.tuples(arrays(s[0], low=1.2, high=2.0), arrays(s[1], low=-1.5, high=1.5, margin=0.1))
    )
)
def test_pow_tensor_exponent(ab):
    a, b = ab
    assert gradcheck(lambda x, y: x**y, (leaf(a), leaf(b)), **TOL)


@given(a=arrays(shapes(max_dims=3), low=0.5, high=2.0), p=st.sampled_from([2, 3, -1, 0.5, -1.5]))
def test_pow_scalar_exponent_and_reflected_ops(a, p):
    assert gradcheck(lambda x: x**p, (leaf(a),), **TOL)
    assert gradcheck(lambda x: 2.0 / x - 3.0 * x + (1.0 - x) - x, (leaf(a),), **TOL)
    assert gradcheck(lambda x: 1.5**x, (leaf(a),), **TOL)


@given(
    batch=broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=2, max_side=3),
    n=st.integers(1, 3),
    k=st.integers(1, 3),
    m=st.integers(1, 3),
    vec=st.sampled_from(["none", "a", "b", "both"]),
    data=st.data(),
)
def test_matmul_batched_broadcast_and_vectors(batch, n, k, m, vec, data):
    a_shape = (k,) if vec in ("a", "both") else (*batch[0], n, k)
    b_shape = (k,) if vec in ("b", "both") else (*batch[1], k, m)
    a = data.draw(arrays(a_shape, margin=0.1))
    b = data.draw(arrays(b_shape, margin=0.1))
    assert gradcheck(weighted(lambda x, y: x @ y), (leaf(a), leaf(b)), **TOL)


@given(data=st.data(), keepdims=st.booleans(), op=st.sampled_from(["sum", "mean"]))
def test_sum_mean_every_axis_and_keepdims(data, keepdims, op):
    a = data.draw(arrays(shapes(max_dims=4, max_side=3)))
    axis = data.draw(axes(a.ndim))
    fn = weighted(lambda x: getattr(x, op)(axis=axis, keepdims=keepdims))
    assert gradcheck(fn, (leaf(a),), **TOL)


@given(data=st.data(), keepdims=st.booleans())
def test_max_every_axis_and_keepdims(data, keepdims):
    a = data.draw(arrays(shapes(min_dims=1, max_dims=3, max_side=3), min_gap=0.05))
    axis = data.draw(axes(a.ndim))
    assert gradcheck(weighted(lambda x: x.max(axis=axis, keepdims=keepdims)), (leaf(a),), **TOL)


def test_max_splits_the_gradient_between_ties():
    x = leaf([1.0, 3.0, 3.0, 2.0])
    x.max().backward()
    np.testing.assert_array_equal(x.grad, [0.0, 0.5, 0.5, 0.0])


@pytest.mark.parametrize(
    "fn, low, high",
    [
        (lambda x: x.exp(), -2, 2),
        (lambda x: x.log(), 0.2, 3),
        (lambda x: x.sqrt(), 0.2, 3),
        (lambda x: x.tanh(), -2, 2),
        (lambda x: -x, -2, 2),
        (F.gelu, -3, 3),
        (lambda x: F.gelu(x, approximate="tanh"), -3, 3),
    ],
)
@given(data=st.data())
def test_unary(fn, low, high, data):
    a = data.draw(arrays(shapes(max_dims=3), low=low, high=high))
    assert gradcheck(weighted(fn), (leaf(a),), **TOL)


@given(a=arrays(shapes(max_dims=3), margin=0.01))
def test_abs_away_from_the_kink(a):
    assert gradcheck(weighted(abs), (leaf(a),), **TOL)


def test_comparisons_give_boolean_tensors_outside_the_graph():
    x = leaf([1.0, -2.0, 3.0])
    for mask, expected in ((x > 0.0, [1, 0, 1]), (x <= 1.0, [1, 1, 0]), (x < x * 0.0, [0, 1, 0]), (x >= 3, [0, 0, 1])):
        assert mask.dtype == np.bool_ and not mask.requires_grad
        np.testing.assert_array_equal(mask.data, np.array(expected, dtype=bool))


@given(a=arrays(shapes(max_dims=3), margin=0.01).filter(lambda a: np.any(a > 0)))
def test_relu_away_from_the_kink(a):
    assert gradcheck(weighted(F.relu), (leaf(a),), **TOL)


@given(data=st.data(), op=st.sampled_from(["softmax", "log_softmax"]))
def test_softmax_and_log_softmax_any_axis(data, op):
    a = data.draw(arrays(shapes(min_dims=1, max_dims=3, min_side=2, max_side=4), low=-5, high=5))
    axis = data.draw(st.integers(-a.ndim, a.ndim - 1))
    assert gradcheck(weighted(lambda x: getattr(F, op)(x, axis=axis)), (leaf(a),), **TOL)


def test_softmax_is_stable_for_huge_logits():
    y = F.softmax(Tensor(np.array([1000.0, 1000.0, -1000.0])))
    np.testing.assert_allclose(y.data, [0.5, 0.5, 0.0])
    ls = F.log_softmax(Tensor(np.array([1000.0, 0.0])))
    np.testing.assert_allclose(ls.data, [0.0, -1000.0])


@given(data=st.data())
def test_reshape_permute_swapaxes_transpose(data):
    a = data.draw(arrays(shapes(min_dims=2, max_dims=4, max_side=3)))
    perm = data.draw(st.permutations(range(a.ndim)))
    assert gradcheck(weighted(lambda x: x.reshape(-1)), (leaf(a),), **TOL)
    assert gradcheck(weighted(lambda x: x.permute(*perm)), (leaf(a),), **TOL)
    assert gradcheck(weighted(lambda x: x.swapaxes(0, -1)), (leaf(a),), **TOL)
    assert gradcheck(weighted(lambda x: x.transpose(0, 1) * 1.0), (leaf(a),), **TOL)
    assert gradcheck(weighted(lambda x: x.T), (leaf(a),), **TOL)


@given(data=st.data())
def test_getitem_slices_integers_and_repeated_indices(data):
    a = data.draw(arrays(shapes(min_dims=1, max_dims=3, min_side=2, max_side=4), margin=0.1))
    idx = data.draw(st.lists(st.integers(0, a.shape[0] - 1), min_size=1, max_size=6))
    assert gradcheck(weighted(lambda x: x[np.array(idx)]), (leaf(a),), **TOL)
    assert gradcheck(weighted(lambda x: x[1:, ...]), (leaf(a),), **TOL)
    assert gradcheck(weighted(lambda x: x[-1]), (leaf(a),), **TOL)
    if np.any(a > 0):
        assert gradcheck(weighted(lambda x: x[a > 0]), (leaf(a),), **TOL)


def test_repeated_indices_accumulate():
    x = leaf(np.zeros(3))
    x[np.array([0, 0, 2, 0])].backward(np.array([1.0, 2.0, 3.0, 4.0]))
    np.testing.assert_array_equal(x.grad, [7.0, 0.0, 3.0])


@given(data=st.data(), axis=st.integers(-4, 3))
def test_concatenate_and_stack(data, axis):
    """3-D inputs, every axis: on 2-D ones at axes 0 and 1 stack's backward could move the wrong way unseen."""
    a = data.draw(arrays((2, 3, 2)))
    b = data.draw(arrays((2, 3, 2)))
    if axis == 3 or axis == -4:  # one past the last: stack only
        assert gradcheck(weighted(lambda x, y: stack([x, y], axis=axis)), (leaf(a), leaf(b)), **TOL)
        return
    assert gradcheck(weighted(lambda x, y: concatenate([x, y, x], axis=axis)), (leaf(a), leaf(b)), **TOL)
    assert gradcheck(weighted(lambda x, y: stack([x, y], axis=axis)), (leaf(a), leaf(b)), **TOL)


@given(a=arrays((3, 4), margin=0.1), mask=arrays((1, 4)).map(lambda m: m > 0).filter(lambda m: not m.all()))
def test_masked_fill(a, mask):
    assert gradcheck(weighted(lambda x: x.masked_fill(mask, -7.0)), (leaf(a),), **TOL)
    y = Tensor(a).masked_fill(mask, -7.0)
    assert np.all(y.data[np.broadcast_to(mask, a.shape)] == -7.0)


@given(x=arrays((2, 3, 4), margin=0.1), w=arrays((5, 4), margin=0.1), b=arrays((5,)))
def test_linear_matches_its_definition(x, w, b):
    assert gradcheck(weighted(F.linear), (leaf(x), leaf(w), leaf(b)), **TOL)
    assert gradcheck(weighted(F.linear), (leaf(x), leaf(w)), **TOL)
    np.testing.assert_allclose(F.linear(Tensor(x), Tensor(w), Tensor(b)).data, x @ w.T + b)


@given(w=arrays((5, 3)), idx=st.lists(st.integers(0, 4), min_size=1, max_size=8))
def test_embedding(w, idx):
    assert gradcheck(weighted(lambda t: F.embedding(np.array(idx), t)), (leaf(w),), **TOL)


@given(
    logits=arrays((5, 4), low=-3, high=3),
    targets=st.lists(st.sampled_from([-100, 0, 1, 2, 3]), min_size=5, max_size=5).filter(
        lambda t: any(v != -100 for v in t)
    ),
    reduction=st.sampled_from(["mean", "sum", "none"]),
)
def test_cross_entropy(logits, targets, reduction):
    t = np.array(targets)
    fn = weighted(lambda z: F.cross_entropy(z, t, reduction=reduction))
    assert gradcheck(fn, (leaf(logits),), **TOL)
    # value: the mean over counted targets of -log softmax
    log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    nll = np.array([-log_p[i, c] if c != -100 else 0.0 for i, c in enumerate(targets)])
    expected = {"none": nll, "sum": nll.sum(), "mean": nll.sum() / np.sum(t != -100)}[reduction]
    np.testing.assert_allclose(F.cross_entropy(Tensor(logits), t, reduction=reduction).data, expected)


def test_cross_entropy_with_spatial_dims():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 3, 4))  # (N, C, d1), as PyTorch
    t = rng.integers(0, 3, (2, 4))
    assert gradcheck(weighted(lambda z: F.cross_entropy(z, t, reduction="none")), (leaf(logits),), **TOL)


def test_pow_gradients_where_the_formulas_give_nan():
    """x^0 is constant (dL/dx 0, not 0 * 0^-1) and 0^p constant for p >= 0 (dL/dp 0, not 0 * log 0), as torch."""
    x = leaf([0.0, 2.0])
    (x**0).sum().backward()
    np.testing.assert_array_equal(x.grad, [0.0, 0.0])
    x, p = leaf([0.0, 0.0, 0.0, 2.0]), leaf([0.0, 0.5, 2.0, 0.0])
    (x**p).sum().backward()
    np.testing.assert_array_equal(x.grad, [0.0, np.inf, 0.0, 0.0])  # 0.5 * 0^-0.5 = inf, as torch
    np.testing.assert_array_equal(p.grad, [0.0, 0.0, 0.0, np.log(2.0)])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_every_target_ignored(reduction):
    x = leaf(np.random.default_rng(0).standard_normal((3, 4)))
    loss = F.cross_entropy(x, np.full(3, -100), reduction=reduction)
    expected = {"mean": np.nan, "sum": 0.0, "none": np.zeros(3)}[reduction]  # mean: 0 / 0, as torch
    np.testing.assert_array_equal(loss.data, expected)
    loss.backward(np.ones(loss.shape))
    np.testing.assert_array_equal(x.grad, np.zeros((3, 4)))


def test_cross_entropy_ignored_row_with_minus_inf_logit():
    """The ignored row's placeholder class 0 has log p = -inf: its loss must be 0, not -(-inf) * 0 = nan."""
    x = leaf([[0.0, 1.0, 2.0], [-np.inf, 0.0, 1.0]])
    expected = np.log(1 + np.e + np.e**2) - 1  # -log softmax([0, 1, 2])[1]
    np.testing.assert_allclose(F.cross_entropy(x, np.array([1, -100]), reduction="none").data, [expected, 0.0])
    loss = F.cross_entropy(x, np.array([1, -100]))
    np.testing.assert_allclose(loss.data, expected)
    loss.backward()
    p = np.exp([0.0, 1.0, 2.0]) / np.exp([0.0, 1.0, 2.0]).sum()
    np.testing.assert_allclose(x.grad, [p - [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
