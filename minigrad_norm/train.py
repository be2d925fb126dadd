"""Train a ``TransformerLM`` on a generated sequence task, end to end on the engine.

``train(config)`` runs AdamW with linear warmup and cosine decay, global
gradient-norm clipping and a tqdm progress bar showing the running loss,
then decodes held-out prompts greedily (the model sees only its own
predictions) and reports token and whole-sequence accuracy.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

import minigrad_norm.functional as F
from minigrad_norm.data import SequenceTask
from minigrad_norm.nn.transformer import TransformerLM
from minigrad_norm.optim import AdamW, WarmupSchedule, clip_grad_norm_
from minigrad_norm.tensor import Tensor, no_grad


@dataclass
class TrainConfig:
    task: str = "sort"
    n_symbols: int = 10
    length: int = 8
    mode: str = "pre"
    norm: str = "layernorm"
    activation: str = "relu"
    layers: int = 2
    d_model: int = 64
    heads: int = 4
    d_ff: int = 256
    batch_size: int = 32
    steps: int = 600
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.01
    decay_1d: bool = True  # False: the 1-D parameters (biases, norm gains) take no weight decay, as in GPT-2
    clip: float = 1.0
    seed: int = 0
    eval_size: int = 500
    dtype: str = "float32"


@dataclass
class TrainResult:
    config: TrainConfig
    losses: list[float]
    token_accuracy: float
    sequence_accuracy: float
    chance_accuracy: float
    seconds: float
    first_step_seconds: float
    steps_per_second: float  # over the steps after the first (over the one step of a one-step run)
    curve: dict[int, float] = field(default_factory=dict)

    def summary(self) -> str:
        c = self.config
        lines = [
            f"task {c.task} (length {c.length}, {c.n_symbols} symbols), mode {c.mode}, norm {c.norm}, "
            f"{c.layers} layers, d_model {c.d_model}, {c.steps} steps, seed {c.seed}",
            "loss curve (mean of the surrounding 5% of steps): "
            + ", ".join(f"step {s}: {v:.3f}" for s, v in self.curve.items()),
            f"held-out accuracy (greedy decoding, {c.eval_size} sequences never seen in training): "
            f"tokens {100 * self.token_accuracy:.1f}%, whole sequences {100 * self.sequence_accuracy:.1f}% "
            f"(chance per token {100 * self.chance_accuracy:.1f}%)",
            f"time {self.seconds:.1f} s: first step {self.first_step_seconds:.2f} s (numba kernels compiled or loaded "
            f"on first use)" + (f", then {self.steps_per_second:.1f} steps/s" if c.steps > 1 else ", the only one"),
        ]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["curve"] = {str(k): v for k, v in self.curve.items()}
        return out


def loss_curve(losses: list[float], points: int = 6) -> dict[int, float]:
    """The loss at ``points`` evenly spaced steps, each the mean over a window of 5% of the run."""
    n = len(losses)
    half = max(1, n // 40)
    steps = sorted({round(i * (n - 1) / (points - 1)) for i in range(points)}) if n > 1 else [0] * (n > 0)
    return {s + 1: float(np.mean(losses[max(0, s - half) : s + half + 1])) for s in steps}


def decay_groups(params: list[Tensor], decay_1d: bool) -> list[dict[str, Any]]:
    """One parameter group, or, without ``decay_1d``, two: the matrices (weights, embeddings) with the weight
    decay, and the 1-D parameters (biases, norm gains and biases) with none, as GPT-2 and nanoGPT train: a
    decay pulls a norm's gain towards 0, and with it the scale of everything the norm feeds."""
    if decay_1d:
        return [{"params": params}]
    matrices, vectors = [p for p in params if p.ndim >= 2], [p for p in params if p.ndim < 2]
    return [{"params": matrices}, {"params": vectors, "weight_decay": 0.0}]


def build_model(cfg: TrainConfig, task: SequenceTask) -> TransformerLM:
    return TransformerLM(
        task.vocab_size,
        cfg.d_model,
        cfg.heads,
        cfg.d_ff,
        cfg.layers,
        task.seq_len,
        cfg.mode,
        cfg.norm,
        activation=cfg.activation,
        dtype=np.dtype(cfg.dtype),
        rng=np.random.default_rng(cfg.seed),
    )


# On long sequences the attention arrays (heads x T x T values a sequence) outweigh the rest. A training step
# holds about one a layer for each sequence of its batch (the probabilities each layer saves for its backward)
# and six besides (the step's temporaries); greedy decoding, without a graph, about three for each held-out
# sequence. Measured: tracemalloc's peaks at lengths 100 and 150 (T = 200, 300), batches of 4-32, 1-3 layers;
# the estimate counts eight besides, to err on the high side.
ATTENTION_ARRAYS_PER_LAYER, ATTENTION_ARRAYS_BESIDES, ATTENTION_ARRAYS_DECODING = 1, 8, 3


