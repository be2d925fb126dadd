"""Neural-network modules (PyTorch's names, parameter layouts and defaults)."""

from minigrad_norm.nn.module import Module, ModuleList

__all__ = ["Module", "ModuleList"]
