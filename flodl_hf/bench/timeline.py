"""Per-window timeline of an El Che run and where its time goes against the ideal.

Why it exists: "El Che reaches 0.89-0.93 of the sum of solo rates" says how much is lost, not where. Each rank
records, per micro-step, a few ``time.perf_counter()`` stamps (CLOCK_MONOTONIC on Linux: one clock for every
process of the machine, so stamps of different ranks compare): when its batch arrives, when backward ends
(``graph.step()`` is called), when the optimizer step starts and ends (optimizer hooks, inside the window end)
and when ``graph.step()`` returns. Nothing in the engine is changed: :class:`StepClock` only reads the clock and,
on rank 0, El Che's public state after each window end (``ms_per_unit``, ``batch_sizes()``, ``anchor``).

Per window (:func:`window_timeline`): each rank's samples, split (samples per micro-batch), compute (batch
arrival to backward end, summed over the window's micro-batches), its **wait** at the window end (from its own
arrival at the window-end ``graph.step()`` to the last rank's arrival: time it idled because the split did not
match the speeds), the window's **sync** (last arrival to optimizer start: the all-reduce, unpack, clipping),
optimizer time, and the rest of the loop (input, per-micro-batch accumulation, El Che's update).

Gap accounting (:func:`gap_accounting`): with solo rates ``R_r`` (the ideal is their sum), ``N`` samples in time
``T``, the ideal time is ``T* = N / sum R`` and the gap ``T - T*`` equals ``sum_r w_r (T - n_r / R_r)`` with
``w_r = R_r / sum R`` (a second lost on rank r costs ``R_r`` samples). Each rank's ``T`` is split into measured
intervals, and ``n_r / R_r`` into solo's per-sample compute, input and optimizer times, which gives:

- (a) ``sync``: window-end synchronisation (last arrival to optimizer start);
- (b) ``wait``: ranks idling at window ends until the slowest arrives (imbalance: the split lagging the speeds);
- (c) ``compute``: compute slower than solo's at the same per-sample cost (e.g. a busy core's scheduling, a
  different micro-batch size);
- (d) ``loop``: input, accumulation, optimizer and El Che's update against solo's input and per-step optimizer
  (usually negative: one optimizer step per window instead of one per micro-batch);
- ``unmeasured``: what no interval covers (the timed region's edges), the accounting's own error.

The wait is further compared with counterfactual splits applied to the same windows' measured per-sample
compute: the best constant split in hindsight (what a split matching the run's mean speeds would have waited:
per-window noise no split rule can predict) and the previous window's balanced split (pure tracking).
"""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence

from ..elche.split import largest_remainder

__all__ = ["StepClock", "window_timeline", "solo_phases", "gap_accounting", "timeline_markdown"]

# Row layout of one micro-step: arrival of input start, batch in hand, backward done (step called), optimizer
# start / end (None: no optimizer step in it), step returned, loop body end, samples, window end (0/1).
_IN, _BODY, _CALL, _OPT0, _OPT1, _RET, _END, _N, _CLOSED = range(9)


class StepClock:
    """One rank's per-micro-step stamps. Call :meth:`fetch` (optional: input starts inside the loop body),
    :meth:`body`, :meth:`call`, :meth:`returned`, :meth:`end` in that order, once per micro-step."""

    def __init__(self, optimizer: Any = None) -> None:
        self.rows: list[list[Any]] = []
        self.windows: list[dict[str, Any]] = []
        self._row: list[Any] = [None] * 9
        self._last_end: Optional[float] = None
        if optimizer is not None:
            optimizer.register_step_pre_hook(self._opt_start)
            optimizer.register_step_post_hook(self._opt_end)

    def _opt_start(self, *_: Any) -> None:
        self._row[_OPT0] = time.perf_counter()

    def _opt_end(self, *_: Any) -> None:
        self._row[_OPT1] = time.perf_counter()

    def start(self) -> None:
        """Before the loop: input of the first micro-step starts now."""
        self._last_end = time.perf_counter()

    def fetch(self) -> None:
        self._row[_IN] = time.perf_counter()

    def body(self) -> None:
        now = time.perf_counter()
        if self._row[_IN] is None:
            self._row[_IN] = self._last_end if self._last_end is not None else now
        self._row[_BODY] = now

    def call(self) -> None:
        self._row[_CALL] = time.perf_counter()

    def returned(self) -> None:
        self._row[_RET] = time.perf_counter()

    def window(self, el_che: Any) -> None:
        """After a window end: El Che's estimate and next plan (read-only)."""
        self.windows.append({"row": len(self.rows), "ms_per_sample": [None if m is None else round(m, 4)
                                                                      for m in el_che.ms_per_unit],
                             "next_split": list(el_che.batch_sizes()), "anchor": int(el_che.anchor)})

    def end(self, samples: int, closed: bool) -> None:
        now = time.perf_counter()
        row = self._row
        row[_END], row[_N], row[_CLOSED] = now, int(samples), 1 if closed else 0
        self.rows.append(row)
        self._row, self._last_end = [None] * 9, now

    def to_dict(self, t0: Optional[float], start_step: int) -> dict[str, Any]:
        return {"t0": t0, "start_step": start_step, "rows": self.rows, "windows": self.windows}


