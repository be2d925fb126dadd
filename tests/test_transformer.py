"""The Transformer modules, the Module base, the sequence task, training and the depth experiment."""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import replace

import numpy as np
import pytest

import minigrad_norm.functional as F
from minigrad_norm import grad, gradcheck
from minigrad_norm.cli import main
from minigrad_norm.data import IGNORE, SequenceTask
from minigrad_norm.depth import DepthConfig, run_experiment
from minigrad_norm.nn import (
    Embedding,
    FeedForward,
    Linear,
    Module,
    ModuleList,
    MultiHeadSelfAttention,
    Parameter,
    TransformerBlock,
    TransformerLM,
)
from minigrad_norm.nn.attention import attention
from minigrad_norm.nn.check_cases import TINY, block_fn, block_inputs, tiny_block
from minigrad_norm.nn.module import functional_call
from minigrad_norm.nn.transformer import MODES, NORMS, deepnorm_constants
from minigrad_norm.optim import AdamW
from minigrad_norm.tensor import Tensor, no_grad
from minigrad_norm.train import TrainConfig, build_model, decay_groups, evaluate, greedy_decode, train


def block(mode: str = "pre", norm: str = "layernorm", seed: int = 0, **kw) -> TransformerBlock:
    kw.setdefault("dtype", np.float64)
    return TransformerBlock(8, 2, 16, mode=mode, norm=norm, rng=np.random.default_rng(seed), **kw)


# -- gradients ------------------------------------------------------------------------------------
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("mode", MODES)
def test_block_gradcheck_all_parameters_and_input(mode: str, norm: str, activation: str) -> None:
    b = tiny_block(mode, norm, activation)
    inputs = block_inputs(b)(np.random.default_rng(7))
    assert len(inputs) == 1 + len(b.parameters())
    with key_bias_is_vacuous(b):
        assert gradcheck(block_fn(b), inputs, atol=1e-6, rtol=1e-5)


def test_block_gradcheck_with_key_padding_mask() -> None:
    b = tiny_block("post", "layernorm", "gelu")
    names = [n for n, _ in b.named_parameters()]
    batch, seq = TINY[:2]
    pad = np.zeros((batch, seq), dtype=bool)
    pad[1, -1] = True  # the last key of the second sequence is padding

    def fn(x: Tensor, *params: Tensor) -> Tensor:
        return functional_call(b, dict(zip(names, params, strict=True)), (x,), {"key_padding_mask": pad})

    with key_bias_is_vacuous(b):
        assert gradcheck(fn, block_inputs(b)(np.random.default_rng(3)), atol=1e-6, rtol=1e-5)


def key_bias_is_vacuous(b: TransformerBlock) -> pytest.WarningsRecorder:
    """gradcheck warns that the key projection's bias has no Jacobian entry above atol: it adds q . b_k to
    every score of a query, which softmax ignores, so its gradient is zero (and zero is what gets checked)."""
    names = [n for n, _ in b.named_parameters()]
    return pytest.warns(UserWarning, match=rf"input\(s\) {1 + names.index('attn.k_proj.bias')} is below atol")


