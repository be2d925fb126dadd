"""Optimizer update rules against closed forms worked out by hand (no PyTorch needed)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from minigrad_norm.nn import Linear
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
    assert AdamW([param([0.0])]).param_groups[0]["weight_decay"] == 0.01  # PyTorch's default


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
    assert b.data[0] == 1.0 and opt.state[a]["step"] == 1 and b not in opt.state
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
    assert [s.step() for _ in range(6)] == [[0.25], [0.5], [0.75], [1.0], [1.0], [1.0]]  # the lr of each group
    opt = SGD([param([0.0])], lr=2.0)
    s = WarmupSchedule(opt, warmup_steps=2, total_steps=6, decay="linear")
    # the decay counts from the step before: the last of the 6 steps still moves (0.5), 0 would be the 7th
    assert [s.step()[0] for _ in range(8)] == pytest.approx([1.0, 2.0, 2.0, 1.5, 1.0, 0.5, 0.0, 0.0])
    opt = SGD([param([0.0])], lr=1.0)
    s = WarmupSchedule(opt, warmup_steps=1, total_steps=3, decay="cosine")
    assert [s.step()[0] for _ in range(3)] == pytest.approx([1.0, 1.0, 0.5])  # (1 + cos(pi u)) / 2, u = 0, 1/2
    s = WarmupSchedule(SGD([param([0.0])], lr=1.0), warmup_steps=0, total_steps=1, decay="cosine")
    assert s.step() == [1.0]  # a run of one step moves
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
    with pytest.raises(TypeError, match="SGD: params must be an iterable of Tensors or dicts, got a Tensor of shape"):
        SGD(param([0.0]), lr=0.1)
    with pytest.raises(TypeError, match="SGD: parameter 1 is a dict, not a Tensor"):  # Tensors, then a group
        SGD([param([0.0]), {"params": [param([0.0])], "lr": 0.1}], lr=0.1)
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
    """It is stepped once for each copy (with its one state, as PyTorch): twice the step, silently, until then."""
    p = Tensor(np.ones(2), requires_grad=True)
    with pytest.warns(UserWarning, match="SGD: parameter group 0 holds a parameter more than once"):
        SGD([p, p], lr=0.1)
    with pytest.warns(UserWarning, match="Adam: parameter group 1 holds a parameter more than once"):
        Adam([{"params": [param([0.0])]}, {"params": [p, p]}])
    with pytest.warns(UserWarning, match="SGD: parameter group 1 holds a parameter more than once") as record:
        SGD([param([0.0])]).add_param_group({"params": [p, p]})
    assert record[0].filename == __file__  # the caller's line, as from the constructor
    # its state dict numbers it by its first place, as PyTorch's (which lists it twice as well)
    q = param([3.0])
    with pytest.warns(UserWarning):
        opt = SGD([p, q, p], lr=0.1, momentum=0.9)
    p.grad, q.grad = np.ones(2), np.ones(1)
    opt.step()
    saved = opt.state_dict()
    assert saved["param_groups"][0]["params"] == [0, 1, 0] and sorted(saved["state"]) == [0, 1]


# -- parameter groups and state dicts ----------------------------------------------------------------------


def test_each_group_steps_with_its_own_hyperparameters_the_rest_the_defaults() -> None:
    """The GPT-style split: weights decay, norm gains and biases (weight_decay 0) do not; zero gradients, so
    AdamW only shrinks p by (1 - lr wd)."""
    w, gain = param([2.0, -4.0]), param([1.0])
    opt = AdamW([{"params": [w]}, {"params": gain, "weight_decay": 0.0}], lr=0.1, weight_decay=0.5)
    assert opt.defaults == {"lr": 0.1, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.5}
    assert opt.param_groups == [
        {**opt.defaults, "params": [w]},
        {**opt.defaults, "weight_decay": 0.0, "params": [gain]},  # a lone Tensor becomes a list
    ]
    for _ in range(2):
        w.grad, gain.grad = np.zeros(2), np.zeros(1)
        opt.step()
    np.testing.assert_allclose(w.data, np.array([2.0, -4.0]) * (1 - 0.1 * 0.5) ** 2, rtol=1e-15)
    assert gain.data[0] == 1.0
    a, b = param([0.0]), param([0.0])
    opt = SGD([{"params": [a], "lr": 0.5}, {"params": [b]}], lr=0.1)  # a group's lr, then the default
    a.grad, b.grad = np.array([1.0]), np.array([1.0])
    opt.step()
    assert a.data[0] == -0.5 and b.data[0] == -0.1


@pytest.mark.parametrize("make", [lambda ps: SGD(ps, lr=0.1), lambda ps: AdamW(ps, lr=0.1)], ids=["sgd", "adamw"])
def test_optimizer_lr_raises_rather_than_being_silently_ignored(make) -> None:
    p = param([1.0])
    opt = make([p])
    with pytest.raises(AttributeError, match=r"no single lr: .*param_groups\[i\]\['lr'\]"):
        opt.lr = 0.0  # would otherwise leave the groups' lr at 0.1
    with pytest.raises(AttributeError, match="no single lr"):
        _ = opt.lr
    assert opt.param_groups[0]["lr"] == 0.1


def test_a_group_asking_for_an_update_we_do_not_compute_is_refused() -> None:
    with pytest.raises(ValueError, match=r"Adam parameter group 0: amsgrad=True is not implemented"):
        Adam([{"params": [param([1.0])], "amsgrad": True}])
    with pytest.raises(ValueError, match=r"AdamW parameter group 1: decoupled_weight_decay=False is not"):
        AdamW([{"params": [param([1.0])]}, {"params": [param([2.0])], "decoupled_weight_decay": False}])
    opt = SGD([{"params": [param([1.0])], "maximize": False, "foreach": None}], lr=0.1)  # the values we compute
    assert opt.param_groups[0]["foreach"] is None


def test_add_param_group_steps_the_new_parameters_from_then_on() -> None:
    a, b = param([0.0]), param([0.0])
    opt = SGD([a], lr=0.1, momentum=0.9)
    opt.add_param_group({"params": b, "lr": 1.0, "extra": "kept"})  # unknown keys are kept, as in PyTorch
    defaults = {"lr": 0.1, "momentum": 0.9, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False}
    assert opt.param_groups[1] == {**defaults, "lr": 1.0, "extra": "kept", "params": [b]}
    a.grad, b.grad = np.array([1.0]), np.array([2.0])
    opt.step()
    assert a.data[0] == -0.1 and b.data[0] == -2.0
    opt.zero_grad()  # every group's
    assert a.grad is None and b.grad is None


def test_state_is_keyed_by_the_parameter_under_pytorch_s_names() -> None:
    a, b = param([1.0, 2.0]), param([3.0])
    adam = Adam([{"params": [a]}, {"params": [b]}], lr=0.1)
    a.grad = np.array([0.5, -0.5])
    adam.step()
    adam.step()
    assert list(adam.state) == [a] and list(adam.state[a]) == ["step", "exp_avg", "exp_avg_sq"]
    assert adam.state[a]["step"] == 2 and type(adam.state[a]["step"]) is int
    np.testing.assert_allclose(adam.state[a]["exp_avg"], (1 - 0.9**2) * a.grad, rtol=1e-15)
    sgd = SGD([a, b], lr=0.1, momentum=0.9)
    sgd.step()
    assert list(sgd.state) == [a] and sgd.state[a]["momentum_buffer"].tolist() == [0.5, -0.5]
    plain = SGD([a, b], lr=0.1)
    plain.step()
    assert plain.state == {}  # no momentum, no state (as PyTorch's)


def test_a_step_in_any_group_is_counted_so_an_older_graph_cannot_backward() -> None:
    a, b = param([1.0]), param([2.0])
    loss = (a * b).sum()
    opt = SGD([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1)
    b.grad = np.array([1.0])
    opt.step()
    with pytest.raises(RuntimeError, match="was modified in place after the forward"):
        loss.backward()


def two_groups(cls, **kwargs):
    rng = np.random.default_rng(3)
    params = [param(rng.standard_normal(s)) for s in [(3, 2), (2,), (4,)]]
    groups = [{"params": params[:2]}, {"params": params[2:], "lr": 0.05, "weight_decay": 0.0}]
    return params, cls(groups, **kwargs)


ROUND_TRIPS = [
    (SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1}),
    (SGD, {"lr": 0.1, "momentum": 0.8, "dampening": 0.3}),
    (Adam, {"lr": 0.01, "weight_decay": 0.1}),
    (AdamW, {"lr": 0.01, "betas": (0.8, 0.99), "weight_decay": 0.2}),
]


def steps(params, opt, grads) -> None:
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = None if g is None else g.copy()
        opt.step()


@pytest.mark.parametrize(("cls", "kwargs"), ROUND_TRIPS)
def test_state_dict_round_trip_continues_bit_for_bit(cls, kwargs) -> None:
    """3 steps, save, a fresh optimizer on fresh copies loads it, 3 more: equal to 6 steps without the break."""
    rng = np.random.default_rng(4)
    shapes = [(3, 2), (2,), (4,)]
    grads = [[rng.standard_normal(s) for s in shapes] for _ in range(6)]
    grads[1][2] = None  # a parameter without a gradient on one step: its step count lags behind
    grads[0][1] = None  # and one whose state starts at the second step
    params, opt = two_groups(cls, **kwargs)
    steps(params, opt, grads)
    resumed, first = two_groups(cls, **kwargs)
    steps(resumed, first, grads[:3])
    saved = first.state_dict()
    copies = [param(p.data.copy()) for p in resumed]
    second = cls([{"params": copies[:2]}, {"params": copies[2:]}], lr=1.0)  # hyperparameters come from the dict
    second.load_state_dict(saved)
    assert second.param_groups[1]["lr"] == 0.05 and second.param_groups[1]["params"] == copies[2:]
    steps(copies, second, grads[3:])
    for p, q in zip(params, copies, strict=True):
        np.testing.assert_array_equal(p.data, q.data)


def test_state_dict_is_pytorch_s_format_and_a_copy_both_ways() -> None:
    params, opt = two_groups(AdamW, lr=0.01)
    params[0].grad, params[2].grad = np.ones((3, 2)), np.ones(4)
    opt.step()
    saved = opt.state_dict()
    assert saved["param_groups"] == [
        {"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01, "params": [0, 1]},
        {"lr": 0.05, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "params": [2]},
    ]
    assert list(saved["state"]) == [0, 2] and saved["state"][2]["step"] == 1
    saved["state"][0]["exp_avg"] += 1.0  # the returned arrays are copies
    assert opt.state[params[0]]["exp_avg"][0, 0] == pytest.approx(0.1)
    opt.load_state_dict(saved)
    saved["state"][0]["exp_avg"] += 1.0  # and so are the loaded ones
    assert opt.state[params[0]]["exp_avg"][0, 0] == pytest.approx(1.1)


def test_load_state_dict_casts_to_the_parameter_s_dtype_and_the_step_to_int() -> None:
    p = Tensor(np.ones(2, dtype=np.float32), requires_grad=True)
    opt = Adam([p])
    opt.load_state_dict(
        {
            "state": {0: {"step": np.float32(3.0), "exp_avg": np.full(2, 0.1), "exp_avg_sq": [0.01, 0.02]}},
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "params": [0]}],
        }
    )
    state = opt.state[p]
    assert state["step"] == 3 and type(state["step"]) is int
    assert state["exp_avg"].dtype == np.float32 and state["exp_avg_sq"].dtype == np.float32
    p.grad = np.ones(2, dtype=np.float32)
    opt.step()
    assert state["step"] == 4 and p.dtype == np.float32


A = param([0.0])


def sgd_groups(*groups: object, lr: float = 0.1):
    return lambda: SGD(list(groups), lr=lr)


GROUP_ERRORS = [
    (
        sgd_groups({"params": [A]}, {"params": [param([1.0]), A]}),
        ValueError,
        "SGD: parameter 2 (shape (1,)) is in parameter group 0 too",
    ),
    (sgd_groups({"params": [A]}, {"lr": 0.1}), KeyError, "SGD: parameter group 1 has no 'params'"),
    (sgd_groups({"params": [A]}, [param([0.0])]), TypeError, "SGD: parameter group 1 is a list, not a dict"),
    (sgd_groups({"params": {A}}), TypeError, "SGD: parameter group 0's params are a set"),
    (sgd_groups({"params": [A]}, {"params": ["w"]}), TypeError, "SGD: parameter 1 is a str, not a Tensor"),
    (sgd_groups({"params": [A * 2.0]}), ValueError, "SGD: can't optimize a non-leaf Tensor (parameter 0"),
    (sgd_groups({"params": [A], "lr": NAN}), ValueError, "SGD parameter group 0: invalid learning rate lr=nan"),
    (sgd_groups({"params": [A], "lr": 0.1}, lr=-1.0), ValueError, "SGD: invalid learning rate lr=-1.0"),  # defaults too
    (sgd_groups({"params": [A], "momentum": NAN}), ValueError, "SGD parameter group 0: momentum (nan)"),
    (sgd_groups({"params": [A], "momentum": 0.9, "dampening": NAN}), ValueError, "SGD parameter group 0: dampening"),
    (sgd_groups({"params": [A], "nesterov": True}), ValueError, "SGD parameter group 0: nesterov momentum requires"),
    (
        lambda: Adam([{"params": [A]}, {"params": [param([0.0])], "betas": (0.9, NAN)}]),
        ValueError,
        "Adam parameter group 1: betas must be in [0, 1), got (0.9, nan)",
    ),
    (lambda: Adam([{"params": [A], "eps": NAN}]), ValueError, "Adam parameter group 0: eps (nan)"),
    (
        lambda: AdamW([{"params": [A], "weight_decay": NAN}]),
        ValueError,
        "AdamW parameter group 0: eps (1e-08) and weight_decay (nan)",
    ),
]


@pytest.mark.parametrize(("make", "error", "message"), GROUP_ERRORS)
def test_bad_parameter_groups_are_refused_naming_the_optimizer_and_the_problem(make, error, message) -> None:
    with pytest.raises(error, match=re.escape(message)):
        make()


def test_add_param_group_refuses_a_parameter_already_in_a_group() -> None:
    a = param([0.0])
    opt = Adam([a])
    with pytest.raises(ValueError, match=r"Adam: parameter 1 \(shape \(1,\)\) is in parameter group 0 too"):
        opt.add_param_group({"params": [a]})
    with pytest.raises(ValueError, match="Adam parameter group 1: invalid learning rate lr=nan"):
        opt.add_param_group({"params": [param([0.0])], "lr": NAN})
    assert len(opt.param_groups) == 1


def test_bad_state_dicts_are_refused_and_change_nothing() -> None:
    params, opt = two_groups(Adam, lr=0.01)
    for p in params:
        p.grad = np.ones(p.shape)
    opt.step()
    good = opt.state_dict()
    groups, state = opt.param_groups, opt.state
    one_group = {"state": {}, "param_groups": [{**good["param_groups"][0], "params": [0, 1, 2]}]}
    sizes = {"state": {}, "param_groups": [{**good["param_groups"][0], "params": [0]}, good["param_groups"][1]]}
    nan_lr = {**good, "param_groups": [good["param_groups"][0], {**good["param_groups"][1], "lr": NAN}]}
    wrong_shape = {**good, "state": {**good["state"], 1: {**good["state"][1], "exp_avg": np.zeros(3)}}}
    transposed = {**good, "state": {**good["state"], 0: {**good["state"][0], "exp_avg": np.zeros((2, 3))}}}
    hyperparameters = [{k: v for k, v in g.items() if k != "params"} for g in groups]
    stray = {**good, "state": {**good["state"], 7: good["state"][2]}}
    for bad, message in [
        (one_group, r"Adam: loaded state dict has a different number of parameter groups \(1, the optimizer 2\)"),
        (
            sizes,
            r"Adam: loaded state dict contains a parameter group that doesn't match the size of optimizer's group "
            r"\(group 0: 1 parameters, the optimizer's 2\)",
        ),
        (nan_lr, "Adam loaded parameter group 1: invalid learning rate lr=nan"),
        (wrong_shape, r"Adam: loaded exp_avg of parameter 1 has shape \(3,\), the parameter \(2,\)"),
        (transposed, r"Adam: loaded exp_avg of parameter 0 has shape \(2, 3\), the parameter \(3, 2\)"),
        (stray, "Adam: loaded state dict has state for parameter 7, which no group lists"),
    ]:
        with pytest.raises(ValueError, match=message):
            opt.load_state_dict(bad)
        assert opt.param_groups is groups and opt.state is state
        assert [{k: v for k, v in g.items() if k != "params"} for g in groups] == hyperparameters  # nor in place


def test_warmup_schedule_sets_every_group_from_its_own_base_lr() -> None:
    a, b = param([0.0]), param([0.0])
    opt = SGD([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=2.0)
    s = WarmupSchedule(opt, warmup_steps=2, total_steps=4, decay="linear")
    assert [group["initial_lr"] for group in opt.param_groups] == [2.0, 0.5]  # the base lrs, as PyTorch keeps them
    assert [s.step() for _ in range(4)] == [[1.0, 0.25], [2.0, 0.5], [2.0, 0.5], [1.0, 0.25]]
    assert [group["lr"] for group in opt.param_groups] == [1.0, 0.25]
    resumed = SGD([{"params": [a]}, {"params": [b]}], lr=0.1)
    resumed.load_state_dict(opt.state_dict())
    s = WarmupSchedule(resumed, warmup_steps=2)
    assert s.base_lrs == [2.0, 0.5] and s.step() == [1.0, 0.25]  # from the saved base lrs, not the decayed lrs
    resumed.add_param_group({"params": [param([0.0])]})
    with pytest.raises(ValueError, match="WarmupSchedule: the optimizer has 3 parameter groups, 2 when the schedule"):
        s.step()


# -- named parameters -------------------------------------------------------------------------------------


def linears() -> tuple[Linear, Linear]:
    """Two equal Linear(3, 2) in float64."""
    a, b = (Linear(3, 2, dtype=np.float64, rng=np.random.default_rng(5)) for _ in range(2))
    return a, b


@pytest.mark.parametrize(("cls", "kwargs"), ROUND_TRIPS)
def test_named_parameters_step_exactly_as_the_parameters(cls, kwargs) -> None:
    """model.named_parameters() (PyTorch 2.13 takes it): it was refused, "parameter 0 is a tuple"."""
    named, plain = linears()
    opt_named, opt_plain = cls(named.named_parameters(), **kwargs), cls(plain.parameters(), **kwargs)
    (group,), (plain_group,) = opt_named.param_groups, opt_plain.param_groups
    assert group == {**plain_group, "params": [named.weight, named.bias], "param_names": ["weight", "bias"]}
    rng = np.random.default_rng(6)
    grads = [[rng.standard_normal((2, 3)), rng.standard_normal(2)] for _ in range(3)]
    steps(named.parameters(), opt_named, grads)
    steps(plain.parameters(), opt_plain, grads)
    for p, q in zip(named.parameters(), plain.parameters(), strict=True):
        np.testing.assert_array_equal(p.data, q.data)
    saved, saved_plain = opt_named.state_dict(), opt_plain.state_dict()
    assert saved["param_groups"] == [{**saved_plain["param_groups"][0], "param_names": ["weight", "bias"]}]
    for k, state in saved["state"].items():
        assert list(state) == list(saved_plain["state"][k])
        for key, value in state.items():
            np.testing.assert_array_equal(value, saved_plain["state"][k][key])


def test_named_groups_keep_their_names_through_a_state_dict() -> None:
    a, b = linears()
    groups = [{"params": [("weight", a.weight)]}, {"params": [("bias", a.bias)], "weight_decay": 0.0}]
    opt = AdamW(groups, lr=0.1)
    opt.add_param_group({"params": b.named_parameters(), "lr": 0.2})
    assert [g["param_names"] for g in opt.param_groups] == [["weight"], ["bias"], ["weight", "bias"]]
    for p in [*a.parameters(), *b.parameters()]:
        p.grad = np.ones(p.shape)
    opt.step()
    saved = opt.state_dict()
    assert [g["param_names"] for g in saved["param_groups"]] == [["weight"], ["bias"], ["weight", "bias"]]
    assert [g["params"] for g in saved["param_groups"]] == [[0], [1], [2, 3]]
    c, d = linears()
    resumed = AdamW(
        [{"params": [("weight", c.weight)]}, {"params": [("bias", c.bias)]}, {"params": d.named_parameters()}]
    )
    resumed.load_state_dict(saved)
    assert resumed.param_groups[1]["weight_decay"] == 0.0 and resumed.param_groups[2]["lr"] == 0.2
    np.testing.assert_array_equal(resumed.state[d.bias]["exp_avg"], opt.state[b.bias]["exp_avg"])


def test_load_state_dict_matches_parameters_by_place_not_name_as_pytorch() -> None:
    """A saved group's names replace the optimizer's; a group saved without names keeps the optimizer's."""
    a, b = linears()
    named = SGD(a.named_parameters(), lr=0.1, momentum=0.9)
    a.weight.grad, a.bias.grad = np.ones((2, 3)), np.ones(2)
    named.step()
    plain = SGD(b.parameters(), lr=0.5, momentum=0.9)
    plain.load_state_dict(named.state_dict())  # named into unnamed: the names come along
    assert plain.param_groups[0]["param_names"] == ["weight", "bias"] and plain.param_groups[0]["lr"] == 0.1
    renamed = SGD([("w", b.weight), ("b", b.bias)], lr=0.5, momentum=0.9)
    renamed.load_state_dict(named.state_dict())  # other names: loaded by place, the saved names replacing them
    assert renamed.param_groups[0]["param_names"] == ["weight", "bias"]
    np.testing.assert_array_equal(renamed.state[b.bias]["momentum_buffer"], np.ones(2))
    renamed = SGD([("w", b.weight), ("b", b.bias)], lr=0.5)
    renamed.load_state_dict(SGD(a.parameters(), lr=0.2).state_dict())  # unnamed into named: its names are kept
    assert renamed.param_groups[0]["param_names"] == ["w", "b"] and renamed.param_groups[0]["lr"] == 0.2


