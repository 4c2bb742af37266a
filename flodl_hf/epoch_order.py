"""The order of each epoch's samples when the loop brings its own sampler.

It exists so that a ported script trains on one device exactly as it did before porting: a plain loop that read
its data through ``DataLoader(dataset, sampler=RandomSampler(dataset, generator=g))`` passes the same sampler to
``graph.set_data_loader(..., sampler=...)``, and epoch ``n``'s order is the sampler's ``n``-th pass, as the
``DataLoader`` would have drawn it. Passes are drawn in epoch order and kept, so replanning an epoch (read-ahead,
``graph.plan(n)`` twice, a resume that starts at epoch ``n``) sees the same order. On N ranks every rank holds
its own copy of the sampler, seeded alike: each draws the same orders, and the window end compares a digest of
the first one, so ranks whose samplers disagree are stopped before any update.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable

import torch

__all__ = ["SamplerOrders"]


class SamplerOrders:
    """Epoch ``n`` -> the ``n``-th full pass of a sampler over ``range(size)``, checked to be a permutation."""

    def __init__(self, sampler: Iterable[Any], size: int) -> None:
        if not hasattr(sampler, "__iter__"):
            raise TypeError(f"sampler of type {type(sampler).__name__} is not iterable: pass a torch sampler "
                            "(e.g. RandomSampler(dataset, generator=torch.Generator().manual_seed(42))) or None")
        self.sampler, self.size = sampler, int(size)
        self._orders: list[torch.Tensor] = []

    def order(self, epoch: int) -> torch.Tensor:
        """The permutation of ``range(size)`` for ``epoch`` (drawing the passes before it first)."""
        while len(self._orders) <= epoch:
            self._orders.append(self._draw())
        return self._orders[epoch]

    def digest(self) -> int:
        """A 24-bit digest of epoch 0's order: equal on ranks whose samplers agree."""
        data = self.order(0).numpy().tobytes()
        return int.from_bytes(hashlib.sha256(data).digest()[:3], "big")

    def _draw(self) -> torch.Tensor:
        indices = [int(i) for i in self.sampler]
        n = self.size
        if len(indices) != n or sorted(indices) != list(range(n)):
            seen = len(set(indices))
            raise ValueError(f"the sampler's pass {len(self._orders)} yields {len(indices)} indices ({seen} "
                             f"distinct), not each of the dataset's {n} rows once: pass a sampler over the whole "
                             "dataset without replacement (RandomSampler or SequentialSampler); setup mode splits "
                             "each batch between the ranks itself, so no DistributedSampler")
        return torch.tensor(indices, dtype=torch.int64)
