"""The learning-rate schedule of ``flodl-hf train --warmup-ratio``: linear warmup, then linear decay to 0.

It exists apart from the job because it is the one piece of the run's optimizer state the job defines itself
(rather than the engine or torch): it counts the run's micro-steps, not optimizer steps, and a checkpoint saves and
restores it (``flodl_hf.job.checkpoints``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["LinearSchedule"]


def _number(value: Any) -> Any:
    """An int when integral (the usual case), else the float a rescaled schedule carries."""
    value = float(value)
    return int(value) if value.is_integer() else value


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
