"""``Module``: parameters, buffers, submodules, train/eval and state dicts, as in PyTorch.

A module's parameters are its ``Parameter`` attributes (Tensors that stay
parameters when frozen with ``requires_grad = False``, as PyTorch's
``nn.Parameter``), its submodules the Module attributes (and ModuleLists); buffers
(running statistics, counters) are plain ndarrays declared with
``register_buffer``. Names are dotted paths: ``attn.q_proj.weight``. A
parameter or submodule reachable under two names (weight tying) is listed
once, under the first name, by ``named_parameters``/``named_modules``, and
under every name by ``state_dict``, as in PyTorch.
"""

from __future__ import annotations

import contextlib
import operator
import os
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, overload

import numpy as np

from minigrad_norm.tensor import Tensor, increment_version


def factory_dtype(op: str, device: Any, dtype: Any) -> np.dtype:
    """The dtype of a module's parameters and buffers from PyTorch's factory arguments: ``device`` None or
    "cpu" (or ``torch.device("cpu")``, by its str), the one device here, and ``dtype`` None for float32,
    PyTorch's default."""
    if device is not None and str(device) != "cpu":
        raise ValueError(f"{op}: device={device!r}: minigrad_norm computes on the CPU only (device=None or 'cpu')")
    return np.dtype(np.float32 if dtype is None else dtype)


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


def _join(prefix: str, name: str) -> str:
    """A dotted name as PyTorch builds it: the root's prefix is ``""``, so no leading dot."""
    return f"{prefix}.{name}" if prefix else name


def _typename(value: Any) -> str:
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _as_array(value: Any) -> np.ndarray:
    """A state value as an array: a Tensor's own ``data`` (not a copy), anything else through ``np.asarray``
    (ndarrays, scalars, and torch CPU tensors, which implement ``__array__``)."""
    return value.data if isinstance(value, Tensor) else np.asarray(value)


def _addindent(text: str) -> str:
    """Indent every line but the first by two spaces, blank lines left empty (PyTorch's ``_addindent``)."""
    first, *rest = text.split("\n")
    return "\n".join([first, *(f"  {line}" if line.strip() else "" for line in rest)])


