"""The one graph node behind every norm: normalize the groups of a 4-D view, then an affine.

Every norm in this package is the same computation once its input is seen as
``x4`` of shape ``(N, G, K, S)`` (see ``minigrad_norm.kernels.reference``):

    mean  = mean over the group of x          (0 when not centered: RMSNorm)
    var   = mean over the group of (x - mean)^2
    rstd  = 1 / sqrt(var + eps)
    xhat  = (x - mean) * rstd
    y     = xhat * weight[g, k] + bias[g, k]

where "the group" is ``(K, S)`` for each ``(n, g)`` (per-sample norms) or
``(N, K, S)`` for each ``g`` (BatchNorm, ``reduce_batch``). Each public norm
only arranges its axes into that view and states its own math; the forward and
backward below are the single place the graph node is defined:

    forward:  x -> view x4 -> norm_forward(x4, weight, bias) -> y;    saved: see ``Normalize``
    backward: dy -> norm_backward(dy, x4, mean, rstd, weight) -> dx, dweight, dbias

``norm_forward`` and ``norm_backward`` are the kernels' functions, picked by
``kernels_for`` (``minigrad_norm/backend.py``). Their formulas are read in
``minigrad_norm/kernels/reference.py``, whose module docstring states the backward
(derived in docs/derivations.md); the numba backend computes the same.

An empty input (N = 0, or any other zero-size dim) has no statistic to compute.
As in PyTorch, it gives an empty output, leaves the running buffers alone, and
its backward gives an empty dx and zero dweight/dbias (no position contributes
to their sums). It reaches no kernel: there is nothing to compute, and for a
BatchNorm channel of N = 0 samples the kernels would divide 0 by 0.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from minigrad_norm.backend import kernels_for
from minigrad_norm.kernels.reference import check_eps_type
from minigrad_norm.ops import as_tensor
from minigrad_norm.tensor import Context, Function, Tensor

View = tuple[int, int, int, int]


@dataclass
class RunningStats:
    """Running buffers updated in place by a training-mode forward (BatchNorm, InstanceNorm).

    ``new = (1 - momentum) * old + momentum * batch_stat``, with the *unbiased*
    batch variance ``var * count / (count - 1)``. Per-sample statistics (N, C)
    (InstanceNorm) are averaged over N first, as PyTorch does. Both buffers are
    there (``check_buffer_pair``).
    """

    mean: np.ndarray
    var: np.ndarray
    momentum: float

    def update(self, mean: np.ndarray, var: np.ndarray, count: np.ndarray) -> None:
        # under the complex-step method the real part is the statistic of the real input (to O(h^2))
        mean, var = mean.real, var.real
        unbiased = var * (count / (count - 1))
        if mean.ndim == 2:  # per-sample statistics: average over the batch
            mean, unbiased = mean.mean(axis=0), unbiased.mean(axis=0)
        m = self.momentum
        self.mean[...] = (1 - m) * self.mean + m * mean
        self.var[...] = (1 - m) * self.var + m * unbiased


class Normalize(Function):
    """Group normalization of the view ``(N, G, K, S)`` then ``* weight + bias``; see the module docstring.

    ``apply(x, weight, bias, view=..., eps=..., ...)``: ``x`` of any shape
    with ``prod(x.shape) == prod(view)``, ``weight``/``bias`` of any shape
    with ``G * K`` elements (or None). Keyword options:

    * ``centered``: subtract the mean (False: RMSNorm);
    * ``reduce_batch``: statistics per ``g`` over ``(N, K, S)`` (BatchNorm);
      statistics then have shape (G,), else (N, G);
    * ``mask``: bool (N, S), the valid positions;
    * ``stats``: given ``(mean, var)`` used as constants, of the statistics'
      shape (eval-mode BatchNorm and InstanceNorm without input statistics
      pass their (C,) running buffers, with ``reduce_batch``);
    * ``running``: ``RunningStats`` to update from the batch statistics.

    What the backward reads:

    * ``ctx.saved_tensors = (x4, mean, rstd, w2)``: x as the view, the
      statistics (mean 0 when not centered), rstd = 1 / sqrt(var + eps), and
      the weight as (G, K) or None (all but x4 None for an empty input);
    * ``ctx.options``: ``centered``, ``reduce_batch``, ``mask``, passed on to
      ``norm_backward`` as the forward used them;
    * ``ctx.fixed_stats``: ``stats`` were given, so the backward has no mean terms;
    * ``ctx.inputs`` and ``ctx.needs_input_grad`` (set by the engine): x,
      weight and bias, whose shapes and dtypes the gradients are given back
      in, and which of them want one.

    x is saved, not xhat (the backward recomputes xhat = (x - mean) * rstd):
    x4 is a view of the input, which ``ctx.inputs`` keeps alive anyway, so
    saving it costs no memory, where xhat would be one more activation-sized
    array. (A non-contiguous input is copied once into x4, which the kernels need.)
    """

    @staticmethod
    def forward(
        ctx: Context,
        x: np.ndarray,
        weight: np.ndarray | None,
        bias: np.ndarray | None,
        *,
        view: View,
        eps: float,
        centered: bool = True,
        reduce_batch: bool = False,
        mask: np.ndarray | None = None,
        stats: tuple[np.ndarray, np.ndarray] | None = None,
        running: RunningStats | None = None,
    ) -> np.ndarray:
        # given statistics are copied, so that a later update of the buffers cannot reach the backward, which
        # stays the derivative of what this forward computed (docs/derivations.md §6)
        if stats is not None:
            stats = (np.array(stats[0], copy=True), np.array(stats[1], copy=True))
        x4 = np.ascontiguousarray(x).reshape(view)
        if x4.size == 0:  # nothing to normalize: no statistic, no kernel, no buffer update (module docstring)
            ctx.save_for_backward(x4, None, None, None)
            return np.empty(x.shape, dtype=x.dtype)
        affine_shape = view[1:3]
        w2 = None if weight is None else np.ascontiguousarray(weight).reshape(affine_shape)
        b2 = None if bias is None else np.ascontiguousarray(bias).reshape(affine_shape)
        # the formula: kernels/reference.py norm_forward (the numba backend computes the same; see backend.py)
        y, mean, var = kernels_for(x4, w2, b2).norm_forward(
            x4, w2, b2, eps, centered=centered, reduce_batch=reduce_batch, mask=mask, stats=stats
        )
        if running is not None and stats is None:
            running.update(mean, var, group_count(view, reduce_batch, mask))
        rstd = 1.0 / np.sqrt(var + eps)
        ctx.save_for_backward(x4, mean, rstd, w2)
        ctx.options = {"centered": centered, "reduce_batch": reduce_batch, "mask": mask}
        ctx.fixed_stats = stats is not None
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx: Context, dy: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        x4, mean, rstd, w2 = ctx.saved_tensors
        if x4.size == 0:
            return empty_input_gradients(ctx)
        x, weight, bias = ctx.inputs
        need_w, need_b = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        if w2 is None and need_b:  # bias without weight: dbias is the core's dbias with weight = 1
            w2 = np.ones(x4.shape[1:3], dtype=bias.dtype)
        elif need_b and bias.dtype != w2.dtype:
            # the kernels return dbias in the weight's dtype: widened (exactly), a float32 weight does not
            # round a float64 bias's gradient to float32
            w2 = w2.astype(np.result_type(w2.dtype, bias.dtype))
        dy4 = np.ascontiguousarray(dy).reshape(x4.shape)
        # the formula: kernels/reference.py norm_backward (the numba backend computes the same; see backend.py)
        dx, dw, db = kernels_for(x4, dy4, w2).norm_backward(
            dy4, x4, mean, rstd, w2, fixed_stats=ctx.fixed_stats, need_affine_grads=need_w or need_b, **ctx.options
        )
        return (
            dx.reshape(x.shape) if ctx.needs_input_grad[0] else None,
            dw.reshape(weight.shape).astype(weight.dtype, copy=False) if need_w else None,
            db.reshape(bias.shape).astype(bias.dtype, copy=False) if need_b else None,
        )


def empty_input_gradients(ctx: Context) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """dx, dweight, dbias of an empty input: zeros of each input's shape and dtype, where asked for.

    dweight and dbias are sums over no position, so 0, as in PyTorch.
    """
    return tuple(
        np.zeros(t.shape, dtype=t.dtype) if needed else None for t, needed in zip(ctx.inputs, ctx.needs_input_grad)
    )


def group_count(view: View, reduce_batch: bool, mask: np.ndarray | None) -> np.ndarray:
    """How many values each statistic averages: shape (G,) or (N, G), as float64."""
    n, g, k, s = view
    if mask is None:
        per_stat = n * k * s if reduce_batch else k * s
        return np.full((g,) if reduce_batch else (n, g), float(per_stat))
    valid = mask.reshape(n, s).sum(axis=1).astype(np.float64) * k  # per sample
    return np.full(g, valid.sum()) if reduce_batch else np.repeat(valid[:, None], g, axis=1)


# -- argument checks shared by the public functionals ------------------------------------------------
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


def _is_int(value: Any) -> bool:
    """An int, Python's or NumPy's, and not a bool."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def check_int(op: str, name: str, value: Any, *, minimum: int | None = None) -> int:
    """A count (``num_groups``, ``num_features``...) must be an int (Python's or NumPy's) and not a bool,
    as in PyTorch, where ``int()`` would truncate 2.5 or read "2"; ``>= minimum`` when one is given."""
    if not _is_int(value):
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
    if _is_int(normalized_shape):
        dims: tuple[Any, ...] = (normalized_shape,)
    else:
        try:
            dims = tuple(normalized_shape)
        except TypeError:
            raise TypeError(message) from None
    if not all(_is_int(d) for d in dims):
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


