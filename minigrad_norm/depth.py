"""The depth experiment: how gradients flow through depth at initialisation, per norm placement.

For each depth L and mode, build a fresh ``TransformerLM`` (seeded, so every
mode starts from the same random draws), push one batch of the sequence task
through it, backprop the cross-entropy, and record for every layer l = 1..L:

* ``param``:    ||dL/dtheta_l||, the 2-norm of the gradient of all of block l's parameters together;
* ``ffn_fc2``:  ||dL/dW2_l||_F, the second FFN weight (Xiong et al.'s W^{2,l});
* ``residual``: ||dL/dx_l||, the gradient of the residual stream at block l's input (via ``retain_grad``).

What to expect (Xiong et al. 2020, "On Layer Normalization in the Transformer
Architecture", Theorem 1 and Fig. 3): for Post-Norm, ||dL/dW2_L|| at the last
layer is O(d sqrt(ln d)) whatever L, and going down the stack each norm
divides the backward signal by the scale of its input sum, so that gradients
could shrink from the top layers to the bottom ones (measured here, they do
not at initialisation itself: see below). For
Pre-Norm the residual path is an identity, the per-layer gradients stay of
one order across layers, and the last layer's is O(d sqrt(ln d / L)),
shrinking like 1/sqrt(L). DeepNorm sits in between.

With ``train_steps > 0`` the models first take that many AdamW steps (constant
``lr``, no warmup, fresh batches) and the norms are measured after them: the
regime in which Post-Norm's vanishing gradient at the bottom layers appears
(see docs/transformer.md for the numbers and why it is absent at
initialisation itself).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import minigrad_norm.functional as F
from minigrad_norm.data import SequenceTask
from minigrad_norm.nn.transformer import MODES, TransformerLM
from minigrad_norm.optim import AdamW, global_norm
from minigrad_norm.tensor import Tensor


@dataclass
class DepthConfig:
    layers: tuple[int, ...] = (6, 12, 24)
    modes: tuple[str, ...] = MODES
    norm: str = "layernorm"
    d_model: int = 64
    heads: int = 4
    d_ff: int = 256
    batch_size: int = 16
    length: int = 8
    init: str = "xavier"
    train_steps: int = 0
    lr: float = 1e-3
    seed: int = 0


@dataclass
class DepthRun:
    mode: str
    layers: int
    loss: float
    param: list[float] = field(default_factory=list)
    ffn_fc2: list[float] = field(default_factory=list)
    residual: list[float] = field(default_factory=list)

    @property
    def bottom_to_top(self) -> float:
        """||dL/dtheta_1|| / ||dL/dtheta_L||: 1 when gradients are even across layers, << 1 when they vanish."""
        return self.param[0] / self.param[-1]

    @property
    def per_layer_factor(self) -> float:
        """The geometric mean ratio between consecutive layers' gradient norms, going down the stack."""
        return self.bottom_to_top ** (1.0 / max(1, self.layers - 1))


def measure(cfg: DepthConfig, mode: str, n_layers: int) -> DepthRun:
    """Gradient norms per layer of one model on one batch (float64 throughout), at init or after training steps."""
    task = SequenceTask("reverse", 10, cfg.length)
    model = TransformerLM(
        task.vocab_size,
        cfg.d_model,
        cfg.heads,
        cfg.d_ff,
        n_layers,
        task.seq_len,
        mode,
        cfg.norm,
        dtype=np.float64,
        init=cfg.init,
        rng=np.random.default_rng(cfg.seed),
    )
    if cfg.train_steps:
        opt = AdamW(model.parameters(), lr=cfg.lr)
        data = np.random.default_rng([cfg.seed, 2])
        for _ in range(cfg.train_steps):
            inputs, targets = task.sample(data, cfg.batch_size)
            opt.zero_grad()
            F.cross_entropy(model(inputs).transpose(1, 2), targets).backward()
            opt.step()
        opt.zero_grad()
    inputs, targets = task.sample(np.random.default_rng([cfg.seed, 1]), cfg.batch_size)
    hidden: list[Tensor] = []
    logits = model(inputs, hidden=hidden)
    for h in hidden:
        h.retain_grad()
    loss = F.cross_entropy(logits.transpose(1, 2), targets)
    loss.backward()
    run = DepthRun(mode, n_layers, loss.item())
    for block, h in zip(model.blocks, hidden, strict=True):
        run.param.append(global_norm(p.grad for p in block.parameters()))
        run.ffn_fc2.append(global_norm([block.ffn.fc2.weight.grad]))
        run.residual.append(global_norm([h.grad]))
    return run


