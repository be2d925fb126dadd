"""Optimizers (SGD, Adam, AdamW), a warmup schedule and global gradient-norm clipping, as in PyTorch.

Each optimizer updates its parameters' ``.data`` in place from their
``.grad`` (parameters whose grad is None are skipped, as PyTorch does), in
the parameter's own dtype, and counts the write (``increment_version``), so a
backward through a graph built before the step raises, as in PyTorch. With g the gradient, p the parameter, lr the
learning rate and t the step count (from 1):

SGD (``torch.optim.SGD``)::

    g = g + weight_decay * p                     L2 penalty folded into the gradient
    b = g                     at t = 1           momentum buffer
    b = momentum * b + (1 - dampening) * g       afterwards
    g = g + momentum * b  if nesterov  else  b   (when momentum != 0)
    p = p - lr * g

Adam (``torch.optim.Adam``; weight decay is the L2 penalty, as above)::

    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g^2
    p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

AdamW (``torch.optim.AdamW``; Loshchilov & Hutter's decoupled weight decay:
the parameter shrinks directly, the gradient is left alone)::

    p = p * (1 - lr * weight_decay)
    then the Adam step with g unchanged

Note the placement of eps: outside the square root and after the bias
correction of v, exactly as PyTorch writes it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable

import numpy as np

from minigrad_norm.tensor import Tensor, increment_version


class Optimizer:
    """Holds the parameters and a learning rate ``lr`` (which a schedule may change between steps).

    One group of parameters with one set of hyperparameters: PyTorch's parameter groups (a list of dicts),
    ``state_dict``/``load_state_dict`` and ``add_param_group`` are not implemented, and a list of dicts is
    refused with ``TypeError``.
    """

    def __init__(self, params: Iterable[Tensor], lr: float) -> None:
        name = type(self).__name__
        if isinstance(params, Tensor):
            raise TypeError(f"{name}: params must be an iterable of Tensors, got a Tensor of shape {params.shape}")
        self.params = list(params)
        if not self.params:
            raise ValueError(f"{name}: got an empty parameter list")
        for k, p in enumerate(self.params):
            if not isinstance(p, Tensor):
                raise TypeError(
                    f"{name}: parameter {k} is a {type(p).__name__}, not a Tensor (parameter groups, dicts in "
                    "PyTorch, are not implemented)"
                )
            if not p.is_leaf:
                raise ValueError(f"{name}: can't optimize a non-leaf Tensor (parameter {k}, shape {p.shape})")
        if len({id(p) for p in self.params}) < len(self.params):
            # as PyTorch's warning: each copy would be stepped, with state of its own
            warnings.warn(
                f"{name}: the parameter list holds a parameter more than once; it is updated once for each copy",
                stacklevel=3,
            )
        if not lr >= 0.0:  # not `lr < 0.0`, which a nan lr would pass
            raise ValueError(f"{name}: invalid learning rate lr={lr}")
        self.lr = lr

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every gradient (PyTorch's default), or with ``set_to_none=False`` zero them in place."""
        for p in self.params:
            p.zero_grad(set_to_none)

    def step(self) -> None:
        for i, p in enumerate(self.params):
            if p.grad is not None:
                self.update(i, p, p.grad)
                increment_version(p)  # a backward through a graph built before this step now raises

    def update(self, i: int, p: Tensor, grad: np.ndarray) -> None:
        """Apply one step to parameter number ``i``."""
        raise NotImplementedError


class SGD(Optimizer):
    """Stochastic gradient descent with optional (Nesterov) momentum and L2 weight decay."""

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        super().__init__(params, lr)
        # Written so that nan fails (nan >= 0 is False). PyTorch's SGD accepts nan and trains on nan.
        if not (momentum >= 0.0 and weight_decay >= 0.0):
            raise ValueError(f"SGD: momentum ({momentum}) and weight_decay ({weight_decay}) must be >= 0")
        if math.isnan(dampening):
            raise ValueError("SGD: dampening must be a number, got nan")
        if nesterov and (momentum <= 0.0 or dampening != 0.0):
            raise ValueError("SGD: nesterov momentum requires momentum > 0 and dampening = 0")
        self.momentum, self.dampening, self.weight_decay, self.nesterov = momentum, dampening, weight_decay, nesterov
        self.buffers: list[np.ndarray | None] = [None] * len(self.params)

    def update(self, i: int, p: Tensor, grad: np.ndarray) -> None:
        g = grad + self.weight_decay * p.data if self.weight_decay else grad
        if self.momentum:
            buf = self.buffers[i]
            if buf is None:
                buf = self.buffers[i] = np.array(g, dtype=p.dtype)
            else:
                buf *= self.momentum
                buf += (1 - self.dampening) * g
            g = g + self.momentum * buf if self.nesterov else buf
        p.data -= self.lr * g


