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
numerical one: nothing a plain ``sum`` could hide. The reverse-mode rows come
from unit vectors, so it also runs backwards with random dL/d(output) vectors,
which a rule that is not linear in its incoming gradient gets wrong.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from minigrad_norm.tensor import Tensor, _topological_order, enable_grad, grad, no_grad

Fn = Callable[..., Tensor | Sequence[Tensor]]

# gradcheck's default tolerances: for central differences in float64 (the complex step's cross-check with
# central differences uses them whatever the caller's), and for the complex step, exact but for roundoff
_CENTRAL_ATOL = 1e-5
_CENTRAL_RTOL = 1e-3
_COMPLEX_ATOL = 1e-8
_COMPLEX_RTOL = 1e-6


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


def _fresh(inputs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """Leaf copies of ``inputs`` (their data copied): fn and its backward cannot write into the caller's
    arrays, and a backward cannot run on into the graph that made an input."""
    return tuple(Tensor(t.data.copy(), requires_grad=t.requires_grad) for t in inputs)


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
    ``fn`` is called on fresh, graph-free copies; the inputs are not modified.
    Central differences refuse an input that requires grad and is not float64.
    With ``"complex"``, an output that comes back real raises ``TypeError``
    (a cast or ``abs`` dropped the imaginary part), unless fn does not use
    that input element at all (its output is bit-for-bit unchanged when the
    element moves), whose column is then zero. An output that only partly
    lost its imaginary part cannot be told from a right one here
    (``gradcheck`` cross-checks with central differences).
    """
    inputs = _as_inputs("numerical_jacobian", inputs)
    _check_method("numerical_jacobian", method)
    h = eps if eps is not None else (1e-6 if method == "central" else 1e-30)
    _check_positive("numerical_jacobian", "eps", h)
    if method == "central":  # (the complex step pushes x as complex128, exact whatever x's dtype)
        _check_float64("numerical_jacobian", inputs)

    def f(k: int, xk: np.ndarray) -> np.ndarray:
        args = [Tensor(xk) if i == k else Tensor(t.data.copy()) for i, t in enumerate(inputs)]
        with no_grad():
            try:
                return _flat_output("numerical_jacobian", fn(*args))
            except TypeError as e:
                if not np.iscomplexobj(xk):
                    raise
                raise TypeError(
                    f"numerical_jacobian: fn failed on a complex input {k} ({e}); the complex step needs every "
                    "operation in fn to take complex numbers; use method='central'"
                ) from e

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
                    if not _uses_element(f, k, inputs[k].data, j, out):
                        cols.append(np.zeros(out.size))
                        continue
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
        n_out = f(k, inputs[k].data.copy()).size if not cols else cols[0].size
        jacobians.append(np.stack(cols, axis=1) if cols else np.zeros((n_out, 0)))
    return tuple(jacobians)


def _uses_element(f: Callable[[int, np.ndarray], np.ndarray], k: int, x: np.ndarray, j: int, out: np.ndarray) -> bool:
    """Whether fn's (real) output ``out`` at x changes when element j of input k moves by a real step.

    A complex step that comes back real either lost its imaginary part or never reached fn's output; in
    the second case fn does not read the element, and its derivative is exactly zero."""
    xp = x.copy()
    xp.flat[j] += 1e-3 * max(1.0, abs(float(xp.flat[j])))
    return not np.array_equal(f(k, xp), out, equal_nan=True)


def _check_float64(op: str, inputs: tuple[Tensor, ...]) -> None:
    for k, t in enumerate(inputs):
        if t.requires_grad and t.dtype != np.float64:
            raise TypeError(
                f"{op}: input {k} (shape {t.shape}) is {t.dtype}; finite differences need float64 inputs (in "
                "float32 their roundoff, about u |f| / eps, is some percent of the derivative)"
            )


def _check_method(op: str, method: str) -> None:
    if method not in ("central", "complex"):
        raise ValueError(f"{op}: method must be 'central' or 'complex', got {method!r}")


def _check_positive(op: str, name: str, value: float, allow_zero: bool = False) -> None:
    """``value`` a finite real number, > 0 (or >= 0 with ``allow_zero``): NaN would pass ``value <= 0``."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{op}: {name} must be a real number, got {type(value).__name__}")
    if not (np.isfinite(value) and (value >= 0 if allow_zero else value > 0)):
        raise ValueError(f"{op}: {name} must be finite and {'>= 0' if allow_zero else '> 0'}, got {value}")


