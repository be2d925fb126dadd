"""Cross-checks against PyTorch: blocks (outputs and every gradient), optimizer steps and the Module API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is the optional cross-check peer for blocks and optimizers")

import minigrad_norm.nn as mnn  # noqa: E402
from minigrad_norm.nn import TransformerBlock  # noqa: E402
from minigrad_norm.nn.transformer import MODES, NORMS  # noqa: E402
from minigrad_norm.optim import SGD, Adam, AdamW, clip_grad_norm_  # noqa: E402
from minigrad_norm.tensor import Tensor  # noqa: E402

pytestmark = pytest.mark.torch

D, H, FF, B, T = 8, 2, 16, 2, 5


def t64(a: np.ndarray) -> torch.Tensor:
    return torch.tensor(a, dtype=torch.float64)


def copy_(dst: torch.Tensor, src: Tensor) -> None:
    with torch.no_grad():
        dst.copy_(t64(src.data))


def copy_weights(ours: TransformerBlock, attn, fc1, fc2, norm1, norm2) -> None:
    """Our block's parameters into torch modules (q, k, v stacked into MultiheadAttention's in_proj)."""
    a = ours.attn
    copy_(
        attn.in_proj_weight, Tensor(np.concatenate([a.q_proj.weight.data, a.k_proj.weight.data, a.v_proj.weight.data]))
    )
    copy_(attn.in_proj_bias, Tensor(np.concatenate([a.q_proj.bias.data, a.k_proj.bias.data, a.v_proj.bias.data])))
    pairs = [
        (attn.out_proj, a.out_proj),
        (fc1, ours.ffn.fc1),
        (fc2, ours.ffn.fc2),
        (norm1, ours.norm1),
        (norm2, ours.norm2),
    ]
    for theirs, mine in pairs:
        copy_(theirs.weight, mine.weight)
        if getattr(theirs, "bias", None) is not None:
            copy_(theirs.bias, mine.bias)


def run_ours(block: TransformerBlock, x: np.ndarray, g: np.ndarray, pad: np.ndarray | None = None):
    xt = Tensor(x, requires_grad=True)
    y = block(xt, key_padding_mask=pad)
    y.backward(g)
    return y.data, xt.grad, {n: p.grad for n, p in block.named_parameters()}


def causal_mask() -> torch.Tensor:
    return torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)  # True = may not attend


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("mode", ["pre", "post"])
@pytest.mark.parametrize("padded", ["none", "right", "left"])
def test_block_matches_transformer_encoder_layer(mode: str, activation: str, padded: str) -> None:
    """Left padding under the causal mask leaves the first queries of sample 1 no key at all: PyTorch
    (its scaled_dot_product_attention) gives them zero attention, and so do we."""
    rng = np.random.default_rng(0)
    ours = TransformerBlock(D, H, FF, mode=mode, activation=activation, dtype=np.float64, rng=rng)
    for p in (ours.norm1.weight, ours.norm1.bias, ours.norm2.weight, ours.norm2.bias):
        p.data[...] = rng.uniform(0.5, 1.5, p.shape) if p is ours.norm1.weight else rng.uniform(-0.5, 0.5, p.shape)
    ref = torch.nn.TransformerEncoderLayer(
        D, H, FF, dropout=0.0, activation=activation, batch_first=True, norm_first=(mode == "pre"), dtype=torch.float64
    )
    copy_weights(ours, ref.self_attn, ref.linear1, ref.linear2, ref.norm1, ref.norm2)
    ref.train()  # no inference fast path

    x, g = rng.standard_normal((B, T, D)), rng.standard_normal((B, T, D))
    pad = None
    if padded != "none":
        pad = np.zeros((B, T), dtype=bool)
        pad[1, -2:] = padded == "right"
        pad[1, :2] = padded == "left"
    y, dx, grads = run_ours(ours, x, g, pad)

    xt = t64(x).requires_grad_()
    kpm = None if pad is None else torch.tensor(pad)
    yt = ref(xt, src_mask=causal_mask(), src_key_padding_mask=kpm)
    yt.backward(t64(g))
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-9, atol=1e-12)
    q, k, v = np.split(ref.self_attn.in_proj_weight.grad.numpy(), 3)
    qb, kb, vb = np.split(ref.self_attn.in_proj_bias.grad.numpy(), 3)
    expected = {
        "attn.q_proj.weight": q,
        "attn.k_proj.weight": k,
        "attn.v_proj.weight": v,
        "attn.q_proj.bias": qb,
        "attn.k_proj.bias": kb,
        "attn.v_proj.bias": vb,
        "attn.out_proj.weight": ref.self_attn.out_proj.weight.grad,
        "attn.out_proj.bias": ref.self_attn.out_proj.bias.grad,
        "ffn.fc1.weight": ref.linear1.weight.grad,
        "ffn.fc1.bias": ref.linear1.bias.grad,
        "ffn.fc2.weight": ref.linear2.weight.grad,
        "ffn.fc2.bias": ref.linear2.bias.grad,
        "norm1.weight": ref.norm1.weight.grad,
        "norm1.bias": ref.norm1.bias.grad,
        "norm2.weight": ref.norm2.weight.grad,
        "norm2.bias": ref.norm2.bias.grad,
    }
    assert set(expected) == set(grads)
    for name, want in expected.items():
        np.testing.assert_allclose(grads[name], np.asarray(want), rtol=1e-9, atol=1e-12, err_msg=name)


class TorchBlock(torch.nn.Module):
    """Every mode and norm assembled from torch modules (MultiheadAttention, Linear, LayerNorm/RMSNorm)."""

    def __init__(self, ours: TransformerBlock, activation: str) -> None:
        super().__init__()
        self.mode, self.alpha, self.activation = ours.mode, ours.alpha, activation
        self.attn = torch.nn.MultiheadAttention(D, H, batch_first=True, dtype=torch.float64)
        self.fc1 = torch.nn.Linear(D, FF, dtype=torch.float64)
        self.fc2 = torch.nn.Linear(FF, D, dtype=torch.float64)
        make = (
            (lambda: torch.nn.RMSNorm(D, eps=1e-5, dtype=torch.float64))
            if ours.norm == "rmsnorm"
            else (lambda: torch.nn.LayerNorm(D, eps=1e-5, dtype=torch.float64))
        )
        self.norm1, self.norm2 = make(), make()
        copy_weights(ours, self.attn, self.fc1, self.fc2, self.norm1, self.norm2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def sa(z: torch.Tensor) -> torch.Tensor:
            return self.attn(z, z, z, attn_mask=causal_mask(), need_weights=False)[0]

        def ff(z: torch.Tensor) -> torch.Tensor:
            h = self.fc1(z)
            return self.fc2(torch.relu(h) if self.activation == "relu" else torch.nn.functional.gelu(h))

        if self.mode == "pre":
            x = x + sa(self.norm1(x))
            return x + ff(self.norm2(x))
        x = self.norm1(self.alpha * x + sa(x))
        return self.norm2(self.alpha * x + ff(x))


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("mode", MODES)
def test_every_mode_and_norm_matches_a_block_of_torch_modules(mode: str, norm: str, activation: str) -> None:
    rng = np.random.default_rng(1)
    ours = TransformerBlock(
        D, H, FF, mode=mode, norm=norm, activation=activation, num_layers=4, dtype=np.float64, rng=rng
    )
    for name, p in ours.named_parameters():
        if name.startswith("norm"):
            p.data[...] = rng.uniform(0.5, 1.5, p.shape)
    ref = TorchBlock(ours, activation)
    x, g = rng.standard_normal((B, T, D)), rng.standard_normal((B, T, D))
    y, dx, grads = run_ours(ours, x, g)
    xt = t64(x).requires_grad_()
    yt = ref(xt)
    yt.backward(t64(g))
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-9, atol=1e-12)
    dq, dk, dv = np.split(ref.attn.in_proj_weight.grad.numpy(), 3)
    np.testing.assert_allclose(grads["attn.q_proj.weight"], dq, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(grads["attn.k_proj.weight"], dk, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(grads["attn.v_proj.weight"], dv, rtol=1e-9, atol=1e-12)
    for name, mod in [
        ("attn.out_proj", ref.attn.out_proj),
        ("ffn.fc1", ref.fc1),
        ("ffn.fc2", ref.fc2),
        ("norm1", ref.norm1),
        ("norm2", ref.norm2),
    ]:
        np.testing.assert_allclose(
            grads[f"{name}.weight"], mod.weight.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=name
        )
        if getattr(mod, "bias", None) is not None:
            np.testing.assert_allclose(
                grads[f"{name}.bias"], mod.bias.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=name
            )


# -- optimizers ----------------------------------------------------------------------------------------------
OPTIMIZERS = [
    (SGD, torch.optim.SGD, {"lr": 0.1}),
    (SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}),
    (SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.8, "dampening": 0.3}),
    (SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1}),
    (Adam, torch.optim.Adam, {"lr": 1e-2}),
    (Adam, torch.optim.Adam, {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1}),
    (AdamW, torch.optim.AdamW, {"lr": 1e-2}),
    (AdamW, torch.optim.AdamW, {"lr": 3e-2, "betas": (0.9, 0.95), "weight_decay": 0.2}),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(("ours_cls", "torch_cls", "kwargs"), OPTIMIZERS)
def test_optimizer_steps_match_torch(ours_cls, torch_cls, kwargs, dtype) -> None:
    rng = np.random.default_rng(0)
    shapes = [(3, 4), (4,), (2, 2, 3)]
    ours = [Tensor(rng.standard_normal(s).astype(dtype), requires_grad=True) for s in shapes]
    theirs = [torch.tensor(p.data.copy(), requires_grad=True) for p in ours]
    opt, topt = ours_cls(ours, **kwargs), torch_cls(theirs, **kwargs, foreach=False)
    for step in range(6):
        lr = kwargs["lr"] * (0.5 + 0.1 * step)  # a changing learning rate, as under a schedule
        for group in opt.param_groups + topt.param_groups:
            group["lr"] = lr
        for k, (p, tp) in enumerate(zip(ours, theirs, strict=True)):
            if step == 2 and k == 1:  # a parameter without a gradient this step is skipped by both
                p.grad, tp.grad = None, None
                continue
            g = rng.standard_normal(p.shape).astype(dtype)
            p.grad, tp.grad = g.copy(), torch.tensor(g)
        opt.step()
        topt.step()
    tol = 1e-12 if dtype == np.float64 else 2e-6
    for p, tp in zip(ours, theirs, strict=True):
        assert p.dtype == dtype
        np.testing.assert_allclose(p.data, tp.detach().numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_grad_norm_matches_torch(max_norm: float, norm_type: float) -> None:
    rng = np.random.default_rng(0)
    ours = [Tensor(np.zeros(s), requires_grad=True) for s in [(3, 4), (5,)]]
    theirs = [torch.zeros(s, dtype=torch.float64, requires_grad=True) for s in [(3, 4), (5,)]]
    for p, tp in zip(ours, theirs, strict=True):
        g = rng.standard_normal(p.shape)
        p.grad, tp.grad = g.copy(), torch.tensor(g)
    total = clip_grad_norm_(ours, max_norm, norm_type)
    ttotal = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type)
    assert total == pytest.approx(float(ttotal), rel=1e-12)
    for p, tp in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(p.grad, tp.grad.numpy(), rtol=1e-12)


# -- the Module API against torch.nn.Module ---------------------------------------------------------------------
def module_net(nn: Any, parameter: Callable[[np.ndarray], Any], buffer: Callable[[np.ndarray], Any], dtype: Any):
    """One network built from our nn or from torch.nn: a weight tied across two Linears, a Linear shared under two
    names, a BatchNorm, a ModuleList with a run of equal entries, and a submodule that registers a child before
    its own parameter and buffer (PyTorch's state_dict still lists the module's parameters, buffers, then children)."""

    class Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2, dtype=dtype)
            self.scale = parameter(np.array([0.5, 2.0]))
            self.register_buffer("shift", buffer(np.array([0.25, -0.5])))

        def forward(self, x):
            return self.lin(x) * self.scale + self.shift

        def extra_repr(self) -> str:
            return "scaled=True\nshifted=True"

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(2, 2, dtype=dtype)
            self.b = nn.Linear(2, 2, dtype=dtype)
            self.b.weight = self.a.weight  # weight tying
            self.bn = nn.BatchNorm1d(2, dtype=dtype)
            self.inner = Inner()
            self.blocks = nn.ModuleList(
                [nn.Linear(2, 2, dtype=dtype) for _ in range(2)] + [nn.Linear(2, 3, dtype=dtype)]
            )
            self.shared = self.a  # one module under two names

        def forward(self, x):
            return self.blocks[2](self.inner(self.bn(self.b(self.a(x)))))

    return Net()


def module_nets(state: dict[str, np.ndarray] | None = None):
    """Our Net and torch's, both loaded with ``state`` (default: a seeded random one, each entry different,
    so the three names of the tied weight carry three different values)."""
    ours = module_net(mnn, mnn.Parameter, np.asarray, np.float64)
    theirs = module_net(torch.nn, lambda a: torch.nn.Parameter(t64(a)), t64, torch.float64)
    if state is None:
        rng = np.random.default_rng(0)
        state = {k: rng.uniform(0.5, 1.5, v.shape) for k, v in theirs.state_dict().items()}
        state["bn.num_batches_tracked"] = np.array(3)
    # given in reverse: of two names of one array the later in the module's order wins, not the mapping's later
    backwards = dict(reversed(state.items()))
    ours.load_state_dict(backwards)
    theirs.load_state_dict({k: torch.tensor(v) for k, v in backwards.items()})
    return ours, theirs


def test_module_names_and_state_dict_keys_match_torch() -> None:
    ours, theirs = module_nets()
    assert list(ours.state_dict()) == list(theirs.state_dict())  # order too, tied entries under every name
    for kw in ({}, {"remove_duplicate": False}):
        for method in ("named_parameters", "named_buffers", "named_modules"):
            assert [n for n, _ in getattr(ours, method)(**kw)] == [n for n, _ in getattr(theirs, method)(**kw)]
    assert [n for n, _ in ours.named_modules(prefix="net")] == [n for n, _ in theirs.named_modules(prefix="net")]
    assert [n for n, _ in ours.named_children()] == [n for n, _ in theirs.named_children()]
    assert [type(m).__name__ for m in ours.children()] == [type(m).__name__ for m in theirs.children()]
    assert len(ours.parameters()) == len(list(theirs.parameters()))


def test_loading_tied_entries_matches_torch() -> None:
    """The module_nets state gives the tied weight three different values: the last name's wins in both."""
    ours, theirs = module_nets()
    for (name, value), (name_t, value_t) in zip(ours.state_dict().items(), theirs.state_dict().items(), strict=True):
        assert name == name_t
        np.testing.assert_array_equal(value, value_t.numpy(), err_msg=name)
    partial = {k: v for k, v in ours.state_dict().items() if k != "b.weight"}
    result = ours.load_state_dict(partial, strict=False)
    assert tuple(result) == tuple(theirs.load_state_dict({k: t64(v) for k, v in partial.items()}, strict=False))
    assert result.missing_keys == ["b.weight"]


