"""The argument checks shared by the public norms.

The functionals, their ``*_jacobian`` and the modules (``minigrad_norm.nn.norm``)
check their arguments with these same functions, so that they refuse the same
calls with the same errors, each naming the op and the argument.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from minigrad_norm.kernels.reference import check_eps_type
from minigrad_norm.norms._node import View
from minigrad_norm.ops import as_tensor, is_int
from minigrad_norm.tensor import Tensor


def array_of(value: Any) -> np.ndarray | None:
    """The ndarray inside a Tensor (or the array itself, or None)."""
    if value is None:
        return None
    return np.asarray(value.data if isinstance(value, Tensor) else value)


def as_float_tensor(op: str, x: Any) -> Tensor:
    """``x`` as a Tensor; integer or boolean data is a TypeError (a norm of integers is meaningless)."""
    t = as_tensor(x)
    if t.dtype.kind not in "fc":
        raise TypeError(f"{op}: input must be a floating-point array, got dtype {t.dtype} with shape {t.shape}")
    return t


def check_eps(op: str, eps: Any, *, allow_zero: bool = False) -> float:
    """eps must be a finite real number > 0 (>= 0 where ``allow_zero``: the mathematical eps = 0 case); not
    text, which ``float`` would read ("1e-5") and PyTorch refuses (``check_eps_type``)."""
    check_eps_type(op, eps)
    value = float(eps)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{op}: eps must be a finite number {bound}, got {eps!r}")
    return value


def check_flag(op: str, name: str, value: Any) -> bool:
    """A switch (``training``, ``use_input_stats``, a module's ``affine``...) must be a bool (Python's or
    NumPy's): anything else would be read by its truth value, and the text "False" is true.

    PyTorch's functionals refuse the rest with TypeError too, ints included (``training=1``).
    """
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{op}: {name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def check_momentum(op: str, momentum: Any) -> float | None:
    """``momentum`` is a real number (as PyTorch, ints and NumPy scalars included) or None; not text,
    which ``float`` would read ("0.5") and PyTorch refuses. None is refused later, where it would be used
    (``running_stats``)."""
    if momentum is None:
        return None
    if not isinstance(momentum, numbers.Real):
        raise TypeError(f"{op}: momentum must be a real number or None, got {type(momentum).__name__} {momentum!r}")
    return float(momentum)


def check_int(op: str, name: str, value: Any, *, minimum: int | None = None) -> int:
    """A count (``num_groups``, ``num_features``...) must be an int (Python's or NumPy's) and not a bool,
    as in PyTorch, where ``int()`` would truncate 2.5 or read "2"; ``>= minimum`` when one is given."""
    if not is_int(value):
        raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{op}: {name} must be >= {minimum}, got {value}")
    return int(value)


def check_normalized_shape(op: str, normalized_shape: Any) -> tuple[int, ...]:
    """``normalized_shape`` as a tuple of sizes >= 0: an int or a sequence of ints (not bools, as in
    ``check_int``).

    Whether it is non-empty and matches the input is for ``row_view`` (a module checks that at its
    forward, as PyTorch's ``LayerNorm(())`` does).
    """
    message = (
        f"{op}: normalized_shape must be an int or a sequence of ints, got "
        f"{type(normalized_shape).__name__} {normalized_shape!r}"
    )
    if isinstance(normalized_shape, str | bytes | bool | np.bool_):
        raise TypeError(message)
    if is_int(normalized_shape):
        dims: tuple[Any, ...] = (normalized_shape,)
    else:
        try:
            dims = tuple(normalized_shape)
        except TypeError:
            raise TypeError(message) from None
    if not all(is_int(d) for d in dims):
        raise TypeError(message)
    shape = tuple(int(d) for d in dims)
    if any(d < 0 for d in shape):
        raise ValueError(f"{op}: normalized_shape={shape} must have no negative size")
    return shape


def check_affine(op: str, name: str, value: Any, shape: tuple[int, ...], x_shape: tuple[int, ...]) -> Any:
    """``weight``/``bias`` must be None or a float array of exactly ``shape``; returned unchanged (Tensor or
    array). (A text weight was read as numbers by one backend and refused by NumPy on the other.)"""
    if value is None:
        return None
    data = array_of(value)
    if data.dtype.kind not in "fc":
        raise TypeError(f"{op}: {name} must be a floating-point array, got dtype {data.dtype}")
    if data.shape != shape:
        raise ValueError(f"{op}: {name} must have shape {shape} for an input of shape {x_shape}, got {data.shape}")
    return value


def channel_args(op: str, x: Any, weight: Any, bias: Any, eps: Any) -> tuple[Tensor, Any, Any, float, View]:
    """Check the arguments every ``(N, C, *)`` norm takes; returns them and the view (N, C, 1, S)."""
    x = as_float_tensor(op, x)
    if x.ndim < 2:
        raise ValueError(f"{op}: input must have at least 2 dims (N, C, *), got shape {x.shape}")
    n, c = x.shape[:2]
    weight = check_affine(op, "weight", weight, (c,), x.shape)
    bias = check_affine(op, "bias", bias, (c,), x.shape)
    return x, weight, bias, check_eps(op, eps), (n, c, 1, math.prod(x.shape[2:]))


def check_mask(op: str, mask: Any, x_shape: tuple[int, ...]) -> np.ndarray | None:
    """A boolean mask of shape (N, *spatial) as a C-contiguous (N, S) array, or None."""
    if mask is None:
        return None
    m = array_of(mask)
    expected = x_shape[:1] + x_shape[2:]
    if m.dtype != np.bool_:
        raise TypeError(f"{op}: mask must be a boolean array of shape {expected}, got dtype {m.dtype}")
    if m.shape != expected:
        raise ValueError(
            f"{op}: mask must have shape (N, *spatial) = {expected} for an input of shape {x_shape}, got {m.shape}"
        )
    return np.ascontiguousarray(m).reshape(x_shape[0], math.prod(x_shape[2:]))  # (not -1: N may be 0)


def check_count(op: str, counts: np.ndarray, what: str, x_shape: tuple[int, ...], masked: bool) -> None:
    """Training statistics need at least 2 values each: with 1 the output would be ``bias`` whatever x.

    An empty input (N = 0) computes no statistic, so it passes, as in PyTorch (whose check is
    ``size == 1``), even though its counts are 0.
    """
    if math.prod(x_shape) and counts.min() <= 1:
        where = f" (the mask leaves {int(counts.min())} valid value(s) for some statistic)" if masked else ""
        raise ValueError(
            f"{op}: Expected more than 1 {what} when training, got input size {x_shape}{where}: with a single "
            "value, x - mean is 0 and the output would be the bias whatever the input"
        )


def check_writeable(op: str, name: str, buffer: np.ndarray) -> None:
    """A buffer updated in place must be writable, checked before any update, so that a refused call changes
    none of them (NumPy's own error would come after the first update, and name neither op nor buffer)."""
    if not buffer.flags.writeable:
        raise ValueError(f"{op}: {name} is read-only, but training updates it in place")
