"""Cold compile times of the numba kernels at an earlier revision against the working tree, alternated.

    python benchmarks/compile_time.py REV [--what every|every_in_one_process|layer_norm] [--rounds 3]

Each timing is a fresh process on an empty numba cache (``NUMBA_CACHE_DIR`` a new temporary directory) that
imports minigrad_norm from REV (extracted with ``git archive``) or from the working tree, and compiles every
kernel for both dtypes (``--what every``: ``numba_cpu.compile_every_kernel``, in one process per CPU;
``every_in_one_process``: all in that one process, the whole compile's CPU time, which a change to the kernels
moves more plainly than the wall time of processes sharing the machine) or what a user's first float32
LayerNorm forward+backward compiles (``--what layer_norm``: the benchmark's start-up script). The two
alternate, the order flipped every round, as in ``compare_kernels.py``: on the 2-core AMD VM one version's
compile of every kernel read 81-88 s within an hour, more than many a change is worth.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from minigrad_norm.bench import FIRST_LAYER_NORM_SCRIPT, git_output, positive_int

ROOT = Path(__file__).resolve().parent.parent
IMPORT = (
    "import inspect\n"
    "try:\n"
    "    from minigrad_norm.kernels.numba_cpu import compile_every_kernel\n"
    "except ImportError:  # a revision from before it moved out of the benchmark module\n"
    "    from minigrad_norm.bench import compile_every_kernel\n"
)
SCRIPTS = {
    "every": IMPORT + "compile_every_kernel()\n",
    # (revisions from before the compile in several processes compile in this one anyway)
    "every_in_one_process": IMPORT
    + "one = {'processes': 1} if 'processes' in inspect.signature(compile_every_kernel).parameters else {}\n"
    + "compile_every_kernel(**one)\n",
    "layer_norm": FIRST_LAYER_NORM_SCRIPT,
}


def extract(rev: str, into: Path) -> Path:
    """The package ``minigrad_norm`` as it was at git revision ``rev``, under ``into``."""
    archive = git_output(["archive", rev, "minigrad_norm"], ROOT)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def cold_seconds(root: Path, script: str) -> float:
    """Wall time of ``script`` in a fresh process that imports minigrad_norm from ``root``, on an empty cache."""
    check = f"import minigrad_norm\nassert minigrad_norm.__file__.startswith({str(root)!r}), minigrad_norm.__file__\n"
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=str(root))
        t = time.perf_counter()
        # (run from root: ``python -c`` puts the working directory first on the path)
        subprocess.run([sys.executable, "-c", check + script], check=True, env=env, cwd=root)
        return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev", help="the git revision to compare with (e.g. HEAD~1, a commit)")
    parser.add_argument("--what", choices=sorted(SCRIPTS), default="every", help="what to compile (default every)")
    parser.add_argument("--rounds", type=positive_int, default=3, help="cold compiles per side (default 3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        roots = (extract(args.rev, Path(tmp)), ROOT)
        times: dict[int, list[float]] = {0: [], 1: []}
        for r in range(args.rounds):
            for i in (0, 1) if r % 2 else (1, 0):
                times[i].append(cold_seconds(roots[i], SCRIPTS[args.what]))
                print(f"round {r + 1}: {('old', 'new')[i]} {times[i][-1]:.1f} s", flush=True)
    old, new = statistics.median(times[0]), statistics.median(times[1])
    print(
        f"cold compile ({args.what}), median s: {args.rev} (old) {old:.1f}, working tree (new) {new:.1f}, "
        f"new/old {new / old:.2f}"
    )


if __name__ == "__main__":
    main()
