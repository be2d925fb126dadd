"""Multi-head self-attention, with its core as one graph node.

For each head h, with Q = x Wq^T + bq (and K, V alike) split into heads of
size d_head = d_model / n_heads::

    S = Q_h K_h^T / sqrt(d_head)            scores, (T_query, T_key)
    S = -inf where masked                    causal and/or key padding
    P = softmax(S) over keys                 each query row sums to 1
    O_h = P V_h                              (T_query, d_head)

and the heads are concatenated again and projected by ``out_proj``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minigrad_norm.functional import softmax_grad
from minigrad_norm.nn.linear import Linear
from minigrad_norm.nn.module import Module
from minigrad_norm.tensor import Context, Function, Tensor


def _split_heads(a: np.ndarray, n_heads: int) -> np.ndarray:
    """(B, T, D) -> (B, H, T, D/H)."""
    b, t, d = a.shape
    return a.reshape(b, t, n_heads, d // n_heads).transpose(0, 2, 1, 3)


def _merge_heads(a: np.ndarray) -> np.ndarray:
    """(B, H, T, D/H) -> (B, T, D)."""
    b, h, t, dh = a.shape
    return a.transpose(0, 2, 1, 3).reshape(b, t, h * dh)


class Attention(Function):
    """Scaled dot-product attention over heads: inputs q, k, v of shape (B, T, D), output (B, T, D).

    Forward, per head, with c = 1/sqrt(d_head) and M the boolean mask (True = may not attend)::

        S = c Q K^T;  S[M] = -inf;  P = softmax(S, keys);  O = P V

    A query whose every key is masked has no softmax (0/0): its row of P is 0, so its output is 0 and
    it passes no gradient, as in PyTorch's ``scaled_dot_product_attention`` (the path its
    ``TransformerEncoderLayer`` and ``MultiheadAttention(need_weights=False)`` take, except in eval mode
    under ``no_grad``, where their fast path gives NaN). Left padding
    under a causal mask makes such queries: the padded positions before the first real token.

    Backward, from G = dL/dO (the softmax rule dS = P * (dP - rowsum(dP * P))
    gives masked entries zero gradient, since P is 0 there)::

        dV = P^T G
        dP = G V^T
        dS = P * (dP - rowsum(dP * P))
        dQ = c dS K
        dK = c dS^T Q
    """

    @staticmethod
    def forward(
        ctx: Context, q: np.ndarray, k: np.ndarray, v: np.ndarray, n_heads: int, mask: np.ndarray | None
    ) -> np.ndarray:
        qh, kh, vh = (_split_heads(a, n_heads) for a in (q, k, v))
        scale = 1.0 / math.sqrt(qh.shape[-1])
        s = (qh @ kh.swapaxes(-1, -2)) * scale
        dead = None
        if mask is not None:
            s = np.where(mask, np.asarray(-np.inf, dtype=s.dtype), s)
            dead = np.all(mask, axis=-1, keepdims=True)  # queries with every key masked
            if dead.any():
                s = np.where(dead, np.asarray(0, dtype=s.dtype), s)  # a finite row, zeroed below
        s -= s.max(axis=-1, keepdims=True, initial=-np.inf)  # (initial: a sequence of length 0 has no keys)
        p = np.exp(s, out=s)
        p /= p.sum(axis=-1, keepdims=True)
        if dead is not None and dead.any():
            p = np.where(dead, np.asarray(0, dtype=p.dtype), p)
        ctx.n_heads, ctx.scale = n_heads, scale
        ctx.save_for_backward(qh, kh, vh, p)
        return _merge_heads(p @ vh)

    @staticmethod
    def backward(ctx: Context, g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, None, None]:
        qh, kh, vh, p = ctx.saved_tensors
        gh = _split_heads(g, ctx.n_heads)
        dv = p.swapaxes(-1, -2) @ gh
        dp = gh @ vh.swapaxes(-1, -2)
        ds = softmax_grad(p, dp, axis=-1)
        ds *= ctx.scale
        dq = ds @ kh
        dk = ds.swapaxes(-1, -2) @ qh
        return _merge_heads(dq), _merge_heads(dk), _merge_heads(dv), None, None


def attention_mask(batch: int, seq: int, causal: bool, key_padding_mask: Any = None) -> np.ndarray | None:
    """The boolean mask (True = may not attend), broadcastable to (batch, heads, seq, seq), or None."""
    mask = np.triu(np.ones((seq, seq), dtype=bool), k=1)[None, None] if causal else None
    if key_padding_mask is not None:
        kpm = np.asarray(key_padding_mask.data if isinstance(key_padding_mask, Tensor) else key_padding_mask)
        if kpm.dtype != np.bool_:
            raise TypeError(f"attention: key_padding_mask must be boolean (True = padding), got dtype {kpm.dtype}")
        if kpm.shape != (batch, seq):
            raise ValueError(
                f"attention: key_padding_mask must have shape (batch, seq) = {(batch, seq)}, got {kpm.shape}"
            )
        kpm = kpm[:, None, None, :]
        mask = kpm if mask is None else mask | kpm
    return mask


def attention(q: Tensor, k: Tensor, v: Tensor, n_heads: int, mask: np.ndarray | None = None) -> Tensor:
    """Multi-head scaled dot-product attention of (B, T, D) tensors; ``mask`` True where not allowed."""
    if q.ndim != 3 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(
            f"attention: q, k, v must share one (batch, seq, d_model) shape, got {q.shape}, {k.shape}, {v.shape}"
        )
    if q.shape[-1] % n_heads:
        raise ValueError(f"attention: d_model={q.shape[-1]} is not divisible by n_heads={n_heads}")
    if mask is not None:
        mask = np.asarray(mask.data if isinstance(mask, Tensor) else mask)
        b, t = q.shape[:2]
        if mask.dtype != np.bool_:  # (a float mask is additive in PyTorch: not the same thing)
            raise TypeError(f"attention: mask must be boolean (True = may not attend), got dtype {mask.dtype}")
        target = (b, n_heads, t, t)
        try:
            fits = np.broadcast_shapes(mask.shape, target) == target
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(
                f"attention: mask of shape {mask.shape} does not broadcast to (batch, heads, seq, seq) = {target}"
            )
    return Attention.apply(q, k, v, n_heads, mask)


class MultiHeadSelfAttention(Module):
    """Self-attention with ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj`` Linears (d_model -> d_model).

    ``forward(x, key_padding_mask=None)``: x of shape (batch, seq, d_model);
    ``key_padding_mask`` boolean (batch, seq), True at keys to ignore, as in
    ``torch.nn.MultiheadAttention``. With ``causal=True`` position i attends
    to positions <= i only.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        bias: bool = True,
        causal: bool = False,
        *,
        dtype: Any = np.float32,
        rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__()
        if n_heads <= 0 or d_model % n_heads:
            raise ValueError(f"MultiHeadSelfAttention: d_model={d_model} must be divisible by n_heads={n_heads}")
        rng = np.random.default_rng() if rng is None else rng
        self.d_model, self.n_heads, self.causal = d_model, n_heads, causal
        self.q_proj = Linear(d_model, d_model, bias, dtype=dtype, rng=rng)
        self.k_proj = Linear(d_model, d_model, bias, dtype=dtype, rng=rng)
        self.v_proj = Linear(d_model, d_model, bias, dtype=dtype, rng=rng)
        self.out_proj = Linear(d_model, d_model, bias, dtype=dtype, rng=rng)

    def forward(self, x: Tensor, key_padding_mask: Any = None) -> Tensor:
        if x.ndim != 3 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"MultiHeadSelfAttention: input must be (batch, seq, d_model={self.d_model}), got shape {x.shape}"
            )
        mask = attention_mask(x.shape[0], x.shape[1], self.causal, key_padding_mask)
        out = attention(self.q_proj(x), self.k_proj(x), self.v_proj(x), self.n_heads, mask)
        return self.out_proj(out)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, causal={self.causal}"
