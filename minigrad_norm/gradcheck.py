"""Gradient verification: reverse-mode Jacobians against numerical ones.

All Jacobians here are 2-D: ``J[i, j] = d out.flat[i] / d input.flat[j]``,
one matrix per input that requires grad (outputs given as a tuple are
flattened and stacked in order).

Numerical Jacobians, two methods:

* ``"central"``: ``(f(x + eps e_j) - f(x - eps e_j)) / (2 eps)``, error
  O(eps^2) from truncation plus O(u / eps) from cancellation (u the unit
  roundoff), so only meaningful in float64. (The division is by the step
  actually taken, ``(x + eps) - (x - eps)`` as rounded, which is not 2 eps
  once |x| is large next to eps.)
* ``"complex"``: ``imag(f(x + i h e_j)) / h`` with h = 1e-30. For f built
  from analytic operations, f(x + ih) = f(x) + ih f'(x) + O(h^2): there is no
  subtraction, so the result is exact to machine precision. This library's ops
  that are not analytic (``abs``, ``max``, ``relu``, comparisons) raise
  ``TypeError``, and an output that comes back real raises too; but a user's
  ``Function`` whose forward uses ``np.abs`` or ``np.maximum`` silently loses
  part of the imaginary part, so ``gradcheck`` also takes central differences
  and fails when the two methods disagree.

``gradcheck`` compares every entry of the reverse-mode Jacobian with the
numerical one: no random projection, nothing a plain ``sum`` could hide.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from minigrad_norm.tensor import Tensor, enable_grad, grad, no_grad

Fn = Callable[..., Tensor | Sequence[Tensor]]

# gradcheck's default tolerances, right for central differences in float64; the complex step's
# cross-check with central differences uses them whatever the caller's
_CENTRAL_ATOL = 1e-5
_CENTRAL_RTOL = 1e-3


class GradcheckError(RuntimeError):
    """A reverse-mode gradient disagrees with the numerical one."""


def _as_inputs(op: str, inputs: Tensor | Sequence[Tensor]) -> tuple[Tensor, ...]:
    """The inputs as a tuple of Tensors, none that requires grad given twice: the reverse-mode gradient
    of a Tensor used twice is the sum over both uses, while a finite difference moves one argument at a
    time, so the two would disagree (or, for a rule wrong by exactly the missing half, agree)."""
    inputs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
    first: dict[int, int] = {}
    for k, t in enumerate(inputs):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: input {k} is a {type(t).__name__}, expected a Tensor")
        if t.requires_grad and first.setdefault(id(t), k) != k:
            raise ValueError(
                f"{op}: inputs {first[id(t)]} and {k} are the same Tensor (shape {t.shape}); pass it once, "
                "or pass a copy as the second (Tensor(x.data.copy(), requires_grad=True))"
            )
    return inputs


def _outputs(op: str, out: object) -> tuple[Tensor, ...]:
    outs = (out,) if isinstance(out, Tensor) else tuple(out) if isinstance(out, (tuple, list)) else None
    if outs is None or not all(isinstance(o, Tensor) for o in outs):
        raise TypeError(f"{op}: fn must return a Tensor or a tuple of Tensors, got {type(out).__name__}")
    return outs


def _flat_output(op: str, out: object) -> np.ndarray:
    outs = _outputs(op, out)
    return np.concatenate([np.ravel(o.data) for o in outs]) if outs else np.zeros(0)


def _output_element(i: int, shapes: Sequence[tuple[int, ...]]) -> str:
    """Row i of a Jacobian as a place in fn's output(s): "output element (1, 2)", or "output 1 element (2,)"."""
    for m, shape in enumerate(shapes):
        size = int(np.prod(shape))
        if i < size:
            where = tuple(int(v) for v in np.unravel_index(i, shape)) if shape else ()
            return f"output {m} element {where}" if len(shapes) > 1 else f"output element {where}"
        i -= size
    raise IndexError(i)


def _modified(inputs: Sequence[Tensor], before: Sequence[np.ndarray]) -> int | None:
    """The first input whose data differ from ``before`` (a copy taken earlier), if any."""
    for k, (t, b) in enumerate(zip(inputs, before)):
        if not np.array_equal(t.data, b, equal_nan=True):
            return k
    return None


def _wrt(inputs: tuple[Tensor, ...]) -> list[int]:
    return [k for k, t in enumerate(inputs) if t.requires_grad]


