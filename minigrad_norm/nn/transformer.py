"""A Transformer block in three norm placements, and a small decoder-only language model.

Pre-Norm (GPT-2 and most models since)::

    x = x + attn(norm1(x))
    x = x + ffn(norm2(x))

Post-Norm (Vaswani et al. 2017, the original)::

    x = norm1(x + attn(x))
    x = norm2(x + ffn(x))

DeepNorm (Wang et al. 2022, "DeepNet"): Post-Norm with the residual
up-weighted, for N layers::

    x = norm1(alpha * x + attn(x))
    x = norm2(alpha * x + ffn(x))
    alpha = (2N)^(1/4)

alpha multiplies the residual (the skip path), not the branch: at every layer
the norm then sees a sum dominated by the incoming stream, so its Jacobian
stays close to an identity and gradients pass through N layers without the
Post-Norm shrinkage. The DeepNet initialisation also scales the initial
weights and biases of ``ffn.fc1``, ``ffn.fc2``, ``attn.v_proj`` and
``attn.out_proj`` by beta = (8N)^(-1/4) (as torchscale does after its
default initialisation; ``q_proj`` and ``k_proj`` are left alone, since the
scores' scale does not grow the residual), bounding the size of each update
to the residual stream. These are the constants for a decoder-only (or
encoder-only) stack of N layers.

Initialisation: ``init="torch"`` (default) keeps PyTorch's ``Linear`` init,
U(-1/sqrt(fan_in), 1/sqrt(fan_in)), so that weights can be compared with
``torch.nn.TransformerEncoderLayer``. ``init="xavier"`` redraws every Linear
weight of the blocks from Xavier-normal (gain 1) with zero biases, the setting
of Vaswani et al., Xiong et al. 2020 and DeepNet (DeepNorm's beta is applied
on top of either); ``TransformerLM``'s embeddings and head keep their own init.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import minigrad_norm.functional as F
from minigrad_norm.nn.attention import MultiHeadSelfAttention
from minigrad_norm.nn.linear import Embedding, Linear, xavier_normal_
from minigrad_norm.nn.module import Module, ModuleList
from minigrad_norm.nn.norm import LayerNorm, RMSNorm
from minigrad_norm.tensor import Tensor

MODES = ("pre", "post", "deepnorm")
NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("relu", "gelu")
INITS = ("torch", "xavier")


def deepnorm_constants(num_layers: int) -> tuple[float, float]:
    """(alpha, beta) = ((2N)^(1/4), (8N)^(-1/4)) for N layers."""
    if num_layers < 1:
        raise ValueError(f"deepnorm_constants: num_layers must be >= 1, got {num_layers}")
    return (2.0 * num_layers) ** 0.25, (8.0 * num_layers) ** -0.25


def make_norm(norm: str, d_model: int, eps: float, bias: bool, dtype: Any) -> Module:
    if norm == "layernorm":
        return LayerNorm(d_model, eps=eps, bias=bias, dtype=dtype)
    if norm == "rmsnorm":
        return RMSNorm(d_model, eps=eps, dtype=dtype)
    raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")


class FeedForward(Module):
    """fc2(activation(fc1(x))): d_model -> d_ff -> d_model. ``gelu`` is the exact (erf) form, as PyTorch's."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: str = "relu",
        bias: bool = True,
        *,
        dtype: Any = np.float32,
        rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"FeedForward: activation must be one of {ACTIVATIONS}, got {activation!r}")
        rng = np.random.default_rng() if rng is None else rng
        self.activation = activation
        self.fc1 = Linear(d_model, d_ff, bias, dtype=dtype, rng=rng)
        self.fc2 = Linear(d_ff, d_model, bias, dtype=dtype, rng=rng)

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc1(x)
        return self.fc2(F.relu(h) if self.activation == "relu" else F.gelu(h))

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


