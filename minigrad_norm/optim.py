"""Optimizers (SGD, Adam, AdamW) with parameter groups and state dicts, a warmup schedule and global
gradient-norm clipping, as in PyTorch.

An optimizer's ``param_groups`` is a list of dicts, each holding its parameters under ``"params"`` and every
hyperparameter (those a group leaves out are the constructor's, ``defaults``), so that groups can differ,
as in GPT-style training, which leaves norm gains and biases out of the weight decay::

    AdamW([{"params": weights}, {"params": gains_and_biases, "weight_decay": 0.0}], lr=3e-3)

A list of Tensors is one group, and so is ``model.named_parameters()``: a group given (name, Tensor) pairs
keeps the names under ``"param_names"`` (every group named or none, as in PyTorch), which ``state_dict()``
saves and ``load_state_dict`` restores but never matches parameters by. Per-parameter state is ``state[p]``,
keyed by the Tensor, under PyTorch's names (given below); ``state_dict()`` and ``load_state_dict`` use
PyTorch's format.

Each optimizer updates its parameters' ``.data`` in place from their
``.grad`` (parameters whose grad is None are skipped, as PyTorch does), in
the parameter's own dtype, and counts the write (``increment_version``), so a
backward through a graph built before the step raises, as in PyTorch. With g the gradient, p the parameter, lr the
learning rate and t the step count (from 1), the hyperparameters being those of p's group:

SGD (``torch.optim.SGD``; state: b is ``momentum_buffer``, kept when momentum != 0)::

    g = g + weight_decay * p                     L2 penalty folded into the gradient
    b = g                     at t = 1           momentum buffer
    b = momentum * b + (1 - dampening) * g       afterwards
    g = g + momentum * b  if nesterov  else  b   (when momentum != 0)
    p = p - lr * g

Adam (``torch.optim.Adam``; state: t is ``step``, m ``exp_avg``, v ``exp_avg_sq``; weight decay is the L2
penalty, as above)::

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
from collections.abc import Iterable, Mapping
from itertools import chain
from typing import Any

import numpy as np

from minigrad_norm.tensor import Tensor, increment_version

# What an optimizer takes: Tensors or (name, Tensor) pairs (one group), or groups {"params": a Tensor, Tensors or
# pairs, **hyperparameters}.
Params = Iterable[Tensor] | Iterable[tuple[str, Tensor]] | Iterable[dict[str, Any]]


class Optimizer:
    """Parameter groups, per-parameter state and the step loop, as ``torch.optim.Optimizer``; a subclass
    checks its hyperparameters (``check``) and updates one parameter (``update``).

    ``param_groups``: a list of dicts, each with ``"params"`` (a list of Tensors), every hyperparameter and, if
    given names, ``"param_names"``; a schedule sets each group's ``"lr"`` between steps. ``defaults``: the
    constructor's hyperparameters.
    ``state``: a parameter's state (a dict, made at its first step), keyed by the parameter.
    """

    def __init__(self, params: Params, defaults: dict[str, Any]) -> None:
        name = type(self).__name__
        if isinstance(params, Tensor):
            raise TypeError(
                f"{name}: params must be an iterable of Tensors or dicts, got a Tensor of shape {params.shape}"
            )
        self.check(defaults, name)
        self.defaults = defaults
        self.param_groups: list[dict[str, Any]] = []
        self.state: dict[Tensor, dict[str, Any]] = {}
        groups = list(params)
        if not groups:
            raise ValueError(f"{name}: got an empty parameter list")
        for group in groups if isinstance(groups[0], dict) else [{"params": groups}]:
            self._add_param_group(group, stacklevel=4)  # a warning names the line that made the optimizer

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Append a copy of ``param_group`` to ``param_groups``; see ``_add_param_group``."""
        self._add_param_group(param_group, stacklevel=3)

    def _add_param_group(self, param_group: dict[str, Any], stacklevel: int) -> None:
        """Append a copy of ``param_group``, ``{"params": a Tensor, Tensors or (name, Tensor) pairs,
        **hyperparameters}``, to ``param_groups``, the hyperparameters it leaves out taken from ``defaults`` and
        the names of pairs kept as ``"param_names"``. Other keys are kept (as PyTorch keeps them, a schedule's
        ``initial_lr`` say); the parameters are numbered across the groups in order, in messages as in
        ``state_dict``."""
        name, i = type(self).__name__, len(self.param_groups)
        if not isinstance(param_group, dict):
            raise TypeError(f"{name}: parameter group {i} is a {type(param_group).__name__}, not a dict")
        if "params" not in param_group:
            raise KeyError(f"{name}: parameter group {i} has no 'params'")
        params = param_group["params"]
        if isinstance(params, set):  # as PyTorch: the order of a set, and so state_dict's numbering, varies by run
            raise TypeError(f"{name}: parameter group {i}'s params are a set, whose order varies; pass a list")
        params, names = _split_names(f"{name}: parameter group {i}", [params] if isinstance(params, Tensor) else params)
        group_of = {p: j for j, group in enumerate(self.param_groups) for p in group["params"]}
        for k, p in enumerate(params, sum(len(group["params"]) for group in self.param_groups)):
            if not isinstance(p, Tensor):
                raise TypeError(f"{name}: parameter {k} is a {type(p).__name__}, not a Tensor")
            if not p.is_leaf:
                raise ValueError(f"{name}: can't optimize a non-leaf Tensor (parameter {k}, shape {p.shape})")
            if p in group_of:
                raise ValueError(f"{name}: parameter {k} (shape {p.shape}) is in parameter group {group_of[p]} too")
        if len(set(params)) < len(params):
            # as PyTorch's warning: each copy is stepped, with the one state of the parameter
            warnings.warn(
                f"{name}: parameter group {i} holds a parameter more than once; it is updated once for each copy",
                stacklevel=stacklevel,
            )
        group = {**self.defaults, **param_group, "params": params, **names}
        named = "param_names" in group  # (as in PyTorch, a group may also bring "param_names" of its own)
        if self.param_groups and ("param_names" in self.param_groups[0]) != named:
            # as PyTorch: a state dict's groups are all named or none is
            raise ValueError(
                f"{name}: parameter group {i} is {'named' if named else 'unnamed'} and group 0 is not; every group "
                "must name its parameters (give (name, Tensor) pairs, as named_parameters()) or none"
            )
        self.check(group, f"{name} parameter group {i}")
        self.param_groups.append(group)

    def check(self, group: Mapping[str, Any], where: str) -> None:
        """Raise ValueError, its message starting with ``where``, for a hyperparameter out of range in ``group``
        (a parameter group or ``defaults``). Each check is written so that nan fails (nan >= 0 is False)."""
        if not group["lr"] >= 0.0:  # not `lr < 0.0`, which a nan lr would pass
            raise ValueError(f"{where}: invalid learning rate lr={group['lr']}")
        for key, value in self.fixed_options().items():
            if key in group and group[key] != value:
                raise ValueError(
                    f"{where}: {key}={group[key]!r} is not implemented ({type(self).__name__} steps as {key}={value!r})"
                )

    def fixed_options(self) -> dict[str, Any]:
        """PyTorch's options that change the update, at the one value this optimizer computes: a group (from a
        PyTorch state dict, say) holding another value is refused, rather than stepped as if it did not."""
        return {"maximize": False}

    def _no_lr(self, *_: Any) -> None:
        raise AttributeError(
            f"{type(self).__name__} has no single lr: each parameter group has its own, param_groups[i]['lr']"
        )

    # Reading or writing optimizer.lr raises (in PyTorch a write silently adds an attribute no step reads),
    # so that code written for one lr (as this package's optimizers had) cannot train at a stale one.
    lr = property(_no_lr, _no_lr)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every gradient (PyTorch's default), or with ``set_to_none=False`` zero them in place."""
        for group in self.param_groups:
            for p in group["params"]:
                p.zero_grad(set_to_none)

    def step(self) -> None:
        """Update every parameter that has a gradient, with its group's hyperparameters."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.update(p, p.grad, group)
                    increment_version(p)  # a backward through a graph built before this step now raises

    def update(self, p: Tensor, grad: np.ndarray, group: dict[str, Any]) -> None:
        """Apply one step to ``p`` with ``group``'s hyperparameters, its state in ``self.state[p]``."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """PyTorch's format: ``{"state": {index: {name: value}}, "param_groups": [{**hyperparameters, "params":
        [index, ...]}]}``, the parameters numbered across the groups in order (a repeated one by its first
        place), a named group's ``"param_names"`` with them; only parameters that have state are in
        ``"state"``, their arrays copied."""
        index: dict[Tensor, int] = {}
        for k, p in enumerate(chain.from_iterable(group["params"] for group in self.param_groups)):
            index.setdefault(p, k)
        return {
            "state": {
                index[p]: {key: np.copy(v) if isinstance(v, np.ndarray) else v for key, v in state.items()}
                for p, state in self.state.items()
            },
            "param_groups": [{**group, "params": [index[p] for p in group["params"]]} for group in self.param_groups],
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Replace the hyperparameters and state with those of ``state_dict`` (from ``state_dict()``, ours or
        PyTorch's: its CPU tensors are read as arrays), matching parameters by their place in the groups, as
        PyTorch does: names are not compared. A saved group's ``"param_names"`` replace the optimizer's, and a
        saved group without them keeps the optimizer's, as in PyTorch.

        State arrays are copied and cast to the parameter's dtype, as PyTorch casts them; ``step`` becomes a
        Python int (PyTorch keeps a float tensor). Checked first, so that a bad dict changes nothing: the
        number of groups and of parameters in each, the hyperparameters (as ``add_param_group``), and the
        shape of each state array.
        """
        name, saved = type(self).__name__, state_dict["param_groups"]
        if len(saved) != len(self.param_groups):
            raise ValueError(
                f"{name}: loaded state dict has a different number of parameter groups "
                f"({len(saved)}, the optimizer {len(self.param_groups)})"
            )
        groups = []
        for i, (group, saved_group) in enumerate(zip(self.param_groups, saved, strict=True)):
            if len(saved_group["params"]) != len(group["params"]):
                raise ValueError(
                    f"{name}: loaded state dict contains a parameter group that doesn't match the size of "
                    f"optimizer's group (group {i}: {len(saved_group['params'])} parameters, the optimizer's "
                    f"{len(group['params'])})"
                )
            loaded = {**saved_group, "params": group["params"]}
            if (names := saved_group.get("param_names", group.get("param_names"))) is not None:
                loaded["param_names"] = list(names)  # a group saved unnamed keeps its names, as in PyTorch
            self.check(loaded, f"{name} loaded parameter group {i}")
            groups.append(loaded)
        param_of = dict(
            zip(
                chain.from_iterable(s["params"] for s in saved),
                chain.from_iterable(group["params"] for group in groups),
                strict=True,
            )
        )
        state = {}
        for k, saved_state in state_dict["state"].items():
            if k not in param_of:
                raise ValueError(f"{name}: loaded state dict has state for parameter {k}, which no group lists")
            p = param_of[k]
            state[p] = {
                key: int(value) if key == "step" else _state_array(value, p, f"{name}: loaded {key} of parameter {k}")
                for key, value in saved_state.items()
            }
        self.param_groups, self.state = groups, state


def _split_names(where: str, params: Iterable[Any]) -> tuple[list[Any], dict[str, list[str]]]:
    """``params`` and ``{}``, or, given (name, Tensor) pairs as ``named_parameters()`` gives them (PyTorch's test:
    a tuple), the Tensors and ``{"param_names": names}``, which ``state_dict`` saves; a group names all its
    parameters or none, as in PyTorch."""
    params = list(params)
    pairs = [p for p in params if isinstance(p, tuple)]
    if not pairs:
        return params, {}
    if len(pairs) < len(params):
        raise ValueError(f"{where} names some of its parameters, not all")
    if bad := [pair for pair in pairs if len(pair) != 2]:
        raise TypeError(f"{where}: a named parameter is a (name, Tensor) pair, got a tuple of {len(bad[0])}")
    return [p for _, p in pairs], {"param_names": [n for n, _ in pairs]}


def _state_array(value: Any, p: Tensor, where: str) -> np.ndarray:
    """A copy of ``value`` in ``p``'s dtype (PyTorch casts state to its parameter's dtype), refused unless of
    ``p``'s shape (a state dict of other parameters would broadcast into the update or fail there)."""
    array = np.asarray(value).astype(p.dtype)  # (astype copies; np.array(value, dtype) warns on a torch tensor)
    if array.shape != p.shape:
        raise ValueError(f"{where} has shape {array.shape}, the parameter {p.shape}")
    return array


class SGD(Optimizer):
    """Stochastic gradient descent with optional (Nesterov) momentum and L2 weight decay."""

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening, "weight_decay": weight_decay}
        super().__init__(params, {**defaults, "nesterov": nesterov})

    def check(self, group: Mapping[str, Any], where: str) -> None:
        super().check(group, where)
        momentum, dampening, weight_decay = group["momentum"], group["dampening"], group["weight_decay"]
        # PyTorch's SGD accepts nan and trains on nan.
        if not (momentum >= 0.0 and weight_decay >= 0.0):
            raise ValueError(f"{where}: momentum ({momentum}) and weight_decay ({weight_decay}) must be >= 0")
        if math.isnan(dampening):
            raise ValueError(f"{where}: dampening must be a number, got nan")
        if group["nesterov"] and (momentum <= 0.0 or dampening != 0.0):
            raise ValueError(f"{where}: nesterov momentum requires momentum > 0 and dampening = 0")

    def update(self, p: Tensor, grad: np.ndarray, group: dict[str, Any]) -> None:
        momentum, weight_decay = group["momentum"], group["weight_decay"]
        g = grad + weight_decay * p.data if weight_decay else grad
        if momentum:
            state = self.state.setdefault(p, {})
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = np.array(g, dtype=p.dtype)
            else:
                buf *= momentum
                buf += (1 - group["dampening"]) * g
            g = g + momentum * buf if group["nesterov"] else buf
        p.data -= group["lr"] * g


