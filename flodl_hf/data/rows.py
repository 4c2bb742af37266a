"""``Rows``: the items of one task's data (what the task head's ``collate`` takes) with their source, and the
seeded split and subset every task shares.

It exists so that token classification, question answering and fill-mask data split into training and held-out
rows exactly as the text-classification job's ``TextDataset`` does (a seeded permutation, the same on every machine
and every rank), without each task re-implementing it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Sequence

__all__ = ["Rows"]


@dataclass
class Rows:
    """Task items (``(words, tags)`` pairs, SQuAD-style dicts, or texts) read from ``source``."""

    items: list
    source: str
    labels: list = field(default_factory=list)
    """Tag names in id order (token classification); empty for the other tasks."""
    dropped: int = 0
    """Rows skipped as empty."""

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        return self.items[index]

    def _take(self, indices: Sequence[int]) -> "Rows":
        return Rows([self.items[i] for i in indices], self.source, list(self.labels), 0)

    def split(self, n_eval: int, seed: int = 0) -> tuple["Rows", "Rows"]:
        """Seeded random ``(train, held-out)`` with ``n_eval`` held-out rows (both kept in source order)."""
        n = len(self)
        if isinstance(n_eval, bool) or not isinstance(n_eval, int) or not 1 <= n_eval < n:
            raise ValueError(f"cannot hold out {n_eval!r} of {n} rows of {self.source}: give --eval-rows between 1 "
                             f"and {n - 1}, so that rows remain for training")
        order = list(range(n))
        random.Random(seed).shuffle(order)
        return self._take(sorted(order[n_eval:])), self._take(sorted(order[:n_eval]))

    def subset(self, n: int, seed: int = 0) -> "Rows":
        """``n`` rows drawn with ``seed`` (kept in source order); every row when ``n >= len(self)``."""
        if n >= len(self):
            return self._take(range(len(self)))
        order = list(range(len(self)))
        random.Random(seed).shuffle(order)
        return self._take(sorted(order[:n]))
