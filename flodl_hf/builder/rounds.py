"""CPU-backend averaging rounds on the coordinator: collect snapshots, leave out the silent, average.

Why it exists: this is what makes the CPU backend tolerant. The workers send a snapshot when the status board
says the round fires and keep training; the coordinator waits for the snapshots of the ranks taking part, but
only for ``round_timeout_s`` after the first one arrived (a worker that does not answer by then is left out of
that round), averages what it has (parameters weighted by batches run, at least 1; buffers plainly), measures
each rank's divergence from the average, and the coordinator sends the result back. Nothing here touches a
process or a queue, so the rules are tested with plain tensors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch

from .state import relative_distance, weighted_mean

__all__ = ["Snapshot", "RoundResult", "CpuRounds"]


@dataclass
class Snapshot:
    rank: int
    round: int
    batches: int
    wall_ms: float
    sync_ms: float
    done: bool
    params: torch.Tensor
    buffers: torch.Tensor
    others: dict


@dataclass
class RoundResult:
    round: int
    params: torch.Tensor
    buffers: torch.Tensor
    others: dict
    participants: list[int]
    left_out: list[int]
    divergence: float
    snapshots: dict[int, Snapshot]

    @property
    def all_done(self) -> bool:
        return all(s.done for s in self.snapshots.values())


class CpuRounds:
    """Snapshots of the round being collected (rounds close in order, one at a time)."""

    def __init__(self, round_timeout_s: float) -> None:
        self.round_timeout_s = float(round_timeout_s)
        self.current = 0
        self._snaps: dict[int, dict[int, Snapshot]] = {}
        self._first_at: dict[int, float] = {}

    def add(self, snap: Snapshot, now: Optional[float] = None) -> bool:
        """Keep a snapshot; False (dropped) if its round is already closed."""
        if snap.round < self.current:
            return False
        self._snaps.setdefault(snap.round, {})[snap.rank] = snap
        self._first_at.setdefault(snap.round, time.monotonic() if now is None else now)
        return True

    def waiting_for(self, expected: set[int]) -> set[int]:
        return set(expected) - set(self._snaps.get(self.current, {}))

    def ready(self, expected: set[int], now: Optional[float] = None) -> bool:
        """The current round can close: every expected rank answered, or the timeout ran out (with >= 1
        answer)."""
        got = self._snaps.get(self.current, {})
        if not got:
            return False
        if not self.waiting_for(expected):
            return True
        now = time.monotonic() if now is None else now
        return now - self._first_at[self.current] >= self.round_timeout_s

    def close(self, expected: set[int]) -> RoundResult:
        """Average the current round's snapshots (from ranks still expected) and move to the next round."""
        k = self.current
        got = {r: s for r, s in self._snaps.pop(k, {}).items() if r in expected}
        self._first_at.pop(k, None)
        self.current += 1
        if not got:
            raise RuntimeError(f"round {k} has no snapshot from a live worker")
        ranks = sorted(got)
        snaps = [got[r] for r in ranks]
        params = weighted_mean([s.params for s in snaps], [max(1, s.batches) for s in snaps])
        if snaps[0].buffers.numel():
            buffers = torch.stack([s.buffers for s in snaps]).mean(dim=0)
        else:
            buffers = snaps[0].buffers.clone()
        divergence = max(relative_distance(s.params, params) for s in snaps)
        return RoundResult(
            k,
            params,
            buffers,
            dict(snaps[0].others),
            ranks,
            sorted(set(expected) - set(ranks)),
            divergence,
            got,
        )
