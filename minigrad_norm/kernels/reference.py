"""The NumPy reference kernels: readable, exact, and the oracle for the numba ones.

Every normalization layer here is the same computation on a 4-D view of its
input, ``x`` of shape ``(N, G, K, S)``:

* statistics (mean and variance, or only the mean square) over each group:
  over ``(K, S)`` for each ``(n, g)`` ("per sample": LayerNorm, RMSNorm,
  GroupNorm, InstanceNorm), or over ``(N, K, S)`` for each ``g`` when
  ``reduce_batch`` ("per channel": BatchNorm);
* ``xhat = (x - mean) * rstd`` with ``rstd = 1 / sqrt(var + eps)``;
* an affine per ``(g, k)``, broadcast over ``n`` and ``s``:
  ``y = xhat * weight[g, k] + bias[g, k]``.

How each norm maps onto the view (D = prod(normalized_shape), S = prod(spatial)):

    LayerNorm / RMSNorm   (rows, 1, D, 1)     per sample, weight (1, D)
    GroupNorm             (N, G, C/G, S)      per sample, weight (G, C/G)
    InstanceNorm          (N, C, 1, S)        per sample, weight (C, 1)
    BatchNorm             (N, C, 1, S)        per channel, weight (C, 1)

An optional ``mask`` of shape ``(N, S)`` marks the valid positions: the
statistics count only those, masked-out outputs are 0 and get 0 gradient.

The backward (derived in docs/derivations.md). With m the number of values in
a group, mean_g(.) the mean over the group, and dxhat = dy * weight:

    centered:      dx = rstd * (dxhat - mean_g(dxhat) - xhat * mean_g(dxhat * xhat))
    not centered:  dx = rstd * (dxhat - xhat * mean_g(dxhat * xhat))
    fixed stats:   dx = rstd * dxhat            (mean, var are constants: eval-mode BatchNorm,
                                                 InstanceNorm with use_input_stats=False)
    dweight[g, k] = sum over (n, s) of dy * xhat,   dbias[g, k] = sum over (n, s) of dy
                    (both None without a weight: a caller with a bias alone passes weight = 1)

Here g indexes the view's second axis (the group, a channel for BatchNorm and
InstanceNorm), not dL/dy as in docs/derivations.md; dx's terms are added as
(dxhat - xhat * proj) - mean_g(dxhat), the order the numba bound is stated for.

Names in docs/derivations.md = names here: mu = mean, gamma = weight, beta = bias,
g = dy (dya in the accumulation dtype), m = the group's size (count under a mask),
ms (RMSNorm) = var, B/m = mean_g(dxhat * xhat) = proj, A/m = mean_g(dxhat) (no name:
the last term of dx); var, rstd, xhat and dxhat are the same.

Float32 data is accumulated in float64 here; complex data (the complex-step
method) in complex128. Everything is written with analytic operations
(``xc * xc``, never ``abs`` or ``np.var``) so that the complex step applies.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

_erf = np.vectorize(math.erf, otypes=[np.float64])


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, elementwise, in x's dtype (a floating-point one)."""
    check_numeric("erf", "x", x, kinds="f")
    return _erf(x).astype(x.dtype, copy=False)


def rstd(var: np.ndarray, eps: float) -> np.ndarray:
    """rstd = 1 / sqrt(var + eps), elementwise (eps inside the square root, as PyTorch): the factor by which the
    forward scales x - mean, from the var it returns, for the backward."""
    check_numeric("rstd", "var", var)
    check_eps_type("rstd", eps)
    return 1.0 / np.sqrt(var + eps)


# ---------------------------------------------------------------------------
# the arguments' contract, checked by both backends before any work


# (the type tests below take tuples built once: ``isinstance(a, np.ndarray | np.generic)`` builds the union on
# every call, and these checks run on every kernel call, whose own work can be a microsecond or two)
_ARRAY_TYPES = (np.ndarray, np.generic)
_REAL_TYPES = (int, float, np.integer, np.floating)
_BOOL_TYPES = (bool, np.bool_)