def _timed(clock: dict[str, Any]) -> list[list[Any]]:
    rows = [list(r) for r in clock["rows"][clock["start_step"]:]]
    if rows and clock["t0"] is not None:
        rows[0][_IN] = clock["t0"]  # the timed region starts at t0, after the previous step's barrier
    return rows


def _ms(x: float) -> float:
    return round(1000.0 * x, 3)


def window_timeline(clocks: Sequence[dict[str, Any]], elapsed: Sequence[float]) -> dict[str, Any]:
    """Merge every rank's :class:`StepClock` dict (timed region only) into per-window rows and per-rank totals
    (seconds). ``elapsed``: each rank's timed seconds."""
    world = len(clocks)
    per_rank = [_timed(c) for c in clocks]
    ends = [[i for i, r in enumerate(rows) if r[_CLOSED]] for rows in per_rank]
    if len({len(e) for e in ends}) != 1:
        raise ValueError(f"ranks closed different numbers of windows in the timed region: {[len(e) for e in ends]}")
    totals = [{k: 0.0 for k in ("compute", "input", "wait", "sync", "optimizer", "other", "unmeasured")}
              for _ in range(world)]
    elche_windows = {w["row"]: w for w in clocks[0].get("windows", [])}
    offset = clocks[0]["start_step"]
    windows: list[dict[str, Any]] = []
    starts = [0] * world
    for k in range(len(ends[0])):
        closing = [per_rank[r][ends[r][k]] for r in range(world)]
        last = max(row[_CALL] for row in closing)
        row_out: dict[str, Any] = {"window": k, "micro": ends[0][k] - starts[0] + 1, "samples": [], "split": [],
                                   "compute_ms": [], "input_ms": [], "wait_ms": [], "sync_ms": [],
                                   "optimizer_ms": [], "other_ms": []}
        for r in range(world):
            rows = per_rank[r][starts[r]:ends[r][k] + 1]
            comp = sum(x[_CALL] - x[_BODY] for x in rows)
            inp = sum(x[_BODY] - x[_IN] for x in rows)
            end = rows[-1]
            wait = last - end[_CALL]
            opt0 = end[_OPT0] if end[_OPT0] is not None else end[_RET]
            opt1 = end[_OPT1] if end[_OPT1] is not None else opt0
            sync = opt0 - last
            opt = opt1 - opt0
            other = sum(x[_END] - x[_CALL] for x in rows[:-1]) + (end[_END] - opt1)
            for key, v in (("compute", comp), ("input", inp), ("wait", wait), ("sync", sync), ("optimizer", opt),
                           ("other", other)):
                totals[r][key] += v
            row_out["samples"].append(sum(x[_N] for x in rows))
            row_out["split"].append(rows[0][_N])
            for key, v in (("compute_ms", comp), ("input_ms", inp), ("wait_ms", wait), ("sync_ms", sync),
                           ("optimizer_ms", opt), ("other_ms", other)):
                row_out[key].append(_ms(v))
            starts[r] = ends[r][k] + 1
        info = elche_windows.get(offset + ends[0][k] + 1)
        if info is not None:
            row_out["elche_ms_per_sample"] = info["ms_per_sample"]
            row_out["next_split"] = info["next_split"]
            row_out["anchor_next"] = info["anchor"]
        windows.append(row_out)
    for r in range(world):
        rows = per_rank[r]
        if not rows:
            continue
        tail = rows[starts[r]:]  # micro-steps after the last window end (none in a complete run)
        totals[r]["other"] += sum(x[_END] - x[_IN] for x in tail)
        t0 = clocks[r]["t0"]
        covered = rows[-1][_END] - t0
        totals[r]["unmeasured"] = max(elapsed) - covered  # the finish barrier, the edges, the longest rank's lead
        totals[r]["samples"] = sum(x[_N] for x in rows)
    return {"windows": windows, "totals": totals}


def solo_phases(clock: dict[str, Any], elapsed: float) -> dict[str, float]:
    """One solo rank's timed seconds split into compute, input, optimizer and the rest, and its samples."""
    rows = _timed(clock)
    comp = sum(x[_CALL] - x[_BODY] for x in rows)
    inp = sum(x[_BODY] - x[_IN] for x in rows)
    opt = sum((x[_RET] - x[_CALL]) for x in rows)  # optimizer step + zero_grad
    return {"samples": sum(x[_N] for x in rows), "elapsed": elapsed, "compute": comp, "input": inp,
            "optimizer": opt, "other": elapsed - comp - inp - opt}


def _balanced(inv_speed: Sequence[float], total: int) -> list[int]:
    caps = [total] * len(inv_speed)
    share = [1.0 / m for m in inv_speed]
    s = sum(share)
    return largest_remainder([total * v / s for v in share], total, caps)