def check_running(op: str, name: str, value: Any, c: int) -> np.ndarray | None:
    """A running buffer: None or a float ndarray of shape (C,) (updated in place, so not a copy)."""
    if value is None:
        return None
    if isinstance(value, Tensor):
        value = value.data
    if not isinstance(value, np.ndarray) or value.dtype.kind != "f":
        raise TypeError(f"{op}: {name} must be a float ndarray of shape ({c},), got {type(value).__name__}")
    if value.shape != (c,):
        raise ValueError(f"{op}: {name} must have shape ({c},) (one per channel), got {value.shape}")
    return value


def check_buffer_pair(op: str, mean: np.ndarray | None, var: np.ndarray | None) -> None:
    """Both running buffers or neither (PyTorch's ValueError): one alone would be updated in training
    while its partner goes stale, and cannot normalize in evaluation."""
    if (mean is None) != (var is None):
        given = "running_mean" if var is None else "running_var"
        raise ValueError(
            f"{op}: running_mean and running_var must either both be None or neither be None, got only {given}"
        )


def running_stats(
    op: str, mean: np.ndarray | None, var: np.ndarray | None, momentum: float | None
) -> RunningStats | None:
    """The buffers a training-mode forward updates, or None when there are none; ``momentum`` as
    ``check_momentum`` returns it."""
    if mean is None or var is None:  # (both, after check_buffer_pair)
        return None
    check_writeable(op, "running_mean", mean)
    check_writeable(op, "running_var", var)
    if momentum is None:
        raise TypeError(
            f"{op}: momentum=None (a cumulative average) needs the batch counter of a module; the functional "
            "form takes a number (the module passes 1 / num_batches_tracked)"
        )
    return RunningStats(mean, var, momentum)


