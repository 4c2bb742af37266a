"""El Che: the heterogeneous cadence scheduler (pure Python, no torch).

Why this module exists: plain synchronous data parallelism runs every rank at the
slowest one's pace, so mixed devices deliver ``N * min(rate)`` instead of
``sum(rate)``. El Che measures each rank's speed, keeps the window length (the
*anchor*) and says how much work each rank does in the next window, so fast
ranks work instead of waiting. It is a small deterministic state machine:
every rank feeds it the same all-gathered timings and computes the same plan,
so no coordinator is needed. See ``design/el-che.md`` for the exact rules.

Setup mode splits micro-batch *sizes* (:meth:`ElChe.batch_sizes`, summing to
``world_size * batch_size``; every rank runs ``anchor`` micro-batches per window);
builder mode splits batch *counts* (:meth:`ElChe.counts`; the slowest rank runs ``anchor``).
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from collections.abc import Sequence
from typing import Any

__all__ = ["ElChe", "round_half_up"]

_MODES = ("setup", "builder")
_DEAD_ZONE = 0.10  # keep a previous value unless the new one differs by more than this fraction
_SETUP_DEAD_ZONE = 0.02  # setup: keep the previous sizes while their predicted window time is this close
_HISTORY_LEN = 1000  # history entries kept (oldest dropped)
_CEIL_TOL = 1e-9  # absorbs float noise in ceil(A * ov / tau), e.g. 50.000000000000007 -> 50
_STATE_VERSION = 1


def round_half_up(x: float) -> int:
    """Round half away from zero: ``floor(x + 0.5)`` for x >= 0, mirrored for x < 0.

    Never banker's rounding: ``round_half_up(2.5) == 3``, ``round_half_up(-2.5) == -3``.
    """
    if not math.isfinite(x):
        raise ValueError(f"x={x!r} cannot be rounded: pass a finite number")
    if x >= 0:
        return math.floor(x + 0.5)
    return -math.floor(-x + 0.5)


def _is_int(v: object) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _check_int(name: str, value: object, minimum: int, fix: str) -> None:
    if not _is_int(value) or value < minimum:  # type: ignore[operator]
        raise ValueError(f"{name}={value!r} is invalid: {fix}")


def _largest_remainder(quotas: Sequence[float], total: int) -> list[int]:
    """Integers summing exactly to ``total``, each >= 1, close to ``quotas``.

    Floors first, then one extra unit each to the largest fractional parts (ties:
    lower rank). A rank left at 0 takes one unit from the most over-allocated
    rank (largest ``b - quota``, ties: lower rank) that has more than 1.
    """
    out = [math.floor(q) for q in quotas]
    order = sorted(range(len(quotas)), key=lambda r: (-(quotas[r] - out[r]), r))
    for r in order[: total - sum(out)]:
        out[r] += 1
    for r in range(len(out)):
        if out[r] < 1:
            donor = max((q for q in range(len(out)) if out[q] > 1), key=lambda q: (out[q] - quotas[q], -q))
            out[donor] -= 1
            out[r] += 1
    return out


class ElChe:
    """Heterogeneous cadence scheduler: anchor (window length) plus per-rank work.

    Call :meth:`report` once per window on every rank with the all-gathered
    per-rank compute times, the work each rank actually did and the sync time;
    then read the next plan from :meth:`batch_sizes` (setup) or :meth:`counts`
    (builder). Decisions are a pure function of the constructor arguments, the
    speed hint and the sequence of reports.

    Disabled El Che (``max_anchor=0`` or ``world_size == 1``) is plain
    synchronous data parallelism: anchor 1, setup sizes ``[batch_size] * W``,
    builder counts ``[1] * W`` (sync after every batch). Reports are still
    counted, recorded in :attr:`history` and measured into :attr:`ms_per_unit`,
    but never change the plan.

    Unmeasured ranks: a rank without a measurement yet is estimated from the
    prior (the speed hint, else the initial ``batch_sizes``, else equal speed)
    scaled by the mean ratio ``m_q / prior_q`` over the measured ranks.

    Setup mode refinements over the design card (measured on the benchmark: a
    10 % per-rank dead zone on ~10-sample micro-batches kept a one-sample error
    for 44 windows, and single contention spikes ratcheted the anchor up):

    - Dead zone: the previous sizes are kept while their predicted window time
      (``max_r b_r * m_r``) is within 2 % of the new plan's; the dead zone applies
      only once the previous plan came from measurements of every rank.
    - Anchor jumps need persistent evidence: the overhead that may raise the
      anchor is the median of the last three measured windows (the smaller of
      two; no jump on a single window), and the latest window must be over
      target too. Decay still reacts to the latest window alone.
    - Warm-up: a rank's first window carries one-time costs, so its second
      measurement replaces the first outright; the EMA applies from then on.
    Builder mode follows the design card exactly (10 % dead zone per count,
    immediate jumps).
    Builder mode: the slowest rank always runs ``anchor`` batches; every other
    count keeps its previous value inside the same 10 % dead zone, and with
    ``max_batch_diff=d`` moves at most ``d`` per report (a speed hint is a seed
    and is not limited).

    Checkpoint behaviour: :meth:`state_dict` saves the dynamic state (anchor,
    smoothed ``ms_per_unit``, speed prior, current plan, window count, frozen
    flag, history) plus ``world_size``, ``mode`` and ``batch_size`` for
    checking. The tuning configuration (``min_anchor``, ``max_anchor``,
    ``overhead_target``, ``max_batch_diff``) is *not* restored: it comes from
    the constructor, so a resumed run may change it; a restored anchor outside
    the new bounds is clamped into them and the plan recomputed. With the same
    configuration a restored object makes exactly the original's future decisions.
    """

    def __init__(
        self,
        world_size: int,
        *,
        mode: str = "setup",
        batch_size: int | None = None,
        anchor: int | None = None,
        min_anchor: int | None = None,
        max_anchor: int | None = None,
        overhead_target: float = 0.10,
        max_batch_diff: int | None = None,
        batch_sizes: list[int] | None = None,
    ) -> None:
        _check_int("world_size", world_size, 1, "pass the number of ranks, an integer >= 1")
        if mode not in _MODES:
            raise ValueError(
                f"mode={mode!r} is unknown: use 'setup' (split micro-batch sizes) or 'builder' (split counts)"
            )
        setup = mode == "setup"
        if setup or batch_size is not None:
            fix = "setup mode needs" if setup else "builder mode takes None or"
            _check_int("batch_size", batch_size, 1, f"{fix} the per-rank micro-batch size, an integer >= 1")
        anchor = (1 if setup else 10) if anchor is None else anchor
        _check_int("anchor", anchor, 1, "use an integer >= 1 (micro-batches or slow-rank batches per window)")
        min_anchor = (1 if setup else anchor) if min_anchor is None else min_anchor
        _check_int("min_anchor", min_anchor, 1, "use an integer >= 1")
        max_anchor = (8 if setup else 200) if max_anchor is None else max_anchor
        _check_int("max_anchor", max_anchor, 0, "use an integer >= 1, or 0 to disable El Che")
        if max_anchor != 0 and min_anchor > max_anchor:
            raise ValueError(
                f"min_anchor={min_anchor} is greater than max_anchor={max_anchor}: raise max_anchor or "
                "lower min_anchor (in builder mode min_anchor defaults to anchor)"
            )
        if max_anchor != 0 and not min_anchor <= anchor <= max_anchor:
            raise ValueError(
                f"anchor={anchor} is outside [min_anchor={min_anchor}, max_anchor={max_anchor}]: "
                "pick an anchor inside the bounds"
            )
        if not isinstance(overhead_target, numbers.Real) or not 0.01 <= overhead_target <= 0.5:
            raise ValueError(
                f"overhead_target={overhead_target!r} is out of range: use a value in [0.01, 0.5] "
                "(fraction of compute time spent synchronising)"
            )
        if max_batch_diff is not None:
            if setup:
                raise ValueError(
                    f"max_batch_diff={max_batch_diff!r} applies to builder mode only: "
                    "remove it or use mode='builder'"
                )
            _check_int("max_batch_diff", max_batch_diff, 1, "use an integer >= 1, or None for no limit")
        if batch_sizes is not None and not setup:
            raise ValueError(
                "batch_sizes is setup-mode only: remove it or use mode='setup' (builder mode splits counts)"
            )

        self._world_size: int = world_size
        self._mode: str = mode
        self._batch_size: int | None = batch_size
        self._min_anchor: int = min_anchor
        self._max_anchor: int = max_anchor
        self._overhead_target: float = float(overhead_target)
        self._max_batch_diff: int | None = max_batch_diff
        self._enabled: bool = max_anchor != 0 and world_size > 1
        self._anchor: int = anchor if self._enabled else 1
        self._ms: list[float | None] = [None] * world_size
        self._measured: list[int] = [0] * world_size  # windows measured per rank
        self._overheads: deque[float] = deque(maxlen=3)  # recent sync/compute ratios (setup mode)
        self._prior: list[float] | None = None  # relative cost per unit, from hint or initial sizes
        self._plan: list[int] = []
        self._plan_calibrated: bool = False
        self._windows: int = 0
        self._frozen: bool = False
        self._history: deque[dict[str, Any]] = deque(maxlen=_HISTORY_LEN)

        total = self._total()
        if batch_sizes is not None:
            sizes = list(batch_sizes)
            if len(sizes) != world_size or any(not _is_int(b) or b < 1 for b in sizes) or sum(sizes) != total:
                raise ValueError(
                    f"batch_sizes={batch_sizes!r} is invalid: give {world_size} integers >= 1 summing to "
                    f"world_size * batch_size = {total}"
                )
            if not self._enabled and sizes != [batch_size] * world_size:
                raise ValueError(
                    f"batch_sizes={batch_sizes!r} cannot be used with El Che disabled (max_anchor=0 or "
                    "world_size=1): remove batch_sizes or set max_anchor >= 1"
                )
            self._prior = [max(sizes) / b for b in sizes]
            self._plan = sizes
        else:
            self._plan = self._compute_plan(dead_zone=False) if self._enabled else self._disabled_plan()

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def enabled(self) -> bool:
        """False when ``max_anchor == 0`` or ``world_size == 1`` (plain synchronous behaviour)."""
        return self._enabled

    @property
    def anchor(self) -> int:
        """Micro-batches (setup) or slow-rank batches (builder) per window."""
        return self._anchor

    @property
    def overhead_target(self) -> float:
        return self._overhead_target

    @property
    def windows(self) -> int:
        """Number of :meth:`report` calls so far."""
        return self._windows

    @property
    def calibrated(self) -> bool:
        """True once every rank has a measured ``ms_per_unit``."""
        return all(m is not None for m in self._ms)

    @property
    def ms_per_unit(self) -> list[float | None]:
        """Smoothed ms per sample (setup) or per batch (builder) per rank; None = not measured yet."""
        return list(self._ms)

    @property
    def shares(self) -> list[float]:
        """Per-rank share of the work, summing to 1, proportional to ``1 / m_r`` (equal when disabled)."""
        if not self._enabled:
            return [1.0 / self._world_size] * self._world_size
        inv = [1.0 / m for m in self._estimates()]
        s = sum(inv)
        return [v / s for v in inv]

    @property
    def frozen(self) -> bool:
        return self._frozen

    @property
    def history(self) -> list[dict[str, Any]]:
        """One entry per report (last 1000): window, overhead, anchor, shares, batch_sizes or counts."""
        return [dict(h) for h in self._history]

    def batch_sizes(self) -> list[int]:
        """Per-rank micro-batch sizes for the next window (setup mode); they sum to ``W * batch_size``."""
        if self._mode != "setup":
            raise ValueError("batch_sizes() is setup-mode only: this El Che is in builder mode, use counts()")
        return list(self._plan)

    def counts(self) -> list[int]:
        """Per-rank batch counts for the next window (builder mode); the slowest rank runs ``anchor``."""
        if self._mode != "builder":
            raise ValueError("counts() is builder-mode only: this El Che is in setup mode, use batch_sizes()")
        return list(self._plan)

    def freeze(self) -> None:
        """Stop adapting: reports are still counted and recorded but change nothing."""
        self._frozen = True

    def unfreeze(self) -> None:
        self._frozen = False

    def speed_hint(self, slow_rank: int, ratio: float) -> None:
        """Declare that every other rank is ``ratio`` times faster than ``slow_rank``.

        Seeds the shares (and the plan, while not every rank is measured) until
        measurements replace it; measured ranks ignore it.
        """
        if not _is_int(slow_rank) or not 0 <= slow_rank < self._world_size:
            raise ValueError(
                f"slow_rank={slow_rank!r} is out of range: use a rank in [0, {self._world_size - 1}]"
            )
        if not isinstance(ratio, numbers.Real) or not math.isfinite(ratio) or ratio < 1:
            raise ValueError(
                f"ratio={ratio!r} is invalid: the speed hint ratio must be >= 1 (how many times faster the "
                "other ranks are than slow_rank); if slow_rank is the fast one, name the slow rank instead"
            )
        self._prior = [float(ratio) if r == slow_rank else 1.0 for r in range(self._world_size)]
        if self._enabled and not self._frozen and not self.calibrated:
            self._plan = self._compute_plan(dead_zone=False)
            self._plan_calibrated = False

    def report(self, wall_ms: Sequence[float], work: Sequence[float], sync_ms: float) -> None:
        """Feed one window's figures (identical on every rank) and compute the next plan.

        ``wall_ms[r]``: rank r's compute time in the window, excluding sync.
        ``work[r]``: samples (setup) or batches (builder) rank r *actually* did.
        ``sync_ms``: all-reduce plus buffer sync time of the window.
        """
        w = self._world_size
        for name, seq in (("wall_ms", wall_ms), ("work", work)):
            if len(seq) != w:
                raise ValueError(f"{name} has {len(seq)} entries: pass one value per rank ({w})")
            for r, v in enumerate(seq):
                if not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
                    raise ValueError(f"{name}[{r}]={v!r} is invalid: pass a finite value >= 0")
        if not isinstance(sync_ms, numbers.Real) or not math.isfinite(sync_ms) or sync_ms < 0:
            raise ValueError(f"sync_ms={sync_ms!r} is invalid: pass a finite time in ms >= 0")

        compute = max(float(x) for x in wall_ms)
        overhead = sync_ms / compute if compute > 0 else None
        if not self._frozen:
            # 1. Speed: EMA with a surprise-adaptive alpha.
            for r in range(w):
                if work[r] > 0 and wall_ms[r] > 0:
                    new = wall_ms[r] / work[r]
                    m = self._ms[r]
                    self._measured[r] += 1
                    if m is None or (self._mode == "setup" and self._measured[r] == 2):
                        self._ms[r] = new
                    else:
                        alpha = min(max(abs(new - m) / m, 0.1), 0.8)
                        self._ms[r] = alpha * new + (1 - alpha) * m
            if self._enabled:
                # 2. Anchor: jump up on overhead, decay by one when well under target.
                tau = self._overhead_target
                if compute > 0 and sync_ms > 0:
                    ov = sync_ms / compute
                    jump_ov = ov
                    if self._mode == "setup":
                        self._overheads.append(ov)
                        recent = sorted(self._overheads)
                        jump_ov = recent[len(recent) // 2] if len(recent) == 3 else (
                            recent[0] if len(recent) == 2 else 0.0)
                    if jump_ov > tau and ov > tau:
                        target = math.ceil(self._anchor * jump_ov / tau - _CEIL_TOL)
                        self._anchor = min(max(target, self._min_anchor), self._max_anchor)
                    elif ov < tau / 2 and self._anchor > self._min_anchor:
                        self._anchor -= 1
                # 3. Shares and the next plan.
                self._plan = self._compute_plan(dead_zone=self._plan_calibrated, limit=True)
                self._plan_calibrated = self.calibrated
        self._windows += 1
        entry: dict[str, Any] = {
            "window": self._windows - 1,
            "overhead": overhead,
            "anchor": self._anchor,
            "shares": self.shares,
            ("batch_sizes" if self._mode == "setup" else "counts"): list(self._plan),
        }
        self._history.append(entry)

    def _total(self) -> int:
        return self._world_size * (self._batch_size or 0)

    def _disabled_plan(self) -> list[int]:
        return [(self._batch_size or 0) if self._mode == "setup" else 1] * self._world_size

    def _estimates(self) -> list[float]:
        """Cost per unit for every rank: measured, else prior scaled to the measured ranks."""
        prior = self._prior or [1.0] * self._world_size
        measured = [(m, prior[r]) for r, m in enumerate(self._ms) if m is not None]
        scale = sum(m / p for m, p in measured) / len(measured) if measured else 1.0
        return [m if m is not None else prior[r] * scale for r, m in enumerate(self._ms)]

    def _compute_plan(self, *, dead_zone: bool, limit: bool = False) -> list[int]:
        prev = self._plan
        est = self._estimates()
        if self._mode == "setup":
            total = self._total()
            inv = [1.0 / m for m in est]
            s = sum(inv)
            new = _largest_remainder([total * v / s for v in inv], total)
            if dead_zone and prev and sum(prev) == total:
                predicted = lambda plan: max(b * m for b, m in zip(plan, est))  # noqa: E731
                if predicted(prev) <= (1.0 + _SETUP_DEAD_ZONE) * predicted(new):
                    return list(prev)
            return new
        a = self._anchor
        slow = max(range(self._world_size), key=lambda r: (est[r], -r))
        new = [max(1, round_half_up(a * est[slow] / est[r])) for r in range(self._world_size)]
        new[slow] = a
        if prev:
            d = self._max_batch_diff if limit else None
            for r in range(self._world_size):
                if r == slow:
                    continue
                if dead_zone and abs(new[r] - prev[r]) <= _DEAD_ZONE * prev[r]:
                    new[r] = prev[r]
                if d is not None:
                    new[r] = max(1, min(max(new[r], prev[r] - d), prev[r] + d))
        return new

    def set_anchor(self, anchor: int) -> None:
        """Move the anchor from outside (e.g. builder mode's divergence guard) and recompute the plan.

        An anchor below ``min_anchor`` lowers the floor to it (the caller asked for a smaller window on purpose);
        one above ``max_anchor`` is a ValueError. Ignored while El Che is disabled.
        """
        _check_int("anchor", anchor, 1, "use an anchor >= 1")
        if not self._enabled:
            return
        if anchor > self._max_anchor:
            raise ValueError(f"anchor={anchor} is above max_anchor={self._max_anchor}: use a value <= max_anchor")
        self._min_anchor = min(self._min_anchor, int(anchor))
        self._anchor = int(anchor)
        self._plan = self._compute_plan(dead_zone=False)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable snapshot; see "Checkpoint behaviour" in the class docstring."""
        return {
            "version": _STATE_VERSION,
            "world_size": self._world_size,
            "mode": self._mode,
            "batch_size": self._batch_size,
            "anchor": self._anchor,
            "ms_per_unit": list(self._ms),
            "measured": list(self._measured),
            "recent_overheads": list(self._overheads),
            "prior": None if self._prior is None else list(self._prior),
            "plan": list(self._plan),
            "plan_calibrated": self._plan_calibrated,
            "windows": self._windows,
            "frozen": self._frozen,
            "history": [dict(h) for h in self._history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` snapshot taken with the same world_size, mode and batch_size."""
        missing = [k for k in self.state_dict() if k not in state]
        if missing:
            raise ValueError(f"state is missing keys {missing}: pass a dict produced by ElChe.state_dict()")
        for key in ("world_size", "mode") + (("batch_size",) if self._mode == "setup" else ()):
            if state[key] != getattr(self, "_" + key):
                raise ValueError(
                    f"state has {key}={state[key]!r} but this El Che has {key}={getattr(self, '_' + key)!r}: "
                    f"build ElChe with {key}={state[key]!r} or start without the checkpoint"
                )
        self._ms = [None if m is None else float(m) for m in state["ms_per_unit"]]
        self._measured = [int(n) for n in state["measured"]]
        self._overheads = deque((float(v) for v in state["recent_overheads"]), maxlen=3)
        self._prior = None if state["prior"] is None else [float(p) for p in state["prior"]]
        self._windows = int(state["windows"])
        self._frozen = bool(state["frozen"])
        self._history = deque((dict(h) for h in state["history"]), maxlen=_HISTORY_LEN)
        if not self._enabled:
            self._anchor, self._plan, self._plan_calibrated = 1, self._disabled_plan(), False
            return
        anchor = int(state["anchor"])
        self._anchor = min(max(anchor, self._min_anchor), self._max_anchor)
        self._plan = [int(v) for v in state["plan"]]
        self._plan_calibrated = bool(state["plan_calibrated"])
        if self._anchor != anchor or len(self._plan) != self._world_size:
            self._plan = self._compute_plan(dead_zone=False)

    def describe(self) -> str:
        """One log line, e.g. ``El Che: anchor 2, shares [0.71, 0.29], batch sizes [23, 9]``."""
        what = "batch sizes" if self._mode == "setup" else "counts"
        shares = "[" + ", ".join(f"{s:.2f}" for s in self.shares) + "]"
        if not self._enabled:
            why = "max_anchor=0" if self._max_anchor == 0 else "world_size=1"
            return f"El Che: off ({why}), plain synchronous, anchor 1, {what} {self._plan}"
        tags = ("" if self.calibrated else ", uncalibrated") + (", frozen" if self._frozen else "")
        return f"El Che: anchor {self._anchor}, shares {shares}, {what} {self._plan}{tags}"
