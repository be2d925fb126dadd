"""Cross-check every norm against PyTorch (``torch.nn.functional`` and ``torch.nn``), float64.

Forward, the gradients of the input, weight and bias, and the running buffers
after a training step, for random shapes and every option. Skipped, with the
reason, when PyTorch is not installed (it is an optional test peer).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minigrad_norm.functional as F
from minigrad_norm import nn
from minigrad_norm.norms import batch_norm, group_norm, instance_norm, layer_norm, rms_norm
from minigrad_norm.tensor import Tensor, grad
from minigrad_norm.testing import channel_shapes, ensure_spread, layer_norm_shapes

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the cross-checks against it are skipped")
TF = torch.nn.functional

pytestmark = pytest.mark.torch


def _both(fn_ours, fn_torch, arrays: list[np.ndarray | None], g: np.ndarray, atol: float = 1e-12) -> None:
    rtol = 1e-9 if atol < 1e-6 else 1e-4
    """Run both implementations on the same arrays (None = absent) and compare y and every gradient."""
    ours = [None if a is None else Tensor(a, requires_grad=True) for a in arrays]
    theirs = [None if a is None else torch.tensor(a, requires_grad=True) for a in arrays]
    y = fn_ours(*ours)
    yt = fn_torch(*theirs)
    np.testing.assert_allclose(y.data, yt.detach().numpy(), atol=atol, rtol=rtol)
    present = [i for i, a in enumerate(arrays) if a is not None]
    grads = grad(y, [ours[i] for i in present], g)
    grads_t = torch.autograd.grad(yt, [theirs[i] for i in present], torch.tensor(g))
    for i, a, e in zip(present, grads, grads_t):
        np.testing.assert_allclose(a, e.numpy(), atol=atol, rtol=rtol, err_msg=f"gradient of input {i}")


def _affine(rng: np.random.Generator, shape, mode: str):
    w = rng.standard_normal(shape) if mode in ("weight", "both") else None
    b = rng.standard_normal(shape) if mode in ("bias", "both") else None
    return w, b


AFFINE = st.sampled_from(["none", "weight", "bias", "both"])
SEED = st.integers(0, 2**31 - 1)


@given(shapes=layer_norm_shapes(max_norm_dims=3), mode=AFFINE, eps=st.sampled_from([1e-5, 0.1]), seed=SEED)
def test_layer_norm(shapes, mode, eps, seed) -> None:
    shape, ns = shapes
    rng = np.random.default_rng(seed)
    w, b = _affine(rng, ns, mode)
    _both(
        lambda x, w, b: layer_norm(x, ns, w, b, eps),
        lambda x, w, b: TF.layer_norm(x, ns, w, b, eps),
        [rng.standard_normal(shape), w, b],
        rng.standard_normal(shape),
    )


@given(shapes=layer_norm_shapes(max_norm_dims=3), affine=st.booleans(), eps=st.sampled_from([None, 1e-6]), seed=SEED)
def test_rms_norm(shapes, affine, eps, seed) -> None:
    shape, ns = shapes
    rng = np.random.default_rng(seed)
    _both(
        lambda x, w: rms_norm(x, ns, w, eps),
        lambda x, w: TF.rms_norm(x, ns, w, eps),
        [rng.standard_normal(shape), rng.standard_normal(ns) if affine else None],
        rng.standard_normal(shape),
    )


@given(
    shape=channel_shapes(min_batch=2),
    mode=AFFINE,
    training=st.booleans(),
    momentum=st.sampled_from([0.1, 0.5, 1.0]),
    seed=SEED,
)
def test_batch_norm_forward_gradients_and_running_buffers(shape, mode, training, momentum, seed) -> None:
    rng = np.random.default_rng(seed)
    c = shape[1]
    w, b = _affine(rng, (c,), mode)
    rm, rv = rng.standard_normal(c), rng.uniform(0.5, 2.0, c)
    rm_t, rv_t = torch.tensor(rm), torch.tensor(rv)
    _both(
        lambda x, w, b: batch_norm(x, rm, rv, w, b, training, momentum),
        lambda x, w, b: TF.batch_norm(x, rm_t, rv_t, w, b, training, momentum),
        [rng.standard_normal(shape) * 2 + 1, w, b],
        rng.standard_normal(shape),
    )
    np.testing.assert_allclose(rm, rm_t.numpy(), atol=1e-14, rtol=1e-12)
    np.testing.assert_allclose(rv, rv_t.numpy(), atol=1e-14, rtol=1e-12)


@given(
    shape=channel_shapes(min_spatial=2),
    mode=AFFINE,
    tracked=st.booleans(),
    use_input_stats=st.booleans(),
    seed=SEED,
)
def test_instance_norm(shape, mode, tracked, use_input_stats, seed) -> None:
    rng = np.random.default_rng(seed)
    c = shape[1]
    w, b = _affine(rng, (c,), mode)
    if not tracked and not use_input_stats:
        use_input_stats = True  # without buffers there is nothing else to normalize with
    rm, rv = (rng.standard_normal(c), rng.uniform(0.5, 2.0, c)) if tracked else (None, None)
    rm_t, rv_t = (torch.tensor(rm), torch.tensor(rv)) if tracked else (None, None)
    _both(
        lambda x, w, b: instance_norm(x, rm, rv, w, b, use_input_stats, 0.3),
        lambda x, w, b: TF.instance_norm(x, rm_t, rv_t, w, b, use_input_stats, 0.3),
        [rng.standard_normal(shape), w, b],
        rng.standard_normal(shape),
    )
    if tracked:
        np.testing.assert_allclose(rm, rm_t.numpy(), atol=1e-14, rtol=1e-12)
        np.testing.assert_allclose(rv, rv_t.numpy(), atol=1e-14, rtol=1e-12)


@given(shape=channel_shapes(), mode=AFFINE, data=st.data(), seed=SEED)
def test_group_norm(shape, mode, data, seed) -> None:
    c = shape[1]
    groups = data.draw(st.sampled_from([g for g in range(1, c + 1) if c % g == 0]))
    rng = np.random.default_rng(seed)
    w, b = _affine(rng, (c,), mode)
    if shape[0] * (c // groups) * math.prod(shape[2:]) == 1:  # one sample, one value per group: both refuse
        with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
            TF.group_norm(torch.zeros(shape, dtype=torch.float64), groups)
        with pytest.raises(ValueError, match="group_norm: Expected more than 1 value per channel"):
            group_norm(np.zeros(shape), groups)
        return
    _both(
        lambda x, w, b: group_norm(x, groups, w, b),
        # torch 2.13's group_norm backward fails ("tensor does not have a device") for a bias without a
        # weight, so torch gets the equivalent explicit weight of ones there
        lambda x, w, b: TF.group_norm(x, groups, torch.ones(c, dtype=x.dtype) if w is None and b is not None else w, b),
        [rng.standard_normal(shape), w, b],
        rng.standard_normal(shape),
    )


MODULE_PAIRS = [
    ("BatchNorm1d", {}, (4, 3)),
    ("BatchNorm1d", {"momentum": None}, (4, 3, 5)),
    ("BatchNorm1d", {"affine": False, "track_running_stats": False}, (4, 3, 2)),
    ("BatchNorm2d", {"momentum": None}, (2, 3, 2, 3)),
    ("BatchNorm2d", {"eps": 1e-3, "momentum": 0.5}, (2, 3, 2, 2)),
    ("InstanceNorm1d", {}, (2, 3, 5)),
    ("InstanceNorm1d", {"affine": True, "track_running_stats": True}, (3, 5)),
    ("InstanceNorm2d", {"affine": True, "track_running_stats": True, "momentum": None}, (2, 3, 2, 3)),
    ("LayerNorm", {}, (2, 3, 4)),
    ("LayerNorm", {"bias": False, "eps": 1e-3}, (2, 3, 4)),
    ("RMSNorm", {}, (2, 3, 4)),
    ("RMSNorm", {"eps": 1e-4, "elementwise_affine": False}, (2, 3, 4)),
]


def _step_like_pytorch(ours, theirs, x: np.ndarray, g: np.ndarray) -> None:
    """One forward and backward of each module on x (upstream gradient g): the same output, gradients of
    x and of every parameter, and state (buffers, num_batches_tracked) after it."""
    xo, xt = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    y, yt = ours(xo), theirs(xt)
    np.testing.assert_allclose(y.data, yt.detach().numpy(), atol=1e-12, rtol=1e-10)
    got = grad(y, [xo, *ours.parameters()], g)
    want = torch.autograd.grad(yt, [xt, *theirs.parameters()], torch.tensor(g))
    for a, e in zip(got, want):
        np.testing.assert_allclose(a, e.numpy(), atol=1e-11, rtol=1e-9)
    state, state_t = ours.state_dict(), theirs.state_dict()
    assert sorted(state) == sorted(state_t)
    for k in state:
        np.testing.assert_allclose(state[k], state_t[k].numpy(), atol=1e-13, rtol=1e-12, err_msg=k)


@pytest.mark.parametrize("name, kwargs, shape", MODULE_PAIRS, ids=[f"{m[0]}-{m[1]}" for m in MODULE_PAIRS])
def test_modules_over_train_and_eval_steps(name, kwargs, shape, rng) -> None:
    first = (
        shape[-1]
        if name in ("LayerNorm", "RMSNorm")
        else (shape[0] if len(shape) == 2 and "Instance" in name else shape[1])
    )
    ours = getattr(nn, name)(first, dtype=np.float64, **kwargs)
    theirs = getattr(torch.nn, name)(first, dtype=torch.float64, **kwargs)
    for p, pt in zip(ours.parameters(), theirs.parameters()):  # random parameters, the same on both sides
        p.data[...] = rng.standard_normal(p.shape)
        pt.data[...] = torch.tensor(p.data)
    for step in range(4):
        if step == 3:
            ours.eval()
            theirs.eval()
        x = rng.standard_normal(shape) * (step + 1) + step
        g = rng.standard_normal(shape)
        _step_like_pytorch(ours, theirs, x, g)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_nan_and_inf_propagate_like_pytorch(rng) -> None:
    x = rng.standard_normal((3, 2, 4))
    x[0, 1, 2], x[2, 0, 0] = math.nan, math.inf
    g = rng.standard_normal(x.shape)
    cases = [
        (lambda t: layer_norm(t, 4), lambda t: TF.layer_norm(t, (4,))),
        (lambda t: rms_norm(t, 4), lambda t: TF.rms_norm(t, (4,))),
        (lambda t: batch_norm(t, None, None, training=True), lambda t: TF.batch_norm(t, None, None, training=True)),
        (lambda t: instance_norm(t), lambda t: TF.instance_norm(t)),
        (lambda t: group_norm(t, 2), lambda t: TF.group_norm(t, 2)),
    ]
    for ours, theirs in cases:
        xo, xt = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        y, yt = ours(xo), theirs(xt)
        dx = grad(y, [xo], g)[0]
        (dxt,) = torch.autograd.grad(yt, [xt], torch.tensor(g))
        np.testing.assert_allclose(y.data, yt.detach().numpy(), atol=1e-12)  # NaN where torch has NaN
        np.testing.assert_allclose(dx, dxt.numpy(), atol=1e-12)


@given(shape=channel_shapes(min_batch=2, min_spatial=2), seed=SEED)
def test_float32_within_float32_tolerance_of_pytorch(shape, seed) -> None:
    rng = np.random.default_rng(seed)
    # spread within every (n, c): a near-constant group makes dx a cancellation of terms ~rstd, and float32
    # PyTorch (accumulating in float32) and we (in float64) then differ by far more than float32 rounding
    x = ensure_spread(rng.standard_normal(shape) * 3 + 5, tuple(range(2, len(shape))), min_std=0.5).astype(np.float32)
    w = rng.standard_normal(shape[1]).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    for ours, theirs in [
        (
            lambda t, w: batch_norm(t, None, None, w, training=True),
            lambda t, w: TF.batch_norm(t, None, None, w, training=True),
        ),
        (lambda t, w: instance_norm(t, weight=w), lambda t, w: TF.instance_norm(t, weight=w)),
        (lambda t, w: group_norm(t, 1, w), lambda t, w: TF.group_norm(t, 1, w)),
    ]:
        _both(ours, theirs, [x, w], g, atol=2e-4)


# -- an empty batch --------------------------------------------------------------------------------------------
# name: (the norm, called as ``norm(F, x, w, b, running_mean, running_var)`` with F ours or torch's, x's shape)
EMPTY_FUNCTIONALS = {
    "layer_norm": (lambda f, x, w, b, rm, rv: f.layer_norm(x, (5,), w, b), (0, 3, 5)),
    "rms_norm": (lambda f, x, w, b, rm, rv: f.rms_norm(x, (5,), w), (0, 3, 5)),
    "layer_norm, D = 0": (lambda f, x, w, b, rm, rv: f.layer_norm(x, (0,), w, b), (2, 3, 0)),
    "rms_norm, D = 0": (lambda f, x, w, b, rm, rv: f.rms_norm(x, (0,), w), (2, 3, 0)),
    "group_norm": (lambda f, x, w, b, rm, rv: f.group_norm(x, 2, w, b), (0, 4, 5)),
    "group_norm, one value per group": (lambda f, x, w, b, rm, rv: f.group_norm(x, 4, w, b), (0, 4)),
    "batch_norm train": (lambda f, x, w, b, rm, rv: f.batch_norm(x, rm, rv, w, b, True, 0.5), (0, 4, 5)),
    "batch_norm train (N, C)": (lambda f, x, w, b, rm, rv: f.batch_norm(x, rm, rv, w, b, True, 0.5), (0, 4)),
    "batch_norm train, S = 0": (lambda f, x, w, b, rm, rv: f.batch_norm(x, rm, rv, w, b, True, 0.5), (2, 4, 0)),
    "batch_norm eval": (lambda f, x, w, b, rm, rv: f.batch_norm(x, rm, rv, w, b, False), (0, 4, 2, 2)),
    "instance_norm": (lambda f, x, w, b, rm, rv: f.instance_norm(x, rm, rv, w, b, True, 0.5), (0, 4, 5)),
    "instance_norm, running stats": (
        lambda f, x, w, b, rm, rv: f.instance_norm(x, rm, rv, w, b, False, 0.5),
        (0, 4, 5),
    ),
}


@pytest.mark.parametrize("name", list(EMPTY_FUNCTIONALS))
def test_empty_batch_like_pytorch(name, rng) -> None:
    """An empty output, an empty dx, dweight = dbias = 0, and the running buffers as they were."""
    norm, shape = EMPTY_FUNCTIONALS[name]
    affine_shape = shape[-1:] if name.startswith(("layer_norm", "rms_norm")) else shape[1:2]
    # torch 2.13's instance_norm raises IndexError on an empty batch with a weight or bias: without them here
    w, b = _affine(rng, affine_shape, "none" if name.startswith("instance_norm") else "both")
    rm, rv = rng.standard_normal(4), rng.uniform(0.5, 2.0, 4)
    rm_t, rv_t = torch.tensor(rm), torch.tensor(rv)
    before = rm.copy(), rv.copy()
    _both(
        lambda x, w, b: norm(F, x, w, b, rm, rv),
        lambda x, w, b: norm(TF, x, w, b, rm_t, rv_t),
        [np.zeros(shape), w, None if name.startswith("rms_norm") else b],
        np.zeros(shape),
    )
    for ours, theirs, old in zip((rm, rv), (rm_t, rv_t), before):
        np.testing.assert_array_equal(ours, old)
        if name == "instance_norm":  # torch averages no instance statistic into its buffers: NaN (docs §6)
            assert torch.isnan(theirs).all()
        else:
            np.testing.assert_array_equal(theirs.numpy(), old)


EMPTY_MODULES = [  # (PyTorch's InstanceNorm modules raise IndexError on an empty batch: not compared)
    ("BatchNorm1d", (3,), {"momentum": 0.5}, (5, 3, 4)),
    ("BatchNorm1d", (3,), {"momentum": None}, (5, 3)),
    ("BatchNorm2d", (3,), {"affine": False}, (2, 3, 2, 2)),
    ("BatchNorm1d", (3,), {"track_running_stats": False}, (5, 3)),
    ("GroupNorm", (2, 4), {}, (3, 4, 5)),
    ("LayerNorm", (5,), {}, (2, 3, 5)),
    ("RMSNorm", (5,), {}, (2, 3, 5)),
]


@pytest.mark.parametrize("name, args, kwargs, shape", EMPTY_MODULES, ids=[f"{m[0]}-{m[2]}" for m in EMPTY_MODULES])
def test_module_over_empty_and_real_batches_like_pytorch(name, args, kwargs, shape, rng) -> None:
    """Train on an empty batch, a real one, an empty one, then eval on an empty one: the same outputs,
    gradients and state (an empty training batch counts in num_batches_tracked, moves no buffer)."""
    ours = getattr(nn, name)(*args, dtype=np.float64, **kwargs)
    theirs = getattr(torch.nn, name)(*args, dtype=torch.float64, **kwargs)
    for p, pt in zip(ours.parameters(), theirs.parameters()):
        p.data[...] = rng.standard_normal(p.shape)
        pt.data[...] = torch.tensor(p.data)
    empty = (0, *shape[1:])
    for step, batch in enumerate([empty, shape, empty, empty]):
        if step == 3:
            ours.eval()
            theirs.eval()
        x, g = rng.standard_normal(batch) + 1, rng.standard_normal(batch)
        _step_like_pytorch(ours, theirs, x, g)


@pytest.mark.parametrize("given", ["running_mean", "running_var"])
@pytest.mark.parametrize("fn", ["batch_norm", "instance_norm"])
def test_a_lone_running_buffer_is_refused_like_pytorch(fn, given) -> None:
    x = np.zeros((2, 3, 4))
    buffers = {"running_mean": None, "running_var": None, given: np.ones(3)}
    message = "running_mean and running_var must either both be None or neither be None"
    buffers_t = [None if v is None else torch.tensor(v) for v in buffers.values()]
    with pytest.raises(ValueError, match=message):
        getattr(TF, fn)(torch.tensor(x), *buffers_t, None, None, True)
    with pytest.raises(ValueError, match=f"{fn}: {message}"):
        getattr(F, fn)(x, *buffers.values(), None, None, True)
