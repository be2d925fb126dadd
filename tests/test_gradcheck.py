"""The verification tools themselves: they catch wrong rules and never pass one by accident."""

import re

import numpy as np
import pytest
from hypothesis import given

import minigrad_norm.functional as F
from minigrad_norm import Function, GradcheckError, Tensor, gradcheck, jacobian, numerical_jacobian
from minigrad_norm.gradcheck import gradcheck_report
from minigrad_norm.testing import arrays, shapes


def leaf(a, dtype=np.float64):
    return Tensor(np.asarray(a, dtype=dtype), requires_grad=True)


class MatVec(Function):
    """y = A x, with a backward chosen by ``mode``: right, off by a factor, or transposed."""

    mode = "right"

    @staticmethod
    def forward(ctx, a, x):
        ctx.save_for_backward(a, x)
        return a @ x

    @staticmethod
    def backward(ctx, g):
        a, x = ctx.saved_tensors
        da = np.outer(g, x)
        dx = {"right": a.T @ g, "factor": 2 * (a.T @ g), "transpose": a @ g}[MatVec.mode]
        return da, dx


@pytest.fixture
def matvec_inputs(rng):
    return leaf(rng.standard_normal((3, 3))), leaf(rng.standard_normal(3))


@pytest.mark.parametrize("method", ["central", "complex"])
def test_catches_a_backward_off_by_a_factor_or_a_transpose(matvec_inputs, method, monkeypatch):
    monkeypatch.setattr(MatVec, "mode", "right")
    assert gradcheck(MatVec.apply, matvec_inputs, method=method)
    for wrong in ("factor", "transpose"):
        monkeypatch.setattr(MatVec, "mode", wrong)
        assert not gradcheck(MatVec.apply, matvec_inputs, raise_exception=False, method=method)
        with pytest.raises(GradcheckError, match=r"Jacobian mismatch for input 1 \(shape \(3,\)\)"):
            gradcheck(MatVec.apply, matvec_inputs, method=method)


