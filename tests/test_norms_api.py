"""The norms' API: bad input, modules and their buffers, masked statistics against NumPy.

Expected values are computed here with plain NumPy on the valid positions
(np.var with ddof), independently of the package's kernels.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minigrad_norm.functional as F
from minigrad_norm import nn
from minigrad_norm.norms import _node, batch_norm, group_norm, instance_norm, layer_norm, rms_norm
from minigrad_norm.tensor import Tensor
from minigrad_norm.testing import channel_shapes, masks

X = np.zeros((2, 3, 4))


# -- bad input -------------------------------------------------------------------------------------------
BAD = [
    (lambda: layer_norm(X, 4, eps=-1e-5), ValueError, ["layer_norm", "eps", "-1e-05"]),
    (lambda: batch_norm(X, None, None, training=True, eps=0.0), ValueError, ["batch_norm", "eps", "> 0"]),
    (lambda: instance_norm(X, eps=0), ValueError, ["instance_norm", "eps"]),
    (lambda: group_norm(X, 3, eps=-1.0), ValueError, ["group_norm", "eps"]),
    (lambda: rms_norm(X, 4, eps=float("nan")), ValueError, ["rms_norm", "eps"]),
    (lambda: layer_norm(X, 4, eps="1e-5"), TypeError, ["layer_norm", "eps must be a real number", "'1e-5'"]),
    (lambda: nn.GroupNorm(1, 3, eps=b"1e-5"), TypeError, ["GroupNorm", "eps must be a real number"]),
    (lambda: layer_norm(X, (3,)), ValueError, ["layer_norm", "normalized_shape=(3,)", "(2, 3, 4)"]),
    (lambda: layer_norm(X, (2, 4)), ValueError, ["layer_norm", "normalized_shape=(2, 4)", "(2, 3, 4)"]),
    (lambda: rms_norm(X, 5), ValueError, ["rms_norm", "normalized_shape=(5,)", "(2, 3, 4)"]),
    (lambda: layer_norm(X, 4, np.ones(3)), ValueError, ["layer_norm", "weight", "(4,)", "(3,)", "(2, 3, 4)"]),
    (lambda: layer_norm(X, 4, None, np.ones((1, 4))), ValueError, ["layer_norm", "bias", "(4,)", "(1, 4)"]),
    # (the numba backend read the text as numbers, NumPy's multiply refused it without naming the op)
    (lambda: layer_norm(X, 4, np.array(["2"] * 4)), TypeError, ["layer_norm", "weight", "floating-point", "<U1"]),
    (lambda: group_norm(X, 3, None, np.ones(3, int)), TypeError, ["group_norm", "bias", "floating-point", "int64"]),
    (
        lambda: batch_norm(X, None, None, np.ones(4), training=True),
        ValueError,
        ["batch_norm", "weight", "(3,)", "(4,)"],
    ),
    (lambda: group_norm(X, 2, None, np.ones(2)), ValueError, ["group_norm", "bias", "(3,)", "(2,)"]),
    (lambda: group_norm(X, 2), ValueError, ["group_norm", "num_groups=2", "C=3", "(2, 3, 4)"]),
    (lambda: group_norm(X, 0), ValueError, ["group_norm", "num_groups=0"]),
    (lambda: batch_norm(np.zeros(5), None, None, training=True), ValueError, ["batch_norm", "(5,)", "2 dims"]),
    (lambda: instance_norm(np.zeros(5)), ValueError, ["instance_norm", "(5,)"]),
    (lambda: layer_norm(np.zeros((2, 4), dtype=np.int64), 4), TypeError, ["layer_norm", "int64", "(2, 4)"]),
    (lambda: batch_norm(np.zeros((2, 3), dtype=np.int32), None, None), TypeError, ["batch_norm", "int32"]),
    (lambda: group_norm(np.zeros((2, 2), dtype=bool), 1), TypeError, ["group_norm", "bool"]),
    (lambda: batch_norm(X, None, None, training=False), ValueError, ["batch_norm", "running_mean", "training=False"]),
    (
        lambda: instance_norm(X, use_input_stats=False),
        ValueError,
        ["instance_norm", "running_var", "use_input_stats=False"],
    ),
    (lambda: batch_norm(X, np.zeros(4), np.ones(3)), ValueError, ["batch_norm", "running_mean", "(3,)", "(4,)"]),
    # one running buffer alone (PyTorch: ValueError in training), in training and in eval
    (
        lambda: batch_norm(X, np.zeros(3), None, training=True),
        ValueError,
        ["batch_norm", "running_mean and running_var must either both be None or neither be None", "only running_mean"],
    ),
    (lambda: batch_norm(X, None, np.ones(3)), ValueError, ["batch_norm", "neither be None", "only running_var"]),
    (lambda: instance_norm(X, np.zeros(3), None), ValueError, ["instance_norm", "neither be None", "running_mean"]),
    (
        lambda: instance_norm(X, None, np.ones(3), use_input_stats=False),
        ValueError,
        ["instance_norm", "neither be None", "only running_var"],
    ),
    # statistics of exactly one value (or none, under a mask) are still refused; only an empty input passes
    (lambda: instance_norm(np.zeros((2, 3, 1))), ValueError, ["instance_norm", "more than 1 spatial element"]),
    (lambda: group_norm(np.zeros((1, 2, 1)), 2), ValueError, ["group_norm", "more than 1 value", "(1, 2, 1)"]),
    (
        lambda: batch_norm(X, None, None, training=True, mask=np.zeros((2, 4), bool)),
        ValueError,
        ["batch_norm", "the mask leaves 0 valid value(s)"],
    ),
    (lambda: batch_norm(X, [0.0, 0, 0], np.ones(3)), TypeError, ["batch_norm", "running_mean", "ndarray"]),
    (
        lambda: batch_norm(X, np.zeros(3), np.ones(3), training=True, momentum=None),
        TypeError,
        ["batch_norm", "momentum=None"],
    ),
    (
        lambda: batch_norm(X, None, None, mask=np.ones((2, 3), bool)),
        ValueError,
        ["batch_norm", "mask", "(2, 4)", "(2, 3)"],
    ),
    (lambda: instance_norm(X, mask=np.ones((2, 4))), TypeError, ["instance_norm", "mask", "float64"]),
    (lambda: nn.BatchNorm1d(3)(np.zeros((2, 3, 4, 5), np.float32)), ValueError, ["BatchNorm1d", "2D or 3D", "4D"]),
    (lambda: nn.BatchNorm2d(3)(np.zeros((2, 3, 4), np.float32)), ValueError, ["BatchNorm2d", "4D", "3D"]),
    (lambda: nn.InstanceNorm1d(3, affine=True)(np.zeros((2, 4, 5))), ValueError, ["InstanceNorm1d", "num_features"]),
    (lambda: nn.GroupNorm(2, 3), ValueError, ["GroupNorm", "num_channels=3", "num_groups=2"]),
    (lambda: nn.LayerNorm(4, eps=0), ValueError, ["LayerNorm", "eps"]),
    (lambda: nn.LayerNorm(4)(np.zeros((2, 5), np.float32)), ValueError, ["layer_norm", "(4,)", "(2, 5)"]),
    # switches, momentum and sizes of the wrong type: refused, not read by truth value, float() or int()
    (lambda: batch_norm(X, None, None, training="False"), TypeError, ["batch_norm", "training", "str", "'False'"]),
    (lambda: batch_norm(X, None, None, training=1), TypeError, ["batch_norm", "training must be a bool", "int"]),
    (lambda: instance_norm(X, use_input_stats="False"), TypeError, ["instance_norm", "use_input_stats", "str"]),
    (
        lambda: batch_norm(X, np.zeros(3), np.ones(3), training=True, momentum="0.5"),
        TypeError,
        ["batch_norm", "momentum", "'0.5'"],
    ),
    (lambda: batch_norm(X, np.zeros(3), np.ones(3), momentum="0.5"), TypeError, ["batch_norm", "momentum"]),
    (lambda: instance_norm(X, momentum=1j), TypeError, ["instance_norm", "momentum", "complex"]),
    (lambda: layer_norm(X, 4.0), TypeError, ["layer_norm", "normalized_shape", "float 4.0"]),
    (lambda: layer_norm(X, None), TypeError, ["layer_norm", "normalized_shape", "NoneType"]),
    (lambda: layer_norm(X, [4.0]), TypeError, ["layer_norm", "normalized_shape", "[4.0]"]),
    (lambda: layer_norm(np.zeros((2, 1)), (True,)), TypeError, ["layer_norm", "normalized_shape", "(True,)"]),
    (lambda: rms_norm(X, "4"), TypeError, ["rms_norm", "normalized_shape", "str '4'"]),
    (lambda: layer_norm(X, (-4,)), ValueError, ["layer_norm", "normalized_shape=(-4,)", "negative"]),
    (lambda: group_norm(X, None), TypeError, ["group_norm", "num_groups must be an int", "NoneType"]),
    (lambda: group_norm(X, 3.0), TypeError, ["group_norm", "num_groups", "float 3.0"]),
    (lambda: group_norm(X, True), TypeError, ["group_norm", "num_groups", "bool"]),
    (lambda: nn.GroupNorm(2.0, 6), TypeError, ["GroupNorm", "num_groups", "float 2.0"]),
    (lambda: nn.GroupNorm(2, 6.0), TypeError, ["GroupNorm", "num_channels", "float 6.0"]),
    (lambda: nn.GroupNorm(2, -6), ValueError, ["GroupNorm", "num_channels", ">= 0", "-6"]),
    (lambda: nn.LayerNorm(-1), ValueError, ["LayerNorm", "normalized_shape=(-1,)", "negative"]),
    (lambda: nn.LayerNorm((2, -3)), ValueError, ["LayerNorm", "normalized_shape=(2, -3)"]),
    (lambda: nn.RMSNorm(4.0), TypeError, ["RMSNorm", "normalized_shape", "float"]),
    (lambda: nn.BatchNorm1d(-1), ValueError, ["BatchNorm1d", "num_features", ">= 0", "-1"]),
    (lambda: nn.InstanceNorm3d(3.0), TypeError, ["InstanceNorm3d", "num_features", "float"]),
    (lambda: nn.BatchNorm2d(3, momentum="0.5"), TypeError, ["BatchNorm2d", "momentum", "'0.5'"]),
    (lambda: nn.BatchNorm1d(3, affine="False"), TypeError, ["BatchNorm1d", "affine must be a bool"]),
    (lambda: nn.InstanceNorm1d(3, track_running_stats="False"), TypeError, ["InstanceNorm1d", "track_running_stats"]),
    (lambda: nn.BatchNorm3d(3, bias=0), TypeError, ["BatchNorm3d", "bias must be a bool", "int"]),
    (lambda: nn.GroupNorm(1, 3, bias="False"), TypeError, ["GroupNorm", "bias"]),
    (lambda: nn.LayerNorm(3, elementwise_affine="False"), TypeError, ["LayerNorm", "elementwise_affine"]),
    (lambda: nn.BatchNorm1d(3).train("False"), ValueError, ["BatchNorm1d.train", "mode must be a bool", "'False'"]),
    # the 3-d modules' ranks, as PyTorch's _check_input_dim
    (lambda: nn.BatchNorm3d(3)(np.zeros((2, 3, 4, 5), np.float32)), ValueError, ["BatchNorm3d", "5D", "got 4D"]),
    (lambda: nn.InstanceNorm3d(3)(np.zeros((3, 4, 5), np.float32)), ValueError, ["InstanceNorm3d", "4D or 5D", "3D"]),
    (
        lambda: nn.InstanceNorm1d(12, track_running_stats=True)(np.zeros((2, 10, 5), np.float32)),
        ValueError,
        ["InstanceNorm1d", "num_features (12)", "(2, 10, 5)"],
    ),
    (lambda: nn.BatchNorm1d(3).load_state_dict([1]), TypeError, ["load_state_dict", "mapping", "list"]),
    (lambda: nn.BatchNorm1d(3).load_state_dict({}, strict="no"), TypeError, ["load_state_dict", "strict", "'no'"]),
]


@pytest.mark.parametrize("call, error, fragments", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_raises_a_clear_error(call, error, fragments) -> None:
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from {message!r}"


def test_eps_zero_is_allowed_in_layer_norm_and_rms_norm_only() -> None:
    x = np.arange(8.0).reshape(2, 4)
    assert np.isfinite(layer_norm(x, 4, eps=0.0).data).all()
    assert np.isfinite(rms_norm(x + 1, 4, eps=0.0).data).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rms_norm_eps_none_is_the_machine_epsilon_of_the_input_dtype(dtype) -> None:
    """Rows of mean square 1e-8, where float32's epsilon (1.2e-7) dominates and float64's (2.2e-16) does not: an
    eps of the other dtype changes y by a factor of up to 3.6."""
    x = (1e-4 * np.random.default_rng(0).choice([-1.0, 1.0], (3, 8))).astype(dtype)
    for module in (False, True):
        y = (nn.RMSNorm(8, dtype=dtype, elementwise_affine=False)(x) if module else rms_norm(x, 8)).data
        want = x.astype(np.float64) / np.sqrt(
            np.mean(x.astype(np.float64) ** 2, -1, keepdims=True) + np.finfo(dtype).eps
        )
        np.testing.assert_allclose(y, want, rtol=1e-5 if dtype == np.float32 else 1e-13)


def test_functionals_are_exported_with_pytorch_names_and_defaults() -> None:
    import inspect

    assert F.layer_norm is layer_norm and F.batch_norm is batch_norm and F.group_norm is group_norm
    params = inspect.signature(F.batch_norm).parameters
    assert list(params)[:8] == ["input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"]
    assert params["training"].default is False and params["momentum"].default == 0.1 and params["eps"].default == 1e-5
    assert inspect.signature(F.rms_norm).parameters["eps"].default is None
    assert inspect.signature(F.instance_norm).parameters["use_input_stats"].default is True


# -- modules -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_modules_have_pytorch_parameters_and_buffers(dtype) -> None:
    bn = nn.BatchNorm2d(3, dtype=dtype)
    assert [n for n, _ in bn.named_parameters()] == ["weight", "bias"]
    assert sorted(bn.state_dict()) == ["bias", "num_batches_tracked", "running_mean", "running_var", "weight"]
    assert bn.weight.dtype == bn.running_var.dtype == dtype and bn.num_batches_tracked.dtype == np.int64
    assert np.array_equal(bn.weight.data, np.ones(3)) and np.array_equal(bn.running_var, np.ones(3))
    inorm = nn.InstanceNorm1d(3, dtype=dtype)
    assert inorm.parameters() == [] and inorm.state_dict() == {}
    assert sorted(nn.InstanceNorm2d(3, affine=True, track_running_stats=True).state_dict()) == sorted(bn.state_dict())
    assert [n for n, _ in nn.LayerNorm((2, 3), bias=False, dtype=dtype).named_parameters()] == ["weight"]
    assert nn.LayerNorm(3, elementwise_affine=False).parameters() == []
    assert nn.RMSNorm(3, dtype=dtype).weight.dtype == dtype
    assert [p.shape for p in nn.GroupNorm(2, 4).parameters()] == [(4,), (4,)]
    # bias=False keeps the weight only; the running buffers do not depend on it
    bn3 = nn.BatchNorm3d(3, bias=False, dtype=dtype)
    assert [n for n, _ in bn3.named_parameters()] == ["weight"] and bn3.bias is None
    assert sorted(bn3.state_dict()) == ["num_batches_tracked", "running_mean", "running_var", "weight"]
    assert [n for n, _ in nn.InstanceNorm3d(3, affine=True, bias=False).named_parameters()] == ["weight"]
    assert [n for n, _ in nn.GroupNorm(2, 4, bias=False).named_parameters()] == ["weight"]
    assert nn.BatchNorm1d(3, affine=False, bias=True).parameters() == []


def test_modules_take_pytorchs_device_and_dtype_arguments() -> None:
    """``device`` before ``dtype``, as PyTorch's factory arguments: a positional dtype landed in device, and
    ``device="cpu"`` was a TypeError. The CPU is the one device; dtype None is float32, PyTorch's default."""
    assert nn.LayerNorm(4, 1e-5, True, True, None, np.float64).weight.dtype == np.float64
    assert nn.GroupNorm(2, 4, 1e-5, True, "cpu", np.float64).bias.dtype == np.float64
    bn = nn.BatchNorm2d(3, 1e-5, 0.1, True, True, None, np.float64)
    assert bn.weight.dtype == bn.running_var.dtype == np.float64
    assert nn.InstanceNorm1d(3, affine=True, device="cpu").weight.dtype == np.float32
    assert nn.RMSNorm(4, dtype=None).weight.dtype == np.float32
    assert nn.Linear(3, 2, device="cpu", dtype=np.float64).weight.dtype == np.float64
    assert nn.Embedding(5, 2, device="cpu").weight.dtype == np.float32
    for make in (lambda: nn.LayerNorm(4, device="cuda"), lambda: nn.Linear(3, 2, device="cuda:0")):
        with pytest.raises(ValueError, match="device='cuda.*the CPU only"):
            make()


