"""Cross-check every norm against PyTorch (``torch.nn.functional`` and ``torch.nn``), float64.

Forward, the gradients of the input, weight and bias, and the running buffers
after a training step, for random shapes and every option. Skipped, with the
reason, when PyTorch is not installed (it is an optional test peer).
"""

from __future__ import annotations

import inspect
import math
import re

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
    ("BatchNorm1d", {"bias": False}, (4, 3, 5)),
    ("BatchNorm3d", {}, (2, 3, 2, 3, 2)),
    ("BatchNorm3d", {"momentum": None, "bias": False}, (3, 2, 2, 2, 2)),
    ("BatchNorm3d", {"affine": False, "track_running_stats": False}, (2, 3, 2, 2, 2)),
    ("InstanceNorm1d", {}, (2, 3, 5)),
    ("InstanceNorm1d", {"affine": True, "track_running_stats": True}, (3, 5)),
    ("InstanceNorm1d", {"affine": True, "bias": False}, (2, 3, 5)),
    ("InstanceNorm2d", {"affine": True, "track_running_stats": True, "momentum": None}, (2, 3, 2, 3)),
    ("InstanceNorm3d", {}, (2, 3, 2, 3, 2)),
    ("InstanceNorm3d", {"affine": True, "track_running_stats": True}, (3, 2, 3, 2)),
    ("InstanceNorm3d", {"affine": True, "bias": False, "track_running_stats": True}, (2, 3, 2, 2, 3)),
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
    unbatched = name.startswith("InstanceNorm") and len(shape) == int(name[-2]) + 1  # (C, *spatial)
    first = shape[-1] if name in ("LayerNorm", "RMSNorm") else shape[0 if unbatched else 1]
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
    ("BatchNorm3d", (3,), {"bias": False}, (2, 3, 2, 2, 2)),
    ("GroupNorm", (2, 4), {}, (3, 4, 5)),
    ("GroupNorm", (2, 4), {"bias": False}, (3, 4, 5)),
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


# -- signatures, reprs and argument checks ------------------------------------------------------------------
FUNCTIONALS = ["layer_norm", "rms_norm", "batch_norm", "instance_norm", "group_norm"]
MODULES = [
    "LayerNorm",
    "RMSNorm",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "InstanceNorm3d",
    "GroupNorm",
]


@pytest.mark.parametrize("name", FUNCTIONALS)
def test_functional_signatures_are_pytorchs(name) -> None:
    """The same parameter names, order, kinds and defaults, so that keyword calls carry over (``mask`` is ours)."""
    ours = inspect.signature(getattr(F, name)).parameters
    theirs = inspect.signature(getattr(TF, name)).parameters
    assert [n for n in ours if n != "mask"] == list(theirs)
    for n, p in theirs.items():
        assert (ours[n].kind, ours[n].default) == (p.kind, p.default), n


@pytest.mark.parametrize("name", MODULES)
def test_module_constructor_signatures_are_pytorchs(name) -> None:
    """PyTorch's names, order, kinds (``bias`` keyword-only where it is) and defaults, ``device`` and ``dtype``
    included, so that a call by position (``LayerNorm(8, 1e-5, True, True, None, np.float64)``) carries over."""
    ours = inspect.signature(getattr(nn, name).__init__).parameters
    theirs = inspect.signature(getattr(torch.nn, name).__init__).parameters
    assert list(ours) == list(theirs)
    for n, p in theirs.items():
        assert (ours[n].kind, ours[n].default) == (p.kind, p.default), n


def test_functionals_take_pytorchs_keywords(rng) -> None:
    x = rng.standard_normal((4, 6, 5))
    w6, b6, w5, b5 = (rng.standard_normal(n) for n in (6, 6, 5, 5))
    rm, rv = rng.standard_normal(6), rng.uniform(0.5, 2.0, 6)
    cases = [
        ("layer_norm", {"normalized_shape": (5,), "weight": w5, "bias": b5, "eps": 1e-3}),
        ("rms_norm", {"normalized_shape": (5,), "weight": w5, "eps": 1e-3}),
        ("batch_norm", {"running_mean": rm, "running_var": rv, "weight": w6, "bias": b6, "training": False}),
        ("instance_norm", {"use_input_stats": True, "weight": w6, "bias": b6, "momentum": 0.2, "eps": 1e-3}),
        ("group_norm", {"num_groups": 3, "weight": w6, "bias": b6, "eps": 1e-3}),
    ]
    for name, kwargs in cases:
        ours = getattr(F, name)(input=x, **kwargs)
        kwargs_t = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
        theirs = getattr(TF, name)(input=torch.tensor(x), **kwargs_t)
        np.testing.assert_allclose(ours.data, theirs.numpy(), atol=1e-12, err_msg=name)


