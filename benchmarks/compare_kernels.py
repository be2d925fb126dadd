"""Time the numba kernels against an earlier version of themselves, interleaved in one process.

    python benchmarks/compare_kernels.py REV [--views 8192x1x1024x1 32x8x8x3136 ...]
                                             [--dtype float32] [--threads 2] [--rounds 60] [--cold] [--floor]
                                             [--wrapper]

Loads ``minigrad_norm/kernels/numba_cpu.py`` as it was at git revision REV into a
module of its own (compiled into its own cache), then times forward, backward,
backward without affine gradients and, for a BatchNorm view, the forward with given
statistics (eval mode) of both versions on each (N, G, K, S) view, with
preallocated outputs, both on the very same arrays (see ``problem``). The two
alternate call by call, and the order flips every round (ABBA), so that neither
always runs in the cache state the other leaves behind (a fixed order showed 7-9 %
between two copies of the same code). Reports the medians and new/old.

Run it against HEAD with the tree unchanged first, or pass ``--floor``, which times a
second copy of the working tree's kernels (loaded as REV's are) in the same rounds and
reports new/twin: that is how far apart two copies of the same code read, the floor
under which a change shows nothing. On the Intel VM that was 2 %. On the AMD Zen 4 VM
(CPU family 25), in one hour, 0.93-1.04 in runs of their own, and a change's 0.92-0.94
hot stood inside that. On the AMD VM of CPU family 26 (2 threads, cold) it was 0.87-1.08 for
most views and directions, but the backward of 65536x1x128x1 read 1.19-1.34 and its
backward without affine gradients 0.86-0.90, in four runs out of four (why is not
known). Nor is it the code's alignment: each copy's functions start on page boundaries, at the same
offsets in every copy. Copies of one source, each compiled in its own module, timed in one process (float32
backward of 256x64x1x256, cold): in one run six read within 2 % of each other; in another, of four (the
package's kernels and three copies), one read 1.37-1.45 of the others' time, steadily over three sets of 20
rounds. On the Zen 4 VM
the working tree's kernels, loaded from a cache the test suite had written, read 1.17-1.62
of their twin's time on that view's backward without affine gradients, in two runs; with
the cache emptied (``find minigrad_norm -name "*.nb[ic]" -delete``) and the kernels
compiled again, 0.98-1.00. A --floor run is worth repeating after a recompile.

``--cold`` empties the caches before each timed call (``bench.Stream.evict``), as
the benchmark times the listed shapes: without it the arrays of these shapes can
stay in a large L3 from call to call, and a change that helps only when x comes
from DRAM (a prefetch) shows nothing.
A view whose name ends in "bn" (32x64x1x3136bn) reduces over the batch (BatchNorm).

``--wrapper`` also times, in the same rounds, a copy of the working tree's module whose
kernels do nothing (``wrapper_only``): what a call costs around its kernel, in Python
(argument checks, the choice of loop and work items, buffers from the pool, the kernel's
lookup; not numba's dispatch of the kernel's arguments, which counts as the kernel's). Hot
that is tens of microseconds; from cold caches the interpreter's and NumPy's code and data
come from memory too. ``compare_kernels.py HEAD --cold --wrapper`` (the Intel VM, 2 threads,
the default views and 4096x64x1x16): forwards 0.15-0.29 ms, 3-11 % of the call, backwards
0.18-0.43 ms, 2-14 % (float32 LayerNorm 512x4096: 0.38 of 2.7 ms). Taken apart with timers
inside a copy of ``norm_backward`` (float64 LayerNorm 512x4096, cold; before the kernels
summed their own partial rows, ``_sum_chunks``): the argument checks 64 us, the checks of
the dtypes and the mean 25 (float32, whose float64 mean is tested against float32's range,
66), three buffers from the pool 79, NumPy's sums of dweight's and dbias's partial rows
176-196. A step timed alone from cold caches costs what it will not cost inside a call
whose earlier steps ran the same code: three pool buffers fewer per backward showed nothing
in whole calls (0.99-1.02).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numba
import numpy as np

from minigrad_norm import bench
from minigrad_norm.kernels import numba_cpu
from minigrad_norm.kernels.buffers import aligned_empty

EPS = 1e-5
VIEWS = ("8192x1x1024x1", "65536x1x128x1", "512x1x4096x1", "4096x1x768x1", "32x64x1x3136bn", "32x8x8x3136")


ROOT = Path(__file__).resolve().parent.parent


def load_revision(rev: str, into: Path):
    """numba_cpu.py at git revision ``rev``, imported as a module of its own."""
    source = bench.git_output(["show", f"{rev}:minigrad_norm/kernels/numba_cpu.py"], ROOT).decode()
    return load_source(source, into / f"numba_cpu_{rev.replace('/', '_').replace('~', '_')}.py")


def load_source(source: str, path: Path):
    """``source`` written to ``path`` and imported from there, as a module of its own."""
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (numba pickles references to its classes into the cache)
    spec.loader.exec_module(module)
    return module


def problem(view: str, dtype: np.dtype) -> dict:
    """The arrays of one view, made once and handed to both versions, so that the comparison is not also
    one of two sets of physical pages (their places in the caches and DRAM banks)."""
    reduce_batch = view.endswith("bn")
    shape = tuple(int(v) for v in view.removesuffix("bn").split("x"))
    rng = np.random.default_rng(0)
    x, dy = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    w, b = (rng.standard_normal(shape[1:3]).astype(dtype) for _ in range(2))
    y, dx = aligned_empty(shape, dtype), aligned_empty(shape, dtype)  # as the benchmark preallocates them
    _, mean, var = numba_cpu.norm_forward(x, w, b, EPS, reduce_batch=reduce_batch)
    return dict(
        x=x, dy=dy, w=w, b=b, y=y, dx=dx, mean=mean, var=var, rstd=1 / np.sqrt(var + EPS), reduce_batch=reduce_batch
    )


def runners(mod, p: dict) -> dict:
    x, dy, w, mean, rstd = p["x"], p["dy"], p["w"], p["mean"], p["rstd"]
    opts = dict(reduce_batch=p["reduce_batch"], out=p["dx"])
    fns = {
        "fwd": lambda: mod.norm_forward(x, w, p["b"], EPS, out=p["y"], reduce_batch=p["reduce_batch"]),
        "bwd": lambda: mod.norm_backward(dy, x, mean, rstd, w, **opts),
        "bwd, no affine grads": lambda: mod.norm_backward(dy, x, mean, rstd, w, need_affine_grads=False, **opts),
    }
    if p["reduce_batch"]:  # BatchNorm in eval mode: the forward with the running statistics given
        stats = (mean, p["var"])
        fns["fwd, eval"] = lambda: mod.norm_forward(x, w, p["b"], EPS, out=p["y"], reduce_batch=True, stats=stats)
    return fns


def working_tree(path: Path):
    """The working tree's numba_cpu.py, imported again from ``path``, as a module of its own."""
    return load_source((ROOT / "minigrad_norm" / "kernels" / "numba_cpu.py").read_text(), path)