def jacobian(fn: Fn, inputs: Tensor | Sequence[Tensor]) -> tuple[np.ndarray, ...]:
    """Jacobians of ``fn`` by reverse mode: one backward per output element.

    ``fn`` runs on leaf copies of the inputs, so neither it nor its backward
    can change the caller's arrays, and an input that came out of another
    graph is differentiated as a leaf. Uses ``grad``, so no ``.grad`` (of the
    inputs or of any parameter ``fn`` closes over) is touched. Records
    ``fn``'s graph even inside ``no_grad()``. A backward that writes into the
    gradient it is given raises ``GradcheckError``: in a graph that array is
    shared (``a + b`` hands the same one to both inputs).
    """
    inputs = _fresh(_as_inputs("jacobian", inputs))
    return _reverse_jacobian(fn, inputs)


def _reverse_jacobian(fn: Fn, inputs: tuple[Tensor, ...]) -> tuple[np.ndarray, ...]:
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
            for r, g in zip(rows, _vjp(o, wrt, seed)):
                r.append(g.ravel())
    return tuple(np.array(r, dtype=np.float64).reshape(len(r), t.size) for r, t in zip(rows, wrt))


def _vjp(output: Tensor, wrt: Sequence[Tensor], v: np.ndarray) -> tuple[np.ndarray, ...]:
    """v^T J for each input in ``wrt``, by one backward; refuses a backward that wrote into v."""
    kept = v.copy()
    grads = grad(output, wrt, v, retain_graph=True)
    if not np.array_equal(v, kept, equal_nan=True):
        raise GradcheckError(
            f"jacobian: a backward of fn wrote into the gradient it was given (for the output of shape "
            f"{output.shape}); a backward must not modify its argument, which the engine shares between "
            "ops (a + b hands the same array to both inputs)"
        )
    return grads


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
    atol: float | None = None,
    rtol: float | None = None,
    method: str = "central",
) -> GradcheckReport:
    """Run the checks of ``gradcheck`` and return the numbers instead of raising."""
    inputs = _as_inputs("gradcheck", inputs)
    _check_method("gradcheck", method)
    atol, rtol = _tolerances(method, atol, rtol)
    if eps is not None:
        _check_positive("gradcheck", "eps", eps)
    _check_float64("gradcheck", inputs)
    for k, t in enumerate(inputs):
        if t.requires_grad and not np.isfinite(t.data).all():
            j = _input_element(int(np.argmin(np.isfinite(t.data).ravel())), t.shape)
            raise ValueError(
                f"gradcheck: input {k} (shape {t.shape}) holds {t.data[j]} at {j}; numerical derivatives "
                "need finite inputs"
            )
    wrt = _wrt(inputs)
    if not wrt:
        raise ValueError("gradcheck: no input requires grad, so there is nothing to check")
    inputs = _fresh(inputs)

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

    try:
        analytic = _reverse_jacobian(fn, inputs)
        if (k := _modified(inputs, before)) is not None:
            return failed(f"gradcheck: the backward of fn modified input {k} in place")
        repeat = _reverse_jacobian(fn, inputs)
    except GradcheckError as e:
        return failed(f"gradcheck: {e}")
    for k, a, r in zip(wrt, analytic, repeat):
        if not np.array_equal(a, r, equal_nan=True):
            return failed(
                f"gradcheck: the backward for input {k} is not deterministic: two runs differ by "
                f"{np.nanmax(np.abs(a - r)):.3e}"
            )
    numeric = numerical_jacobian(fn, inputs, eps, method)
    if method == "complex" and (mismatch := _complex_step_mismatch(fn, inputs, numeric, outs)):
        return failed(mismatch)

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
                "entries disagree" + _mismatch_hint(fn, inputs, k, a, method, eps, outs, i, diff[i, j])
            )
    if not failure:
        failure = _nonlinear_backward(fn, inputs, numeric, atol, rtol)
    vacuous = [k for k, a, n in zip(wrt, analytic, numeric) if a.size and not (np.abs(n) >= atol).any()]
    if not failure and vacuous:
        warnings.warn(
            f"gradcheck: every Jacobian entry of input(s) {', '.join(map(str, vacuous))} is below atol "
            f"{atol:g}, so the check cannot tell a right gradient there from a zero one; rescale those "
            "inputs or lower atol",
            stacklevel=3,
        )
    return GradcheckReport(not failure, worst_abs, worst_rel, failure)


