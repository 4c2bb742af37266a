"""Per-epoch bookkeeping on the coordinator: turns per-batch reports into ``EpochMetrics``.

It exists apart from the coordinator so the arithmetic (batch-weighted loss, shares, throughput, scalar means)
is testable with plain numbers and shared by the multi-worker coordinator and the single-device runner. Epochs
are pipelined, so an epoch is complete when all of its batches are reported, and epochs are emitted in order.
"""

from __future__ import annotations

import time
from typing import Optional

from .types import EpochMetrics

__all__ = ["EpochBook"]


class _Epoch:
    def __init__(self, world: int) -> None:
        self.done = 0
        self.skipped = 0
        self.loss_sum = 0.0
        self.batches = [0] * world
        self.samples = [0] * world
        self.scalars: list[dict[str, list[float]]] = [{} for _ in range(world)]  # name -> [sum, count]


class EpochBook:
    """Collects batch reports; :meth:`completed` returns the epochs finished since the last call, in order."""

    def __init__(
        self,
        num_epochs: int,
        batches_per_epoch: int,
        world: int,
        devices: list[str],
        start: Optional[float] = None,
        first_epoch: int = 0,
        skipped: frozenset = frozenset(),
    ) -> None:
        self.num_epochs = num_epochs
        self.batches_per_epoch = batches_per_epoch
        self.world = world
        self.devices = list(devices)
        self._epochs = [_Epoch(world) for _ in range(num_epochs)]
        self._next = int(first_epoch)  # a resumed run reports from the epoch after its checkpoint's
        for epoch, _ in skipped:  # ... whose checkpoint's model already holds these batches: they are not run
            self._epochs[epoch].skipped += 1
        self._last_done = time.perf_counter() if start is None else start

    def restart_clock(self, now: Optional[float] = None) -> None:
        """Training starts now (the workers are up): epoch 0's time is measured from here."""
        self._last_done = time.perf_counter() if now is None else now

    def record(
        self,
        rank: int,
        epoch: int,
        loss: float,
        samples: int,
        scalars: Optional[dict[str, list[float]]] = None,
    ) -> None:
        ep = self._epochs[epoch]
        ep.done += 1
        ep.loss_sum += float(loss)
        ep.batches[rank] += 1
        ep.samples[rank] += int(samples)
        for name, values in (scalars or {}).items():
            acc = ep.scalars[rank].setdefault(name, [0.0, 0])
            acc[0] += sum(values)
            acc[1] += len(values)

    def _complete(self, ep: _Epoch) -> bool:
        return ep.done + ep.skipped >= self.batches_per_epoch

    @property
    def epochs_done(self) -> int:
        return self._next

    def completed(self, now: Optional[float] = None, **extra: object) -> list[EpochMetrics]:
        """Metrics of every epoch whose batches are all reported (``extra`` fills anchor, rounds, ...)."""
        out: list[EpochMetrics] = []
        now = time.perf_counter() if now is None else now
        while self._next < self.num_epochs and self._complete(self._epochs[self._next]):
            ep = self._epochs[self._next]
            epoch_ms = max(1e-6, (now - self._last_done) * 1000.0)
            self._last_done = now
            totals: dict[str, list[float]] = {}
            per_rank: list[dict[str, float]] = []
            for rank_scalars in ep.scalars:
                per_rank.append({k: s / c for k, (s, c) in rank_scalars.items() if c})
                for k, (s, c) in rank_scalars.items():
                    acc = totals.setdefault(k, [0.0, 0])
                    acc[0] += s
                    acc[1] += c
            out.append(
                EpochMetrics(
                    epoch=self._next,
                    avg_loss=ep.loss_sum / max(1, ep.done),
                    epoch_ms=epoch_ms,
                    scalars={k: s / c for k, (s, c) in totals.items() if c},
                    per_rank_scalars=per_rank,
                    per_rank_throughput=[s * 1000.0 / epoch_ms for s in ep.samples],
                    per_rank_batch_share=[b / max(1, ep.done) for b in ep.batches],
                    devices=list(self.devices),
                    per_rank_batches=list(ep.batches),
                    samples=sum(ep.samples),
                    **extra,  # type: ignore[arg-type]
                )
            )
            self._epochs[self._next] = _Epoch(0)  # free the per-rank lists
            self._next += 1
        return out
