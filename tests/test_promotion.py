"""Type promotion: every op that combines operands computes in PyTorch's ``torch.result_type`` of them,
with float64 as the default float dtype (docs/engine.md). A table written from PyTorch's rules, values
computed in the promoted dtype, gradients through mixed dtypes, and a hypothesis cross-check against
torch itself (skipped without torch)."""

import operator

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given

import minigrad_norm.functional as F
from minigrad_norm import Tensor, concatenate, gradcheck, numerical_jacobian, ops, stack
from minigrad_norm.tensor import backprop
from minigrad_norm.testing import broadcastable_shapes, shapes

b1, u8, i8, i16, i32, i64 = (np.dtype(t) for t in (bool, np.uint8, np.int8, np.int16, np.int32, np.int64))
f32, f64, c64, c128 = (np.dtype(t) for t in (np.float32, np.float64, np.complex64, np.complex128))


def dim(dtype, shape=(3,)):
    return Tensor(np.ones(shape, dtype))


def zero(dtype):
    return Tensor(np.ones((), dtype))


# (a, b, the dtype of a + b), from PyTorch's rule (with float64 the default float dtype), not from our output
TABLE = [
    # tensors with dimensions: the wider dtype, but an integer never widens a float
    (dim(f32), dim(i64), f32),
    (dim(f32), np.arange(3), f32),  # an ndarray is a tensor
    (dim(i64), dim(f32), f32),
    (dim(f32), dim(f64), f64),
    (dim(i32), dim(i64), i64),
    (dim(u8), dim(i8), i16),
    (dim(f32), np.ones(3, bool), f32),
    (dim(b1), dim(b1), b1),
    (dim(c64), dim(f64), c128),
    # a 0-d tensor decides only if its category is higher, keeping its own dtype
    (dim(f32), zero(f64), f32),
    (zero(f32), dim(f64), f64),
    (dim(u8), zero(i8), u8),
    (dim(i16), zero(i64), i16),
    (dim(i64), zero(f32), f32),
    (dim(i32), zero(f64), f64),
    (dim(b1), zero(i8), i8),
    (zero(i64), zero(f32), f32),
    (zero(f32), zero(f64), f64),
    (dim(f32), zero(c128), c64),  # a complex 0-d tensor takes a float tensor's precision
    (dim(f64), zero(c64), c128),
    (dim(c64), zero(f64), c64),
    # a number (Python number, NumPy scalar, 0-d array) decides only if higher, as its category's default dtype
    (dim(f32), 2.5, f32),
    (dim(f32), np.float64(2), f32),
    (dim(f32), np.array(2.0), f32),
    (zero(f32), 2.5, f32),
    (dim(i64), 2.5, f64),
    (dim(i32), np.float32(2.5), f64),
    (zero(i32), 2.5, f64),
    (dim(i32), np.int64(2), i32),
    (dim(u8), 1, u8),
    (dim(b1), 1, i64),
    (dim(b1), 2.5, f64),
    (dim(b1), True, b1),
    (dim(f32), True, f32),
    (dim(f32), 1j, c64),
    (dim(i64), 1j, c128),
]


def describe(x):
    if isinstance(x, Tensor):
        return f"{'0-d ' if x.ndim == 0 else ''}{x.dtype}"
    return f"{x.ndim}-d array {x.dtype}" if isinstance(x, np.ndarray) else repr(x)


IDS = [f"{describe(a)} with {describe(b)}" for a, b, _ in TABLE]


def floating(dtype):
    return dtype if dtype.kind in "fc" else f64


@pytest.mark.parametrize("a, b, expected", TABLE, ids=IDS)
def test_result_type(a, b, expected):
    assert ops.result_type(a, b) == ops.result_type(b, a) == expected


@pytest.mark.parametrize("a, b, expected", TABLE, ids=IDS)
def test_arithmetic_and_comparisons_compute_in_the_result_type(a, b, expected):
    cases = [(operator.add, expected), (operator.mul, expected), (operator.truediv, floating(expected))]
    if not any(isinstance(x, Tensor | np.ndarray) and x.dtype == b1 for x in (a, b)):
        cases.append((operator.sub, expected))  # PyTorch refuses to subtract a bool tensor, or from one
    if expected != b1:  # NumPy's bool ** bool is int8
        cases.append((operator.pow, expected))
    with np.errstate(all="ignore"):
        for op, dtype in cases:
            assert op(a, b).dtype == op(b, a).dtype == dtype, op.__name__
            raw = [np.asarray(x.data if isinstance(x, Tensor) else x).astype(dtype) for x in (a, b)]
            np.testing.assert_array_equal(op(a, b).data, op(*raw))
        if expected.kind != "c":
            assert (a < b).dtype == (a == b).dtype == b1


