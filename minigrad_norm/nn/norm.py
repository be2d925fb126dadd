"""Normalization modules: parameters ``weight``/``bias`` and running buffers, as in PyTorch.

The math lives in ``minigrad_norm.norms``; these classes hold the state
(affine parameters, ``running_mean``, ``running_var``, ``num_batches_tracked``)
and pick training or evaluation behaviour, following ``torch.nn`` line by line:

* BatchNorm in training updates the running buffers (when it tracks them)
  and counts batches; ``momentum=None`` then means the cumulative average
  ``momentum = 1 / num_batches_tracked``. In eval mode it normalizes with the
  running buffers, or with the batch statistics when it tracks none.
* InstanceNorm uses the input statistics unless it tracks running stats and
  is in eval mode; like PyTorch it does not count batches, and
  ``momentum=None`` there means momentum 0 (the buffers stay as they are).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from minigrad_norm.nn.module import Module, Parameter, factory_dtype
from minigrad_norm.norms import batch_norm, group_norm, instance_norm, layer_norm, rms_norm
from minigrad_norm.norms._args import (
    array_of,
    check_eps,
    check_flag,
    check_int,
    check_momentum,
    check_normalized_shape,
    check_writeable,
)
from minigrad_norm.tensor import Tensor, increment_version


def _param(value: float, shape: tuple[int, ...], dtype: Any) -> Parameter:
    return Parameter(np.full(shape, value, dtype=dtype))


class LayerNorm(Module):
    """``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the trailing ``normalized_shape`` dims."""

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        dtype = factory_dtype("LayerNorm", device, dtype)
        self.normalized_shape = check_normalized_shape("LayerNorm", normalized_shape)
        self.eps = check_eps("LayerNorm", eps)
        self.elementwise_affine = check_flag("LayerNorm", "elementwise_affine", elementwise_affine)
        bias = check_flag("LayerNorm", "bias", bias)
        self.weight = _param(1.0, self.normalized_shape, dtype) if self.elementwise_affine else None
        self.bias = _param(0.0, self.normalized_shape, dtype) if self.elementwise_affine and bias else None

    def forward(self, x: Any) -> Tensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
            f"bias={self.bias is not None}"
        )


class RMSNorm(Module):
    """``y = x / sqrt(mean(x^2) + eps) * weight``; ``eps=None`` means the input dtype's machine epsilon."""

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        dtype = factory_dtype("RMSNorm", device, dtype)
        self.normalized_shape = check_normalized_shape("RMSNorm", normalized_shape)
        self.eps = None if eps is None else check_eps("RMSNorm", eps)
        self.elementwise_affine = check_flag("RMSNorm", "elementwise_affine", elementwise_affine)
        self.weight = _param(1.0, self.normalized_shape, dtype) if self.elementwise_affine else None

    def forward(self, x: Any) -> Tensor:
        return rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class _NormBase(Module):
    """The state shared by BatchNorm and InstanceNorm: affine parameters and running buffers.

    ``bias=False`` (keyword-only, as in PyTorch) keeps the weight and drops the bias; it means nothing
    without ``affine``.
    """

    name = "_NormBase"
    dims: tuple[int, ...] = ()  # the input ranks accepted

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: Any = None,
        dtype: Any = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__()
        op = self.name
        dtype = factory_dtype(op, device, dtype)
        self.num_features = check_int(op, "num_features", num_features, minimum=0)
        self.eps = check_eps(op, eps)
        self.momentum = check_momentum(op, momentum)
        self.affine = check_flag(op, "affine", affine)
        self.track_running_stats = check_flag(op, "track_running_stats", track_running_stats)
        bias = check_flag(op, "bias", bias)
        self.weight = _param(1.0, (self.num_features,), dtype) if self.affine else None
        self.bias = _param(0.0, (self.num_features,), dtype) if self.affine and bias else None
        tracked = self.track_running_stats
        self.register_buffer("running_mean", np.zeros(self.num_features, dtype=dtype) if tracked else None)
        self.register_buffer("running_var", np.ones(self.num_features, dtype=dtype) if tracked else None)
        self.register_buffer("num_batches_tracked", np.array(0, dtype=np.int64) if tracked else None)

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            self.running_mean[...] = 0
            self.running_var[...] = 1
            self.num_batches_tracked[...] = 0
            increment_version([self.running_mean, self.running_var, self.num_batches_tracked])

    def _input(self, x: Any) -> Tensor:
        """``x`` as a Tensor of one of the accepted ranks (as PyTorch's ``_check_input_dim``)."""
        x = x if isinstance(x, Tensor) else Tensor(x)
        if x.ndim not in self.dims:
            dims = " or ".join(f"{d}D" for d in self.dims)
            raise ValueError(f"{self.name}: expected {dims} input (got {x.ndim}D input of shape {x.shape})")
        return x

    def _optional_state(self) -> tuple[str, ...]:
        # as PyTorch with a state dict without version metadata (ours have none): a missing counter is
        # no error, and the module keeps its own count
        return ("num_batches_tracked",) if self.track_running_stats else ()

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}"
        )