def _mismatch_hint(
    fn: Fn,
    inputs: tuple[Tensor, ...],
    k: int,
    a: np.ndarray,
    method: str,
    eps: float | None,
    outs: tuple[Tensor, ...],
    i: int,
    err: float,
) -> str:
    """What may explain a mismatch at output element i other than a wrong rule: a graph that does not reach
    input k (fn left the engine), or central differences' roundoff as large as the error (an output far from
    0); ``outs`` are fn's outputs at ``inputs``."""
    if not a.any():
        with enable_grad():
            graph = {
                id(t) for o in _outputs("gradcheck", fn(*inputs)) if o.requires_grad for t in _topological_order(o)
            }
        if id(inputs[k]) not in graph:
            return (
                f"; no output of fn reaches input {k} in the graph: something in fn left the engine (.data, "
                ".numpy(), np.asarray, a new Tensor) and cut it"
            )
    if method == "central":
        h = 1e-6 if eps is None else eps
        f = _flat_output("gradcheck", outs)[i]
        if err <= (noise := _roundoff(f, h)):
            return (
                f"; central differences' roundoff here is about {noise:.1e} (output {f:.4g}, step {h:g}), as large "
                "as the error: subtract the output's constant part in fn, or use method='complex' if fn is analytic"
            )
    return ""


def _roundoff(f: float | np.ndarray, h: float) -> float | np.ndarray:
    """About what rounding adds to central differences of step h where fn's output is f: u |f| / h (u the unit
    roundoff), allowed 16 times over."""
    return 16 * np.finfo(np.float64).eps * np.abs(f) / h


def _tolerances(method: str, atol: float | None, rtol: float | None) -> tuple[float, float]:
    """The caller's tolerances, or the method's defaults: the complex step has no cancellation, so its
    defaults are a thousand times tighter. (A normalization whose backward uses eps = 1e-4 where its
    forward uses 1e-5 is off by about (1e-4 - 1e-5) / (2 var) relative: on rows of variance near 1,
    inside central differences' rtol and outside the complex step's.)"""
    default_atol, default_rtol = (
        (_CENTRAL_ATOL, _CENTRAL_RTOL) if method == "central" else (_COMPLEX_ATOL, _COMPLEX_RTOL)
    )
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    _check_positive("gradcheck", "atol", atol, allow_zero=True)
    _check_positive("gradcheck", "rtol", rtol, allow_zero=True)
    return float(atol), float(rtol)


def _nonlinear_backward(
    fn: Fn, inputs: tuple[Tensor, ...], numeric: Sequence[np.ndarray], atol: float, rtol: float
) -> str:
    """A failure message if a backward with a random dL/d(output) v disagrees with v^T J, else "".

    The entrywise check seeds the backward with unit vectors only, and a rule that is not linear in its
    incoming gradient (``np.clip(g, -1, 1)``, ``g ** 2``, ``abs(g)``) can be right on every one of them.
    Three vectors v, every entry nonzero: large ones (|v| in 300..1000), small ones of the opposite signs
    (1e-3..3e-3), and ones of random signs spread over 1e-3..1e3. So a square, an abs or a sign of g, or a
    clip at any threshold under 300, changes some v^T J, even for a scalar output. If every entry of the
    analytic J is within atol + rtol |J_num| of the numerical one, a linear backward's v^T J is within
    sum_i |v_i| (atol + rtol |J_num[i, j]|) of v^T J_num; the bound is doubled for the roundoff of the sums.
    """
    wrt = [inputs[k] for k in _wrt(inputs)]
    with enable_grad():
        outs = _outputs("gradcheck", fn(*inputs))
    rng = np.random.default_rng(0)
    sign, mixed = ([rng.choice([-1.0, 1.0], o.shape) for o in outs] for _ in range(2))
    for signs, low, high in ((sign, 2.5, 3.0), ([-s for s in sign], -3.0, -2.5), (mixed, -3.0, 3.0)):
        vs = [s * 10.0 ** rng.uniform(low, high, s.shape) for s in signs]
        v = np.concatenate([u.ravel() for u in vs]) if vs else np.zeros(0)
        got = [np.zeros(t.size) for t in wrt]
        for o, u in zip(outs, vs):
            if o.requires_grad:
                try:
                    for acc, g in zip(got, _vjp(o, wrt, u)):
                        acc += g.ravel()
                except GradcheckError as e:
                    return f"gradcheck: {e}"
        for k, g, n in zip(_wrt(inputs), got, numeric):
            want = v @ n
            bound = 2 * (atol * np.abs(v).sum() + rtol * (np.abs(v) @ np.abs(n)))
            diff = np.nan_to_num(np.abs(g - want), nan=np.inf)
            if not (diff <= bound).all():
                j = int(np.argmax(diff - bound))
                return (
                    f"gradcheck: the backward is not linear in its incoming gradient: for input {k}, a random "
                    f"dL/d(output) v gives {g[j]:.10g} at input element {_input_element(j, inputs[k].shape)}, "
                    f"where v^T J is {want[j]:.10g} (J numerical), although every unit vector gave the right "
                    "row of J"
                )
    return ""