def test_bias_false_modules_scale_without_shifting(rng) -> None:
    """y = xhat * weight: the normalized input of NumPy's statistics, scaled, with no bias added."""
    x = rng.standard_normal((3, 4, 2, 3, 2)) * 2 + 1
    w = rng.standard_normal(4)
    for module, axes in (
        (nn.BatchNorm3d(4, bias=False, dtype=np.float64), (0, 2, 3, 4)),
        (nn.InstanceNorm3d(4, affine=True, bias=False, dtype=np.float64), (2, 3, 4)),
        (nn.GroupNorm(4, 4, bias=False, dtype=np.float64), (2, 3, 4)),
    ):
        module.weight.data[...] = w
        xhat = (x - x.mean(axis=axes, keepdims=True)) / np.sqrt(x.var(axis=axes, keepdims=True) + 1e-5)
        np.testing.assert_allclose(module(x).data, xhat * w[:, None, None, None], atol=1e-12)


def test_a_refused_switch_or_momentum_leaves_the_running_buffers_alone(rng) -> None:
    """The text "False" was read as true: a training step that updated the buffers. Now nothing moves."""
    x = rng.standard_normal((4, 3, 5))
    rm, rv = np.zeros(3), np.ones(3)
    for call in (
        lambda: batch_norm(x, rm, rv, training="False"),
        lambda: batch_norm(x, rm, rv, training=True, momentum="0.5"),
        lambda: instance_norm(x, rm, rv, use_input_stats="False", momentum=1.0),
    ):
        with pytest.raises(TypeError):
            call()
        np.testing.assert_array_equal(rm, np.zeros(3))
        np.testing.assert_array_equal(rv, np.ones(3))