def wrapper_only(path: Path):
    """The working tree's module loaded again from ``path``, its kernels replaced by calls that do nothing, before
    any is compiled: its public functions then run all their Python and no kernel."""
    module = working_tree(path)

    def nothing(*args: object) -> None:
        return None

    module._KERNELS = {name: (nothing, nothing) for name in module._KERNELS}
    return module


def interleaved(fns: list, rounds: int, before=None) -> list[float]:
    """Median ms of each of ``fns``, called in turn, each round in an order rotated by one and every other
    cycle reversed (for two: AB BA BA AB), so that none always runs in the cache state another leaves
    behind; ``before`` (untimed) runs before each timed call."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    k = len(fns)
    for r in range(rounds):
        order = [(i + r) % k for i in range(k)]
        if (r // k) % 2:
            order.reverse()
        for i in order:
            if before is not None:
                before()
            t = time.perf_counter()
            fns[i]()
            times[i].append(time.perf_counter() - t)
    return [1e3 * statistics.median(t) for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev", help="the git revision to compare with (e.g. HEAD~1, a commit)")
    parser.add_argument(
        "--views", nargs="+", type=bench.view_spec, default=VIEWS, help=f"NxGxKxS[bn] (default {' '.join(VIEWS)})"
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"], help="(default float32)")
    parser.add_argument(
        "--threads", type=bench.thread_count, default=numba.config.NUMBA_NUM_THREADS, help="(default all of numba's)"
    )
    parser.add_argument("--rounds", type=bench.positive_int, default=60, help="timed calls per kernel (default 60)")
    parser.add_argument("--cold", action="store_true", help="empty the caches before each timed call")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also time a second copy of the working tree's kernels, loaded as REV's are, in the same rounds: "
        "new/twin, two copies of the same code, is the floor under which new/old shows nothing",
    )
    parser.add_argument(
        "--wrapper",
        action="store_true",
        help="also time the working tree's functions with kernels that do nothing, in the same rounds: the Python "
        "around the kernels ('wrapper ms', and its share of new)",
    )
    args = parser.parse_args()
    # REV and the twin come from this checkout; the new kernels are whatever Python imports, which a
    # non-editable install (or another checkout's editable one) puts ahead of this working tree
    imported = Path(numba_cpu.__file__).resolve()
    if not imported.is_relative_to(ROOT):
        raise SystemExit(
            f"compare_kernels.py: minigrad_norm is imported from {imported.parents[2]}, not from this checkout "
            f"{ROOT}, so 'new' would not be its working tree: run with PYTHONPATH={ROOT}"
        )
    numba.set_num_threads(args.threads)
    before = bench.Stream(quick=True).evict if args.cold else None
    with tempfile.TemporaryDirectory() as tmp:
        modules = [load_revision(args.rev, Path(tmp)), numba_cpu]
        if args.floor:
            modules.append(working_tree(Path(tmp) / "numba_cpu_twin.py"))
        if args.wrapper:
            modules.append(wrapper_only(Path(tmp) / "numba_cpu_wrapper.py"))
        state = "cold" if args.cold else "hot"
        print(f"numba kernels: {args.rev} (old) against the working tree (new), {args.dtype}, {args.threads} threads")
        print(f"{state} caches")
        floor = f" {'twin ms':>9} {'new/twin':>8}" if args.floor else ""
        wrapper = f" {'wrapper ms':>10} {'of new':>6}" if args.wrapper else ""
        print(f"{'view':>16} {'direction':>22} {'old ms':>9} {'new ms':>9} {'new/old':>8}{floor}{wrapper}")
        for view in args.views:
            arrays = problem(view, np.dtype(args.dtype))
            calls = [runners(module, arrays) for module in modules]
            for direction in calls[0]:
                t = interleaved([c[direction] for c in calls], args.rounds, before)
                line = f"{view:>16} {direction:>22} {t[0]:>9.3f} {t[1]:>9.3f} {t[1] / t[0]:>8.2f}"
                if args.floor:
                    line += f" {t[2]:>9.3f} {t[1] / t[2]:>8.2f}"
                if args.wrapper:
                    line += f" {t[-1]:>10.3f} {t[-1] / t[1]:>6.0%}"
                print(line)
                sys.stdout.flush()


if __name__ == "__main__":
    main()
