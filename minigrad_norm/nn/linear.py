"""``Linear`` and ``Embedding``: PyTorch's layouts and initialisations.

Random initialisation draws from ``rng`` (a ``np.random.Generator``); pass
one seeded generator to every module of a model to make it reproducible.
Without one, a fresh unseeded generator is used.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minigrad_norm.functional import embedding, linear
from minigrad_norm.nn.module import Module, Parameter, factory_dtype
from minigrad_norm.tensor import Tensor


def parameter(data: np.ndarray, dtype: Any) -> Parameter:
    """A trainable leaf of the given dtype."""
    return Parameter(np.asarray(data, dtype=dtype))


def xavier_normal_(weight: Tensor, gain: float, rng: np.random.Generator) -> None:
    """Redraw a (fan_out, fan_in) weight in place from N(0, gain^2 * 2 / (fan_in + fan_out)) (Glorot & Bengio)."""
    fan_out, fan_in = weight.shape
    std = gain * math.sqrt(2.0 / (fan_in + fan_out))
    weight.data[...] = rng.normal(0.0, std, weight.shape)


class Linear(Module):
    """y = x @ weight^T + bias, ``weight`` of shape (out_features, in_features).

    Initialisation as ``torch.nn.Linear``: weight and bias both uniform in
    [-1/sqrt(in_features), 1/sqrt(in_features)] (kaiming_uniform with a=sqrt(5)
    reduces to that bound for the weight).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        device: Any = None,
        dtype: Any = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__()
        dtype = factory_dtype("Linear", device, dtype)
        if in_features <= 0 or out_features <= 0:
            raise ValueError(f"Linear: features must be positive, got in={in_features}, out={out_features}")
        rng = np.random.default_rng() if rng is None else rng
        bound = 1.0 / math.sqrt(in_features)
        self.in_features, self.out_features = in_features, out_features
        self.weight = parameter(rng.uniform(-bound, bound, (out_features, in_features)), dtype)
        self.bias = parameter(rng.uniform(-bound, bound, out_features), dtype) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    """Row lookup in ``weight`` of shape (num_embeddings, embedding_dim), initialised N(0, 1) as PyTorch."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        device: Any = None,
        dtype: Any = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__()
        dtype = factory_dtype("Embedding", device, dtype)
        if num_embeddings <= 0 or embedding_dim <= 0:
            raise ValueError(f"Embedding: sizes must be positive, got ({num_embeddings}, {embedding_dim})")
        rng = np.random.default_rng() if rng is None else rng
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = parameter(rng.standard_normal((num_embeddings, embedding_dim)), dtype)

    def forward(self, indices: Any) -> Tensor:
        return embedding(indices, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"
