"""CPU-backend averaging rounds on the coordinator: collect snapshots, leave out the silent, average.

Why it exists: this is what makes the CPU backend tolerant. The workers write a snapshot into their
shared-memory slot when the status board says the round fires, tell the coordinator, and keep training; the
coordinator waits for the snapshots of the ranks taking part, but only for a bounded time after the first one
arrived (a worker that does not answer by then is left out of that round). :class:`CpuRounds` holds the
snapshots' metadata (the tensors stay in the slots) and decides when a round closes; :class:`Averager` is the
thread that averages a closed round in place (parameters weighted by the batches each rank ran, so a rank that
ran none has weight 0; under SYNC gradients weighted by samples; buffers plainly), measures how far the replicas
drifted apart, and sends the result back, off the thread that hands out batches.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .slots import Slots, average_into

__all__ = ["Snapshot", "RoundResult", "CpuRounds", "AverageJob", "Averager"]


@dataclass
class Snapshot:
    rank: int
    round: int
    batches: int
    samples: int
    wall_ms: float
    sync_ms: float
    done: bool
    others: dict
    present: Optional[list[bool]] = None


@dataclass
class RoundResult:
    round: int
    participants: list[int]
    left_out: list[int]
    snapshots: dict[int, Snapshot]

    @property
    def all_done(self) -> bool:
        return all(s.done for s in self.snapshots.values())

    @property
    def batches(self) -> int:
        return sum(s.batches for s in self.snapshots.values())


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

    def ready(self, expected: set[int], now: Optional[float] = None, timeout_s: Optional[float] = None) -> bool:
        """The current round can close: every expected rank answered, or the timeout ran out (with >= 1
        answer)."""
        got = self._snaps.get(self.current, {})
        if not got:
            return False
        if not self.waiting_for(expected):
            return True
        now = time.monotonic() if now is None else now
        limit = self.round_timeout_s if timeout_s is None else timeout_s
        return now - self._first_at[self.current] >= limit

    def close(self, expected: set[int]) -> RoundResult:
        """Close the current round with the snapshots of ranks still expected, and move to the next round."""
        k = self.current
        got = {r: s for r, s in self._snaps.pop(k, {}).items() if r in expected}
        self._first_at.pop(k, None)
        self.current += 1
        if not got:
            raise RuntimeError(f"round {k} has no snapshot from a live worker")
        ranks = sorted(got)
        return RoundResult(k, ranks, sorted(set(expected) - set(ranks)), got)


@dataclass
class AverageJob:
    """What the averager needs for one closed round (everything copied: the coordinator moves on)."""

    result: RoundResult
    sync: bool
    n_weighted: int
    global_step: int
    final: bool
    recipients: list[int]
    want_state: bool
    noise: Optional[tuple[list[float], list[float], float]] = None
    """SYNC, set by the averager: ``(|G_r|^2 per participant, their samples, |G_big|^2)`` for
    :meth:`flodl_hf.elche.noise_scale.NoiseScale.update`."""


class Averager:
    """The thread that averages closed rounds into the slots and answers the workers.

    ``send(rank, msg)`` puts a command on a worker's queue; ``build_state(avg_vector, others)`` turns an average
    into a state dict (only when a checkpoint or the result needs one). Results come back on ``done`` as
    ``(job, divergence, state_or_None)``; an exception ends the thread and comes back as ``(job, exc, None)``."""

    def __init__(self, slots: Slots, send: Callable[[int, tuple], None],
                 build_state: Callable[[Any, dict], Any]) -> None:
        self.slots = slots
        self.send = send
        self.build_state = build_state
        self.jobs: "queue.Queue[Optional[AverageJob]]" = queue.Queue()
        self.done: "queue.Queue[tuple]" = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="flodl-hf-averager", daemon=True)
        self.thread.start()

    def submit(self, job: AverageJob) -> None:
        self.jobs.put(job)

    def close(self, timeout: float = 10.0) -> None:
        self.jobs.put(None)
        self.thread.join(timeout)

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            try:
                self.done.put(self._average(job))
            except BaseException as exc:  # noqa: BLE001 - handed to the coordinator
                self.done.put((job, exc, None))
                return

    def _average(self, job: AverageJob) -> tuple:
        res = job.result
        snaps = [res.snapshots[r] for r in res.participants]
        weights = [float(s.samples if job.sync else s.batches) for s in snaps]
        out = self.slots.begin_write(res.round)
        norms: Optional[dict] = {} if job.sync else None
        divergence = average_into(out, [self.slots.snap[r] for r in res.participants], weights, job.n_weighted,
                                  divergence=not job.sync, norms=norms)  # SYNC averages gradients: nothing drifted
        if norms:
            job.noise = (norms["sources"], weights, norms["average"])
        self.slots.end_write(res.round)
        present = None
        if job.sync:
            present = [any(flags) for flags in zip(*[s.present or [] for s in snaps])]
        state = None
        if job.want_state:
            others = dict(res.snapshots[res.participants[0]].others)
            state = self.build_state(out, others)
        for r in job.recipients:
            self.send(r, ("avg", res.round, list(res.participants), job.global_step, present, job.final))
        return job, divergence, state
