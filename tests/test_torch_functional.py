"""The engine's activations, softmax, linear, embedding and loss against torch.nn.functional, and pow's
edge cases against torch.pow (float64)."""

import numpy as np
import pytest

import minigrad_norm.functional as F
from minigrad_norm import Tensor

torch = pytest.importorskip("torch", reason="PyTorch is an optional test peer: pip install torch==2.13.0")
TF = torch.nn.functional


def both(fn_ours, fn_torch, *arrays, int_args=()):
    """Run both frameworks on the same float64 inputs with the same random upstream gradient."""
    ours = [Tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    y = fn_ours(*ours, *int_args)
    yt = fn_torch(*theirs, *(torch.tensor(i) for i in int_args))
    g = np.random.default_rng(7).standard_normal(y.shape)
    y.backward(g)
    yt.backward(torch.tensor(g))
    np.testing.assert_allclose(y.data, yt.detach().numpy(), rtol=1e-12, atol=1e-13)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.grad, b.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.fixture
def x(rng):
    return rng.standard_normal((3, 4, 5)) * 3


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(x, approximate):
    both(lambda t: F.gelu(t, approximate=approximate), lambda t: TF.gelu(t, approximate=approximate), x)


def test_relu(x):
    both(F.relu, TF.relu, x)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_and_log_softmax(x, axis):
    both(lambda t: F.softmax(t, axis=axis), lambda t: TF.softmax(t, dim=axis), x)
    both(lambda t: F.log_softmax(t, axis=axis), lambda t: TF.log_softmax(t, dim=axis), x)


def test_linear(x, rng):
    both(F.linear, TF.linear, x, rng.standard_normal((6, 5)), rng.standard_normal(6))


def test_embedding(rng):
    idx = np.array([[0, 3, 3], [1, 0, 2]])
    both(lambda w: F.embedding(idx, w), lambda w: TF.embedding(torch.tensor(idx), w), rng.standard_normal((4, 3)))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_ignore_index_and_spatial_dims(rng, reduction):
    logits = rng.standard_normal((4, 5, 3))
    targets = rng.integers(0, 5, (4, 3))
    targets[1, 2] = targets[3, 0] = -100
    both(
        lambda z, t: F.cross_entropy(z, t, reduction=reduction),
        lambda z, t: TF.cross_entropy(z, t, reduction=reduction),
        logits,
        int_args=(targets,),
    )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_with_class_weights_and_label_smoothing(rng, reduction, label_smoothing, weighted):
    logits = rng.standard_normal((4, 5, 3))
    targets = rng.integers(0, 5, (4, 3))
    targets[1, 2] = -100
    weight = rng.uniform(0.1, 2.0, 5) if weighted else None
    both(
        lambda z, t: F.cross_entropy(z, t, weight, reduction=reduction, label_smoothing=label_smoothing),
        lambda z, t: TF.cross_entropy(
            z,
            t,
            None if weight is None else torch.tensor(weight),
            reduction=reduction,
            label_smoothing=label_smoothing,
        ),
        logits,
        int_args=(targets,),
    )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_every_target_ignored(rng, reduction):
    """The mean is 0 / 0 = nan, as torch's, but the gradient is zeros (it was 0 * inf = nan)."""
    both(
        lambda z, t: F.cross_entropy(z, t, reduction=reduction),
        lambda z, t: TF.cross_entropy(z, t, reduction=reduction),
        rng.standard_normal((3, 4)),
        int_args=(np.full(3, -100),),
    )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("bad", [-np.inf, np.inf, np.nan])
def test_cross_entropy_ignores_a_row_whatever_its_logits(reduction, bad):
    """An ignored row may pick log p = -inf (or nan) at the placeholder class 0: its loss is still 0.

    The backward follows torch too: finite for -inf, nan in the ignored row for inf or nan.
    """
    logits = np.array([[0.0, 1.0, 2.0], [bad, 0.0, 1.0]])
    with np.errstate(invalid="ignore"):  # +inf: the log-softmax of that row is inf - inf = nan
        both(
            lambda z, t: F.cross_entropy(z, t, reduction=reduction),
            lambda z, t: TF.cross_entropy(z, t, reduction=reduction),
            logits,
            int_args=(np.array([1, -100]),),
        )
        loss = F.cross_entropy(Tensor(logits), np.array([1, -100]), reduction=reduction).data
    nll = np.log(1 + np.e + np.e**2) - 1  # -log softmax([0, 1, 2])[1]
    expected = {"mean": nll, "sum": nll, "none": [nll, 0.0]}
    np.testing.assert_allclose(loss, expected[reduction], rtol=1e-12)


@pytest.mark.parametrize("form", ["tensor ** tensor", "tensor ** number", "number ** tensor"])
def test_pow_at_zero_and_negative_bases(form):
    """Every base in {-2, -0.5, 0, 0.5, 2} against every exponent in {-1, 0, 0.5, 1, 2, 3}.

    torch masks x^0 (base gradient 0, not 0 * 0^-1 = nan) and 0^p for p >= 0 (exponent
    gradient 0, not 0 * log 0 = nan); elsewhere its nan and inf are the formulas' own, and ours
    must be the same, so the comparison includes them (assert_allclose treats nan as equal to nan).
    """
    bases = [-2.0, -0.5, 0.0, 0.5, 2.0]
    exponents = [-1.0, 0.0, 0.5, 1.0, 2.0, 3.0]
    with np.errstate(invalid="ignore", divide="ignore"):  # our forwards: 0^-1 = inf, (-2)^0.5 = nan
        if form == "tensor ** tensor":
            a, b = np.meshgrid(bases, exponents, indexing="ij")
            both(lambda x, p: x**p, lambda x, p: x**p, a, b)
        elif form == "tensor ** number":
            for p in exponents:
                both(lambda x: x**p, lambda x: x**p, np.array(bases))  # noqa: B023 (called at once)
        else:
            for base in bases:
                both(lambda p: base**p, lambda p: base**p, np.array(exponents))  # noqa: B023


@pytest.mark.parametrize("name", ["relu", "gelu", "softmax", "log_softmax", "linear", "embedding", "cross_entropy"])
def test_the_functionals_take_their_arguments_by_pytorchs_names_and_positions(name):
    """A call by keyword (``cross_entropy(input=..., target=...)``) or by position means the same thing in both:
    our positional parameters are the first of PyTorch's, but softmax's ``axis`` (PyTorch's ``dim``, which ours
    takes as a keyword too)."""
    import inspect

    ours = inspect.signature(getattr(F, name)).parameters.values()
    positional = [p.name for p in ours if p.kind is p.POSITIONAL_OR_KEYWORD]
    builtins = {"gelu": ["input", "approximate"], "linear": ["input", "weight", "bias"]}  # (as their docs say:
    # C functions have no signature to inspect)
    all_theirs = builtins.get(name) or list(inspect.signature(getattr(TF, name)).parameters)
    assert [{"axis": "dim"}.get(p, p) for p in positional] == all_theirs[: len(positional)]
    keywords = {p.name for p in ours if p.kind is p.KEYWORD_ONLY}
    assert keywords <= set(all_theirs) | {"axis"}
