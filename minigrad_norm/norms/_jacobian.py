"""The closed-form Jacobians of the norms, to check the hand-derived backward against.

The formulas are stated in ``minigrad_norm/jacobians.py``'s docstring.
``group_jacobians`` computes them for each group of the 4-D view of
``Normalize`` (``_node.py``); each norm's ``*_jacobian`` reaches it through
``view_jacobians`` (BatchNorm and InstanceNorm through ``channel_jacobians``,
after their forward's checks), and ``full_jacobian`` assembles the per-group
blocks into the whole Jacobian.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minigrad_norm.norms._args import array_of
from minigrad_norm.norms._channel import channel_call_args
from minigrad_norm.norms._node import View
from minigrad_norm.tensor import Tensor


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
