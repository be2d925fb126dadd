"""Neural-network modules (PyTorch's names, parameter layouts and defaults)."""

from minigrad_norm.nn.attention import MultiHeadSelfAttention
from minigrad_norm.nn.linear import Embedding, Linear
from minigrad_norm.nn.module import Module, ModuleList, Parameter, functional_call
from minigrad_norm.nn.norm import (
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    GroupNorm,
    InstanceNorm1d,
    InstanceNorm2d,
    InstanceNorm3d,
    LayerNorm,
    RMSNorm,
)
from minigrad_norm.nn.transformer import FeedForward, TransformerBlock, TransformerLM

__all__ = [
    "Embedding",
    "FeedForward",
    "Linear",
    "MultiHeadSelfAttention",
    "TransformerBlock",
    "TransformerLM",
    "functional_call",
    "Module",
    "ModuleList",
    "Parameter",
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
