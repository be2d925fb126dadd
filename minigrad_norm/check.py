"""The table behind ``minigrad-norm check``: every differentiable op, gradchecked.

Each ``CheckCase`` builds random well-conditioned float64 inputs and a
function of them. ``run_checks`` compares the reverse-mode Jacobian with
central differences and, where the op has one, with its closed-form
Jacobian (the norms), and reports the worst errors.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

import minigrad_norm.functional as F
from minigrad_norm import ops
from minigrad_norm.gradcheck import gradcheck_report, jacobian
from minigrad_norm.tensor import Tensor

Inputs = tuple[Tensor, ...]


@dataclass
class CheckCase:
    name: str
    make_inputs: Callable[[np.random.Generator], Inputs]
    fn: Callable[..., Tensor]
    #: the closed-form Jacobian of ``fn`` w.r.t. its first input, if the op has one
    closed_form: Callable[..., np.ndarray] | None = None
    atol: float = 1e-5
    rtol: float = 1e-3
    #: what explains a warning that gradcheck gives on this case, printed after it
    note: str = ""


@dataclass
class CheckResult:
    name: str
    shapes: str
    fd_abs_err: float
    fd_rel_err: float
    closed_form_err: float | None
    passed: bool
    message: str = field(default="")


def _x(rng: np.random.Generator, *shape: int, positive: bool = False, requires_grad: bool = True) -> Tensor:
    data = rng.uniform(0.5, 2.0, shape) if positive else rng.standard_normal(shape)
    return Tensor(data, requires_grad=requires_grad)


def _distinct(rng: np.random.Generator, *shape: int) -> Tensor:
    """Values at least 0.1 apart and away from 0: no ties for max, no kinks for relu."""
    values = (rng.permutation(int(np.prod(shape))) - np.prod(shape) / 2 + 0.5) * 0.1 + 0.02
    return Tensor(values.reshape(shape), requires_grad=True)


_TARGETS = np.array([-100, 0, 3, 1, 3, 2])  # one ignored target: ignore_index is part of what is checked


PRIMITIVES: list[CheckCase] = [
    CheckCase("add (broadcast)", lambda r: (_x(r, 3, 1, 4), _x(r, 2, 4)), ops.add),
    CheckCase("sub (broadcast)", lambda r: (_x(r, 2, 3), _x(r, 3)), ops.sub),
    CheckCase("mul (broadcast)", lambda r: (_x(r, 3, 1), _x(r, 1, 4)), ops.mul),
    CheckCase("div (broadcast)", lambda r: (_x(r, 2, 3), _x(r, 3, positive=True)), ops.div),
    CheckCase("pow (tensor exponent)", lambda r: (_x(r, 2, 3, positive=True), _x(r, 2, 3)), ops.pow),
    CheckCase("pow (scalar exponent)", lambda r: (_x(r, 4, positive=True),), lambda a: a**2.5),
    CheckCase("neg", lambda r: (_x(r, 3, 2),), ops.neg),
    CheckCase("matmul (batched, broadcast)", lambda r: (_x(r, 2, 1, 3, 4), _x(r, 3, 4, 2)), ops.matmul),
    CheckCase("matmul (vector)", lambda r: (_x(r, 4), _x(r, 2, 4, 3)), ops.matmul),
    CheckCase("sum (axis, keepdims)", lambda r: (_x(r, 2, 3, 4),), lambda a: a.sum(axis=(0, 2), keepdims=True)),
    CheckCase("mean (axis)", lambda r: (_x(r, 2, 3, 4),), lambda a: a.mean(axis=1)),
    CheckCase("max (axis)", lambda r: (_distinct(r, 3, 4),), lambda a: a.max(axis=-1)),
    CheckCase("abs", lambda r: (_distinct(r, 3, 4),), ops.abs),
    CheckCase("exp", lambda r: (_x(r, 3, 3),), ops.exp),
    CheckCase("log", lambda r: (_x(r, 3, 3, positive=True),), ops.log),
    CheckCase("sqrt", lambda r: (_x(r, 3, 3, positive=True),), ops.sqrt),
    CheckCase("tanh", lambda r: (_x(r, 3, 3),), ops.tanh),
    CheckCase("reshape", lambda r: (_x(r, 2, 6),), lambda a: a.reshape(3, 4) * a.reshape(3, 4)),
    CheckCase("permute", lambda r: (_x(r, 2, 3, 4),), lambda a: a.permute(2, 0, 1) * np.arange(24.0).reshape(4, 2, 3)),
    CheckCase("swapaxes", lambda r: (_x(r, 2, 3),), lambda a: a.swapaxes(0, 1) @ a),
    CheckCase("getitem (repeated indices)", lambda r: (_x(r, 5, 3),), lambda a: a[np.array([0, 2, 2, 4])] * 2.0),
    CheckCase("getitem (slices)", lambda r: (_x(r, 4, 5),), lambda a: a[1:, ::2]),
    CheckCase("concatenate", lambda r: (_x(r, 2, 3), _x(r, 4, 3)), lambda a, b: ops.concatenate([a, b, a], axis=0)),
    CheckCase("stack", lambda r: (_x(r, 2, 3), _x(r, 2, 3)), lambda a, b: ops.stack([a, b], axis=1)),
    CheckCase("masked_fill", lambda r: (_x(r, 3, 4),), lambda a: a.masked_fill(np.tri(3, 4, dtype=bool), -1.0)),
    CheckCase("relu", lambda r: (_distinct(r, 3, 4),), F.relu),
    CheckCase("gelu (erf)", lambda r: (_x(r, 3, 4),), F.gelu),
    CheckCase("gelu (tanh)", lambda r: (_x(r, 3, 4),), lambda a: F.gelu(a, approximate="tanh")),
    CheckCase("softmax (axis 0)", lambda r: (_x(r, 4, 3),), lambda a: F.softmax(a, axis=0)),
    CheckCase("log_softmax", lambda r: (_x(r, 3, 5),), F.log_softmax),
    CheckCase("linear", lambda r: (_x(r, 2, 3, 4), _x(r, 5, 4), _x(r, 5)), F.linear),
    CheckCase("embedding", lambda r: (_x(r, 6, 3),), lambda w: F.embedding(np.array([[0, 5], [5, 2]]), w)),
    CheckCase(
        "cross_entropy (ignore_index)",
        lambda r: (_x(r, 6, 4),),
        lambda z: F.cross_entropy(z, _TARGETS),
    ),
    CheckCase(
        "cross_entropy (weight, smoothing)",
        lambda r: (_x(r, 6, 4),),
        lambda z: F.cross_entropy(z, _TARGETS, weight=np.array([0.5, 1.0, 2.0, 1.5]), label_smoothing=0.2),
    ),
]


def all_cases() -> list[CheckCase]:
    """Every case ``check`` runs: the primitives, the norms, the Transformer blocks.

    The norm and block tables import this module (for ``CheckCase``), so they
    are imported here, when the table is wanted, rather than at the top.
    """
    from minigrad_norm.nn.check_cases import BLOCK_CASES
    from minigrad_norm.norms.check_cases import NORM_CASES

    return [*PRIMITIVES, *NORM_CASES, *BLOCK_CASES]


def shapes_of(inputs: Inputs) -> str:
    """The input shapes, e.g. ``3x1x4 2x4``; past three inputs (a block's parameters) only a count."""
    shapes = ["x".join(map(str, t.shape)) or "()" for t in inputs]
    return " ".join(shapes) if len(shapes) <= 3 else f"{shapes[0]} +{len(shapes) - 1} params"


def run_case(case: CheckCase, seed: int = 0) -> CheckResult:
    """Check one op; an exception inside it (a broken backward) is a failed row, not a crash."""
    inputs = case.make_inputs(np.random.default_rng(seed))
    try:
        return _compare(case, inputs)
    except Exception as e:  # noqa: BLE001 - the table must report every op
        return CheckResult(case.name, shapes_of(inputs), np.inf, np.inf, None, False, f"{type(e).__name__}: {e}")


def _compare(case: CheckCase, inputs: Inputs) -> CheckResult:
    """gradcheck (its warnings, such as an input whose Jacobian is all below atol, become the row's message
    rather than lines on stderr that name no row) and the closed form, if the case has one."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = gradcheck_report(case.fn, inputs, atol=case.atol, rtol=case.rtol)
    closed_err = None
    passed, message = report.passed, report.message
    if case.closed_form is not None:
        closed = case.closed_form(*inputs)
        closed_err = float(np.max(np.abs(closed - jacobian(case.fn, inputs)[0]), initial=0.0))
        if not closed_err <= case.atol:
            passed = False
            message = message or f"closed-form Jacobian differs from reverse mode by {closed_err:.3e}"
    notes = [str(w.message) for w in caught]
    message = message or "; ".join(notes + [case.note] if notes and case.note else notes)
    return CheckResult(
        case.name, shapes_of(inputs), report.max_abs_err, report.max_rel_err, closed_err, passed, message
    )


def run_checks(cases: list[CheckCase] | None = None, seed: int = 0) -> list[CheckResult]:
    return [run_case(c, seed) for c in (all_cases() if cases is None else cases)]