class _BatchNorm(_NormBase):
    def forward(self, x: Any, mask: np.ndarray | None = None) -> Tensor:
        """``mask`` (N, *spatial) bool: statistics over the valid positions only (see ``batch_norm``)."""
        x = self._input(x)
        counting = self.training and self.track_running_stats
        momentum = self.momentum
        if counting:
            check_writeable(self.name, "num_batches_tracked", self.num_batches_tracked)
        if counting and momentum is None:  # cumulative average over the batches seen, this one included
            momentum = 1.0 / float(self.num_batches_tracked + 1)
        # eval mode normalizes with the running buffers, unless there are none
        use_batch_stats = self.training or self.running_mean is None
        keep = not self.training or self.track_running_stats
        y = batch_norm(
            x,
            self.running_mean if keep else None,
            self.running_var if keep else None,
            self.weight,
            self.bias,
            use_batch_stats,
            0.0 if momentum is None else momentum,
            self.eps,
            mask=mask,
        )
        if counting:  # counted after a successful forward, so a refused batch leaves the state alone
            self.num_batches_tracked[...] += 1
        return y


class BatchNorm1d(_BatchNorm):
    """BatchNorm over (N, C) or (N, C, L): statistics per channel over N (and L)."""

    name = "BatchNorm1d"
    dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """BatchNorm over (N, C, H, W): statistics per channel over N, H and W."""

    name = "BatchNorm2d"
    dims = (4,)


class BatchNorm3d(_BatchNorm):
    """BatchNorm over (N, C, D, H, W): statistics per channel over N, D, H and W."""

    name = "BatchNorm3d"
    dims = (5,)


class _InstanceNorm(_NormBase):
    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = False,
        track_running_stats: bool = False,
        device: Any = None,
        dtype: Any = None,
        *,
        bias: bool = True,
    ) -> None:
        # PyTorch's InstanceNorm defaults differ from BatchNorm's: no affine, no running statistics
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias)

    def forward(self, x: Any, mask: np.ndarray | None = None) -> Tensor:
        """An unbatched input (C, *) is normalized as a batch of one, as PyTorch does."""
        x = self._input(x)
        unbatched = x.ndim == self.dims[0]
        channels = x.shape[0] if unbatched else x.shape[1]
        if channels != self.num_features:
            message = (
                f"{self.name}: expected input's size at dim {0 if unbatched else 1} to match num_features "
                f"({self.num_features}), but got input of shape {x.shape}"
            )
            if self.affine or self.track_running_stats:
                raise ValueError(message)
            warnings.warn(message + "; num_features is not used because affine=False", stacklevel=2)
        if unbatched:
            x = x.reshape((1, *x.shape))
            mask = None if mask is None else array_of(mask)[None]
        y = instance_norm(
            x,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            self.training or not self.track_running_stats,
            0.0 if self.momentum is None else self.momentum,
            self.eps,
            mask=mask,
        )
        return y.reshape(y.shape[1:]) if unbatched else y


class InstanceNorm1d(_InstanceNorm):
    """InstanceNorm over (N, C, L) or unbatched (C, L): statistics per (sample, channel) over L."""

    name = "InstanceNorm1d"
    dims = (2, 3)


class InstanceNorm2d(_InstanceNorm):
    """InstanceNorm over (N, C, H, W) or unbatched (C, H, W): statistics per (sample, channel) over H, W."""

    name = "InstanceNorm2d"
    dims = (3, 4)


class InstanceNorm3d(_InstanceNorm):
    """InstanceNorm over (N, C, D, H, W) or unbatched (C, D, H, W): statistics per (sample, channel) over
    D, H, W."""

    name = "InstanceNorm3d"
    dims = (4, 5)


class GroupNorm(Module):
    """GroupNorm: C channels in ``num_groups`` groups, statistics per (sample, group); affine per channel."""

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        device: Any = None,
        dtype: Any = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__()
        dtype = factory_dtype("GroupNorm", device, dtype)
        # refused here, where PyTorch's constructor takes GroupNorm(2.0, 6) and its forward refuses it
        self.num_groups = check_int("GroupNorm", "num_groups", num_groups)
        self.num_channels = check_int("GroupNorm", "num_channels", num_channels, minimum=0)
        if self.num_groups <= 0 or self.num_channels % self.num_groups:
            raise ValueError(
                f"GroupNorm: num_channels={num_channels} must be divisible by num_groups={num_groups} (> 0)"
            )
        self.eps = check_eps("GroupNorm", eps)
        self.affine = check_flag("GroupNorm", "affine", affine)
        bias = check_flag("GroupNorm", "bias", bias)
        self.weight = _param(1.0, (self.num_channels,), dtype) if self.affine else None
        self.bias = _param(0.0, (self.num_channels,), dtype) if self.affine and bias else None

    def forward(self, x: Any) -> Tensor:
        return group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        bias = self.bias is not None
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, bias={bias}"
