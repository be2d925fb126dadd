"""What the allocating path costs: page faults on fresh output memory, for numba and PyTorch alike.

glibc hands out an allocation of 32 MiB or more (its largest mmap threshold) as fresh
pages from the kernel, which zeroes each page on first touch, and gives it back on free.
So a kernel that allocates a 32 MiB output on every call pays for zeroing 32 MiB of new
memory every call, whatever the kernel itself costs. PyTorch's CPU allocator sits on the
same malloc, so its default path pays the same.

This script times a float32 LayerNorm forward+backward, numba allocating its outputs,
numba with preallocated ``out=`` buffers, and PyTorch CPU eager (allocating), in two
fresh processes: one with glibc's defaults, one with

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296

which makes glibc serve large blocks from its heap and keep freed memory for the next
call (no new pages, no faults). Everything else is the same code. The difference
between the two runs is what the page faults cost each implementation.

    python benchmarks/allocation.py [--rows 8192] [--dim 1024] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from minigrad_norm.bench import positive_int, thread_count

REUSE = {"MALLOC_MMAP_THRESHOLD_": str(1 << 32), "MALLOC_TRIM_THRESHOLD_": str(1 << 32)}
IMPLS = ("numba", "numba out=", "torch")


def measure(rows: int, dim: int, threads: int) -> dict[str, float]:
    """Median ms per fwd+bwd call of each implementation, interleaved round by round."""
    import numpy as np

    from minigrad_norm import bench
    from minigrad_norm.kernels import numba_cpu

    torch = bench._torch()
    p = bench.Problem.make(bench.layer_norm_case(rows, dim), np.dtype(np.float32))
    plan = {
        "numba": (threads, bench.kernel_runner(numba_cpu, p, "fwd+bwd", False)),
        "numba out=": (threads, bench.kernel_runner(numba_cpu, p, "fwd+bwd", True)),
    }
    if torch is not None:
        plan["torch"] = (threads, bench.torch_runner(torch, p, "fwd+bwd"))
    return {k: 1e3 * v for k, v in bench.interleaved_medians(plan, torch, 15, 5.0).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=positive_int, default=8192, help="LayerNorm rows (default 8192)")
    parser.add_argument("--dim", type=positive_int, default=1024, help="values per row (default 1024)")
    parser.add_argument("--threads", type=thread_count, default=2, help="numba threads (default 2)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.rows, args.dim, args.threads)))
        return
    cmd = [sys.executable, __file__, "--child", f"--rows={args.rows}", f"--dim={args.dim}", f"--threads={args.threads}"]
    env = {k: v for k, v in os.environ.items() if k not in REUSE}
    runs = {}
    for name, extra in (("glibc defaults", {}), ("freed memory reused", REUSE)):
        child = subprocess.run(cmd, env={**env, **extra}, stdout=subprocess.PIPE, text=True)  # (its stderr shows)
        if child.returncode:
            raise SystemExit(f"allocation.py: the run with {name} failed")
        runs[name] = json.loads(child.stdout.strip().splitlines()[-1])
    mib = args.rows * args.dim * 4 / 2**20
    print(f"LayerNorm float32 ({args.rows}, {args.dim}) = {mib:.0f} MiB per array, fwd+bwd, {args.threads} threads")
    print(f"median ms per call (15+ interleaved rounds)\n{'':>22}" + "".join(f"{i:>12}" for i in IMPLS))
    for name, ms in runs.items():
        print(f"{name:>22}" + "".join(f"{ms[i]:>12.2f}" if i in ms else f"{'-':>12}" for i in IMPLS))
    if "torch" in runs["glibc defaults"]:
        for name, ms in runs.items():
            print(f"torch / numba (both allocating), {name}: {ms['torch'] / ms['numba']:.2f}x")


if __name__ == "__main__":
    main()
