"""The ``minigrad-norm`` command line: ``check`` (and, as they land, ``bench``, ``train``, ``depth``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from minigrad_norm import __version__


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2e}"


def cmd_check(args: argparse.Namespace) -> int:
    from minigrad_norm.check import CASES, run_case

    cases = [c for c in CASES if not args.only or any(s in c.name for s in args.only)]
    if not cases:
        print(f"check: no op matches {args.only}", file=sys.stderr)
        return 2
    header = f"{'op':<44} {'shapes':<22} {'fd abs err':>10} {'fd rel err':>10} {'closed-form':>11}  result"
    print(header)
    print("-" * len(header))
    results = []
    for case in cases:
        r = run_case(case, seed=args.seed)
        results.append(r)
        print(
            f"{r.name:<44} {r.shapes:<22} {_fmt(r.fd_abs_err):>10} {_fmt(r.fd_rel_err):>10} "
            f"{_fmt(r.closed_form_err):>11}  {'pass' if r.passed else 'FAIL'}",
            flush=True,
        )
        if not r.passed:
            print(f"    {r.message}")
    failed = sum(not r.passed for r in results)
    print(f"\n{len(results) - failed} passed, {failed} failed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.__dict__ for r in results], f, indent=2)
    return 0 if failed == 0 else 1


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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)