def test_a_read_only_buffer_refuses_a_training_step_before_any_update(rng) -> None:
    """NumPy's own error came after the first update (running_mean moved, running_var could not), naming
    neither op nor buffer. Evaluation reads the buffers only, so read-only buffers are fine there."""
    x = rng.standard_normal((4, 3, 5))
    training = (lambda *a: batch_norm(*a, training=True, momentum=1.0), lambda *a: instance_norm(*a, momentum=1.0))
    for op, name in zip(training, ("batch_norm", "instance_norm"), strict=True):
        rm, rv = np.zeros(3), np.ones(3)
        rv.flags.writeable = False
        with pytest.raises(ValueError, match=f"{name}: running_var is read-only"):
            op(x, rm, rv)
        np.testing.assert_array_equal(rm, np.zeros(3))
        rm.flags.writeable = False
        with pytest.raises(ValueError, match=f"{name}: running_mean is read-only"):
            op(x, rm, rv)
    y = batch_norm(x, rm, rv, training=False)
    np.testing.assert_allclose(y.data, x / np.sqrt(1 + 1e-5), atol=1e-12)
    bn = nn.BatchNorm1d(3, dtype=np.float64)
    bn.num_batches_tracked.flags.writeable = False
    with pytest.raises(ValueError, match="BatchNorm1d: num_batches_tracked is read-only"):
        bn(x)
    np.testing.assert_array_equal(np.stack([bn.running_mean, bn.running_var]), [np.zeros(3), np.ones(3)])


