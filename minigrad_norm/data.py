"""A generated sequence task that needs no download: copy, reverse or sort a string of digits.

A sample is ``x_1 .. x_n SEP y_1 .. y_n`` with x uniform over ``n_symbols``
digits and y = x (copy), x reversed (reverse) or x sorted (sort). A causal
language model reads the sequence shifted by one and is scored only on the
y positions (the x positions get ``IGNORE`` targets, since x is random and
cannot be predicted). Chance accuracy per y token is 1 / n_symbols.

Held-out sequences are disjoint from training ones by construction, not
just by luck: a sequence belongs to the held-out split when a hash of its
digits is 0 modulo ``HELDOUT_MODULUS``, and the training sampler throws
such sequences away. Everything is a deterministic function of the seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TASKS = ("copy", "reverse", "sort")
IGNORE = -100  # cross_entropy's ignore_index
HELDOUT_MODULUS = 10  # about one sequence in ten is reserved for evaluation (exactly so for 10 symbols)


@dataclass(frozen=True)
class SequenceTask:
    task: str = "reverse"
    n_symbols: int = 10
    length: int = 8

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"SequenceTask: task must be one of {TASKS}, got {self.task!r}")
        if self.n_symbols < 2 or self.length < 1:
            raise ValueError(f"SequenceTask: need n_symbols >= 2 and length >= 1, got {self.n_symbols}, {self.length}")
        # the residues the hash can take over all n_symbols^length prompts, one position at a time
        reached = {13 % HELDOUT_MODULUS}
        for w in self._weights():
            reached = {(r + d * int(w)) % HELDOUT_MODULUS for r in reached for d in range(self.n_symbols)}
        if 0 not in reached or reached == {0}:
            split = "held-out" if 0 not in reached else "training"
            raise ValueError(
                f"SequenceTask: with n_symbols={self.n_symbols} and length={self.length} no prompt falls in the "
                f"{split} split (the hash of its digits is {'never' if 0 not in reached else 'always'} 0 modulo "
                f"{HELDOUT_MODULUS}); take more symbols or a longer length"
            )

    @property
    def sep(self) -> int:
        return self.n_symbols

    @property
    def vocab_size(self) -> int:
        return self.n_symbols + 1

    @property
    def seq_len(self) -> int:
        """Length of the model's input (the full sample minus its last token)."""
        return 2 * self.length

    def answer(self, x: np.ndarray) -> np.ndarray:
        """The target digits y for prompts x of shape (batch, length)."""
        if self.task == "copy":
            return x.copy()
        if self.task == "reverse":
            return x[:, ::-1].copy()
        return np.sort(x, axis=1)

    def _weights(self) -> np.ndarray:
        return (np.arange(1, self.length + 1, dtype=np.int64) * 7919) % 1000003

    def is_heldout(self, x: np.ndarray) -> np.ndarray:
        """Which rows of x belong to the held-out split (a fixed hash of the digits)."""
        return (x.astype(np.int64) @ self._weights() + 13) % HELDOUT_MODULUS == 0

    def prompts(self, rng: np.random.Generator, n: int, heldout: bool) -> np.ndarray:
        """``n`` prompts from one split, shape (n, length)."""
        out = np.empty((0, self.length), dtype=np.int64)
        while len(out) < n:
            x = rng.integers(0, self.n_symbols, size=(2 * n + 16, self.length))
            out = np.concatenate([out, x[self.is_heldout(x) == heldout]])
        return out[:n]

    def batch(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets) of shape (batch, seq_len) for prompts x; prompt positions are IGNORE."""
        full = np.concatenate([x, np.full((len(x), 1), self.sep), self.answer(x)], axis=1)
        targets = full[:, 1:].copy()
        targets[:, : self.length] = IGNORE  # the random prompt and the fixed separator are not scored
        return full[:, :-1], targets

    def sample(self, rng: np.random.Generator, batch_size: int, heldout: bool = False) -> tuple[np.ndarray, np.ndarray]:
        return self.batch(self.prompts(rng, batch_size, heldout))