def test_module_repr_matches_torch() -> None:
    ours, theirs = module_nets()
    assert repr(ours) == repr(theirs)
    assert repr(ours.blocks[:0]) == repr(theirs.blocks[:0])


def test_zero_grad_matches_torch() -> None:
    """Only ``inner`` takes part in the forward: the other parameters have no gradient, and keep none."""
    ours, theirs = module_nets()
    x, g = np.random.default_rng(1).standard_normal((2, 4, 2))
    ours.inner(Tensor(x)).backward(g)
    theirs.inner(t64(x)).backward(t64(g))
    grads = {name: p.grad for name, p in ours.named_parameters()}
    assert any(v is None for v in grads.values()) and any(v is not None for v in grads.values())
    ours.zero_grad(set_to_none=False)
    theirs.zero_grad(set_to_none=False)
    for (name, p), (_, p_t) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        assert (p.grad is None) == (p_t.grad is None), name
        if p.grad is not None:
            assert p.grad is grads[name]  # zeroed in place
            np.testing.assert_array_equal(p.grad, p_t.grad.numpy())
    ours.zero_grad()
    theirs.zero_grad()
    assert all(p.grad is None for p in ours.parameters()) and all(p.grad is None for p in theirs.parameters())


W = np.array([[0.5, -1.0], [2.0, 0.25]])
FUNCTIONAL_CALLS = {
    "one name of a tied weight replaces all": ({"a.weight": W}, {}),
    "another name of it": ({"b.weight": W}, {}),
    "the name of the shared module": ({"shared.weight": W}, {}),
    "the same value under every name": ({"a.weight": W, "b.weight": W, "shared.weight": W}, {}),
    "untied: only that name": ({"a.weight": W}, {"tie_weights": False}),
    "buffers": ({"bn.running_mean": np.array([0.3, -0.2]), "inner.shift": np.array([1.0, 2.0])}, {}),
    "parameters and buffers as two dicts": (({"inner.scale": W[0]}, {"bn.running_var": W[1] ** 2}), {}),
}


