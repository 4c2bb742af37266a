"""The status board: a small shared-memory table through which the workers agree on *when* to average.

Why it exists: with the collective (NCCL/gloo) backend every worker must enter the same all-reduce, but asking
the coordinator after every batch would add a round trip to the critical path, and a fast rank that has
reached its count should keep working (ASYNC) rather than wait for a message. So each worker publishes its
progress in the current round (round index, batches, compute ms, done flag) in its own row, the coordinator
publishes the plan of each round (El Che counts or the CADENCE time threshold, and which ranks take part), and
every worker evaluates the same monotone predicate, :func:`round_ready`, after each batch. Because a plan is
immutable once posted for a round and rows only grow within a round, all workers reach the same decision, at
most one batch apart, with no message on the critical path. The CPU backend uses the same predicate to decide
when to send a snapshot.

Each row and the plan are written by a single process and guarded by a sequence lock (odd while writing), so a
reader never sees a half-written record and a worker killed mid-write cannot leave a lock held.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

__all__ = ["Board", "Plan", "Row", "round_ready", "must_wait"]

_ROW = 7  # seq, round, batches, wall_ms, done, fired, total
_PLAN_HEAD = 7  # seq, round, static, threshold_ms (-1: count-based), max_ahead, batch_diff, hold_rank (-1: none)


@dataclass(frozen=True)
class Row:
    """One worker's progress in its current averaging round."""

    round: int
    batches: int
    wall_ms: float
    done: bool
    fired: int = -1
    """The last round this rank found ready and entered (sticky: once one rank fires a round, all do)."""
    total: int = 0
    """Batches this rank has run in the whole run (every round): the others read it to place their LR schedule at
    the global step, the batches run anywhere so far (CADENCE and ASYNC)."""


@dataclass(frozen=True)
class Plan:
    """When round ``round`` fires. ``static`` plans (SYNC) hold for every later round too."""

    round: int
    counts: tuple[int, ...]
    mask: tuple[bool, ...]
    threshold_ms: Optional[float] = None
    max_ahead: Optional[int] = None
    static: bool = False
    batch_diff: Optional[int] = None
    hold_rank: Optional[int] = None
    """ASYNC: the slowest rank stops at its count instead of starting one more batch (its batch is the longest,
    so its overshoot is what the faster ranks would wait for in the all-reduce)."""

    def applies_to(self, k: int) -> bool:
        return self.round <= k if self.static else self.round == k


def round_ready(plan: Optional[Plan], rows: Sequence[Row], k: int, sync: bool = False) -> bool:
    """True when round ``k`` fires (el-che.md, builder-mode triggers and hold-back rules).

    Held back while the plan of round ``k`` is not posted (the previous round is still running) or while a
    taking part rank has run zero batches in the round. A rank already past round ``k`` or done with all its
    work counts as ready, and so does a rank that :func:`must_wait` holds back (it cannot run another batch
    before this round fires, so waiting for it to reach the trigger would deadlock). Because a held-back rank
    can be released by another rank's progress, the predicate alone is not monotone: a rank that finds the
    round ready records it (``Row.fired``) before it acts, and every rank then treats the round as fired.
    Otherwise: CADENCE (threshold set) needs ``wall_ms >= threshold``; count-based plans (SYNC, ASYNC, CADENCE
    before calibration) need ``batches >= counts[rank]``.
    """
    if plan is None or not plan.applies_to(k):
        return False
    live = [q for q, on in enumerate(plan.mask) if on]
    if not live:
        return False
    if any(rows[q].fired >= k for q in live):  # another rank already decided: the decision is sticky
        return True
    for q in live:
        row = rows[q]
        if row.round > k:
            continue
        if row.round < k:
            return False
        if row.done:
            continue
        if row.batches < 1:
            return False
        if must_wait(plan, rows, q, sync):
            continue
        if plan.threshold_ms is not None:
            if row.wall_ms < plan.threshold_ms:
                return False
        elif row.batches < plan.counts[q]:
            return False
    return True


def must_wait(plan: Optional[Plan], rows: Sequence[Row], rank: int, sync: bool) -> bool:
    """True when a worker must not start another batch before the round fires.

    SYNC runs exactly one batch per round (plain synchronous data parallelism). ``max_ahead`` (max_overshoot):
    at most that many batches beyond the rank's count. ``batch_diff`` (max_batch_diff): at most that many
    batches more than the slowest taking-part rank in this round. The slowest rank is never held back by
    ``batch_diff``, and a held-back rank counts as ready in :func:`round_ready`, so no combination deadlocks.
    """
    row = rows[rank]
    if row.done:
        return False
    if sync:
        return row.batches >= 1
    if plan is None or not plan.applies_to(row.round):
        return False
    if plan.max_ahead is not None and row.batches >= plan.counts[rank] + plan.max_ahead:
        return True
    if plan.hold_rank == rank and row.batches >= plan.counts[rank]:
        return True
    if plan.batch_diff is not None:
        others = [
            rows[q].batches for q, on in enumerate(plan.mask)
            if on and q != rank and rows[q].round == row.round and not rows[q].done
        ]
        if others and row.batches >= min(others) + plan.batch_diff:
            return True
    return False


