"""The El Che plan a run followed, recorded so that the same command can repeat the run exactly.

Why it exists: on N ranks El Che splits every global batch by measured speed and may change its window (the anchor)
with measured timing, so the same command, seed and data can train a different model depending on the machine's
load: a different split puts samples on other ranks (other dropout draws, another summation order) and a different
anchor takes other optimizer steps. The plan is what El Che decided, not what it measured: per window, how many
micro-batches it averaged; per plan step (draw number), how the global batch was split. :class:`PlanRecord` keeps
both as change lists (a few entries for a whole run) and :class:`PlanReplay` plays a recorded plan back instead of
El Che's timing decisions (``DdpConfig(replay_plan=...)``, CLI ``--replay-plan metrics.json``), so a repeat of a
run on the same devices is bit for bit the run, whatever else the machine is doing. Pure Python.
"""

from __future__ import annotations

import bisect
import json
from typing import Any, Optional

__all__ = ["PLAN_FORMAT", "PlanRecord", "PlanReplay", "check_plan"]

#: The recorded plan's format number (``plan["format"]``).
PLAN_FORMAT = 1


_SETUP_FIX = "pass metrics.json's el_che.plan of an earlier run (CLI: --replay-plan path/to/metrics.json)"


def _shown(value: Any) -> str:
    """A value of a plan as its JSON file spells it (``true``, not ``True``)."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def check_plan(plan: Any, name: str = "DdpConfig.replay_plan", fix: str = _SETUP_FIX) -> dict:
    """Validate the structure of a recorded plan (the run's world and batch size are checked at setup); a refusal
    names ``name`` (the setting that passed the plan) and ``fix``."""

    def _bad(why: str) -> ValueError:
        return ValueError(f"{name} is not a recorded El Che plan ({why}): {fix}")

    if not isinstance(plan, dict):
        raise _bad(f"got {type(plan).__name__}, not a dict")
    missing = [k for k in ("format", "world", "batch_size", "anchors", "splits") if k not in plan]
    if missing:
        raise _bad(f"missing {', '.join(missing)}")
    if plan["format"] != PLAN_FORMAT:
        raise _bad(f"format {plan['format']!r}, this version reads format {PLAN_FORMAT}")
    world, batch = plan["world"], plan["batch_size"]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (world, batch)):
        raise _bad(f"world={world!r} and batch_size={batch!r} must be integers >= 1")
    for key, entries in (("anchors", plan["anchors"]), ("splits", plan["splits"])):
        if not isinstance(entries, list) or not entries:
            raise _bad(f"{key} must be a non-empty list of [start, value] pairs")
        starts = []
        for entry in entries:
            if not (isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[0], int)
                    and entry[0] >= 0):
                raise _bad(f"{key} entry {_shown(entry)} is not [start >= 0, value]")
            starts.append(entry[0])
        if starts[0] != 0 or starts != sorted(set(starts)):
            raise _bad(f"{key} must start at 0 and increase: {starts[:6]}...")
    for _, anchor in plan["anchors"]:
        if not isinstance(anchor, int) or isinstance(anchor, bool) or anchor < 1:
            raise _bad(f"anchor {_shown(anchor)} is not an integer >= 1")
    for _, sizes in plan["splits"]:
        # El Che gives every rank at least one sample of each micro-batch, so a recorded split never holds a 0
        if not (isinstance(sizes, list) and len(sizes) == world and all(
                isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in sizes)
                and sum(sizes) == world * batch):
            raise _bad(f"split {_shown(sizes)} is not {world} sizes >= 1 summing to {world} x {batch}")
    return plan


class PlanRecord:
    """What El Che decided during a run: the anchor of each window and the split of each plan step, as changes."""

    def __init__(self, world: int) -> None:
        self.world = int(world)
        self.batch_size: Optional[int] = None
        self.anchors: list[list[Any]] = []  # [window index, micro-batches per window] from that window on
        self.splits: list[list[Any]] = []  # [draw number, per-rank sizes] from that plan step on
        self.resumed = False  # resumed from a checkpoint: the record misses the run's beginning

    def restart(self, batch_size: int) -> None:
        """A new data loader (another batch size): the record restarts with it."""
        if batch_size != self.batch_size:
            self.batch_size, self.anchors, self.splits = int(batch_size), [], []

    def split(self, draw: int, sizes: list[int]) -> None:
        if self.splits and self.splits[-1][0] >= draw:
            self.splits = [s for s in self.splits if s[0] < draw]
        if not self.splits or self.splits[-1][1] != list(sizes):
            self.splits.append([int(draw), [int(b) for b in sizes]])

    def window(self, index: int, anchor: int) -> None:
        if not self.anchors or self.anchors[-1][1] != int(anchor):
            self.anchors.append([int(index), int(anchor)])

    def to_dict(self) -> Optional[dict]:
        """The plan as JSON-ready data (None before any window, or for a resumed run: its record misses the run's
        beginning, so it cannot replay the run from its start)."""
        if self.resumed or self.batch_size is None or not self.anchors or not self.splits:
            return None
        return {"format": PLAN_FORMAT, "world": self.world, "batch_size": self.batch_size,
                "anchors": [list(a) for a in self.anchors], "splits": [[g, list(s)] for g, s in self.splits]}


class PlanReplay:
    """A recorded plan played back: the anchor of window ``w`` and the split of plan step ``g``."""

    def __init__(self, plan: dict, world: int, batch_size: int) -> None:
        check_plan(plan)
        if plan["world"] != world or plan["batch_size"] != batch_size:
            raise ValueError(f"DdpConfig.replay_plan was recorded on {plan['world']} rank(s) with batch size "
                             f"{plan['batch_size']}, but this run has {world} rank(s) with batch size {batch_size}: "
                             "replay it with the same devices and --batch-size, or drop --replay-plan")
        self._anchor_starts = [a[0] for a in plan["anchors"]]
        self._anchors = [int(a[1]) for a in plan["anchors"]]
        self.anchors = list(self._anchors)
        self.splits: list[tuple[int, list[int]]] = [(int(g), list(s)) for g, s in plan["splits"]]
        self._split_starts = [g for g, _ in self.splits]

    def split(self, draw: int) -> list[int]:
        """The recorded split of plan step ``draw`` (the last one recorded, past the record's end)."""
        return list(self.splits[bisect.bisect_right(self._split_starts, draw) - 1][1])

    def anchor(self, window: int) -> int:
        """The recorded anchor of window ``window`` (the last one recorded, past the record's end)."""
        return self._anchors[bisect.bisect_right(self._anchor_starts, window) - 1]
