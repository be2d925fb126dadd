"""Optimizer update rules against closed forms worked out by hand (no PyTorch needed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from minigrad_norm.optim import SGD, Adam, AdamW, WarmupSchedule, clip_grad_norm_
from minigrad_norm.tensor import Tensor


def param(values) -> Tensor:
    return Tensor(np.array(values, dtype=np.float64), requires_grad=True)


def run(opt, p: Tensor, grads) -> None:
    for g in grads:
        p.grad = np.array(g, dtype=p.dtype)
        opt.step()


def test_sgd_plain_and_l2() -> None:
    p = param([1.0, -2.0])
    run(SGD([p], lr=0.1), p, [[0.5, 1.0]])
    np.testing.assert_allclose(p.data, [1.0 - 0.05, -2.0 - 0.1])
    p = param([1.0, -2.0])
    run(SGD([p], lr=0.1, weight_decay=0.5), p, [[0.0, 0.0]])  # L2: the gradient gains 0.5 * p
    np.testing.assert_allclose(p.data, [1.0 * (1 - 0.05), -2.0 * (1 - 0.05)])
    p = param([1.0])
    run(SGD([p]), p, [[2.0]])  # PyTorch's default lr, 1e-3
    assert p.data[0] == 1.0 - 1e-3 * 2.0


def test_sgd_momentum_closed_form() -> None:
    """Constant gradient g: the buffer after t steps is g (1 + m + ... + m^(t-1))."""
    m, lr, g = 0.9, 0.1, 2.0
    p = param([0.0])
    run(SGD([p], lr=lr, momentum=m), p, [[g]] * 3)
    assert p.data[0] == pytest.approx(-lr * g * (1 + (1 + m) + (1 + m + m * m)))
    p = param([0.0])  # Nesterov steps with g + m * buf
    run(SGD([p], lr=lr, momentum=m, nesterov=True), p, [[g]] * 2)
    assert p.data[0] == pytest.approx(-lr * ((g + m * g) + (g + m * (1 + m) * g)))
    p = param([0.0])  # dampening scales every gradient after the first into the buffer
    run(SGD([p], lr=lr, momentum=m, dampening=0.5), p, [[g]] * 2)
    assert p.data[0] == pytest.approx(-lr * (g + (m * g + 0.5 * g)))


def test_adam_first_step_is_lr_times_sign() -> None:
    """After bias correction m_hat = g and v_hat = g^2, so the first step is lr * g / (|g| + eps)."""
    p = param([1.0, 1.0, 1.0])
    g = np.array([3.0, -0.25, 1e-3])
    run(Adam([p], lr=0.01, eps=1e-8), p, [g])
    np.testing.assert_allclose(p.data, 1.0 - 0.01 * g / (np.abs(g) + 1e-8), rtol=1e-12)


def test_adam_two_steps_closed_form() -> None:
    b1, b2, lr, eps = 0.9, 0.999, 0.1, 1e-8
    g1, g2 = 1.0, -3.0
    m = (1 - b1) * g1
    v = (1 - b2) * g1**2
    expected = 0.0 - lr * (m / (1 - b1)) / (math.sqrt(v / (1 - b2)) + eps)
    m = b1 * m + (1 - b1) * g2
    v = b2 * v + (1 - b2) * g2**2
    expected -= lr * (m / (1 - b1**2)) / (math.sqrt(v / (1 - b2**2)) + eps)
    p = param([0.0])
    run(Adam([p], lr=lr), p, [[g1], [g2]])
    assert p.data[0] == pytest.approx(expected, rel=1e-12)


def test_adamw_decay_is_decoupled_from_the_gradient() -> None:
    """With zero gradient, AdamW only shrinks p by (1 - lr wd); Adam's L2 term instead takes a full Adam step."""
    lr, wd = 0.1, 0.5
    p = param([2.0, -4.0])
    run(AdamW([p], lr=lr, weight_decay=wd), p, [[0.0, 0.0]] * 3)
    np.testing.assert_allclose(p.data, np.array([2.0, -4.0]) * (1 - lr * wd) ** 3, rtol=1e-12)
    p = param([2.0, -4.0])
    run(Adam([p], lr=lr, weight_decay=wd), p, [[0.0, 0.0]])
    np.testing.assert_allclose(p.data, [2.0 - lr, -4.0 + lr], rtol=1e-7)  # lr * sign(wd * p)
    assert AdamW([param([0.0])]).weight_decay == 0.01  # PyTorch's default


