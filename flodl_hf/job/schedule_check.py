"""The LR schedule checked before the model loads: every keyword in its domain, then every step's LR.

Why it exists: transformers' schedules take whatever numbers they are given. A NaN ``num_cycles`` makes every LR
0 (the run trains nothing), a negative ``lr_end`` makes the LR negative (gradient ascent), a ``min_lr_rate`` of a
million lifts the LR a million times above the peak, a negative ``num_decay_steps`` makes the schedule constant,
a warmup longer than the run never ends. Each of these trained to the end and wrote a model. Here each keyword is
checked against its domain, and the schedule the run will follow is evaluated at every one of its micro-steps: a
non-finite or negative LR, or one above the peak (which no schedule of transformers' goes above by definition),
is refused in one line naming the option and the step.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable

__all__ = ["check_keywords", "check_schedule"]


def _finite(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _whole(value: Any) -> bool:
    return _finite(value) and float(value).is_integer()


_STYLES = ("linear", "cosine", "1-sqrt")
#: Each keyword the job's schedules take: (its domain in words, the test of a value, given the peak LR).
_DOMAINS: dict[str, tuple[str, Callable[[Any, float], bool]]] = {
    "num_cycles": ("a finite number > 0", lambda v, lr: _finite(v) and v > 0),
    "lr_end": ("a finite LR >= 0 below --lr", lambda v, lr: _finite(v) and 0 <= v < lr),
    "power": ("a finite number > 0", lambda v, lr: _finite(v) and v > 0),
    "timescale": ("an integer >= 1", lambda v, lr: _whole(v) and v >= 1),
    "min_lr": ("a finite LR >= 0 not above --lr", lambda v, lr: _finite(v) and 0 <= v <= lr),
    "min_lr_rate": ("a fraction of the peak LR in [0, 1]", lambda v, lr: _finite(v) and 0 <= v <= 1),
    "warmup_lr_rate": ("a fraction of the peak LR in [0, 1]", lambda v, lr: _finite(v) and 0 <= v <= 1),
    "min_lr_ratio": ("a fraction of the peak LR in [0, 1]", lambda v, lr: _finite(v) and 0 <= v <= 1),
    "num_decay_steps": ("an integer >= 1", lambda v, lr: _whole(v) and v >= 1),
    "num_stable_steps": ("an integer >= 0", lambda v, lr: _whole(v) and v >= 0),
    "warmup_type": (f"one of {', '.join(_STYLES)}", lambda v, lr: v in _STYLES),
    "decay_type": (f"one of {', '.join(_STYLES)}", lambda v, lr: v in _STYLES),
}
#: Arguments the job itself passes to every schedule: not the user's to set.
_THE_JOBS = ("optimizer", "num_warmup_steps", "num_training_steps", "last_epoch")


def _keywords(name: str) -> list[str]:
    """The keywords transformers' schedule ``name`` takes beyond what the job passes."""
    import inspect

    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION
    from transformers.trainer_utils import SchedulerType

    function = TYPE_TO_SCHEDULER_FUNCTION[SchedulerType(name)]
    return [p for p in inspect.signature(function).parameters if p not in _THE_JOBS]


def check_keywords(name: str, kwargs: dict, lr: float, example: str) -> None:
    """Every ``--lr-scheduler-kwargs`` key one that schedule takes, and every value in its domain."""
    taken = _keywords(name)
    for key, value in kwargs.items():
        if key not in taken:
            raise ValueError(f"--lr-scheduler-kwargs: {key!r} is not a keyword of --lr-scheduler-type {name}, which "
                             f"takes {', '.join(taken) or 'none'}: e.g. --lr-scheduler-kwargs '{example}'")
        domain, fits = _DOMAINS.get(key, ("a JSON value", lambda v, lr: True))
        if not fits(value, lr):
            raise ValueError(f"--lr-scheduler-kwargs: {key}={json.dumps(value)} is invalid for --lr-scheduler-type "
                             f"{name}: use {domain}, e.g. --lr-scheduler-kwargs '{example}'")


def check_schedule(name: str, kwargs: dict | None, lr: float, total: int, warmup: int, warmup_option: str) -> None:
    """The schedule the run will follow, at every one of its ``total`` micro-steps: a warmup no longer than the
    run, and an LR that is finite, >= 0 and not above ``lr``."""
    import torch

    from .schedule import TrainerSchedule

    if warmup > total:
        raise ValueError(f"{warmup_option} gives a warmup of {warmup:,} micro-steps, longer than the run's {total:,}: "
                         f"the LR would never reach --lr; use a warmup below {total}, e.g. --warmup-ratio 0.1")
    schedule = TrainerSchedule(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr), name, total, warmup,
                               kwargs)
    given = f" with --lr-scheduler-kwargs '{json.dumps(kwargs)}'" if kwargs else ""
    for step in range(total):
        now = schedule.get_last_lr()[0]
        if not math.isfinite(now) or now < 0 or now > lr * (1 + 1e-9):
            what = ("not a number" if math.isnan(now) else "infinite" if not math.isfinite(now)
                    else "negative" if now < 0 else f"{now / lr:.3g} times --lr {lr:g}, above the peak")
            raise ValueError(f"--lr-scheduler-type {name}{given} gives an LR of {now:.4g} at micro-step {step} of "
                             f"{total} ({what}): change --lr-scheduler-kwargs so that every LR lies in [0, --lr]")
        schedule.step()
