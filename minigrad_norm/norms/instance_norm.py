"""InstanceNorm: normalize each (sample, channel) over its spatial positions.

Forward, for x of shape (N, C, *) with S = prod(spatial); the group of
(n, c) is its S values x[n, c, ...]:

    mu_nc   = 1/S * sum_s x[n, c, s],   var_nc = 1/S * sum_s (x[n, c, s] - mu_nc)^2
    rstd_nc = 1 / sqrt(var_nc + eps)
    xhat    = (x - mu_nc) * rstd_nc
    y       = xhat * gamma_c + beta_c

With running buffers (``track_running_stats``), training updates them with
the batch average of the per-instance statistics (as PyTorch):

    running_mean = (1 - momentum) * running_mean + momentum * mean_n(mu_nc)
    running_var  = (1 - momentum) * running_var + momentum * mean_n(var_nc * S / (S - 1))

and ``use_input_stats=False`` normalizes with the running buffers instead,
constants, as eval-mode BatchNorm does:

    rstd_c = 1 / sqrt(running_var_c + eps),   xhat = (x - running_mean_c) * rstd_c
    dL/dx  = g * gamma_c * rstd_c

(then the view is BatchNorm's, statistics per channel: ``reduce_batch`` with
the running buffers as fixed statistics.)

Saved: x, mu, rstd (one per (n, c); per channel c with ``use_input_stats=False``)
and gamma.

Backward: LayerNorm's formula with the group being one channel of one sample,
the view (N, C, 1, S) with per-sample statistics, dxhat = g * gamma_c
(code path: ``instance_norm`` -> ``channel_args`` (``_args.py``, the checks and the
view) -> ``channel_norm`` (``_channel.py``, the running buffers and the choice of
statistics) -> ``Normalize`` (``_node.py``) -> ``norm_forward``/``norm_backward`` of
``kernels/reference.py``):

    dL/dx     = rstd_nc * (dxhat - mean_s(dxhat) - xhat * mean_s(dxhat * xhat))
    dL/dgamma = sum over (n, s) of g * xhat,    dL/dbeta = sum over (n, s) of g

Unlike LayerNorm, gamma is per channel, so its gradient sums over the batch
*and* the positions of a group; unlike BatchNorm, the means in dL/dx run over
one sample only. Masked: S becomes the number of valid positions of the
sample, and masked-out positions give 0 and get 0 gradient.

Closed-form Jacobian of one (n, c) (``instance_norm_jacobian``):

    J = gamma_c * rstd_nc * (I - 1/S * 1 1^T - 1/S * xhat xhat^T)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minigrad_norm.norms._channel import channel_norm
from minigrad_norm.norms._jacobian import channel_jacobians
from minigrad_norm.tensor import Tensor


def instance_norm(
    input: Any,  # noqa: A002  (PyTorch's name, for callers passing it by keyword)
    running_mean: np.ndarray | None = None,
    running_var: np.ndarray | None = None,
    weight: Tensor | np.ndarray | None = None,
    bias: Tensor | np.ndarray | None = None,
    use_input_stats: bool = True,
    momentum: float | None = 0.1,
    eps: float = 1e-5,
    mask: np.ndarray | None = None,
) -> Tensor:
    """InstanceNorm of an (N, C, *) input (PyTorch's ``F.instance_norm``, plus ``mask``).

    With ``use_input_stats`` each (n, c) needs more than one spatial element
    (with one, the output would be ``bias`` whatever the input): ValueError.
    The running buffers are both given or both None, as in PyTorch.
    """
    return channel_norm(
        input, running_mean, running_var, weight, bias, use_input_stats, momentum, eps, mask, reduce_batch=False
    )


def instance_norm_jacobian(
    x: Any,
    weight: Any = None,
    eps: float = 1e-5,
    mask: np.ndarray | None = None,
    use_input_stats: bool = True,
    running_mean: np.ndarray | None = None,
    running_var: np.ndarray | None = None,
) -> np.ndarray:
    """The closed-form Jacobian of each (n, c) of ``instance_norm``: shape (N * C, S, S).

    gamma_c * rstd_nc * (I - 1/S 1 1^T - 1/S xhat xhat^T); with running
    statistics as constants (``use_input_stats=False``) gamma_c * rstd_c * I,
    rstd_c = 1 / sqrt(running_var_c + eps). (rstd_nc and xhat as in the module docstring.)
    """
    return channel_jacobians(
        "instance_norm_jacobian",
        x,
        weight,
        eps,
        reduce_batch=False,
        mask=mask,
        input_stats=use_input_stats,
        running_mean=running_mean,
        running_var=running_var,
    )