@pytest.mark.parametrize(
    "a, b, expected",
    [
        (dim(f32), np.arange(3), f32),
        (dim(i64, (2, 3)), dim(f32), f32),
        (dim(f32), dim(f64), f64),
        (dim(i32), dim(i64, (3, 2)), i64),
        (dim(c128, (2, 3)), dim(f32), c128),
    ],
)
def test_matmul(a, b, expected):
    assert (a @ b).dtype == expected


@pytest.mark.parametrize(
    "x_dtype, w_dtype, b_dtype, expected",
    [(i64, f32, f32, f32), (f32, f64, f64, f64), (f32, f32, f64, f64), (f64, f32, None, f64), (i64, f64, None, f64)],
)
def test_linear_promotes_as_matmul_and_its_gradients_keep_each_dtype(x_dtype, w_dtype, b_dtype, expected):
    x = Tensor(np.arange(6).reshape(2, 3).astype(x_dtype))
    w = Tensor(np.ones((4, 3), w_dtype), requires_grad=True)
    b = None if b_dtype is None else Tensor(np.zeros(4, b_dtype), requires_grad=True)
    y = F.linear(x, w, b)
    assert y.dtype == expected
    y.sum().backward()
    assert w.grad.dtype == w_dtype
    np.testing.assert_array_equal(w.grad, np.tile([3.0, 5.0, 7.0], (4, 1)))  # dL/dW[o] = the sum of the rows
    if b is not None:
        assert b.grad.dtype == b_dtype
        np.testing.assert_array_equal(b.grad, [2.0] * 4)


@pytest.mark.parametrize(
    "tensors, expected",
    [
        ([dim(f32), dim(i64)], f32),
        ([dim(f32), np.arange(3)], f32),
        ([dim(i32), dim(f32)], f32),
        ([dim(b1), dim(u8), dim(i8)], i16),
        ([dim(f32), dim(i64), dim(f64)], f64),
        ([zero(f32), zero(i64)], f32),
        ([zero(i32), zero(f64)], f64),
    ],
)
def test_concatenate_and_stack(tensors, expected):
    y = stack(tensors)
    assert y.dtype == expected
    np.testing.assert_array_equal(y.data, np.stack([np.asarray(getattr(t, "data", t), expected) for t in tensors]))
    if y.ndim > 1:
        assert concatenate(tensors).dtype == expected


@pytest.mark.parametrize(
    "a, value",
    [
        (dim(f32), 1j),
        (dim(b1), 1j),
        (dim(i64), np.nan),
        (dim(i64), np.inf),
        (dim(i8), 300),
        (dim(u8), -1),
        (dim(f32), 1e300),
    ],
)
def test_masked_fill_refuses_a_value_the_input_cannot_hold(a, value):
    # NumPy's cast dropped the imaginary part, or wrapped around (int8 300 -> 44); PyTorch raises
    message = rf"masked_fill: value .* cannot be converted to the tensor's dtype {a.dtype}$"
    with pytest.raises(RuntimeError, match=message):
        a.masked_fill(np.array([True, False, False]), value)


@pytest.mark.parametrize(
    "scalar", [np.float16(2), np.array(2, np.float16), np.longdouble(2)], ids=["float16", "0-d float16", "longdouble"]
)
def test_numpy_scalars_no_tensor_holds_are_numbers_too(scalar):
    # such a scalar was wrapped in a Tensor, which refuses float16 and longdouble
    x = dim(f32)  # ones
    results = {"mul": x * scalar, "rmul": scalar * x, "sub": x - scalar, "div": x / scalar}
    results["fill"] = x.masked_fill(np.ones(3, bool), scalar)
    expected = {"mul": 2.0, "rmul": 2.0, "sub": -1.0, "div": 0.5, "fill": 2.0}
    for name, y in results.items():
        assert y.dtype == f32, name
        np.testing.assert_array_equal(y.data, [expected[name]] * 3, err_msg=name)
    assert (x < scalar).data.all()


