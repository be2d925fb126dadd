"""One training step of a Transformer block (and of a small stack) on the engine, next to PyTorch eager.

A step is: forward of (batch, seq, d_model) input through the block(s),
backward from a fixed random upstream gradient, AdamW update, zero_grad. Both
sides use float32, 2 threads (numba and PyTorch; NumPy's BLAS, below),
the same configuration and Pre-Norm with LayerNorm and GELU (PyTorch also on
one thread, for reference). NumPy's
OpenBLAS runs single-threaded unless OPENBLAS_NUM_THREADS says otherwise:
these matmuls are small, and with two OpenBLAS threads on two shared cores
one busy core makes the threads wait on each other (measured here: 18 ms a
step at the larger configuration with one BLAS thread, 400-600 ms with two
while another process ran). Steps alternate
between the two sides so that both see the same machine noise, each timed
step right after an untimed one of the same side (so that neither is timed
waking its threads after the other's); the medians and their ratio are
reported.

Then one more set of steps of the engine runs with every Function's forward
and backward wrapped in a timer, to show where the step's time goes:

    norm         the LayerNorm / RMSNorm nodes (numba kernels)
    matmul       Linear and MatMul nodes (BLAS)
    attention    the fused attention node: QK^T, mask, softmax, PV and their backward
    activation   GELU / ReLU
    elementwise  residual adds and other primitives
    optimizer    AdamW's update
    python       everything else: Function.apply, Tensor and Context objects,
                 the tape walk, module calls (the graph overhead)

    python benchmarks/train_step.py [--repeats N] [--json PATH]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy loads OpenBLAS; see the docstring

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402

from minigrad_norm import bench  # noqa: E402
from minigrad_norm.nn import ModuleList, TransformerBlock  # noqa: E402
from minigrad_norm.optim import AdamW  # noqa: E402
from minigrad_norm.tensor import Function, Tensor  # noqa: E402

THREADS = 2


@dataclass(frozen=True)
class Config:
    d_model: int
    heads: int
    d_ff: int
    seq: int
    batch: int
    layers: int

    def label(self) -> str:
        return f"d{self.d_model} h{self.heads} ff{self.d_ff} T{self.seq} B{self.batch} L{self.layers}"


CONFIGS = [
    Config(128, 4, 512, 64, 8, 1),
    Config(64, 4, 256, 32, 4, 1),
    Config(128, 4, 512, 64, 8, 4),
    Config(64, 4, 256, 32, 4, 4),
]


def ours_step(cfg: Config, seed: int = 0) -> Callable[[], None]:
    rng = np.random.default_rng(seed)
    blocks = ModuleList(
        [TransformerBlock(cfg.d_model, cfg.heads, cfg.d_ff, activation="gelu", rng=rng) for _ in range(cfg.layers)]
    )
    x = Tensor(rng.standard_normal((cfg.batch, cfg.seq, cfg.d_model)).astype(np.float32))
    g = rng.standard_normal((cfg.batch, cfg.seq, cfg.d_model)).astype(np.float32)
    opt = AdamW(blocks.parameters(), lr=1e-4)

    def step() -> None:
        h = x
        for b in blocks:
            h = b(h)
        h.backward(g)
        opt.step()
        opt.zero_grad()

    step.optimizer = opt  # type: ignore[attr-defined]
    return step


def torch_step(torch: Any, cfg: Config, seed: int = 0) -> Callable[[], None]:
    torch.manual_seed(seed)
    layers = torch.nn.Sequential(
        *[
            torch.nn.TransformerEncoderLayer(
                cfg.d_model, cfg.heads, cfg.d_ff, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
            )
            for _ in range(cfg.layers)
        ]
    )
    mask = torch.triu(torch.ones(cfg.seq, cfg.seq, dtype=torch.bool), diagonal=1)
    x = torch.randn(cfg.batch, cfg.seq, cfg.d_model)
    g = torch.randn(cfg.batch, cfg.seq, cfg.d_model)
    opt = torch.optim.AdamW(layers.parameters(), lr=1e-4)

    def step() -> None:
        h = x
        for layer in layers:
            h = layer(h, src_mask=mask)
        h.backward(g)
        opt.step()
        opt.zero_grad()

    return step


def time_interleaved(fns: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Median seconds per step of each fn over ``repeats`` rounds, each timed step right after an untimed
    one of its own (``bench.interleaved_medians``, on the thread counts already set)."""
    return bench.interleaved_medians({k: (THREADS, fn) for k, fn in fns.items()}, None, repeats, 0.0)


