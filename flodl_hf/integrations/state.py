"""What `ElCheTrainer` keeps across runs: El Che's state in each checkpoint, the one rule of a resume, the plan file.

Why it exists: a Trainer checkpoint holds the model, optimizer, scheduler and Trainer's counters, but not what
El Che needs to go on exactly: the global micro-batch and window shape the run trained (so a resume on another
number of ranks keeps the optimizer steps the same size and sees every remaining sample once), El Che's measured
speeds, and the split of every window so far. This module reads and writes that state (``elche_trainer.json`` in
each checkpoint), checks a resume against it before Trainer loads anything, and writes the run's split plan
(``elche_plan.json`` in ``output_dir``), which ``ElCheArguments(replay_plan=...)`` replays.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..files.atomic import atomic_path
from ..files.reader import read_json
from .plan import WindowPlan, equal_sizes

__all__ = [
    "PLAN_FILE",
    "STATE_FILE",
    "check_resume",
    "check_stream_resume",
    "checkpoint_state",
    "read_state",
    "recorded",
    "write_json",
]

#: What ElCheTrainer adds to each Trainer checkpoint directory.
STATE_FILE = "elche_trainer.json"
#: The split plan a multi-rank run followed, in its output_dir (``ElCheArguments(replay_plan=...)`` replays it).
PLAN_FILE = "elche_plan.json"
_STATE_FORMAT = 1


def read_state(path: str) -> dict:
    """A checkpoint's ``elche_trainer.json``, refused in one line when it is not one this version wrote."""
    try:
        state = read_json(path, STATE_FILE)
        int(state["global_micro_batch"]), int(state["micro_batches_per_window"]), int(state["format"])
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"ElCheTrainer: {path} is not a readable El Che state ({type(exc).__name__}: {exc}): "
                         "resume from another checkpoint, or delete that file to resume without El Che's state"
                         ) from None
    return state


def check_resume(state: dict, path: str, *, world: int, per_device: int, ga: int, pinned: list[int] | None) -> dict:
    """The one rule of a resume on several ranks, checked before Trainer loads anything: the run goes on in the
    checkpoint's global micro-batch ``U`` and micro-batches per step (so the optimizer steps, the schedule and the
    data position stay the run's), so the ``W`` ranks' ``per_device_train_batch_size`` must be ``U / W`` and a
    pinned split must sum to ``U``. Refused in one line naming what works; nothing else is ever trained silently."""
    if int(state.get("format", 0)) != _STATE_FORMAT:
        raise ValueError(f"ElCheTrainer: {STATE_FILE} has format {state.get('format')!r}, this version "
                         f"reads {_STATE_FORMAT}: resume with the flodl-hf version that wrote it")
    if int(state["micro_batches_per_window"]) != ga:
        raise ValueError(
            f"ElCheTrainer: gradient_accumulation_steps={ga} but the checkpoint was written with "
            f"{state['micro_batches_per_window']}: pass gradient_accumulation_steps="
            f"{state['micro_batches_per_window']} to resume it")
    unit = int(state["global_micro_batch"])
    if unit < 1 or unit % world != 0:
        fits = [w for w in range(1, unit + 1) if unit % w == 0]
        raise ValueError(
            f"ElCheTrainer: the checkpoint {path} trains global micro-batches of {unit} samples (kept on resume, "
            f"so each rank's batch is {unit} / world size), which {world} ranks cannot share: resume it on "
            f"{', '.join(map(str, fits))} ranks")
    split = (f" and batch_sizes={equal_sizes(world, unit)!r} (or any {world} sizes >= 1 summing to {unit})"
             if pinned is not None else "")
    if per_device * world != unit:
        raise ValueError(
            f"ElCheTrainer: the checkpoint {path} trains global micro-batches of {unit} samples (kept on resume), "
            f"but per_device_train_batch_size={per_device} on {world} ranks gives {per_device * world}: pass "
            f"per_device_train_batch_size={unit // world}{split}")
    if pinned is not None and sum(pinned) != unit:
        raise ValueError(
            f"ElCheTrainer: ElCheArguments(batch_sizes={list(pinned)!r}) sums to {sum(pinned)}, but the checkpoint "
            f"{path} trains global micro-batches of {unit} samples (kept on resume): pass "
            f"per_device_train_batch_size={unit // world}{split}")
    return state


def recorded(plan: WindowPlan | None, windows: int) -> dict | None:
    """The split of the first ``windows`` windows (drawn ones beyond them were not trained: a loader reads ahead),
    or None when the record does not start at the run's first window."""
    record = None if plan is None else plan.record.to_dict()
    if record is not None:
        record["splits"] = [entry for entry in record["splits"] if entry[0] < max(windows, 1)]
    return record


def checkpoint_state(plan: WindowPlan, world: int, elche: Any, step: int, *, windows: int | None = None,
                     stream_ended: int | None = None) -> dict:
    """``elche_trainer.json`` of a checkpoint after ``step`` optimizer steps (``windows`` windows drawn, ``step``
    unless a stream's window cut short by its end makes it more; ``stream_ended``: how often a train stream had
    ended by then)."""
    state = {"format": _STATE_FORMAT, "global_micro_batch": plan.global_micro_batch,
             "micro_batches_per_window": plan.micro_batches_per_window, "world_size": world,
             "batch_sizes": list(plan.sizes), "elche": None if elche is None else elche.state_dict(),
             "step": step, "plan": recorded(plan, step if windows is None else windows)}
    if stream_ended is not None:
        state["stream"] = {"ended": stream_ended}
    return state


def check_stream_resume(state: dict, path: str) -> None:
    """A stream resumes as Trainer resumes one: by skipping ``global_step x gradient_accumulation_steps``
    micro-batches from its start. That is where the run stopped only while the stream had not yet ended and started
    over; a checkpoint saved later is refused in one line."""
    ended = int((state.get("stream") or {}).get("ended", 0))
    if ended > 0:
        raise ValueError(
            f"ElCheTrainer: {path} was saved after the train stream had ended and started over ({ended} time"
            f"{'s' if ended > 1 else ''}), and a stream is resumed by skipping global_step x "
            "gradient_accumulation_steps micro-batches from its start, which would not continue where the run "
            "stopped: resume from a checkpoint saved before the stream first ended, or train again from the start")


def write_json(path: str, data: Any) -> None:
    """``data`` as indented JSON at ``path``, written whole or not at all."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
