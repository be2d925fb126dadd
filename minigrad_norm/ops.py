"""Primitive differentiable ops: each a forward and its hand-written backward.

Notation in the docstrings: ``g`` is dL/d(output), the gradient flowing in;
each backward returns dL/d(input) for every positional input, in order.

Broadcasting: an op on operands of shapes (3,1,4) and (2,4) produces (3,2,4).
Every element of a broadcast input was used several times, so its gradient
is the sum over the copies: ``unbroadcast`` sums ``g`` over the axes that
broadcasting added or stretched.

Complex step: ops that are analytic (arithmetic, exp, log, sqrt, tanh,
matmul, sums, reshapes, indexing) accept complex arrays, so that
``numerical_jacobian(method="complex")`` can push ``x + i*h`` through a
forward. Ops that are not analytic (``max``, ``relu``, the ordering
comparisons) refuse complex input through ``require_real``.

Dtypes: an op on several operands computes in their ``result_type``, PyTorch's
type promotion; its forward casts the arrays to it first (``masked_fill``
keeps its input's dtype, as PyTorch's).
"""

from __future__ import annotations

import builtins
import copy
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from minigrad_norm.tensor import Context, Function, Tensor

Axis = int | Sequence[int] | None


# -- helpers ------------------------------------------------------------------
def as_number(value: Any) -> int | float | complex | None:
    """``value`` as a Python number if it is one, a NumPy scalar or a 0-d array of numbers (not a bool).

    PyTorch takes all three as a number next to a tensor: one that never widens the tensor's dtype within
    its kind (``float32_tensor * np.float64(2)`` stays float32)."""
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iufc":
        return value.item()
    if isinstance(value, np.number):
        return value.item()
    if isinstance(value, int | float | complex) and not isinstance(value, bool):
        return value
    return None


def as_tensor(value: Any) -> Tensor:
    """``value`` wrapped in a Tensor (a Tensor is returned as it is)."""
    return value if isinstance(value, Tensor) else Tensor(value)


def number_dtype(number: int | float | complex) -> np.dtype:
    """The dtype a number (``as_number``) counts as in type promotion: its category's default."""
    if isinstance(number, complex | np.complexfloating):
        return np.dtype(np.complex128)
    return np.dtype(np.float64 if isinstance(number, float | np.floating) else np.int64)


def as_operand(value: Any) -> Tensor:
    """An operand as a Tensor; a number as a 0-d one of its ``number_dtype`` (a float16 or longdouble NumPy
    scalar too, whose own dtype no Tensor holds): the op casts it to its ``result_type`` anyway."""
    if not isinstance(value, Tensor) and (number := as_number(value)) is not None:
        return Tensor(np.asarray(number, dtype=number_dtype(number)))
    return as_tensor(value)


# bool < integer < floating < complex
CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


def result_type(*operands: Any) -> np.dtype:
    """The dtype an op on ``operands`` computes in: PyTorch's type promotion (``torch.result_type``).

    Operands rank in three groups: tensors with dimensions (Tensors, arrays), 0-d Tensors, and numbers
    (``as_number``), a number counting as its category's default dtype (int64, float64, complex128). Within
    a group dtypes promote as in NumPy, except that integers and bools never widen a float or complex dtype
    (int64 with float32 is float32). The first group decides, unless a later one is of a higher category
    (bool < integer < floating < complex): then that one does, but a complex one next to a float group keeps
    the float's precision (float32 with 1j is complex64). So float32 stays float32 next to an integer
    tensor, a 0-d float64 tensor or 2.5.

    Two differences from PyTorch: the default float dtype is float64 (NumPy's), so an int64 tensor times 2.5
    is float64, as in PyTorch after ``torch.set_default_dtype(torch.float64)``; and uint16-uint64 promote as
    in NumPy, where PyTorch refuses them.
    """
    groups: tuple[list[np.dtype], ...] = ([], [], [])
    for x in operands:
        if isinstance(x, Tensor) or (number := as_number(x)) is None:
            x = as_tensor(x)
            groups[0 if x.ndim else 1].append(x.dtype)
        else:
            groups[2].append(number_dtype(number))
    result = None
    for group in reversed(groups):
        if not group:
            continue
        dtype = np.result_type(*([d for d in group if d.kind in "fc"] or group))
        if result is None or CATEGORY[dtype.kind] >= CATEGORY[result.kind]:
            result = dtype
        elif dtype.kind == "f":  # and result is complex
            result = np.promote_types(dtype, np.complex64)
    return result


