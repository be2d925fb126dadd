"""The ``minigrad-norm`` command line: ``check``, ``bench``, ``compile``, ``train``, ``depth``."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from minigrad_norm import __version__

if TYPE_CHECKING:
    from minigrad_norm.train import TrainConfig

# A check row that takes longer than this is, on a fresh install, the first use of a norm compiling its numba kernels
CHECK_SLOW_ROW_SECONDS = 3.0


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2e}"


def _say_once(said: threading.Event, message: str) -> None:
    if not said.is_set():
        said.set()
        print(message, file=sys.stderr, flush=True)


def cmd_check(args: argparse.Namespace) -> int:
    from minigrad_norm.check import all_cases, run_case

    cases = [c for c in all_cases() if not args.only or any(s in c.name for s in args.only)]
    error = (
        (f"no op matches {args.only}" if not cases else None)
        or _limits_error([("--seed", args.seed, args.seed >= 0, ">= 0")])
        or _output_error(args, ["--json"])
    )
    if error:
        print(f"check: {error}", file=sys.stderr)
        return 2
    header = f"{'op':<44} {'shapes':<22} {'fd abs err':>10} {'fd rel err':>10} {'closed-form':>11}  result"
    print(header)
    print("-" * len(header))
    results = []
    # On an empty numba cache the norms' rows wait 30 s in all on 2 cores for their kernels to compile, without a
    # word: a first-time user would take the stall for a hang. Said once, on stderr, while the row still runs.
    said = threading.Event()
    for case in cases:
        note = (
            f"check: {case.name} is taking a while: a norm's first use compiles its numba kernels (about 30 s for "
            "this whole check on 2 cores, once: later runs load them from numba's cache)"
        )
        timer = threading.Timer(CHECK_SLOW_ROW_SECONDS, _say_once, (said, note))
        timer.start()
        try:
            r = run_case(case, seed=args.seed)
        finally:
            timer.cancel()
        results.append(r)
        print(
            f"{r.name:<44} {r.shapes:<22} {_fmt(r.fd_abs_err):>10} {_fmt(r.fd_rel_err):>10} "
            f"{_fmt(r.closed_form_err):>11}  {'pass' if r.passed else 'FAIL'}",
            flush=True,
        )
        if r.message:
            print(f"    {r.message}" if not r.passed else f"    note: {r.message}")
    failed = sum(not r.passed for r in results)
    print(f"\n{len(results) - failed} passed, {failed} failed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([_finite_or_none(r.__dict__) for r in results], f, indent=2, allow_nan=False)
    return 0 if failed == 0 else 1


def _finite_or_none(row: dict[str, object]) -> dict[str, object]:
    """``row`` with its non-finite numbers (a failed check's infinite errors) as None: JSON has no Infinity."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}


def _limits_error(limits: Sequence[tuple[str, float, bool, str]]) -> str | None:
    """The first of the ``(option, value, ok, what it must be)`` that is not ok, as an error message."""
    # Each ``ok`` states what is allowed (lr > 0), not what is refused (lr <= 0): nan fails
    # every comparison, so it is refused as well.
    return next((f"{option} must be {need}, got {value}" for option, value, ok, need in limits if not ok), None)


def _output_error(args: argparse.Namespace, options: Sequence[str]) -> str | None:
    """Why a file named by one of the output ``options`` could not be written (``bench.output_problem``), or
    two of them name one file, found before the run they would hold."""
    from minigrad_norm.bench import output_problem

    given = {option: getattr(args, option[2:].replace("-", "_")) for option in options}
    given = {option: path for option, path in given.items() if path is not None}
    seen: dict[str, str] = {}
    for option, path in given.items():
        if not path:
            return f"{option}: the path is empty"
        if (first := seen.setdefault(os.path.realpath(path), option)) != option:
            return f"{option} {path}: {first} writes the same file"
        if problem := output_problem(path):
            return f"{option} {path}: {problem}"
    return None


def _numba_error() -> str | None:
    """Why the numba kernels cannot run here (numba missing, its JIT off), if they cannot."""
    from minigrad_norm import backend

    return "the numba kernels are unavailable" if backend._load_numba() is None else None


def _environment_error() -> str | None:
    """What is wrong with the package's environment variables, found before any command starts its work."""
    from minigrad_norm import backend

    try:
        backend.get_backend()
    except ValueError as e:
        return str(e)
    return None


def _plot_error(args: argparse.Namespace) -> str | None:
    """The missing-matplotlib error of ``--plot``, found before the run rather than after it."""
    if not args.plot:
        return None
    from minigrad_norm.train import import_pyplot

    try:
        import_pyplot(f"{args.command} --plot")
    except RuntimeError as e:
        return str(e)
    return None


def _model_args_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the model and run options of ``train``/``depth``, checked before any work starts."""
    sizes = {"--d-model": args.d_model, "--heads": args.heads, "--d-ff": args.d_ff, "--batch-size": args.batch_size}
    sizes.update({"--layers": min(args.layers)} if isinstance(args.layers, list) else {"--layers": args.layers})
    bad = [f"{name} {value}" for name, value in sizes.items() if value < 1]
    if bad:
        return f"these must be positive: {', '.join(bad)}"
    if args.d_model % args.heads:
        return f"--d-model {args.d_model} must be divisible by --heads {args.heads}"
    limits = [
        ("--lr", args.lr, args.lr > 0 and math.isfinite(args.lr), "a positive number"),
        ("--seed", args.seed, args.seed >= 0, ">= 0"),
    ]
    return _limits_error(limits) or _output_error(args, ["--json", "--plot"]) or _plot_error(args)


def _train_memory_error(cfg: TrainConfig) -> str | None:
    """Why ``train(cfg)`` would not fit in this machine's available memory (with 1 GiB for the rest of the
    process), found before the run, which would otherwise fail, or be killed, part-way through."""
    from minigrad_norm.kernels.machine import available_memory_bytes
    from minigrad_norm.train import memory_estimate

    available, need = available_memory_bytes(), memory_estimate(cfg) + 2**30
    if available is None or need <= available:
        return None
    return (
        f"--length {cfg.length} with --batch-size {cfg.batch_size}, --layers {cfg.layers} and --heads {cfg.heads} "
        f"needs about {need / 2**30:.1f} GiB (attention arrays of heads x T x T values for T = {2 * cfg.length}, "
        f"in training and in greedy decoding of {cfg.eval_size} held-out sequences), but "
        f"{available / 2**30:.1f} GiB of memory is available"
    )


def cmd_train(args: argparse.Namespace) -> int:
    from minigrad_norm.train import TrainConfig, plot_losses, train

    limits = [
        ("--steps", args.steps, args.steps >= 1, "positive"),
        ("--length", args.length, args.length >= 1, "positive"),
        ("--warmup", args.warmup, args.warmup >= 0, ">= 0"),
        ("--clip", args.clip, args.clip >= 0, ">= 0 (0 = off)"),
        ("--weight-decay", args.weight_decay, args.weight_decay >= 0, ">= 0"),
    ]
    error = _model_args_error(args) or _limits_error(limits)
    fields = TrainConfig.__dataclass_fields__
    configs = [
        TrainConfig(mode=mode, **{k: v for k, v in vars(args).items() if k in fields and k != "mode"})
        for mode in args.mode
    ]
    error = error or _train_memory_error(configs[0])
    if error:
        print(f"train: {error}", file=sys.stderr)
        return 2
    results = []
    for cfg in configs:
        result = train(cfg, progress=not args.no_progress)
        print(result.summary(), flush=True)
        results.append(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.to_json() for r in results], f, indent=2)
    if args.plot:
        plot_losses(results, args.plot)
        print(f"loss curves written to {args.plot}")
    return 0


def cmd_depth(args: argparse.Namespace) -> int:
    from minigrad_norm.depth import DepthConfig, format_table, plot, run_experiment, to_json

    error = _model_args_error(args) or _limits_error(
        [("--train-steps", args.train_steps, args.train_steps >= 0, ">= 0")]
    )
    if error:
        print(f"depth: {error}", file=sys.stderr)
        return 2
    cfg = DepthConfig(
        layers=tuple(args.layers),
        modes=tuple(args.mode),
        norm=args.norm,
        d_model=args.d_model,
        heads=args.heads,
        d_ff=args.d_ff,
        batch_size=args.batch_size,
        init=args.init,
        train_steps=args.train_steps,
        lr=args.lr,
        seed=args.seed,
    )
    runs = run_experiment(cfg, progress=not args.no_progress)
    print(format_table(runs, cfg))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(to_json(runs, cfg), f, indent=2)
    if args.plot:
        plot(runs, cfg, args.plot)
        print(f"plot written to {args.plot}")
    return 0


def _model_args(p: argparse.ArgumentParser, d_model: int, heads: int, d_ff: int, batch_size: int) -> None:
    p.add_argument("--norm", choices=["layernorm", "rmsnorm"], default="layernorm", help="(default layernorm)")
    p.add_argument("--d-model", type=int, default=d_model, help=f"model width (default {d_model})")
    p.add_argument("--heads", type=int, default=heads, help=f"attention heads (default {heads})")
    p.add_argument("--d-ff", type=int, default=d_ff, help=f"feed-forward width (default {d_ff})")
    p.add_argument("--batch-size", type=int, default=batch_size, help=f"sequences per batch (default {batch_size})")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and data (default 0)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--plot", metavar="PNG", help="save a plot (needs matplotlib, the 'plot' extra)")


def cmd_bench(args: argparse.Namespace) -> int:
    from minigrad_norm import bench

    try:
        cases, sweep = bench.selection(args)
        error = _output_error(args, ["--json", "--markdown", "--plot"]) or _plot_error(args) or _numba_error()
    except ValueError as e:  # (what selection refuses)
        error = str(e)
    if error:
        print(f"bench: {error}", file=sys.stderr)
        return 2
    return bench.main(args, cases, sweep)


def cmd_compile(args: argparse.Namespace) -> int:
    import time

    from minigrad_norm import backend

    error = _limits_error([("--processes", args.processes, args.processes is None or args.processes > 0, "positive")])
    if error:
        print(f"compile: {error}", file=sys.stderr)
        return 2
    if error := _numba_error():
        print(f"compile: {error}: the NumPy backend has nothing to compile", file=sys.stderr)
        return 1
    kernels = backend._load_numba()
    if kernels.cache_path() is None:
        print(
            "compile: numba cannot cache the kernels here (no writable directory for its cache): set NUMBA_CACHE_DIR "
            "to one",
            file=sys.stderr,
        )
        return 1
    t = time.perf_counter()
    kernels.compile_every_kernel(args.dtype, progress=not args.no_progress, processes=args.processes)
    seconds = time.perf_counter() - t
    print(f"compiled every kernel for {' and '.join(args.dtype)} in {seconds:.0f} s, cached in {kernels.cache_path()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minigrad-norm", description="Backprop through normalization layers: verify, time, train."
    )
    parser.add_argument("--version", action="version", version=f"minigrad-norm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    check = sub.add_parser("check", help="gradcheck every differentiable op against finite differences")
    check.add_argument("--json", metavar="PATH", help="also write the table as JSON")
    check.add_argument("--seed", type=int, default=0, help="seed for the random inputs (default 0)")
    check.add_argument("--only", nargs="*", metavar="NAME", help="only ops whose name contains one of these")
    check.set_defaults(run=cmd_check)

    bench = sub.add_parser("bench", help="time the norm kernels against STREAM bandwidth, NumPy and PyTorch")
    bench.add_argument(
        "--quick",
        action="store_true",
        help="one shape per norm, float32 unless --dtype, few repeats, no 1t columns (under a minute once compiled)",
    )
    bench.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    bench.add_argument("--markdown", metavar="PATH", help="also write the report as Markdown (benchmarks/RESULTS.md)")
    bench.add_argument(
        "--plot",
        metavar="PATH",
        help="plot time and GB/s against size, from the LayerNorm size sweep (not with --shape, nor with --only "
        "without layer_norm; needs matplotlib)",
    )
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.add_argument("--no-startup", action="store_true", help="skip the fresh-process start-up timings")
    bench.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help="only these norms, of layer_norm rms_norm batch_norm2d instance_norm2d group_norm batch_norm1d",
    )
    bench.add_argument(
        "--shape",
        nargs="+",
        metavar="SHAPE",
        help="time these input shapes instead of the listed ones, in PyTorch's layout, e.g. --only layer_norm "
        "--shape 16384x2048, --only group_norm --shape 8x32x64x64 (without --only: every norm that takes them; "
        "no size sweep, no start-up timings)",
    )
    bench.add_argument(
        "--hot",
        action="store_true",
        help="time the shapes hot, in a loop on the same arrays (default: each call from cold caches, x from DRAM)",
    )
    bench.add_argument("--groups", type=int, metavar="G", help="GroupNorm's groups for --shape (default 8)")
    bench.add_argument(
        "--dtype", nargs="+", choices=["float32", "float64"], help="(default both; with --quick, float32)"
    )
    bench.set_defaults(run=cmd_bench)

    compile_ = sub.add_parser(
        "compile", help="compile every numba kernel now, into numba's cache, so that first use only loads them"
    )
    compile_.add_argument(
        "--dtype", nargs="+", choices=["float32", "float64"], default=["float32", "float64"], help="(default both)"
    )
    compile_.add_argument(
        "--processes", type=int, metavar="N", help="compile in N processes at once (default: one per usable CPU)"
    )
    compile_.add_argument("--no-progress", action="store_true", help="no progress bar")
    compile_.set_defaults(run=cmd_compile)

    train = sub.add_parser("train", help="train a small Transformer LM on a generated sequence task")
    train.add_argument(
        "--mode",
        nargs="+",
        choices=["pre", "post", "deepnorm"],
        default=["pre"],
        help="norm placement; several modes train one after another (default pre)",
    )
    train.add_argument("--layers", type=int, default=2, help="number of blocks (default 2)")
    train.add_argument("--steps", type=int, default=600, help="optimizer steps (default 600)")
    train.add_argument("--task", choices=["copy", "reverse", "sort"], default="sort", help="(default sort)")
    train.add_argument("--length", type=int, default=8, help="digits per sequence (default 8)")
    train.add_argument("--activation", choices=["relu", "gelu"], default="relu", help="the FFN's (default relu)")
    train.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate (default 3e-3)")
    train.add_argument(
        "--warmup",
        type=int,
        default=50,
        help="linear warmup steps before the cosine decay, cut to --steps - 1 in a shorter run (default 50)",
    )
    train.add_argument("--weight-decay", type=float, default=0.01, help="AdamW's decoupled weight decay (default 0.01)")
    train.add_argument(
        "--no-decay-1d",
        dest="decay_1d",
        action="store_false",
        help="no weight decay for the 1-D parameters (biases, norm gains), as GPT-2 trains",
    )
    train.add_argument("--clip", type=float, default=1.0, help="global grad-norm clip, 0 = off (default 1.0)")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    _model_args(train, d_model=64, heads=4, d_ff=256, batch_size=32)
    train.set_defaults(run=cmd_train)

    depth = sub.add_parser("depth", help="gradient norms per layer at initialisation, per norm placement")
    depth.add_argument("--layers", type=int, nargs="+", default=[6, 12, 24], help="depths (default 6 12 24)")
    depth.add_argument(
        "--mode",
        nargs="+",
        choices=["pre", "post", "deepnorm"],
        default=["pre", "post", "deepnorm"],
        help="norm placements to measure (default all three)",
    )
    depth.add_argument(
        "--init",
        choices=["xavier", "torch"],
        default="xavier",
        help="Linear init: Xavier-normal as in Xiong et al. (default) or PyTorch's",
    )
    depth.add_argument(
        "--train-steps", type=int, default=0, help="measure after this many AdamW steps (default 0: at init)"
    )
    depth.add_argument("--lr", type=float, default=1e-3, help="AdamW lr for --train-steps (default 1e-3)")
    depth.add_argument("--no-progress", action="store_true", help="no progress bar")
    _model_args(depth, d_model=64, heads=4, d_ff=256, batch_size=16)
    depth.set_defaults(run=cmd_depth)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv  # (for a report to say which command made it)
    if error := _environment_error():
        print(f"minigrad-norm {args.command}: {error}", file=sys.stderr)
        return 2
    try:
        return args.run(args)
    except KeyboardInterrupt:  # (Ctrl-C: a message, not a traceback; 128 + SIGINT, as a shell reports it)
        print(f"minigrad-norm {args.command}: interrupted", file=sys.stderr)
        return 130