def test_adamw_decays_before_its_step() -> None:
    """PyTorch's order: p <- p (1 - lr wd), then the Adam step, whose first one is lr g / (|g| + eps) (the bias
    corrections make m_hat = g and v_hat = g^2). Decaying after the step would give (p - lr) (1 - lr wd)."""
    lr, wd, eps = 0.1, 0.5, 1e-8
    p = param([2.0, -1.0])
    run(AdamW([p], lr=lr, weight_decay=wd, eps=eps), p, [[3.0, -0.5]])
    g = np.array([3.0, -0.5])
    np.testing.assert_allclose(p.data, np.array([2.0, -1.0]) * (1 - lr * wd) - lr * g / (np.abs(g) + eps), rtol=1e-14)


def test_zero_grad_drops_the_gradients_or_zeros_them_in_place() -> None:
    a, b = param([1.0, 2.0]), param([3.0])
    opt = SGD([a, b], lr=0.1)
    a.grad = np.array([5.0, 6.0])
    held = a.grad
    opt.zero_grad(set_to_none=False)
    assert a.grad is held and held.tolist() == [0.0, 0.0] and b.grad is None
    opt.zero_grad()
    assert a.grad is None


def test_parameters_without_grad_are_skipped_and_state_is_per_parameter() -> None:
    a, b = param([1.0]), param([1.0])
    opt = Adam([a, b], lr=0.1)
    a.grad = np.array([1.0])
    opt.step()
    assert b.data[0] == 1.0 and opt.steps == [1, 0]
    a.grad, b.grad = np.array([1.0]), np.array([1.0])
    opt.step()
    assert b.data[0] == pytest.approx(1.0 - 0.1)  # b's first step: bias correction with t = 1
    opt.zero_grad()
    assert a.grad is None and b.grad is None


def test_float32_parameters_stay_float32() -> None:
    p = Tensor(np.ones(3, dtype=np.float32), requires_grad=True)
    for cls in (SGD, Adam, AdamW):
        p.grad = np.full(3, 0.5, dtype=np.float32)
        cls([p], lr=0.1).step()
        assert p.data.dtype == np.float32


