"""GroupNorm: split the C channels into G groups and normalize each (sample, group).

Forward, for x of shape (N, C, *) with S = prod(spatial) and K = C / G
channels per group; the group (n, j) is its m = K * S values:

    mu_nj   = mean of x[n, jK:(j+1)K, ...],   var_nj = mean of (x - mu_nj)^2 over the same values
    rstd_nj = 1 / sqrt(var_nj + eps)
    xhat    = (x - mu_nj) * rstd_nj
    y       = xhat * gamma_c + beta_c          (gamma, beta per channel c, c in group j)

Saved: x, mu, rstd (one per (n, j)) and gamma.

Backward: LayerNorm's formula over the m = K * S values of a group (view
(N, G, K, S), per-sample statistics; code path: ``group_norm`` -> ``channel_args`` and
``group_view`` (``_args.py``, the checks and the view) -> ``Normalize``
(``_node.py``) -> ``norm_forward``/``norm_backward`` of ``kernels/reference.py``),
with g = dL/dy and dxhat = g * gamma_c:

    dL/dx     = rstd_nj * (dxhat - mean_{k,s}(dxhat) - xhat * mean_{k,s}(dxhat * xhat))
    dL/dgamma = sum over (n, s) of g * xhat,    dL/dbeta = sum over (n, s) of g

GroupNorm spans the two neighbours: G = C is InstanceNorm, G = 1 is
LayerNorm over (C, *) with a per-channel instead of a per-element affine.

Closed-form Jacobian of one (n, j) (``group_norm_jacobian``):

    J = diag(gamma) * rstd_nj * (I - 1/m * 1 1^T - 1/m * xhat xhat^T)

(diag(gamma) is m x m: each value's channel weight, repeated over its positions.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minigrad_norm.norms._args import channel_args, check_count, check_int
from minigrad_norm.norms._jacobian import view_jacobians
from minigrad_norm.norms._node import Normalize, View
from minigrad_norm.tensor import Tensor


def group_view(op: str, shape: tuple[int, ...], channel_view: View, num_groups: int) -> View:
    """(N, G, C/G, S) from ``channel_args``' view (N, C, 1, S) of an input of ``shape``; ``num_groups`` must
    be an int (``check_int``) that divides C.

    As in PyTorch (its ``_verify_batch_size``), only N * C/G * S = 1 is refused: a single sample whose groups
    are single values. Groups of one value are accepted when N > 1, and their output is the bias.
    """
    n, c, _, s = channel_view
    num_groups = check_int(op, "num_groups", num_groups)
    if num_groups <= 0 or c % num_groups:
        raise ValueError(
            f"{op}: num_groups={num_groups} must be positive and divide the number of channels C={c} "
            f"(input of shape {shape})"
        )
    view = n, num_groups, c // num_groups, s
    check_count(op, np.array([view[0] * view[2] * view[3]]), "value per channel", shape, False)
    return view


def group_norm(
    input: Any,  # noqa: A002  (PyTorch's name, for callers passing it by keyword)
    num_groups: int,
    weight: Tensor | np.ndarray | None = None,
    bias: Tensor | np.ndarray | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """GroupNorm of an (N, C, *) input (PyTorch's ``F.group_norm``); weight and bias have shape (C,)."""
    x, weight, bias, eps, channel_view = channel_args("group_norm", input, weight, bias, eps)
    view = group_view("group_norm", x.shape, channel_view, num_groups)
    return Normalize.apply(x, weight, bias, view=view, eps=eps)


def group_norm_jacobian(x: Any, num_groups: int, weight: Any = None, eps: float = 1e-5) -> np.ndarray:
    """The closed-form Jacobian of each (n, j) of ``group_norm``: shape (N * G, m, m), m = (C / G) * S.

    Elements of a group are ordered (channel, position) in C order. The arguments are checked as
    ``group_norm`` checks them, with the same errors.
    """
    op = "group_norm_jacobian"
    x, weight, _, eps, channel_view = channel_args(op, x, weight, None, eps)
    view = group_view(op, x.shape, channel_view, num_groups)
    return view_jacobians(x, weight, eps, view)
