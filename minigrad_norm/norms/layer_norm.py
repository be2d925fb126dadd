"""LayerNorm: normalize each sample over its trailing ``normalized_shape`` dims.

Forward, for each row x of D = prod(normalized_shape) values:

    mu   = 1/D * sum_i x_i
    var  = 1/D * sum_i (x_i - mu)^2          (biased, two-pass)
    rstd = 1 / sqrt(var + eps)
    xhat = (x - mu) * rstd
    y    = xhat * gamma + beta               (gamma, beta of shape normalized_shape)

Saved for the backward: x, mu, rstd (one per row) and gamma; xhat is recomputed.

Backward (docs/derivations.md, "LayerNorm"), with g = dL/dy and dxhat = g * gamma:

    dL/dx     = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))   (means over the row)
    dL/dgamma = sum over rows of g * xhat
    dL/dbeta  = sum over rows of g

The view: x (..., *normalized_shape) is (rows, 1, D, 1) for the shared node
``Normalize`` (one group per row, weight of shape (1, D)). This is the
reference case the other norms are stated against.

Code path: ``layer_norm`` -> ``row_args`` (the checks and the view) -> ``Normalize``
(``_node.py``) -> ``norm_forward``/``norm_backward`` of ``kernels/reference.py`` with
``centered=True``.

Closed-form Jacobian of one row (``layer_norm_jacobian``):

    J = diag(gamma) * rstd * (I - 1/D * 1 1^T - 1/D * xhat xhat^T)

Without gamma, J is symmetric; its eigenvalues are 0 (along 1),
rstd * eps / (var + eps) (along xhat) and rstd (D - 2 times).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from minigrad_norm.norms._args import as_float_tensor, check_affine, check_eps, check_normalized_shape
from minigrad_norm.norms._jacobian import view_jacobians
from minigrad_norm.norms._node import Normalize, View
from minigrad_norm.tensor import Tensor


def row_view(op: str, x_shape: tuple[int, ...], normalized_shape: int | Sequence[int]) -> tuple[tuple[int, ...], View]:
    """``normalized_shape`` as a tuple (``check_normalized_shape``), and the (rows, 1, D, 1) view; the
    trailing dims must match."""
    shape = check_normalized_shape(op, normalized_shape)
    if not shape or x_shape[len(x_shape) - len(shape) :] != shape:
        raise ValueError(
            f"{op}: normalized_shape={shape} must be non-empty and equal the input's trailing dims, "
            f"but the input has shape {x_shape}"
        )
    # (rows as a product, not size // D: a normalized_shape with a 0, as PyTorch allows, is an empty input)
    return shape, (math.prod(x_shape[: len(x_shape) - len(shape)]), 1, math.prod(shape), 1)


def row_args(
    op: str, x: Any, normalized_shape: int | Sequence[int], weight: Any, bias: Any, eps: Any
) -> tuple[Tensor, Any, Any, float, View]:
    """The checks ``layer_norm``, ``rms_norm`` and their Jacobians share (as ``channel_args`` for the (N, C, *)
    norms): x as a float Tensor, eps >= 0, weight and bias None or of ``normalized_shape``; returns them and
    the view (rows, 1, D, 1)."""
    x = as_float_tensor(op, x)
    eps = check_eps(op, eps, allow_zero=True)
    shape, view = row_view(op, x.shape, normalized_shape)
    weight = check_affine(op, "weight", weight, shape, x.shape)
    return x, weight, check_affine(op, "bias", bias, shape, x.shape), eps, view


def layer_norm(
    input: Any,  # noqa: A002  (PyTorch's name, for callers passing it by keyword)
    normalized_shape: int | Sequence[int],
    weight: Tensor | np.ndarray | None = None,
    bias: Tensor | np.ndarray | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """LayerNorm over the trailing ``normalized_shape`` dims (PyTorch's ``F.layer_norm``).

    ``eps`` must be >= 0; eps = 0 is allowed (PyTorch allows it too) because
    the exact invariants are stated at eps = 0, but a constant row then gives
    0/0 = NaN.
    """
    x, weight, bias, eps, view = row_args("layer_norm", input, normalized_shape, weight, bias, eps)
    return Normalize.apply(x, weight, bias, view=view, eps=eps)


def layer_norm_jacobian(
    x: Any, normalized_shape: int | Sequence[int], weight: Any = None, eps: float = 1e-5
) -> np.ndarray:
    """The closed-form Jacobian of each row of ``layer_norm``: shape (rows, D, D).

    J[r] = diag(gamma) * rstd_r * (I - 1/D * 1 1^T - 1/D * xhat_r xhat_r^T),
    rows in C order of the leading dims, elements in C order of normalized_shape.
    The arguments are checked as ``layer_norm`` checks them, with the same errors.
    """
    x, weight, _, eps, view = row_args("layer_norm_jacobian", x, normalized_shape, weight, None, eps)
    return view_jacobians(x, weight, eps, view)