def test_bool_tensors_are_not_subtracted_or_negated_and_unsigned_sums_are_int64():
    b = dim(b1)
    for call in (lambda: b - 1, lambda: 1.5 - b, lambda: b - b, lambda: -b):
        with pytest.raises(TypeError, match=r"(sub|neg): .*with a bool tensor \(shape \(3,\)\) is not supported"):
            call()
    assert dim(u8).sum().dtype == i64 and dim(b1).sum().dtype == i64  # as PyTorch's sum (NumPy: uint64)


def test_a_negative_size_other_than_minus_one_is_refused():
    # NumPy reads -2 as -1; PyTorch refuses it
    with pytest.raises(ValueError, match=r"reshape: invalid size in shape \(-2, 3\) .*only -1 may be negative"):
        Tensor(np.arange(6.0)).reshape(-2, 3)
    assert Tensor(np.arange(6.0)).reshape(-1, 3).shape == (2, 3)


def test_complex_numbers_compare_for_equality_but_have_no_order():
    x = Tensor(np.array([1.0, 2.0]))
    np.testing.assert_array_equal((x == 1 + 0j).data, [True, False])
    np.testing.assert_array_equal((x != 1j).data, [True, True])
    with pytest.raises(TypeError, match="less"):
        x < 1j  # noqa: B015


@pytest.mark.parametrize(
    "a, value, expected",
    [(dim(f32), zero(f64), 1.0), (dim(f32), np.float64(3), 3.0), (dim(f64), zero(f32), 1.0), (dim(i64), 2.5, 2)],
)
def test_masked_fill_keeps_the_input_dtype(a, value, expected):
    """As PyTorch's (an out-of-place masked_fill_): the value is cast to the input's dtype, truncated if need be."""
    y = a.masked_fill(np.array([True, False, False]), value)
    assert y.dtype == a.dtype and y.data[0] == expected


def test_values_are_computed_in_the_promoted_dtype():
    """2**24 + 1 is no float32: as PyTorch, an int64 tensor meets a float32 one as float32 (NumPy: float64)."""
    big, f = Tensor(np.array([2**24 + 1])), Tensor(np.array([2.0**24], np.float32))
    assert (big == f).data.all() and not (big != f).data.any()
    assert (big + 0 * f).data.tolist() == [2.0**24]
    tenth = Tensor(np.array([0.1], np.float32))
    assert (tenth == 0.1).data.all() and (tenth == Tensor(np.array(0.1))).data.all()  # 0.1 rounded to float32


def test_an_integer_mask_keeps_float32_activations_float32():
    x = Tensor(np.array([0.5, -1.0, 2.0], np.float32), requires_grad=True)
    ints, scale = np.array([0, 1, 2]), Tensor(np.array(0.25))
    h = x * Tensor(ints) + x / (ints + 1) + scale * x  # an int64 tensor, an int64 array, a 0-d float64 tensor
    out = (h.tanh() * 2.5).sum() + concatenate([h, np.arange(2)]).sum()
    assert h.dtype == out.dtype == f32
    grads = backprop(out, inputs=[h, x], retain_graph=True)
    assert grads[id(h)][1].dtype == grads[id(x)][1].dtype == f32
    out.backward()
    h64 = x.data.astype(f64) * (ints + 1 / (ints + 1) + 0.25)
    expected = (2.5 * (1 - np.tanh(h64) ** 2) + 1) * (ints + 1 / (ints + 1) + 0.25)
    assert x.grad.dtype == f32
    np.testing.assert_allclose(x.grad, expected, rtol=1e-6)


@pytest.mark.parametrize("method", ["central", "complex"])
def test_gradients_through_mixed_dtypes(method):
    """Every op with integer, bool, float32 and 0-d operands next to a float64 input: the result is float64,
    and its gradient right (the complex step pushes complex128 through each of them)."""
    ints, w32 = Tensor(np.array([1, 2, 3])), Tensor(np.array([0.5, -2.0, 1.5], np.float32))
    half = Tensor(np.array(0.5, np.float32))

    def fn(x):
        y = x * ints + x / np.array([1, 2, 4], np.int32) - half * x + x**ints + 2 ** (x * w32)
        z = concatenate([y, ints]) * stack([x, x * w32, np.ones(3, bool)])[:2].reshape(6)
        return z @ np.arange(6) + y.masked_fill(np.array([True, False, False]), half * x.sum())

    x = Tensor(np.array([0.7, -1.3, 1.1]), requires_grad=True)
    assert fn(x).dtype == f64
    assert gradcheck(fn, (x,), method=method)


