"""The tape: graph traversal, accumulation, released graphs, no_grad, dtypes and bad input."""

import re

import numpy as np
import pytest

import minigrad_norm as mg
import minigrad_norm.functional as F
from minigrad_norm import Function, Tensor
from minigrad_norm.optim import SGD


def leaf(a, dtype=np.float64):
    return Tensor(np.asarray(a, dtype=dtype), requires_grad=True)


# -- graph shape ----------------------------------------------------------------
def test_chain_of_100k_nodes_backprops_without_recursion():
    x = leaf([1.0, 2.0])
    y = x
    for _ in range(100_000):
        y = y * 1.0001
    (y * y).sum().backward()
    expected = 2 * np.array([1.0, 2.0]) * 1.0001 ** (2 * 100_000)
    np.testing.assert_allclose(x.grad, expected, rtol=1e-9)


def test_a_node_feeding_several_ops_counts_each_path_once():
    a = leaf([1.0, -2.0, 3.0])
    b = a + a  # a reaches b twice
    c = b * b  # b reaches c twice
    c.backward(np.array([1.0, 10.0, 100.0]))
    # c = 4 a^2, dc/da = 8a
    np.testing.assert_array_equal(a.grad, np.array([8.0, -160.0, 2400.0]))


def test_diamond_graph():
    x = leaf(2.0)
    u, v = x * 3.0, x.exp()
    (u * v).backward()
    # d/dx (3x e^x) = 3 e^x + 3x e^x
    np.testing.assert_allclose(x.grad, 3 * np.exp(2.0) * (1 + 2.0))


def test_gradients_accumulate_across_backward_calls():
    x = leaf([1.0, 2.0])
    (x * x).sum().backward()
    (x * 3.0).sum().backward()
    np.testing.assert_array_equal(x.grad, [2.0 + 3.0, 4.0 + 3.0])
    x.zero_grad()
    assert x.grad is None


def test_second_backward_through_released_graph_raises_clearly():
    x = leaf([1.0, 2.0])
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="second time.*retain_graph=True"):
        y.backward()
    np.testing.assert_array_equal(x.grad, [2.0, 4.0])  # the failed call added nothing


def test_retain_graph_allows_a_correct_second_backward():
    x = leaf([1.0, 2.0])
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_array_equal(x.grad, [4.0, 8.0])


def test_ops_that_save_nothing_give_correct_results_on_a_second_backward():
    x = leaf([1.0, 2.0])
    y = (x + 1.0).sum()
    y.backward()
    y.backward()
    np.testing.assert_array_equal(x.grad, [2.0, 2.0])


def test_non_scalar_backward_needs_a_gradient():
    x = leaf([1.0, 2.0])
    with pytest.raises(RuntimeError, match=r"shape \(2,\).*gradient="):
        (x * 2.0).backward()
    with pytest.raises(RuntimeError, match=r"gradient has shape \(3,\) but the output has shape \(2,\)"):
        (x * 2.0).backward(np.ones(3))


@pytest.mark.parametrize("gradient", [np.array([1 + 1j, 2.0]), np.array(["a", "b"])], ids=["complex", "text"])
def test_a_gradient_that_is_not_real_numbers_is_refused(gradient):
    # a complex one was cast with only NumPy's warning, dropping its imaginary part; text got NumPy's ValueError
    x = leaf([1.0, 2.0])
    with pytest.raises(TypeError, match=rf"backward: gradient has dtype {gradient.dtype}, .*must be real numbers"):
        (x * 2.0).backward(gradient)


def test_a_ragged_gradient_is_named():
    with pytest.raises(ValueError, match="backward: gradient is not an array of numbers"):
        (leaf([1.0, 2.0]) * 2.0).backward([1.0, [2.0]])


def test_a_gradient_of_integers_or_bools_is_cast_to_the_output_s_dtype_as_in_pytorch():
    x = leaf([1.0, 2.0], dtype=np.float32)
    (x * 2.0).backward(np.array([3, 0]))
    (x * 2.0).backward(np.array([True, False]))
    np.testing.assert_array_equal(x.grad, [8.0, 0.0])
    assert x.grad.dtype == np.float32


def test_backward_on_a_constant_raises():
    with pytest.raises(RuntimeError, match="does not require grad"):
        Tensor(np.ones(2)).sum().backward()


def test_non_leaf_grads_are_not_kept_unless_retained():
    x = leaf([1.0, 2.0])
    h = x * 2.0
    k = x * 3.0
    k.retain_grad()
    (h * k).sum().backward()
    assert h.grad is None
    np.testing.assert_array_equal(k.grad, [2.0, 4.0])  # d/dk sum(h k) = h