def test_fused_attention_matches_composition_of_primitives(rng: np.random.Generator) -> None:
    """The hand-written Attention node against the same math built from matmul, masked_fill and softmax."""
    b, t, d, h = 2, 5, 6, 3
    q, k, v = (Tensor(rng.standard_normal((b, t, d)), requires_grad=True) for _ in range(3))
    mask = np.triu(np.ones((t, t), dtype=bool), 1)[None, None] | (np.arange(t) == 1)[None, None, None, :]

    def composed(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        def split(a: Tensor) -> Tensor:
            return a.reshape(b, t, h, d // h).permute(0, 2, 1, 3)

        s = split(q) @ split(k).transpose(-1, -2) * (1 / math.sqrt(d // h))
        p = F.softmax(s.masked_fill(mask, -1e30), axis=-1)
        return (p @ split(v)).permute(0, 2, 1, 3).reshape(b, t, d)

    fused = attention(q, k, v, h, mask)
    ref = composed(q, k, v)
    np.testing.assert_allclose(fused.data, ref.data, rtol=1e-12, atol=1e-12)
    g = rng.standard_normal(fused.shape)
    for a, r in zip(grad(fused, [q, k, v], g), grad(ref, [q, k, v], g), strict=True):
        np.testing.assert_allclose(a, r, rtol=1e-10, atol=1e-12)


# -- attention masks --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_attention_is_causal(mode: str, rng: np.random.Generator) -> None:
    b = block(mode)
    x = rng.standard_normal((2, 6, 8))
    y = b(Tensor(x)).data
    x2 = x.copy()
    x2[:, 4] += rng.standard_normal((2, 8))  # change token 4
    y2 = b(Tensor(x2)).data
    np.testing.assert_array_equal(y2[:, :4], y[:, :4])  # positions 0..3 cannot see it
    assert np.abs(y2[:, 4:] - y[:, 4:]).max() > 1e-3  # later positions do


def test_non_causal_attention_sees_later_tokens(rng: np.random.Generator) -> None:
    b = block("pre", causal=False)
    x = rng.standard_normal((1, 4, 8))
    x2 = x.copy()
    x2[:, 3] += rng.standard_normal(8)  # not a constant shift: the norms would remove that
    assert np.abs(b(Tensor(x2)).data[:, 0] - b(Tensor(x)).data[:, 0]).max() > 1e-3


def test_key_padding_mask_hides_padded_keys(rng: np.random.Generator) -> None:
    attn = MultiHeadSelfAttention(8, 2, dtype=np.float64, rng=rng)
    x = rng.standard_normal((2, 5, 8))
    pad = np.zeros((2, 5), dtype=bool)
    pad[0, 3:] = True
    y = attn(Tensor(x), key_padding_mask=pad).data
    x2 = x.copy()
    x2[0, 3:] += 5.0
    y2 = attn(Tensor(x2), key_padding_mask=pad).data
    np.testing.assert_allclose(y2[0, :3], y[0, :3], rtol=1e-12, atol=1e-12)  # unpadded queries ignore padding
    np.testing.assert_array_equal(y2[1], y[1])


def test_a_query_with_every_key_masked_attends_to_nothing(rng: np.random.Generator) -> None:
    """Its softmax would be 0/0: its row of P is 0, so it outputs 0 and passes no gradient (PyTorch's
    scaled_dot_product_attention; compared with torch in test_torch_transformer.py), and the other
    queries are as if it were not there."""
    x = Tensor(rng.standard_normal((2, 4, 8)), requires_grad=True)
    mask = np.zeros((2, 1, 4, 4), dtype=bool)
    mask[0, :, 1, :] = True  # query 1 of sample 0 sees no key
    out = attention(x, x * 2.0, x * 3.0, 2, mask)
    g = rng.standard_normal(out.shape)
    out.backward(g)
    assert np.all(np.isfinite(out.data)) and np.all(np.isfinite(x.grad))
    np.testing.assert_array_equal(out.data[0, 1], 0.0)
    full = attention(x, x * 2.0, x * 3.0, 2, None).data  # sample 1 unmasked
    np.testing.assert_allclose(out.data[1], full[1], rtol=1e-12)
    # the dead query's own gradient is only what flows through its keys and values (their rows of P are
    # the others'): without that query's output in the loss the gradient is the same
    x2 = Tensor(x.data, requires_grad=True)
    g2 = g.copy()
    g2[0, 1] = 0.0
    attention(x2, x2 * 2.0, x2 * 3.0, 2, mask).backward(g2)
    np.testing.assert_allclose(x.grad, x2.grad, rtol=1e-12, atol=1e-12)


def test_attention_rejects_bad_masks_and_shapes(rng: np.random.Generator) -> None:
    attn = MultiHeadSelfAttention(8, 2, rng=rng)
    x = Tensor(rng.standard_normal((2, 3, 8)).astype(np.float32))
    with pytest.raises(TypeError, match="key_padding_mask must be boolean"):
        attn(x, key_padding_mask=np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape"):
        attn(x, key_padding_mask=np.zeros((3, 2), dtype=bool))
    with pytest.raises(TypeError, match="mask must be boolean"):
        attention(x, x, x, 2, np.zeros((1, 1, 3, 3)))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 1, 3, 3\) does not broadcast"):
        attention(x, x, x, 2, np.zeros((3, 1, 3, 3), dtype=bool))
    with pytest.raises(ValueError, match="d_model=8"):
        attn(Tensor(np.zeros((2, 3, 4), dtype=np.float32)))
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadSelfAttention(10, 3)


@pytest.mark.parametrize("shape", [(2, 0, 8), (0, 3, 8)], ids=["empty sequence", "empty batch"])
@pytest.mark.parametrize("mode", MODES)
def test_an_empty_sequence_or_batch_gives_an_empty_output_and_zero_gradients(shape, mode) -> None:
    # as PyTorch's MultiheadAttention and TransformerEncoderLayer; the softmax's max over no keys used to fail
    b = block(mode, causal=True)
    x = Tensor(np.zeros(shape), requires_grad=True)
    y = b(x, key_padding_mask=np.zeros(shape[:2], dtype=bool))
    assert y.shape == shape
    y.sum().backward()
    assert x.grad.shape == shape
    for name, p in b.named_parameters():
        np.testing.assert_array_equal(p.grad, np.zeros_like(p.data), err_msg=name)  # a sum over no position


# -- block structure ----------------------------------------------------------------------------------
def test_parameter_names_and_dtype() -> None:
    b = TransformerBlock(8, 2, 16, dtype=np.float32, rng=np.random.default_rng(0))
    names = [n for n, _ in b.named_parameters()]
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        assert f"attn.{proj}.weight" in names and f"attn.{proj}.bias" in names
    assert {"ffn.fc1.weight", "ffn.fc1.bias", "ffn.fc2.weight", "ffn.fc2.bias"} <= set(names)
    assert {"norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"} <= set(names)
    assert len(names) == 16
    assert all(p.dtype == np.float32 for p in b.parameters())
    assert b.attn.q_proj.weight.shape == (8, 8) and b.ffn.fc1.weight.shape == (16, 8)
    rms = TransformerBlock(8, 2, 16, norm="rmsnorm", bias=False, rng=np.random.default_rng(0))
    assert sorted(n for n, _ in rms.named_parameters() if "norm" in n) == ["norm1.weight", "norm2.weight"]
    assert not any(n.endswith("bias") for n, _ in rms.named_parameters())


def test_float32_block_keeps_float32(rng: np.random.Generator) -> None:
    b = TransformerBlock(8, 2, 16, mode="deepnorm", num_layers=4, dtype=np.float32, rng=rng)
    x = Tensor(rng.standard_normal((2, 3, 8)).astype(np.float32), requires_grad=True)
    y = b(x)
    y.backward(rng.standard_normal(y.shape).astype(np.float32))
    assert y.dtype == np.float32 and x.grad.dtype == np.float32
    assert all(p.grad.dtype == np.float32 for p in b.parameters())


@pytest.mark.parametrize("norm", NORMS)
def test_block_modes_compute_their_formulas(norm: str, rng: np.random.Generator) -> None:
    """Each mode against its formula written out with the block's own submodules."""
    x = Tensor(rng.standard_normal((2, 4, 8)))
    with no_grad():
        pre = block("pre", norm)
        h = x + pre.attn(pre.norm1(x))
        np.testing.assert_allclose(pre(x).data, (h + pre.ffn(pre.norm2(h))).data, rtol=1e-12)
        post = block("post", norm)
        h = post.norm1(x + post.attn(x))
        np.testing.assert_allclose(post(x).data, post.norm2(h + post.ffn(h)).data, rtol=1e-12)
        deep = block("deepnorm", norm, num_layers=6)
        alpha = 12**0.25
        h = deep.norm1(alpha * x + deep.attn(x))  # alpha on the residual, the branch sees x unscaled
        np.testing.assert_allclose(deep(x).data, deep.norm2(alpha * h + deep.ffn(h)).data, rtol=1e-12)


def test_deepnorm_constants_and_init() -> None:
    n = 6
    alpha, beta = deepnorm_constants(n)
    assert alpha == pytest.approx((2 * n) ** 0.25) and beta == pytest.approx((8 * n) ** -0.25)
    post, deep = block("post", seed=3), block("deepnorm", seed=3, num_layers=n)
    assert deep.alpha == pytest.approx(alpha) and post.alpha == 1.0
    scaled = {"ffn.fc1", "ffn.fc2", "attn.v_proj", "attn.out_proj"}
    p_post, p_deep = dict(post.named_parameters()), dict(deep.named_parameters())
    for name, p in p_deep.items():
        factor = beta if name.rsplit(".", 1)[0] in scaled else 1.0
        np.testing.assert_allclose(p.data, factor * p_post[name].data, rtol=1e-15)
    with pytest.raises(ValueError, match="num_layers"):
        deepnorm_constants(0)


def test_xavier_init_statistics() -> None:
    b = TransformerBlock(64, 4, 256, init="xavier", rng=np.random.default_rng(0), dtype=np.float64)
    w = b.ffn.fc1.weight.data
    assert w.std() == pytest.approx(math.sqrt(2 / (64 + 256)), rel=0.05)
    assert np.all(b.ffn.fc1.bias.data == 0)
    with pytest.raises(ValueError, match="init"):
        TransformerBlock(8, 2, 16, init="he")


def test_bad_mode_norm_activation() -> None:
    with pytest.raises(ValueError, match="mode"):
        TransformerBlock(8, 2, 16, mode="sandwich")
    with pytest.raises(ValueError, match="norm"):
        TransformerBlock(8, 2, 16, norm="batchnorm")
    with pytest.raises(ValueError, match="activation"):
        FeedForward(8, 16, activation="swish")


@pytest.mark.parametrize(
    ("name", "value", "mode"),
    [("mode", "bogus", "bogus"), ("norm", "batchnorm", "post"), ("activation", "swish", "pre"), ("init", "he", "pre")],
)
def test_transformer_lm_checks_its_choices_even_without_blocks(name: str, value: str, mode: str) -> None:
    """With n_layers=0 no block checks mode, norm, activation or init: the model does, as the block would."""
    kwargs = {"mode": mode, name: value}
    with pytest.raises(ValueError, match=rf"TransformerLM: {name} must be one of .*, got '{value}'"):
        TransformerLM(10, 8, 2, 16, 0, 4, **kwargs)
    with pytest.raises(ValueError, match="n_layers must be >= 0, got -1"):
        TransformerLM(10, 8, 2, 16, -1, 4)


def test_linear_and_embedding_init() -> None:
    rng = np.random.default_rng(0)
    lin = Linear(100, 300, rng=rng, dtype=np.float64)
    bound = 1 / math.sqrt(100)
    assert np.abs(lin.weight.data).max() <= bound and np.abs(lin.bias.data).max() <= bound
    assert lin.weight.data.std() == pytest.approx(bound / math.sqrt(3), rel=0.03)  # U(-b, b) has std b/sqrt(3)
    assert Linear(3, 4, bias=False).bias is None
    emb = Embedding(500, 64, rng=rng, dtype=np.float64)
    assert emb.weight.data.mean() == pytest.approx(0, abs=0.02) and emb.weight.data.std() == pytest.approx(1, rel=0.02)
    assert emb(np.array([[1, 2]])).shape == (1, 2, 64)
    with pytest.raises(ValueError, match="positive"):
        Linear(0, 3)


# -- the language model -------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_lm_shapes_final_norm_and_hidden(mode: str, rng: np.random.Generator) -> None:
    lm = TransformerLM(11, 8, 2, 16, 3, 10, mode, rng=rng)
    hidden: list[Tensor] = []
    logits = lm(rng.integers(0, 11, (2, 7)), hidden=hidden)
    assert logits.shape == (2, 7, 11) and logits.dtype == np.float32
    assert len(hidden) == 3 and all(h.shape == (2, 7, 8) for h in hidden)
    assert (lm.norm_f is not None) == (mode == "pre")
    assert ("norm_f.weight" in dict(lm.named_parameters())) == (mode == "pre")
    with pytest.raises(ValueError, match="max_seq_len"):
        lm(np.zeros((1, 11), dtype=np.int64))


# -- Module base --------------------------------------------------------------------------------------------
def small_lm(seed: int) -> TransformerLM:
    return TransformerLM(7, 8, 2, 16, 2, 6, "pre", rng=np.random.default_rng(seed))


def test_state_dict_round_trip_is_exact(tmp_path) -> None:
    a, b = small_lm(0), small_lm(1)
    idx = np.array([[1, 2, 3, 4]])
    assert not np.array_equal(a(idx).data, b(idx).data)
    for path in (tmp_path / "model.npz", tmp_path / "model_without_suffix"):
        a.save(path)
        c = small_lm(2)
        c.load(path)
        for (name, p), (name_c, pc) in zip(a.named_parameters(), c.named_parameters(), strict=True):
            assert name == name_c and pc.dtype == p.dtype
            np.testing.assert_array_equal(pc.data, p.data)
        np.testing.assert_array_equal(c(idx).data, a(idx).data)
    b.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(b(idx).data, a(idx).data)


def test_frozen_parameters_stay_parameters_and_are_not_updated() -> None:
    """As with PyTorch's nn.Parameter: freezing a weight keeps it in parameters() and the state dict."""
    a = small_lm(0)
    names = [n for n, _ in a.named_parameters()]
    a.head.weight.requires_grad = False
    assert [n for n, _ in a.named_parameters()] == names
    assert "head.weight" in a.state_dict()
    before = a.head.weight.data.copy()
    opt = AdamW(a.parameters(), lr=0.1)
    logits = a(np.array([[1, 2, 3, 4]]))
    (logits * logits).mean().backward()
    opt.step()
    assert a.head.weight.grad is None
    np.testing.assert_array_equal(a.head.weight.data, before)
    assert not np.array_equal(a.head.bias.data, small_lm(0).head.bias.data)


def test_state_dict_is_a_copy() -> None:
    a = small_lm(0)
    state = a.state_dict()
    state["head.weight"][...] = 0
    assert np.abs(a.head.weight.data).max() > 0


def test_load_state_dict_errors_leave_module_unchanged() -> None:
    a = small_lm(0)
    before = a.state_dict()
    missing = dict(small_lm(1).state_dict())
    del missing["blocks.1.ffn.fc2.bias"]
    with pytest.raises(RuntimeError, match=re.escape('Missing key(s) in state_dict: "blocks.1.ffn.fc2.bias".')):
        a.load_state_dict(missing)
    extra = {**small_lm(1).state_dict(), "blocks.9.attn.q_proj.weight": np.zeros((8, 8))}
    with pytest.raises(
        RuntimeError, match=re.escape('Unexpected key(s) in state_dict: "blocks.9.attn.q_proj.weight".')
    ):
        a.load_state_dict(extra)
    bad = small_lm(1).state_dict()
    bad["head.weight"] = np.zeros((8, 7))
    with pytest.raises(
        RuntimeError,
        match=re.escape(
            "head.weight: copying a param with shape (8, 7) from checkpoint, the shape in current model is (7, 8)"
        ),
    ):
        a.load_state_dict(bad)
    bad = small_lm(1).state_dict()
    bad["head.weight"] = bad["head.weight"] + 1j  # its imaginary part would be dropped
    with pytest.raises(RuntimeError, match=r"dtype mismatch for head.weight: a complex64 value cannot be copied"):
        a.load_state_dict(bad)
    for name, value in a.state_dict().items():  # nothing was half-loaded
        np.testing.assert_array_equal(value, before[name])


def test_module_traversal_train_eval_zero_grad() -> None:
    class Tied(Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = Embedding(5, 4, rng=np.random.default_rng(0))
            self.head = Linear(4, 5, bias=False, rng=np.random.default_rng(0))
            self.head.weight = self.emb.weight  # weight tying: one parameter, two names
            self.layers = ModuleList([Linear(4, 4), Linear(4, 4)])
            self.register_buffer("count", np.zeros(()))

    m = Tied()
    names = [n for n, _ in m.named_parameters()]
    assert names.count("emb.weight") == 1 and "head.weight" not in names
    assert {"layers.0.weight", "layers.1.bias"} <= set(names)
    assert "count" in m.state_dict()
    with pytest.raises(KeyError, match="already has an attribute"):
        m.register_buffer("emb", np.zeros(1))
    m.eval()
    assert not any(mod.training for _, mod in m.named_modules())
    m.train()
    assert all(mod.training for _, mod in m.named_modules())
    out = m.layers[0](m.emb(np.array([1])))
    out.backward(np.ones(out.shape, dtype=np.float32))
    assert m.emb.weight.grad is not None
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())


def test_assigning_a_non_parameter_over_a_parameter_is_refused() -> None:
    """As PyTorch (TypeError): a plain Tensor over a parameter would silently drop it from parameters() and the
    state dict. None is allowed (the parameter is then absent), and a Parameter takes the slot back."""
    lin = Linear(2, 2)
    with pytest.raises(TypeError, match=r"cannot assign 'minigrad_norm\.tensor\.Tensor' as parameter 'weight'"):
        lin.weight = Tensor(np.zeros((2, 2), np.float32))
    with pytest.raises(TypeError, match=r"cannot assign 'numpy\.ndarray' as parameter 'weight'"):
        lin.weight = np.zeros((2, 2), np.float32)
    assert [n for n, _ in lin.named_parameters()] == ["weight", "bias"]
    lin.weight = None
    assert [n for n, _ in lin.named_parameters()] == ["bias"]
    lin.weight = Parameter(np.zeros((2, 2), np.float32))
    assert [n for n, _ in lin.named_parameters()] == ["weight", "bias"]
    lm = small_lm(0)
    with pytest.raises(TypeError, match="cannot assign 'int' as child module 'head'"):
        lm.head = 3
    assert isinstance(lm.head, Linear)


def test_load_state_dict_takes_tensors() -> None:
    a, b = Linear(3, 2), Linear(3, 2)
    assert b.load_state_dict(dict(a.named_parameters())) == ([], [])
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        np.testing.assert_array_equal(q.data, p.data, err_msg=name)
        assert q.data is not p.data  # copied in, not shared


def test_module_list_indexing_and_slicing() -> None:
    layers = ModuleList([Linear(2, 2), Linear(2, 3), Linear(3, 3)])
    tail = layers[1:]
    assert isinstance(tail, ModuleList) and list(tail) == list(layers)[1:]
    assert [n for n, _ in tail.named_parameters()] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert layers[-1] is list(layers)[2]
    with pytest.raises(IndexError, match="index 3 is out of range"):
        layers[3]
    with pytest.raises(TypeError):
        layers["0"]


def test_save_takes_parameters_named_like_savez_arguments(tmp_path) -> None:
    class Odd(Module):
        def __init__(self, value: float) -> None:
            super().__init__()
            self.file = Parameter(np.full(2, value))
            self.allow_pickle = Parameter(np.full(3, value))

    Odd(1.5).save(tmp_path / "odd.npz")
    loaded = Odd(0.0)
    loaded.load(tmp_path / "odd.npz")
    np.testing.assert_array_equal(loaded.file.data, np.full(2, 1.5))
    np.testing.assert_array_equal(loaded.allow_pickle.data, np.full(3, 1.5))


# -- data, training -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", ["copy", "reverse", "sort"])
def test_sequence_task(task: str) -> None:
    t = SequenceTask(task, n_symbols=5, length=4)
    inputs, targets = t.sample(np.random.default_rng(0), 64)
    assert inputs.shape == targets.shape == (64, 8)
    x = inputs[:, :4]
    assert np.all(inputs[:, 4] == t.sep)
    want = {"copy": x, "reverse": x[:, ::-1], "sort": np.sort(x, axis=1)}[task]
    np.testing.assert_array_equal(targets[:, 4:], want)
    np.testing.assert_array_equal(inputs[:, 5:], want[:, :-1])  # teacher forcing: the answer shifted by one
    assert np.all(targets[:, :4] == IGNORE)
    again, _ = t.sample(np.random.default_rng(0), 64)
    np.testing.assert_array_equal(again, inputs)  # deterministic for a seed
    assert not t.is_heldout(x).any()
    held, _ = t.sample(np.random.default_rng(0), 64, heldout=True)
    assert t.is_heldout(held[:, :4]).all()
    with pytest.raises(ValueError, match="task"):
        SequenceTask("shuffle")


@pytest.mark.parametrize("n_symbols", [2, 3, 4, 5])
@pytest.mark.parametrize("length", [1, 2, 3])
def test_a_task_whose_split_would_be_empty_is_refused(n_symbols: int, length: int) -> None:
    """Sampling from an empty split would never end: the task is refused exactly when one of its splits, found
    here by listing every prompt, is empty."""
    every = np.array(list(itertools.product(range(n_symbols), repeat=length)))
    heldout = SequenceTask("copy", 10, length).is_heldout(every)  # (the hash does not depend on n_symbols)
    if heldout.any() and not heldout.all():
        t = SequenceTask("copy", n_symbols, length)
        assert t.is_heldout(t.sample(np.random.default_rng(0), 4, heldout=True)[0][:, :length]).all()
    else:
        with pytest.raises(ValueError, match=r"no prompt falls in the (held-out|training) split"):
            SequenceTask("copy", n_symbols, length)


def test_greedy_decode_uses_the_model_predictions() -> None:
    """A stub model that always predicts token 3 decodes to all 3s: decoding feeds back predictions."""

    class Constant(Module):
        def forward(self, idx: np.ndarray) -> Tensor:
            logits = np.zeros((*idx.shape, 11))
            logits[..., 3] = 1.0
            return Tensor(logits)

    task = SequenceTask("reverse", 10, 4)
    prompts = np.array([[3, 3, 3, 3], [1, 2, 3, 4]])
    np.testing.assert_array_equal(greedy_decode(Constant(), task, prompts), np.full((2, 4), 3))
    assert evaluate(Constant(), task, prompts) == (pytest.approx(5 / 8), 0.5)


@pytest.mark.parametrize("mode", MODES)
def test_training_reduces_the_loss(mode: str) -> None:
    cfg = TrainConfig(
        task="reverse",
        mode=mode,
        layers=1,
        d_model=32,
        heads=2,
        d_ff=64,
        batch_size=16,
        steps=40,
        length=4,
        warmup=5,
        lr=1e-2,
        eval_size=50,
    )
    result = train(cfg, progress=False)
    start, end = np.mean(result.losses[:3]), np.mean(result.losses[-5:])
    assert start > 2.0  # about ln(10) at initialisation
    assert end < 0.5 * start
    assert result.token_accuracy > 2 * result.chance_accuracy


def test_a_run_shorter_than_its_warmup_still_warms_up(monkeypatch) -> None:
    """--steps 3 with the default warmup of 50: the warmup is cut to 2 steps, not dropped (full lr from step 1);
    the decay's first step is at the peak (it counts from the step before: ``WarmupSchedule``)."""
    lrs: list[float] = []
    step = AdamW.step

    def recording_step(self: AdamW) -> None:
        lrs.append(self.param_groups[0]["lr"])
        step(self)

    monkeypatch.setattr(AdamW, "step", recording_step)
    cfg = TrainConfig(steps=3, lr=1e-2, layers=1, d_model=16, heads=2, d_ff=32, batch_size=2, length=4, eval_size=2)
    assert cfg.warmup == 50
    result = train(cfg, progress=False)
    np.testing.assert_allclose(lrs, [5e-3, 1e-2, 1e-2], atol=1e-15)  # warmup 1/2, 2/2, then cosine at u = 0
    assert result.config.warmup == 2  # the config reported is the one used
    with pytest.raises(ValueError, match="steps must be positive, got 0"):
        train(TrainConfig(steps=0), progress=False)


def test_without_decay_1d_biases_and_norm_gains_take_no_weight_decay(monkeypatch) -> None:
    groups: list[list[dict]] = []
    step = AdamW.step

    def recording_step(self: AdamW) -> None:
        groups.append([dict(g) for g in self.param_groups])
        step(self)

    monkeypatch.setattr(AdamW, "step", recording_step)
    cfg = TrainConfig(steps=1, layers=1, d_model=16, heads=2, d_ff=32, batch_size=2, length=4, eval_size=2)
    train(replace(cfg, weight_decay=0.5), progress=False)
    train(replace(cfg, weight_decay=0.5, decay_1d=False), progress=False)
    (everything,), (matrices, vectors) = groups
    assert everything["weight_decay"] == matrices["weight_decay"] == 0.5 and vectors["weight_decay"] == 0.0
    assert {p.ndim for p in matrices["params"]} == {2} and {p.ndim for p in vectors["params"]} == {1}
    assert len(matrices["params"]) + len(vectors["params"]) == len(everything["params"])
    # by name: each norm's weight and bias, and every Linear's bias, are left undecayed
    model = build_model(cfg, SequenceTask(cfg.task, cfg.n_symbols, cfg.length))
    (matrices, vectors) = decay_groups(model.parameters(), decay_1d=False)
    undecayed = {id(p) for p in vectors["params"]}
    names = {name for name, p in model.named_parameters() if id(p) in undecayed}
    assert names == {name for name, p in model.named_parameters() if "norm" in name or name.endswith("bias")}
    assert main(["train", "--weight-decay", "-1"]) == 2


def test_steps_per_second_leave_out_the_first_step(monkeypatch) -> None:
    """The first step of a run pays for the kernels' first use in the process (a compile on an empty numba cache):
    steps/s are over the steps after it, and the first step's time is reported apart. A clock that reads 0 at
    the start, 10 s after the first step and 13 s at the end: 3 steps in 3 s after a first step of 10 s."""
    from types import SimpleNamespace

    import minigrad_norm.train as train_module

    readings = iter([0.0, 10.0, 13.0])
    monkeypatch.setattr(train_module, "time", SimpleNamespace(perf_counter=lambda: next(readings)))
    cfg = TrainConfig(steps=4, layers=1, d_model=16, heads=2, d_ff=32, batch_size=2, length=4, eval_size=2)
    result = train(cfg, progress=False)
    assert (result.first_step_seconds, result.steps_per_second, result.seconds) == (10.0, 1.0, 13.0)
    assert "first step 10.00 s (numba kernels compiled or loaded on first use), then 1.0 steps/s" in result.summary()
    assert result.to_json()["first_step_seconds"] == 10.0


# -- command line ----------------------------------------------------------------------------------------------
TINY_MODEL = "--d-model 16 --d-ff 32 --heads 2".split()


def test_depth_shows_its_progress_unless_told_not_to(capsys) -> None:
    """``depth`` prints nothing until its table (14 s for the default command): a progress bar over its runs on
    stderr says how far it is, and --no-progress leaves stderr empty."""
    assert main(["depth", "--layers", "1", "2", "--mode", "pre", "post", "--batch-size", "2"] + TINY_MODEL) == 0
    err = capsys.readouterr().err
    assert "depth" in err and "4/4" in err
    assert main(["depth", "--layers", "1", "--batch-size", "2", "--no-progress"] + TINY_MODEL) == 0
    assert capsys.readouterr().err == ""


def test_cli_train_and_depth(tmp_path, capsys) -> None:
    out = tmp_path / "train.json"
    args = ["train", "--steps", "3", "--layers", "1", "--no-progress", "--mode", "pre", "post", "--json", str(out)]
    assert main(args + TINY_MODEL) == 0
    text = capsys.readouterr().out
    assert "held-out accuracy" in text and "steps/s" in text
    runs = json.loads(out.read_text())
    assert [r["config"]["mode"] for r in runs] == ["pre", "post"] and len(runs[0]["losses"]) == 3

    out = tmp_path / "depth.json"
    assert main(["depth", "--layers", "2", "3", "--batch-size", "2", "--json", str(out)] + TINY_MODEL) == 0
    assert "per-layer factor" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert sorted((r["mode"], r["layers"]) for r in data["runs"]) == sorted((m, n) for m in MODES for n in (2, 3))
    assert all(len(r["residual_grad_norm"]) == r["layers"] for r in data["runs"])


def test_cli_plots(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="plots need the 'plot' extra")
    png = tmp_path / "depth.png"
    assert (
        main(["depth", "--layers", "2", "--batch-size", "2", "--train-steps", "1", "--plot", str(png)] + TINY_MODEL)
        == 0
    )
    assert png.stat().st_size > 1000
    png = tmp_path / "loss.png"
    argv = ["train", "--steps", "2", "--layers", "1", "--clip", "0", "--no-progress", "--plot", str(png)]  # 0 = off
    assert main(argv + TINY_MODEL) == 0
    assert png.stat().st_size > 1000


def test_depth_residual_norms_are_the_gradients_at_block_inputs() -> None:
    """The depth experiment's numbers against an independent backward with ``grad``."""
    cfg = DepthConfig(layers=(3,), modes=("post",), d_model=16, heads=2, d_ff=32, batch_size=2)
    (run,) = run_experiment(cfg)
    task = SequenceTask("reverse", 10, cfg.length)
    model = TransformerLM(
        task.vocab_size,
        16,
        2,
        32,
        3,
        task.seq_len,
        "post",
        dtype=np.float64,
        init="xavier",
        rng=np.random.default_rng(cfg.seed),
    )
    inputs, targets = task.sample(np.random.default_rng([cfg.seed, 1]), 2)
    hidden: list[Tensor] = []
    loss = F.cross_entropy(model(inputs, hidden=hidden).transpose(1, 2), targets)
    grads = grad(loss, hidden)
    np.testing.assert_allclose(run.residual, [np.linalg.norm(g) for g in grads], rtol=1e-10)
    assert run.loss == pytest.approx(loss.item())


def test_functional_call_swaps_parameters_for_one_call(rng: np.random.Generator) -> None:
    lin = Linear(3, 2, dtype=np.float64, rng=rng)
    original = lin.weight
    w = Tensor(np.eye(2, 3), requires_grad=True)
    x = Tensor(np.array([[1.0, 2.0, 3.0]]))
    np.testing.assert_array_equal(functional_call(lin, {"weight": w}, x).data, x.data[:, :2] + lin.bias.data)
    assert lin.weight is original  # restored after the call
    # PyTorch ignores a name the module lacks unless strict=True: we refuse it always, with its strict message
    with pytest.raises(
        RuntimeError, match=re.escape("Error(s) in reparametrizing for Linear:\n\tUnexpected key(s): 'wieght'.")
    ):
        functional_call(lin, {"wieght": w}, x)
    with pytest.raises(TypeError, match="parameter 'weight' must be a Tensor or None, got numpy.ndarray"):
        functional_call(lin, {"weight": np.eye(2, 3)}, x)
    assert lin.weight is original


def test_cli_rejects_bad_options_before_any_work(capsys) -> None:
    assert main(["train", "--heads", "3"]) == 2
    assert "--d-model 64 must be divisible by --heads 3" in capsys.readouterr().err
    assert main(["train", "--steps", "0"]) == 2
    assert "--steps must be positive" in capsys.readouterr().err
    assert main(["depth", "--layers", "0", "4"]) == 2
    assert "--layers 0" in capsys.readouterr().err
