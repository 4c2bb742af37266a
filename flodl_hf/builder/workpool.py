"""The coordinator-owned cursor over every epoch's batches: who runs which batch, exactly once.

Why it exists: progressive dispatch is what lets a fast device take more of an epoch without anyone predicting
speeds exactly. Each epoch is one seeded permutation cut into ``len(ds) // batch_size`` batches (the workers
compute the same permutation from ``seed + epoch``, so a batch travels as ``(epoch, index)``). With CADENCE
and ASYNC every rank pulls small chunks from one shared cursor, so the slices it ends up with are disjoint and
proportional to its speed; with SYNC each epoch is split equally (round robin) up front, as plain synchronous
data parallelism does; with ``progressive_dispatch(False)`` each epoch is cut into one contiguous slice per rank,
proportional to El Che's counts when the epoch starts. Epochs are pipelined: a rank that runs out of epoch ``e``
takes from ``e + 1``.

A resumed run's pool skips the batches its checkpoint's model already holds (``skip``: a checkpoint taken at an
epoch end may hold a few batches of the next epoch; ``flodl_hf.builder.resume``).

The pool also remembers what each rank holds and has not finished, so the batches of a worker that dies (CPU
backend) go back to the survivors and every epoch still completes.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Optional

__all__ = ["WorkPool", "Batch"]

Batch = tuple[int, int]  # (epoch, batch index within the epoch)


class WorkPool:
    """Hands out ``(epoch, batch)`` pairs; every pair of every epoch is completed exactly once."""

    def __init__(
        self, num_samples: int, batch_size: int, num_epochs: int, world: int, *, equal_split: bool,
        slice_weights: Optional[Callable[[], list[float]]] = None, first_epoch: int = 0,
        skip: frozenset = frozenset(),
    ) -> None:
        self.batches_per_epoch = num_samples // batch_size
        if self.batches_per_epoch < 1:
            raise ValueError(
                f"{num_samples} samples make no full batch of {batch_size}: lower the batch size"
            )
        self.num_epochs = num_epochs
        self.world = world
        self.equal_split = equal_split
        self.slice_weights = slice_weights
        self.own_slices = equal_split or slice_weights is not None
        self.live = set(range(world))
        self._next_epoch = int(first_epoch)  # a resumed run starts after its checkpoint's epoch
        self.skip = frozenset(skip)  # ... and does not run again the batches its checkpoint's model holds
        self._shared: deque[Batch] = deque()
        self._own: list[deque[Batch]] = [deque() for _ in range(world)]
        self._orphans: deque[Batch] = deque()
        self._held: list[deque[Batch]] = [deque() for _ in range(world)]  # handed out, not completed

    @property
    def total_batches(self) -> int:
        return self.batches_per_epoch * self.num_epochs

    def _generate(self) -> None:
        epoch = self._next_epoch
        self._next_epoch += 1
        items = [(epoch, i) for i in range(self.batches_per_epoch) if (epoch, i) not in self.skip]
        if self.equal_split:
            ranks = sorted(self.live)
            for i, item in enumerate(items):
                self._own[ranks[i % len(ranks)]].append(item)
        elif self.slice_weights is not None:
            ranks = sorted(self.live)
            weights = self.slice_weights()
            total = sum(max(0.0, weights[r]) for r in ranks) or float(len(ranks))
            at = 0
            for j, r in enumerate(ranks):
                share = max(0.0, weights[r]) / total if total else 1.0 / len(ranks)
                end = len(items) if j == len(ranks) - 1 else min(len(items), at + round(share * len(items)))
                self._own[r].extend(items[at:end])
                at = end
        else:
            self._shared.extend(items)

    def take(self, rank: int, n: int) -> list[Batch]:
        """Up to ``n`` batches for ``rank`` (orphans first); an empty list when nothing is left for it."""
        if rank not in self.live:
            return []
        out: list[Batch] = []
        while len(out) < n:
            if self._orphans:
                out.append(self._orphans.popleft())
                continue
            source = self._own[rank] if self.own_slices else self._shared
            if not source:
                if self._next_epoch >= self.num_epochs:
                    break
                self._generate()
                continue
            out.append(source.popleft())
        self._held[rank].extend(out)
        return out

    def complete(self, rank: int, item: Batch) -> bool:
        """Mark ``item`` done by ``rank``; False if ``rank`` did not hold it (a late report: ignore it)."""
        held = self._held[rank]
        if held and held[0] == item:
            held.popleft()
            return True
        try:
            held.remove(item)
        except ValueError:
            return False
        return True

    def held(self, rank: int) -> int:
        return len(self._held[rank])

    def drop(self, rank: int) -> int:
        """Rank ``rank`` is gone for good: its unfinished and future batches go to the others. Returns how
        many."""
        self.live.discard(rank)
        moved = list(self._held[rank]) + list(self._own[rank])
        self._held[rank].clear()
        self._own[rank].clear()
        self._orphans.extend(moved)
        return len(moved)

    def has_orphans(self) -> bool:
        return bool(self._orphans)

    def exhausted(self) -> bool:
        """Nothing is left to hand out to anyone."""
        return (
            not self._orphans
            and not self._shared
            and self._next_epoch >= self.num_epochs
            and not any(self._own[r] for r in self.live)
        )

    def all_complete(self) -> bool:
        return self.exhausted() and not any(self._held[r] for r in self.live)