def check_writeable(op: str, name: str, buffer: np.ndarray) -> None:
    """A buffer updated in place must be writable, checked before any update, so that a refused call changes
    none of them (NumPy's own error would come after the first update, and name neither op nor buffer)."""
    if not buffer.flags.writeable:
        raise ValueError(f"{op}: {name} is read-only, but training updates it in place")


def given_stats(op: str, mean: np.ndarray | None, var: np.ndarray | None, flag: str) -> tuple[np.ndarray, np.ndarray]:
    """Statistics used as constants: both buffers must be there."""
    if mean is None or var is None:
        raise ValueError(f"{op}: running_mean and running_var are required when {flag} (they normalize the input)")
    return mean, var


class ChannelArgs(NamedTuple):
    """A BatchNorm/InstanceNorm call's arguments after ``channel_args``' checks and those below."""

    x: Tensor
    weight: Any
    bias: Any
    eps: float
    view: View
    mask: np.ndarray | None
    stats: tuple[np.ndarray, np.ndarray] | None  # the running buffers, when they are the statistics
    running_mean: np.ndarray | None
    running_var: np.ndarray | None


def channel_call_args(
    op: str,
    x: Any,
    running_mean: Any,
    running_var: Any,
    weight: Any,
    bias: Any,
    input_stats: Any,
    eps: Any,
    mask: Any,
    *,
    reduce_batch: bool,
) -> ChannelArgs:
    """The checks shared by ``channel_norm`` and ``channel_jacobians``, so that both refuse the same calls.

    With ``input_stats`` each statistic must average more than one value; without, the running buffers
    must be given, and are the statistics.
    """
    what, flag = ("value per channel", "training") if reduce_batch else ("spatial element", "use_input_stats")
    input_stats = check_flag(op, flag, input_stats)
    x, weight, bias, eps, view = channel_args(op, x, weight, bias, eps)
    running_mean = check_running(op, "running_mean", running_mean, view[1])
    running_var = check_running(op, "running_var", running_var, view[1])
    check_buffer_pair(op, running_mean, running_var)
    mask = check_mask(op, mask, x.shape)
    stats = None
    if input_stats:
        check_count(op, group_count(view, reduce_batch, mask), what, x.shape, mask is not None)
    else:
        stats = given_stats(op, running_mean, running_var, f"{flag}=False")
    return ChannelArgs(x, weight, bias, eps, view, mask, stats, running_mean, running_var)