def _check_shape(op: str, name: str, a: np.ndarray, shape: tuple[int, ...]) -> None:
    # (``a`` is an ndarray or a NumPy scalar, checked before: both have a shape)
    if a.shape != shape:
        raise ValueError(f"{op}: {name} has shape {a.shape}, expected {shape}")


def is_complex(a: np.ndarray | None) -> bool:
    """Whether ``a`` holds complex numbers (the complex step's data; None does not): an array's dtype read directly,
    as ``np.iscomplexobj`` reads it for anything else, which costs 0.3 us a call (1.1 on None) on every kernel call."""
    if a is None:
        return False
    dtype = getattr(a, "dtype", None)
    return np.iscomplexobj(a) if dtype is None else dtype.kind == "c"


def check_numeric(op: str, name: str, a: np.ndarray, kinds: str = "fc") -> None:
    """``a`` is an ndarray (or a NumPy scalar: an op on a 0-d array gives one) of one of the dtype ``kinds``
    (float, or complex: the complex step's data)."""
    if not isinstance(a, _ARRAY_TYPES):
        raise TypeError(f"{op}: {name} must be an ndarray, got {type(a).__name__}")
    if a.dtype.kind not in kinds:
        raise TypeError(f"{op}: {name} must be a floating-point array, got dtype {a.dtype}")


def check_eps_type(op: str, eps: Any) -> None:
    """eps is a real number, a Python or NumPy int or float (as PyTorch's float argument): not a Fraction, which
    NumPy's ufuncs refuse; nor text, which ``float("1e-5")`` reads (and numba's ``float(eps)`` would) where NumPy's
    ``var + "1e-5"`` and PyTorch refuse it; nor a complex number, an array or None, on which the backends would
    fail in different ways or give a complex output."""
    if not isinstance(eps, _REAL_TYPES):
        raise TypeError(f"{op}: eps must be a real number, got {eps!r}")


def check_args(
    op: str,
    x: np.ndarray,
    *,
    reduce_batch: bool,
    flags: dict[str, Any],
    weight: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    stats: tuple[np.ndarray, np.ndarray] | None = None,
    dy: np.ndarray | None = None,
    out: np.ndarray | None = None,
    eps: Any = 0.0,
) -> None:
    """What ``norm_forward``/``norm_backward`` require of their arguments, for both backends: ndarrays, x a
    float (or complex) one of shape (N, G, K, S); dy of x's shape; weight and bias (G, K) float; the statistics
    (N, G), or (G,) with ``reduce_batch``; a boolean mask (N, S); ``out`` of x's shape, writable, of a dtype x's
    casts to within its kind; ``reduce_batch`` and the other ``flags`` bools; eps a real number
    (``check_eps_type``). Nothing is broadcast: a wrong shape raises ``ValueError`` naming the argument, never a
    silently different result; a wrong type raises ``TypeError``, never a result read by truth value."""
    check_eps_type(op, eps)
    for name, value in (("reduce_batch", reduce_batch), *flags.items()):
        if not isinstance(value, _BOOL_TYPES):
            raise TypeError(f"{op}: {name} must be a bool, got {type(value).__name__} {value!r}")
    check_numeric(op, "x", x)
    if x.ndim != 4:
        raise ValueError(f"{op}: x must be 4-D (N, G, K, S), got shape {x.shape}")
    N, G, K, S = x.shape
    if dy is not None:
        check_numeric(op, "dy", dy)
        _check_shape(op, "dy", dy, x.shape)
    for name, a in (("weight", weight), ("bias", bias)):
        if a is not None:
            check_numeric(op, name, a)
            _check_shape(op, name, a, (G, K))
    names = ("mean", "var") if op == "norm_forward" else ("mean", "rstd")
    if stats is not None and not (isinstance(stats, tuple | list) and len(stats) == 2):
        got = type(stats).__name__ + (f" of length {len(stats)}" if isinstance(stats, tuple | list) else "")
        raise TypeError(f"{op}: stats must be None or a pair of arrays ({', '.join(names)}), got {got}")
    for name, a in zip(names, stats or ()):
        check_numeric(op, name, a)
        _check_shape(op, name, a, (G,) if reduce_batch else (N, G))
    if mask is not None:
        if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_:
            raise TypeError(f"{op}: mask must be a boolean array, got {getattr(mask, 'dtype', type(mask).__name__)}")
        _check_shape(op, "mask", mask, (N, S))
    if out is not None:
        if not isinstance(out, np.ndarray):
            raise TypeError(f"{op}: out must be an ndarray, got {type(out).__name__}")
        _check_shape(op, "out", out, x.shape)
        if not out.flags.writeable:
            raise ValueError(f"{op}: out is read-only")
        if out.dtype.kind != x.dtype.kind or not np.can_cast(x.dtype, out.dtype, "same_kind"):
            raise TypeError(f"{op}: out has dtype {out.dtype}, which the {x.dtype} result cannot be cast to")