def memory_estimate(cfg: TrainConfig) -> int:
    """About the peak bytes of ``train(cfg)`` where the sequences are long enough for the attention arrays to
    dominate (shorter runs take little memory)."""
    t = SequenceTask(cfg.task, cfg.n_symbols, cfg.length).seq_len
    per_sequence = cfg.heads * t * t * np.dtype(cfg.dtype).itemsize
    training = cfg.batch_size * (ATTENTION_ARRAYS_PER_LAYER * cfg.layers + ATTENTION_ARRAYS_BESIDES)
    return per_sequence * max(training, cfg.eval_size * ATTENTION_ARRAYS_DECODING)


def greedy_decode(model: TransformerLM, task: SequenceTask, prompts: np.ndarray) -> np.ndarray:
    """Generate the answer to each prompt one token at a time, feeding back the model's own predictions."""
    seq = np.concatenate([prompts, np.full((len(prompts), 1), task.sep)], axis=1)
    with no_grad():
        for _ in range(task.length):
            logits = model(seq).data[:, -1, :]
            seq = np.concatenate([seq, logits.argmax(axis=-1)[:, None]], axis=1)
    return seq[:, task.length + 1 :]


def evaluate(model: TransformerLM, task: SequenceTask, prompts: np.ndarray) -> tuple[float, float]:
    """(token accuracy, whole-sequence accuracy) of greedy decoding on ``prompts``."""
    correct = greedy_decode(model, task, prompts) == task.answer(prompts)
    return float(correct.mean()), float(correct.all(axis=1).mean())


def train(cfg: TrainConfig, progress: bool = True) -> TrainResult:
    """Train as ``cfg`` says; a warmup as long as the run is cut to ``steps - 1`` (the result's config says so)."""
    if cfg.steps < 1:
        raise ValueError(f"train: steps must be positive, got {cfg.steps}")
    # A short run (the default warmup of 50 with --steps 20, say) still warms up and decays:
    # dropping the schedule instead would start at the full peak lr.
    cfg = replace(cfg, warmup=min(cfg.warmup, cfg.steps - 1))
    task = SequenceTask(cfg.task, cfg.n_symbols, cfg.length)
    model = build_model(cfg, task)
    params = model.parameters()
    opt = AdamW(decay_groups(params, cfg.decay_1d), lr=cfg.lr, weight_decay=cfg.weight_decay)
    schedule = WarmupSchedule(opt, cfg.warmup, cfg.steps, decay="cosine")
    data_rng = np.random.default_rng([cfg.seed, 1])
    losses: list[float] = []
    bar = _progress(cfg.steps, progress, "train (the first step compiles or loads the numba kernels)")
    # steps/s leaves the first step out: it pays for the kernels' first use in the process (10 s compiling on
    # an empty numba cache, about 0.4 s loading from a warm one), so that of several modes trained one after
    # another the first had read half as fast as the same mode trained again (50 against 108 steps/s, 30 steps)
    start = first_done = time.perf_counter()
    for step in range(cfg.steps):
        inputs, targets = task.sample(data_rng, cfg.batch_size)
        logits = model(inputs)
        loss = F.cross_entropy(logits.transpose(1, 2), targets)
        opt.zero_grad()
        loss.backward()
        if cfg.clip > 0:
            clip_grad_norm_(params, cfg.clip)
        schedule.step()
        opt.step()
        losses.append(loss.item())
        if step == 0:
            first_done = time.perf_counter()
            if bar is not None:
                bar.set_description_str("train", refresh=False)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}", refresh=False)
    end = time.perf_counter()
    seconds = end - start
    steps_per_second = (cfg.steps - 1) / (end - first_done) if cfg.steps > 1 else 1.0 / seconds
    if bar is not None:
        bar.close()
    model.eval()
    token_acc, seq_acc = evaluate(model, task, task.prompts(np.random.default_rng([cfg.seed, 2]), cfg.eval_size, True))
    return TrainResult(
        cfg,
        losses,
        token_acc,
        seq_acc,
        1.0 / cfg.n_symbols,
        seconds=seconds,
        first_step_seconds=first_done - start,
        steps_per_second=steps_per_second,
        curve=loss_curve(losses),
    )


def _progress(total: int, enabled: bool, desc: str) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True)


def plot_losses(results: list[TrainResult], path: str) -> None:
    """Save the loss curves (raw and smoothed) of one or more runs to ``path``."""
    plt = import_pyplot("train --plot")
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        raw = np.asarray(r.losses)
        width = max(1, len(raw) // 50)
        smooth = np.convolve(raw, np.ones(width) / width, mode="valid")
        label = f"{r.config.mode} / {r.config.norm}"
        (line,) = ax.plot(np.arange(1, len(raw) + 1), raw, alpha=0.25)
        ax.plot(np.arange(width, len(raw) + 1), smooth, color=line.get_color(), label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (cross-entropy)")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title(f"{results[0].config.task}: training loss")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def import_pyplot(what: str) -> Any:
    """matplotlib.pyplot with a non-interactive backend, or a clear error if the ``plot`` extra is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError(f"{what} needs matplotlib: pip install 'minigrad_norm[plot]'") from e
    return plt