def test_complex_step_through_a_float32_input():
    """numerical_jacobian pushes x as complex128: it stays complex128 next to float32 and integer tensors."""
    x = Tensor(np.array([0.5, -1.0, 2.0], np.float32), requires_grad=True)
    ints, half = Tensor(np.array([0, 1, 2])), Tensor(np.array(0.5, np.float32))
    (jac,) = numerical_jacobian(lambda t: t * ints + t * np.float32(2.5) + half * t**2, (x,), method="complex")
    np.testing.assert_allclose(jac, np.diag(np.array([0, 1, 2]) + 2.5 + x.data), rtol=1e-13)


@pytest.mark.parametrize(
    ("base", "exponent", "expected"),
    # PyTorch's rule: a number of a lower category takes the tensor's dtype, bool ** int is the default int
    [(b1, 2, i64), (b1, np.uint8(2), i64), (i8, 2, i8), (u8, 3, u8), (i16, np.uint8(2), i16), (i8, 2.5, f64)],
)
def test_a_bool_or_narrow_integer_tensor_to_a_number_power(base, exponent, expected):
    assert (dim(base) ** exponent).dtype == expected


def test_integer_division_and_functions_of_integers_are_float64():
    """As in PyTorch (default dtype float64); NumPy's exp of int8 or bool is float16, of int16 float32."""
    for dtype in (b1, u8, i8, i16, i64):
        t = Tensor(np.array([1, 1], dtype))
        for y in (t / t, t / 2, 2 / t, t.exp(), t.log(), t.sqrt(), t.tanh()):
            assert y.dtype == f64, dtype


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda x: x.reshape(2.0, 3), r"reshape: shape \(2.0, 3\) must be integers, got float 2.0"),
        (lambda x: x.reshape(6.0), r"reshape: shape \(6.0,\) must be integers, got float"),
        (lambda x: x.reshape((True, 6)), r"reshape: shape \(True, 6\) must be integers, got bool"),
        (lambda x: x.reshape([np.bool_(True), 6]), r"reshape: shape .* must be integers, got bool"),
        (lambda x: x.permute(1.0, 0), r"permute: dims \(1.0, 0\) must be integers, got float"),
        (lambda x: x.permute((True, False)), r"permute: dims \(True, False\) must be integers, got bool"),
        (lambda x: x.transpose(np.float64(1), 0), r"swapaxes: axes \(.*1.0.*, 0\) must be integers, got float64"),
        (lambda x: x.swapaxes(True, 0), r"swapaxes: axes \(True, 0\) must be integers, got bool"),
    ],
)
def test_sizes_and_axes_must_be_integers(call, message):
    """As in PyTorch, which refuses bools there too; the message names the input's shape."""
    with pytest.raises(TypeError, match=message + r".*input of shape \(2, 3\)"):
        call(Tensor(np.zeros((2, 3))))


def test_numpy_integers_are_sizes_and_axes():
    x = Tensor(np.zeros((2, 3)))
    assert x.reshape(np.int64(6)).shape == (6,)
    assert x.reshape(np.int32(3), 2).shape == (3, 2)
    assert x.permute(np.int64(1), 0).shape == x.transpose(np.int8(0), np.int64(1)).shape == (3, 2)


# -- against PyTorch ---------------------------------------------------------------------------------------
DTYPES = [b1, u8, i8, i16, i32, i64, f32, f64, c64, c128]
TENSORS = ("tensor", "0-d tensor")
KINDS = (*TENSORS, "array", "number", "numpy scalar", "0-d array")


@st.composite
def operand(draw, shape, kinds=KINDS):
    """(kind, values): values small whole numbers, exact in every dtype; a 0-d kind ignores ``shape``."""
    kind = draw(st.sampled_from(kinds))
    shape = shape if kind in ("tensor", "array") else ()
    values = draw(hnp.arrays(np.int8, shape, elements=st.integers(0, 3))).astype(draw(st.sampled_from(DTYPES)))
    return kind, values


def ours(kind, values):
    """The operand as the engine takes it."""
    if kind in TENSORS:
        return Tensor(values)
    if kind == "number":
        return values.item()
    return values[()] if kind == "numpy scalar" else values


def theirs(torch, kind, values):
    """The same operand for PyTorch: a tensor, or a Python number for every kind the engine takes as one."""
    return torch.from_numpy(values.copy()) if kind in (*TENSORS, "array") else values.item()