class Adam(Optimizer):
    """Adam with bias correction; ``weight_decay`` adds weight_decay * p to the gradient (L2)."""

    decoupled = False

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, lr)
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"{type(self).__name__}: betas must be in [0, 1), got {betas}")
        if not (eps >= 0.0 and weight_decay >= 0.0):  # written so that nan fails, as in PyTorch
            raise ValueError(f"{type(self).__name__}: eps ({eps}) and weight_decay ({weight_decay}) must be >= 0")
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay
        self.exp_avg = [np.zeros_like(p.data) for p in self.params]
        self.exp_avg_sq = [np.zeros_like(p.data) for p in self.params]
        self.steps = [0] * len(self.params)  # per parameter, as PyTorch's state["step"]

    def update(self, i: int, p: Tensor, grad: np.ndarray) -> None:
        beta1, beta2 = self.betas
        self.steps[i] += 1
        t = self.steps[i]
        if self.weight_decay:
            if self.decoupled:
                p.data *= 1 - self.lr * self.weight_decay
            else:
                grad = grad + self.weight_decay * p.data
        m, v = self.exp_avg[i], self.exp_avg_sq[i]
        m *= beta1
        m += (1 - beta1) * grad
        v *= beta2
        v += (1 - beta2) * grad * grad
        step_size = self.lr / (1 - beta1**t)
        denom = np.sqrt(v) / math.sqrt(1 - beta2**t) + self.eps
        p.data -= step_size * m / denom


class AdamW(Adam):
    """Adam with decoupled weight decay (default 0.01, as ``torch.optim.AdamW``)."""

    decoupled = True

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay)


class WarmupSchedule:
    """Linear warmup to ``optimizer``'s base lr over ``warmup_steps``, then constant, linear or cosine decay.

    Call ``step()`` once per optimizer step, before ``optimizer.step()``; the
    k-th call (k = 1, 2, ...) sets ``lr = base_lr * factor(k)``::

        factor(k) = k / warmup_steps                               for k <= warmup_steps
        then, with u = (k - 1 - warmup_steps) / (total_steps - warmup_steps):
            "constant": 1,  "linear": 1 - u,  "cosine": (1 + cos(pi u)) / 2

    The decay counts from k - 1, so that every one of ``total_steps`` steps moves the parameters: the first
    step after the warmup is at the peak, and the lr would reach 0 at step total_steps + 1 (counted from k it
    reached 0 at the last step, which then did nothing, and a run of one step none at all). The decay is
    that of Hugging Face's ``get_cosine_schedule_with_warmup`` with ``scheduler.step()`` after each step; the
    warmup is 1/w, ..., 1 rather than its 0, ..., (w-1)/w, whose first step is lost.
    """

    def __init__(self, optimizer: Optimizer, warmup_steps: int, total_steps: int = 0, decay: str = "constant") -> None:
        if decay not in ("constant", "linear", "cosine"):
            raise ValueError(f"WarmupSchedule: decay must be 'constant', 'linear' or 'cosine', got {decay!r}")
        if not warmup_steps >= 0:  # written so that nan fails
            raise ValueError(f"WarmupSchedule: warmup_steps must be >= 0, got {warmup_steps}")
        if decay != "constant" and not total_steps > warmup_steps:
            raise ValueError(f"WarmupSchedule: total_steps ({total_steps}) must exceed warmup_steps ({warmup_steps})")
        self.optimizer, self.base_lr = optimizer, optimizer.lr
        self.warmup_steps, self.total_steps, self.decay = warmup_steps, total_steps, decay
        self.count = 0

    def factor(self, k: int) -> float:
        if k <= self.warmup_steps:
            return k / self.warmup_steps
        if self.decay == "constant":
            return 1.0
        u = min(1.0, (k - 1 - self.warmup_steps) / (self.total_steps - self.warmup_steps))
        return 1.0 - u if self.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * u))

    def step(self) -> float:
        self.count += 1
        self.optimizer.lr = self.base_lr * self.factor(self.count)
        return self.optimizer.lr


def global_norm(arrays: Iterable[np.ndarray], norm_type: float = 2.0) -> float:
    """The ``norm_type``-norm of all ``arrays`` as one vector, (sum |a|^p)^(1/p) accumulated in float64, or
    max |a| for p = inf."""
    if norm_type == math.inf:
        return max((float(np.max(np.abs(a), initial=0.0)) for a in arrays), default=0.0)
    if norm_type == 2.0:  # (the usual one: squares, and one correctly rounded square root)
        return math.sqrt(sum(float(np.sum(np.square(a, dtype=np.float64))) for a in arrays))
    return sum(float(np.sum(np.abs(a.astype(np.float64)) ** norm_type)) for a in arrays) ** (1 / norm_type)


def clip_grad_norm_(
    parameters: Tensor | Iterable[Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
) -> float:
    """Scale all gradients together so that their global norm is at most ``max_norm``; return the norm before.

    As ``torch.nn.utils.clip_grad_norm_`` (the same arguments, in its order): total = the ``norm_type``-norm
    of all gradients as one vector (max |g| for inf), and every grad is multiplied by
    min(1, max_norm / (total + 1e-6)); a NaN total makes every grad NaN, as there. Unlike PyTorch, the norm is
    summed in float64 whatever the gradients' dtype, and returned as a Python float.
    """
    if isinstance(norm_type, bool) or not isinstance(norm_type, int | float) or not norm_type > 0:
        raise ValueError(f"clip_grad_norm_: norm_type must be a number > 0 (or inf), got {norm_type!r}")
    grads = [p.grad for p in ([parameters] if isinstance(parameters, Tensor) else parameters) if p.grad is not None]
    if not grads:
        return 0.0
    total = global_norm(grads, norm_type)
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(f"clip_grad_norm_: the total gradient norm is {total}; set error_if_nonfinite=False to clip")
    coef = max_norm / (total + 1e-6)
    if not coef >= 1.0:  # (written so that a NaN total, whose coef is NaN, scales every grad too)
        for g in grads:
            g *= g.dtype.type(coef)
    return total