def test_numpy_bools_are_read_as_their_value(rng) -> None:
    x = rng.standard_normal((4, 3, 5))
    rm, rv = rng.standard_normal(3), rng.uniform(0.5, 2.0, 3)
    before = rm.copy(), rv.copy()
    y = batch_norm(x, rm, rv, training=np.bool_(False))  # the buffers normalize, and stay as they were
    np.testing.assert_allclose(y.data, (x - rm[:, None]) / np.sqrt(rv[:, None] + 1e-5), atol=1e-12)
    np.testing.assert_array_equal(np.stack([rm, rv]), np.stack(before))
    batch_norm(x, rm, rv, training=np.bool_(True), momentum=1.0)  # the batch statistics replace them
    np.testing.assert_allclose(rm, x.mean(axis=(0, 2)), atol=1e-14)
    bn = nn.BatchNorm1d(3).train(np.bool_(False))
    assert bn.training is False


def test_batch_norm_module_updates_running_buffers_with_unbiased_variance(rng) -> None:
    bn = nn.BatchNorm1d(3, momentum=0.3, dtype=np.float64)
    x = rng.standard_normal((5, 3, 4)) * 2 + 1
    y = bn(x)
    mean = x.mean(axis=(0, 2))
    np.testing.assert_allclose(bn.running_mean, 0.3 * mean, rtol=1e-12)
    np.testing.assert_allclose(bn.running_var, 0.7 + 0.3 * x.var(axis=(0, 2), ddof=1), rtol=1e-12)
    # while the output is normalized with the biased variance
    expected = (x - mean[:, None]) / np.sqrt(x.var(axis=(0, 2))[:, None] + 1e-5)
    np.testing.assert_allclose(y.data, expected, atol=1e-12)
    assert bn.num_batches_tracked == 1
    # eval: the buffers normalize, and are left alone
    bn.eval()
    before = bn.state_dict()
    x2 = rng.standard_normal((2, 3, 4))
    expected = (x2 - bn.running_mean[:, None]) / np.sqrt(bn.running_var[:, None] + 1e-5)
    np.testing.assert_allclose(bn(x2).data, expected, atol=1e-12)
    for k, v in bn.state_dict().items():
        assert np.array_equal(v, before[k])