def floating(dtype: np.dtype) -> np.dtype:
    """``dtype``, or the default float dtype (float64) for integers and bools: true division and the
    transcendental functions compute in it, as in PyTorch (NumPy's exp gives float16 for int8)."""
    return dtype if dtype.kind in "fc" else np.dtype(np.float64)


def cast(dtype: np.dtype, *operands: Any) -> list[Any]:
    """Each array cast to ``dtype``; anything else (pow's number exponent, linear's absent bias) left as it is."""
    return [x.astype(dtype, copy=False) if isinstance(x, np.ndarray) else x for x in operands]


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``grad`` over the axes broadcasting added or stretched, back to ``shape``."""
    if grad.shape == shape:
        return grad
    lead = grad.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and grad.shape[lead + i] != 1)
    return grad.sum(axis=axes, keepdims=True).reshape(shape)


def broadcast_shape(op: str, a: np.ndarray, b: np.ndarray) -> tuple[int, ...]:
    try:
        return np.broadcast_shapes(np.shape(a), np.shape(b))
    except ValueError:
        raise ValueError(
            f"{op}: operands could not be broadcast together with shapes {np.shape(a)} and {np.shape(b)}"
        ) from None


def require_real(op: str, *arrays: Any) -> None:
    """Refuse complex input to an op that is not analytic (complex step cannot pass through it)."""
    if any(np.iscomplexobj(a) for a in arrays):
        raise TypeError(
            f"{op} is not analytic, so the complex-step method cannot differentiate through it; use method='central'"
        )


def normalize_axis(op: str, axis: Axis, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``axis`` as a sorted tuple of non-negative axes (``None`` means all).

    As in NumPy and PyTorch, a 0-d tensor accepts axis 0 or -1 (and reduces nothing).
    """
    ndim = len(shape)
    if axis is None:
        return tuple(range(ndim))
    try:
        axes = normalize_axis_tuple(axis, builtins.max(ndim, 1))
    except (TypeError, ValueError) as e:  # AxisError is a ValueError
        raise type(e)(f"{op}: axis={axis!r} is invalid for an input of shape {shape}: {e}") from None
    return tuple(sorted(axes)) if ndim else ()


def reduction_axis(op: str, axis: Axis, keepdims: bool, dim: Axis, keepdim: bool | None) -> tuple[Axis, bool]:
    """``axis`` and ``keepdims`` (NumPy's names), or ``dim`` and ``keepdim`` (PyTorch's), which PyTorch
    also accepts both of; giving one argument under both names is an error."""
    if dim is not None:
        if axis is not None:
            raise TypeError(f"{op}: got both axis={axis!r} and dim={dim!r}; they name the same argument")
        axis = dim
    if keepdim is not None:
        if keepdims:
            raise TypeError(f"{op}: got both keepdims and keepdim; they name the same argument")
        keepdims = keepdim
    return axis, bool(keepdims)