def test_grad_function_does_not_touch_dot_grad():
    x = leaf([1.0, 2.0])
    w = leaf([3.0, 4.0])
    (gx,) = mg.grad((x * w).sum(), [x])
    np.testing.assert_array_equal(gx, [3.0, 4.0])
    assert x.grad is None and w.grad is None


def test_grad_refuses_an_input_that_does_not_require_grad():
    """As torch.autograd.grad; it used to return zeros, hiding a forgotten requires_grad=True."""
    x, c = leaf([1.0, 2.0]), Tensor(np.ones((2, 3)))
    with pytest.raises(
        RuntimeError,
        match=re.escape("one of the differentiated Tensors does not require grad: input 1, of shape (2, 3)"),
    ):
        mg.grad((x * 2.0).sum() + c.sum(), [x, c])


def test_grad_returns_fresh_writable_arrays():
    """Sum's backward hands back a read-only broadcast view, Add's the incoming gradient itself."""
    x = leaf(np.ones((2, 3)))
    (gx,) = mg.grad(x.sum(), [x])
    assert gx.flags.writeable
    gx += 1.0  # as one may with .grad
    g = np.ones((2, 3))
    for out in (x + 1.0, x):
        (gx,) = mg.grad(out, [x], gradient=g)
        assert gx.flags.writeable and not np.shares_memory(gx, g)
        np.testing.assert_array_equal(gx, g)


def test_grad_takes_one_tensor_as_one_input():
    """``grad(y, x)`` walked x's rows, new tensors outside the graph, and gave zeros (torch takes one tensor)."""
    x = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    (g,) = mg.grad((x * x).sum(), x)
    np.testing.assert_array_equal(g, [2.0, 4.0, 6.0])
    with pytest.raises(RuntimeError, match="no inputs"):
        mg.grad((x * x).sum(), [])
    with pytest.raises(TypeError, match="input 0 must be a Tensor, got ndarray"):
        mg.grad((x * x).sum(), [x.data])


def test_sequence_ops_refuse_one_tensor_and_item_needs_one_value():
    """``concatenate(t)`` took t's rows for the sequence: (2, 3) came out (6,), where torch.cat refuses."""
    t = Tensor(np.arange(6.0).reshape(2, 3))
    for op in (mg.concatenate, mg.stack):
        with pytest.raises(TypeError, match=r"expected a sequence of tensors, got one Tensor of shape \(2, 3\)"):
            op(t)
        with pytest.raises(TypeError, match=r"expected a sequence of tensors, got one ndarray of shape \(2, 3\)"):
            op(t.data)
    np.testing.assert_array_equal(mg.concatenate([t, t], axis=1).data, np.concatenate([t.data, t.data], axis=1))
    with pytest.raises(ValueError, match=r"item: a Tensor of shape \(2, 3\) has 6 values"):
        t.item()
    with pytest.raises(ValueError, match=r"embedding: weight must be 2-D .* got shape \(5,\)"):
        F.embedding(np.array([0, 1]), Tensor(np.ones(5), requires_grad=True))


def test_an_assigned_grad_must_match_the_tensor_as_in_pytorch():
    """A (1,) grad on a (3,) parameter was broadcast by SGD's update: a silently wrong step."""
    p = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    for bad in (np.array([10.0]), np.ones((1, 3)), np.ones(3, np.float32)):
        with pytest.raises(
            RuntimeError, match=r"Tensor.grad: assigned grad has shape .* but the tensor has shape \(3,\)"
        ):
            p.grad = bad
    with pytest.raises(TypeError, match="expected an ndarray or None, got list"):
        p.grad = [1.0, 2.0, 3.0]
    assert p.grad is None
    p.grad = np.ones(3)
    SGD([p], lr=0.5).step()
    np.testing.assert_array_equal(p.data, [0.5, 1.5, 2.5])
    p.grad = None
    assert p.grad is None


def test_no_grad_records_nothing():
    x = leaf([1.0])
    with mg.no_grad():
        y = x * 2.0
        assert not mg.is_grad_enabled()
    assert mg.is_grad_enabled()
    assert not y.requires_grad and y.is_leaf


def test_detach_cuts_the_graph_and_shares_data():
    x = leaf([1.0, 2.0])
    d = (x * 2.0).detach()
    assert not d.requires_grad and d.is_leaf
    y = x * d
    y.sum().backward()
    np.testing.assert_array_equal(x.grad, [2.0, 4.0])


