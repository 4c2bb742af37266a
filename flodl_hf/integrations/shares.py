"""Each rank's part of the loss one process computes for a whole micro-batch.

Why it exists: one `transformers.Trainer` process computes one loss per micro-batch; on N ranks each rank holds a
share of that micro-batch (El Che's, unequal), and the ranks' losses, summed, must be the one process's. The rule
here makes that true without knowing how the loss is built: each rank computes the loss *one process would
compute if the micro-batch were this rank's rows*, and weighs it by its share of the micro-batch's items.

* A mean over the rank's own items (or samples): weighed by its share, the ranks' means sum to the micro-batch's.
* A sum divided by Trainer's ``num_items_in_batch`` (the window's count, N): the rank is handed N times its share,
  which is the count one process would see if the window held this share's proportions; weighed by its share,
  the ranks' terms sum to the micro-batch's sum over N.
* Anything added that does not depend on the rows (a penalty on the weights, added to ``super()``'s loss) is
  weighed by the shares too, so it is counted once, as one process counts it, and not once per rank.

A loss that turns the count into an integer (``int()``, ``.long()``, ``//``) would truncate the rank's fractional
count; ``CountProbe`` detects that on the first micro-batch, and the run then hands every rank the window's whole
count N and adds the ranks' terms unweighed (exact for a sum over N, the form such a loss has).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["CountProbe", "Part", "rank_count", "weighed"]

# What turns a count into a whole number: Python's int(), an integer dtype, and rounding operations.
_INTEGRAL = {"__int__", "__index__", "__long__", "long", "int", "short", "floor", "ceil", "round", "trunc", "fix",
             "floor_divide", "__floordiv__", "__rfloordiv__", "__ifloordiv__"}


class CountProbe(torch.Tensor):
    """``num_items_in_batch`` as handed to the loss once, to learn whether the loss turns it into a whole number
    (``.item()`` and ``float()`` keep a fractional count and are fine)."""

    integral: bool = False

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        with torch._C.DisableTorchFunctionSubclass():
            result = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", str(func))
        if name in _INTEGRAL or (isinstance(result, torch.Tensor) and result.dtype != torch.bool
                                 and not result.is_floating_point() and not result.is_complex()):
            cls.integral = True
        return result


@dataclass
class Part:
    """One micro-batch of this rank in the current window, queued when the window is drawn.

    ``total_items`` / ``total_samples`` are the counts of the whole global micro-batch (all ranks), or None when
    the window has one micro-batch and the denominator rides with the gradients instead."""

    weight: int
    items: int | None
    total_items: float | None
    samples: int
    total_samples: float | None
    window: int
    declared: float | None = None  # ElCheArguments.loss_items of this part, and of the whole micro-batch
    total_declared: float | None = None

    def share(self) -> float:
        """This part's share of the micro-batch: of its labelled items where counted, else of its samples."""
        if self.items is not None:
            return self.items / self.total_items if self.total_items else 0.0
        return self.samples / self.total_samples


def rank_count(whole: torch.Tensor, part: Part) -> torch.Tensor:
    """The count handed to this rank's loss: the window's count N times the part's share of the micro-batch (N
    itself where the part has no labelled item: its term is weighed by 0, and N keeps it finite)."""
    if not part.items or not part.total_items:
        return whole
    return whole * (part.items / part.total_items)


def weighed(loss: torch.Tensor, part: Part, whole_count: bool) -> torch.Tensor:
    """This rank's term of the micro-batch's one-process loss (summed over the ranks)."""
    if part.declared is not None:  # a mean over what ElCheArguments.loss_items declared: weigh by its share
        return loss * (part.declared / part.total_declared) if part.total_declared else loss * 0.0
    if whole_count:  # a sum over the window's whole count: the ranks' terms add up as they are
        return loss
    return loss * part.share()
