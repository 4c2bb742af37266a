"""The learning-rate schedules of ``flodl-hf train``: transformers' ``get_scheduler`` schedules on the run's clock.

It exists apart from the job because the schedule is the one piece of the run's optimizer state the job defines
itself (rather than the engine or torch): it counts the run's micro-steps (global batches), not optimizer steps, a
checkpoint saves and restores it (``flodl_hf.job.checkpoints``), and a resume on another device count must keep it
where it was in the run. :class:`TrainerSchedule` is what ``--lr-scheduler-type`` names: the LR factor of
transformers' own schedule (built by ``transformers.get_scheduler``, so every step's LR is Trainer's to the bit on
one device), read at a clock the job moves. :class:`LinearSchedule` is the job's earlier schedule (a ``+1`` in the
warmup), kept for scripts and engine tests that set it with ``graph.set_scheduler``.
"""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any, Callable, Optional

__all__ = ["TrainerSchedule", "LinearSchedule", "SCHEDULES", "METRIC_SCHEDULES", "NEEDS_KWARGS",
           "KWARGS_EXAMPLES", "warmup_steps_for"]

#: ``--lr-scheduler-type`` values: transformers' ``SchedulerType`` names that follow the step count.
SCHEDULES = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
             "inverse_sqrt", "cosine_with_min_lr", "cosine_warmup_with_min_lr", "warmup_stable_decay")
#: transformers' schedules driven by a metric, not the step count (refused: the job's schedule follows steps).
METRIC_SCHEDULES = ("reduce_lr_on_plateau", "greedy")
#: Schedules that need ``--lr-scheduler-kwargs``, with a valid example.
NEEDS_KWARGS = {"cosine_with_min_lr": '{"min_lr_rate": 0.1}', "cosine_warmup_with_min_lr": '{"min_lr_rate": 0.1}',
                "warmup_stable_decay": '{"num_decay_steps": 100}'}
#: A valid ``--lr-scheduler-kwargs`` per schedule (None: the schedule takes no keywords).
KWARGS_EXAMPLES = {"linear": None, "constant": None, "constant_with_warmup": None, "cosine": '{"num_cycles": 0.5}',
                   "cosine_with_restarts": '{"num_cycles": 2}', "polynomial": '{"lr_end": 1e-07, "power": 2.0}',
                   "inverse_sqrt": '{"timescale": 100}', **NEEDS_KWARGS}


def _number(value: Any) -> Any:
    """An int when integral (the usual case), else the float a rescaled schedule carries."""
    value = float(value)
    return int(value) if value.is_integer() else value


def warmup_steps_for(total: int, warmup_steps: Optional[int], warmup_ratio: Optional[float]) -> int:
    """Warmup micro-steps of a run of ``total``: ``warmup_steps`` as given, else ``ceil(total x warmup_ratio)``
    (transformers' ``TrainingArguments.get_warmup_steps``), else 0."""
    if warmup_steps is not None:
        return int(warmup_steps)
    if warmup_ratio is not None:
        whole = total * float(warmup_ratio)
        return int(whole) + (whole > int(whole))
    return 0


def _factors(name: str, optimizer: Any, total: int, warmup: int, kwargs: dict) -> list[Callable[[Any], float]]:
    """One LR factor function per param group: the ``lr_lambdas`` of ``transformers.get_scheduler(name, ...)``,
    built on a stand-in optimizer with the same group LRs and defaults, so the real one is left untouched."""
    import torch
    from transformers import get_scheduler

    stand_in = torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)], "lr": float(group["lr"])}
                                for group in optimizer.param_groups], lr=float(optimizer.defaults["lr"]))
    scheduler = get_scheduler(name, stand_in, num_warmup_steps=warmup, num_training_steps=total,
                              scheduler_specific_kwargs=dict(kwargs) or None)
    return list(scheduler.lr_lambdas)