def test_data_is_the_array_itself_and_ops_never_write_to_it():
    a = np.array([1.0, -2.0, 3.0])
    b = np.array([0.5, 0.5, 0.5])
    snapshot = a.copy(), b.copy()
    x, y = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True)
    assert x.data is a and x.numpy() is a
    out = F.softmax(x * y + x.exp() / y, axis=0)[np.array([0, 0, 2])]
    out.backward(np.array([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(a, snapshot[0])
    np.testing.assert_array_equal(b, snapshot[1])


def test_gradient_argument_is_not_modified():
    x = leaf([1.0, 2.0])
    g = np.array([1.0, 1.0])
    (x * 2.0).backward(g)
    (x * 2.0).backward(g)
    np.testing.assert_array_equal(g, [1.0, 1.0])


# -- dtypes -------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_results_and_grads_keep_the_input_dtype(dtype):
    x = leaf([1.0, 2.0, 3.0], dtype)
    y = (x * 2.5 + 1 - x / 3.0) ** 2
    z = F.gelu(F.softmax(y, axis=0)).sum() * 0.5
    assert y.dtype == dtype and z.dtype == dtype
    z.backward()
    assert x.grad.dtype == dtype


def test_float32_with_float64_promotes_to_float64():
    a = leaf([1.0], np.float32)
    b = leaf([2.0], np.float64)
    c = a * b
    assert c.dtype == np.float64
    c.sum().backward()
    assert a.grad.dtype == np.float32 and b.grad.dtype == np.float64


def test_python_scalars_never_upcast_float32():
    x = leaf([1.0, 2.0], np.float32)
    for y in (x + 1.5, 2.5 * x, x / 3.0, 1.0 - x, x**2.0, 2.0**x, x**2):
        assert y.dtype == np.float32


def test_numpy_scalars_and_0d_arrays_count_as_numbers():
    """As in PyTorch: ``x / np.sqrt(d)`` keeps a float32 x float32 (NumPy 2 alone would give float64)."""
    x = leaf([1.0, 2.0], np.float32)
    for y in (
        x / np.sqrt(4.0),
        x * np.float64(2),
        np.float64(2) * x,
        x ** np.float64(2),
        x * np.array(2.0),
        np.array(2.0) - x,
        x + np.int64(1),
        x.masked_fill(np.array([True, False]), np.float64(3)),
    ):
        assert y.dtype == np.float32
    assert (x / np.sqrt(4.0)).data.tolist() == [0.5, 1.0]
    i = Tensor(np.arange(3))
    assert (i * np.float64(2.5)).dtype == np.float64  # an int tensor still widens to a float number's dtype


def test_equality_is_elementwise_and_truth_needs_one_value():
    t = Tensor(np.array([0.0, 1.0, 2.0]))
    assert (t == 0).data.tolist() == [True, False, False]
    assert (t != 1.0).data.tolist() == [True, False, True]
    assert (0 == t).data.tolist() == [True, False, False]
    assert t.masked_fill(t == 0, 5.0).data.tolist() == [5.0, 1.0, 2.0]
    assert (t == None) is False and (t != None) is True  # noqa: E711  (as torch: identity, not values)
    assert not Tensor(np.array([0.0])) and Tensor(np.array(3.0))
    with pytest.raises(RuntimeError, match=r"truth value of a tensor of shape \(3,\) \(3 values\) is ambiguous"):
        bool(t > 5)
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(Tensor(np.zeros(0)))
    assert {t: 1}[t] == 1 and t in [t] and len({t, Tensor(t.data)}) == 2  # hashed by identity


def test_masked_fill_with_a_0d_tensor_value_passes_its_gradient():
    """dL/dvalue = sum of g over the filled places, as torch.masked_fill with a 0-d value."""
    a, v = leaf(np.ones((2, 3))), leaf(2.0)
    mask = np.array([True, False, True])
    y = a.masked_fill(mask, v)
    assert y.data.tolist() == [[2.0, 1.0, 2.0]] * 2
    g = np.arange(6.0).reshape(2, 3)
    y.backward(g)
    assert v.grad == 0.0 + 2.0 + 3.0 + 5.0
    assert a.grad.tolist() == [[0.0, 1.0, 0.0], [0.0, 4.0, 0.0]]
    with pytest.raises(ValueError, match=r"masked_fill: value must be a number or a 0-d tensor, got shape \(2,\)"):
        a.masked_fill(mask, leaf([1.0, 2.0]))


def test_reductions_take_pytorch_names_too():
    x = leaf(np.arange(6.0).reshape(2, 3))
    assert x.sum(dim=0).data.tolist() == [3.0, 5.0, 7.0]
    assert x.mean(dim=-1, keepdim=True).data.tolist() == [[1.0], [4.0]]
    assert x.max(dim=(0, 1)).data == 5.0
    assert F.softmax(x, dim=0).shape == F.log_softmax(x, dim=0).shape == (2, 3)
    np.testing.assert_allclose(F.softmax(x, dim=0).data.sum(axis=0), 1.0)
    with pytest.raises(TypeError, match=r"sum: got both axis=0 and dim=1"):
        x.sum(axis=0, dim=1)
    with pytest.raises(TypeError, match="max: got both keepdims and keepdim"):
        x.max(keepdims=True, keepdim=True)
    with pytest.raises(TypeError, match="sum: got both keepdims and keepdim"):
        x.sum(keepdims=True, keepdim=False)  # whatever the values
    with pytest.raises(TypeError, match=r"softmax: got both axis=0 and dim=0"):
        F.softmax(x, 0, dim=0)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda x: x.sum(axis=2), np.exceptions.AxisError, r"sum: axis=2 is invalid for an input of shape \(2, 3\)"),
        (lambda x: x.mean(axis=(0, 0)), ValueError, r"mean: axis=\(0, 0\) is invalid .*repeated axis"),
        (lambda x: x.max(axis=1.5), TypeError, r"max: axis=1.5 is invalid for an input of shape \(2, 3\)"),
        (lambda x: F.softmax(x, 2), np.exceptions.AxisError, r"softmax: axis=2 is invalid"),
        (lambda x: F.log_softmax(x, (0, 1)), TypeError, r"log_softmax: axis must be an int, got \(0, 1\)"),
    ],
)
def test_a_bad_reduction_axis_names_the_op_and_the_shape(call, error, match):
    with pytest.raises(error, match=match):
        call(leaf(np.ones((2, 3))))


