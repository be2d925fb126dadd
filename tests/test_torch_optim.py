"""Parameter groups, state dicts and the warmup schedule against torch.optim (float64)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is the optional cross-check peer for optimizers")

from minigrad_norm.nn import Linear  # noqa: E402
from minigrad_norm.optim import SGD, Adam, AdamW, WarmupSchedule  # noqa: E402
from minigrad_norm.tensor import Tensor  # noqa: E402

pytestmark = pytest.mark.torch

SHAPES = [(3, 4), (4,), (2, 2, 3), (5,)]

# Two groups: the first with the defaults, the second (norm gains and biases, say) with no weight decay and its own
# lr. The rows hold (ours, torch's, the constructor's arguments).
OPTIMIZERS = [
    (SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.1}),
    (SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1}),
    (SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.8, "dampening": 0.3}),
    (Adam, torch.optim.Adam, {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1}),
    (AdamW, torch.optim.AdamW, {"lr": 3e-2, "betas": (0.9, 0.95), "weight_decay": 0.2}),
]
IDS = ["sgd", "sgd-nesterov", "sgd-dampening", "adam", "adamw"]


def groups(params: list) -> list[dict[str, Any]]:
    return [{"params": params[:3]}, {"params": params[3:], "lr": 0.02, "weight_decay": 0.0}]


def gradients(steps: int) -> list[list[np.ndarray | None]]:
    """A gradient per parameter and step; parameter 1 has none at step 2, and parameter 3 none at step 0 (its state
    starts a step late)."""
    rng = np.random.default_rng(0)
    grads: list[list[np.ndarray | None]] = [[rng.standard_normal(s) for s in SHAPES] for _ in range(steps)]
    grads[2][1] = grads[0][3] = None
    return grads


def make(ours_cls, torch_cls, kwargs):
    rng = np.random.default_rng(1)
    ours = [Tensor(rng.standard_normal(s), requires_grad=True) for s in SHAPES]
    theirs = [torch.tensor(p.data.copy(), requires_grad=True) for p in ours]
    return ours, theirs, ours_cls(groups(ours), **kwargs), torch_cls(groups(theirs), **kwargs, foreach=False)


def step_both(ours, theirs, opt, topt, grads) -> None:
    for step_grads in grads:
        for p, tp, g in zip(ours, theirs, step_grads, strict=True):
            p.grad, tp.grad = (None, None) if g is None else (g.copy(), torch.tensor(g))
        opt.step()
        topt.step()


def assert_same(ours, theirs, rtol: float = 1e-12) -> None:
    for p, tp in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(p.data, tp.detach().numpy(), rtol=rtol, atol=rtol)


def to_torch(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Our state dict with its arrays as tensors (the step stays a number: torch's load makes it a tensor)."""
    state = {
        k: {key: torch.tensor(v) if isinstance(v, np.ndarray) else v for key, v in s.items()}
        for k, s in state_dict["state"].items()
    }
    return {"state": state, "param_groups": state_dict["param_groups"]}


@pytest.mark.parametrize(("ours_cls", "torch_cls", "kwargs"), OPTIMIZERS, ids=IDS)
def test_parameter_groups_step_as_torch(ours_cls, torch_cls, kwargs) -> None:
    ours, theirs, opt, topt = make(ours_cls, torch_cls, kwargs)
    step_both(ours, theirs, opt, topt, gradients(6))
    assert_same(ours, theirs)
    state, torch_state = opt.state_dict(), topt.state_dict()
    assert list(state["state"]) == list(torch_state["state"])  # the same parameters have state, numbered alike
    for k, s in state["state"].items():
        assert list(s) == list(torch_state["state"][k])  # under the same names
        for key, value in s.items():
            np.testing.assert_allclose(value, torch_state["state"][k][key].numpy(), rtol=1e-12, atol=1e-15)
    for group, torch_group in zip(state["param_groups"], torch_state["param_groups"], strict=True):
        assert group == {key: torch_group[key] for key in group}  # ours are a subset of torch's keys