@st.composite
def pairs(draw):
    """Two operands of broadcastable shapes (0-d included), at least one a Tensor, in either order."""
    s = draw(broadcastable_shapes(num_shapes=2, min_dims=1, max_dims=2, max_side=3))
    pair = [draw(operand(s[0], TENSORS)), draw(operand(s[1]))]
    return pair[::-1] if draw(st.booleans()) else pair


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch", reason="PyTorch is the optional cross-check peer: pip install torch==2.13.0")
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the engine's default float dtype
    yield torch
    torch.set_default_dtype(default)


def numpy_dtype(torch, dtype):
    return torch.empty(0, dtype=dtype).numpy().dtype


BINARY = [operator.add, operator.sub, operator.mul, operator.truediv, operator.pow, operator.lt, operator.eq]


@given(pair=pairs())
def test_binary_ops_against_torch(torch, pair):
    (ka, va), (kb, vb) = pair
    a, b, ta, tb = ours(ka, va), ours(kb, vb), theirs(torch, ka, va), theirs(torch, kb, vb)
    assert ops.result_type(a, b) == numpy_dtype(torch, torch.result_type(ta, tb))
    for op in BINARY:
        try:
            expected = op(ta, tb)
        except (RuntimeError, NotImplementedError):  # bool - bool, bool ** bool, complex < complex
            continue
        if op in (operator.lt, operator.eq) and ops.result_type(a, b).kind == "c":
            continue  # complex == complex: refused here (the complex step cannot pass a comparison)
        if op is operator.pow and expected.dtype == torch.bool:
            continue  # bool ** True: bool in PyTorch (which refuses bool ** a bool tensor), int8 in NumPy
        with np.errstate(all="ignore"):
            y = op(a, b)
        assert y.dtype == numpy_dtype(torch, expected.dtype), op.__name__
        if op is not operator.pow and y.dtype.kind != "c":  # (0j ** 0j, 1 / 0j: nan or inf, differently)
            np.testing.assert_array_equal(y.data, expected.numpy(), err_msg=op.__name__)


@given(n=st.integers(1, 3), data=st.data())
def test_matmul_against_torch(torch, n, data):
    """PyTorch's matmul refuses mixed dtypes; ours computes in their result_type."""
    pair = [data.draw(operand((n, n), ("tensor",))), data.draw(operand((n,), ("tensor", "array")))]
    (ka, va), (kb, vb) = pair[::-1] if data.draw(st.booleans()) else pair
    dtype = numpy_dtype(torch, torch.result_type(theirs(torch, ka, va), theirs(torch, kb, vb)))
    y = ours(ka, va) @ ours(kb, vb)
    assert y.dtype == dtype
    np.testing.assert_array_equal(y.data, va.astype(dtype) @ vb.astype(dtype))


@given(
    shape=shapes(min_dims=0, max_dims=2, max_side=3),
    data=st.data(),
)
def test_concatenate_and_stack_against_torch(torch, shape, data):
    kinds = ("0-d tensor",) if shape == () else ("tensor", "array")
    items = data.draw(st.lists(operand(shape, kinds), min_size=2, max_size=3))
    a, t = [ours(k, v) for k, v in items], [theirs(torch, k, v) for k, v in items]
    fns = [(stack, torch.stack)] + ([(concatenate, torch.cat)] if shape else [])
    for fn, torch_fn in fns:
        y, expected = fn(a), torch_fn(t)
        assert y.dtype == numpy_dtype(torch, expected.dtype)
        np.testing.assert_array_equal(y.data, expected.numpy())


@given(
    a=operand((3,), ("tensor",)),
    value=operand((), ("0-d tensor", "number", "numpy scalar", "0-d array")),
)
def test_masked_fill_against_torch(torch, a, value):
    mask = np.array([True, False, True])
    try:
        expected = theirs(torch, *a).masked_fill(torch.from_numpy(mask), theirs(torch, *value))
    except RuntimeError:  # a complex number into a real tensor
        return
    if value[1].dtype.kind == "c" and a[1].dtype.kind != "c":
        return  # a complex 0-d tensor into a real one: PyTorch drops the imaginary part, NumPy warns as it does
    y = ours(*a).masked_fill(mask, ours(*value))
    assert y.dtype == numpy_dtype(torch, expected.dtype)
    np.testing.assert_array_equal(y.data, expected.numpy())
