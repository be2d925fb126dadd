"""RMSNorm: LayerNorm without centering (Zhang & Sennrich, 2019).

Forward, for each row x of D = prod(normalized_shape) values:

    ms   = 1/D * sum_i x_i^2                 (the mean square; no mean is subtracted)
    rstd = 1 / sqrt(ms + eps)                (1 / rms(x), rms(x) = sqrt(ms + eps))

eps defaults to None: the machine epsilon of x's dtype (2.2e-16 for float64,
1.2e-7 for float32), as PyTorch's, not LayerNorm's 1e-5.
    xhat = x * rstd
    y    = xhat * gamma

Saved: x, rstd (one per row; the saved "mean" is 0) and gamma.

Backward: as LayerNorm's with the mean(dxhat) term gone, because no mean was
subtracted (d mu / dx = 0), with dxhat = g * gamma:

    dL/dx     = rstd * (dxhat - xhat * mean(dxhat * xhat))
    dL/dgamma = sum over rows of g * xhat

The view is LayerNorm's, (rows, 1, D, 1), with ``centered=False``. Code path:
``rms_norm`` -> ``row_args`` (``layer_norm.py``) -> ``Normalize`` (``_node.py``) ->
``norm_forward``/``norm_backward`` of ``kernels/reference.py`` with ``centered=False``.

Closed-form Jacobian of one row (``rms_norm_jacobian``):

    J = diag(gamma) * rstd * (I - 1/D * xhat xhat^T)

Without gamma and with eps = 0, |xhat|^2 = D, so J is rstd times the
projection onto the complement of x: eigenvalues 0 (along x) and rstd
(D - 1 times), spectral norm 1 / rms(x). With eps > 0 the eigenvalue along x
is rstd * eps / (ms + eps) and the spectral norm is still rstd.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from minigrad_norm.norms._args import as_float_tensor
from minigrad_norm.norms._jacobian import view_jacobians
from minigrad_norm.norms._node import Normalize
from minigrad_norm.norms.layer_norm import row_args
from minigrad_norm.tensor import Tensor


def _default_eps(eps: float | None, dtype: np.dtype) -> float:
    """PyTorch's default: eps=None means the machine epsilon of the input's dtype."""
    return float(np.finfo(dtype).eps) if eps is None else eps


def rms_norm(
    input: Any,  # noqa: A002  (PyTorch's name, for callers passing it by keyword)
    normalized_shape: int | Sequence[int],
    weight: Tensor | np.ndarray | None = None,
    eps: float | None = None,
) -> Tensor:
    """RMSNorm over the trailing ``normalized_shape`` dims (PyTorch's ``F.rms_norm``).

    ``eps=None`` means ``np.finfo(input.dtype).eps``; an explicit eps must be >= 0
    (0 is the exact, scale-invariant case used by the invariants).
    """
    x = as_float_tensor("rms_norm", input)  # (for its dtype's eps)
    x, weight, _, eps, view = row_args("rms_norm", x, normalized_shape, weight, None, _default_eps(eps, x.dtype))
    return Normalize.apply(x, weight, None, view=view, eps=eps, centered=False)


def rms_norm_jacobian(
    x: Any, normalized_shape: int | Sequence[int], weight: Any = None, eps: float | None = None
) -> np.ndarray:
    """The closed-form Jacobian of each row of ``rms_norm``: shape (rows, D, D).

    J[r] = diag(gamma) * rstd_r * (I - 1/D * xhat_r xhat_r^T), rstd = 1/sqrt(mean(x^2) + eps).
    The arguments are checked as ``rms_norm`` checks them, with the same errors.
    """
    op = "rms_norm_jacobian"
    x = as_float_tensor(op, x)  # (for its dtype's eps)
    x, weight, _, eps, view = row_args(op, x, normalized_shape, weight, None, _default_eps(eps, x.dtype))
    return view_jacobians(x, weight, eps, view, centered=False)