def _complex_step_mismatch(
    fn: Fn, inputs: tuple[Tensor, ...], numeric: Sequence[np.ndarray], outs: tuple[Tensor, ...]
) -> str:
    """A failure message if the complex-step Jacobians disagree with central differences, else "";
    ``outs`` are fn's outputs at ``inputs``.

    The complex step is only right for a forward that is complex-analytic. Central differences here take
    a step h of 1e-6 times the largest |input| (at least 1e-6). Two errors of theirs are added to the
    tolerances: their roundoff, about u |f| / h per entry (u the unit roundoff, f the output), so that an
    output far from 0 (f = x^2 + 1e9) does not pass for a non-analytic forward; and their truncation,
    O(h^2), estimated from a second set with step h/2 (Richardson: the error of the first is about 4/3 of
    their difference, allowed twice over), so that large inputs (x^3 or sin x at x = 1e5, where h = 0.1)
    do not fail an analytic one. A forward that is not analytic differs from the complex step by its
    whole derivative, whatever the step.
    """
    wrt = _wrt(inputs)
    scale = max((float(np.max(np.abs(inputs[k].data), initial=0.0)) for k in wrt), default=0.0)
    h = 1e-6 * max(1.0, scale)
    central = numerical_jacobian(fn, inputs, h, "central")
    finer = numerical_jacobian(fn, inputs, h / 2, "central")
    shapes = [o.shape for o in outs]
    roundoff = _roundoff(_flat_output("gradcheck", outs), h)[:, None]
    for k, c, c2, n in zip(wrt, central, finer, numeric):
        allowed = _CENTRAL_ATOL + roundoff + 8 / 3 * np.abs(c - c2)
        if (where := _worst_mismatch(n, c, allowed, _CENTRAL_RTOL)) is not None:
            i, j = where
            return (
                f"gradcheck: for input {k} at {_output_element(i, shapes)}, input element "
                f"{_input_element(j, inputs[k].shape)} the complex step gives {n[i, j]:.10g} but central "
                f"differences {c[i, j]:.10g} (step {h:g}; their roundoff here about {roundoff[i, 0]:.1e}, "
                f"their truncation about {4 / 3 * abs(c[i, j] - c2[i, j]):.1e}): fn is not complex-analytic "
                "(abs, maximum, comparisons, casts to a real dtype drop the imaginary part), so the complex "
                "step is wrong for it; use method='central'"
            )
    return ""


def _worst_mismatch(a: np.ndarray, n: np.ndarray, atol: float | np.ndarray, rtol: float) -> tuple[int, int] | None:
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
    atol: float | None = None,
    rtol: float | None = None,
    raise_exception: bool = True,
    method: str = "central",
) -> bool:
    """Check ``fn``'s reverse-mode gradients against numerical ones, entry by entry.

    For every input with ``requires_grad`` (all of them float64 and finite),
    the full Jacobian from backward must satisfy
    ``|analytic - numerical| <= atol + rtol * |numerical|`` everywhere; the
    defaults are atol = 1e-5, rtol = 1e-3 for central differences and 1e-8,
    1e-6 for the complex step. Also checked:

    * ``fn`` and its backward do not modify their inputs (they run on copies,
      so the caller's arrays stay as they were either way);
    * two forward and two backward passes give bit-identical results;
    * the backward is linear in its incoming gradient: one backward with a
      random dL/d(output) v gives v^T J (unit vectors alone cannot tell);
    * no backward writes into the gradient it is given;
    * with ``method="complex"``, the complex step agrees with central
      differences (it is wrong for a forward that is not complex-analytic).

    An input that came out of another graph is differentiated as a leaf. On
    failure, raises ``GradcheckError`` naming the input, the worst element
    and both values (or returns False when ``raise_exception`` is False).
    Float32 inputs or outputs, a Tensor passed twice and bad arguments raise
    ``TypeError``/``ValueError`` instead, and so do the engine's own errors
    (a backward returning a gradient of the wrong shape, or none). Warns when every entry of an
    input's Jacobian is below atol (nothing there can fail).
    """
    report = gradcheck_report(fn, inputs, eps=eps, atol=atol, rtol=rtol, method=method)
    if not report.passed and raise_exception:
        raise GradcheckError(report.message)
    return report.passed