def channel_norm(
    x: Any,
    running_mean: np.ndarray | None,
    running_var: np.ndarray | None,
    weight: Any,
    bias: Any,
    input_stats: bool,
    momentum: float | None,
    eps: float,
    mask: Any,
    *,
    reduce_batch: bool,
) -> Tensor:
    """BatchNorm (``reduce_batch``) and InstanceNorm on the view (N, C, 1, S).

    With ``input_stats`` (BatchNorm's ``training``, InstanceNorm's
    ``use_input_stats``) the statistics come from x, per channel or per
    (n, c), each must average more than one value, and the running buffers,
    if any, are updated; otherwise the running buffers are the statistics.
    """
    op = "batch_norm" if reduce_batch else "instance_norm"
    momentum = check_momentum(op, momentum)
    a = channel_call_args(
        op, x, running_mean, running_var, weight, bias, input_stats, eps, mask, reduce_batch=reduce_batch
    )
    if a.stats is not None:
        # given statistics are the running buffers, per channel (C,), InstanceNorm's too; held constant they
        # average over no group, so its per-(n, c) groups change nothing and they go in as BatchNorm's do
        return Normalize.apply(
            a.x, a.weight, a.bias, view=a.view, eps=a.eps, reduce_batch=True, mask=a.mask, stats=a.stats
        )
    running = running_stats(op, a.running_mean, a.running_var, momentum)
    return Normalize.apply(
        a.x, a.weight, a.bias, view=a.view, eps=a.eps, reduce_batch=reduce_batch, mask=a.mask, running=running
    )


