"""Activations, softmax, linear, embedding and the loss, each one fused graph node.

Each is a single node with a hand-written backward rather than a chain of
primitives: fewer intermediate arrays, and the derivative stated once, next to
the forward. The normalization layers are exported here too (PyTorch's
``torch.nn.functional`` naming); their math lives in ``minigrad_norm.norms``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minigrad_norm.backend import kernels_for
from minigrad_norm.norms import batch_norm, group_norm, instance_norm, layer_norm, rms_norm  # noqa: F401 (re-exported)
from minigrad_norm.norms._args import array_of
from minigrad_norm.ops import as_tensor, cast, normalize_axis, reduction_axis, require_real, result_type
from minigrad_norm.tensor import Context, Function, Tensor

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_TANH_C = 0.044715


class ReLU(Function):
    """y = max(x, 0);  dL/dx = g where y > 0 (that is, x > 0), else 0 (0 at x = 0, as PyTorch).

    Saved: y, not x, as PyTorch saves it: a step on a parameter fed straight into relu does not touch y.
    """

    @staticmethod
    def forward(ctx: Context, x: np.ndarray) -> np.ndarray:
        require_real("relu", x)
        y = np.maximum(x, np.zeros((), dtype=x.dtype))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> np.ndarray:
        (y,) = ctx.saved_tensors
        return np.where(y > 0, g, np.zeros((), dtype=g.dtype))


class GELU(Function):
    """Gaussian error linear unit, y = x * Phi(x), Phi the standard normal CDF.

    exact:  Phi(x) = (1 + erf(x / sqrt2)) / 2,
            dy/dx = Phi(x) + x * phi(x),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
    tanh:   y = x/2 * (1 + t),  t = tanh(u),  u = sqrt(2/pi) * (x + 0.044715 x^3),
            dy/dx = (1 + t)/2 + x/2 * (1 - t^2) * sqrt(2/pi) * (1 + 3 * 0.044715 x^2).
    """

    @staticmethod
    def forward(ctx: Context, x: np.ndarray, approximate: str = "none") -> np.ndarray:
        ctx.approximate = approximate
        if approximate == "tanh":
            t = np.tanh(_SQRT_2_OVER_PI * (x + _GELU_TANH_C * x * x * x))
            ctx.save_for_backward(x, t)
            return 0.5 * x * (1 + t)
        if np.iscomplexobj(x):
            raise TypeError(
                "gelu: the exact erf form has no complex implementation here; "
                "use approximate='tanh' or method='central'"
            )
        cdf = 0.5 * (1 + kernels_for(x).erf(x * np.asarray(1 / math.sqrt(2), dtype=x.dtype)))
        ctx.save_for_backward(x, cdf)  # saving Phi(x) spares the backward a second erf
        return x * cdf

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> np.ndarray:
        x, saved = ctx.saved_tensors
        if ctx.approximate == "tanh":
            t = saved
            dy = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * _GELU_TANH_C * x * x)
        else:
            pdf = np.exp(-0.5 * x * x) * np.asarray(1 / math.sqrt(2 * math.pi), dtype=x.dtype)
            dy = saved + x * pdf
        return g * dy


def softmax_grad(y: np.ndarray, g: np.ndarray, axis: int) -> np.ndarray:
    """dL/dx of y = softmax(x) along ``axis``, from y and g = dL/dy:  y * (g - sum(g * y))."""
    return y * (g - np.sum(g * y, axis=axis, keepdims=True))


class Softmax(Function):
    """y_i = exp(x_i) / sum_j exp(x_j) along ``axis``;  dL/dx = y * (g - sum(g * y)).

    The max is subtracted first so exp never overflows; softmax is invariant
    to that shift, so it carries no gradient (and stays analytic: for complex
    input only the real part's max is used).
    """

    @staticmethod
    def forward(ctx: Context, x: np.ndarray, axis: int = -1) -> np.ndarray:
        if x.size == 0:  # np.max refuses an empty axis; the result is as empty as x
            y = x.copy()
        else:
            e = np.exp(x - np.max(x.real, axis=axis, keepdims=True))
            y = e / np.sum(e, axis=axis, keepdims=True)
        ctx.axis = axis
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> np.ndarray:
        (y,) = ctx.saved_tensors
        return softmax_grad(y, g, ctx.axis)


def log_softmax_array(x: np.ndarray, axis: int) -> np.ndarray:
    """x - logsumexp(x) along ``axis``, shifted by the (real part's) max so exp cannot overflow."""
    if x.size == 0:  # np.max refuses an empty axis; the result is as empty as x
        return x.copy()
    shifted = x - np.max(x.real, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


class LogSoftmax(Function):
    """y = x - logsumexp(x) along ``axis``;  dL/dx = g - softmax(x) * sum(g)."""

    @staticmethod
    def forward(ctx: Context, x: np.ndarray, axis: int = -1) -> np.ndarray:
        y = log_softmax_array(x, axis)
        ctx.axis = axis
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> np.ndarray:
        (y,) = ctx.saved_tensors
        return g - np.exp(y) * np.sum(g, axis=ctx.axis, keepdims=True)


class Linear(Function):
    """y = x @ W^T + b with W of shape (out_features, in_features), as PyTorch.

    dL/dx = g @ W,  dL/dW = sum over rows of g^T x,  dL/db = sum over rows of g.

    Saved: x only if W wants a gradient, W only if x does (as PyTorch's saves), so that a step on W
    before the backward is refused only where the backward would read W.
    """

    @staticmethod
    def forward(
        ctx: Context, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None, *, dtype: np.dtype
    ) -> np.ndarray:
        if weight.ndim != 2:
            raise ValueError(f"linear: weight must be 2-D (out_features, in_features), got shape {weight.shape}")
        if x.ndim == 0 or x.shape[-1] != weight.shape[1]:
            raise ValueError(
                f"linear: input of shape {x.shape} does not match weight of shape {weight.shape}: "
                f"the input's last dim must be in_features={weight.shape[1]}"
            )
        if bias is not None and bias.shape != (weight.shape[0],):
            raise ValueError(f"linear: bias must have shape ({weight.shape[0]},), got {bias.shape}")
        x, weight, bias = cast(dtype, x, weight, bias)
        ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, weight if ctx.needs_input_grad[0] else None)
        y = x @ weight.T
        return y if bias is None else y + bias

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> tuple[np.ndarray | None, ...]:
        x, weight = ctx.saved_tensors
        g2 = g.reshape(-1, g.shape[-1])
        dx = g @ weight if ctx.needs_input_grad[0] else None
        dw = g2.T @ x.reshape(-1, x.shape[-1]) if ctx.needs_input_grad[1] else None
        db = g2.sum(axis=0) if len(ctx.needs_input_grad) > 2 and ctx.needs_input_grad[2] else None
        return (dx, dw, db) if len(ctx.needs_input_grad) > 2 else (dx, dw)


class Embedding(Function):
    """y = weight[indices];  dL/dweight = g scattered back to the rows read (repeats accumulate)."""

    @staticmethod
    def forward(ctx: Context, weight: np.ndarray, indices: np.ndarray) -> np.ndarray:
        if indices.dtype.kind not in "iu":
            raise TypeError(f"embedding: indices must be integers, got dtype {indices.dtype}")
        if indices.size and (indices.min() < 0 or indices.max() >= weight.shape[0]):
            raise IndexError(
                f"embedding: index out of range: indices span [{indices.min()}, {indices.max()}] "
                f"but the weight of shape {weight.shape} has {weight.shape[0]} rows"
            )
        ctx.save_for_backward(indices.copy())  # as GetItem's index: a later write cannot move the gradient
        ctx.weight_shape = weight.shape
        return weight[indices]

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> tuple[np.ndarray, None]:
        (indices,) = ctx.saved_tensors
        dw = np.zeros(ctx.weight_shape, dtype=g.dtype)
        np.add.at(dw, indices.reshape(-1), g.reshape(-1, ctx.weight_shape[1]))
        return dw, None


class CrossEntropy(Function):
    """Mean (or sum) over targets of the cross-entropy of softmax(logits), classes on axis 1 (PyTorch's).

    With log p = log_softmax(logits), the target t, class weights w (all 1 without ``weight``) and
    label smoothing eps over C classes, each counted target's loss is

        l = (1 - eps) * w_t * (-log p_t) + eps / C * sum_c w_c * (-log p_c)

    and, with W = sum_c w_c and e_t the one-hot target,

        dl/dlogits = p * ((1 - eps) * w_t + eps / C * W) - (1 - eps) * w_t * e_t - eps / C * w

    (without weights and smoothing, p - e_t). ``reduction="mean"`` divides the sum by the sum of w_t over
    the counted targets (their number without weights). Targets equal to ``ignore_index`` contribute
    nothing and get zero gradient; with every target ignored the mean is 0 / 0 = nan and the gradient
    zero, as in PyTorch. Logits must be (N, C, ...): PyTorch's unbatched (C,) form is not supported.
    """

    @staticmethod
    def forward(
        ctx: Context,
        logits: np.ndarray,
        targets: np.ndarray,
        weight: np.ndarray | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ) -> np.ndarray:
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        if targets.dtype.kind not in "iu":
            raise TypeError(f"cross_entropy: targets must be class indices (integers), got dtype {targets.dtype}")
        if logits.ndim < 2:
            raise ValueError(
                f"cross_entropy: logits must have at least 2 dims (N, C, ...), got shape {logits.shape} "
                "(the unbatched (C,) form is not supported: pass logits[None] and targets[None])"
            )
        if targets.shape != logits.shape[:1] + logits.shape[2:]:
            raise ValueError(
                f"cross_entropy: logits of shape {logits.shape} (N, C, ...) need targets of shape "
                f"{logits.shape[:1] + logits.shape[2:]}, got {targets.shape}"
            )
        n_classes = logits.shape[1]
        if weight is not None and weight.shape != (n_classes,):
            raise ValueError(
                f"cross_entropy: weight must have shape ({n_classes},) for {n_classes} classes, got {weight.shape}"
            )
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
        counted = targets != ignore_index
        if np.any((targets[counted] < 0) | (targets[counted] >= n_classes)):
            raise IndexError(f"cross_entropy: target out of range for {n_classes} classes")
        log_p = log_softmax_array(np.moveaxis(logits, 1, -1), axis=-1)  # classes last: (..., C)
        w = np.ones(n_classes, dtype=log_p.dtype) if weight is None else weight.astype(log_p.dtype)
        safe_t = np.where(counted, targets, 0)
        w_t = np.where(counted, w[safe_t], np.zeros((), dtype=w.dtype))
        picked = np.take_along_axis(log_p, safe_t[..., None], axis=-1)[..., 0]
        # where, not `* counted`: an ignored row may pick a -inf log-probability, and -(-inf) * 0 is nan
        zero = np.zeros((), dtype=log_p.dtype)
        loss = (1 - label_smoothing) * w_t * np.where(counted, -picked, zero)
        if label_smoothing:
            loss = loss + label_smoothing / n_classes * np.where(counted, -(log_p @ w), zero)
        ctx.reduction, ctx.total_weight, ctx.eps = reduction, float(np.sum(w_t).real), label_smoothing
        ctx.save_for_backward(log_p, safe_t, counted, w, w_t)
        if reduction == "none":
            return loss
        total = np.sum(loss)
        if reduction == "sum":
            return total
        with np.errstate(invalid="ignore"):  # every target ignored: 0 / 0 = nan, as PyTorch, without a warning
            return total / ctx.total_weight

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> tuple[np.ndarray, None]:
        log_p, safe_t, counted, w, w_t = ctx.saved_tensors
        eps, n_classes = ctx.eps, log_p.shape[-1]
        p = np.exp(log_p)
        on_target = (1 - eps) * w_t[..., None]
        d = p * (on_target + eps / n_classes * np.sum(w))
        t = safe_t[..., None]
        np.put_along_axis(d, t, np.take_along_axis(d, t, axis=-1) - on_target, axis=-1)
        if eps:
            d -= eps / n_classes * w
        # With every target ignored the mean is 0 / 0, but no logit reaches it: the gradient is 0 (as
        # PyTorch), so divide by the total weight only where it is not 0, rather than make inf * 0 = nan.
        scale = (
            g[..., None] if ctx.reduction == "none" else g / (ctx.total_weight or 1.0) if ctx.reduction == "mean" else g
        )
        # A product, unlike the forward's np.where: a nan in an ignored row's logits reaches its
        # gradient, as in PyTorch (whose log_softmax backward spreads it). A -inf gives 0, not nan.
        d *= scale * counted[..., None]
        return np.moveaxis(d, -1, 1), None


def relu(input: Tensor) -> Tensor:  # noqa: A002  (PyTorch's name, for callers passing it by keyword)
    return ReLU.apply(input)


def gelu(input: Tensor, approximate: str = "none") -> Tensor:  # noqa: A002
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return GELU.apply(input, approximate=approximate)


def softmax(input: Tensor, axis: int | None = None, *, dim: int | None = None) -> Tensor:  # noqa: A002
    """Softmax along ``axis`` (or ``dim``, PyTorch's name), the last one by default."""
    return Softmax.apply(input, axis=_one_axis("softmax", input, axis, dim))


def log_softmax(input: Tensor, axis: int | None = None, *, dim: int | None = None) -> Tensor:  # noqa: A002
    """Log-softmax along ``axis`` (or ``dim``, PyTorch's name), the last one by default."""
    return LogSoftmax.apply(input, axis=_one_axis("log_softmax", input, axis, dim))


def _one_axis(op: str, x: Tensor, axis: int | None, dim: int | None) -> int:
    axis = reduction_axis(op, axis, False, dim, None)[0]
    axis = -1 if axis is None else axis
    if not isinstance(axis, int | np.integer) or isinstance(axis, bool):
        raise TypeError(f"{op}: axis must be an int, got {axis!r}")
    normalize_axis(op, axis, x.shape)  # an axis out of range raises, naming the op and the shape
    return int(axis)


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:  # noqa: A002
    operands = (as_tensor(input), weight) if bias is None else (as_tensor(input), weight, bias)
    return Linear.apply(*operands, dtype=result_type(*operands))  # (matmul's promotion; PyTorch's refuses mixes)


def embedding(input: Any, weight: Tensor) -> Tensor:  # noqa: A002
    """Rows of ``weight`` (num_embeddings, dim) picked by the integer indices ``input`` (PyTorch's order)."""
    if (w := array_of(weight)).ndim != 2:  # (other ranks ran forward, then failed in the backward)
        raise ValueError(f"embedding: weight must be 2-D (num_embeddings, dim), got shape {w.shape}")
    return Embedding.apply(weight, np.asarray(input.data if isinstance(input, Tensor) else input))


def cross_entropy(
    input: Tensor,  # noqa: A002
    target: Any,
    weight: Any = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """PyTorch's ``F.cross_entropy`` with class-index targets: logits ``input`` (N, C, *), ``target`` (N, *);
    ``weight`` (C,) is a constant, as there. The options after ``weight`` are keyword-only: PyTorch's next
    positional parameters are its deprecated ``size_average`` and ``reduce``, which a call by position would
    have filled."""
    target = np.asarray(target.data if isinstance(target, Tensor) else target)
    weight = array_of(weight)
    return CrossEntropy.apply(
        input, target, weight=weight, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing
    )
