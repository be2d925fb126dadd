"""BatchNorm: normalize each channel over the batch and the spatial dims.

Forward, training mode, for x of shape (N, C, *) with S = prod(spatial); for
each channel c the group is the m = N * S values x[:, c, ...]:

    mu_c   = 1/m * sum_{n,s} x[n, c, s]
    var_c  = 1/m * sum_{n,s} (x[n, c, s] - mu_c)^2        (biased: used to normalize)
    rstd_c = 1 / sqrt(var_c + eps)
    xhat   = (x - mu_c) * rstd_c
    y      = xhat * gamma_c + beta_c
    running_mean = (1 - momentum) * running_mean + momentum * mu_c
    running_var  = (1 - momentum) * running_var + momentum * var_c * m / (m - 1)   (unbiased)

Evaluation mode: mu_c, var_c are the running buffers, constants
(rstd_c = 1 / sqrt(running_var_c + eps), xhat = (x - running_mean_c) * rstd_c).

Saved: x, mu, rstd (one per channel) and gamma.

Backward, training mode: LayerNorm's formula with the group taken across the
batch, i.e. the means are over (n, s) for each channel (view (N, C, 1, S),
``reduce_batch``; code path: ``batch_norm`` -> ``channel_args`` (``_args.py``, the
checks and the view) -> ``channel_norm`` (``_channel.py``, train or eval) ->
``Normalize`` (``_node.py``, which updates the running buffers through
``RunningStats``) -> ``norm_forward``/``norm_backward`` of ``kernels/reference.py``,
with ``fixed_stats`` in evaluation mode):

    dL/dx     = rstd_c * (dxhat - mean_{n,s}(dxhat) - xhat * mean_{n,s}(dxhat * xhat)),  dxhat = g * gamma_c
    dL/dgamma = sum over (n, s) of g * xhat,    dL/dbeta = sum over (n, s) of g

So every sample's gradient depends on every other sample of the batch.

Backward, evaluation mode: the statistics do not depend on x, so the
normalization is an elementwise affine map and

    dL/dx = g * gamma_c * rstd_c.

Masked (``mask`` of shape (N, *spatial)): m becomes the number of valid
positions, every mean above runs over valid positions only, masked-out
outputs are 0 and get 0 gradient; running_var uses m_valid / (m_valid - 1).

Closed-form Jacobian of one channel (``batch_norm_jacobian``), over its m values:

    training:  J = gamma_c * rstd_c * (I - 1/m * 1 1^T - 1/m * xhat xhat^T)
    eval:      J = gamma_c * rstd_c * I
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minigrad_norm.norms._channel import channel_norm
from minigrad_norm.norms._jacobian import channel_jacobians
from minigrad_norm.tensor import Tensor


def batch_norm(
    input: Any,  # noqa: A002  (PyTorch's name, for callers passing it by keyword)
    running_mean: np.ndarray | None,
    running_var: np.ndarray | None,
    weight: Tensor | np.ndarray | None = None,
    bias: Tensor | np.ndarray | None = None,
    training: bool = False,
    momentum: float | None = 0.1,
    eps: float = 1e-5,
    mask: np.ndarray | None = None,
) -> Tensor:
    """BatchNorm of an (N, C, *) input (PyTorch's ``F.batch_norm``, plus ``mask``).

    In training the batch statistics normalize x and, when given, the running
    buffers (float ndarrays of shape (C,), both or neither, as in PyTorch) are
    updated in place with the unbiased variance; an empty batch (N = 0) leaves
    them as they are. In evaluation (``training=False``) the running buffers
    normalize x and are required. ``momentum=None`` needs the module's batch
    counter (``nn.BatchNorm1d``) and is refused here.
    """
    return channel_norm(
        input, running_mean, running_var, weight, bias, training, momentum, eps, mask, reduce_batch=True
    )


def batch_norm_jacobian(
    x: Any,
    weight: Any = None,
    eps: float = 1e-5,
    training: bool = True,
    running_mean: np.ndarray | None = None,
    running_var: np.ndarray | None = None,
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """The closed-form Jacobian of each channel of ``batch_norm`` across the batch: shape (C, m, m).

    m = N * S; a channel's values are ordered (n, s) in C order. Training:
    gamma_c * rstd_c * (I - 1/m 1 1^T - 1/m xhat xhat^T); evaluation (running
    statistics as constants): gamma_c * rstd_c * I. Masked-out rows and
    columns are 0 and m counts the valid positions.

    ``training`` defaults to True here, where ``batch_norm``'s default is
    False (PyTorch's): the batch statistics' Jacobian is the one worth a
    closed form, and evaluation mode needs ``running_mean``/``running_var``.
    """
    return channel_jacobians(
        "batch_norm_jacobian",
        x,
        weight,
        eps,
        reduce_batch=True,
        mask=mask,
        input_stats=training,
        running_mean=running_mean,
        running_var=running_var,
    )