class Adam(Optimizer):
    """Adam with bias correction; ``weight_decay`` adds weight_decay * p to the gradient (L2)."""

    decoupled = False

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    def check(self, group: Mapping[str, Any], where: str) -> None:
        super().check(group, where)
        betas, eps, weight_decay = group["betas"], group["eps"], group["weight_decay"]
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"{where}: betas must be in [0, 1), got {betas}")
        if not (eps >= 0.0 and weight_decay >= 0.0):  # written so that nan fails, as in PyTorch
            raise ValueError(f"{where}: eps ({eps}) and weight_decay ({weight_decay}) must be >= 0")

    def fixed_options(self) -> dict[str, Any]:
        # (PyTorch's Adam takes decoupled_weight_decay=True to be AdamW, and its state dicts say which they are)
        return {**super().fixed_options(), "amsgrad": False, "decoupled_weight_decay": self.decoupled}

    def update(self, p: Tensor, grad: np.ndarray, group: dict[str, Any]) -> None:
        lr, (beta1, beta2), weight_decay = group["lr"], group["betas"], group["weight_decay"]
        state = self.state.setdefault(p, {})
        if not state:  # a parameter's first step, as PyTorch's lazy initialisation
            state.update(step=0, exp_avg=np.zeros_like(p.data), exp_avg_sq=np.zeros_like(p.data))
        state["step"] += 1
        t = state["step"]
        if weight_decay:
            if self.decoupled:
                p.data *= 1 - lr * weight_decay
            else:
                grad = grad + weight_decay * p.data
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m *= beta1
        m += (1 - beta1) * grad
        v *= beta2
        v += (1 - beta2) * grad * grad
        step_size = lr / (1 - beta1**t)
        denom = np.sqrt(v) / math.sqrt(1 - beta2**t) + group["eps"]
        p.data -= step_size * m / denom