REPRS = [
    ("BatchNorm1d", (4,), {"bias": False}),
    ("BatchNorm2d", (3,), {"affine": False, "momentum": None}),
    ("BatchNorm3d", (3,), {}),
    ("InstanceNorm1d", (3,), {"affine": True, "bias": False, "track_running_stats": True}),
    ("InstanceNorm3d", (3,), {}),
    ("GroupNorm", (2, 4), {"bias": False}),
    ("GroupNorm", (2, 4), {"affine": False}),
    ("LayerNorm", ((2, 3),), {"bias": False}),
    ("LayerNorm", (4,), {"elementwise_affine": False}),
    ("RMSNorm", (4,), {"eps": 1e-6}),
]


@pytest.mark.parametrize("name, args, kwargs", REPRS, ids=[f"{r[0]}-{r[2]}" for r in REPRS])
def test_module_reprs_parameters_and_state_keys_are_pytorchs(name, args, kwargs) -> None:
    ours, theirs = getattr(nn, name)(*args, **kwargs), getattr(torch.nn, name)(*args, **kwargs)
    assert repr(ours) == repr(theirs)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())


@pytest.mark.parametrize(
    "name, shape", [("BatchNorm3d", (2, 3, 4, 5)), ("BatchNorm3d", (1, 2, 3, 4, 5, 6)), ("InstanceNorm3d", (3, 4, 5))]
)
def test_the_3d_modules_refuse_other_ranks_like_pytorch(name, shape) -> None:
    expected = "expected 5D input" if name == "BatchNorm3d" else "expected 4D or 5D input"
    with pytest.raises(ValueError, match=re.escape(f"{expected} (got {len(shape)}D input")):
        getattr(torch.nn, name)(3)(torch.zeros(shape))
    with pytest.raises(ValueError, match=re.escape(f"{name}: {expected} (got {len(shape)}D input")):
        getattr(nn, name)(3)(np.zeros(shape))


X_TORCH_SHAPE = (2, 6, 4)
# (the op and the argument our message names, the call made with ``f`` ours or PyTorch's functional)
WRONG_TYPES = [
    ("batch_norm", "training", lambda f, x, rm, rv: f.batch_norm(x, rm, rv, training="False")),
    ("batch_norm", "training", lambda f, x, rm, rv: f.batch_norm(x, rm, rv, training=1)),
    ("batch_norm", "training", lambda f, x, rm, rv: f.batch_norm(x, rm, rv, training=None)),
    ("instance_norm", "use_input_stats", lambda f, x, rm, rv: f.instance_norm(x, use_input_stats="False")),
    ("instance_norm", "use_input_stats", lambda f, x, rm, rv: f.instance_norm(x, rm, rv, use_input_stats=0)),
    ("batch_norm", "momentum", lambda f, x, rm, rv: f.batch_norm(x, rm, rv, training=True, momentum="0.5")),
    ("batch_norm", "momentum", lambda f, x, rm, rv: f.batch_norm(x, rm, rv, momentum="0.5")),
    ("batch_norm", "momentum", lambda f, x, rm, rv: f.batch_norm(x, rm, rv, momentum=np.array(0.5))),
    ("instance_norm", "momentum", lambda f, x, rm, rv: f.instance_norm(x, rm, rv, momentum=1j)),
    ("layer_norm", "normalized_shape", lambda f, x, rm, rv: f.layer_norm(x, 4.0)),
    ("layer_norm", "normalized_shape", lambda f, x, rm, rv: f.layer_norm(x, None)),
    ("layer_norm", "normalized_shape", lambda f, x, rm, rv: f.layer_norm(x, [4.0])),
    ("rms_norm", "normalized_shape", lambda f, x, rm, rv: f.rms_norm(x, "4")),
    ("group_norm", "num_groups", lambda f, x, rm, rv: f.group_norm(x, 2.0)),
    ("group_norm", "num_groups", lambda f, x, rm, rv: f.group_norm(x, True)),
    ("group_norm", "num_groups", lambda f, x, rm, rv: f.group_norm(x, None)),
]


@pytest.mark.parametrize("op, argument, call", WRONG_TYPES, ids=[str(i) for i in range(len(WRONG_TYPES))])
def test_arguments_of_the_wrong_type_are_refused_like_pytorch(op, argument, call) -> None:
    """TypeError on both sides (ours names the op and the argument), and no running buffer moves."""
    x = np.random.default_rng(0).standard_normal(X_TORCH_SHAPE)
    with pytest.raises(TypeError):
        call(TF, torch.tensor(x), torch.zeros(6, dtype=torch.float64), torch.ones(6, dtype=torch.float64))
    rm, rv = np.zeros(6), np.ones(6)
    with pytest.raises(TypeError, match=f"{op}: {argument}"):
        call(F, x, rm, rv)
    np.testing.assert_array_equal(np.stack([rm, rv]), np.stack([np.zeros(6), np.ones(6)]))


