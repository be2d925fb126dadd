"""``Module``: parameters, buffers, submodules, train/eval and state dicts, as in PyTorch.

A module's parameters are the Tensors with ``requires_grad`` among its
attributes, its submodules the Module attributes (and ModuleLists); buffers
(running statistics, counters) are plain ndarrays declared with
``register_buffer``. Names are dotted paths: ``attn.q_proj.weight``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from minigrad_norm.tensor import Tensor


class Module:
    training: bool = True

    def __init__(self) -> None:
        object.__setattr__(self, "_buffers", {})
        self.training = True

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    # -- registration ----------------------------------------------------------
    def register_buffer(self, name: str, value: np.ndarray | None) -> None:
        """A named array saved in the state dict but not trained (e.g. running_mean)."""
        self._buffers[name] = value

    def __getattr__(self, name: str) -> Any:
        buffers = self.__dict__.get("_buffers", {})
        if name in buffers:
            return buffers[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__.get("_buffers", {}):
            self._buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def children(self) -> Iterator[tuple[str, Module]]:
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value

    # -- traversal -----------------------------------------------------------------
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        yield prefix, self
        for name, child in self.children():
            yield from child.named_modules(f"{prefix}{name}.")

    def named_parameters(self) -> Iterator[tuple[str, Tensor]]:
        for prefix, module in self.named_modules():
            for name, value in vars(module).items():
                if isinstance(value, Tensor) and value.requires_grad:
                    yield f"{prefix}{name}", value

    def parameters(self) -> list[Tensor]:
        return [p for _, p in self.named_parameters()]

    def named_buffers(self) -> Iterator[tuple[str, np.ndarray]]:
        for prefix, module in self.named_modules():
            for name, value in module._buffers.items():
                if value is not None:
                    yield f"{prefix}{name}", value

    # -- modes and gradients -------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        for _, module in self.named_modules():
            module.training = mode
        return self

    def eval(self) -> Module:
        return self.train(False)

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    # -- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of every parameter and buffer, by dotted name."""
        state = {name: p.data.copy() for name, p in self.named_parameters()}
        state.update({name: np.array(b, copy=True) for name, b in self.named_buffers()})
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Copy ``state`` into the parameters and buffers in place; strict about names and shapes."""
        targets: dict[str, np.ndarray] = {name: p.data for name, p in self.named_parameters()}
        targets.update(dict(self.named_buffers()))
        missing = sorted(set(targets) - set(state))
        unexpected = sorted(set(state) - set(targets))
        if missing or unexpected:
            raise KeyError(
                f"load_state_dict for {type(self).__name__}: missing keys {missing}, unexpected keys {unexpected}"
            )
        for name, target in targets.items():
            value = np.asarray(state[name])
            if value.shape != target.shape:
                raise ValueError(
                    f"load_state_dict for {type(self).__name__}: {name!r} has shape {value.shape} in the "
                    f"state dict but {target.shape} in the module"
                )
            target[...] = value

    def save(self, path: str) -> None:
        np.savez(path, **self.state_dict())

    def load(self, path: str) -> None:
        with np.load(path) as f:
            self.load_state_dict({k: f[k] for k in f.files})

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, child in self.children():
            lines.append(f"  ({name}): " + repr(child).replace("\n", "\n  "))
        return "\n".join(lines) + ")" if len(lines) > 1 else lines[0] + ")"


class ModuleList(Module):
    """A list of submodules, named ``0``, ``1``, ... in parameter names."""

    def __init__(self, modules: list[Module] | None = None) -> None:
        super().__init__()
        self._list: list[Module] = []
        for m in modules or []:
            self.append(m)

    def append(self, module: Module) -> None:
        self._list.append(module)
        object.__setattr__(self, str(len(self._list) - 1), module)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._list)

    def __len__(self) -> int:
        return len(self._list)

    def __getitem__(self, i: int) -> Module:
        return self._list[i]

    def children(self) -> Iterator[tuple[str, Module]]:
        for i, m in enumerate(self._list):
            yield str(i), m
