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
import statistics
from collections import deque
from collections.abc import Sequence
from typing import Any, Optional

from .split import largest_remainder as _largest_remainder
from .split import water_fill as _water_fill
from .goodput import combined_anchor
from .lr_scaling import LR_SCALINGS, ScheduleClock
from .noise_scale import WindowNoise

__all__ = ["ElChe", "round_half_up"]

_MODES = ("setup", "builder")
_DEAD_ZONE = 0.10  # keep a previous value unless the new one differs by more than this fraction
_SETUP_DEAD_ZONE = 0.02  # setup: keep the previous sizes while their predicted window time is this close
_SETUP_CONFIRM = 0.10  # setup: a re-split gaining less than this must be proposed by two windows in a row
_SPEED_WINDOWS = 3  # setup: a rank's speed is the median of its last this many windows (one spike is ignored)
_HISTORY_LEN = 1000  # history entries kept (oldest dropped)
_CEIL_TOL = 1e-9  # absorbs float noise in ceil(A * ov / tau), e.g. 50.000000000000007 -> 50
_OVERHEAD_WINDOWS = 5  # setup: per-micro-batch overheads kept for the median
_OVERHEAD_MIN = 3  # setup: the anchor moves only once this many windows are measured
_NOISE_MIN = 3  # setup: windows of noise estimate before goodput trusts it
_ANCHOR_RULES = ("goodput", "throughput")
_DEFAULT_TAU = 0.10  # builder mode and the throughput rule
_STATE_VERSION = 3  # 3: gradient noise state; 2: setup overheads per micro-batch (1: sync / compute at anchor)


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

    Setup mode refinements over the design card (measured: a 10 % per-rank dead
    zone on ~10-sample micro-batches kept a one-sample error for 44 windows, one
    contention spike ratcheted the anchor up, and multiplying the anchor by an
    overhead measured at a smaller one settled at 7 where 5 meets the target):

    - Dead zone: the previous sizes are kept while their predicted window time
      (``max_r b_r * m_r``) is within 2 % of the new plan's; the dead zone applies
      only once the previous plan came from measurements of every rank.
    - Anchor, per micro-batch: a window records ``o1 = sync_ms * n / max_r wall_r``
      (n micro-batches), its overhead at anchor 1. Sync does not grow with the
      anchor, compute does, so ``o1 / A`` predicts the overhead at any A and
      windows run at different anchors compare. From three windows on the anchor
      follows ``anchor_rule`` on ``median(o1)`` (last five windows: one spike is
      ignored). ``"goodput"`` (default): throughput x statistical efficiency from
      the gradient noise scale (``flodl_hf.elche.goodput``, ``flodl_hf.elche.noise_scale``),
      ``overhead_target`` (if set) a floor; ``"throughput"``: the overhead rule
      alone (tau 0.10 by default). The noise estimate is updated by every report
      that carries one, even frozen or disabled (a measurement, in :attr:`history`).
    - Memory caps (``max_batch_sizes``): rank r never gets more than its cap;
      what it cannot take goes to the other ranks in proportion to their speed.
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
    flag, history, the smoothed gradient-noise estimate) plus ``world_size``, ``mode`` and ``batch_size`` for
    checking. The tuning configuration (``min_anchor``, ``max_anchor``,
    ``overhead_target``, ``anchor_rule``, ``max_batch_diff``, ``max_batch_sizes``) is *not*
    restored: it comes from the constructor, so a resumed run may change it; a
    restored anchor outside the new bounds is clamped into them and the plan
    recomputed, as is a restored plan above the caps. With the same
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
        overhead_target: Optional[float] = None,
        anchor_rule: Optional[str] = None,
        max_batch_diff: int | None = None,
        batch_sizes: list[int] | None = None,
        max_batch_sizes: list[int] | None = None,
        lr_scaling: str = "none",
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
        rule = ("goodput" if setup else "throughput") if anchor_rule is None else anchor_rule
        if rule not in _ANCHOR_RULES or (rule == "goodput" and not setup):
            raise ValueError(
                f"anchor_rule={anchor_rule!r} is invalid for {mode} mode: use 'goodput' (setup mode: throughput x "
                "statistical efficiency) or 'throughput' (the overhead_target rule; builder mode's only rule)"
            )
        if overhead_target is None and rule == "throughput":
            overhead_target = _DEFAULT_TAU
        if overhead_target is not None and (
            not isinstance(overhead_target, numbers.Real) or not 0.01 <= overhead_target <= 0.5
        ):
            raise ValueError(
                f"overhead_target={overhead_target!r} is out of range: use a value in [0.01, 0.5] "
                "(fraction of compute time spent synchronising), or None for no ceiling (goodput rule)"
            )
        if lr_scaling not in LR_SCALINGS or (lr_scaling != "none" and not setup):
            raise ValueError(
                f"lr_scaling={lr_scaling!r} is invalid for {mode} mode: use 'none' (the user's LR) or, in setup "
                "mode only, 'adascale' (the LR follows AdaScale's gain when the window grows)"
            )
        if max_batch_diff is not None:
            if setup:
                raise ValueError(
                    f"max_batch_diff={max_batch_diff!r} applies to builder mode only: "
                    "remove it or use mode='builder'"
                )
            _check_int("max_batch_diff", max_batch_diff, 1, "use an integer >= 1, or None for no limit")
        for name, value in (("batch_sizes", batch_sizes), ("max_batch_sizes", max_batch_sizes)):
            if value is not None and not setup:
                raise ValueError(
                    f"{name} is setup-mode only: remove it or use mode='setup' (builder mode splits counts)"
                )

        self._world_size: int = world_size
        self._mode: str = mode
        self._batch_size: int | None = batch_size
        self._min_anchor: int = min_anchor
        self._max_anchor: int = max_anchor
        self._overhead_target: Optional[float] = None if overhead_target is None else float(overhead_target)
        self._anchor_rule: str = rule
        self._noise = WindowNoise()
        self._clock = ScheduleClock(lr_scaling)
        self._max_batch_diff: int | None = max_batch_diff
        self._enabled: bool = max_anchor != 0 and world_size > 1
        self._anchor: int = anchor if self._enabled else 1
        self._ms: list[float | None] = [None] * world_size
        self._measured: list[int] = [0] * world_size  # windows measured per rank
        self._recent: list[deque[float]] = [deque(maxlen=_SPEED_WINDOWS) for _ in range(world_size)]  # setup
        self._overheads: deque[float] = deque(maxlen=_OVERHEAD_WINDOWS)  # setup: per-micro-batch overheads
        self._prior: list[float] | None = None  # relative cost per unit, from hint or initial sizes
        self._plan: list[int] = []
        self._plan_calibrated: bool = False
        self._proposed: Optional[list[int]] = None  # setup: a small re-split one window proposed, awaiting a second
        self._windows: int = 0
        self._frozen: bool = False
        self._history: deque[dict[str, Any]] = deque(maxlen=_HISTORY_LEN)

        total = self._total()
        caps = list(max_batch_sizes) if isinstance(max_batch_sizes, (list, tuple)) else max_batch_sizes
        if caps is not None and (
            not isinstance(caps, list) or len(caps) != world_size or any(not _is_int(c) or c < 1 for c in caps)
        ):  # a single int is refused rather than read as "every rank"
            raise ValueError(f"max_batch_sizes={max_batch_sizes!r} is invalid: give {world_size} ints >= 1")
        self._caps: list[int] | None = caps
        if caps is not None and sum(caps) < total:
            raise ValueError(
                f"max_batch_sizes={caps} sums to {sum(caps)}, less than the global batch world_size * "
                f"batch_size = {total}: raise a cap, lower batch_size or add a rank"
            )
        if caps is not None and not self._enabled and min(caps) < total // world_size:
            raise ValueError(
                f"max_batch_sizes={caps} has a cap below batch_size={batch_size}, but El Che is disabled "
                "(max_anchor=0): El Che must be enabled (max_anchor >= 1) for caps below batch_size, "
                "or lower batch_size"
            )
        if batch_sizes is not None:
            self._prior = [max(batch_sizes) / b for b in self._check_sizes("batch_sizes", batch_sizes)]
            self._plan = list(batch_sizes)
        else:
            self._plan = self._compute_plan(dead_zone=False) if self._enabled else self._disabled_plan()

    def _check_sizes(self, name: str, sizes: Sequence[int]) -> list[int]:
        """Validate a user's split: W ints >= 1 summing to W * batch_size, within the caps."""
        total, w, b, out = self._total(), self._world_size, self._batch_size, list(sizes)
        if len(out) != w or any(not _is_int(v) or v < 1 for v in out) or sum(out) != total:
            raise ValueError(
                f"{name}={sizes!r} is invalid: give {w} integers >= 1 summing to "
                f"world_size * batch_size = {total}"
            )
        if not self._enabled and out != [b] * w:
            raise ValueError(
                f"{name}={sizes!r} cannot be used with El Che disabled (max_anchor=0 or world_size=1): "
                f"use [{b}] * {w} or set max_anchor >= 1"
            )
        over = [r for r in range(w) if self._caps is not None and out[r] > self._caps[r]]
        if over:
            raise ValueError(
                f"{name}={sizes!r} exceeds max_batch_sizes={self._caps} on rank(s) {over}: "
                "move the excess to ranks with room or raise their caps"
            )
        return out

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
    def overhead_target(self) -> Optional[float]:
        """Ceiling of sync / compute (None: none; the goodput rule's setup default)."""
        return self._overhead_target

    @property
    def anchor_rule(self) -> str:
        """``"goodput"`` or ``"throughput"`` (see ``flodl_hf.elche.goodput``)."""
        return self._anchor_rule

    @property
    def lr_scaling(self) -> str:
        """``"none"`` (the user's LR) or ``"adascale"`` (see ``flodl_hf.elche.lr_scaling``)."""
        return self._clock.rule

    @property
    def lr_gain(self) -> float:
        """AdaScale's gain of the last window's step (1.0 with ``lr_scaling="none"``)."""
        return self._clock.last_gain

    @property
    def schedule_progress(self) -> float:
        """LR-schedule steps taken over micro-steps run (1.0 unless AdaScale scaled a window)."""
        return self._clock.schedule_progress

    def window_lr(self, micro_batches: int) -> tuple[float, int]:
        """``(gain, scheduler_steps)`` for the window of ``micro_batches`` micro-steps closing now: AdaScale's gain
        of its step (1.0 unless ``lr_scaling="adascale"`` with a usable noise estimate) and how many times to step
        the LR scheduler. Call once per window, before :meth:`report`; deterministic on every rank."""
        _check_int("micro_batches", micro_batches, 1, "pass the window's micro-batches, an integer >= 1")
        usable = self._enabled and self._noise.rho(_NOISE_MIN) is not None
        gain = self._clock.gain(micro_batches, self._noise.scale.noise_scale, self._noise.micro_items, usable)
        return (1.0 if gain is None else gain), self._clock.advance(micro_batches, gain)

    @property
    def noise_scale(self) -> Optional[float]:
        """Smoothed gradient noise scale ``B_noise`` in loss-denominator items (None: no usable estimate yet)."""
        return self._noise.scale.noise_scale

    @property
    def efficiency(self) -> Optional[float]:
        """Estimated statistical efficiency of the current effective batch relative to one micro-step's (at the
        user's LR, ``flodl_hf.elche.noise_scale.fixed_lr_efficiency``; with ``lr_scaling="adascale"``, Pollux's
        ``(B_noise + M0) / (B_noise + A * M0)``); None without a noise estimate."""
        return self._noise.efficiency(self._anchor, adaptive_lr=self._clock.rule == "adascale")

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
    def max_batch_sizes(self) -> list[int] | None:
        """Per-rank micro-batch caps (setup mode; None = uncapped); configuration, never restored."""
        return None if self._caps is None else list(self._caps)

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

    def report(
        self,
        wall_ms: Sequence[float],
        work: Sequence[float],
        sync_ms: float,
        *,
        micro_batches: int | None = None,
        grad_sq: Sequence[float] | None = None,
        grad_items: Sequence[float] | None = None,
        reduced_grad_sq: float | None = None,
        noise_micro_batches: int | None = None,
    ) -> None:
        """Feed one window's figures (identical on every rank) and compute the next plan.

        ``wall_ms[r]``: rank r's compute time in the window, excluding sync.
        ``work[r]``: samples (setup) or batches (builder) rank r *actually* did.
        ``sync_ms``: all-reduce plus buffer sync time of the window.
        ``micro_batches`` (setup mode): micro-batches each rank ran in the window,
        default the current anchor; the anchor rule divides compute by it, so pass
        it when the window ran at another anchor (e.g. a short final window).
        ``grad_sq``, ``grad_items``, ``reduced_grad_sq`` (setup mode, all or none):
        each rank's squared norm of its own window gradient, its loss-denominator
        items, and the squared norm of the reduced gradient; they feed the noise
        estimate (``flodl_hf.elche.noise_scale``) the goodput rule uses. ``noise_micro_batches``:
        the micro-batches of the window those three describe, when it is an earlier
        window than the timing figures' (default ``micro_batches``).
        """
        if micro_batches is not None and self._mode != "setup":
            raise ValueError(f"micro_batches={micro_batches!r} is setup-mode only: remove it in builder mode")
        if micro_batches is not None:
            _check_int("micro_batches", micro_batches, 1, "pass the micro-batches per rank, an integer >= 1")
        w = self._world_size
        for name, seq in (("wall_ms", wall_ms), ("work", work)):
            if len(seq) != w:
                raise ValueError(f"{name} has {len(seq)} entries: pass one value per rank ({w})")
            for r, v in enumerate(seq):
                if not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
                    raise ValueError(f"{name}[{r}]={v!r} is invalid: pass a finite value >= 0")
        if not isinstance(sync_ms, numbers.Real) or not math.isfinite(sync_ms) or sync_ms < 0:
            raise ValueError(f"sync_ms={sync_ms!r} is invalid: pass a finite time in ms >= 0")

        if grad_sq is not None and self._mode != "setup":
            raise ValueError("grad_sq is setup-mode only: remove the gradient-noise inputs in builder mode")
        n_micro = self._anchor if micro_batches is None else micro_batches
        if noise_micro_batches is not None:
            _check_int("noise_micro_batches", noise_micro_batches, 1, "pass the noise window's micro-batches >= 1")
        self._noise.observe(w, n_micro if noise_micro_batches is None else noise_micro_batches, grad_sq, grad_items,
                            reduced_grad_sq)
        compute = max(float(x) for x in wall_ms)
        overhead = sync_ms / compute if compute > 0 else None
        if not self._frozen:
            # 1. Speed: EMA with a surprise-adaptive alpha. Setup mode feeds it the median of the rank's last three
            # windows once it has them: one window slowed by something else (a collection, another process) must
            # not move the split, which then drifts back only slowly where per-micro-batch costs dominate.
            for r in range(w):
                if work[r] > 0 and wall_ms[r] > 0:
                    new = wall_ms[r] / work[r]
                    m = self._ms[r]
                    self._measured[r] += 1
                    if self._mode == "setup":
                        recent = self._recent[r]
                        if self._measured[r] == 2:
                            recent.clear()  # the warm-up window is not a measurement of the speed
                        recent.append(new)
                        if len(recent) == _SPEED_WINDOWS:
                            new = statistics.median(recent)
                    if m is None or (self._mode == "setup" and self._measured[r] == 2):
                        self._ms[r] = new
                    else:
                        alpha = min(max(abs(new - m) / m, 0.1), 0.8)
                        self._ms[r] = alpha * new + (1 - alpha) * m
            if self._enabled:
                # 2. Anchor. Setup: goodput (or the overhead rule) on the median per-micro-batch overhead,
                # see flodl_hf.elche.goodput. Builder: jump up on overhead, decay by one when well under target.
                tau = self._overhead_target
                if compute > 0 and sync_ms > 0 and self._mode == "setup":
                    self._overheads.append(sync_ms * n_micro / compute)
                    if len(self._overheads) >= _OVERHEAD_MIN:
                        o1, rho = statistics.median(self._overheads), self._noise.rho(_NOISE_MIN)
                        self._anchor = combined_anchor(self._anchor, o1, rho, tau, self._min_anchor,
                                                       self._max_anchor, self._anchor_rule, self._clock.rule)
                elif compute > 0 and sync_ms > 0 and tau is not None:  # builder: tau is always set
                    ov = sync_ms / compute
                    if ov > tau:
                        target = math.ceil(self._anchor * ov / tau - _CEIL_TOL)
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
        if self._mode == "setup":
            entry.update(noise_scale=self.noise_scale, efficiency=self.efficiency)
            if self._clock.rule != "none":
                entry.update(lr_gain=self._clock.last_gain)
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
            caps = self._caps or [total] * self._world_size
            new = _largest_remainder(_water_fill([1.0 / m for m in est], total, caps), total, caps)
            if dead_zone and prev and sum(prev) == total and all(b <= c for b, c in zip(prev, caps)):
                predicted = lambda plan: max(b * m for b, m in zip(plan, est))  # noqa: E731
                gain = predicted(prev) / predicted(new) - 1.0 if predicted(new) > 0 else 0.0
                if gain <= _SETUP_DEAD_ZONE:
                    self._proposed = None
                    return list(prev)
                if gain <= _SETUP_CONFIRM:  # small: one noisy window must not move it (the split would wander)
                    direction = [(n > p) - (n < p) for n, p in zip(new, prev)]
                    if self._proposed != direction:
                        self._proposed = direction
                        return list(prev)
            self._proposed = None
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
        """Move the anchor from outside (e.g. builder mode's divergence guard).

        An anchor below ``min_anchor`` lowers the floor to it (the caller asked for a smaller window on purpose);
        one above ``max_anchor`` is a ValueError. Ignored while El Che is disabled. Builder counts scale with
        the anchor, so they are recomputed; setup sizes do not depend on it, so they are kept. Unless frozen,
        later reports apply the anchor rule from there (setup overheads are per micro-batch, so still valid).
        """
        _check_int("anchor", anchor, 1, "use an anchor >= 1")
        if not self._enabled:
            return
        if anchor > self._max_anchor:
            raise ValueError(f"anchor={anchor} is above max_anchor={self._max_anchor}: use a value <= max_anchor")
        self._min_anchor = min(self._min_anchor, int(anchor))
        self._anchor = int(anchor)
        if self._mode == "builder":
            self._plan = self._compute_plan(dead_zone=False)

    def set_batch_sizes(self, sizes: list[int]) -> None:
        """Pin the next window's micro-batch sizes (setup mode): a manual override of the current plan.

        ``sizes``: W integers >= 1 summing to ``W * batch_size``, within ``max_batch_sizes`` (disabled:
        only the equal split). Not a speed statement (use :meth:`speed_hint`). Unless frozen, the next
        report adapts again; the pinned plan is marked uncalibrated so the 2 % dead zone cannot keep it.
        """
        if self._mode != "setup":
            raise ValueError("set_batch_sizes() is setup-mode only: this El Che is in builder mode")
        self._plan = self._check_sizes("sizes", sizes)
        self._plan_calibrated = False

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
            "proposed": None if self._proposed is None else list(self._proposed),
            "recent_ms": [list(d) for d in self._recent],
            "windows": self._windows,
            "frozen": self._frozen,
            "history": [dict(h) for h in self._history],
            "noise": self._noise.state_dict(),
            "lr_clock": self._clock.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` snapshot taken with the same world_size, mode and batch_size."""
        new_keys = ("lr_clock", "proposed", "recent_ms")
        optional = ("noise",) + new_keys if int(state.get("version", 0)) < 3 else new_keys
        missing = [k for k in self.state_dict() if k not in state and k not in optional]
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
        # version 1 kept sync / compute at the anchor then: scale by the saved one (exact while it was steady)
        scale = int(state["anchor"]) if self._mode == "setup" and int(state["version"]) < 2 else 1
        overheads = (float(v) * scale for v in state["recent_overheads"])
        self._overheads = deque(overheads, maxlen=_OVERHEAD_WINDOWS)
        self._prior = None if state["prior"] is None else [float(p) for p in state["prior"]]
        self._windows = int(state["windows"])
        self._frozen = bool(state["frozen"])
        self._history = deque((dict(h) for h in state["history"]), maxlen=_HISTORY_LEN)
        self._noise = WindowNoise()
        if state.get("noise") is not None:
            self._noise.load_state_dict(state["noise"])
        self._clock = ScheduleClock(self._clock.rule)  # the rule is configuration: this run's
        if state.get("lr_clock") is not None:
            self._clock.load_state_dict(state["lr_clock"])
        if not self._enabled:
            self._anchor, self._plan, self._plan_calibrated = 1, self._disabled_plan(), False
            return
        anchor = int(state["anchor"])
        self._anchor = min(max(anchor, self._min_anchor), self._max_anchor)
        self._plan = [int(v) for v in state["plan"]]
        self._plan_calibrated = bool(state["plan_calibrated"])
        self._proposed = None if state.get("proposed") is None else [int(v) for v in state["proposed"]]
        recent = state.get("recent_ms") or [[] for _ in range(self._world_size)]
        self._recent = [deque((float(v) for v in d), maxlen=_SPEED_WINDOWS) for d in recent]
        over_caps = self._caps is not None and any(b > c for b, c in zip(self._plan, self._caps))
        if self._anchor != anchor or len(self._plan) != self._world_size or over_caps:
            self._plan = self._compute_plan(dead_zone=False)

    def describe(self) -> str:
        """One log line, e.g. ``El Che: anchor 2, shares [0.71, 0.29], batch sizes [23, 9]``."""
        what = "batch sizes" if self._mode == "setup" else "counts"
        shares = "[" + ", ".join(f"{s:.2f}" for s in self.shares) + "]"
        if not self._enabled:
            why = "max_anchor=0" if self._max_anchor == 0 else "world_size=1"
            return f"El Che: off ({why}), plain synchronous, anchor 1, {what} {self._plan}"
        tags = ("" if self.calibrated else ", uncalibrated") + (", frozen" if self._frozen else "")
        if self._caps is not None:
            tags += f", caps {list(self._caps)}"
        return f"El Che: anchor {self._anchor}, shares {shares}, {what} {self._plan}{tags}"
