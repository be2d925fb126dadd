"""``Module``: parameters, buffers, submodules, train/eval and state dicts, as in PyTorch.

A module's parameters are its ``Parameter`` attributes (Tensors that stay
parameters when frozen with ``requires_grad = False``, as PyTorch's
``nn.Parameter``), its submodules the Module attributes (and ModuleLists); buffers
(running statistics, counters) are plain ndarrays declared with
``register_buffer``. Names are dotted paths: ``attn.q_proj.weight``. A
parameter or submodule reachable under two names (weight tying) is listed
once, under the first name, as in PyTorch.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from minigrad_norm.tensor import Tensor


class Parameter(Tensor):
    """A Tensor that a Module owns as a parameter: listed by ``parameters()`` and kept in the
    state dict whether or not it currently requires grad. Trainable by default."""

    def __init__(self, data: Any, requires_grad: bool = True) -> None:
        super().__init__(data, requires_grad=requires_grad)


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
        if "_buffers" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}: call super().__init__() before register_buffer")
        if name in self.__dict__:
            raise KeyError(f"register_buffer: {type(self).__name__} already has an attribute {name!r}")
        self._buffers[name] = value

    def __getattr__(self, name: str) -> Any:
        if "_buffers" not in self.__dict__:
            raise AttributeError(
                f"{type(self).__name__} has no attribute {name!r} (did its __init__ call super().__init__()?)"
            )
        buffers = self.__dict__["_buffers"]
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
        """This module and every submodule once each, with its name prefix (``""``, ``"attn."``, ...)."""
        seen: set[int] = set()
        stack: list[tuple[str, Module]] = [(prefix, self)]
        while stack:
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield name, module
            stack.extend((f"{name}{child_name}.", child) for child_name, child in reversed(list(module.children())))

    def named_parameters(self) -> Iterator[tuple[str, Tensor]]:
        seen: set[int] = set()
        for prefix, module in self.named_modules():
            for name, value in vars(module).items():
                if isinstance(value, Parameter) and id(value) not in seen:
                    seen.add(id(value))
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

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Copy ``state`` into the parameters and buffers in place; strict about names and shapes.

        Everything is checked before anything is copied, so a failed load
        leaves the module as it was. Values are cast to each target's dtype.
        """
        targets: dict[str, np.ndarray] = {name: p.data for name, p in self.named_parameters()}
        targets.update({name: np.asarray(b) for name, b in self.named_buffers()})
        missing = sorted(set(targets) - set(state))
        unexpected = sorted(set(state) - set(targets))
        if missing or unexpected:
            raise KeyError(
                f"load_state_dict for {type(self).__name__}: missing keys {missing}, unexpected keys {unexpected}"
            )
        values = {name: np.asarray(state[name]) for name in targets}
        for name, target in targets.items():
            if values[name].shape != target.shape:
                raise ValueError(
                    f"load_state_dict for {type(self).__name__}: {name!r} has shape {values[name].shape} in "
                    f"the state dict but {target.shape} in the module"
                )
        for name, target in targets.items():
            target[...] = values[name]

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the state dict to ``path`` as an ``.npz`` archive (exactly that path: no suffix is added)."""
        with open(path, "wb") as f:
            np.savez(f, **self.state_dict())

    def load(self, path: str | os.PathLike[str]) -> None:
        """Load a state dict written by ``save`` (strict, as ``load_state_dict``)."""
        with np.load(path, allow_pickle=False) as f:
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


@contextlib.contextmanager
def _swapped_parameters(module: Module, tensors: Mapping[str, Tensor]) -> Iterator[None]:
    owners = {}
    for prefix, m in module.named_modules():
        for name, value in vars(m).items():
            if isinstance(value, Parameter):
                owners.setdefault(f"{prefix}{name}", (m, name))
    unknown = sorted(set(tensors) - set(owners))
    if unknown:
        raise KeyError(f"functional_call: {type(module).__name__} has no parameters {unknown}")
    saved = [(owners[k], getattr(*owners[k])) for k in tensors]
    try:
        for k, t in tensors.items():
            object.__setattr__(*owners[k], t)
        yield
    finally:
        for (m, name), old in saved:
            object.__setattr__(m, name, old)


def functional_call(module: Module, tensors: Mapping[str, Tensor], *args: Any, **kwargs: Any) -> Any:
    """``module(*args, **kwargs)`` with the named parameters replaced by ``tensors`` for this call only.

    Like ``torch.func.functional_call``: it turns a module into a function of
    its parameters, which is what ``gradcheck`` needs to differentiate with
    respect to them.
    """
    with _swapped_parameters(module, tensors):
        return module(*args, **kwargs)
