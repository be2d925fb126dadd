"""Every norm and option: gradcheck, and four Jacobians that must agree.

For each configuration (hypothesis draws the shapes, the data, the affine
options and eps) the Jacobian with respect to the input is computed four
independent ways: the closed form (``minigrad_norm.jacobians``), reverse mode
(the hand-derived backward), central finite differences and the complex step.
The complex step has no subtraction, so it must match the closed form to
~1e-13; the central differences to their truncation error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from minigrad_norm import jacobians, nn, ops
from minigrad_norm.gradcheck import gradcheck, jacobian, numerical_jacobian
from minigrad_norm.nn import functional_call
from minigrad_norm.norms import batch_norm, group_norm, instance_norm, layer_norm, rms_norm
from minigrad_norm.norms._jacobian import full_jacobian
from minigrad_norm.tensor import Tensor, grad
from minigrad_norm.testing import arrays, channel_shapes, ensure_spread, layer_norm_shapes, masks, spread_arrays

KINDS = [
    "layer_norm",
    "rms_norm",
    "batch_norm train",
    "batch_norm eval",
    "batch_norm masked",
    "instance_norm",
    "instance_norm running",
    "instance_norm masked",
    "group_norm",
]


@dataclass
class Case:
    """A norm as a function of (x, *affine params), and its closed-form Jacobian w.r.t. x as a full matrix."""

    fn: Callable[..., Tensor]
    inputs: tuple[Tensor, ...]
    closed: Callable[[np.ndarray], np.ndarray]


def _affine(data: st.DataObject, shape: tuple[int, ...], with_bias: bool = True) -> tuple[np.ndarray | None, ...]:
    choice = data.draw(st.sampled_from(["none", "weight", "both", "bias"] if with_bias else ["none", "weight"]))
    w = data.draw(arrays(shape, low=-2, high=2)) if choice in ("weight", "both") else None
    b = data.draw(arrays(shape, low=-2, high=2)) if choice in ("bias", "both") else None
    return w, b


def _pack(x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None) -> tuple[tuple[Tensor, ...], Callable]:
    """Inputs (x, [w], [b]) as Tensors requiring grad, and a function putting them back in their slots."""
    present = [v for v in (w, b) if v is not None]
    tensors = tuple(Tensor(v, requires_grad=True) for v in (x, *present))

    def unpack(params: tuple[Tensor, ...]) -> tuple[Tensor | None, Tensor | None]:
        it = iter(params)
        return (next(it) if w is not None else None), (next(it) if b is not None else None)

    return tensors, unpack


def _running(data: st.DataObject, c: int) -> tuple[np.ndarray, np.ndarray]:
    return data.draw(arrays((c,), low=-1, high=1)), data.draw(arrays((c,), low=0.5, high=2.0))


def draw_case(kind: str, data: st.DataObject) -> Case:
    eps = data.draw(st.sampled_from([1e-5, 1e-2]))
    if kind in ("layer_norm", "rms_norm"):
        # groups of one value have a zero Jacobian, which no gradcheck can tell from a wrong one
        x_shape, ns = data.draw(layer_norm_shapes(max_lead_dims=2, max_norm_dims=2, max_side=3, min_group=2))
        x = data.draw(spread_arrays(x_shape, tuple(range(len(x_shape) - len(ns), len(x_shape)))))
        w, b = _affine(data, ns, with_bias=kind == "layer_norm")
        inputs, unpack = _pack(x, w, b)
        d = math.prod(ns)
        view = (x.size // d, 1, d, 1)
        if kind == "layer_norm":
            return Case(
                lambda x, *p: layer_norm(x, ns, *unpack(p), eps=eps),
                inputs,
                lambda x: full_jacobian(jacobians.layer_norm(x, ns, w, eps), view, False),
            )
        return Case(
            lambda x, *p: rms_norm(x, ns, unpack(p)[0], eps=eps),
            inputs,
            lambda x: full_jacobian(jacobians.rms_norm(x, ns, w, eps), view, False),
        )
    if kind == "group_norm":
        n, g, k = (data.draw(st.integers(1, 3)) for _ in range(3))
        spatial = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
        s = math.prod(spatial)
        if k * s < 2:
            k += 1
        x = data.draw(spread_arrays((n, g, k * s), 2)).reshape(n, g * k, *spatial)
        w, b = _affine(data, (g * k,))
        inputs, unpack = _pack(x, w, b)
        return Case(
            lambda x, *p: group_norm(x, g, *unpack(p), eps=eps),
            inputs,
            lambda x: full_jacobian(jacobians.group_norm(x, g, w, eps), (n, g, k, s), False),
        )

    batch = kind.startswith("batch")
    masked = kind.endswith("masked")
    shape = data.draw(channel_shapes(max_spatial_dims=2, max_side=3, min_spatial=1 if batch and not masked else 2))
    if batch and not masked and shape[0] * math.prod(shape[2:]) < 2:
        shape = (shape[0] + 1, *shape[1:])
    n, c = shape[:2]
    s = math.prod(shape[2:])
    view = (n, c, 1, s)
    stat_axes = tuple(ax for ax in range(len(shape)) if ax != 1 and (batch or ax != 0))
    mask = data.draw(masks((n, *shape[2:]))) if masked else None
    x = ensure_spread(data.draw(arrays(shape)), stat_axes, mask=None if mask is None else mask[:, None])
    w, b = _affine(data, (c,))
    inputs, unpack = _pack(x, w, b)
    # eval-mode BatchNorm and InstanceNorm without input statistics: running statistics as constants
    fixed = kind in ("batch_norm eval", "instance_norm running")
    rm, rv = _running(data, c) if fixed else (None, None)
    if batch:
        fn = lambda x, *p: batch_norm(x, rm, rv, *unpack(p), training=not fixed, eps=eps, mask=mask)  # noqa: E731
        jac = lambda x: jacobians.batch_norm(  # noqa: E731
            x, w, eps, training=not fixed, running_mean=rm, running_var=rv, mask=mask
        )
    else:
        fn = lambda x, *p: instance_norm(x, rm, rv, *unpack(p), use_input_stats=not fixed, eps=eps, mask=mask)  # noqa: E731
        jac = lambda x: jacobians.instance_norm(  # noqa: E731
            x, w, eps, mask=mask, use_input_stats=not fixed, running_mean=rm, running_var=rv
        )
    return Case(fn, inputs, lambda x: full_jacobian(jac(x), view, batch))


@pytest.mark.parametrize("kind", KINDS)
@given(data=st.data())
def test_gradcheck_every_input(kind: str, data: st.DataObject) -> None:
    """gradcheck on x and the affine parameters. A draw whose x-Jacobian lies entirely below gradcheck's atol
    cannot tell a right gradient from none (gradcheck warns), and is drawn again: two values per group, where
    xhat is +-sqrt(var / (var + eps)) whatever x is, and dy/dx about eps / var."""
    case = draw_case(kind, data)
    assume(np.abs(case.closed(case.inputs[0].data)).max() >= 1e-5)
    assert gradcheck(case.fn, case.inputs, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
@given(data=st.data())
def test_closed_form_equals_reverse_mode_central_and_complex_step(kind: str, data: st.DataObject) -> None:
    case = draw_case(kind, data)
    x = case.inputs[0]
    closed = case.closed(x.data)
    scale = max(1.0, float(np.abs(closed).max()))
    fn_of_x = lambda t: case.fn(t, *case.inputs[1:])  # noqa: E731

    reverse = jacobian(fn_of_x, [x])[0]
    np.testing.assert_allclose(reverse, closed, rtol=0, atol=1e-12 * scale)
    central = numerical_jacobian(fn_of_x, [x], method="central")[0]
    np.testing.assert_allclose(central, closed, rtol=0, atol=1e-6 * scale)
    complex_step = numerical_jacobian(fn_of_x, [x], method="complex")[0]
    np.testing.assert_allclose(complex_step, closed, rtol=0, atol=1e-13 * scale)


def _layer_norm_from_primitives(x: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
    """LayerNorm over the last axis as a chain of primitive ops: the chain rule does the backward."""
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    var = (xc * xc).mean(axis=-1, keepdims=True)
    return xc / ops.sqrt(var + eps) * w + b


@given(
    shape=layer_norm_shapes(max_lead_dims=2, max_norm_dims=1, max_side=5).map(lambda t: t[0]),
    data=st.data(),
    eps=st.sampled_from([1e-5, 0.1]),
)
def test_fused_layer_norm_equals_primitive_chain(shape: tuple[int, ...], data: st.DataObject, eps: float) -> None:
    d = shape[-1]
    x = Tensor(data.draw(spread_arrays(shape, -1)), requires_grad=True)
    w = Tensor(data.draw(arrays((d,))), requires_grad=True)
    b = Tensor(data.draw(arrays((d,))), requires_grad=True)
    g = data.draw(arrays(shape))  # a random upstream gradient: a plain sum has zero gradient through a norm
    fused = layer_norm(x, d, w, b, eps)
    chain = _layer_norm_from_primitives(x, w, b, eps)
    np.testing.assert_allclose(fused.data, chain.data, rtol=1e-12, atol=1e-12)
    for gf, gc in zip(grad(fused, [x, w, b], g), grad(chain, [x, w, b], g)):
        np.testing.assert_allclose(gf, gc, rtol=1e-10, atol=1e-11)


MODULES = [
    ("LayerNorm", lambda: nn.LayerNorm((3, 4), dtype=np.float64), (2, 3, 4)),
    ("LayerNorm no bias", lambda: nn.LayerNorm(4, bias=False, dtype=np.float64), (3, 4)),
    ("RMSNorm", lambda: nn.RMSNorm(4, eps=1e-6, dtype=np.float64), (3, 4)),
    ("BatchNorm1d train", lambda: nn.BatchNorm1d(3, dtype=np.float64), (4, 3, 2)),
    ("BatchNorm1d momentum None", lambda: nn.BatchNorm1d(3, momentum=None, dtype=np.float64), (5, 3)),
    ("BatchNorm2d eval", lambda: nn.BatchNorm2d(3, dtype=np.float64).eval(), (2, 3, 2, 2)),
    (
        "BatchNorm1d eval untracked",
        lambda: nn.BatchNorm1d(2, track_running_stats=False, dtype=np.float64).eval(),
        (3, 2, 2),
    ),
    ("InstanceNorm1d affine", lambda: nn.InstanceNorm1d(2, affine=True, dtype=np.float64), (2, 2, 4)),
    (
        "InstanceNorm2d tracked eval",
        lambda: nn.InstanceNorm2d(2, affine=True, track_running_stats=True, dtype=np.float64).eval(),
        (2, 2, 2, 2),
    ),
    ("InstanceNorm1d unbatched", lambda: nn.InstanceNorm1d(2, dtype=np.float64), (2, 5)),
    ("GroupNorm", lambda: nn.GroupNorm(2, 4, dtype=np.float64), (2, 4, 3)),
]


@pytest.mark.parametrize("name, make, shape", MODULES, ids=[m[0] for m in MODULES])
def test_module_gradcheck_with_respect_to_input_and_parameters(name: str, make, shape, rng) -> None:
    module = make()
    names = [n for n, _ in module.named_parameters()]
    values = [
        Tensor(rng.uniform(0.5, 1.5, p.shape) * rng.choice([-1, 1], p.shape), requires_grad=True)
        for p in module.parameters()
    ]
    stat_axes = tuple(range(2, len(shape))) if "InstanceNorm" in name and len(shape) > 2 else -1
    if "BatchNorm" in name:
        stat_axes = tuple(ax for ax in range(len(shape)) if ax != 1)
    x = Tensor(ensure_spread(rng.standard_normal(shape), stat_axes), requires_grad=True)

    def fn(x: Tensor, *params: Tensor) -> Tensor:
        return functional_call(module, dict(zip(names, params)), x)

    assert gradcheck(fn, [x, *values], atol=1e-6, rtol=1e-4)