def test_warmup_schedule() -> None:
    opt = SGD([param([0.0])], lr=1.0)
    s = WarmupSchedule(opt, warmup_steps=4)
    assert [s.step() for _ in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    opt = SGD([param([0.0])], lr=2.0)
    s = WarmupSchedule(opt, warmup_steps=2, total_steps=6, decay="linear")
    # the decay counts from the step before: the last of the 6 steps still moves (0.5), 0 would be the 7th
    assert [s.step() for _ in range(8)] == pytest.approx([1.0, 2.0, 2.0, 1.5, 1.0, 0.5, 0.0, 0.0])
    opt = SGD([param([0.0])], lr=1.0)
    s = WarmupSchedule(opt, warmup_steps=1, total_steps=3, decay="cosine")
    assert [s.step() for _ in range(3)] == pytest.approx([1.0, 1.0, 0.5])  # (1 + cos(pi u)) / 2, u = 0, 1/2
    s = WarmupSchedule(SGD([param([0.0])], lr=1.0), warmup_steps=0, total_steps=1, decay="cosine")
    assert s.step() == 1.0  # a run of one step moves
    with pytest.raises(ValueError, match="total_steps"):
        WarmupSchedule(opt, 5, 5, decay="cosine")


def test_clip_grad_norm() -> None:
    a, b = param([0.0, 0.0]), param([0.0])
    a.grad, b.grad = np.array([3.0, 0.0]), np.array([4.0])
    assert clip_grad_norm_([a, b], 1.0) == pytest.approx(5.0)
    np.testing.assert_allclose(np.concatenate([a.grad, b.grad]), np.array([3.0, 0.0, 4.0]) / (5.0 + 1e-6))
    a.grad, b.grad = np.array([0.3, 0.0]), np.array([0.4])
    assert clip_grad_norm_([a, b], 1.0) == pytest.approx(0.5)
    np.testing.assert_array_equal(a.grad, [0.3, 0.0])  # below the limit: untouched
    a.grad = np.array([np.inf, 0.0])
    with pytest.raises(RuntimeError, match="non"):
        clip_grad_norm_([a], 1.0, error_if_nonfinite=True)


def test_clip_grad_norm_takes_torch_s_arguments_a_single_tensor_and_spreads_nan() -> None:
    a, b = param([0.0, 0.0]), param([0.0])
    a.grad, b.grad = np.array([3.0, -4.0]), np.array([2.0])
    assert clip_grad_norm_([a, b], 1.0, 1.0) == 9.0  # the third argument is norm_type, as torch's: |3|+|4|+|2|
    np.testing.assert_allclose(a.grad, [3.0 / (9.0 + 1e-6), -4.0 / (9.0 + 1e-6)], rtol=1e-15)
    a.grad, b.grad = np.array([3.0, -4.0]), np.array([2.0])
    assert clip_grad_norm_([a, b], 10.0, norm_type=np.inf) == 4.0 and a.grad.tolist() == [3.0, -4.0]
    assert clip_grad_norm_(b, 1.0) == 2.0 and b.grad[0] == 2.0 / (2.0 + 1e-6)  # one Tensor, not its rows
    a.grad, b.grad = np.array([np.nan, 1.0]), np.array([2.0])
    assert np.isnan(clip_grad_norm_([a, b], 1.0))
    assert np.isnan(a.grad).all() and np.isnan(b.grad).all()  # a NaN norm reaches every gradient, as torch's
    for bad in (0.0, -1.0, np.nan, "2"):
        with pytest.raises(ValueError, match="clip_grad_norm_: norm_type must be a number > 0"):
            clip_grad_norm_([a], 1.0, norm_type=bad)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="learning rate"):
        SGD([param([0.0])], lr=-1.0)
    with pytest.raises(ValueError, match="betas"):
        Adam([param([0.0])], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="empty"):
        AdamW([])
    with pytest.raises(ValueError, match=r"SGD: can't optimize a non-leaf Tensor \(parameter 0, shape \(1,\)\)"):
        SGD([param([0.0]) * 2.0], lr=0.1)
    with pytest.raises(TypeError, match="SGD: params must be an iterable of Tensors, got a Tensor of shape"):
        SGD(param([0.0]), lr=0.1)
    with pytest.raises(TypeError, match="parameter 0 is a dict, not a Tensor .parameter groups"):
        SGD([{"params": [param([0.0])], "lr": 0.1}], lr=0.1)
    with pytest.raises(ValueError, match="nesterov"):
        SGD([param([0.0])], lr=0.1, nesterov=True)


NAN = float("nan")


@pytest.mark.parametrize(
    "make",
    [
        lambda p: SGD(p, lr=NAN),
        lambda p: SGD(p, lr=0.1, momentum=NAN),
        lambda p: SGD(p, lr=0.1, weight_decay=NAN),
        lambda p: SGD(p, lr=0.1, momentum=0.9, dampening=NAN),
        lambda p: Adam(p, lr=NAN),
        lambda p: Adam(p, betas=(NAN, 0.999)),
        lambda p: Adam(p, betas=(0.9, NAN)),
        lambda p: Adam(p, eps=NAN),
        lambda p: Adam(p, weight_decay=NAN),
        lambda p: AdamW(p, eps=NAN),
        lambda p: AdamW(p, weight_decay=NAN),
        lambda p: WarmupSchedule(SGD(p, lr=0.1), warmup_steps=NAN),
        lambda p: WarmupSchedule(SGD(p, lr=0.1), warmup_steps=2, total_steps=NAN, decay="cosine"),
    ],
)
def test_nan_hyperparameters_are_refused(make) -> None:
    """nan < 0 is False, so a check written as `x < 0` let nan through and every step made p nan."""
    with pytest.raises(ValueError):
        make([param([0.0])])


def test_a_parameter_listed_twice_is_warned_about_as_in_pytorch():
    """It is stepped once for each copy, each with state of its own: twice the step, silently, until now."""
    p = Tensor(np.ones(2), requires_grad=True)
    with pytest.warns(UserWarning, match="SGD: the parameter list holds a parameter more than once"):
        SGD([p, p], lr=0.1)
