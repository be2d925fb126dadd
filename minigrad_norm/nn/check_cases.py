"""Gradcheck rows for ``minigrad-norm check``: one tiny float64 Transformer block per mode and norm.

Each row differentiates the block's output with respect to its input and
every parameter (``functional_call`` makes the block a function of them).
The parameters are random, not the 1/0 a norm starts with, so that the
norms' weight and bias gradients are checked at a generic point.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from minigrad_norm.check import CheckCase
from minigrad_norm.nn.module import functional_call
from minigrad_norm.nn.transformer import MODES, NORMS, TransformerBlock
from minigrad_norm.tensor import Tensor

Inputs = tuple[Tensor, ...]

#: batch, seq, d_model, heads, d_ff: small enough that central differences over all ~200 inputs stay fast
TINY = (2, 3, 4, 2, 6)


def tiny_block(mode: str, norm: str, activation: str) -> TransformerBlock:
    _, _, d_model, n_heads, d_ff = TINY
    # num_layers=3 so that DeepNorm's alpha (6^(1/4)) differs from 1
    return TransformerBlock(
        d_model, n_heads, d_ff, mode=mode, norm=norm, activation=activation, num_layers=3, dtype=np.float64
    )


def block_inputs(block: TransformerBlock) -> Callable[[np.random.Generator], Inputs]:
    """Random input (batch, seq, d_model) followed by random values for every parameter, in named order."""
    batch, seq, d_model, _, _ = TINY

    def make(rng: np.random.Generator) -> Inputs:
        x = Tensor(rng.standard_normal((batch, seq, d_model)), requires_grad=True)
        params = [Tensor(rng.uniform(-1, 1, p.shape), requires_grad=True) for p in block.parameters()]
        return (x, *params)

    return make


def block_fn(block: TransformerBlock) -> Callable[..., Tensor]:
    names = [name for name, _ in block.named_parameters()]

    def fn(x: Tensor, *params: Tensor) -> Tensor:
        return functional_call(block, dict(zip(names, params, strict=True)), x)

    return fn


def _block_cases() -> list[CheckCase]:
    cases = []
    for mode in MODES:
        for norm in NORMS:
            activation = "gelu" if norm == "layernorm" else "relu"
            b = tiny_block(mode, norm, activation)
            key_bias = 1 + [name for name, _ in b.named_parameters()].index("attn.k_proj.bias")
            note = (
                f"input {key_bias} is attn.k_proj.bias, whose gradient is zero: it adds q . b_k to every score of a "
                "query, which softmax ignores"
            )
            cases.append(CheckCase(f"block {mode} {norm} {activation}", block_inputs(b), block_fn(b), note=note))
    return cases


BLOCK_CASES: list[CheckCase] = _block_cases()