def test_failure_message_names_the_worst_element_and_both_values():
    class Cube(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x**3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            wrong = 3 * x**2
            wrong[1, 2] += 0.5  # one bad entry
            return g * wrong

    x = leaf(np.ones((2, 3)))
    with pytest.raises(GradcheckError) as e:
        gradcheck(Cube.apply, (x,))
    msg = str(e.value)
    assert "input 0 (shape (2, 3))" in msg
    assert "input element (1, 2)" in msg and "output element (1, 2)" in msg
    assert re.search(r"analytic 3\.5\b", msg) and re.search(r"numerical 3(\.0+)?\b", msg)
    assert "1 of 36 entries disagree" in msg


def test_a_wrong_rule_that_a_plain_sum_would_hide_is_caught():
    """LayerNorm-like centering: sum(y) is constant, so a loss of sum(y) has gradient 0
    whatever the rule. The full Jacobian exposes a backward that forgets the centering term."""

    class Center(Function):
        @staticmethod
        def forward(ctx, x):
            return x - x.mean()

        @staticmethod
        def backward(ctx, g):
            return g  # forgets -mean(g)

    x = leaf([1.0, 2.0, 4.0])
    assert not gradcheck(Center.apply, (x,), raise_exception=False)


def test_refuses_float32_inputs():
    with pytest.raises(TypeError, match=r"gradcheck: input 0 \(shape \(2,\)\) is float32.*float64"):
        gradcheck(lambda t: t * 2.0, (leaf([1.0, 2.0], np.float32),))


def test_catches_a_function_that_modifies_its_input():
    def bad(t):
        t.data[0] += 1.0
        return t * 2.0

    report = gradcheck_report(bad, (leaf([1.0, 2.0]),))
    assert not report.passed and "modified input 0" in report.message


def test_catches_a_nondeterministic_backward():
    calls = {"n": 0}

    class Flaky(Function):
        @staticmethod
        def forward(ctx, x):
            return 2 * x

        @staticmethod
        def backward(ctx, g):
            calls["n"] += 1
            return 2 * g + (1e-3 if calls["n"] > 2 else 0.0)

    report = gradcheck_report(Flaky.apply, (leaf([1.0, 2.0]),))
    assert not report.passed and "not deterministic" in report.message


def test_warns_when_the_check_is_vacuous():
    with pytest.warns(UserWarning, match="below atol"):
        assert gradcheck(lambda t: t * 1e-9, (leaf([1.0, 2.0]),))


def test_nan_on_either_side_fails():
    class NaNGrad(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return g * np.nan

    assert not gradcheck(NaNGrad.apply, (leaf([1.0]),), raise_exception=False)
    # caught by the entrywise comparison itself, not only by the check of random output gradients
    with pytest.raises(GradcheckError, match="Jacobian mismatch"):
        gradcheck(NaNGrad.apply, (leaf([1.0]),))
    # log of a negative number: NaN forward, so NaN finite differences
    with np.errstate(invalid="ignore"):
        assert not gradcheck(lambda t: t.log(), (leaf([-1.0]),), raise_exception=False)


def test_a_zero_or_missing_gradient_fails_as_a_jacobian_mismatch(monkeypatch):
    monkeypatch.setattr(SinWith, "rule", staticmethod(lambda g: 0.0 * g))
    with pytest.raises(GradcheckError, match="Jacobian mismatch"):
        gradcheck(SinWith.apply, (leaf([0.1, 0.5]),))


def test_jacobians_are_2d_out_by_in_and_leave_grads_alone(rng):
    a = leaf(rng.standard_normal((2, 3)))
    w = leaf(rng.standard_normal(3))
    (j_a,) = jacobian(lambda t: t * w.data, (a,))
    assert j_a.shape == (6, 6)
    np.testing.assert_array_equal(j_a, np.diag(np.tile(w.data, 2)))
    ja, jw = jacobian(lambda t, u: t * u, (a, w))
    assert jw.shape == (6, 3)
    np.testing.assert_allclose(jw, np.vstack([np.diag(a.data[0]), np.diag(a.data[1])]))
    assert a.grad is None and w.grad is None


def test_only_inputs_that_require_grad_are_differentiated(rng):
    a = leaf(rng.standard_normal(3))
    c = Tensor(rng.standard_normal(3))
    assert len(jacobian(lambda x, y: x * y, (a, c))) == 1
    assert len(numerical_jacobian(lambda x, y: x * y, (a, c))) == 1


def test_tuple_outputs_stack_their_rows(rng):
    a = leaf(rng.standard_normal(2))
    (j,) = jacobian(lambda x: (x * 2.0, x.sum()), (a,))
    np.testing.assert_allclose(j, np.vstack([2 * np.eye(2), np.ones((1, 2))]))


@given(x=arrays(shapes(min_dims=1, max_dims=2, max_side=4), low=0.5, high=2.0))
def test_complex_step_is_exact_to_machine_precision(x):
    """imag(f(x + ih))/h has no cancellation: it matches the analytic derivative to ~1e-15,
    where central differences can only reach ~1e-10."""

    def f(t):
        return (t.exp() * t.sqrt() + t.tanh() / t).log() + t**2.5

    (j_cs,) = numerical_jacobian(f, (leaf(x),), method="complex")
    (j_rev,) = jacobian(f, (leaf(x),))
    np.testing.assert_allclose(j_cs, j_rev, rtol=1e-13, atol=1e-14)


def test_complex_step_through_softmax_matmul_and_cross_entropy(rng):
    z = leaf(rng.standard_normal((4, 5)))
    w = rng.standard_normal((5, 5))
    t = np.array([0, 4, 2, 1])

    def loss(logits):
        return F.cross_entropy(F.softmax(logits @ w, axis=-1) * 3.0, t) + F.log_softmax(logits).mean()

    (j_cs,) = numerical_jacobian(loss, (z,), method="complex")
    (j_rev,) = jacobian(loss, (z,))
    np.testing.assert_allclose(j_cs, j_rev, rtol=1e-12, atol=1e-15)
    assert gradcheck(loss, (z,), method="complex", atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize(
    "fn, op",
    [
        (F.relu, "relu"),
        (lambda t: t.max(), "max"),
        (lambda t: abs(t), "abs"),
        (lambda t: t * (t > 0.0), "greater"),
        (lambda t: F.gelu(t), "gelu"),
    ],
)
def test_complex_step_refuses_non_analytic_ops(fn, op):
    with pytest.raises(TypeError, match=rf"{op}.*(not analytic|no complex).*method='central'"):
        numerical_jacobian(fn, (leaf([1.0, -2.0]),), method="complex")


def test_numerical_jacobian_does_not_modify_inputs(rng):
    x = rng.standard_normal(4)
    snapshot = x.copy()
    t = leaf(x)
    numerical_jacobian(lambda u: u * u, (t,))
    numerical_jacobian(lambda u: u * u, (t,), method="complex")
    np.testing.assert_array_equal(x, snapshot)
    assert t.data is x


def test_bad_arguments():
    with pytest.raises(ValueError, match="method must be 'central' or 'complex'"):
        numerical_jacobian(lambda u: u, (leaf([1.0]),), method="forward")
    with pytest.raises(ValueError, match="no input requires grad"):
        gradcheck(lambda u: u, (Tensor(np.ones(2)),))
    with pytest.raises(TypeError, match="input 0 is a ndarray"):
        gradcheck(lambda u: u, (np.ones(2),))


class StableSoftplus(Function):
    """softplus(x) = max(x, 0) + log1p(exp(-|x|)), the usual overflow-free form: not complex-analytic
    (``np.abs`` of a complex number is its modulus). ``mode`` picks the backward: the right one, or
    relu's derivative, which is exactly what a complex step through this forward computes."""

    mode = "right"

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        right = 1 / (1 + np.exp(-x))
        return g * (right if StableSoftplus.mode == "right" else (x > 0))


def test_complex_step_through_a_non_analytic_forward_fails_instead_of_passing_a_wrong_rule(monkeypatch):
    x = leaf([-1.0, 0.5, 2.0])
    assert gradcheck(StableSoftplus.apply, (x,))
    monkeypatch.setattr(StableSoftplus, "mode", "relu")
    with pytest.raises(GradcheckError, match="Jacobian mismatch"):
        gradcheck(StableSoftplus.apply, (x,))
    # the complex step agrees with the wrong rule; the cross-check with central differences catches it
    (j_cs,) = numerical_jacobian(StableSoftplus.apply, (x,), method="complex")
    np.testing.assert_array_equal(np.diag(j_cs), [0.0, 1.0, 1.0])
    for mode in ("relu", "right"):
        monkeypatch.setattr(StableSoftplus, "mode", mode)
        with pytest.raises(GradcheckError, match=r"not complex-analytic.*method='central'"):
            gradcheck(StableSoftplus.apply, (x,), method="complex")


def test_complex_step_refuses_an_output_that_came_back_real():
    class RealPart(Function):
        @staticmethod
        def forward(ctx, x):
            return np.real(x) * 2.0

        @staticmethod
        def backward(ctx, g):
            return g  # wrong (2 g), and a complex step that read 0 would not say so

    with pytest.raises(TypeError, match=r"real output for a complex input 0.*method='central'"):
        numerical_jacobian(RealPart.apply, (leaf([1.0, 2.0]),), method="complex")
    with pytest.raises(TypeError, match="real output"):
        gradcheck(RealPart.apply, (leaf([1.0, 2.0]),), method="complex")


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_complex_step_reaches_the_weight_and_bias_of_every_norm(backend, rng):
    """A complex weight or bias must keep its imaginary part through the norms (the numba kernels are real:
    any complex array goes to the reference), so that the complex step sees their derivatives."""
    import minigrad_norm as mg

    x2, x3 = leaf(rng.standard_normal((3, 5))), leaf(rng.standard_normal((2, 4, 3)))
    w5, b5 = leaf(rng.standard_normal(5)), leaf(rng.standard_normal(5))
    w4, b4 = leaf(rng.standard_normal(4)), leaf(rng.standard_normal(4))
    cases = [
        (lambda x, w, b: F.layer_norm(x, 5, w, b), (x2, w5, b5)),
        (lambda x, w: F.rms_norm(x, 5, w), (x2, w5)),
        (lambda x, w, b: F.group_norm(x, 2, w, b), (x3, w4, b4)),
        (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), (x3, w4, b4)),
        (lambda x, w, b: F.instance_norm(x, weight=w, bias=b), (x3, w4, b4)),
    ]
    with mg.use_backend(backend):
        for fn, inputs in cases:
            assert gradcheck(fn, inputs, method="complex")


def test_a_tensor_passed_twice_is_refused():
    """The gradient of a Tensor used twice is the sum over both uses, a finite difference moves one
    argument: a rule wrong by exactly half would pass. Refused in every tool."""
    x = leaf([1.0, -2.0, 0.5])
    for tool in (gradcheck, jacobian, numerical_jacobian):
        with pytest.raises(ValueError, match=r"inputs 0 and 1 are the same Tensor"):
            tool(lambda a, b: a * b, (x, x))
    y = Tensor(x.data.copy(), requires_grad=True)
    assert gradcheck(lambda a, b: a * b, (x, y))
    c = Tensor(np.ones(3))  # a constant may appear twice
    assert gradcheck(lambda a, b, d: a * b * d, (x, c, c))


def test_jacobian_records_the_graph_inside_no_grad(rng):
    import minigrad_norm as mg

    x = leaf(rng.standard_normal(3))
    expected = jacobian(lambda t: t * t, (x,))
    with mg.no_grad():
        got = jacobian(lambda t: t * t, (x,))
        assert gradcheck(lambda t: t * t, (x,))
        assert not mg.is_grad_enabled()
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[0], np.diag(2 * x.data))


def test_float32_output_and_non_tensor_output_are_refused():
    class Sin32(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return np.sin(x).astype(np.float32)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * np.cos(x)

    with pytest.raises(TypeError, match=r"output 0 of fn \(shape \(4,\)\) is float32"):
        gradcheck(Sin32.apply, (leaf(np.linspace(0, 1, 4)),))
    with pytest.raises(TypeError, match="fn must return a Tensor or a tuple of Tensors, got float"):
        gradcheck(lambda t: float(t.data.sum()), (leaf([1.0]),))


def test_central_differences_divide_by_the_step_taken_at_large_inputs():
    x = leaf([3e7, -4.1e7, 1e9])
    assert gradcheck(lambda t: t * 3.0, (x,))
    (j,) = numerical_jacobian(lambda t: t * 3.0, (x,))
    np.testing.assert_allclose(np.diag(j), 3.0, rtol=1e-9)
    with pytest.raises(ValueError, match=r"eps=1e-06 vanishes next to input 0's element 0"):
        numerical_jacobian(lambda t: t * 3.0, (leaf([1e11]),))


def test_a_nondeterministic_forward_is_named():
    draws = iter(np.random.default_rng(0).standard_normal(10_000))

    def noisy(t):
        return t * (1.0 + 1e-3 * next(draws))

    with pytest.raises(GradcheckError, match="fn is not deterministic"):
        gradcheck(noisy, (leaf([1.0, 2.0]),))


def test_tuple_outputs_and_empty_inputs_are_named_and_shaped(rng):
    class Square(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x  # wrong: 2 x g

    x = leaf(rng.standard_normal((2, 2)))
    with pytest.raises(GradcheckError, match=r"at output 1 element \(\d, \d\)"):
        gradcheck(lambda t: (t * 2.0, Square.apply(t)), (x,))
    empty = leaf(np.zeros((0, 3)))
    (j_x, j_e) = jacobian(lambda t, e: t * 2.0 + e.sum(), (x, empty))
    assert j_x.shape == (4, 4) and j_e.shape == (4, 0)


@given(arrays(shapes(min_dims=1, max_dims=1, max_side=3), low=0.0, high=1.0, min_gap=0.3))
def test_min_gap_arrays_stay_in_range_and_apart(a):
    assert a.min() >= 0.0 and a.max() <= 1.0
    flat = np.sort(a.ravel())
    assert np.all(np.diff(flat) >= 0.3 - 1e-12)


class SinWith(Function):
    """y = sin(x), dL/dx = cos(x) * rule(g): right when ``rule`` is the identity."""

    rule = staticmethod(lambda g: g)

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.sin(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return np.cos(x) * SinWith.rule(g)


@pytest.mark.parametrize(
    "rule",
    [
        lambda g: np.clip(g, -1.0, 1.0),
        lambda g: np.clip(g, -250.0, 250.0),
        lambda g: g**2,
        np.abs,
        np.sign,
        lambda g: g / np.abs(g).max(),
    ],
)
@pytest.mark.parametrize("method", ["central", "complex"])
@pytest.mark.parametrize("reduce", [False, True])
def test_a_backward_that_is_not_linear_in_its_gradient_is_caught(rule, method, reduce, monkeypatch):
    """Each rule gives rule(1) = 1 and rule(0) = 0, so every unit vector seed gets the right row of J."""
    x = leaf([0.1, 0.5, 1.0, -0.3])
    fn = (lambda t: SinWith.apply(t).sum()) if reduce else SinWith.apply
    assert gradcheck(fn, (x,), method=method)
    monkeypatch.setattr(SinWith, "rule", staticmethod(rule))
    np.testing.assert_allclose(np.diag(jacobian(SinWith.apply, (x,))[0]), np.cos(x.data), rtol=1e-15)
    with pytest.raises(GradcheckError, match="not linear in its incoming gradient"):
        gradcheck(fn, (x,), method=method)


def test_the_linearity_check_holds_a_rule_to_its_stated_bound(monkeypatch):
    """A rule 1 % off for |g| > 2 is right on every unit vector; the stated bound, about 0.2 % of |v| here,
    catches it (a bound 100 times as wide would not)."""
    x = leaf([0.1, 0.5, 1.0, -0.3])
    monkeypatch.setattr(SinWith, "rule", staticmethod(lambda g: np.where(np.abs(g) > 2, 1.01 * g, g)))
    with pytest.raises(GradcheckError, match="not linear in its incoming gradient"):
        gradcheck(SinWith.apply, (x,))


def test_a_backward_that_writes_into_its_gradient_is_caught():
    """In a graph the gradient array is shared (``a + b`` hands the same one to both inputs): writing into it
    changes a sibling's gradient."""

    class Double(Function):
        @staticmethod
        def forward(ctx, x):
            return 2 * x

        @staticmethod
        def backward(ctx, g):
            g *= 2
            return g

    x, y = leaf([1.0, 2.0, 3.0]), leaf([4.0, 5.0, 6.0])
    (Double.apply(x) + y).backward(np.ones(3))
    assert y.grad.tolist() == [2.0, 2.0, 2.0]  # the harm: y's gradient is 1
    with pytest.raises(GradcheckError, match="wrote into the gradient it was given"):
        gradcheck(Double.apply, (leaf([1.0, 2.0]),))
    with pytest.raises(GradcheckError, match="wrote into the gradient it was given"):
        jacobian(Double.apply, (leaf([1.0, 2.0]),))


def test_the_vacuous_check_warning_names_each_input_below_atol():
    class ScaledAdd(Function):
        @staticmethod
        def forward(ctx, x, y):
            return x + 1e-6 * y

        @staticmethod
        def backward(ctx, g):
            return g, None  # y's gradient forgotten, and inside atol

    with pytest.warns(UserWarning, match=r"input\(s\) 1 is below atol"):
        assert gradcheck(ScaledAdd.apply, (leaf([1.0, 2.0]), leaf([3.0, 4.0])))


def test_caller_arrays_stay_as_they_were_whatever_fn_and_its_backward_write():
    x_arr, y_arr = np.array([1.0, 2.0]), np.array([10.0, 20.0])

    def writes_y(x, y):
        y.data += 1.0
        return x * y

    class WritesSaved(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            x *= 2  # the input's own array
            return g * x

    x, y = Tensor(x_arr, requires_grad=True), Tensor(y_arr, requires_grad=True)
    numerical_jacobian(writes_y, (x, y))
    jacobian(writes_y, (x, y))
    report = gradcheck_report(writes_y, (x, y))
    assert not report.passed and "fn modified input 1 in place" in report.message
    report = gradcheck_report(WritesSaved.apply, (x,))
    assert not report.passed and "the backward of fn modified input 0 in place" in report.message
    assert x_arr.tolist() == [1.0, 2.0] and y_arr.tolist() == [10.0, 20.0]
    assert x.data is x_arr and x.grad is None


def test_an_input_from_another_graph_is_differentiated_as_a_leaf():
    a = leaf([1.0, 2.0, 3.0])
    x = a.exp()
    x.sum().backward()  # releases exp's saved arrays: a backward that ran on into exp would raise
    assert gradcheck(lambda t: t * t, (x,))
    np.testing.assert_array_equal(jacobian(lambda t: t * t, (x,))[0], np.diag(2 * np.exp([1.0, 2.0, 3.0])))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"atol": -1.0}, ValueError, r"atol must be finite and >= 0, got -1"),
        ({"atol": np.nan}, ValueError, r"atol must be finite and >= 0, got nan"),
        ({"rtol": np.inf}, ValueError, r"rtol must be finite and >= 0, got inf"),
        ({"rtol": "1e-3"}, TypeError, r"rtol must be a real number, got str"),
        ({"eps": np.nan}, ValueError, r"eps must be finite and > 0, got nan"),
        ({"eps": 0.0}, ValueError, r"eps must be finite and > 0, got 0"),
        ({"method": "forward"}, ValueError, r"method must be 'central' or 'complex', got 'forward'"),
    ],
)
def test_bad_gradcheck_arguments_are_refused_before_fn_runs(kwargs, error, match):
    calls = []

    def fn(t):
        calls.append(1)
        return t * t

    with pytest.raises(error, match=rf"gradcheck: {match}"):
        gradcheck(fn, (leaf([1.0, 2.0]),), **kwargs)
    assert calls == []


def test_a_non_finite_input_is_named():
    with pytest.raises(ValueError, match=r"input 1 \(shape \(2,\)\) holds inf at \(1,\).*finite"):
        gradcheck(lambda a, b: a * b, (leaf([1.0, 2.0]), leaf([3.0, np.inf])))
    with pytest.raises(ValueError, match="numerical_jacobian: eps must be finite and > 0, got nan"):
        numerical_jacobian(lambda t: t, (leaf([1.0]),), eps=np.nan)


class Shifted(Function):
    """y = x^2 + 1e9: analytic, with outputs whose central differences cancel 15 digits."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x + 1e9

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


def test_complex_step_passes_an_analytic_forward_where_central_differences_are_coarse():
    x = leaf([0.3, -1.2, 2.0])
    (c,) = numerical_jacobian(Shifted.apply, (x,))
    assert np.abs(np.diag(c) - 2 * x.data).max() > 1e-2  # central differences: 1e9 * u / 1e-6 = 0.2 of noise
    assert gradcheck(Shifted.apply, (x,), method="complex")
    big = leaf([1e11, -2e11])
    assert gradcheck(lambda t: (t * 1e-11).tanh() * 1e11, (big,), method="complex")


class AbsSquaredShifted(Function):
    """y = x conj(x) + c: not complex-analytic, so the complex step gives 0 where dy/dx = 2x; the backward here
    agrees with the complex step."""

    shift = 1e9

    @staticmethod
    def forward(ctx, x):
        return x * np.conj(x) + AbsSquaredShifted.shift

    @staticmethod
    def backward(ctx, g):
        return 0.0 * g


@pytest.mark.parametrize("shift", [1e6, 1e9])
def test_the_complex_step_cross_check_allows_no_more_than_the_roundoff_of_large_outputs(shift, monkeypatch):
    """The cross-check's allowance for central differences' roundoff, about 16 u |f| / h, is 3.6 for f = 1e9 and
    h = 1e-6 * max|x| = 3e-6 (Shifted above needs about 0.2 of it); a wrong rule 4 to 6 off is still caught."""
    monkeypatch.setattr(AbsSquaredShifted, "shift", shift)
    with pytest.raises(GradcheckError, match="not complex-analytic"):
        gradcheck(AbsSquaredShifted.apply, (leaf([2.0, 3.0]),), method="complex")


def test_complex_step_gives_a_zero_column_for_an_input_fn_does_not_use():
    x, y = leaf([1.0, 2.0]), leaf([3.0, 4.0])
    jx, jy = numerical_jacobian(lambda a, b: a * 2.0, (x, y), method="complex")
    np.testing.assert_array_equal(jx, 2 * np.eye(2))
    np.testing.assert_array_equal(jy, np.zeros((2, 2)))
    with pytest.warns(UserWarning, match=r"input\(s\) 1 is below atol"):
        assert gradcheck(lambda a, b: a * 2.0, (x, y), method="complex")


def test_complex_step_defaults_are_tight_enough_for_a_slightly_wrong_eps():
    """RMS normalization whose backward uses eps = 1e-4 where its forward uses 1e-5: about 1e-4 off, inside
    central differences' rtol, outside the complex step's."""

    class RMS(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x / np.sqrt((x * x).mean() + 1e-5)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            r = 1 / np.sqrt((x * x).mean() + 1e-4)
            return r * g - x * r**3 * (g * x).sum() / x.size

    x = leaf([0.5, -1.0, 0.75])
    assert gradcheck(RMS.apply, (x,))
    with pytest.raises(GradcheckError, match=r"Jacobian mismatch.*\(complex\).*atol 1e-08 \+ rtol 1e-06"):
        gradcheck(RMS.apply, (x,), method="complex")


def test_the_complex_step_cross_check_allows_central_differences_truncation_at_large_inputs():
    """Its step is 1e-6 times the largest |input|: 0.03 for an unrelated input of 3e4, 0.1 at x = 1e5, where
    the truncation of central differences (h^2 f''' / 6) exceeded the tolerances of a right rule."""
    assert gradcheck(lambda a, b: a**3 + b, (leaf([0.5]), leaf([3e4])), method="complex")
    assert gradcheck(lambda a: a**3, (leaf([0.5, 1e5]),), method="complex")
    assert gradcheck(SinWith.apply, (leaf([0.3, 1e5, 1e6]),), method="complex")
    assert gradcheck(lambda a, b: a.exp() * b, (leaf([0.5]), leaf([1e5])), method="complex")
    # a non-analytic forward differs by its whole derivative, whatever the step: still refused
    with pytest.raises(GradcheckError, match="not complex-analytic"):
        gradcheck(lambda a, b: AbsSquaredShifted.apply(a) + b, (leaf([0.5, 2.0]), leaf([3e4])), method="complex")


def test_a_mismatch_within_central_differences_roundoff_says_so(monkeypatch):
    def fn(t):  # a right rule, whose output is far from 0
        return (t * t).sum() * 0.01 + 1e6

    with pytest.raises(GradcheckError, match=r"Jacobian mismatch.*central differences' roundoff here is about"):
        gradcheck(fn, (leaf([0.3, -0.7, 1.1]),))
    assert gradcheck(fn, (leaf([0.3, -0.7, 1.1]),), method="complex")
    monkeypatch.setattr(SinWith, "rule", staticmethod(lambda g: 2 * g))  # wrong far above the roundoff: no hint
    with pytest.raises(GradcheckError, match="Jacobian mismatch") as e:
        gradcheck(SinWith.apply, (leaf([0.3]),))
    assert "roundoff" not in str(e.value)


def test_a_graph_cut_inside_fn_is_named():
    with pytest.raises(GradcheckError, match=r"no output of fn reaches input 0 in the graph.*\.data"):
        gradcheck(lambda a: Tensor(np.sin(a.data)), (leaf([0.3, 0.5]),))
    with pytest.raises(GradcheckError, match=r"Jacobian mismatch") as e:  # a zero rule on a connected graph
        gradcheck(lambda a: a * 0.0 + Tensor(np.sin(a.data)), (leaf([0.3, 0.5]),))
    assert "reaches" not in str(e.value)


def test_numerical_jacobian_refuses_float32_central_differences():
    with pytest.raises(TypeError, match=r"numerical_jacobian: input 0 \(shape \(2,\)\) is float32"):
        numerical_jacobian(lambda t: t * 2.0, (leaf([1.0, 2.0], np.float32),))


def test_a_forward_without_a_complex_version_is_named_under_the_complex_step():
    class LogAddExp(Function):
        @staticmethod
        def forward(ctx, x):
            return np.logaddexp(x, 0.0)

        @staticmethod
        def backward(ctx, g):
            raise AssertionError("not reached")

    with pytest.raises(TypeError, match=r"numerical_jacobian: fn failed on a complex input 0 .*method='central'"):
        numerical_jacobian(LogAddExp.apply, (leaf([0.5]),), method="complex")


def test_a_function_has_one_output_and_positional_tensor_inputs():
    class Two(Function):
        @staticmethod
        def forward(ctx, x):
            return x.mean(), x.std()

        @staticmethod
        def backward(ctx, g):
            raise AssertionError("not reached")

    class Scale(Function):
        @staticmethod
        def forward(ctx, x, w=None):
            return x * w

        @staticmethod
        def backward(ctx, g):
            raise AssertionError("not reached")

    with pytest.raises(TypeError, match=r"Two.forward returned a tuple; a Function has one output"):
        Two.apply(leaf([1.0, 2.0]))
    with pytest.raises(TypeError, match=r"Scale.apply: keyword argument\(s\) w are Tensors"):
        Scale.apply(leaf([1.0]), w=leaf([2.0]))
    np.testing.assert_array_equal(Scale.apply(leaf([1.0]), w=2.0).data, [2.0])  # a number by keyword is fine