@pytest.mark.parametrize("momentum", [1, np.float32(0.25), np.int64(1), True])
def test_a_momentum_of_any_real_type_is_read_like_pytorch(momentum, rng) -> None:
    x = rng.standard_normal((4, 3, 5))
    for fn, flag in (("batch_norm", "training"), ("instance_norm", "use_input_stats")):
        rm, rv = rng.standard_normal(3), rng.uniform(0.5, 2.0, 3)
        rm_t, rv_t = torch.tensor(rm), torch.tensor(rv)
        getattr(F, fn)(x, rm, rv, **{flag: True, "momentum": momentum})
        getattr(TF, fn)(torch.tensor(x), rm_t, rv_t, **{flag: True, "momentum": momentum})
        np.testing.assert_allclose(rm, rm_t.numpy(), atol=1e-14, err_msg=fn)
        np.testing.assert_allclose(rv, rv_t.numpy(), rtol=1e-12, err_msg=fn)


@pytest.mark.parametrize("flag", [False, True])
def test_numpy_bool_switches_act_as_pytorchs_bools(flag, rng) -> None:
    """Where PyTorch refuses NumPy's bool (docs/derivations.md §6), ours reads it as the Python bool."""
    x = rng.standard_normal((4, 3, 5))
    rm, rv = rng.standard_normal(3), rng.uniform(0.5, 2.0, 3)
    rm_t, rv_t = torch.tensor(rm), torch.tensor(rv)
    y = batch_norm(x, rm, rv, training=np.bool_(flag))
    y_t = TF.batch_norm(torch.tensor(x), rm_t, rv_t, training=flag)
    np.testing.assert_allclose(y.data, y_t.numpy(), atol=1e-12)
    np.testing.assert_allclose(np.stack([rm, rv]), np.stack([rm_t.numpy(), rv_t.numpy()]), atol=1e-14)
    y = instance_norm(x, rm, rv, use_input_stats=np.bool_(flag))
    y_t = TF.instance_norm(torch.tensor(x), rm_t, rv_t, use_input_stats=flag)
    np.testing.assert_allclose(y.data, y_t.numpy(), atol=1e-12)
    np.testing.assert_allclose(np.stack([rm, rv]), np.stack([rm_t.numpy(), rv_t.numpy()]), atol=1e-14)
    with pytest.raises(TypeError, match="must be bool, not numpy.bool"):
        TF.batch_norm(torch.tensor(x), rm_t, rv_t, training=np.bool_(flag))


def test_module_arguments_are_refused_where_pytorch_refuses_them() -> None:
    x = torch.zeros(2, 6, 3)
    # PyTorch's constructor takes these and its forward refuses them; ours refuses them at construction
    with pytest.raises(TypeError, match="num_groups"):
        torch.nn.GroupNorm(2.0, 6)(x)
    with pytest.raises(TypeError, match="GroupNorm: num_groups"):
        nn.GroupNorm(2.0, 6)
    with pytest.raises(TypeError, match="momentum"):
        torch.nn.BatchNorm1d(6, momentum="0.5")(x)
    with pytest.raises(TypeError, match="BatchNorm1d: momentum"):
        nn.BatchNorm1d(6, momentum="0.5")
    # refused by both constructors
    for name, args in [
        ("BatchNorm1d", (3.0,)),
        ("BatchNorm2d", (True,)),
        ("BatchNorm3d", ("3",)),
        ("GroupNorm", (2, 6.0)),
        ("LayerNorm", (4.0,)),
        ("LayerNorm", ([4.0],)),
        ("RMSNorm", (4.0,)),
    ]:
        with pytest.raises(TypeError):
            getattr(torch.nn, name)(*args)
        with pytest.raises(TypeError, match=name):
            getattr(nn, name)(*args)
    # a negative size: PyTorch's RuntimeError, our ValueError (docs/derivations.md §6)
    for name, args in [("BatchNorm1d", (-1,)), ("LayerNorm", ((2, -1),)), ("GroupNorm", (2, -6))]:
        with pytest.raises(RuntimeError, match="negative dimension"):
            getattr(torch.nn, name)(*args)
        with pytest.raises(ValueError, match=f"{name}: .*(negative|>= 0)"):
            getattr(nn, name)(*args)
    with pytest.raises(ValueError, match="training mode is expected to be boolean"):
        torch.nn.BatchNorm1d(3).train("False")
    with pytest.raises(ValueError, match="BatchNorm1d.train: mode must be a bool"):
        nn.BatchNorm1d(3).train("False")