def numerical_jacobian(
    fn: Fn, inputs: Tensor | Sequence[Tensor], eps: float | None = None, method: str = "central"
) -> tuple[np.ndarray, ...]:
    """Jacobians of ``fn`` by finite differences, one per input that requires grad.

    ``eps`` defaults to 1e-6 for ``"central"`` and 1e-30 for ``"complex"``.
    ``fn`` is called on fresh, graph-free Tensors; the inputs are not modified.
    With ``"complex"``, an output that comes back real (a cast or ``abs`` dropped
    the imaginary part) raises ``TypeError``; one that only partly lost it cannot
    be told from a right one here (``gradcheck`` cross-checks with central
    differences).
    """
    inputs = _as_inputs("numerical_jacobian", inputs)
    if method not in ("central", "complex"):
        raise ValueError(f"numerical_jacobian: method must be 'central' or 'complex', got {method!r}")
    h = eps if eps is not None else (1e-6 if method == "central" else 1e-30)
    if h <= 0:
        raise ValueError(f"numerical_jacobian: eps must be positive, got {h}")

    def f(k: int, xk: np.ndarray) -> np.ndarray:
        args = [Tensor(xk) if i == k else Tensor(t.data) for i, t in enumerate(inputs)]
        with no_grad():
            return _flat_output("numerical_jacobian", fn(*args))

    jacobians = []
    for k in _wrt(inputs):
        x = inputs[k].data
        if method == "complex":
            x = x.astype(np.complex128)
        cols = []
        for j in range(x.size):
            if method == "complex":
                xp = x.copy()
                xp.flat[j] += 1j * h
                out = f(k, xp)
                if out.size and not np.iscomplexobj(out):
                    raise TypeError(
                        f"numerical_jacobian: fn returned a real output for a complex input {k}: something in fn "
                        "dropped the imaginary part (a cast to a real dtype, abs, a comparison), so the complex "
                        "step sees no derivative; use method='central'"
                    )
                cols.append(out.imag / h)
            else:
                xp, xm = x.copy(), x.copy()
                xp.flat[j] += h
                xm.flat[j] -= h
                step = xp.flat[j] - xm.flat[j]  # exact, and not 2h once |x| is large next to h
                if step == 0:
                    raise ValueError(
                        f"numerical_jacobian: eps={h:g} vanishes next to input {k}'s element {j} "
                        f"({x.flat[j]:g}): x + eps rounds to x; pass a larger eps"
                    )
                cols.append((f(k, xp) - f(k, xm)) / step)
        n_out = f(k, inputs[k].data).size if not cols else cols[0].size
        jacobians.append(np.stack(cols, axis=1) if cols else np.zeros((n_out, 0)))
    return tuple(jacobians)


def jacobian(fn: Fn, inputs: Tensor | Sequence[Tensor]) -> tuple[np.ndarray, ...]:
    """Jacobians of ``fn`` by reverse mode: one backward per output element.

    Uses ``grad``, so no ``.grad`` (of the inputs or of any parameter ``fn``
    closes over) is touched. Records ``fn``'s graph even inside ``no_grad()``.
    """
    inputs = _as_inputs("jacobian", inputs)
    wrt = [inputs[k] for k in _wrt(inputs)]
    with enable_grad():
        outs = _outputs("jacobian", fn(*inputs))
    rows: list[list[np.ndarray]] = [[] for _ in wrt]
    for o in outs:
        if not o.requires_grad:  # does not depend on any input: zero rows
            for r, t in zip(rows, wrt):
                r.extend(np.zeros(t.size) for _ in range(o.size))
            continue
        for i in range(o.size):
            seed = np.zeros(o.shape, dtype=o.dtype)
            seed.flat[i] = 1
            for r, g in zip(rows, grad(o, wrt, seed, retain_graph=True)):
                r.append(g.ravel())
    return tuple(np.array(r, dtype=np.float64).reshape(len(r), t.size) for r, t in zip(rows, wrt))


@dataclass
class GradcheckReport:
    """What ``gradcheck`` found: worst errors over all inputs, and why it failed if it did."""

    passed: bool
    max_abs_err: float
    max_rel_err: float
    message: str = ""