class AdamW(Adam):
    """Adam with decoupled weight decay (default 0.01, as ``torch.optim.AdamW``)."""

    decoupled = True

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay)


class WarmupSchedule:
    """Linear warmup to each parameter group's base lr over ``warmup_steps``, then constant, linear or cosine
    decay.

    Call ``step()`` once per optimizer step, before ``optimizer.step()``; the
    k-th call (k = 1, 2, ...) sets every group's ``lr = base_lr * factor(k)``::

        factor(k) = k / warmup_steps                               for k <= warmup_steps
        then, with u = (k - 1 - warmup_steps) / (total_steps - warmup_steps):
            "constant": 1,  "linear": 1 - u,  "cosine": (1 + cos(pi u)) / 2

    The decay counts from k - 1, so that every one of ``total_steps`` steps moves the parameters: the first
    step after the warmup is at the peak, and the lr would reach 0 at step total_steps + 1 (counted from k it
    reached 0 at the last step, which then did nothing, and a run of one step none at all). The decay is
    that of Hugging Face's ``get_cosine_schedule_with_warmup`` with ``scheduler.step()`` after each step; the
    warmup is 1/w, ..., 1 rather than its 0, ..., (w-1)/w, whose first step is lost.

    The lrs are those of ``torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: factor(e + 1))`` stepped
    after each step. As in PyTorch's schedulers, a group's base lr is its ``"initial_lr"``, set to its
    ``"lr"`` if it has none: a schedule made after ``load_state_dict`` starts from the saved base lrs, not
    from the lrs the saved groups had decayed to.
    """

    def __init__(self, optimizer: Optimizer, warmup_steps: int, total_steps: int = 0, decay: str = "constant") -> None:
        if decay not in ("constant", "linear", "cosine"):
            raise ValueError(f"WarmupSchedule: decay must be 'constant', 'linear' or 'cosine', got {decay!r}")
        if not warmup_steps >= 0:  # written so that nan fails
            raise ValueError(f"WarmupSchedule: warmup_steps must be >= 0, got {warmup_steps}")
        if decay != "constant" and not total_steps > warmup_steps:
            raise ValueError(f"WarmupSchedule: total_steps ({total_steps}) must exceed warmup_steps ({warmup_steps})")
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.optimizer = optimizer
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.warmup_steps, self.total_steps, self.decay = warmup_steps, total_steps, decay
        self.count = 0

    def factor(self, k: int) -> float:
        if k <= self.warmup_steps:
            return k / self.warmup_steps
        if self.decay == "constant":
            return 1.0
        u = min(1.0, (k - 1 - self.warmup_steps) / (self.total_steps - self.warmup_steps))
        return 1.0 - u if self.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * u))

    def step(self) -> list[float]:
        """Set the lr of the next optimizer step, in every group; return the lrs (PyTorch's ``get_last_lr()``)."""
        groups = self.optimizer.param_groups
        if len(groups) != len(self.base_lrs):  # (PyTorch 2.13's LambdaLR raises too; StepLR scales it)
            raise ValueError(
                f"WarmupSchedule: the optimizer has {len(groups)} parameter groups, {len(self.base_lrs)} when the "
                "schedule was made; make the schedule after add_param_group"
            )
        self.count += 1
        factor = self.factor(self.count)
        for group, base_lr in zip(groups, self.base_lrs, strict=True):
            group["lr"] = base_lr * factor
        return [group["lr"] for group in groups]


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