def test_batch_norm_momentum_none_is_the_cumulative_average(rng) -> None:
    bn = nn.BatchNorm2d(2, momentum=None, dtype=np.float64)
    batches = [rng.standard_normal((3, 2, 2, 2)) + k for k in range(4)]
    for x in batches:
        bn(x)
    np.testing.assert_allclose(bn.running_mean, np.mean([x.mean(axis=(0, 2, 3)) for x in batches], axis=0))
    np.testing.assert_allclose(bn.running_var, np.mean([x.var(axis=(0, 2, 3), ddof=1) for x in batches], axis=0))
    assert bn.num_batches_tracked == 4


def test_refused_batch_leaves_module_state_alone() -> None:
    bn = nn.BatchNorm1d(3, momentum=None)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        bn(np.zeros((1, 3), np.float32))
    assert bn.num_batches_tracked == 0 and np.array_equal(bn.running_mean, np.zeros(3))


def test_untracked_batch_norm_uses_batch_statistics_in_eval(rng) -> None:
    bn = nn.BatchNorm1d(3, track_running_stats=False, affine=False, dtype=np.float64).eval()
    x = rng.standard_normal((4, 3))
    np.testing.assert_allclose(bn(x).data, (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5), atol=1e-12)
    assert bn.running_mean is None and bn.state_dict() == {}


def test_instance_norm_running_buffers_average_the_instances(rng) -> None:
    inorm = nn.InstanceNorm1d(2, momentum=0.5, track_running_stats=True, dtype=np.float64)
    x = rng.standard_normal((3, 2, 5))
    inorm(x)
    np.testing.assert_allclose(inorm.running_mean, 0.5 * x.mean(axis=2).mean(axis=0))
    np.testing.assert_allclose(inorm.running_var, 0.5 + 0.5 * x.var(axis=2, ddof=1).mean(axis=0))
    inorm.eval()  # tracked + eval: the running statistics normalize
    expected = (x - inorm.running_mean[:, None]) / np.sqrt(inorm.running_var[:, None] + 1e-5)
    np.testing.assert_allclose(inorm(x).data, expected, atol=1e-12)


def test_instance_norm_unbatched_input_is_a_batch_of_one(rng) -> None:
    x = rng.standard_normal((2, 3, 4))
    y = nn.InstanceNorm2d(2, dtype=np.float64)(x)
    assert y.shape == (2, 3, 4)
    np.testing.assert_allclose(y.data, instance_norm(x[None]).data[0])
    mask = np.arange(12).reshape(3, 4) % 5 > 0  # (a mask Tensor as well as an array, as in the batched form)
    for m in (mask, Tensor(mask)):
        y = nn.InstanceNorm2d(2, dtype=np.float64)(x, mask=m)
        np.testing.assert_allclose(y.data, instance_norm(x[None], mask=mask[None]).data[0])


