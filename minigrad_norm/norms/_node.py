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

    forward:  x -> view x4 -> norm_forward(x4, weight, bias) -> (y, mean, var);
              rstd = 1 / sqrt(var + eps), computed here;  saved: x4, mean, rstd, weight
    backward: dy -> norm_backward(dy, x4, mean, rstd, weight) -> dx, dweight, dbias
              (a bias without a weight: weight = 1, so that dbias comes back)

``norm_forward`` and ``norm_backward`` are the kernels' functions, picked by
``kernels_for`` (``minigrad_norm/backend.py``). Their formulas are read in
``minigrad_norm/kernels/reference.py``, whose module docstring states the backward
(derived in docs/derivations.md); the numba backend computes the same.

An empty input (N = 0, or any other zero-size dim) has no statistic to compute.
As PyTorch does for BatchNorm, GroupNorm, LayerNorm and RMSNorm, it gives an
empty output, leaves the running buffers alone, and its backward gives an empty
dx and zero dweight/dbias (no position contributes to their sums); for
InstanceNorm, where PyTorch differs, see docs/derivations.md §6. It reaches no
kernel: there is nothing to compute, and for a BatchNorm channel of N = 0
samples the kernels would divide 0 by 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minigrad_norm.backend import kernels_for
from minigrad_norm.tensor import Context, Function

View = tuple[int, int, int, int]


@dataclass
class RunningStats:
    """Running buffers updated in place by a training-mode forward (BatchNorm, InstanceNorm).

    ``new = (1 - momentum) * old + momentum * batch_stat``, with the *unbiased*
    batch variance ``var * count / (count - 1)``. Per-sample statistics (N, C)
    (InstanceNorm) are averaged over N first, as PyTorch does. Both buffers are
    there (``_channel.check_buffer_pair``).
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
        rstd = kernels_for(var).rstd(var, eps)
        ctx.save_for_backward(x4, mean, rstd, w2)
        # the mask copied, as the given statistics are: a later write into it cannot reach the backward
        mask = None if mask is None else mask.copy()
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