@pytest.mark.parametrize("wrap", [True, False], ids=["args tuple", "single arg"])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("case", list(FUNCTIONAL_CALLS))
def test_functional_call_matches_torch_func(case: str, training: bool, wrap: bool) -> None:
    values, kwargs = FUNCTIONAL_CALLS[case]
    ours, theirs = module_nets()
    ours.train(training)
    theirs.train(training)
    before = ours.state_dict()
    dicts = [values] if isinstance(values, dict) else list(values)
    # one object per array, so a value given under several names is the same object on each side, as
    # tie_weights compares them by identity
    made: dict[tuple[int, Any], Any] = {}
    ours_dicts, theirs_dicts = (
        [{k: made.setdefault((id(v), make), make(v)) for k, v in d.items()} for d in dicts] for make in (Tensor, t64)
    )
    given, given_t = (
        (ours_dicts[0], theirs_dicts[0]) if isinstance(values, dict) else (tuple(ours_dicts), tuple(theirs_dicts))
    )
    x = np.random.default_rng(2).standard_normal((4, 2))
    args, args_t = ((Tensor(x),), (t64(x),)) if wrap else (Tensor(x), t64(x))
    y = mnn.functional_call(ours, given, args, **kwargs)
    y_t = torch.func.functional_call(theirs, given_t, args_t, **kwargs)
    np.testing.assert_allclose(y.data, y_t.detach().numpy(), rtol=1e-12, atol=1e-12)
    # In training mode the batch norm's running statistics moved as torch's did, except a buffer given to the
    # call, which took the in-place updates instead; every other entry of the module is back as it was. (Not
    # compared with torch: 2.13 leaves the replacement in a module shared under two names, as it restores the
    # shared slot in the order it swapped it.)
    state, state_t = ours.state_dict(), theirs.state_dict()
    for name, value in state.items():
        if training and name.startswith("bn."):
            np.testing.assert_allclose(value, state_t[name].numpy(), rtol=1e-12, atol=1e-12, err_msg=name)
        else:
            np.testing.assert_array_equal(value, before[name], err_msg=name)
    buffers = dict(ours.named_buffers())
    for d, d_t in zip(ours_dicts, theirs_dicts, strict=True):
        for name in buffers.keys() & d.keys():
            np.testing.assert_allclose(d[name].data, d_t[name].numpy(), rtol=1e-12, atol=1e-12, err_msg=name)