def test_state_dict_round_trip(rng) -> None:
    a = nn.BatchNorm1d(3, dtype=np.float64)
    a(rng.standard_normal((4, 3)))
    b = nn.BatchNorm1d(3, dtype=np.float64)
    result = b.load_state_dict(a.state_dict())
    assert result == ([], []) and repr(result) == "<All keys matched successfully>"
    for k, v in a.state_dict().items():
        assert np.array_equal(b.state_dict()[k], v)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(3, dtype=np.float64)
        self.ln = nn.LayerNorm(3, dtype=np.float64)


def test_a_value_that_is_not_a_number_fails_the_load_before_anything_is_copied() -> None:
    """NumPy's cast of a text value failed half-way through the copies, after the entries before it were in."""
    ln = nn.LayerNorm(3)
    with pytest.raises(
        RuntimeError, match="dtype mismatch for bias: a <U1 value cannot be copied into the model's float32"
    ):
        ln.load_state_dict({"weight": np.zeros(3), "bias": np.array(["a", "b", "c"])})
    np.testing.assert_array_equal(ln.weight.data, np.ones(3))
    bn = nn.BatchNorm1d(3)
    bn.load_state_dict({**bn.state_dict(), "num_batches_tracked": np.array(5.0), "weight": np.arange(3)})
    assert bn.num_batches_tracked == 5 and bn.weight.data.dtype == np.float32  # (numbers are cast)


def test_load_state_dict_not_strict_loads_what_it_can_and_lists_the_rest() -> None:
    net = _Net()
    state = {"bn.weight": np.full(3, 2.0), "ln.bias": np.full(3, 5.0), "head.weight": np.zeros(2)}
    missing, unexpected = net.load_state_dict(state, strict=False)
    assert sorted(missing) == ["bn.bias", "bn.running_mean", "bn.running_var", "ln.weight"]
    assert unexpected == ["head.weight"]
    np.testing.assert_array_equal(net.bn.weight.data, np.full(3, 2.0))
    np.testing.assert_array_equal(net.ln.bias.data, np.full(3, 5.0))
    np.testing.assert_array_equal(net.bn.bias.data, np.zeros(3))  # missing: left as it was


def test_load_state_dict_without_num_batches_tracked_keeps_the_count(rng) -> None:
    """As PyTorch with a state dict that has no version: the counter is filled from the module, even
    with strict=True; any other missing entry is still an error."""
    net = _Net()
    net.bn(rng.standard_normal((4, 3)))
    net.bn(rng.standard_normal((4, 3)))
    state = _Net().state_dict()
    state["bn.running_mean"][...] = 7.0
    del state["bn.num_batches_tracked"]
    assert net.load_state_dict(state) == ([], [])
    assert net.bn.num_batches_tracked == 2
    np.testing.assert_array_equal(net.bn.running_mean, np.full(3, 7.0))
    del state["bn.running_var"]
    with pytest.raises(RuntimeError, match=re.escape('Missing key(s) in state_dict: "bn.running_var".')):
        net.load_state_dict(state)
    untracked = nn.BatchNorm1d(3, track_running_stats=False)
    with pytest.raises(RuntimeError, match=re.escape('Unexpected key(s) in state_dict: "num_batches_tracked"')):
        untracked.load_state_dict({**untracked.state_dict(), "num_batches_tracked": np.array(0)})


@pytest.mark.parametrize("strict", [True, False])
def test_a_failed_load_lists_every_problem_and_copies_nothing(strict) -> None:
    net = _Net()
    before = net.state_dict()
    state = {k: np.full_like(v, 9) for k, v in _Net().state_dict().items()}
    del state["ln.weight"]
    state["extra"] = np.zeros(1)
    state["bn.bias"] = np.zeros(4)
    state["ln.bias"] = np.zeros((1, 3))
    with pytest.raises(RuntimeError) as info:
        net.load_state_dict(state, strict=strict)
    lines = str(info.value).split("\n\t")
    expected = [
        "Error(s) in loading state_dict for _Net:",
        *(
            ['Missing key(s) in state_dict: "ln.weight".', 'Unexpected key(s) in state_dict: "extra".']
            if strict
            else []
        ),
        "size mismatch for bn.bias: copying a param with shape (4,) from checkpoint, the shape in current model "
        "is (3,).",
        "size mismatch for ln.bias: copying a param with shape (1, 3) from checkpoint, the shape in current "
        "model is (3,).",
    ]
    assert lines == expected
    for k, v in net.state_dict().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


# -- an empty batch ----------------------------------------------------------------------------------------
def _buffers(c: int = 3) -> tuple[np.ndarray, np.ndarray]:
    return np.full(c, 2.0), np.full(c, 3.0)