class TrainerSchedule:
    """transformers' ``get_scheduler(name)`` schedule, stepped once per micro-step (a global batch; an optimizer
    step on one device) and rescaled on a resume with another device count.

    The LR of param group g is ``base_lr[g] x factor_g(clock)``, ``factor_g`` being the schedule's own
    ``lr_lambdas[g]`` built for the run's first ``total`` micro-steps and ``warmup``. ``graph.step()`` steps it
    once per micro-step, so ``clock`` advances by ``rate`` (1) per micro-step and the LR at micro-step k is
    ``LambdaLR``'s after k steps: Trainer's on one device.

    A resume on another device count changes how many micro-steps remain (the global batch changes).
    :meth:`continue_over` keeps the clock where it is (the LR at the resume point is unchanged) and sets ``rate``
    so that the remaining micro-steps cover what remained of the first run's clock: the schedule keeps following
    the run's sample position (each new micro-step advances it by the ratio of the global batches, up to each
    epoch's last partial batch), and a schedule with an end (linear, cosine, polynomial, ...) still ends on the
    run's last micro-step. Step-valued keywords (``num_decay_steps``, ``timescale``) stay on the first run's clock.
    """

    def __init__(self, optimizer: Any, name: str, total: int, warmup: int, kwargs: Optional[dict] = None) -> None:
        self.optimizer = optimizer
        self.name = str(name)
        self.kwargs = dict(kwargs or {})
        self.total = max(1, int(total))
        self.warmup = int(warmup)
        self.clock = Fraction(0)
        self.rate = Fraction(1)
        self.base_lrs = [float(group["lr"]) for group in optimizer.param_groups]
        self._factors = _factors(self.name, optimizer, self.total, self.warmup, self.kwargs)
        self._apply()

    def _at(self) -> Any:
        """The clock as the schedule's functions take it: an int on whole steps (always, without a rescale)."""
        return int(self.clock) if self.clock.denominator == 1 else float(self.clock)

    def factor(self, group: int = 0) -> float:
        """The LR factor of param group ``group`` now."""
        return float(self._factors[group](self._at()))

    def _apply(self) -> None:
        at = self._at()
        for index, (group, base) in enumerate(zip(self.optimizer.param_groups, self.base_lrs)):
            group["lr"] = base * self._factors[index](at)

    def step(self) -> None:
        self.clock += self.rate  # exact (fractions): a rescaled run reaches the end of its clock on its last step
        self._apply()

    def get_last_lr(self) -> list[float]:
        """The LR of every param group now (as torch's schedulers)."""
        return [float(group["lr"]) for group in self.optimizer.param_groups]

    def continue_over(self, remaining: int) -> None:
        """Make the rest of the first run's clock last ``remaining`` micro-steps (a resume on another device count).

        Nothing changes when ``remaining`` already matches (a resume on the same devices) or nothing remains."""
        remaining, left = int(remaining), self.total - self.clock
        if remaining > 0 and left > 0:
            self.rate = left / remaining

    def state_dict(self) -> dict:
        return {"name": self.name, "kwargs": json.loads(json.dumps(self.kwargs)), "total": self.total,
                "warmup": self.warmup, "clock": [self.clock.numerator, self.clock.denominator],
                "rate": [self.rate.numerator, self.rate.denominator], "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state: dict) -> None:
        self.name, self.kwargs = str(state["name"]), dict(state.get("kwargs") or {})
        self.total, self.warmup = int(state["total"]), int(state["warmup"])
        self.clock, self.rate = (Fraction(int(state[k][0]), int(state[k][1])) for k in ("clock", "rate"))
        self.base_lrs = [float(lr) for lr in state["base_lrs"]]
        self._factors = _factors(self.name, self.optimizer, self.total, self.warmup, self.kwargs)
        self._apply()

    def set_base_lr(self, lr: float) -> None:
        """Change the peak LR (on resume with another --lr) and apply it to the next step."""
        self.base_lrs = [float(lr)] * len(self.optimizer.param_groups)
        self._apply()


class LinearSchedule:
    """Linear warmup then linear decay to 0 over the run's micro-steps (batches of ``graph.epoch``).

    ``graph.step()`` steps an LR scheduler once per micro-step (A times after a window of A micro-batches), so this
    schedule ends exactly at the run's last micro-batch whatever El Che's anchor does; on one device it is the
    usual per-step linear schedule. A checkpoint saves ``done`` and the base LRs.

    A resume on another device count changes how many micro-steps remain (the global batch changes):
    :meth:`continue_over` rescales the schedule's clock so that the LR at the resume point stays what it was, the
    warmup and the decay keep their share of what remains, and the LR still reaches 0 on the run's last micro-step.
    """

    def __init__(self, optimizer: Any, total: int, warmup_ratio: float) -> None:
        self.optimizer = optimizer
        self.total = max(1, int(total))
        self.warmup = int(self.total * warmup_ratio)
        self.done = 0
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]
        self._apply()

    def factor(self) -> float:
        if self.done < self.warmup:
            return (self.done + 1) / (self.warmup + 1)
        return max(0.0, (self.total - self.done) / max(1, self.total - self.warmup))

    def _apply(self) -> None:
        factor = self.factor()
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * factor

    def step(self) -> None:
        self.done += 1
        self._apply()

    def continue_over(self, remaining: int) -> None:
        """Make the rest of the schedule last ``remaining`` micro-steps (a resume on another device count).

        ``done``, ``warmup`` and ``total`` are scaled by ``remaining / (total - done)``: the decay factor
        ``(total - done) / (total - warmup)`` is unchanged (so is a warmup's ``(done + 1) / (warmup + 1)``, up to
        the +1), and the schedule ends exactly at the last micro-step. Nothing changes when ``remaining`` already
        matches (a resume on the same devices)."""
        remaining = int(remaining)
        left = self.total - self.done
        if remaining == left or remaining < 0:
            return
        if left <= 0:
            self.total = self.done + remaining
        else:
            scale = remaining / left
            self.done, self.warmup = self.done * scale, self.warmup * scale
            self.total = self.done + remaining
        self._apply()

    def state_dict(self) -> dict:
        return {"total": self.total, "warmup": self.warmup, "done": self.done, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state: dict) -> None:
        self.total, self.warmup, self.done = (_number(state[k]) for k in ("total", "warmup", "done"))
        self.base_lrs = [float(lr) for lr in state["base_lrs"]]

    def set_base_lr(self, lr: float) -> None:
        """Change the peak LR (on resume with another --lr) and apply it to the next step."""
        self.base_lrs = [float(lr)] * len(self.optimizer.param_groups)
        self._apply()
