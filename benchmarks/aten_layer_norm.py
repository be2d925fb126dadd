"""The LayerNorm kernels against ATen's own, without autograd, on one thread and on all.

``minigrad-norm bench`` times PyTorch as its users call it: eager, through autograd
(``F.layer_norm`` then ``backward``), with its bookkeeping and its allocations. This
script times ATen's kernels themselves, ``torch.native_layer_norm`` and
``torch.ops.aten.native_layer_norm_backward`` (the outputs still allocated by ATen,
dweight and dbias included), beside the numba kernels with preallocated ``out=``
buffers, hot, interleaved round by round (``bench.interleaved_medians``): what
separates the two kernels' code, with the least around it.

It then prints what each computes: y and dx (a forward, then a backward on that forward's
statistics) against the float64 reference, on the timed rows and on the same rows moved to a
mean of 1e4. ATen's float32 kernels subtract a float32 mean, whose rounding (up to 1e4 * 2^-24 = 6e-4)
is then as large as 6e-4 of a spread of 1; the numba kernels subtract it as a pair of float32
values (``numba_cpu._split``) and take the sums in float64: more arithmetic per value, for an
error that does not grow with the mean.

    python benchmarks/aten_layer_norm.py [--rows 4096] [--dim 768] [--dtype float32]
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

import numba
import numpy as np

from minigrad_norm import bench
from minigrad_norm.bench import positive_int
from minigrad_norm.kernels import numba_cpu, reference

OFFSETS = (0.0, 1e4)


def _tensors(torch: Any, p: bench.Problem) -> tuple[Any, Any, Any, Any]:
    """The problem's x, dy (rows, dim) and weight, bias (dim,) as tensors sharing its arrays' memory."""
    rows, dim = p.case.shape
    x, dy = (torch.from_numpy(np.ascontiguousarray(a).reshape(rows, dim)) for a in (p.x, p.dy))
    return x, dy, torch.from_numpy(p.weight.reshape(-1)), torch.from_numpy(p.bias.reshape(-1))


def aten_runner(torch: Any, p: bench.Problem, direction: str) -> Callable[[], Any]:
    """ATen's LayerNorm forward or backward on the problem's (rows, dim) arrays."""
    x, dy, w, b = _tensors(torch, p)
    dim = x.shape[1]
    _, mean, rstd = torch.native_layer_norm(x, (dim,), w, b, bench.EPS)
    if direction == "fwd":
        return lambda: torch.native_layer_norm(x, (dim,), w, b, bench.EPS)
    return lambda: torch.ops.aten.native_layer_norm_backward(dy, x, (dim,), mean, rstd, w, b, [True, True, True])


def outputs(torch: Any, p: bench.Problem) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(y, dx) of ATen, of the numba kernels, and of the reference on the problem's arrays in float64: each a
    forward, then a backward on that forward's own statistics, as a layer's training step runs them."""
    x, dy, w, b = _tensors(torch, p)
    rows, dim = x.shape
    y, mean, rstd = torch.native_layer_norm(x, (dim,), w, b, bench.EPS)
    dx = torch.ops.aten.native_layer_norm_backward(dy, x, (dim,), mean, rstd, w, b, [True, False, False])[0]
    result = {"aten": (y.numpy(), dx.numpy())}
    exact = dataclasses.replace(
        p, **{k: getattr(p, k).astype(np.float64) for k in ("x", "dy", "weight", "bias")}, dtype=np.dtype(np.float64)
    )
    for name, kernels, q in (("numba", numba_cpu, p), ("float64 reference", reference, exact)):
        y, mean, var = kernels.norm_forward(q.x, q.weight, q.bias, bench.EPS)
        dx = kernels.norm_backward(q.dy, q.x, mean, 1.0 / np.sqrt(var + bench.EPS), q.weight)[0]
        result[name] = (y.reshape(rows, dim), dx.reshape(rows, dim))
    return result


def relative_errors(torch: Any, p: bench.Problem, offset: float) -> dict[str, tuple[float, float]]:
    """For ATen and the numba kernels, on the problem's x + offset (rounded to its dtype, then exact input):
    max |y - y_exact| / max |y_exact| and the same for dx, y_exact and dx_exact from the float64 reference."""
    got = outputs(torch, dataclasses.replace(p, x=(p.x + offset).astype(p.dtype)))
    exact = got.pop("float64 reference")
    return {
        name: tuple(float(np.max(np.abs(a - e)) / np.max(np.abs(e))) for a, e in zip(pair, exact))
        for name, pair in got.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=positive_int, default=4096, help="rows (default 4096)")
    parser.add_argument("--dim", type=positive_int, default=768, help="values per row (default 768)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    args = parser.parse_args()
    torch = bench._torch()
    if torch is None:
        raise SystemExit("aten_layer_norm.py: PyTorch is not installed (pip install torch==2.13.0)")
    p = bench.Problem.make(bench.layer_norm_case(args.rows, args.dim), np.dtype(args.dtype))
    threads = numba.config.NUMBA_NUM_THREADS
    plan = {}
    for direction in ("fwd", "bwd"):
        for t in sorted({1, threads}):
            plan[f"numba out= {direction} {t}t"] = (t, bench.kernel_runner(numba_cpu, p, direction, True))
            plan[f"aten {direction} {t}t"] = (t, aten_runner(torch, p, direction))
    medians = bench.interleaved_medians(plan, torch, 30, 10.0, warmup_calls=bench.WARMUP_CALLS)
    ms = {k: 1e3 * v for k, v in medians.items()}
    print(f"LayerNorm {args.dtype} ({args.rows}, {args.dim}), hot; median ms per call, 30+ interleaved rounds")
    for direction in ("fwd", "bwd"):
        for t in sorted({1, threads}):
            ours, theirs = ms[f"numba out= {direction} {t}t"], ms[f"aten {direction} {t}t"]
            print(f"  {direction} {t}t: numba out= {ours:.3f}, ATen {theirs:.3f}, ATen / numba {theirs / ours:.2f}")
    print("max |error| / max |value| against the float64 reference, y and dx (a backward on the forward's statistics)")
    for offset in OFFSETS:
        errors = relative_errors(torch, p, offset)
        print(f"  rows of mean {offset:g}, spread 1: " + ", ".join(
            f"{name} y {y:.1e} dx {dx:.1e}" for name, (y, dx) in errors.items()
        ))  # fmt: skip


if __name__ == "__main__":
    main()