class Board:
    """The shared table: ``world`` rows plus one plan. Build it with ``Board.create(world, ctx)``."""

    def __init__(self, world: int, array: Any) -> None:
        self.world = int(world)
        self.array = array
        self._plan_at = self.world * _ROW

    @staticmethod
    def size(world: int) -> int:
        return world * _ROW + _PLAN_HEAD + 2 * world

    @classmethod
    def create(cls, world: int, ctx: Any = None) -> "Board":
        """A board in shared memory (``ctx.RawArray``), or in plain memory when ``ctx`` is None (tests)."""
        if ctx is None:
            import array

            return cls(world, array.array("d", [0.0] * cls.size(world)))
        return cls(world, ctx.RawArray("d", cls.size(world)))

    # -- sequence-locked records -----------------------------------------------------------------------------
    def _write(self, base: int, values: Sequence[float]) -> None:
        a = self.array
        seq = a[base]
        a[base] = seq + 1.0  # odd: writing
        for i, v in enumerate(values):
            a[base + 1 + i] = float(v)
        a[base] = seq + 2.0

    def _read(self, base: int, n: int) -> list[float]:
        """A consistent copy of one record. A writer finishes in microseconds; if the sequence stays odd, the
        writer was killed mid-write: its record no longer matters (the coordinator drops it), so return it as
        is rather than wait forever."""
        a = self.array
        values: list[float] = []
        for attempt in range(2000):
            s1 = a[base]
            values = list(a[base + 1 : base + 1 + n])
            if int(s1) % 2 == 0 and a[base] == s1:
                return values
            if attempt > 100:
                time.sleep(0.0001)
        return values

    # -- rows ------------------------------------------------------------------------------------------------
    def write_row(self, rank: int, row: Row) -> None:
        self._write(rank * _ROW, (row.round, row.batches, row.wall_ms, 1.0 if row.done else 0.0, row.fired + 1,
                                  row.total))

    def read_row(self, rank: int) -> Row:
        r, b, w, d, f, t = self._read(rank * _ROW, _ROW - 1)
        return Row(int(r), int(b), w, d > 0.5, int(f) - 1, int(t))  # fired stored + 1: a fresh row fired nothing

    def read_rows(self, only: Optional[Sequence[bool]] = None) -> list[Row]:
        """Every row, or only those where ``only[q]`` is true (the others read as an empty row), so that a
        dropped worker's row is never read again."""
        empty = Row(0, 0, 0.0, False, -1, 0)
        return [self.read_row(q) if only is None or only[q] else empty for q in range(self.world)]

    # -- plan ------------------------------------------------------------------------------------------------
    def post_plan(self, plan: Plan) -> None:
        if len(plan.counts) != self.world or len(plan.mask) != self.world:
            raise ValueError(f"a plan needs {self.world} counts and mask entries")
        head = (
            plan.round,
            1.0 if plan.static else 0.0,
            -1.0 if plan.threshold_ms is None else plan.threshold_ms,
            -1.0 if plan.max_ahead is None else plan.max_ahead,
            -1.0 if plan.batch_diff is None else plan.batch_diff,
            -1.0 if plan.hold_rank is None else plan.hold_rank,
        )
        self._write(
            self._plan_at,
            head + tuple(float(c) for c in plan.counts) + tuple(1.0 if m else 0.0 for m in plan.mask),
        )

    def read(self) -> tuple[Optional[Plan], list[Row]]:
        """The plan and the rows it still counts (a dropped worker's row reads as empty): a worker's one read
        of the board per pass, for both of its decisions."""
        plan = self.read_plan()
        return plan, self.read_rows(only=plan.mask if plan is not None else None)

    def read_plan(self) -> Optional[Plan]:
        """The posted plan, or None before the first one."""
        if self.array[self._plan_at] == 0.0:
            return None
        v = self._read(self._plan_at, _PLAN_HEAD - 1 + 2 * self.world)
        w = self.world
        return Plan(
            round=int(v[0]),
            static=v[1] > 0.5,
            threshold_ms=None if v[2] < 0 else v[2],
            max_ahead=None if v[3] < 0 else int(v[3]),
            batch_diff=None if v[4] < 0 else int(v[4]),
            hold_rank=None if v[5] < 0 else int(v[5]),
            counts=tuple(int(c) for c in v[6 : 6 + w]),
            mask=tuple(m > 0.5 for m in v[6 + w : 6 + 2 * w]),
        )