# name: (the norm of (x, weight, bias), x's shape, the affine shape)
EMPTY = {
    "layer_norm": (lambda x, w, b: layer_norm(x, 5, w, b), (0, 3, 5), (5,)),
    "layer_norm, no row": (lambda x, w, b: layer_norm(x, (3, 5), w, b), (2, 0, 3, 5), (3, 5)),
    "rms_norm": (lambda x, w, b: rms_norm(x, 5, w), (0, 3, 5), (5,)),
    "layer_norm, D = 0": (lambda x, w, b: layer_norm(x, (2, 0), w, b), (3, 2, 0), (2, 0)),
    "group_norm": (lambda x, w, b: group_norm(x, 2, w, b), (0, 4, 5), (4,)),
    "batch_norm train": (lambda x, w, b: batch_norm(x, *_buffers(), w, b, training=True), (0, 3, 5), (3,)),
    "batch_norm train (N, C)": (lambda x, w, b: batch_norm(x, *_buffers(), w, b, training=True), (0, 3), (3,)),
    "batch_norm train, S = 0": (lambda x, w, b: batch_norm(x, None, None, w, b, training=True), (2, 3, 0), (3,)),
    "batch_norm train, masked": (
        lambda x, w, b: batch_norm(x, None, None, w, b, training=True, mask=np.ones((0, 5), bool)),
        (0, 3, 5),
        (3,),
    ),
    "batch_norm eval": (lambda x, w, b: batch_norm(x, *_buffers(), w, b), (0, 3, 2, 2), (3,)),
    "instance_norm": (lambda x, w, b: instance_norm(x, *_buffers(), w, b), (0, 3, 5), (3,)),
    "instance_norm, running stats": (
        lambda x, w, b: instance_norm(x, *_buffers(), w, b, use_input_stats=False),
        (0, 3, 5),
        (3,),
    ),
}


@pytest.mark.parametrize("name", list(EMPTY))
def test_an_empty_batch_gives_an_empty_output_and_zero_affine_gradients(name, monkeypatch) -> None:
    """As PyTorch: y and dx empty, dweight and dbias 0 (sums over no position), each in its tensor's
    dtype. No kernel is reached (``kernels_for`` is the one dispatch point, for both backends): a
    BatchNorm channel of no value would be a 0/0 there."""

    def no_kernel(*arrays: np.ndarray) -> None:
        raise AssertionError(f"an empty input reached a kernel: shapes {[np.shape(a) for a in arrays]}")

    monkeypatch.setattr(_node, "kernels_for", no_kernel)
    fn, shape, affine_shape = EMPTY[name]
    x = Tensor(np.zeros(shape, np.float32), requires_grad=True)
    w = Tensor(np.full(affine_shape, 2.0), requires_grad=True)  # float64 beside float32 data (docs/derivations.md §6)
    b = Tensor(np.full(affine_shape, 1.0), requires_grad=True)
    y = fn(x, w, b)
    assert y.shape == shape and y.dtype == np.float32
    y.backward(np.ones(shape, np.float32))
    assert x.grad.shape == shape and x.grad.dtype == np.float32
    assert w.grad.dtype == np.float64 and np.array_equal(w.grad, np.zeros(affine_shape))
    if name != "rms_norm":  # (no bias)
        assert b.grad.dtype == np.float64 and np.array_equal(b.grad, np.zeros(affine_shape))


@pytest.mark.parametrize("momentum", [0.5, None])
def test_an_empty_batch_is_counted_but_leaves_the_running_buffers_alone(momentum) -> None:
    """PyTorch's BatchNorm module counts an empty training batch in num_batches_tracked (so that with
    momentum=None the next batch's weight is 1/2), and has no statistic to move the buffers with."""
    bn = nn.BatchNorm1d(3, momentum=momentum, dtype=np.float64)
    bn.running_mean[...], bn.running_var[...] = _buffers()
    assert bn(np.zeros((0, 3, 5))).shape == (0, 3, 5)
    assert bn.num_batches_tracked == 1
    np.testing.assert_array_equal(np.stack([bn.running_mean, bn.running_var]), np.stack(_buffers()))
    x = np.arange(8.0).reshape(4, 2)[:, [0, 1, 1]]
    bn(x)  # with momentum=None, the cumulative average over 2 batches: the empty one counts
    m = 0.5 if momentum is None else momentum
    np.testing.assert_allclose(bn.running_mean, (1 - m) * 2.0 + m * x.mean(axis=0), rtol=1e-15)
    bn.eval()
    assert bn(np.zeros((0, 3))).shape == (0, 3) and bn.num_batches_tracked == 2


def test_an_empty_batch_updates_no_running_buffer_in_the_functionals_and_instance_norm() -> None:
    x = np.zeros((0, 3, 5))
    for call in (
        lambda rm, rv: batch_norm(x, rm, rv, training=True, momentum=1.0),
        lambda rm, rv: instance_norm(x, rm, rv, momentum=1.0),
        lambda rm, rv: batch_norm(x, rm, rv, training=True, momentum=1.0, mask=np.ones((0, 5), bool)),
    ):
        rm, rv = _buffers()
        assert call(rm, rv).shape == x.shape
        np.testing.assert_array_equal(np.stack([rm, rv]), np.stack(_buffers()))
    inorm = nn.InstanceNorm1d(3, momentum=1.0, track_running_stats=True, dtype=np.float64)
    inorm.running_mean[...], inorm.running_var[...] = _buffers()
    assert inorm(x).shape == x.shape
    np.testing.assert_array_equal(np.stack([inorm.running_mean, inorm.running_var]), np.stack(_buffers()))


