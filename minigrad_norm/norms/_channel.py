"""BatchNorm's and InstanceNorm's shared body, ``channel_norm``: the checks of an ``(N, C, *)`` call with
running buffers (``channel_call_args``, which ``channel_jacobians`` runs too), then one ``Normalize.apply`` on
the view (N, C, 1, S)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from minigrad_norm.norms._args import (
    channel_args,
    check_count,
    check_flag,
    check_mask,
    check_momentum,
    check_writeable,
)
from minigrad_norm.norms._node import Normalize, RunningStats, View, group_count
from minigrad_norm.tensor import Tensor


def check_running(op: str, name: str, value: Any, c: int) -> np.ndarray | None:
    """A running buffer: None or a float ndarray of shape (C,) (updated in place, so not a copy)."""
    if value is None:
        return None
    if isinstance(value, Tensor):
        value = value.data
    if not isinstance(value, np.ndarray) or value.dtype.kind != "f":
        raise TypeError(f"{op}: {name} must be a float ndarray of shape ({c},), got {type(value).__name__}")
    if value.shape != (c,):
        raise ValueError(f"{op}: {name} must have shape ({c},) (one per channel), got {value.shape}")
    return value


def check_buffer_pair(op: str, mean: np.ndarray | None, var: np.ndarray | None) -> None:
    """Both running buffers or neither (PyTorch's ValueError): one alone would be updated in training
    while its partner goes stale, and cannot normalize in evaluation."""
    if (mean is None) != (var is None):
        given = "running_mean" if var is None else "running_var"
        raise ValueError(
            f"{op}: running_mean and running_var must either both be None or neither be None, got only {given}"
        )


def running_stats(
    op: str, mean: np.ndarray | None, var: np.ndarray | None, momentum: float | None
) -> RunningStats | None:
    """The buffers a training-mode forward updates, or None when there are none; ``momentum`` as
    ``check_momentum`` returns it."""
    if mean is None or var is None:  # (both, after check_buffer_pair)
        return None
    check_writeable(op, "running_mean", mean)
    check_writeable(op, "running_var", var)
    if momentum is None:
        raise TypeError(
            f"{op}: momentum=None (a cumulative average) needs the batch counter of a module; the functional "
            "form takes a number (the module passes 1 / num_batches_tracked)"
        )
    return RunningStats(mean, var, momentum)


def given_stats(op: str, mean: np.ndarray | None, var: np.ndarray | None, flag: str) -> tuple[np.ndarray, np.ndarray]:
    """Statistics used as constants: both buffers must be there."""
    if mean is None or var is None:
        raise ValueError(f"{op}: running_mean and running_var are required when {flag} (they normalize the input)")
    return mean, var


class ChannelArgs(NamedTuple):
    """A BatchNorm/InstanceNorm call's arguments after ``channel_args``' checks and those below."""

    x: Tensor
    weight: Any
    bias: Any
    eps: float
    view: View
    mask: np.ndarray | None
    stats: tuple[np.ndarray, np.ndarray] | None  # the running buffers, when they are the statistics
    running_mean: np.ndarray | None
    running_var: np.ndarray | None


def channel_call_args(
    op: str,
    x: Any,
    running_mean: Any,
    running_var: Any,
    weight: Any,
    bias: Any,
    input_stats: Any,
    eps: Any,
    mask: Any,
    *,
    reduce_batch: bool,
) -> ChannelArgs:
    """The checks shared by ``channel_norm`` and ``channel_jacobians``, so that both refuse the same calls.

    With ``input_stats`` each statistic must average more than one value; without, the running buffers
    must be given, and are the statistics.
    """
    what, flag = ("value per channel", "training") if reduce_batch else ("spatial element", "use_input_stats")
    input_stats = check_flag(op, flag, input_stats)
    x, weight, bias, eps, view = channel_args(op, x, weight, bias, eps)
    running_mean = check_running(op, "running_mean", running_mean, view[1])
    running_var = check_running(op, "running_var", running_var, view[1])
    check_buffer_pair(op, running_mean, running_var)
    mask = check_mask(op, mask, x.shape)
    stats = None
    if input_stats:
        check_count(op, group_count(view, reduce_batch, mask), what, x.shape, mask is not None)
    else:
        stats = given_stats(op, running_mean, running_var, f"{flag}=False")
    return ChannelArgs(x, weight, bias, eps, view, mask, stats, running_mean, running_var)


def channel_norm(
    x: Any,
    running_mean: np.ndarray | None,
    running_var: np.ndarray | None,
    weight: Any,
    bias: Any,
    input_stats: bool,
    momentum: float | None,
    eps: float,
    mask: Any,
    *,
    reduce_batch: bool,
) -> Tensor:
    """BatchNorm (``reduce_batch``) and InstanceNorm on the view (N, C, 1, S).

    With ``input_stats`` (BatchNorm's ``training``, InstanceNorm's
    ``use_input_stats``) the statistics come from x, per channel or per
    (n, c), each must average more than one value, and the running buffers,
    if any, are updated; otherwise the running buffers are the statistics.
    """
    op = "batch_norm" if reduce_batch else "instance_norm"
    momentum = check_momentum(op, momentum)
    a = channel_call_args(
        op, x, running_mean, running_var, weight, bias, input_stats, eps, mask, reduce_batch=reduce_batch
    )
    if a.stats is not None:
        # given statistics are the running buffers, per channel (C,), InstanceNorm's too; held constant they
        # average over no group, so its per-(n, c) groups change nothing and they go in as BatchNorm's do
        return Normalize.apply(
            a.x, a.weight, a.bias, view=a.view, eps=a.eps, reduce_batch=True, mask=a.mask, stats=a.stats
        )
    running = running_stats(op, a.running_mean, a.running_var, momentum)
    return Normalize.apply(
        a.x, a.weight, a.bias, view=a.view, eps=a.eps, reduce_batch=reduce_batch, mask=a.mask, running=running
    )