@pytest.mark.parametrize(("ours_cls", "torch_cls", "kwargs"), OPTIMIZERS, ids=IDS)
def test_state_dicts_load_into_each_other(ours_cls, torch_cls, kwargs) -> None:
    """3 steps in one framework, its state dict loaded into the other's fresh optimizer, 3 more steps there."""
    grads = gradients(6)
    ours, theirs, opt, topt = make(ours_cls, torch_cls, kwargs)
    step_both(ours, theirs, opt, topt, grads[:3])
    ours2, theirs2, opt2, topt2 = make(ours_cls, torch_cls, {**kwargs, "lr": 1.0})  # the lr comes from the dict
    for p, q, tp, tq in zip(ours, ours2, theirs, theirs2, strict=True):
        q.data[...] = p.data
        with torch.no_grad():
            tq.copy_(tp)
    topt2.load_state_dict(to_torch(opt.state_dict()))  # ours into torch
    opt2.load_state_dict(topt.state_dict())  # torch's into ours, as it is (its tensors read as arrays)
    step_both(ours, theirs2, opt, topt2, grads[3:])
    step_both(ours2, theirs, opt2, topt, grads[3:])
    assert_same(ours, theirs2)
    assert_same(ours2, theirs)
    assert all(type(s["step"]) is int for s in opt2.state.values() if "step" in s)


@pytest.mark.parametrize(
    ("warmup", "total", "decay"), [(3, 0, "constant"), (2, 7, "linear"), (3, 8, "cosine"), (0, 5, "cosine")]
)
def test_warmup_schedule_sets_each_group_as_lambda_lr(warmup, total, decay) -> None:
    """Ours steps before each optimizer step, LambdaLR after: the k-th step (from 1) runs at factor(k) both ways."""
    ours, theirs, opt, topt = make(AdamW, torch.optim.AdamW, {"lr": 1e-2})
    schedule = WarmupSchedule(opt, warmup, total, decay)
    torch_schedule = torch.optim.lr_scheduler.LambdaLR(topt, lambda e: schedule.factor(e + 1))
    for step_grads in gradients(10):
        lrs = schedule.step()
        assert lrs == [group["lr"] for group in topt.param_groups]
        assert math.isclose(lrs[1], 0.02 * schedule.factor(schedule.count), rel_tol=1e-15)
        step_both(ours, theirs, opt, topt, [step_grads])
        torch_schedule.step()
    assert_same(ours, theirs)
    assert [g["initial_lr"] for g in opt.param_groups] == [g["initial_lr"] for g in topt.param_groups] == [1e-2, 0.02]


@pytest.mark.parametrize(
    ("torch_cls", "torch_kwargs", "ours_cls", "option"),
    [
        (torch.optim.Adam, {"amsgrad": True}, Adam, "amsgrad=True"),
        (torch.optim.SGD, {"lr": 0.1, "maximize": True}, SGD, "maximize=True"),
        (torch.optim.AdamW, {}, Adam, "decoupled_weight_decay=True"),  # PyTorch's AdamW into our Adam
        (torch.optim.Adam, {}, AdamW, "decoupled_weight_decay=False"),
    ],
)
def test_a_torch_state_dict_with_an_update_we_do_not_compute_is_refused(torch_cls, torch_kwargs, ours_cls, option):
    # it was loaded and its option ignored: the steps after it then differed from PyTorch's, silently
    tp = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    topt = torch_cls([tp], **torch_kwargs)
    tp.grad = torch.ones_like(tp)
    topt.step()
    p = Tensor(np.ones(2), requires_grad=True)
    opt = ours_cls([p])
    with pytest.raises(ValueError, match=rf"loaded parameter group 0: {option} is not implemented"):
        opt.load_state_dict(topt.state_dict())
    assert opt.state == {} and "amsgrad" not in opt.param_groups[0]  # nothing was loaded


