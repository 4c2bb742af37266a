"""Where an epoch stands, counted in samples of its permutation: what a checkpoint records and a resume continues
from, on any number of ranks.

It exists because a step count is not a position once the device count can change: step k of an epoch covers
positions ``[k*G, (k+1)*G)`` of the epoch's seeded permutation, with the global batch ``G = world_size *
batch_size``. A checkpoint written on N ranks therefore records *samples consumed* (``samples``) and the end of what
the epoch covers (``end``: fixed when the epoch started, ``floor(n / G) * G`` under ``drop_last`` or ``n``); a run
on M ranks continues the epoch at position ``samples``, cutting ``[samples, end)`` into steps of its own global
batch ``G'``. Every remaining sample of the interrupted epoch is seen exactly once and none twice, whatever N and
M are. When ``end - samples`` is not a multiple of ``G'`` the epoch's last step is partial: it is shared out in
proportion and padded with zero-weight samples (as ``drop_last=False`` does), and it is a window of its own, so
El Che's exact weighting holds. The following epochs are planned afresh with ``G'``.

On the same device count the segment is exactly the rest of the uninterrupted plan (same steps, same windows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

__all__ = ["EpochPosition", "Segment", "epoch_end", "segment", "steps_left"]


def epoch_end(total: int, global_batch: int, drop_last: bool) -> int:
    """The positions ``[0, end)`` of the permutation an epoch started with ``global_batch`` covers."""
    return (total // global_batch) * global_batch if drop_last else total


@dataclass(frozen=True)
class EpochPosition:
    """How far epoch ``epoch`` went: ``steps`` plan steps finished, covering positions ``[0, samples)`` of its
    permutation; the epoch ends at position ``end``. JSON-able through :meth:`to_state`."""

    epoch: int
    steps: int
    samples: int
    end: int

    @property
    def finished(self) -> bool:
        return self.samples >= self.end

    def to_state(self) -> dict:
        return {"epoch": self.epoch, "steps": self.steps, "samples": self.samples, "end": self.end}

    @classmethod
    def from_state(cls, state: Any) -> "EpochPosition":
        """Read :meth:`to_state` output; refuses anything else with a ValueError naming the field."""
        if not isinstance(state, dict):
            raise ValueError(f"epoch position {state!r} is not a dict with epoch, steps, samples and end")
        values = {}
        for key in ("epoch", "steps", "samples", "end"):
            value = state.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"epoch position field {key}={value!r} is invalid: an integer >= 0 was expected")
            values[key] = value
        if values["samples"] > values["end"]:
            raise ValueError(f"epoch position has samples={values['samples']} past its end={values['end']}")
        return cls(**values)

    @classmethod
    def from_steps(cls, position: Sequence[int], total: int, global_batch: int, drop_last: bool) -> "EpochPosition":
        """A position of the older ``(epoch, steps done)`` form, written with ``global_batch`` over ``total``."""
        epoch, steps = int(position[0]), int(position[1])
        end = epoch_end(total, global_batch, drop_last)
        return cls(epoch, steps, min(end, steps * global_batch), end)


@dataclass(frozen=True)
class Segment:
    """What of epoch ``epoch`` a plan still runs: positions ``[start, end)`` in steps of ``global_batch``, the first
    being the epoch's step ``first_step``."""

    epoch: int
    first_step: int
    start: int
    end: int
    global_batch: int

    @property
    def steps(self) -> int:
        return -(-(self.end - self.start) // self.global_batch)

    @property
    def partial_last(self) -> bool:
        return (self.end - self.start) % self.global_batch != 0

    def window_end(self, j: int) -> bool:
        """Step ``j`` of the segment closes a window: the last one does, and a partial last step is a window of its
        own (so every window's micro-batches have one size per rank: exact weighting)."""
        return j == self.steps - 1 or (self.partial_last and j == self.steps - 2)

    def position(self, j: int) -> EpochPosition:
        """Where the epoch stands once the segment's first ``j`` steps are done."""
        return EpochPosition(self.epoch, self.first_step + j, min(self.end, self.start + j * self.global_batch),
                             self.end)


def segment(n: int, resume: Optional[EpochPosition], total: int, global_batch: int,
            drop_last: bool) -> Optional[Segment]:
    """The part of epoch ``n`` still to run (None: it finished before the checkpoint ``resume``)."""
    if resume is None or n > resume.epoch:
        return Segment(n, 0, 0, epoch_end(total, global_batch, drop_last), global_batch)
    if n < resume.epoch or resume.finished:
        return None
    return Segment(n, resume.steps, resume.samples, resume.end, global_batch)


def steps_left(at: Optional[EpochPosition], epochs: int, total: int, global_batch: int, drop_last: bool) -> int:
    """Micro-steps from position ``at`` (None: the start) to the end of epoch ``epochs - 1``."""
    full = len(range(0, epoch_end(total, global_batch, drop_last), global_batch))
    if at is None:
        return full * epochs
    rest = 0 if at.finished else segment(at.epoch, at, total, global_batch, drop_last).steps  # type: ignore[union-attr]
    return rest + full * max(0, epochs - at.epoch - 1)
