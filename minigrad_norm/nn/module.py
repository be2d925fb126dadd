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
from typing import Any, NamedTuple

import numpy as np

from minigrad_norm.tensor import Tensor


class Parameter(Tensor):
    """A Tensor that a Module owns as a parameter: listed by ``parameters()`` and kept in the
    state dict whether or not it currently requires grad. Trainable by default."""

    def __init__(self, data: Any, requires_grad: bool = True) -> None:
        super().__init__(data, requires_grad=requires_grad)


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict(..., strict=False)`` left out, as PyTorch's ``_IncompatibleKeys``: the
    module's entries the state dict lacked, and the state dict's entries the module has no place for."""

    missing_keys: list[str]
    unexpected_keys: list[str]

    def __repr__(self) -> str:
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return f"IncompatibleKeys(missing_keys={self.missing_keys}, unexpected_keys={self.unexpected_keys})"


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
        # as PyTorch (ValueError): "False" would be read as true, and the norms would then refuse the
        # flag they are passed at every forward
        if not isinstance(mode, bool | np.bool_):
            raise ValueError(f"{type(self).__name__}.train: mode must be a bool, got {type(mode).__name__} {mode!r}")
        for _, module in self.named_modules():
            module.training = bool(mode)
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

    def _optional_state(self) -> tuple[str, ...]:
        """This module's own entries (not its submodules') that a state dict may lack: the module then
        keeps its value, even with ``strict``."""
        return ()

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> IncompatibleKeys:
        """Copy ``state_dict`` into the parameters and buffers in place, as PyTorch's ``load_state_dict``.

        With ``strict`` a missing or unexpected key is an error; without it those are skipped, the rest is
        loaded, and the returned ``IncompatibleKeys`` lists them. A shape mismatch is an error either way.
        Errors are ``RuntimeError`` listing every problem, as PyTorch's ("Error(s) in loading state_dict
        for ..."). Everything is checked before anything is copied, so a failed load leaves the module as
        it was (PyTorch copies the entries before the failing one). Values are cast to each target's dtype.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"load_state_dict: expected state_dict to be a mapping, got {type(state_dict).__name__}")
        if not isinstance(strict, bool | np.bool_):
            raise TypeError(f"load_state_dict: strict must be a bool, got {type(strict).__name__} {strict!r}")
        targets: dict[str, np.ndarray] = {name: p.data for name, p in self.named_parameters()}
        targets.update({name: np.asarray(b) for name, b in self.named_buffers()})
        optional = {f"{prefix}{name}" for prefix, module in self.named_modules() for name in module._optional_state()}
        missing = [name for name in targets if name not in state_dict and name not in optional]
        unexpected = [name for name in state_dict if name not in targets]
        loaded = {name: np.asarray(state_dict[name]) for name in targets if name in state_dict}
        errors = []
        for kind, keys in (("Missing", missing), ("Unexpected", unexpected)):
            if strict and keys:
                quoted = ", ".join(f'"{k}"' for k in keys)
                errors.append(f"{kind} key(s) in state_dict: {quoted}.")
        errors += [
            f"size mismatch for {name}: copying a param with shape {value.shape} from checkpoint, the shape in "
            f"current model is {targets[name].shape}."
            for name, value in loaded.items()
            if value.shape != targets[name].shape
        ]
        if errors:
            raise RuntimeError(
                f"Error(s) in loading state_dict for {type(self).__name__}:" + "".join(f"\n\t{e}" for e in errors)
            )
        for name, value in loaded.items():
            targets[name][...] = value
        return IncompatibleKeys(missing, unexpected)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the state dict to ``path`` as an ``.npz`` archive (exactly that path: no suffix is added)."""
        with open(path, "wb") as f:
            np.savez(f, **self.state_dict())

    def load(self, path: str | os.PathLike[str]) -> None:
        """Load a state dict written by ``save`` (with ``load_state_dict``'s default, ``strict``)."""
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
