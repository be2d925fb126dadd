"""The tape: ``Tensor``, ``Function`` and reverse-mode backpropagation.

A ``Tensor`` wraps an ``np.ndarray``. Every differentiable op is a ``Function``
subclass with two static methods kept side by side, as in
``torch.autograd.Function``::

    class Exp(Function):
        '''y = exp(x);  dL/dx = dL/dy * y'''

        @staticmethod
        def forward(ctx, x):
            y = np.exp(x)
            ctx.save_for_backward(y)      # only what the backward needs
            return y

        @staticmethod
        def backward(ctx, grad):
            (y,) = ctx.saved_tensors
            return grad * y               # one gradient per positional input

``Exp.apply(t)`` unwraps Tensors to arrays, runs ``forward`` and, when a
gradient is wanted, records the op on the output: the output's ``_ctx`` holds
the Function, its inputs and the saved arrays. That record is the tape.

``Tensor.backward`` walks the tape once in reverse topological order (built
iteratively, so a chain of any length works), calling each ``backward`` with
dL/d(output) and summing the returned dL/d(input) over every path that reaches
an input. Leaves accumulate into ``.grad`` with ``+=``, as in PyTorch.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

_grad_enabled = True

#: dtypes a Tensor may carry. Complex arrays exist only so that the complex-step
#: method of ``numerical_jacobian`` can push ``x + i*h`` through a forward.
_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_COMPLEX_DTYPES = (np.dtype(np.complex64), np.dtype(np.complex128))


@contextlib.contextmanager
def _grad_mode(enabled: bool) -> Iterator[None]:
    global _grad_enabled
    previous, _grad_enabled = _grad_enabled, enabled
    try:
        yield
    finally:
        _grad_enabled = previous


def no_grad() -> contextlib.AbstractContextManager[None]:
    """Inside this context no op is recorded: outputs never require grad."""
    return _grad_mode(False)


def enable_grad() -> contextlib.AbstractContextManager[None]:
    """Inside this context ops are recorded again, even within an enclosing ``no_grad()``."""
    return _grad_mode(True)


def is_grad_enabled() -> bool:
    return _grad_enabled


# -- version counters ------------------------------------------------------------
# How many times the memory of an array was written in place by something that says so (increment_version):
# an optimizer's step(), load_state_dict, the in-place methods (add_, copy_, ...). The count is kept per
# owning array (the end of the .base chain), so that every view of a parameter sees the write: the reshaped
# weight a norm saved, a row taken by indexing; PyTorch's views share their base's counter in the same way. Only
# arrays ever written have an entry, dropped when the array dies (ndarrays are not hashable, hence ids).
_versions: dict[int, tuple[weakref.ref, int]] = {}


def _owner(a: np.ndarray) -> np.ndarray:
    while True:
        base = a.base
        if not isinstance(base, np.ndarray):  # as_strided's views keep their array one object further down
            base = getattr(base, "base", None)
        if not isinstance(base, np.ndarray):
            return a
        a = base


def _version_of(a: np.ndarray) -> int:
    entry = _versions.get(id(_owner(a)))
    return 0 if entry is None else entry[1]


def increment_version(t: Tensor | np.ndarray | Sequence[Tensor | np.ndarray]) -> None:
    """Record that the memory of ``t`` (a Tensor's ``.data``, an array, or each of a list of them) was
    written in place.

    A backward that needs an array saved before the write then raises ``RuntimeError`` instead of
    computing the gradient from the new values. The optimizers, ``load_state_dict`` and the in-place methods
    (``add_``, ``copy_``, ...) call it; call it after writing into ``.data`` yourself (as
    ``torch.autograd.graph.increment_version``: a write through ``.data`` is not counted, there or here).
    """
    if isinstance(t, list | tuple):  # as PyTorch's, which takes an iterable of tensors too
        for item in t:
            increment_version(item)
        return
    if not isinstance(t, Tensor | np.ndarray):
        raise TypeError(f"increment_version: expected a Tensor, an ndarray or a list of them, got {type(t).__name__}")
    owner = _owner(t.data if isinstance(t, Tensor) else t)
    key = id(owner)
    entry = _versions.get(key)
    if entry is None:
        _versions[key] = (weakref.ref(owner, lambda _, key=key: _versions.pop(key, None)), 1)
    else:
        _versions[key] = (entry[0], entry[1] + 1)


class Context:
    """What a Function's forward hands to its backward.

    Arrays go through ``save_for_backward`` so that the engine can release them
    after a backward pass, and can refuse them if they were written in place
    since (``increment_version``); plain Python values (shapes, axes, flags) may
    be set as attributes. ``needs_input_grad[i]`` says whether input ``i`` wants a
    gradient, so a backward can skip work nobody asked for.
    """

    def __init__(self, fn: type[Function], inputs: tuple[Any, ...]):
        self.fn = fn
        self.inputs = inputs
        self.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in inputs)
        self._saved: tuple[Any, ...] | None = ()
        self._saved_versions: tuple[int | None, ...] = ()

    def save_for_backward(self, *arrays: Any) -> None:
        self._saved = arrays
        self._saved_versions = tuple(_version_of(a) if isinstance(a, np.ndarray) else None for a in arrays)

    @property
    def saved_tensors(self) -> tuple[Any, ...]:
        if self._saved is None:
            raise RuntimeError(
                f"{self.fn.__name__}.backward: trying to backward through the graph a second "
                "time, but its saved arrays were released by the first backward. Pass "
                "retain_graph=True to the first backward() to keep them."
            )
        for k, (a, version) in enumerate(zip(self._saved, self._saved_versions)):
            if version is not None and _version_of(a) != version:
                raise RuntimeError(
                    f"{self.fn.__name__}.backward: saved array {k} (shape {a.shape}, {a.dtype}) was modified in "
                    f"place after the forward: it is at version {_version_of(a)}, the forward saved version "
                    f"{version}. An optimizer step(), load_state_dict or in-place method (add_, copy_...) between a "
                    "forward and its backward does this; call backward() first (PyTorch raises the same error)."
                )
        return self._saved

    def release(self) -> None:
        self._saved = None


class Function:
    """Base class of every differentiable op (see the module docstring)."""

    @staticmethod
    def forward(ctx: Context, *args: Any, **kwargs: Any) -> np.ndarray:
        raise NotImplementedError

    @staticmethod
    def backward(ctx: Context, grad: np.ndarray) -> np.ndarray | None | tuple[np.ndarray | None, ...]:
        raise NotImplementedError

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Tensor:
        """Run ``forward`` on the arrays inside ``args`` and record the op.

        Positional Tensor arguments are the differentiable inputs; everything
        else (keyword arguments, Python numbers, masks) is passed through.
        """
        if tensors := [name for name, v in kwargs.items() if isinstance(v, Tensor)]:
            raise TypeError(
                f"{cls.__name__}.apply: keyword argument(s) {', '.join(tensors)} are Tensors; only positional "
                "Tensors are differentiated inputs (their arrays reach forward): pass them positionally"
            )
        ctx = Context(cls, args)
        raw = [a.data if isinstance(a, Tensor) else a for a in args]
        result = cls.forward(ctx, *raw, **kwargs)
        if isinstance(result, tuple | list | Tensor):
            raise TypeError(
                f"{cls.__name__}.forward returned a {type(result).__name__}; a Function has one output, an "
                "array (for several, write one Function per output, or return them stacked and index the result)"
            )
        out = Tensor(result)
        if _grad_enabled and any(ctx.needs_input_grad):
            out.requires_grad = True
            out._ctx = ctx
        # A view of a tensor that requires grad, made under no_grad() (or a view of such a view), must not be
        # written in grad mode: PyTorch forbids it as ambiguous (should the write be tracked or not?).
        for a in args:
            if isinstance(a, Tensor) and (a._no_grad_view or (not _grad_enabled and a._requires_grad)):
                out._no_grad_view = _owner(a.data) is _owner(out.data)
                if out._no_grad_view:
                    break
        return out


class Tensor:
    """An ndarray that remembers how it was computed.

    ``data`` is the wrapped array itself (never copied); ``grad`` is None or an
    array of the same shape and dtype. Integer and boolean tensors serve as
    indices and masks and can never require grad.
    """

    __array_priority__ = 1000  # ndarray (op) Tensor defers to Tensor's reflected op

    def __init__(self, data: Any, requires_grad: bool = False):
        if isinstance(data, Tensor):
            data = data.data
        data = np.asarray(data)
        dtype = data.dtype
        if dtype.kind == "f" and dtype not in _FLOAT_DTYPES:
            raise TypeError(f"Tensor: dtype {dtype} is not supported; use float32 or float64")
        if dtype.kind not in "fciub":
            raise TypeError(f"Tensor: dtype {dtype} is not supported (shape {data.shape})")
        if dtype.kind == "c" and dtype not in _COMPLEX_DTYPES:
            raise TypeError(f"Tensor: dtype {dtype} is not supported")
        self.data: np.ndarray = data
        self.grad: np.ndarray | None = None
        self._ctx: Context | None = None
        self._retains_grad = False
        self._no_grad_view = False
        self.requires_grad = requires_grad

    # -- attributes ---------------------------------------------------------
    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        if value and self.data.dtype not in _FLOAT_DTYPES:
            raise TypeError(
                f"Tensor: only float32 and float64 tensors can require grad, got dtype "
                f"{self.data.dtype} with shape {self.data.shape}"
            )
        self._requires_grad = bool(value)

    @property
    def grad(self) -> np.ndarray | None:
        return self._grad

    @grad.setter
    def grad(self, value: np.ndarray | None) -> None:
        # Checked here, as PyTorch checks an assigned .grad: an optimizer would otherwise broadcast a (1,)
        # gradient over a (3,) parameter, or fail half-way through its update.
        if value is not None:
            if not isinstance(value, np.ndarray):
                raise TypeError(f"Tensor.grad: expected an ndarray or None, got {type(value).__name__}")
            if value.shape != self.shape or value.dtype != self.dtype:
                raise RuntimeError(
                    f"Tensor.grad: assigned grad has shape {value.shape} and dtype {value.dtype}, but the "
                    f"tensor has shape {self.shape} and dtype {self.dtype}"
                )
        self._grad = value

    @property
    def _version(self) -> int:
        """How many counted in-place writes ``.data``'s memory has had (``increment_version``), as PyTorch's."""
        return _version_of(self.data)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def size(self) -> int:
        return self.data.size

    @property
    def is_leaf(self) -> bool:
        return self._ctx is None

    def numpy(self) -> np.ndarray:
        return self.data

    def item(self) -> Any:
        if self.size != 1:
            raise ValueError(f"item: a Tensor of shape {self.shape} has {self.size} values, not one")
        return self.data.item()

    def detach(self) -> Tensor:
        """The same array, cut from the graph."""
        return Tensor(self.data)

    def retain_grad(self) -> None:
        """Keep ``.grad`` on this non-leaf tensor during backward (as PyTorch)."""
        self._retains_grad = True

    def __len__(self) -> int:
        return len(self.data)

    def __bool__(self) -> bool:
        """The truth of a one-element tensor; any other size raises, as in PyTorch (``if t > 0:`` on a
        vector is a mistake, not a test of its length)."""
        if self.size != 1:
            raise RuntimeError(
                f"Tensor: the truth value of a tensor of shape {self.shape} ({self.size} values) is ambiguous; "
                "use t.data.any() or t.data.all()"
            )
        return bool(self.data.item())

    def __repr__(self) -> str:
        grad = f", grad_fn={self._ctx.fn.__name__}" if self._ctx else ""
        req = ", requires_grad=True" if self.requires_grad and not self._ctx else ""
        return f"Tensor({np.array2string(self.data, prefix='Tensor(')}, dtype={self.dtype}{req}{grad})"

    # -- backpropagation ----------------------------------------------------
    def backward(self, gradient: Any = None, retain_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf), contracted with ``gradient``, into every leaf's ``.grad``.

        A one-element output defaults to ``gradient = 1``. Without
        ``retain_graph`` the saved arrays are released, and a second backward
        through the same ops raises instead of computing with stale data.
        """
        grads = backprop(self, gradient, retain_graph)
        for t, g in grads.values():
            if t.is_leaf or t._retains_grad:
                if t.grad is None:
                    t.grad = np.array(g, dtype=t.dtype)  # a copy we own, safe for +=
                else:
                    t.grad += g

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradient (``set_to_none``, PyTorch's default for modules and optimizers), or zero it in
        place: in place keeps the array (and anything holding it), and a gradient that is None stays None."""
        if set_to_none:
            self.grad = None
        elif self.grad is not None:
            self.grad[...] = 0

    # -- in-place ops (PyTorch's), outside the graph ---------------------------
    def add_(self, other: Any, alpha: float | Tensor = 1) -> Tensor:
        """self += alpha * other, in place (``torch.Tensor.add_``); returns self."""
        return self._write("add_", np.add, other, alpha)

    def sub_(self, other: Any, alpha: float | Tensor = 1) -> Tensor:
        """self -= alpha * other, in place; returns self."""
        ops.refuse_bool("sub_", "subtraction", self, other)
        return self._write("sub_", np.subtract, other, alpha)

    def mul_(self, other: Any) -> Tensor:
        """self *= other, in place; returns self."""
        return self._write("mul_", np.multiply, other)

    def div_(self, other: Any) -> Tensor:
        """self /= other (true division, so never into an integer tensor), in place; returns self."""
        return self._write("div_", np.true_divide, other)

    def copy_(self, src: Any) -> Tensor:
        """self[...] = src (broadcast, cast to self's dtype as PyTorch casts), in place; returns self."""
        return self._write("copy_", None, src)

    def fill_(self, value: Any) -> Tensor:
        """Every element = value (a number or a 0-d tensor that self's dtype can hold), in place; returns self."""
        return self._write("fill_", None, ops.fill_value("fill_", value, self.dtype))

    def zero_(self) -> Tensor:
        """Every element = 0, in place; returns self."""
        return self._write("zero_", None, 0)

    def _write(self, op: str, ufunc: np.ufunc | None, other: Any, alpha: float | Tensor = 1) -> Tensor:
        """``self = ufunc(self, alpha * other)`` computed in the ops' result dtype (PyTorch's: ``alpha * other``
        is computed there too), or, with no ufunc, ``self[...] = other`` (copy_, fill_); then count the write
        (``increment_version``), so that a backward through an op that saved the old values refuses them.

        Refused, as in PyTorch: in grad mode, a view made under ``no_grad()`` of a tensor that requires grad;
        a result of a higher category than self's dtype (a float, or a float ``alpha``, into an integer tensor;
        a copy casts any real value, truncating, but not a complex one); an ``alpha`` the result dtype cannot
        hold; a shape that does not broadcast to self's; a read-only array. And, as no in-place op is recorded
        on the tape, in grad mode a tensor or value that requires grad (write under ``no_grad()``, as an
        optimizer does).
        """
        alpha = ops.number(op, "alpha", alpha)
        if _grad_enabled and self._no_grad_view:
            raise RuntimeError(
                f"{op}: the tensor (shape {self.shape}) is a view, made under no_grad(), of a tensor that requires "
                "grad; writing it in place in grad mode is ambiguous (tracked or not?) and forbidden, as in "
                "PyTorch: make the view and the write both inside no_grad(), or both outside"
            )
        for t, which in ((self, "a tensor"), (other, "a value")):
            if _grad_enabled and isinstance(t, Tensor) and t.requires_grad:
                raise RuntimeError(
                    f"{op}: {which} that requires grad (shape {t.shape}) cannot take part in an in-place op in "
                    "grad mode, which is not recorded on the tape; write inside no_grad(), as an optimizer's "
                    "step does, or use the out-of-place op"
                )
        # alpha = 1 takes no part in the promotion, so that bool tensors add as a logical or
        result = ops.result_type(self, other) if alpha == 1 else ops.result_type(self, other, alpha)
        if ufunc is np.true_divide:
            result = ops.floating(result)
        if ops.CATEGORY[result.kind] > ops.CATEGORY[self.dtype.kind] and (ufunc is not None or result.kind == "c"):
            raise RuntimeError(f"{op}: result type {result} can't be cast to the tensor's dtype {self.dtype}")
        if not ops.can_hold(result, alpha):
            raise RuntimeError(f"{op}: alpha {alpha!r} cannot be converted to the result dtype {result}")
        if not self.data.flags.writeable:
            raise RuntimeError(f"{op}: the tensor's array (shape {self.shape}) is read-only")
        b = np.asarray(other.data if isinstance(other, Tensor) else other)
        try:
            np.broadcast_to(b, self.shape)
        except ValueError:
            raise RuntimeError(
                f"{op}: a value of shape {b.shape} does not broadcast to the tensor's shape {self.shape}"
            ) from None
        if ufunc is None:
            np.copyto(self.data, b, casting="unsafe")
        else:
            b = b.astype(result, copy=False)
            ufunc(self.data, b if alpha == 1 else alpha * b, out=self.data, casting="unsafe")  # (no temporary for 1)
        increment_version(self)
        return self

    # -- operators (defined in ops.py) --------------------------------------
    def __add__(self, other: Any) -> Tensor:
        return ops.add(self, other)

    def __radd__(self, other: Any) -> Tensor:
        return ops.add(other, self)

    def __sub__(self, other: Any) -> Tensor:
        return ops.sub(self, other)

    def __rsub__(self, other: Any) -> Tensor:
        return ops.sub(other, self)

    def __mul__(self, other: Any) -> Tensor:
        return ops.mul(self, other)

    def __rmul__(self, other: Any) -> Tensor:
        return ops.mul(other, self)

    def __truediv__(self, other: Any) -> Tensor:
        return ops.div(self, other)

    def __rtruediv__(self, other: Any) -> Tensor:
        return ops.div(other, self)

    def __pow__(self, exponent: Any) -> Tensor:
        return ops.pow(self, exponent)

    def __rpow__(self, base: Any) -> Tensor:
        return ops.pow(base, self)

    def __neg__(self) -> Tensor:
        return ops.neg(self)

    def __matmul__(self, other: Any) -> Tensor:
        return ops.matmul(self, other)

    def __rmatmul__(self, other: Any) -> Tensor:
        return ops.matmul(other, self)

    def __abs__(self) -> Tensor:
        return ops.abs(self)

    def abs(self) -> Tensor:
        return ops.abs(self)

    # == and != compare elementwise, as the ordering operators do, so identity (not value) is what
    # makes a Tensor a dict key or a set member, as in PyTorch
    __hash__ = object.__hash__

    def __eq__(self, other: Any) -> Tensor:  # type: ignore[override]
        return NotImplemented if other is None else ops.compare("equal", self, other)

    def __ne__(self, other: Any) -> Tensor:  # type: ignore[override]
        return NotImplemented if other is None else ops.compare("not_equal", self, other)

    def __lt__(self, other: Any) -> Tensor:
        return ops.compare("less", self, other)

    def __le__(self, other: Any) -> Tensor:
        return ops.compare("less_equal", self, other)

    def __gt__(self, other: Any) -> Tensor:
        return ops.compare("greater", self, other)

    def __ge__(self, other: Any) -> Tensor:
        return ops.compare("greater_equal", self, other)

    def __getitem__(self, index: Any) -> Tensor:
        return ops.getitem(self, index)

    def sum(
        self,
        axis: int | Sequence[int] | None = None,
        keepdims: bool = False,
        *,
        dim: int | Sequence[int] | None = None,
        keepdim: bool | None = None,
    ) -> Tensor:
        return ops.sum(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def mean(
        self,
        axis: int | Sequence[int] | None = None,
        keepdims: bool = False,
        *,
        dim: int | Sequence[int] | None = None,
        keepdim: bool | None = None,
    ) -> Tensor:
        return ops.mean(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def max(
        self,
        axis: int | Sequence[int] | None = None,
        keepdims: bool = False,
        *,
        dim: int | Sequence[int] | None = None,
        keepdim: bool | None = None,
    ) -> Tensor:
        return ops.max(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def exp(self) -> Tensor:
        return ops.exp(self)

    def log(self) -> Tensor:
        return ops.log(self)

    def sqrt(self) -> Tensor:
        return ops.sqrt(self)

    def tanh(self) -> Tensor:
        return ops.tanh(self)

    def reshape(self, *shape: int | Sequence[int]) -> Tensor:
        return ops.reshape(self, shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape)

    def permute(self, *dims: int | Sequence[int]) -> Tensor:
        return ops.permute(self, dims[0] if len(dims) == 1 and not isinstance(dims[0], int) else dims)

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        """Swap two axes (PyTorch's ``transpose``; for a full permutation use ``permute``)."""
        return ops.swapaxes(self, dim0, dim1)

    def swapaxes(self, axis1: int, axis2: int) -> Tensor:
        return ops.swapaxes(self, axis1, axis2)

    @property
    def T(self) -> Tensor:
        return ops.permute(self, tuple(reversed(range(self.ndim))))

    def masked_fill(self, mask: Any, value: float | Tensor) -> Tensor:
        return ops.masked_fill(self, mask, value)


def backprop(
    root: Tensor, gradient: Any = None, retain_graph: bool = False, inputs: Sequence[Tensor] | None = None
) -> dict[int, tuple[Tensor, np.ndarray]]:
    """Run the chain rule from ``root`` down the tape.

    Returns ``{id(t): (t, dL/dt)}`` for the leaves reached and the tensors
    that retain their grad, or, given ``inputs``, for those; an intermediate
    gradient is dropped as soon as its op has used it. Given ``inputs``, only
    the ops on a path from ``root`` down to one of them run, as in
    ``torch.autograd.grad``: another op's backward would be wasted work, and
    could refuse a saved array written since its forward. This is the engine
    behind ``Tensor.backward`` and ``grad``; it writes no ``.grad`` itself.
    """
    if not root.requires_grad:
        raise RuntimeError(
            f"backward: the tensor of shape {root.shape} does not require grad and has no "
            "recorded op (did it come from constants or from inside no_grad()?)"
        )
    order = _topological_order(root)
    runs, reaches = (None, None) if inputs is None else _paths_to(order, inputs)
    kept = {id(t) for t in inputs or ()}
    grads: dict[int, tuple[Tensor, np.ndarray]] = {id(root): (root, _root_gradient(root, gradient))}
    for t in reversed(order):
        ctx = t._ctx
        if ctx is None or id(t) not in grads or (runs is not None and id(t) not in runs):
            continue
        g = grads[id(t)][1]
        if not (id(t) in kept or (inputs is None and t._retains_grad)):
            del grads[id(t)]
        input_grads = ctx.fn.backward(ctx, g)
        if isinstance(input_grads, list):  # (a list would be read as one gradient, an array of its items)
            raise TypeError(
                f"{ctx.fn.__name__}.backward returned a list; return a tuple, one gradient (or None) per input"
            )
        if not isinstance(input_grads, tuple):
            input_grads = (input_grads,)
        if len(input_grads) != len(ctx.inputs):
            raise RuntimeError(
                f"{ctx.fn.__name__}.backward returned {len(input_grads)} gradients for {len(ctx.inputs)} inputs"
            )
        for k, (inp, needs, ig) in enumerate(zip(ctx.inputs, ctx.needs_input_grad, input_grads)):
            if not needs or ig is None:
                continue
            if not isinstance(ig, np.ndarray | np.generic):
                raise TypeError(
                    f"{ctx.fn.__name__}.backward returned a {type(ig).__name__} as the gradient of input {k}; "
                    "a backward returns NumPy arrays (or None)"
                )
            if np.iscomplexobj(ig):  # only real tensors require grad
                raise TypeError(
                    f"{ctx.fn.__name__}.backward returned a {ig.dtype} gradient for input {k}, which is real"
                )
            if ig.shape != inp.shape:
                raise RuntimeError(
                    f"{ctx.fn.__name__}.backward returned a gradient of shape {ig.shape} for an "
                    f"input of shape {inp.shape}"
                )
            if reaches is not None and id(inp) not in reaches:  # off every path to grad()'s inputs
                continue
            if ig.dtype != inp.dtype:  # as PyTorch's engine: each gradient in its input's dtype
                ig = ig.astype(inp.dtype)
            if id(inp) in grads:  # a tensor used by several ops: sum over the paths
                grads[id(inp)] = (inp, grads[id(inp)][1] + ig)
            else:
                grads[id(inp)] = (inp, ig)
        if not retain_graph:
            ctx.release()
    return grads


def _root_gradient(root: Tensor, gradient: Any) -> np.ndarray:
    """dL/d(root): ones for a one-element root if no ``gradient`` is given, else ``gradient``, which must be
    real numbers of the root's shape, cast to its dtype (as PyTorch casts integers and bools)."""
    if gradient is None:
        if root.size != 1:
            raise RuntimeError(
                f"backward: grad can be implicitly created only for one-element outputs, but "
                f"this output has shape {root.shape}; pass gradient= (an array of that shape)"
            )
        return np.ones_like(root.data)
    try:
        gradient = np.asarray(gradient.data if isinstance(gradient, Tensor) else gradient)
    except ValueError as e:  # a ragged nested list
        raise ValueError(f"backward: gradient is not an array of numbers: {e}") from None
    if gradient.dtype.kind not in "biuf":  # (a cast would drop a complex gradient's imaginary part)
        raise TypeError(
            f"backward: gradient has dtype {gradient.dtype}, but the output (shape {root.shape}, dtype "
            f"{root.dtype}) is real: its gradient must be real numbers"
        )
    gradient = gradient.astype(root.dtype, copy=False)
    if gradient.shape != root.shape:
        raise RuntimeError(f"backward: gradient has shape {gradient.shape} but the output has shape {root.shape}")
    return gradient


def _paths_to(order: list[Tensor], inputs: Sequence[Tensor]) -> tuple[set[int], set[int]]:
    """(the ops whose backward lies on a path down to one of ``inputs``, the tensors from which such a path
    starts: those ops' outputs and the inputs themselves), by id; ``order`` is inputs before outputs."""
    reaches, runs = {id(t) for t in inputs}, set()
    for t in order:
        if t._ctx is not None and any(id(i) in reaches for i in t._ctx.inputs if isinstance(i, Tensor)):
            runs.add(id(t))
            reaches.add(id(t))
    return runs, reaches


def grad(
    output: Tensor, inputs: Tensor | Sequence[Tensor], gradient: Any = None, retain_graph: bool = False
) -> tuple[np.ndarray, ...]:
    """d(output)/d(input) contracted with ``gradient``, for each input (one Tensor or a sequence of them),
    without touching ``.grad``.

    Like ``torch.autograd.grad`` with ``materialize_grads=True``: an input the output does not
    depend on gets zeros (PyTorch's default raises), and an input that does not require grad
    raises ``RuntimeError``. Each result is a fresh writable array, as ``.grad`` is after
    ``backward``.
    """
    # (a single Tensor is one input, not a sequence of its rows: those are new tensors outside the graph,
    # whose gradients would all be zeros)
    inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    if not inputs:
        raise RuntimeError("grad: no inputs to differentiate with respect to")
    for k, t in enumerate(inputs):
        if not isinstance(t, Tensor):
            raise TypeError(f"grad: input {k} must be a Tensor, got {type(t).__name__}")
        if not t.requires_grad:  # its gradient would be zeros whatever the graph: most likely a mistake
            raise RuntimeError(
                f"grad: one of the differentiated Tensors does not require grad: input {k}, of shape {t.shape}"
            )
    grads = backprop(output, gradient, retain_graph, inputs=inputs)
    # np.array copies: a backward may hand back a read-only broadcast view, or the caller's own `gradient`
    return tuple(np.array(grads[id(t)][1]) if id(t) in grads else np.zeros_like(t.data) for t in inputs)


def _topological_order(root: Tensor) -> list[Tensor]:
    """Tensors reachable from ``root`` that require grad, inputs before outputs.

    An iterative depth-first search: each tensor is pushed once to be expanded
    and once more to be emitted after everything it depends on.
    """
    order: list[Tensor] = []
    visited: set[int] = set()
    stack: list[tuple[Tensor, bool]] = [(root, False)]
    while stack:
        t, expanded = stack.pop()
        if expanded:
            order.append(t)
            continue
        if id(t) in visited:
            continue
        visited.add(id(t))
        stack.append((t, True))
        if t._ctx is not None:
            for inp in t._ctx.inputs:
                if isinstance(inp, Tensor) and inp.requires_grad and id(inp) not in visited:
                    stack.append((inp, False))
    return order


from minigrad_norm import ops  # noqa: E402  (ops builds on Function and Tensor above)
