"""The divergence guard and the anchor control that applies its verdicts to El Che.

Why it exists: local SGD averages replicas that trained apart for a whole window. If they drift apart (a high
learning rate, a large anchor, very different data), averaging them mixes unrelated solutions. After every
average the workers measure how far each rank's pre-average parameters were from the average, ``||p_r - avg||
/ ||avg||``; the guard watches the largest of these values:

- above the threshold and rising (not lower than the previous round's value): the anchor may not grow (El
  Che's own overhead rule is undone for that round);
- above ``4 x threshold``: the anchor is halved (at least 1), so replicas are averaged more often.

El Che itself is the pure scheduler; :class:`AnchorControl` changes its anchor only through ``ElChe.set_anchor``,
which lowers El Che's floor when the guard goes below the initial anchor (builder mode's default floor).
"""

from __future__ import annotations

from collections import deque
from typing import Optional, Sequence

from ..elche.scheduler import ElChe

__all__ = ["DivergenceGuard", "AnchorControl", "OK", "HOLD", "SHRINK"]

OK, HOLD, SHRINK = "ok", "hold", "shrink"
_SHRINK_FACTOR = 4.0


class DivergenceGuard:
    """Verdicts on the per-round divergence: ``OK``, ``HOLD`` (no anchor growth) or ``SHRINK`` (halve it)."""

    def __init__(self, threshold: float, *, shrink_factor: float = _SHRINK_FACTOR, window: int = 3) -> None:
        if not threshold > 0:
            raise ValueError(
                f"divergence threshold={threshold!r} is invalid: use a positive relative distance"
            )
        self.threshold = float(threshold)
        self.shrink_factor = float(shrink_factor)
        self.history: deque[float] = deque(maxlen=window)
        self.actions: list[tuple[float, str]] = []

    def observe(self, value: float) -> str:
        previous = self.history[-1] if self.history else None
        self.history.append(float(value))
        if value > self.shrink_factor * self.threshold:
            verdict = SHRINK
        elif value > self.threshold and (previous is None or value >= previous):
            verdict = HOLD
        else:
            verdict = OK
        if verdict != OK:
            self.actions.append((float(value), verdict))
        return verdict


class AnchorControl:
    """Owns the coordinator's El Che (builder mode) and applies the guard's verdicts to its anchor."""

    def __init__(
        self,
        world: int,
        *,
        anchor: int,
        max_anchor: int,
        overhead_target: float,
        max_batch_diff: Optional[int],
        guard: Optional[DivergenceGuard],
    ) -> None:
        self.world = world
        self._kw = {
            "max_anchor": max_anchor,
            "overhead_target": overhead_target,
            "max_batch_diff": max_batch_diff,
        }
        self.guard = guard
        self.el = ElChe(self.world, mode="builder", anchor=anchor, min_anchor=anchor, **self._kw)  # type: ignore[arg-type]
        self.anchors: list[int] = [self.el.anchor]

    @property
    def anchor(self) -> int:
        return self.el.anchor

    def counts(self) -> list[int]:
        return self.el.counts()

    def threshold_ms(self, live: Sequence[int]) -> Optional[float]:
        """CADENCE's window in ms (``anchor * max ms_per_batch`` over live ranks), None before calibration."""
        if not self.el.calibrated:
            return None
        ms = [self.el.ms_per_unit[r] for r in live]
        known = [m for m in ms if m is not None]
        return self.el.anchor * max(known) if known else None

    def report(
        self, wall_ms: Sequence[float], work: Sequence[float], sync_ms: float, divergence: Optional[float]
    ) -> str:
        """Feed one round to El Che, then let the guard hold or shrink the anchor. Returns the verdict."""
        before = self.el.anchor
        self.el.report(list(wall_ms), list(work), sync_ms)
        verdict = OK
        if self.guard is not None and divergence is not None and self.el.enabled:
            verdict = self.guard.observe(divergence)
            if verdict == SHRINK:
                self.set_anchor(max(1, min(before, self.el.anchor) // 2))
            elif verdict == HOLD and self.el.anchor > before:
                self.set_anchor(before)
        self.anchors.append(self.el.anchor)
        return verdict

    def set_anchor(self, anchor: int) -> None:
        """Move the anchor (lowering El Che's floor if needed) and recompute the counts."""
        self.el.set_anchor(anchor)