def _block_repr(name: str, lines: list[str]) -> str:
    """``Name(`` with one indented line per item and ``)`` on its own line, as PyTorch lays out children."""
    return f"{name}()" if not lines else f"{name}(\n  " + "\n  ".join(lines) + "\n)"


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
            return
        # As PyTorch: replacing a parameter or a submodule with anything but its kind (or None) is refused,
        # since it would silently drop it from parameters(), the state dict and the optimizer's view.
        current = self.__dict__.get(name)
        if value is not None:
            if isinstance(current, Parameter) and not isinstance(value, Parameter):
                raise TypeError(
                    f"cannot assign '{_typename(value)}' as parameter '{name}' (Parameter or None expected)"
                )
            if isinstance(current, Module) and not isinstance(value, Module):
                raise TypeError(
                    f"cannot assign '{_typename(value)}' as child module '{name}' (Module or None expected)"
                )
        object.__setattr__(self, name, value)

    # -- this module's own members, in registration order (shared ones included: PyTorch's _modules etc.) --
    def _submodules(self) -> Iterator[tuple[str, Module]]:
        return ((name, value) for name, value in vars(self).items() if isinstance(value, Module))

    def _own_parameters(self) -> Iterator[tuple[str, Parameter]]:
        return ((name, value) for name, value in vars(self).items() if isinstance(value, Parameter))

    def _own_buffers(self) -> Iterator[tuple[str, np.ndarray]]:
        return ((name, value) for name, value in self._buffers.items() if value is not None)

    # -- traversal -----------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, Module]]:
        """The direct submodules with their attribute names; one shared under two names is yielded once."""
        seen: set[int] = set()
        for name, module in self._submodules():
            if id(module) not in seen:
                seen.add(id(module))
                yield name, module

    def children(self) -> Iterator[Module]:
        """The direct submodules (``named_children`` without the names), as PyTorch's."""
        for _, module in self.named_children():
            yield module

    def named_modules(self, *, prefix: str = "", remove_duplicate: bool = True) -> Iterator[tuple[str, Module]]:
        """This module (named ``prefix``, ``""`` by default) and its submodules depth first, with dotted names
        (``"attn"``, ``"attn.q_proj"``). A module reachable under several names comes once, under the first,
        unless ``remove_duplicate`` is False (the traversal ``state_dict`` uses)."""
        seen: set[int] = set()

        def walk(name: str, module: Module) -> Iterator[tuple[str, Module]]:
            if id(module) in seen:
                return
            if remove_duplicate:
                seen.add(id(module))
            yield name, module
            for child_name, child in module._submodules():
                yield from walk(_join(name, child_name), child)

        return walk(prefix, self)

    def _named_members(
        self, members: Callable[[Module], Iterable[tuple[str, Any]]], remove_duplicate: bool
    ) -> Iterator[tuple[str, Any]]:
        """Each module's ``members`` with dotted names, each object once unless ``remove_duplicate`` is False."""
        seen: set[int] = set()
        for prefix, module in self.named_modules(remove_duplicate=remove_duplicate):
            for name, value in members(module):
                if id(value) in seen:
                    continue
                if remove_duplicate:
                    seen.add(id(value))
                yield _join(prefix, name), value

    def named_parameters(self, *, remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        """Every parameter with its dotted name; a tied one once, under its first name, unless
        ``remove_duplicate`` is False (PyTorch's default is also True)."""
        return self._named_members(lambda m: m._own_parameters(), remove_duplicate)

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def named_buffers(self, *, remove_duplicate: bool = True) -> Iterator[tuple[str, np.ndarray]]:
        """Every registered (non-None) buffer with its dotted name, each array once unless ``remove_duplicate``
        is False."""
        return self._named_members(lambda m: m._own_buffers(), remove_duplicate)

    def _state_slots(self) -> Iterator[tuple[str, Module, str, Tensor | np.ndarray]]:
        """``(dotted name, owning module, attribute, value)`` of every parameter and buffer, in the order of
        PyTorch's ``state_dict``: module by module depth first, each module's parameters, then its buffers,
        then its children; a tied or shared entry under every name it has."""
        for prefix, module in self.named_modules(remove_duplicate=False):
            for name, value in (*module._own_parameters(), *module._own_buffers()):
                yield _join(prefix, name), module, name, value

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

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every parameter's gradient (``set_to_none``, the default) or zero it in place, as PyTorch's
        (``Tensor.zero_grad``)."""
        for p in self.parameters():
            p.zero_grad(set_to_none)

    # -- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of every parameter and buffer, by dotted name, with PyTorch's keys and order (see
        ``_state_slots``): a tied parameter appears under each of its names."""
        return {name: _as_array(value).copy() for name, _, _, value in self._state_slots()}

    def _optional_state(self) -> tuple[str, ...]:
        """This module's own entries (not its submodules') that a state dict may lack: the module then
        keeps its value, even with ``strict``."""
        return ()

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> IncompatibleKeys:
        """Copy ``state_dict`` into the parameters and buffers in place, as PyTorch's ``load_state_dict``.

        Values may be ndarrays, our Tensors (their data is read) or anything ``np.asarray`` takes. With
        ``strict`` a missing or unexpected key is an error; without it those are skipped, the rest is
        loaded, and the returned ``IncompatibleKeys`` lists them. A shape mismatch is an error either way.
        A tied parameter is expected under each of its names (as ``state_dict`` writes it); if the entries
        differ, the one under the later name in the module's ``state_dict`` order (not the mapping's) wins,
        as in PyTorch, which copies them in turn.
        Errors are ``RuntimeError`` listing every problem, as PyTorch's ("Error(s) in loading state_dict
        for ..."). Everything is checked before anything is copied, so a failed load leaves the module as
        it was (PyTorch copies every entry that fits, those after a failing one too, then raises). Values are
        cast to each target's dtype: numbers only (a text or object value is an error, and a complex one into
        a real target).
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"load_state_dict: expected state_dict to be a mapping, got {type(state_dict).__name__}")
        if not isinstance(strict, bool | np.bool_):
            raise TypeError(f"load_state_dict: strict must be a bool, got {type(strict).__name__} {strict!r}")
        targets = {name: _as_array(value) for name, _, _, value in self._state_slots()}
        optional = {_join(prefix, name) for prefix, module in self.named_modules() for name in module._optional_state()}
        missing = [name for name in targets if name not in state_dict and name not in optional]
        unexpected = [name for name in state_dict if name not in targets]
        loaded = {name: _as_array(state_dict[name]) for name in targets if name in state_dict}
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
        errors += [  # (numbers are cast, as PyTorch's copy_ casts; text, objects and complex into real are not)
            f"dtype mismatch for {name}: a {value.dtype} value cannot be copied into the model's {targets[name].dtype}."
            for name, value in loaded.items()
            if value.dtype.kind not in ("biufc" if targets[name].dtype.kind == "c" else "biuf")
        ]
        if errors:
            raise RuntimeError(
                f"Error(s) in loading state_dict for {type(self).__name__}:" + "".join(f"\n\t{e}" for e in errors)
            )
        for name, value in loaded.items():  # in targets' order, so the last name of a tied array wins
            targets[name][...] = value
            increment_version(targets[name])  # a graph built before the load no longer matches the weights
        return IncompatibleKeys(missing, unexpected)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the state dict to ``path`` as an ``.npz`` archive (exactly that path: no suffix is added)."""
        # What np.savez writes, one ``<key>.npy`` member per entry; not np.savez(f, **state) itself, whose own
        # keywords (file, allow_pickle) would collide with parameters of those names.
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
            for name, value in self.state_dict().items():
                with archive.open(f"{name}.npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, value, allow_pickle=False)

    def load(self, path: str | os.PathLike[str]) -> None:
        """Load a state dict written by ``save`` (with ``load_state_dict``'s default, ``strict``)."""
        with np.load(path, allow_pickle=False) as f:
            self.load_state_dict({k: f[k] for k in f.files})

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        """PyTorch's layout: ``Name(extra)`` on one line for a single-line extra_repr and no children, else
        each extra_repr line and then each ``(name): child`` on its own indented line."""
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({name}): {_addindent(repr(child))}" for name, child in self._submodules()]
        if len(extra_lines) == 1 and not child_lines:
            return f"{type(self).__name__}({extra})"
        return _block_repr(type(self).__name__, extra_lines + child_lines)


class ModuleList(Module):
    """A list of submodules, named ``0``, ``1``, ... in parameter names."""

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
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

    @overload
    def __getitem__(self, index: int) -> Module: ...
    @overload
    def __getitem__(self, index: slice) -> ModuleList: ...
    def __getitem__(self, index: int | slice) -> Module | ModuleList:
        """One module, or for a slice a new ModuleList of the same modules (not copies), as PyTorch."""
        if isinstance(index, slice):
            return type(self)(self._list[index])
        i = operator.index(index)
        if not -len(self._list) <= i < len(self._list):
            raise IndexError(f"index {i} is out of range")
        return self._list[i]

    def _submodules(self) -> Iterator[tuple[str, Module]]:
        return ((str(i), m) for i, m in enumerate(self._list))

    def __repr__(self) -> str:
        """PyTorch's ModuleList layout: a run of equal reprs is one line, ``(0-2): 3 x Linear(...)``."""
        runs: list[tuple[int, int, str]] = []  # first index, last index, shared repr
        for i, text in enumerate(repr(m) for m in self._list):
            if runs and runs[-1][2] == text:
                runs[-1] = (runs[-1][0], i, text)
            else:
                runs.append((i, i, text))
        lines = [
            _addindent(f"({first}): {text}" if first == last else f"({first}-{last}): {last - first + 1} x {text}")
            for first, last, text in runs
        ]
        return _block_repr(type(self).__name__, lines)


def _merge_dicts(dicts: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``torch.func.functional_call``'s first argument: one mapping, or a list/tuple of them (say parameters
    and buffers) whose keys must not repeat."""
    if isinstance(dicts, Mapping):
        return dict(dicts)
    if not isinstance(dicts, list | tuple):
        raise ValueError(
            f"Expected parameter_and_buffer_dicts to be a dict, or a list/tuple of dicts, but got {type(dicts)}"
        )
    if not all(isinstance(d, Mapping) for d in dicts):
        raise ValueError("Expected all elements of parameter_and_buffer_dicts to be dictionaries")
    keys = [k for d in dicts for k in d]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise ValueError(f"{repeated} appeared in multiple dictionaries; behavior of functional call is ambiguous")
    return {k: v for d in dicts for k, v in d.items()}


@contextlib.contextmanager
def _swapped_state(module: Module, tensors: dict[str, Any], tie_weights: bool, strict: bool) -> Iterator[None]:
    """Put ``tensors`` in place of the named parameters and buffers for the duration of the block."""
    slots = {name: (owner, attr, value) for name, owner, attr, value in module._state_slots()}
    if tie_weights:
        # A tied array (one object under several names) is replaced under all of them, whichever name was
        # given, so the call computes with one replaced weight as the module does with one weight.
        names_of: dict[int, list[str]] = {}
        for name, (_, _, value) in slots.items():
            names_of.setdefault(id(value), []).append(name)
        untied = dict(tensors)
        for name, new in tensors.items():
            tied = names_of[id(slots[name][2])] if name in slots else [name]
            if any(other in tensors and tensors[other] is not new for other in tied):
                raise ValueError(
                    f"functional_call got multiple values for keys {sorted(tied)}, which are tied. "
                    "Consider using tie_weights=False"
                )
            untied.update(dict.fromkeys(tied, new))
        tensors = untied
    unexpected = sorted(set(tensors) - set(slots))
    missing = sorted(set(slots) - set(tensors)) if strict else []
    if unexpected or missing:
        # PyTorch checks unexpected names only with strict, and otherwise swaps them in as new attributes
        # that nothing reads: a misspelt name would silently leave the real parameter in use.
        errors = [
            f"{kind} key(s): {', '.join(map(repr, keys))}."
            for kind, keys in (("Unexpected", unexpected), ("Missing", missing))
            if keys
        ]
        raise RuntimeError(
            f"Error(s) in reparametrizing for {type(module).__name__}:" + "".join(f"\n\t{e}" for e in errors)
        )
    swaps = []
    for name, new in tensors.items():
        owner, attr, _ = slots[name]
        if attr in owner._buffers:
            if not isinstance(new, Tensor | np.ndarray | None):
                raise TypeError(
                    f"functional_call: buffer {name!r} must be a Tensor, an ndarray or None, got {_typename(new)}"
                )
            # the array itself, so that updates the module makes in place (running statistics) land in it
            swaps.append((owner._buffers, attr, _as_array(new) if new is not None else None))
        else:
            if not isinstance(new, Tensor | None):
                raise TypeError(f"functional_call: parameter {name!r} must be a Tensor or None, got {_typename(new)}")
            swaps.append((vars(owner), attr, new))
    # originals taken before any swap: a shared module's slot appears under two names
    originals = [(where, attr, where[attr]) for where, attr, _ in swaps]
    try:
        for where, attr, new in swaps:
            where[attr] = new  # into __dict__ directly: a plain Tensor may stand in for a Parameter here
        yield
    finally:
        for where, attr, old in reversed(originals):
            where[attr] = old


def functional_call(
    module: Module,
    parameter_and_buffer_dicts: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    args: Any = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    tie_weights: bool = True,
    strict: bool = False,
) -> Any:
    """``module(*args, **kwargs)`` with named parameters and buffers replaced for this call only.

    As ``torch.func.functional_call``: ``args`` is a tuple of positional arguments, or a single one (anything
    but a tuple); the replacements are one mapping or a list/tuple of them. With ``tie_weights`` a value
    given under one name of a tied parameter replaces it under all its names (two different values for one
    tied parameter are a ValueError). With ``strict`` every parameter and buffer must be given. A name the
    module does not have is always an error (PyTorch ignores it unless ``strict``). It turns a module into a
    function of its parameters, which is what ``gradcheck`` needs to differentiate with respect to them.
    """
    tensors = _merge_dicts(parameter_and_buffer_dicts)
    if args is None:
        args = ()
    elif not isinstance(args, tuple):
        args = (args,)
    with _swapped_state(module, tensors, tie_weights, strict):
        return module(*args, **(kwargs or {}))