def expand_reduced(grad: np.ndarray, shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """Put back the reduced axes of ``grad`` (as size 1) so it broadcasts against ``shape``."""
    if keepdims:
        return grad
    return grad.reshape([1 if i in axes else n for i, n in enumerate(shape)])


# -- arithmetic -----------------------------------------------------------------
class Add(Function):
    """y = a + b;  dL/da = g,  dL/db = g  (each summed back to its input's shape)."""

    @staticmethod
    def forward(ctx: Context, a: np.ndarray, b: np.ndarray, dtype: np.dtype) -> np.ndarray:
        broadcast_shape("add", a, b)
        ctx.shapes = np.shape(a), np.shape(b)
        a, b = cast(dtype, a, b)
        return a + b

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return unbroadcast(g, ctx.shapes[0]), unbroadcast(g, ctx.shapes[1])


class Sub(Function):
    """y = a - b;  dL/da = g,  dL/db = -g."""

    @staticmethod
    def forward(ctx: Context, a: np.ndarray, b: np.ndarray, dtype: np.dtype) -> np.ndarray:
        broadcast_shape("sub", a, b)
        ctx.shapes = np.shape(a), np.shape(b)
        a, b = cast(dtype, a, b)
        return a - b

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return unbroadcast(g, ctx.shapes[0]), unbroadcast(-g, ctx.shapes[1])


class Mul(Function):
    """y = a * b;  dL/da = g * b,  dL/db = g * a.

    Saved: b only for a's gradient, a only for b's, as PyTorch saves them, so that a step on a
    parameter w before the backward of ``w * x`` is refused only where the backward reads w (when x
    wants a gradient). (The inputs themselves stay alive anyway, in ``ctx.inputs``.)
    """

    @staticmethod
    def forward(ctx: Context, a: np.ndarray, b: np.ndarray, dtype: np.dtype) -> np.ndarray:
        broadcast_shape("mul", a, b)
        ctx.shapes = np.shape(a), np.shape(b)
        a, b = cast(dtype, a, b)  # saved cast: g * an int64 mask would be float64 for a float32 g
        need_a, need_b = ctx.needs_input_grad
        ctx.save_for_backward(a if need_b else None, b if need_a else None)
        return a * b

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        a, b = ctx.saved_tensors
        da = unbroadcast(g * b, ctx.shapes[0]) if ctx.needs_input_grad[0] else None
        db = unbroadcast(g * a, ctx.shapes[1]) if ctx.needs_input_grad[1] else None
        return da, db


class Div(Function):
    """y = a / b (true division: integers divide as float64);  dL/da = g / b,  dL/db = -g * a / b^2 = -g * y / b."""

    @staticmethod
    def forward(ctx: Context, a: np.ndarray, b: np.ndarray, dtype: np.dtype) -> np.ndarray:
        broadcast_shape("div", a, b)
        ctx.shapes = np.shape(a), np.shape(b)
        a, b = cast(floating(dtype), a, b)
        y = a / b
        ctx.save_for_backward(b, y if ctx.needs_input_grad[1] else None)  # (y only for b's gradient)
        return y

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        b, y = ctx.saved_tensors
        g_over_b = g / b
        da = unbroadcast(g_over_b, ctx.shapes[0]) if ctx.needs_input_grad[0] else None
        db = unbroadcast(-g_over_b * y, ctx.shapes[1]) if ctx.needs_input_grad[1] else None
        return da, db


class Pow(Function):
    """y = a ** b;  dL/da = g * b * a^(b-1), but 0 where b = 0;
    dL/db = g * y * log(a) (b a tensor), but 0 where a = 0 and b >= 0.

    The two exceptions are PyTorch's (``pow_backward_self``, ``pow_backward_exponent``):
    there the formulas give 0 * inf or 0 * log(0) = nan, while a^0 = 1 is constant in a
    and 0^b = 0 constant in b > 0. Elsewhere the formulas hold as written, as in PyTorch:
    a negative base gives a nan dL/db (log of a negative number), and a = 0 with b < 1,
    b != 0, an infinite dL/da.
    """

    @staticmethod
    def forward(ctx: Context, a: np.ndarray, b: Any, dtype: np.dtype) -> np.ndarray:
        broadcast_shape("pow", a, b)
        a, b = cast(dtype, a, b)
        y = a**b
        ctx.save_for_backward(a, b, y if ctx.needs_input_grad[1] else None)  # (y only for b's gradient)
        return y

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        a, b, y = ctx.saved_tensors
        zero = np.zeros((), dtype=g.dtype)
        da = db = None
        # The masked-out entries are the 0 * inf and 0 * log(0) computed before np.where discards them.
        with np.errstate(divide="ignore", invalid="ignore"):
            if ctx.needs_input_grad[0]:
                da = unbroadcast(np.where(b == 0, zero, g * b * a ** (b - 1)), np.shape(a))
            if ctx.needs_input_grad[1]:
                db = unbroadcast(g * np.where((a == 0) & (b >= 0), zero, y * np.log(a)), np.shape(b))
        return da, db


class Neg(Function):
    """y = -a;  dL/da = -g."""

    @staticmethod
    def forward(ctx: Context, a: np.ndarray) -> np.ndarray:
        return -a

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> np.ndarray:
        return -g


class MatMul(Function):
    """y = a @ b (NumPy's matmul: batched, broadcasting over leading axes).

    For matrices, dL/da = g @ b^T and dL/db = a^T @ g; batch axes that
    broadcasting stretched are summed back. A 1-D operand is treated as a row
    (a) or column (b) vector and the added axis removed again.
    """

    @staticmethod
    def forward(ctx: Context, a: np.ndarray, b: np.ndarray, dtype: np.dtype) -> np.ndarray:
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError(f"matmul: both operands need at least one dimension, got shapes {a.shape} and {b.shape}")
        k_a, k_b = a.shape[-1], b.shape[-2] if b.ndim > 1 else b.shape[0]
        if k_a != k_b:
            raise ValueError(
                f"matmul: shapes {a.shape} and {b.shape} are not aligned: {k_a} (last dim of a) != {k_b} "
                f"({'second-to-last' if b.ndim > 1 else 'only'} dim of b)"
            )
        try:
            np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            raise ValueError(
                f"matmul: batch dimensions of shapes {a.shape} and {b.shape} cannot be broadcast together"
            ) from None
        ctx.shapes = a.shape, b.shape
        a, b = cast(dtype, a, b)
        need_a, need_b = ctx.needs_input_grad
        ctx.save_for_backward(a if need_b else None, b if need_a else None)  # (each for the other's gradient)
        return a @ b

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        a, b = ctx.saved_tensors
        shape_a, shape_b = ctx.shapes
        shape_a2 = (1, *shape_a) if len(shape_a) == 1 else shape_a  # a vector a as a row
        shape_b2 = (*shape_b, 1) if len(shape_b) == 1 else shape_b  # a vector b as a column
        batch = np.broadcast_shapes(shape_a2[:-2], shape_b2[:-2])
        g2 = g.reshape(*batch, shape_a2[-2], shape_b2[-1])  # g with the vectors' axes put back
        da = db = None
        if ctx.needs_input_grad[0]:
            da = unbroadcast(g2 @ np.swapaxes(b.reshape(shape_b2), -1, -2), shape_a2).reshape(shape_a)
        if ctx.needs_input_grad[1]:
            db = unbroadcast(np.swapaxes(a.reshape(shape_a2), -1, -2) @ g2, shape_b2).reshape(shape_b)
        return da, db


# -- reductions -------------------------------------------------------------------
class Sum(Function):
    """y = sum of a over ``axis``;  dL/da = g broadcast back over the summed axes."""

    @staticmethod
    def forward(ctx: Context, a: np.ndarray, axis: Axis = None, keepdims: bool = False) -> np.ndarray:
        ctx.axes, ctx.keepdims, ctx.shape = normalize_axis("sum", axis, a.shape), keepdims, a.shape
        # integers sum in int64, as in PyTorch (NumPy sums unsigned ones in uint64)
        return np.sum(a, axis=ctx.axes, keepdims=keepdims, dtype=np.int64 if a.dtype.kind == "u" else None)

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> np.ndarray:
        return np.broadcast_to(expand_reduced(g, ctx.shape, ctx.axes, ctx.keepdims), ctx.shape)


class Mean(Function):
    """y = mean of a over ``axis`` (n elements each);  dL/da = g / n, broadcast back."""

    @staticmethod
    def forward(ctx: Context, a: np.ndarray, axis: Axis = None, keepdims: bool = False) -> np.ndarray:
        ctx.axes, ctx.keepdims, ctx.shape = normalize_axis("mean", axis, a.shape), keepdims, a.shape
        return np.mean(a, axis=ctx.axes, keepdims=keepdims)

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> np.ndarray:
        n = int(np.prod([ctx.shape[i] for i in ctx.axes]))
        return np.broadcast_to(expand_reduced(g, ctx.shape, ctx.axes, ctx.keepdims) / n, ctx.shape)


class Max(Function):
    """y = max of a over ``axis``.

    dL/da = g at the maximal elements, 0 elsewhere. k tied maxima share the
    gradient equally, g/k each (as ``torch.amax``). For a two-way tie that is
    the average of the one-sided derivatives, which is what central differences
    see; for k >= 3 they see 1/2 for each tied element, not 1/k: there is no
    derivative at a tie, and finite differences cannot check one there.
    """

    @staticmethod
    def forward(ctx: Context, a: np.ndarray, axis: Axis = None, keepdims: bool = False) -> np.ndarray:
        require_real("max", a)
        if a.size == 0:
            raise ValueError(f"max: cannot reduce an empty tensor of shape {a.shape}")
        ctx.axes, ctx.keepdims = normalize_axis("max", axis, a.shape), keepdims
        y = np.max(a, axis=ctx.axes, keepdims=True)
        ctx.save_for_backward(a, y)
        return y if keepdims else np.squeeze(y, axis=ctx.axes)

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> np.ndarray:
        a, y = ctx.saved_tensors
        is_max = a == y
        share = is_max / np.sum(is_max, axis=ctx.axes, keepdims=True)
        return expand_reduced(g, a.shape, ctx.axes, ctx.keepdims) * share.astype(a.dtype)


# -- elementwise functions --------------------------------------------------------------
class Exp(Function):
    """y = exp(a);  dL/da = g * y."""

    @staticmethod
    def forward(ctx: Context, a: np.ndarray) -> np.ndarray:
        y = np.exp(a, dtype=floating(a.dtype))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> np.ndarray:
        (y,) = ctx.saved_tensors
        return g * y


class Log(Function):
    """y = log(a);  dL/da = g / a."""

    @staticmethod
    def forward(ctx: Context, a: np.ndarray) -> np.ndarray:
        ctx.save_for_backward(a)
        return np.log(a, dtype=floating(a.dtype))

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> np.ndarray:
        (a,) = ctx.saved_tensors
        return g / a


class Sqrt(Function):
    """y = sqrt(a);  dL/da = g / (2 y)."""

    @staticmethod
    def forward(ctx: Context, a: np.ndarray) -> np.ndarray:
        y = np.sqrt(a, dtype=floating(a.dtype))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> np.ndarray:
        (y,) = ctx.saved_tensors
        return g / (2 * y)


class Tanh(Function):
    """y = tanh(a);  dL/da = g * (1 - y^2)."""

    @staticmethod
    def forward(ctx: Context, a: np.ndarray) -> np.ndarray:
        y = np.tanh(a, dtype=floating(a.dtype))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> np.ndarray:
        (y,) = ctx.saved_tensors
        return g * (1 - y * y)


class Abs(Function):
    """y = |a|;  dL/da = g * sign(a)  (0 at a = 0, as PyTorch). Not analytic: no complex step."""

    @staticmethod
    def forward(ctx: Context, a: np.ndarray) -> np.ndarray:
        require_real("abs", a)
        ctx.save_for_backward(a)
        return np.abs(a)

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> np.ndarray:
        (a,) = ctx.saved_tensors
        return g * np.sign(a)


# -- shape ops ------------------------------------------------------------------------
class Reshape(Function):
    """y = a viewed with a new shape;  dL/da = g viewed with a's shape."""

    @staticmethod
    def forward(ctx: Context, a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        ctx.shape = a.shape
        try:
            return a.reshape(shape)
        except ValueError:
            raise ValueError(
                f"reshape: cannot reshape a tensor of shape {a.shape} ({a.size} elements) into {tuple(shape)}"
            ) from None

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> np.ndarray:
        return g.reshape(ctx.shape)


class Permute(Function):
    """y = a with its axes reordered by ``dims``;  dL/da = g with the inverse order."""

    @staticmethod
    def forward(ctx: Context, a: np.ndarray, dims: tuple[int, ...]) -> np.ndarray:
        # The range is checked first: modulo ndim alone would let 3 pass as axis 1 of a 2-d tensor.
        in_range = all(-a.ndim <= d < a.ndim for d in dims)
        if not in_range or sorted(d % a.ndim for d in dims) != list(range(a.ndim)):
            raise ValueError(
                f"permute: dims {tuple(dims)} are not a permutation of the axes of a tensor of shape {a.shape} "
                f"(each dim must be in [{-a.ndim}, {a.ndim}), each axis named once)"
            )
        ctx.inverse = tuple(np.argsort([d % a.ndim for d in dims]))
        return np.transpose(a, dims)

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> np.ndarray:
        return np.transpose(g, ctx.inverse)


class GetItem(Function):
    """y = a[index] (slices, integers, integer or boolean arrays).

    dL/da is zero except where a was read: there ``g`` is scattered back with
    ``np.add.at``, so an element read several times (a repeated index) gets
    the sum of its gradients. The index arrays and lists are copied, so that
    a later write into them cannot send the gradient elsewhere than what was
    read.
    """

    @staticmethod
    def forward(ctx: Context, a: np.ndarray, index: Any) -> np.ndarray:
        # (a basic index holds only ints, slices, None and Ellipsis, which no write can change)
        ctx.index, ctx.shape = index if _is_basic_index(index) else copy.deepcopy(index), a.shape
        try:
            y = a[index]
        except IndexError as e:
            raise IndexError(f"getitem: {e} (tensor of shape {a.shape})") from None
        if not isinstance(y, np.ndarray):  # one element: NumPy gives a copy, a scalar; PyTorch, as here, a 0-d view
            y = a[(*index, ...) if isinstance(index, tuple) else (index, ...)]
        return y

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> np.ndarray:
        da = np.zeros(ctx.shape, dtype=g.dtype)
        if _is_basic_index(ctx.index):
            da[ctx.index] = g  # basic indexing never reads an element twice
        else:
            np.add.at(da, ctx.index, g)
        return da


def _is_basic_index(index: Any) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return all(p is None or p is Ellipsis or isinstance(p, int | slice | np.integer) for p in parts)


class Concatenate(Function):
    """y = the inputs joined along ``axis``;  dL/d(input k) = the slice of g that input k filled."""

    @staticmethod
    def forward(ctx: Context, *arrays: np.ndarray, axis: int, dtype: np.dtype) -> np.ndarray:
        try:
            y = np.concatenate(cast(dtype, *arrays), axis=axis)
        except ValueError as e:
            raise ValueError(f"concatenate: {e}; shapes {[a.shape for a in arrays]}") from None
        ctx.splits, ctx.axis = np.cumsum([a.shape[axis] for a in arrays])[:-1], axis
        return y

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> tuple[np.ndarray, ...]:
        return tuple(np.split(g, ctx.splits, axis=ctx.axis))


class Stack(Function):
    """y = the inputs stacked along a new ``axis``;  dL/d(input k) = g taken at k on that axis."""

    @staticmethod
    def forward(ctx: Context, *arrays: np.ndarray, axis: int, dtype: np.dtype) -> np.ndarray:
        try:
            y = np.stack(cast(dtype, *arrays), axis=axis)
        except ValueError as e:
            raise ValueError(f"stack: {e}; shapes {[a.shape for a in arrays]}") from None
        ctx.axis = axis
        return y

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> tuple[np.ndarray, ...]:
        return tuple(np.moveaxis(g, ctx.axis, 0))


class MaskedFill(Function):
    """y = value where mask, else a;  dL/da = g where not mask, 0 where mask;
    dL/dvalue = sum of g where mask (value a 0-d tensor, as in PyTorch)."""

    @staticmethod
    def forward(ctx: Context, a: np.ndarray, value: np.ndarray, mask: np.ndarray) -> np.ndarray:
        ctx.save_for_backward(mask)
        return np.where(mask, value.astype(a.dtype, copy=False), a)

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        (mask,) = ctx.saved_tensors
        zero = np.zeros((), dtype=g.dtype)
        da = np.where(mask, zero, g) if ctx.needs_input_grad[0] else None
        dvalue = np.where(mask, g, zero).sum() if ctx.needs_input_grad[1] else None
        return da, None if dvalue is None else np.asarray(dvalue)


# -- the functions Tensor's methods call ---------------------------------------------------------
def add(a: Any, b: Any) -> Tensor:
    return _binary(Add, a, b)


def sub(a: Any, b: Any) -> Tensor:
    refuse_bool("sub", "subtraction, the - operator,", a, b)
    return _binary(Sub, a, b)


def mul(a: Any, b: Any) -> Tensor:
    return _binary(Mul, a, b)


def div(a: Any, b: Any) -> Tensor:
    return _binary(Div, a, b)


def pow(a: Any, b: Any) -> Tensor:  # noqa: A001  (the ** operator)
    if isinstance(a, Tensor) and (exponent := as_number(b)) is not None:
        # kept a Python number (cast leaves it): NumPy computes it in a's dtype, and x ** 2 stays a square
        return Pow.apply(a, exponent, dtype=result_type(a, b))
    return _binary(Pow, a, b)


def neg(a: Tensor) -> Tensor:
    refuse_bool("neg", "negation, the - operator,", a)
    return Neg.apply(a)


def refuse_bool(op: str, what: str, *operands: Any) -> None:
    """As PyTorch: a bool tensor is a mask, not a number to subtract (use ~ or logical_xor)."""
    for x in operands:
        if isinstance(x, Tensor | np.ndarray) and x.dtype == np.bool_:
            raise TypeError(f"{op}: {what} with a bool tensor (shape {x.shape}) is not supported; use ~ or ^")


def matmul(a: Any, b: Any) -> Tensor:
    return _binary(MatMul, a, b)


def sum(  # noqa: A001
    a: Tensor, axis: Axis = None, keepdims: bool = False, *, dim: Axis = None, keepdim: bool | None = None
) -> Tensor:
    axis, keepdims = reduction_axis("sum", axis, keepdims, dim, keepdim)
    return Sum.apply(a, axis=axis, keepdims=keepdims)


def mean(
    a: Tensor, axis: Axis = None, keepdims: bool = False, *, dim: Axis = None, keepdim: bool | None = None
) -> Tensor:
    axis, keepdims = reduction_axis("mean", axis, keepdims, dim, keepdim)
    return Mean.apply(a, axis=axis, keepdims=keepdims)


def max(  # noqa: A001
    a: Tensor, axis: Axis = None, keepdims: bool = False, *, dim: Axis = None, keepdim: bool | None = None
) -> Tensor:
    axis, keepdims = reduction_axis("max", axis, keepdims, dim, keepdim)
    return Max.apply(a, axis=axis, keepdims=keepdims)


def exp(a: Tensor) -> Tensor:
    return Exp.apply(a)


def log(a: Tensor) -> Tensor:
    return Log.apply(a)


def sqrt(a: Tensor) -> Tensor:
    return Sqrt.apply(a)


def tanh(a: Tensor) -> Tensor:
    return Tanh.apply(a)


def abs(a: Tensor) -> Tensor:  # noqa: A001
    return Abs.apply(a)


def compare(op: str, a: Any, b: Any) -> Tensor:
    """Elementwise comparison: a boolean Tensor outside the graph (it has no gradient)."""
    dtype = result_type(a, b)
    a, b = as_operand(a).data, as_operand(b).data
    if op not in ("equal", "not_equal"):  # complex numbers are equal or not, but have no order
        require_real(op, a, b)
    broadcast_shape(op, a, b)
    return Tensor(getattr(np, op)(*cast(dtype, a, b)))


def reshape(a: Tensor, shape: Sequence[int]) -> Tensor:
    shape = _ints("reshape", "shape", shape, a.shape)
    if any(n < -1 for n in shape):  # (NumPy reads any negative size as -1)
        raise ValueError(f"reshape: invalid size in shape {shape} (input of shape {a.shape}): only -1 may be negative")
    return Reshape.apply(a, shape=shape)


def permute(a: Tensor, dims: Sequence[int]) -> Tensor:
    return Permute.apply(a, dims=_ints("permute", "dims", dims, a.shape))


def swapaxes(a: Tensor, axis1: int, axis2: int) -> Tensor:
    axis1, axis2 = _ints("swapaxes", "axes", (axis1, axis2), a.shape)
    dims = list(range(a.ndim))
    try:
        dims[axis1], dims[axis2] = dims[axis2], dims[axis1]
    except IndexError:
        raise np.exceptions.AxisError(f"swapaxes: axes ({axis1}, {axis2}) out of range for shape {a.shape}") from None
    return Permute.apply(a, dims=tuple(dims))


def getitem(a: Tensor, index: Any) -> Tensor:
    if isinstance(index, tuple):
        index = tuple(i.data if isinstance(i, Tensor) else i for i in index)
    elif isinstance(index, Tensor):
        index = index.data
    return GetItem.apply(a, index=index)


def concatenate(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    tensors = _sequence("concatenate", tensors)
    return Concatenate.apply(*tensors, axis=axis, dtype=result_type(*tensors))


def stack(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    tensors = _sequence("stack", tensors)
    return Stack.apply(*tensors, axis=axis, dtype=result_type(*tensors))


def _sequence(op: str, tensors: Any) -> list[Tensor]:
    # (a Tensor iterates over its rows: taken for the sequence, it concatenated its own rows, as PyTorch refuses)
    if isinstance(tensors, Tensor | np.ndarray):
        raise TypeError(
            f"{op}: expected a sequence of tensors, got one {type(tensors).__name__} of shape {tensors.shape}"
        )
    return [as_tensor(t) for t in tensors]


def masked_fill(a: Tensor, mask: Any, value: float | Tensor) -> Tensor:
    mask = np.asarray(mask.data if isinstance(mask, Tensor) else mask)
    if mask.dtype != np.bool_:
        raise TypeError(f"masked_fill: mask must be boolean, got dtype {mask.dtype}")
    if broadcast_shape("masked_fill", a.data, mask) != a.shape:
        raise ValueError(f"masked_fill: mask of shape {mask.shape} does not broadcast to the input's shape {a.shape}")
    fill_value("masked_fill", value, a.dtype)
    return MaskedFill.apply(a, as_operand(value), mask=mask)  # (of any dtype: the result keeps a's, as PyTorch)


def fill_value(op: str, value: Any, dtype: np.dtype) -> np.ndarray:
    """``value`` (a number or a 0-d tensor) as a 0-d array, refused unless ``dtype`` can hold it (``can_hold``):
    NumPy's cast would drop an imaginary part, or wrap an integer around (int8 300 is 44)."""
    x = number(op, "value", value)
    if not can_hold(dtype, x):
        raise RuntimeError(f"{op}: value {x!r} cannot be converted to the tensor's dtype {dtype}")
    return np.asarray(x)


def number(op: str, name: str, value: Any) -> bool | int | float | complex:
    """``value``, a number or a 0-d tensor (PyTorch's Scalar), as a Python number."""
    v = np.asarray(value.data if isinstance(value, Tensor) else value)
    if v.ndim != 0:
        raise ValueError(f"{op}: {name} must be a number or a 0-d tensor, got shape {v.shape}")
    if v.dtype.kind not in "biufc":
        raise TypeError(f"{op}: {name} must be a number or a 0-d tensor, got {type(value).__name__}")
    return v.item()


def can_hold(dtype: np.dtype, x: bool | int | float | complex) -> bool:
    """Whether ``dtype`` can hold the number ``x`` (as PyTorch decides for a fill value): no complex in a real
    dtype, no nan, inf or out-of-range value in an integer one, no finite one beyond a float's range (inf
    and nan are floats; a fraction is truncated into an integer, as PyTorch's)."""
    if isinstance(x, complex):
        return dtype.kind == "c"
    if dtype.kind == "b":
        return True
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return math.isfinite(x) and info.min <= x <= info.max
    return not math.isfinite(x) or builtins.abs(x) <= float(np.finfo(dtype).max)


def _binary(fn: type[Function], a: Any, b: Any) -> Tensor:
    """``fn`` on both operands as Tensors, computing in the ``result_type`` of the operands as given (once
    wrapped, a number would count as a 0-d tensor)."""
    return fn.apply(as_operand(a), as_operand(b), dtype=result_type(a, b))


def is_int(value: Any) -> bool:
    """An int, Python's or NumPy's, and not a bool (which PyTorch refuses as a size, an axis or a count)."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _ints(op: str, name: str, values: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``values`` (a sequence, or one value) as a tuple of ints (``is_int``)."""
    values = tuple(values) if isinstance(values, Iterable) else (values,)
    for v in values:
        if not is_int(v):
            raise TypeError(
                f"{op}: {name} {values} must be integers, got {type(v).__name__} {v!r} (input of shape {shape})"
            )
    return tuple(int(v) for v in values)