CATEGORIES = ("norm", "matmul", "attention", "activation", "elementwise", "optimizer", "python")


def category(fn_name: str) -> str:
    if "Norm" in fn_name or fn_name == "Normalize":
        return "norm"
    if fn_name in ("Linear", "MatMul"):
        return "matmul"
    if fn_name == "Attention":
        return "attention"
    if fn_name in ("GELU", "ReLU"):
        return "activation"
    return "elementwise"


def _function_classes() -> Iterator[type]:
    stack = [Function]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        yield cls


def breakdown(step: Callable[[], None], repeats: int) -> dict[str, float]:
    """Seconds per step spent in each category (see the module docstring), from instrumented runs."""
    spent: dict[str, float] = defaultdict(float)
    saved = []
    for cls in _function_classes():
        for name in ("forward", "backward"):
            if name not in cls.__dict__:
                continue
            original = cls.__dict__[name].__func__
            saved.append((cls, name, cls.__dict__[name]))

            def timed(*args: Any, _f: Callable = original, _c: str = category(cls.__name__), **kwargs: Any) -> Any:
                t = time.perf_counter()
                out = _f(*args, **kwargs)
                spent[_c] += time.perf_counter() - t
                return out

            setattr(cls, name, staticmethod(timed))
    opt = step.optimizer  # type: ignore[attr-defined]
    original_step = opt.step

    def timed_step() -> None:
        t = time.perf_counter()
        original_step()
        spent["optimizer"] += time.perf_counter() - t

    opt.step = timed_step
    try:
        step()
        spent.clear()
        t = time.perf_counter()
        for _ in range(repeats):
            step()
        total = (time.perf_counter() - t) / repeats
    finally:
        for cls, name, value in saved:
            setattr(cls, name, value)
        del opt.step
    out = {k: spent[k] / repeats for k in CATEGORIES if k != "python"}
    out["python"] = total - sum(out.values())
    out["total"] = total
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30, help="timed steps per side and config (default 30)")
    parser.add_argument("--json", metavar="PATH", type=bench.output_path, help="also write the results as JSON")
    args = parser.parse_args()
    try:  # PyTorch before numba starts its thread pool: the other order made PyTorch's 2-thread steps 3x slower
        import torch

        torch.set_num_threads(THREADS)
    except ImportError:
        torch = None
        print("PyTorch is not installed: timing the engine alone")
    numba.set_num_threads(THREADS)
    results = []
    head = f"{'config':<30} {'ours ms':>9}{'torch ms':>9}{'torch 1t':>9} {'ours/torch':>10}   our step's time, %"
    print(f"threads: numba {THREADS}, torch {THREADS}, OpenBLAS {os.environ['OPENBLAS_NUM_THREADS']}")
    print(head)
    print("-" * (len(head) + 40))
    for cfg in CONFIGS:
        ours = ours_step(cfg)
        med = {"ours": 0.0}
        if torch is None:
            med = time_interleaved({"ours": ours}, args.repeats)
        else:  # one thread count per round: resizing PyTorch's thread pool between steps costs more than a step
            torch.set_num_threads(1)
            med["torch 1t"] = time_interleaved({"ours": ours, "torch 1t": torch_step(torch, cfg)}, args.repeats)[
                "torch 1t"
            ]
            torch.set_num_threads(THREADS)
            med.update(time_interleaved({"ours": ours, "torch": torch_step(torch, cfg)}, args.repeats))
        parts = breakdown(ours, max(5, args.repeats // 3))
        ratio = med["ours"] / med["torch"] if "torch" in med else float("nan")
        split = "  ".join(f"{k} {100 * parts[k] / parts['total']:.0f}" for k in CATEGORIES)
        torch_ms = "".join(f"{1e3 * med[k]:>9.2f}" if k in med else f"{'-':>9}" for k in ("torch", "torch 1t"))
        print(f"{cfg.label():<30} {1e3 * med['ours']:>9.2f}{torch_ms} {ratio:>10.2f}   {split}", flush=True)
        results.append({"config": cfg.__dict__, "median_s": med, "ratio": ratio, "breakdown_s": parts})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