def run_experiment(cfg: DepthConfig, progress: bool = False) -> list[DepthRun]:
    """Every (depth, mode) run of ``cfg``, depth by depth; with ``progress``, a progress bar over the runs (the
    default command's 9 runs take about 14 s here, and print nothing until the table)."""
    from tqdm import tqdm

    runs = [(n, mode) for n in cfg.layers for mode in cfg.modes]
    return [measure(cfg, mode, n) for n, mode in tqdm(runs, desc="depth", unit="run", disable=not progress)]


def format_table(runs: list[DepthRun], cfg: DepthConfig) -> str:
    """Per-layer norms side by side for each depth, then a summary comparing depths."""
    when = f"after {cfg.train_steps} AdamW steps (lr {cfg.lr:g}, no warmup)" if cfg.train_steps else "at initialisation"
    lines = [
        f"gradient norms {when}: {cfg.norm}, d_model {cfg.d_model}, {cfg.heads} heads, d_ff {cfg.d_ff}, "
        f"batch {cfg.batch_size} x seq {2 * cfg.length}, {cfg.init} init, seed {cfg.seed}",
        "  param = ||dL/dtheta|| of the block's parameters; resid = ||dL/dx|| at the block's input",
    ]
    for n in cfg.layers:
        group = [r for r in runs if r.layers == n]
        lines.append("")
        lines.append(f"L = {n}")
        head = f"{'layer':>5} " + " ".join(f"{r.mode + ' param':>15} {r.mode + ' resid':>15}" for r in group)
        lines.append(head)
        for i in range(n):
            lines.append(f"{i + 1:>5} " + " ".join(f"{r.param[i]:>15.3e} {r.residual[i]:>15.3e}" for r in group))
    lines.append("")
    lines.append("summary (Xiong et al. 2020, Theorem 1: last-layer ||dL/dW2|| is O(d sqrt(ln d)) for Post-LN,")
    lines.append("         O(d sqrt(ln d / L)) for Pre-LN, so sqrt(L) * ||dL/dW2_L|| is flat in L for Pre-LN)")
    lines.append(
        f"{'mode':<9} {'L':>3} {'loss':>7} {'||dW2_L||':>11} {'sqrt(L)*||dW2_L||':>18} "
        f"{'param_1/param_L':>16} {'per-layer factor':>17} {'resid_1/resid_L':>16}"
    )
    for r in sorted(runs, key=lambda r: (cfg.modes.index(r.mode), r.layers)):
        lines.append(
            f"{r.mode:<9} {r.layers:>3} {r.loss:>7.3f} {r.ffn_fc2[-1]:>11.3e} "
            f"{math.sqrt(r.layers) * r.ffn_fc2[-1]:>18.3e} "
            f"{r.bottom_to_top:>16.3e} {r.per_layer_factor:>17.3f} {r.residual[0] / r.residual[-1]:>16.3e}"
        )
    return "\n".join(lines)


def to_json(runs: list[DepthRun], cfg: DepthConfig) -> dict[str, Any]:
    return {
        "config": {**cfg.__dict__, "layers": list(cfg.layers), "modes": list(cfg.modes)},
        "runs": [
            {
                "mode": r.mode,
                "layers": r.layers,
                "loss": r.loss,
                "param_grad_norm": r.param,
                "ffn_fc2_grad_norm": r.ffn_fc2,
                "residual_grad_norm": r.residual,
                "bottom_to_top": r.bottom_to_top,
                "per_layer_factor": r.per_layer_factor,
            }
            for r in runs
        ],
    }


def plot(runs: list[DepthRun], cfg: DepthConfig, path: str) -> None:
    """One column per depth: parameter gradient norms (top) and residual-stream gradient norms (bottom) by layer."""
    from minigrad_norm.train import import_pyplot

    plt = import_pyplot("depth --plot")
    fig, axes = plt.subplots(2, len(cfg.layers), figsize=(4 * len(cfg.layers), 6.5), squeeze=False, sharey="row")
    for col, n in enumerate(cfg.layers):
        for r in (r for r in runs if r.layers == n):
            layers = np.arange(1, n + 1)
            axes[0, col].plot(layers, r.param, marker="o", ms=3, label=r.mode)
            axes[1, col].plot(layers, r.residual, marker="o", ms=3, label=r.mode)
        axes[0, col].set_title(f"L = {n}")
        axes[1, col].set_xlabel("layer (1 = bottom)")
    axes[0, 0].set_ylabel("||dL/d params of layer||")
    axes[1, 0].set_ylabel("||dL/d residual at layer input||")
    for ax in axes.flat:
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].legend()
    when = f"after {cfg.train_steps} AdamW steps" if cfg.train_steps else "at initialisation"
    fig.suptitle(f"Gradient norms {when} ({cfg.norm}, {cfg.init} init)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