def test_functional_call_errors_match_torch_func() -> None:
    ours, theirs = module_nets()
    x = np.ones((4, 2))
    w, w2 = Tensor(W), Tensor(2 * W)
    tw, tw2 = t64(W), t64(2 * W)
    calls = [
        # two values for one tied weight
        (
            lambda: mnn.functional_call(ours, {"a.weight": w, "b.weight": w, "shared.weight": w2}, Tensor(x)),
            lambda: torch.func.functional_call(theirs, {"a.weight": tw, "b.weight": tw, "shared.weight": tw2}, t64(x)),
        ),
        # strict: everything must be given (the tied names count once one of them is)
        (
            lambda: mnn.functional_call(ours, {"a.weight": w}, Tensor(x), strict=True),
            lambda: torch.func.functional_call(theirs, {"a.weight": tw}, t64(x), strict=True),
        ),
        (
            lambda: mnn.functional_call(ours, ({"a.weight": w}, {"a.weight": w}), Tensor(x)),
            lambda: torch.func.functional_call(theirs, ({"a.weight": tw}, {"a.weight": tw}), t64(x)),
        ),
    ]
    for call, call_t in calls:
        with pytest.raises(Exception) as caught_t:
            call_t()
        with pytest.raises(type(caught_t.value)) as caught:
            call()
        assert str(caught.value) == str(caught_t.value)