def named_linears(ours_cls, torch_cls, kwargs, split: bool):
    """Our Linear(3, 2) and torch's, equal, with optimizers given named_parameters(), as one group or split into
    two (the bias without weight decay)."""
    ours = Linear(3, 2, dtype=np.float64, rng=np.random.default_rng(7))
    theirs = torch.nn.Linear(3, 2, dtype=torch.float64)
    with torch.no_grad():
        for p, tp in zip(ours.parameters(), theirs.parameters(), strict=True):
            tp.copy_(torch.tensor(p.data))

    def params(model):
        pairs = list(model.named_parameters())
        return [{"params": pairs[:1]}, {"params": pairs[1:], "weight_decay": 0.0}] if split else pairs

    return ours, theirs, ours_cls(params(ours), **kwargs), torch_cls(params(theirs), **kwargs, foreach=False)


def linear_grads(steps: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(8)
    return [[rng.standard_normal((2, 3)), rng.standard_normal(2)] for _ in range(steps)]


@pytest.mark.parametrize("split", [False, True], ids=["one-group", "two-groups"])
@pytest.mark.parametrize(("ours_cls", "torch_cls", "kwargs"), OPTIMIZERS, ids=IDS)
def test_named_parameters_step_and_save_their_names_as_torch(ours_cls, torch_cls, kwargs, split) -> None:
    ours, theirs, opt, topt = named_linears(ours_cls, torch_cls, kwargs, split)
    step_both(ours.parameters(), list(theirs.parameters()), opt, topt, linear_grads(4))
    assert_same(ours.parameters(), list(theirs.parameters()))
    state, torch_state = opt.state_dict(), topt.state_dict()
    assert [g["param_names"] for g in state["param_groups"]] == [g["param_names"] for g in torch_state["param_groups"]]
    for group, torch_group in zip(state["param_groups"], torch_state["param_groups"], strict=True):
        assert group == {key: torch_group[key] for key in group}


@pytest.mark.parametrize("split", [False, True], ids=["one-group", "two-groups"])
@pytest.mark.parametrize(("ours_cls", "torch_cls", "kwargs"), OPTIMIZERS, ids=IDS)
def test_named_state_dicts_load_into_each_other(ours_cls, torch_cls, kwargs, split) -> None:
    """As test_state_dicts_load_into_each_other, named: the names come along both ways."""
    grads = linear_grads(6)
    ours, theirs, opt, topt = named_linears(ours_cls, torch_cls, kwargs, split)
    step_both(ours.parameters(), list(theirs.parameters()), opt, topt, grads[:3])
    ours2, theirs2, opt2, topt2 = named_linears(ours_cls, torch_cls, {**kwargs, "lr": 1.0}, split)
    for p, q, tp, tq in zip(
        ours.parameters(), ours2.parameters(), theirs.parameters(), theirs2.parameters(), strict=True
    ):
        q.data[...] = p.data
        with torch.no_grad():
            tq.copy_(tp)
    topt2.load_state_dict(to_torch(opt.state_dict()))
    opt2.load_state_dict(topt.state_dict())
    assert [g["param_names"] for g in opt2.param_groups] == [g["param_names"] for g in topt2.param_groups]
    step_both(ours.parameters(), list(theirs2.parameters()), opt, topt2, grads[3:])
    step_both(ours2.parameters(), list(theirs.parameters()), opt2, topt, grads[3:])
    assert_same(ours.parameters(), list(theirs2.parameters()))
    assert_same(ours2.parameters(), list(theirs.parameters()))


@pytest.mark.parametrize(
    "make",
    [
        lambda a, b: [("a", a), b],
        lambda a, b: [{"params": [a]}, {"params": [("b", b)]}],
        lambda a, b: [{"params": [("a", a)]}, {"params": [b]}],
    ],
    ids=["within-a-group", "named-after-unnamed", "unnamed-after-named"],
)
def test_mixing_named_and_unnamed_parameters_is_refused_as_torch(make) -> None:
    with pytest.raises(ValueError, match="all optimizer param") as torch_error:
        torch.optim.SGD(make(torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)), lr=0.1)
    with pytest.raises(type(torch_error.value), match="SGD: parameter group"):
        SGD(make(Tensor(np.zeros(1), requires_grad=True), Tensor(np.zeros(1), requires_grad=True)), lr=0.1)