def test_cross_entropy_weight_and_label_smoothing_are_checked():
    logits, targets = leaf(np.zeros((2, 3))), np.array([0, 2])
    with pytest.raises(ValueError, match=r"cross_entropy: weight must have shape \(3,\) for 3 classes, got \(2,\)"):
        F.cross_entropy(logits, targets, weight=np.ones(2))
    for bad in (-0.1, 1.5, np.nan):
        with pytest.raises(ValueError, match=r"cross_entropy: label_smoothing must be in \[0, 1\]"):
            F.cross_entropy(logits, targets, label_smoothing=bad)


def test_cross_entropy_with_weights_and_smoothing_by_hand():
    """Uniform logits over 3 classes: -log p = log 3 for every class, and dl/dz = p * ((1 - eps) w_t + eps/C W)
    - (1 - eps) w_t e_t - eps/C w."""
    eps, w = 0.3, np.array([1.0, 2.0, 4.0])
    z = leaf(np.zeros((1, 3)))
    loss = F.cross_entropy(z, np.array([2]), weight=w, label_smoothing=eps, reduction="sum")
    np.testing.assert_allclose(loss.data, (1 - eps) * 4 * np.log(3) + eps / 3 * 7 * np.log(3), rtol=1e-15)
    loss.backward()
    expected = np.full(3, ((1 - eps) * 4 + eps / 3 * 7) / 3) - eps / 3 * w
    expected[2] -= (1 - eps) * 4
    np.testing.assert_allclose(z.grad[0], expected, rtol=1e-14)
    mean = F.cross_entropy(leaf(np.zeros((1, 3))), np.array([2]), weight=w, label_smoothing=eps)
    np.testing.assert_allclose(mean.data, loss.data / 4, rtol=1e-15)  # the mean divides by w_t


def test_transpose_needs_both_dims_as_in_pytorch():
    x = leaf(np.arange(6.0).reshape(1, 2, 3))
    assert x.transpose(0, 2).shape == (3, 2, 1)
    with pytest.raises(TypeError):
        x.transpose()


def test_softmax_over_an_empty_axis_is_empty():
    x = leaf(np.zeros((2, 0)))
    F.softmax(x, dim=-1).sum().backward()
    assert x.grad.shape == (2, 0) and F.log_softmax(leaf(np.zeros((0, 3))), 0).shape == (0, 3)


def test_integer_tensors_serve_as_indices_but_never_require_grad():
    idx = Tensor(np.array([2, 0]))
    w = leaf(np.arange(6.0).reshape(3, 2))
    w[idx].backward(np.ones((2, 2)))
    np.testing.assert_array_equal(w.grad, [[1, 1], [0, 0], [1, 1]])
    with pytest.raises(TypeError, match=r"only float32 and float64 tensors can require grad.*int64.*\(2,\)"):
        Tensor(np.array([1, 2]), requires_grad=True)
    with pytest.raises(TypeError, match=r"only float32 and float64 tensors can require grad.*complex128"):
        Tensor(np.ones(2, complex), requires_grad=True)  # complex data is for the complex step, not for grads