B = param([0.0])


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([("a", A), B], "SGD: parameter group 0 names some of its parameters, not all"),
        ([{"params": [A]}, {"params": [("b", B)]}], "SGD: parameter group 1 is named and group 0 is not"),
        ([{"params": [("a", A)]}, {"params": [B]}], "SGD: parameter group 1 is unnamed and group 0 is not"),
        ([{"params": [("a", A)]}, {"params": [B], "param_names": ["b"]}], None),  # names of its own, as PyTorch
    ],
)
def test_named_and_unnamed_parameters_do_not_mix_as_in_pytorch(groups, message) -> None:
    if message is None:
        assert SGD(groups, lr=0.1).param_groups[1]["param_names"] == ["b"]
        return
    with pytest.raises(ValueError, match=re.escape(message)):
        SGD(groups, lr=0.1)


def test_a_named_parameter_is_a_pair() -> None:
    with pytest.raises(
        TypeError, match=r"SGD: parameter group 0: a named parameter is a \(name, Tensor\) pair, got a tuple of 3"
    ):
        SGD([("w", param([1.0]), "extra")], lr=0.1)


def test_add_param_group_refuses_an_unnamed_group_after_a_named_one() -> None:
    opt = SGD([("a", A)], lr=0.1)
    with pytest.raises(ValueError, match="SGD: parameter group 1 is unnamed and group 0 is not; every group must"):
        opt.add_param_group({"params": [B]})
    with pytest.raises(ValueError, match="SGD: parameter group 1 names some of its parameters, not all"):
        opt.add_param_group({"params": [("b", B), param([1.0])]})
    assert len(opt.param_groups) == 1
