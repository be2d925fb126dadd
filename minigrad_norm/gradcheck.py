"""Gradient verification: reverse-mode Jacobians against numerical ones.

All Jacobians here are 2-D: ``J[i, j] = d out.flat[i] / d input.flat[j]``,
one matrix per input that requires grad (outputs given as a tuple are
flattened and stacked in order).

Numerical Jacobians, two methods:

* ``"central"``: ``(f(x + eps e_j) - f(x - eps e_j)) / (2 eps)``, error
  O(eps^2) from truncation plus O(u / eps) from cancellation (u the unit
  roundoff), so only meaningful in float64.
* ``"complex"``: ``imag(f(x + i h e_j)) / h`` with h = 1e-30. For f built
  from analytic operations, f(x + ih) = f(x) + ih f'(x) + O(h^2): there is no
  subtraction, so the result is exact to machine precision. Ops that are not
  analytic (``abs``, ``max``, ``relu``, comparisons) raise ``TypeError``.

``gradcheck`` compares every entry of the reverse-mode Jacobian with the
numerical one: no random projection, nothing a plain ``sum`` could hide.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from minigrad_norm.tensor import Tensor, grad, no_grad

Fn = Callable[..., Tensor | Sequence[Tensor]]


class GradcheckError(RuntimeError):
    """A reverse-mode gradient disagrees with the numerical one."""


def _as_inputs(inputs: Tensor | Sequence[Tensor]) -> tuple[Tensor, ...]:
    inputs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
    for k, t in enumerate(inputs):
        if not isinstance(t, Tensor):
            raise TypeError(f"gradcheck: input {k} is a {type(t).__name__}, expected a Tensor")
    return inputs


def _flat_output(out: Tensor | Sequence[Tensor]) -> np.ndarray:
    outs = (out,) if isinstance(out, Tensor) else tuple(out)
    return np.concatenate([np.ravel(o.data) for o in outs]) if outs else np.zeros(0)


def _wrt(inputs: tuple[Tensor, ...]) -> list[int]:
    return [k for k, t in enumerate(inputs) if t.requires_grad]


def numerical_jacobian(
    fn: Fn, inputs: Tensor | Sequence[Tensor], eps: float | None = None, method: str = "central"
) -> tuple[np.ndarray, ...]:
    """Jacobians of ``fn`` by finite differences, one per input that requires grad.

    ``eps`` defaults to 1e-6 for ``"central"`` and 1e-30 for ``"complex"``.
    ``fn`` is called on fresh, graph-free Tensors; the inputs are not modified.
    """
    inputs = _as_inputs(inputs)
    if method not in ("central", "complex"):
        raise ValueError(f"numerical_jacobian: method must be 'central' or 'complex', got {method!r}")
    h = eps if eps is not None else (1e-6 if method == "central" else 1e-30)
    if h <= 0:
        raise ValueError(f"numerical_jacobian: eps must be positive, got {h}")

    def f(k: int, xk: np.ndarray) -> np.ndarray:
        args = [Tensor(xk) if i == k else Tensor(t.data) for i, t in enumerate(inputs)]
        with no_grad():
            return _flat_output(fn(*args))

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
                cols.append(f(k, xp).imag / h)
            else:
                xp, xm = x.copy(), x.copy()
                xp.flat[j] += h
                xm.flat[j] -= h
                cols.append((f(k, xp) - f(k, xm)) / (2 * h))
        n_out = f(k, inputs[k].data).size if not cols else cols[0].size
        jacobians.append(np.stack(cols, axis=1) if cols else np.zeros((n_out, 0)))
    return tuple(jacobians)


def jacobian(fn: Fn, inputs: Tensor | Sequence[Tensor]) -> tuple[np.ndarray, ...]:
    """Jacobians of ``fn`` by reverse mode: one backward per output element.

    Uses ``grad``, so no ``.grad`` (of the inputs or of any parameter ``fn``
    closes over) is touched.
    """
    inputs = _as_inputs(inputs)
    wrt = [inputs[k] for k in _wrt(inputs)]
    out = fn(*inputs)
    outs = (out,) if isinstance(out, Tensor) else tuple(out)
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
    return tuple(np.array(r, dtype=np.float64).reshape(-1, t.size) for r, t in zip(rows, wrt))


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
    atol: float = 1e-5,
    rtol: float = 1e-3,
    method: str = "central",
) -> GradcheckReport:
    """Run the checks of ``gradcheck`` and return the numbers instead of raising."""
    inputs = _as_inputs(inputs)
    for k, t in enumerate(inputs):
        if t.requires_grad and t.dtype != np.float64:
            raise TypeError(
                f"gradcheck: input {k} (shape {t.shape}) is {t.dtype}; finite differences need "
                "float64 inputs (in float32 their roundoff exceeds these tolerances)"
            )
    wrt = _wrt(inputs)
    if not wrt:
        raise ValueError("gradcheck: no input requires grad, so there is nothing to check")
    before = [t.data.copy() for t in inputs]
    analytic = jacobian(fn, inputs)
    for k, (t, b) in enumerate(zip(inputs, before)):
        if not np.array_equal(t.data, b, equal_nan=True):
            return GradcheckReport(False, np.inf, np.inf, f"gradcheck: fn modified input {k} in place")
    repeat = jacobian(fn, inputs)
    for k, a, r in zip(wrt, analytic, repeat):
        if not np.array_equal(a, r, equal_nan=True):
            return GradcheckReport(
                False,
                np.inf,
                np.inf,
                f"gradcheck: the backward for input {k} is not deterministic: two runs differ by "
                f"{np.nanmax(np.abs(a - r)):.3e}",
            )
    numeric = numerical_jacobian(fn, inputs, eps, method)

    worst_abs = worst_rel = 0.0
    failure = ""
    for k, a, n in zip(wrt, analytic, numeric):
        if a.size == 0:
            continue
        diff = np.nan_to_num(np.abs(a - n), nan=np.inf)  # a NaN on either side is an infinite error
        worst_abs = max(worst_abs, float(np.max(diff)))
        worst_rel = max(worst_rel, float(np.max(diff / np.maximum(np.maximum(np.abs(a), np.abs(n)), atol))))
        bad = ~(diff <= atol + rtol * np.abs(n))  # NaN anywhere counts as bad
        if bad.any() and not failure:
            excess = np.where(bad, np.nan_to_num(diff / (atol + rtol * np.abs(n)), nan=np.inf), -1.0)
            i, j = np.unravel_index(int(np.argmax(excess)), a.shape)
            in_idx = np.unravel_index(j, inputs[k].shape) if inputs[k].shape else ()
            failure = (
                f"gradcheck: Jacobian mismatch for input {k} (shape {inputs[k].shape}) at output "
                f"element {i}, input element {tuple(int(v) for v in in_idx)}: analytic "
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


def gradcheck(
    fn: Fn,
    inputs: Tensor | Sequence[Tensor],
    *,
    eps: float | None = None,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    raise_exception: bool = True,
    method: str = "central",
) -> bool:
    """Check ``fn``'s reverse-mode gradients against numerical ones, entry by entry.

    For every input with ``requires_grad`` (all of them float64), the full
    Jacobian from backward must satisfy
    ``|analytic - numerical| <= atol + rtol * |numerical|`` everywhere. Also
    checked: ``fn`` does not modify its inputs, and two backward passes give
    bit-identical results. On failure, raises ``GradcheckError`` naming the
    input, the worst element and both values (or returns False when
    ``raise_exception`` is False).
    """
    report = gradcheck_report(fn, inputs, eps=eps, atol=atol, rtol=rtol, method=method)
    if not report.passed and raise_exception:
        raise GradcheckError(report.message)
    return report.passed