# ---------------------------------------------------------------------------
# the kernels


def _stat_axes(reduce_batch: bool) -> tuple[int, ...]:
    return (0, 2, 3) if reduce_batch else (2, 3)


def _mask4(mask: np.ndarray | None) -> np.ndarray | None:
    return None if mask is None else mask[:, None, None, :]


def _group_mean(v: np.ndarray, axes: tuple[int, ...], mask4: np.ndarray | None, count: np.ndarray | None) -> np.ndarray:
    """Mean of v over the statistic axes (keepdims), over the valid positions only when masked."""
    if mask4 is None:
        return v.mean(axis=axes, keepdims=True)
    return np.where(mask4, v, 0).sum(axis=axes, keepdims=True) / count


def _count(x: np.ndarray, mask4: np.ndarray | None, axes: tuple[int, ...]) -> np.ndarray | None:
    if mask4 is None:
        return None
    return np.broadcast_to(mask4, x.shape).sum(axis=axes, keepdims=True)


def norm_forward(
    x: np.ndarray,
    weight: np.ndarray | None,
    bias: np.ndarray | None,
    eps: float,
    *,
    centered: bool = True,
    reduce_batch: bool = False,
    mask: np.ndarray | None = None,
    stats: tuple[np.ndarray, np.ndarray] | None = None,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Normalize ``x`` (N, G, K, S) group by group, then apply the affine.

    Returns ``(y, mean, var)``; ``mean`` and ``var`` have shape (N, G), or (G,)
    with ``reduce_batch``, in the accumulation dtype (float64, or complex128).
    ``var`` is the biased variance (the mean square when not ``centered``;
    then ``mean`` is 0). With ``stats=(mean, var)`` the
    given statistics are used instead of computed (eval-mode BatchNorm,
    InstanceNorm with ``use_input_stats=False``) and
    returned unchanged. Arguments as ``check_args`` says.
    """
    check_args(
        "norm_forward", x, reduce_batch=reduce_batch, flags={"centered": centered}, weight=weight, bias=bias,
        mask=mask, stats=stats, out=out, eps=eps,
    )  # fmt: skip
    acc = np.result_type(x.dtype, np.float64, *(np.asarray(s).dtype for s in stats or ()))
    axes = _stat_axes(reduce_batch)
    m4 = _mask4(mask)
    xa = x.astype(acc, copy=False)
    if stats is None:
        count = _count(x, m4, axes)
        mean = _group_mean(xa, axes, m4, count) if centered else np.zeros((1,) * 4, dtype=acc)
        xc = xa - mean
        var = _group_mean(xc * xc, axes, m4, count)
    else:
        mean, var = (_as_stat4(s, reduce_batch).astype(acc, copy=False) for s in stats)
        xc = xa - mean
    r = rstd(var, eps)
    y = xc * r
    if weight is not None:
        y = y * weight[None, :, :, None]
    if bias is not None:
        y = y + bias[None, :, :, None]
    if m4 is not None:
        y = np.where(m4, y, 0)
    if out is None:
        # x's dtype; complex if a complex weight or bias (a complex step) made y complex
        out = np.empty(x.shape, dtype=np.result_type(x.dtype, y.dtype) if np.iscomplexobj(y) else x.dtype)
    out[...] = y
    stat_shape = (x.shape[1],) if reduce_batch else x.shape[:2]
    mean = np.broadcast_to(mean, var.shape).reshape(stat_shape)
    return out, mean.astype(acc), var.reshape(stat_shape).astype(acc)


def norm_backward(
    dy: np.ndarray,
    x: np.ndarray,
    mean: np.ndarray,
    rstd: np.ndarray,
    weight: np.ndarray | None,
    *,
    centered: bool = True,
    reduce_batch: bool = False,
    mask: np.ndarray | None = None,
    fixed_stats: bool = False,
    need_affine_grads: bool = True,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Gradients of ``norm_forward``: returns ``(dx, dweight, dbias)``.

    ``mean`` and ``rstd`` are the statistics the forward used (shape (N, G) or
    (G,)); ``rstd = 1 / sqrt(var + eps)``. ``dweight``/``dbias`` are None
    when ``weight`` is None or ``need_affine_grads`` is False. Arguments as
    ``check_args`` says; ``out`` may be ``dy`` or ``x`` itself.
    """
    check_args(
        "norm_backward", x, reduce_batch=reduce_batch,
        flags={"centered": centered, "fixed_stats": fixed_stats, "need_affine_grads": need_affine_grads},
        weight=weight, mask=mask, stats=(mean, rstd), dy=dy, out=out,
    )  # fmt: skip
    acc = np.result_type(x.dtype, dy.dtype, np.float64)
    axes = _stat_axes(reduce_batch)
    m4 = _mask4(mask)
    mean4 = _as_stat4(mean, reduce_batch).astype(acc, copy=False)
    rstd4 = _as_stat4(rstd, reduce_batch).astype(acc, copy=False)
    dya = dy.astype(acc, copy=False)
    if m4 is not None:
        dya = np.where(m4, dya, 0)
    # the mean the forward subtracted: Normalize saves mean = 0 when not centered, but a direct call may pass
    # any mean with centered=False, which the forward never subtracted (unless it was given: fixed_stats)
    xhat = (x.astype(acc, copy=False) - (mean4 if centered or fixed_stats else 0)) * rstd4
    if m4 is not None:  # masked-out values (even NaN) must reach no sum
        xhat = np.where(m4, xhat, 0)
    dxhat = dya * weight[None, :, :, None] if weight is not None else dya

    if fixed_stats:
        dx = dxhat * rstd4
    else:
        count = _count(x, m4, axes)
        proj = _group_mean(dxhat * xhat, axes, m4, count)  # B/m of docs/derivations.md
        # the xhat term first and the mean term last: the mean term is the optional one (RMSNorm has none),
        # and numba's float32 error bound is stated against this order of operations
        dx = dxhat - xhat * proj
        if centered:
            dx = dx - _group_mean(dxhat, axes, m4, count)
        dx = dx * rstd4
    if m4 is not None:
        dx = np.where(m4, dx, 0)
    dweight = dbias = None
    if weight is not None and need_affine_grads:  # (before dx is written: out may be dy, which dya may be)
        dweight = (dya * xhat).sum(axis=(0, 3)).astype(weight.dtype)
        dbias = dya.sum(axis=(0, 3)).astype(weight.dtype)
    if out is None:
        out = np.empty(x.shape, dtype=x.dtype)
    out[...] = dx
    return out, dweight, dbias


def _as_stat4(stat: np.ndarray, reduce_batch: bool) -> np.ndarray:
    """A statistic of shape (N, G) or (G,) as a 4-D array that broadcasts against x."""
    return stat[None, :, None, None] if reduce_batch else stat[:, :, None, None]