def gradcheck_report(
    fn: Fn,
    inputs: Tensor | Sequence[Tensor],
    *,
    eps: float | None = None,
    atol: float = _CENTRAL_ATOL,
    rtol: float = _CENTRAL_RTOL,
    method: str = "central",
) -> GradcheckReport:
    """Run the checks of ``gradcheck`` and return the numbers instead of raising."""
    inputs = _as_inputs("gradcheck", inputs)
    for k, t in enumerate(inputs):
        if t.requires_grad and t.dtype != np.float64:
            raise TypeError(
                f"gradcheck: input {k} (shape {t.shape}) is {t.dtype}; finite differences need "
                "float64 inputs (in float32 their roundoff exceeds these tolerances)"
            )
    wrt = _wrt(inputs)
    if not wrt:
        raise ValueError("gradcheck: no input requires grad, so there is nothing to check")

    def failed(message: str) -> GradcheckReport:
        return GradcheckReport(False, np.inf, np.inf, message)

    before = [t.data.copy() for t in inputs]
    with no_grad():
        outs = _outputs("gradcheck", fn(*inputs))
        if (k := _modified(inputs, before)) is not None:
            return failed(f"gradcheck: fn modified input {k} in place")
        again = _outputs("gradcheck", fn(*inputs))
    for i, o in enumerate(outs):
        if o.dtype != np.float64:
            raise TypeError(
                f"gradcheck: output {i} of fn (shape {o.shape}) is {o.dtype}; finite differences need "
                "float64 outputs (a float32 output rounds them away)"
            )
    if len(again) != len(outs) or any(not np.array_equal(a.data, o.data, equal_nan=True) for a, o in zip(again, outs)):
        return failed("gradcheck: fn is not deterministic: two calls on the same inputs gave different outputs")
    shapes = [o.shape for o in outs]

    analytic = jacobian(fn, inputs)
    if (k := _modified(inputs, before)) is not None:
        return failed(f"gradcheck: fn modified input {k} in place")
    repeat = jacobian(fn, inputs)
    for k, a, r in zip(wrt, analytic, repeat):
        if not np.array_equal(a, r, equal_nan=True):
            return failed(
                f"gradcheck: the backward for input {k} is not deterministic: two runs differ by "
                f"{np.nanmax(np.abs(a - r)):.3e}"
            )
    numeric = numerical_jacobian(fn, inputs, eps, method)
    if method == "complex":
        # the complex step is only right for an analytic forward: check it against central differences
        central = numerical_jacobian(fn, inputs, None, "central")
        for k, c, n in zip(wrt, central, numeric):
            if (where := _worst_mismatch(n, c, _CENTRAL_ATOL, _CENTRAL_RTOL)) is not None:
                i, j = where
                return failed(
                    f"gradcheck: for input {k} at {_output_element(i, shapes)}, input element "
                    f"{_input_element(j, inputs[k].shape)} the complex step gives {n[i, j]:.10g} but central "
                    f"differences {c[i, j]:.10g}: fn is not complex-analytic (abs, maximum, comparisons, casts "
                    "to a real dtype drop the imaginary part), so the complex step is wrong for it; use "
                    "method='central'"
                )

    worst_abs = worst_rel = 0.0
    failure = ""
    for k, a, n in zip(wrt, analytic, numeric):
        if a.size == 0:
            continue
        diff = np.nan_to_num(np.abs(a - n), nan=np.inf)  # a NaN on either side is an infinite error
        worst_abs = max(worst_abs, float(np.max(diff)))
        worst_rel = max(worst_rel, float(np.max(diff / np.maximum(np.maximum(np.abs(a), np.abs(n)), atol))))
        if (where := _worst_mismatch(a, n, atol, rtol)) is not None and not failure:
            i, j = where
            bad = ~(diff <= atol + rtol * np.abs(n))
            failure = (
                f"gradcheck: Jacobian mismatch for input {k} (shape {inputs[k].shape}) at "
                f"{_output_element(i, shapes)}, input element {_input_element(j, inputs[k].shape)}: analytic "
                f"{a[i, j]:.10g}, numerical {n[i, j]:.10g} ({method}), abs error {diff[i, j]:.3e} "
                f"> atol {atol:g} + rtol {rtol:g} * |numerical|; {int(bad.sum())} of {bad.size} "
                "entries disagree"
            )
    if not failure and all(a.size == 0 or np.nanmax(np.abs(n)) < atol for a, n in zip(analytic, numeric)):
        warnings.warn(
            "gradcheck: every Jacobian entry is below atol, so the check cannot tell a right "
            "gradient from a zero one; rescale the inputs or lower atol",
            stacklevel=3,
        )
    return GradcheckReport(not failure, worst_abs, worst_rel, failure)


def _worst_mismatch(a: np.ndarray, n: np.ndarray, atol: float, rtol: float) -> tuple[int, int] | None:
    """Where ``|a - n| <= atol + rtol * |n|`` fails worst (NaN on either side fails), or None."""
    diff = np.nan_to_num(np.abs(a - n), nan=np.inf)
    bad = ~(diff <= atol + rtol * np.abs(n))
    if not bad.any():
        return None
    excess = np.where(bad, np.nan_to_num(diff / (atol + rtol * np.abs(n)), nan=np.inf), -1.0)
    i, j = np.unravel_index(int(np.argmax(excess)), a.shape)
    return int(i), int(j)


def _input_element(j: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(v) for v in np.unravel_index(j, shape)) if shape else ()


def gradcheck(
    fn: Fn,
    inputs: Tensor | Sequence[Tensor],
    *,
    eps: float | None = None,
    atol: float = _CENTRAL_ATOL,
    rtol: float = _CENTRAL_RTOL,
    raise_exception: bool = True,
    method: str = "central",
) -> bool:
    """Check ``fn``'s reverse-mode gradients against numerical ones, entry by entry.

    For every input with ``requires_grad`` (all of them float64), the full
    Jacobian from backward must satisfy
    ``|analytic - numerical| <= atol + rtol * |numerical|`` everywhere. Also
    checked: ``fn`` does not modify its inputs, two forward and two backward
    passes give bit-identical results, and with ``method="complex"`` the
    complex step agrees with central differences (it is wrong for a forward
    that is not complex-analytic). On failure, raises ``GradcheckError``
    naming the input, the worst element and both values (or returns False
    when ``raise_exception`` is False). Float32 inputs or outputs, and a
    Tensor passed twice, raise ``TypeError``/``ValueError`` instead.
    """
    report = gradcheck_report(fn, inputs, eps=eps, atol=atol, rtol=rtol, method=method)
    if not report.passed and raise_exception:
        raise GradcheckError(report.message)
    return report.passed