class TransformerBlock(Module):
    """Self-attention and feed-forward sublayers with residuals, normalised per ``mode`` (see the module doc).

    Input and output (batch, seq, d_model). With the same weights, ``mode="pre"``
    / ``"post"``, ``norm="layernorm"`` and ReLU/GELU, this computes what
    ``torch.nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout=0.0,
    activation=..., batch_first=True, norm_first=(mode == "pre"))`` computes
    with a causal ``src_mask`` (the q/k/v Linears are the three row blocks of
    its ``in_proj_weight``).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        *,
        mode: str = "pre",
        norm: str = "layernorm",
        activation: str = "relu",
        causal: bool = True,
        eps: float = 1e-5,
        num_layers: int = 1,
        bias: bool = True,
        dtype: Any = np.float32,
        init: str = "torch",
        rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"TransformerBlock: mode must be one of {MODES}, got {mode!r}")
        if init not in INITS:
            raise ValueError(f"TransformerBlock: init must be one of {INITS}, got {init!r}")
        rng = np.random.default_rng() if rng is None else rng
        self.mode, self.norm = mode, norm
        self.attn = MultiHeadSelfAttention(d_model, n_heads, bias, causal, dtype=dtype, rng=rng)
        self.ffn = FeedForward(d_model, d_ff, activation, bias, dtype=dtype, rng=rng)
        self.norm1 = make_norm(norm, d_model, eps, bias, dtype)
        self.norm2 = make_norm(norm, d_model, eps, bias, dtype)
        linears = (self.attn.q_proj, self.attn.k_proj, self.attn.v_proj, self.attn.out_proj, self.ffn.fc1, self.ffn.fc2)
        if init == "xavier":
            for layer in linears:
                xavier_normal_(layer.weight, 1.0, rng)
                if layer.bias is not None:
                    layer.bias.data[...] = 0
        self.alpha = 1.0
        if mode == "deepnorm":
            self.alpha, beta = deepnorm_constants(num_layers)
            for layer in (self.ffn.fc1, self.ffn.fc2, self.attn.v_proj, self.attn.out_proj):
                for p in (layer.weight, layer.bias):
                    if p is not None:
                        p.data *= beta

    def forward(self, x: Tensor, key_padding_mask: Any = None) -> Tensor:
        if self.mode == "pre":
            x = x + self.attn(self.norm1(x), key_padding_mask)
            return x + self.ffn(self.norm2(x))
        # post and deepnorm: the norm comes after the residual sum; alpha = 1 for post
        residual = x if self.alpha == 1.0 else x * self.alpha
        x = self.norm1(residual + self.attn(x, key_padding_mask))
        residual = x if self.alpha == 1.0 else x * self.alpha
        return self.norm2(residual + self.ffn(x))

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}, norm={self.norm!r}" + (
            f", alpha={self.alpha:.4g}" if self.mode == "deepnorm" else ""
        )


class TransformerLM(Module):
    """A decoder-only language model: token + learned position embeddings, blocks, (final norm), linear head.

    ``forward(idx)`` maps integer tokens (batch, seq) to logits (batch, seq,
    vocab_size). The final norm ``norm_f`` exists only in Pre-Norm mode (in
    Post-Norm and DeepNorm every block already ends with a norm). Pass a list
    as ``hidden`` to receive the residual stream at each block's input (for
    ``retain_grad``).
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        n_heads: int,
        d_ff: int,
        n_layers: int,
        max_seq_len: int,
        mode: str = "pre",
        norm: str = "layernorm",
        *,
        activation: str = "relu",
        eps: float = 1e-5,
        bias: bool = True,
        dtype: Any = np.float32,
        init: str = "torch",
        rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__()
        # Checked here too, since with n_layers=0 no block is built to check them.
        for name, value, allowed in (
            ("mode", mode, MODES),
            ("norm", norm, NORMS),
            ("activation", activation, ACTIVATIONS),
            ("init", init, INITS),
        ):
            if value not in allowed:
                raise ValueError(f"TransformerLM: {name} must be one of {allowed}, got {value!r}")
        if n_layers < 0:
            raise ValueError(f"TransformerLM: n_layers must be >= 0, got {n_layers}")
        rng = np.random.default_rng() if rng is None else rng
        self.max_seq_len = max_seq_len
        self.tok_emb = Embedding(vocab_size, d_model, dtype=dtype, rng=rng)
        self.pos_emb = Embedding(max_seq_len, d_model, dtype=dtype, rng=rng)
        self.blocks = ModuleList(
            [
                TransformerBlock(
                    d_model,
                    n_heads,
                    d_ff,
                    mode=mode,
                    norm=norm,
                    activation=activation,
                    causal=True,
                    eps=eps,
                    num_layers=n_layers,
                    bias=bias,
                    dtype=dtype,
                    init=init,
                    rng=rng,
                )
                for _ in range(n_layers)
            ]
        )
        self.norm_f = make_norm(norm, d_model, eps, bias, dtype) if mode == "pre" else None
        self.head = Linear(d_model, vocab_size, bias, dtype=dtype, rng=rng)

    def forward(self, idx: Any, key_padding_mask: Any = None, hidden: list[Tensor] | None = None) -> Tensor:
        idx = np.asarray(idx.data if isinstance(idx, Tensor) else idx)
        if idx.ndim != 2:
            raise ValueError(f"TransformerLM: tokens must be (batch, seq), got shape {idx.shape}")
        if idx.shape[1] > self.max_seq_len:
            raise ValueError(f"TransformerLM: sequence length {idx.shape[1]} exceeds max_seq_len={self.max_seq_len}")
        x = self.tok_emb(idx) + self.pos_emb(np.arange(idx.shape[1]))
        for block in self.blocks:
            if hidden is not None:
                hidden.append(x)
            x = block(x, key_padding_mask)
        if self.norm_f is not None:
            x = self.norm_f(x)
        return self.head(x)