def test_unsupported_dtypes_are_refused():
    with pytest.raises(TypeError, match="float16"):
        Tensor(np.ones(2, dtype=np.float16))
    with pytest.raises(TypeError, match="not supported"):
        Tensor(np.array(["a"]))


# -- bad input ------------------------------------------------------------------------
def test_matmul_shape_mismatch_names_the_op_and_shapes():
    with pytest.raises(ValueError, match=re.escape("matmul: shapes (3, 4) and (5, 6) are not aligned")):
        leaf(np.ones((3, 4))) @ leaf(np.ones((5, 6)))
    with pytest.raises(ValueError, match=r"matmul: batch dimensions of shapes \(2, 3, 4\) and \(5, 4, 6\)"):
        leaf(np.ones((2, 3, 4))) @ leaf(np.ones((5, 4, 6)))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_broadcasting_failure_names_the_op_and_shapes(op):
    a, b = leaf(np.ones((3, 4))), leaf(np.ones((2, 4)))
    fn = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b, "div": lambda: a / b}[op]
    with pytest.raises(
        ValueError, match=re.escape(f"{op}: operands could not be broadcast together with shapes (3, 4) and (2, 4)")
    ):
        fn()


def test_other_shape_errors_name_the_op():
    x = leaf(np.ones((3, 4)))
    with pytest.raises(ValueError, match=re.escape("reshape: cannot reshape a tensor of shape (3, 4)")):
        x.reshape(5)
    with pytest.raises(ValueError, match="permute"):
        x.permute(0, 0)
    for dims in ((0, 3), (-3, 1), (0, 1, 2)):  # (0, 3) once passed as (0, 1) modulo ndim, then failed in NumPy
        with pytest.raises(
            ValueError,
            match=re.escape(f"permute: dims {dims} are not a permutation of the axes of a tensor of shape (3, 4)"),
        ):
            x.permute(*dims)
    with pytest.raises(
        ValueError, match=re.escape("linear: input of shape (3, 4) does not match weight of shape (2, 5)")
    ):
        F.linear(x, leaf(np.ones((2, 5))))
    with pytest.raises(IndexError, match="embedding: index out of range"):
        F.embedding(np.array([3]), x)
    with pytest.raises(
        ValueError,
        match=re.escape("masked_fill: operands could not be broadcast together with shapes (3, 4) and (2, 4)"),
    ):
        x.masked_fill(np.ones((2, 4), dtype=bool), 0.0)
    with pytest.raises(
        ValueError,
        match=re.escape("masked_fill: mask of shape (2, 3, 4) does not broadcast to the input's shape (3, 4)"),
    ):
        x.masked_fill(np.ones((2, 3, 4), dtype=bool), 0.0)
    with pytest.raises(ValueError, match="cross_entropy: logits of shape"):
        F.cross_entropy(x, np.array([0, 1]))
    with pytest.raises(ValueError, match=re.escape("cross_entropy: logits must have at least 2 dims (N, C, ...)")):
        F.cross_entropy(Tensor(np.ones(3)), np.array([1, 1, 1]))  # PyTorch's unbatched (C,) form: not supported


class Square(Function):
    """A user-defined op, the way the README shows it."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


def test_a_user_defined_function_joins_the_tape():
    x = leaf([1.0, 3.0])
    (Square.apply(x) * 2.0).sum().backward()
    np.testing.assert_array_equal(x.grad, [4.0, 12.0])


@pytest.mark.parametrize(
    ("rule", "error", "match"),
    [
        (lambda g: 2.0, TypeError, "returned a float as the gradient of input 0"),
        (lambda g: [2.0, 2.0], TypeError, "returned a list; return a tuple, one gradient"),
        (lambda g: [2 * g], TypeError, "returned a list; return a tuple, one gradient"),  # was "1 gradients for"
        (lambda g: Tensor(2 * g), TypeError, "returned a Tensor as the gradient of input 0"),
        (lambda g: 2 * g + 0j, TypeError, "returned a complex128 gradient for input 0, which is real"),
        (lambda g: g.sum(), RuntimeError, r"returned a gradient of shape \(\) for an input of shape \(2,\)"),
    ],
)
def test_a_backward_returning_anything_but_a_real_array_of_the_input_shape_is_named(rule, error, match):
    class Bad(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return rule(g)

    with pytest.raises(error, match=rf"Bad.backward {match}"):
        Bad.apply(leaf([1.0, 2.0])).backward(np.ones(2))