# -- masked statistics ---------------------------------------------------------------------------------------
@given(shape=channel_shapes(min_spatial=2, max_side=4), data=st.data(), affine=st.booleans())
def test_masked_batch_norm_matches_numpy_on_the_valid_positions(shape, data, affine) -> None:
    n, c = shape[:2]
    mask = data.draw(masks((n, *shape[2:])))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.standard_normal(shape)
    w, b = (rng.standard_normal(c), rng.standard_normal(c)) if affine else (None, None)
    rm, rv = np.zeros(c), np.ones(c)
    xt = Tensor(x, requires_grad=True)
    y = batch_norm(xt, rm, rv, w, b, training=True, momentum=0.25, mask=mask)
    m = np.broadcast_to(mask[:, None], shape)
    for ch in range(c):
        valid = x[:, ch][mask]
        expected = (valid - valid.mean()) / np.sqrt(valid.var() + 1e-5)
        if affine:
            expected = expected * w[ch] + b[ch]
        np.testing.assert_allclose(y.data[:, ch][mask], expected, atol=1e-12)
        assert rm[ch] == pytest.approx(0.25 * valid.mean(), abs=1e-14)
        assert rv[ch] == pytest.approx(0.75 + 0.25 * valid.var(ddof=1), rel=1e-12)
    assert np.all(y.data[~m] == 0)
    y.backward(rng.standard_normal(shape))
    assert np.all(xt.grad[~m] == 0)
    # masked-out values do not reach the output
    x2 = np.where(m, x, 1e3)
    np.testing.assert_allclose(batch_norm(x2, None, None, w, b, training=True, mask=mask).data, y.data, atol=1e-12)


@given(shape=channel_shapes(min_spatial=2, max_side=4), data=st.data())
def test_masked_instance_norm_matches_numpy_on_the_valid_positions(shape, data) -> None:
    n, c = shape[:2]
    mask = data.draw(masks((n, *shape[2:])))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.standard_normal(shape)
    rm, rv = np.zeros(c), np.ones(c)
    xt = Tensor(x, requires_grad=True)
    y = instance_norm(xt, rm, rv, momentum=1.0, mask=mask)
    means, variances = np.zeros((n, c)), np.zeros((n, c))
    for i in range(n):
        for ch in range(c):
            valid = x[i, ch][mask[i]]
            expected = (valid - valid.mean()) / np.sqrt(valid.var() + 1e-5)
            np.testing.assert_allclose(y.data[i, ch][mask[i]], expected, atol=1e-12)
            means[i, ch], variances[i, ch] = valid.mean(), valid.var(ddof=1)
            assert np.all(y.data[i, ch][~mask[i]] == 0)
    np.testing.assert_allclose(rm, means.mean(axis=0), atol=1e-14)
    np.testing.assert_allclose(rv, variances.mean(axis=0), rtol=1e-12)
    y.backward(rng.standard_normal(shape))
    assert np.all(xt.grad[~np.broadcast_to(mask[:, None], shape)] == 0)


def test_error_messages_name_the_shapes_in_pytorch_style() -> None:
    with pytest.raises(ValueError, match=re.escape("got input size (1, 3)")):
        batch_norm(np.zeros((1, 3)), None, None, training=True)


def test_backward_uses_the_statistics_of_its_forward_even_if_the_buffers_change(rng) -> None:
    x = rng.standard_normal((4, 2, 3))
    rm, rv = rng.standard_normal(2), rng.uniform(0.5, 2, 2)
    g = rng.standard_normal(x.shape)
    grads = []
    for mutate in (False, True):
        xt, wt = Tensor(x, requires_grad=True), Tensor(np.ones(2), requires_grad=True)
        buffers = rm.copy(), rv.copy()
        y = batch_norm(xt, *buffers, wt, training=False)
        if mutate:  # e.g. a training step of the same module between this forward and its backward
            batch_norm(x * 3, *buffers, training=True, momentum=1.0)
        y.backward(g)
        grads.append((xt.grad, wt.grad))
    for a, b in zip(*grads):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_each_affine_gradient_has_its_own_dtype_and_full_precision(backend, rng) -> None:
    """A float32 weight beside a float64 bias (docs/derivations.md §6): dbias is float64 and as exact as
    with a float64 weight, not a float32 rounding of it; dweight is float32."""
    import minigrad_norm as mg

    x = rng.standard_normal((64, 6))
    dy = rng.standard_normal((64, 6))
    w32 = rng.standard_normal(6).astype(np.float32)
    with mg.use_backend(backend):
        grads = {}
        for wdtype in (np.float32, np.float64):
            w = Tensor(w32.astype(wdtype), requires_grad=True)
            b = Tensor(np.full(6, 0.5), requires_grad=True)
            layer_norm(Tensor(x), 6, w, b).backward(dy)
            grads[wdtype] = (w.grad, b.grad)
    (dw32, db), (dw64, db64) = grads[np.float32], grads[np.float64]
    assert dw32.dtype == np.float32 and db.dtype == np.float64
    np.testing.assert_array_equal(db, db64)  # the same float64 sums
    np.testing.assert_allclose(db, dy.sum(axis=0), rtol=1e-13)
    np.testing.assert_allclose(dw32, dw64, rtol=1e-6)