# -- closed-form Jacobians ---------------------------------------------------------------------------
def group_jacobians(
    x4: np.ndarray,
    weight2: np.ndarray | None,
    eps: float,
    *,
    centered: bool = True,
    reduce_batch: bool = False,
    mask: np.ndarray | None = None,
    stats: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """The Jacobian of each group's output w.r.t. the same group's input: (groups, m, m).

    For a group of m values (m = the valid count under a mask), with
    rstd = 1/sqrt(var + eps) and xhat the normalized group:

        J = diag(w) * rstd * (I - 1/m * 1 1^T - 1/m * xhat xhat^T)    (centered)
        J = diag(w) * rstd * (I - 1/m * xhat xhat^T)                   (RMS: no mean)
        J = diag(w) * rstd * I                                         (fixed statistics)

    w is the affine weight of each element (1 without weight). Masked-out
    elements have zero rows and columns. Groups are ordered as the statistics
    ((n, g) per sample, g per channel) and elements within a group as ``x4``'s
    (n, k, s) in C order. Complex input is allowed (the formula is analytic).
    """
    xg = as_groups(x4, reduce_batch).astype(np.result_type(x4.dtype, np.float64))
    n_groups, m = xg.shape
    valid = np.ones_like(xg, dtype=bool) if mask is None else as_groups(_mask_full(mask, x4.shape), reduce_batch)
    count = valid.sum(axis=1, keepdims=True)
    if stats is None:
        mean = (np.where(valid, xg, 0).sum(axis=1, keepdims=True) / count) if centered else np.zeros((n_groups, 1))
        xc = np.where(valid, xg - mean, 0)
        var = (xc * xc).sum(axis=1, keepdims=True) / count
    else:
        stat_shape = x4.shape[1:2] if reduce_batch else x4.shape[:2]
        mean, var = (np.broadcast_to(np.asarray(s, dtype=np.float64), stat_shape).reshape(n_groups, 1) for s in stats)
        xc = np.where(valid, xg - mean, 0)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = xc * rstd
    eye = np.broadcast_to(np.eye(m), (n_groups, m, m)) * valid[:, :, None]
    inner = eye.astype(xhat.dtype)
    if stats is None:
        inner = inner - xhat[:, :, None] * xhat[:, None, :] / count[:, :, None]
        if centered:
            inner = inner - (valid[:, :, None] & valid[:, None, :]) / count[:, :, None]
    if weight2 is None:
        return rstd[:, :, None] * inner
    w = as_groups(np.broadcast_to(weight2[None, :, :, None], x4.shape), reduce_batch)
    return w[:, :, None] * rstd[:, :, None] * inner


def channel_jacobians(
    op: str,
    x: Any,
    weight: Any,
    eps: Any,
    *,
    reduce_batch: bool,
    mask: Any,
    input_stats: bool,
    running_mean: Any,
    running_var: Any,
) -> np.ndarray:
    """``group_jacobians`` of an (N, C, *) input seen as (N, C, 1, S), weight (C,), mask (N, *spatial).

    The arguments go through ``channel_norm``'s checks (``channel_call_args``), so a call its forward
    refuses (no running statistics to hold constant, a statistic of one value, a weight or mask of the wrong
    shape, a flag that is not a bool) is refused here with the same error.
    """
    a = channel_call_args(
        op, x, running_mean, running_var, weight, None, input_stats, eps, mask, reduce_batch=reduce_batch
    )
    return view_jacobians(a.x, a.weight, a.eps, a.view, reduce_batch=reduce_batch, mask=a.mask, stats=a.stats)


def view_jacobians(x: Tensor, weight: Any, eps: float, view: View, **options: Any) -> np.ndarray:
    """``group_jacobians`` of a checked input seen as ``view``, its weight (G * K elements, or None) as (G, K);
    ``options`` as ``group_jacobians``'. The one call of every norm's ``*_jacobian``."""
    w = array_of(weight)
    return group_jacobians(x.data.reshape(view), None if w is None else w.reshape(view[1:3]), eps, **options)


def as_groups(a4: np.ndarray, reduce_batch: bool) -> np.ndarray:
    """The 4-D view as (groups, m): rows (n, g) per sample, or g per channel with elements (n, k, s)."""
    n, g, k, s = a4.shape
    if reduce_batch:
        return a4.transpose(1, 0, 2, 3).reshape(g, n * k * s)
    return a4.reshape(n * g, k * s)


def _mask_full(mask: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The (N, S) mask broadcast to the whole 4-D ``shape`` (N, G, K, S)."""
    return np.broadcast_to(mask.reshape(shape[0], 1, 1, shape[3]), shape)


def full_jacobian(blocks: np.ndarray, view: View, reduce_batch: bool) -> np.ndarray:
    """Assemble the per-group Jacobians into the full (x.size, x.size) Jacobian (zero between groups)."""
    index = as_groups(np.arange(math.prod(view)).reshape(view), reduce_batch)
    full = np.zeros((math.prod(view),) * 2, dtype=blocks.dtype)
    for idx, block in zip(index, blocks):
        full[np.ix_(idx, idx)] = block
    return full