def _counterfactual_wait(windows: list[dict[str, Any]], weights: Sequence[float],
                         split_for: Any) -> float:
    """Weighted wait (s) had window k run split ``split_for(k)`` (per micro-batch) at its measured ms/sample."""
    lost = 0.0
    for k, w in enumerate(windows):
        split = split_for(k)
        if split is None:
            continue
        speeds = [c / n for c, n in zip(w["compute_ms"], w["samples"])]
        times = [w["micro"] * b * m for b, m in zip(split, speeds)]
        lost += sum(wt * (max(times) - t) for wt, t in zip(weights, times)) / 1000.0
    return lost


def gap_accounting(timeline: dict[str, Any], solo: Sequence[dict[str, float]], elapsed: float) -> dict[str, Any]:
    """Split ``elapsed - ideal time`` into (a) sync, (b) wait, (c) compute, (d) loop and the unmeasured rest.

    ``solo``: :func:`solo_phases` of each rank's solo run in the same round. Seconds, plus fractions of the gap."""
    totals = timeline["totals"]
    rates = [s["samples"] / s["elapsed"] for s in solo]
    weights = [r / sum(rates) for r in rates]
    n = [t["samples"] for t in totals]
    ideal_t = sum(n) / sum(rates)
    gap = elapsed - ideal_t
    parts = {"sync": 0.0, "wait": 0.0, "compute": 0.0, "loop": 0.0, "unmeasured": 0.0}
    for w, t, s, nr in zip(weights, totals, solo, n):
        per = {k: s[k] / s["samples"] for k in ("compute", "input", "optimizer", "other")}
        parts["sync"] += w * t["sync"]
        parts["wait"] += w * t["wait"]
        parts["compute"] += w * (t["compute"] - nr * per["compute"])
        parts["loop"] += w * (t["input"] + t["optimizer"] + t["other"]
                              - nr * (per["input"] + per["optimizer"] + per["other"]))
        parts["unmeasured"] += w * t["unmeasured"]
    windows = timeline["windows"]
    mean_speed = [sum(w["compute_ms"][r] for w in windows) / max(1, sum(w["samples"][r] for w in windows))
                  for r in range(len(n))]
    total = sum(windows[0]["split"]) if windows else 0
    fixed = _balanced(mean_speed, total) if windows and all(m > 0 for m in mean_speed) else None

    def previous(k: int) -> Optional[list[int]]:
        if k == 0:
            return None
        p = windows[k - 1]
        return _balanced([c / s for c, s in zip(p["compute_ms"], p["samples"])], total)

    counter = {
        "best_constant_split": fixed,
        "wait_if_best_constant_split_s": _counterfactual_wait(windows, weights, lambda k: fixed) if fixed else None,
        "wait_if_previous_window_split_s": _counterfactual_wait(windows, weights, previous),
        "wait_as_run_s": _counterfactual_wait(windows, weights, lambda k: windows[k]["split"]),
    }
    per_rank = [{k: round(v, 4) for k, v in t.items()} for t in totals]
    out: dict[str, Any] = {
        "elapsed_s": elapsed, "ideal_s": ideal_t, "gap_s": gap, "efficiency": ideal_t / elapsed,
        "parts_s": parts, "fractions": {k: (v / gap if gap > 0 else None) for k, v in parts.items()},
        "accounted": (1.0 - abs(parts["unmeasured"]) / gap) if gap > 0 else None,
        "weights": weights, "solo_ms_per_sample": [1000.0 * s["compute"] / s["samples"] for s in solo],
        "elche_compute_ms_per_sample": [1000.0 * t["compute"] / max(1, nr) for t, nr in zip(totals, n)],
        "samples": n, "per_rank_s": per_rank, "wait_counterfactuals": counter,
        "windows": len(windows), "anchors": sorted({w["micro"] for w in windows}),
    }
    return out


def timeline_markdown(timeline: dict[str, Any], limit: int = 40) -> str:
    """The per-window table (first ``limit`` windows)."""
    head = ("| window | micro | split | samples | compute ms | wait ms | sync ms | optimizer ms | other ms "
            "| El Che ms/sample after |")
    lines = [head, "|" + "---|" * 10]

    def fmt(xs: Sequence[float], f: str = ".0f") -> str:
        return "/".join(format(x, f) for x in xs)

    for w in timeline["windows"][:limit]:
        est = w.get("elche_ms_per_sample")
        lines.append(f"| {w['window']} | {w['micro']} | {fmt(w['split'], 'd')} | {fmt(w['samples'], 'd')} "
                     f"| {fmt(w['compute_ms'])} | {fmt(w['wait_ms'])} | {fmt(w['sync_ms'], '.1f')} "
                     f"| {fmt(w['optimizer_ms'], '.1f')} | {fmt(w['other_ms'], '.1f')} "
                     f"| {fmt(est, '.2f') if est and None not in est else '-'} |")
    if len(timeline["windows"]) > limit:
        lines.append(f"| ... {len(timeline['windows']) - limit} more windows in results.json | | | | | | | | | |")
    return "\n".join(lines) + "\n"
