"""Rows of ``minigrad-norm check`` for the normalization layers: every norm and option.

Each row gradchecks the norm with respect to its input and, where it has
them, its weight and bias (against central differences), and compares the
reverse-mode Jacobian with respect to the input with the closed-form one
(``minigrad_norm.jacobians``, assembled block by block into the full matrix).
Weights and biases are random rather than PyTorch's 1 and 0, so that their
gradients are checked at a generic point.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from minigrad_norm import jacobians
from minigrad_norm.check import CheckCase, Inputs
from minigrad_norm.nn.norm import BatchNorm1d, BatchNorm2d
from minigrad_norm.norms import batch_norm, group_norm, instance_norm, layer_norm, rms_norm
from minigrad_norm.norms._jacobian import full_jacobian
from minigrad_norm.tensor import Tensor


def _t(rng: np.random.Generator, *shape: int) -> Tensor:
    return Tensor(rng.standard_normal(shape), requires_grad=True)


def _inputs(x_shape: tuple[int, ...], *affine_shapes: tuple[int, ...]) -> Callable[[np.random.Generator], Inputs]:
    return lambda rng: (_t(rng, *x_shape), *(_t(rng, *s) for s in affine_shapes))


def _channel_view(x: Tensor, groups: int | None = None) -> tuple[int, int, int, int]:
    n, c = x.shape[:2]
    g = c if groups is None else groups
    return n, g, c // g, x.size // (n * c)


def _rows(x: Tensor, d: int) -> tuple[int, int, int, int]:
    return x.size // d, 1, d, 1


# fixed data the rows share: running statistics for eval mode, masks with >= 2 valid values per statistic
_RUNNING_MEAN = np.array([0.3, -0.2, 0.1])
_RUNNING_VAR = np.array([0.8, 1.5, 1.1])
_MASK_BN = np.array([[True, True, False, True], [True, False, False, False], [True, True, True, False]])
_MASK_IN = np.array([[True, True, False, True, False], [True, False, True, True, True]])
_BN1D = BatchNorm1d(3, momentum=None, dtype=np.float64)  # training mode: its buffers do not change y
_BN2D_EVAL = BatchNorm2d(3, dtype=np.float64).eval()
_BN2D_EVAL.running_mean[...], _BN2D_EVAL.running_var[...] = _RUNNING_MEAN, _RUNNING_VAR


def _bn_train(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return batch_norm(x, np.zeros(3), np.ones(3), w, b, training=True)


NORM_CASES: list[CheckCase] = [
    CheckCase(
        "layer_norm (affine)",
        _inputs((3, 5), (5,), (5,)),
        lambda x, w, b: layer_norm(x, 5, w, b),
        lambda x, w, b: full_jacobian(jacobians.layer_norm(x, 5, w), _rows(x, 5), False),
    ),
    CheckCase(
        "layer_norm (2 dims, weight, no bias)",
        _inputs((2, 3, 2), (3, 2)),
        lambda x, w: layer_norm(x, (3, 2), w),
        lambda x, w: full_jacobian(jacobians.layer_norm(x, (3, 2), w), _rows(x, 6), False),
    ),
    CheckCase(
        "layer_norm (no affine)",
        _inputs((2, 2, 4)),
        lambda x: layer_norm(x, 4),
        lambda x: full_jacobian(jacobians.layer_norm(x, 4), _rows(x, 4), False),
    ),
    CheckCase(
        "layer_norm (bias only, eps 0.1)",
        _inputs((3, 4), (4,)),
        lambda x, b: layer_norm(x, 4, None, b, eps=0.1),
        lambda x, b: full_jacobian(jacobians.layer_norm(x, 4, eps=0.1), _rows(x, 4), False),
    ),
    CheckCase(
        "rms_norm (weight)",
        _inputs((3, 5), (5,)),
        lambda x, w: rms_norm(x, 5, w),
        lambda x, w: full_jacobian(jacobians.rms_norm(x, 5, w), _rows(x, 5), False),
    ),
    CheckCase(
        "rms_norm (2 dims, no affine, eps 1e-3)",
        _inputs((2, 2, 3)),
        lambda x: rms_norm(x, (2, 3), eps=1e-3),
        lambda x: full_jacobian(jacobians.rms_norm(x, (2, 3), eps=1e-3), _rows(x, 6), False),
    ),
    CheckCase(
        "batch_norm (train, affine, running)",
        _inputs((4, 3, 2), (3,), (3,)),
        _bn_train,
        lambda x, w, b: full_jacobian(jacobians.batch_norm(x, w), _channel_view(x), True),
    ),
    CheckCase(
        "batch_norm (train, 2-D, no affine)",
        _inputs((5, 3)),
        lambda x: batch_norm(x, None, None, training=True),
        lambda x: full_jacobian(jacobians.batch_norm(x), _channel_view(x), True),
    ),
    CheckCase(
        "batch_norm (eval, affine)",
        _inputs((2, 3, 3), (3,), (3,)),
        lambda x, w, b: batch_norm(x, _RUNNING_MEAN, _RUNNING_VAR, w, b),
        lambda x, w, b: full_jacobian(
            jacobians.batch_norm(x, w, training=False, running_mean=_RUNNING_MEAN, running_var=_RUNNING_VAR),
            _channel_view(x),
            True,
        ),
    ),
    CheckCase(
        "batch_norm (train, masked, affine)",
        _inputs((3, 3, 4), (3,), (3,)),
        lambda x, w, b: batch_norm(x, None, None, w, b, training=True, mask=_MASK_BN),
        lambda x, w, b: full_jacobian(jacobians.batch_norm(x, w, mask=_MASK_BN), _channel_view(x), True),
    ),
    CheckCase(
        "BatchNorm1d (train, momentum=None)",
        _inputs((4, 3, 2)),
        _BN1D,
        lambda x: full_jacobian(jacobians.batch_norm(x, _BN1D.weight), _channel_view(x), True),
    ),
    CheckCase(
        "BatchNorm2d (eval)",
        _inputs((2, 3, 2, 2)),
        _BN2D_EVAL,
        lambda x: full_jacobian(
            jacobians.batch_norm(x, training=False, running_mean=_RUNNING_MEAN, running_var=_RUNNING_VAR),
            _channel_view(x),
            True,
        ),
    ),
    CheckCase(
        "instance_norm (affine)",
        _inputs((2, 3, 4), (3,), (3,)),
        lambda x, w, b: instance_norm(x, weight=w, bias=b),
        lambda x, w, b: full_jacobian(jacobians.instance_norm(x, w), _channel_view(x), False),
    ),
    CheckCase(
        "instance_norm (masked)",
        _inputs((2, 2, 5)),
        lambda x: instance_norm(x, mask=_MASK_IN),
        lambda x: full_jacobian(jacobians.instance_norm(x, mask=_MASK_IN), _channel_view(x), False),
    ),
    CheckCase(
        "instance_norm (no input stats, running)",
        _inputs((2, 3, 2, 2), (3,)),
        lambda x, w: instance_norm(x, _RUNNING_MEAN, _RUNNING_VAR, w, use_input_stats=False),
        lambda x, w: full_jacobian(
            jacobians.instance_norm(x, w, use_input_stats=False, running_mean=_RUNNING_MEAN, running_var=_RUNNING_VAR),
            _channel_view(x),
            False,
        ),
    ),
    CheckCase(
        "group_norm (affine, 2 groups)",
        _inputs((2, 4, 3), (4,), (4,)),
        lambda x, w, b: group_norm(x, 2, w, b),
        lambda x, w, b: full_jacobian(jacobians.group_norm(x, 2, w), _channel_view(x, 2), False),
    ),
    CheckCase(
        "group_norm (1 group, 4-D, no affine)",
        _inputs((2, 2, 2, 2)),
        lambda x: group_norm(x, 1),
        lambda x: full_jacobian(jacobians.group_norm(x, 1), _channel_view(x, 1), False),
    ),
]