@pytest.mark.filterwarnings("ignore:input's size at dim=1 does not match num_features:UserWarning")
def test_instance_norm_module_refuses_another_channel_count_like_pytorch() -> None:
    """With running statistics only, PyTorch's RuntimeError comes from its buffer check and ours is the
    ValueError of the affine case (docs/derivations.md §6, "Exception classes")."""
    x = np.zeros((2, 10, 5))
    with pytest.raises(RuntimeError, match="running_mean should contain"):
        torch.nn.InstanceNorm1d(12, track_running_stats=True)(torch.tensor(x))
    with pytest.raises(ValueError, match=re.escape("InstanceNorm1d: expected input's size at dim 1 to match num_f")):
        nn.InstanceNorm1d(12, track_running_stats=True)(x)
    with pytest.raises(ValueError, match="num_features"):
        torch.nn.InstanceNorm1d(12, affine=True)(torch.tensor(x))
    with pytest.raises(ValueError, match="InstanceNorm1d: .*num_features"):
        nn.InstanceNorm1d(12, affine=True)(x)


# -- loading a state dict ----------------------------------------------------------------------------------------
class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(3, dtype=np.float64)
        self.ln = nn.LayerNorm(4, dtype=np.float64)


class _NetTorch(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = torch.nn.BatchNorm2d(3, dtype=torch.float64)
        self.ln = torch.nn.LayerNorm(4, dtype=torch.float64)


def _load_both(state: dict[str, np.ndarray], **kwargs):
    """Load ``state`` (plain dicts, no version metadata) into fresh nets, counters at 5; the nets and results."""
    ours, theirs = _Net(), _NetTorch()
    ours.bn.num_batches_tracked[...] = 5
    theirs.bn.num_batches_tracked.fill_(5)
    result = ours.load_state_dict(state, **kwargs)
    result_t = theirs.load_state_dict({k: torch.tensor(v) for k, v in state.items()}, **kwargs)
    return ours, theirs, result, result_t


def _same_state(ours: nn.Module, theirs) -> None:
    state, state_t = ours.state_dict(), theirs.state_dict()
    assert sorted(state) == sorted(state_t)
    for k in state:
        np.testing.assert_array_equal(state[k], state_t[k].numpy(), err_msg=k)


def test_load_state_dict_like_pytorch(rng) -> None:
    full = {k: rng.standard_normal(v.shape) for k, v in _Net().state_dict().items() if k != "bn.num_batches_tracked"}
    # no num_batches_tracked, strict: both keep their count (PyTorch fills it when there is no version)
    ours, theirs, result, result_t = _load_both(full)
    assert result == ([], []) and tuple(result_t) == ([], [])
    assert ours.bn.num_batches_tracked == 5
    _same_state(ours, theirs)
    # not strict: the same keys left out, the same entries loaded
    partial = {k: v for k, v in full.items() if not k.startswith("ln.")} | {"head.weight": np.zeros(2)}
    ours, theirs, result, result_t = _load_both(partial, strict=False)
    assert sorted(result.missing_keys) == sorted(result_t.missing_keys) == ["ln.bias", "ln.weight"]
    assert result.unexpected_keys == result_t.unexpected_keys == ["head.weight"]
    _same_state(ours, theirs)


@pytest.mark.parametrize("strict", [True, False])
def test_a_bad_state_dict_raises_pytorchs_runtime_error(strict, rng) -> None:
    state = {k: rng.standard_normal(v.shape) for k, v in _Net().state_dict().items()}
    del state["ln.bias"]
    state["extra"] = np.zeros(1)
    state["bn.weight"] = np.zeros(4)
    with pytest.raises(RuntimeError) as info_t:
        _NetTorch().load_state_dict({k: torch.tensor(v) for k, v in state.items()}, strict=strict)
    with pytest.raises(RuntimeError) as info:
        _Net().load_state_dict(state, strict=strict)
    torch_message, message = str(info_t.value), str(info.value)
    assert message.startswith("Error(s) in loading state_dict for _Net:")
    for line in ('Missing key(s) in state_dict: "ln.bias".', 'Unexpected key(s) in state_dict: "extra".'):
        assert (line in message) == (line in torch_message) == strict, line
    mismatch = "size mismatch for bn.weight: copying a param with shape "
    assert mismatch in message and mismatch in torch_message
    assert "(4,) from checkpoint, the shape in current model is (3,)." in message
