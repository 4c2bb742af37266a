"""One micro-batch's loss declarations (``graph.loss_items``), bound to the backward pass that uses them.

Why it exists: on N ranks a micro-batch's gradient is weighted by what its loss averaged over, so a declaration
that belongs to another loss re-weights the wrong gradients with no sign of it. Two loops did that: a mid-training
evaluation with gradients enabled (its ``compute_loss`` declares the eval batch's items, which the next training
micro-batch then used), and a rank that skips a bad batch (the loss declared, no ``backward()``, ``graph.step()``
still called: its items stayed in the window's denominator and shrank every other gradient). A declaration made
with ``loss=`` (every head's ``compute_loss``) is bound to that tensor by a hook that fires when a backward pass
runs through it: only those that fired count (a loss with nothing trainable on its path never fires). A
micro-batch whose only declarations were bound and never fired, and that had no backward pass at all, weighs
nothing, as one process leaving that batch out would. Declarations without ``loss=`` keep their plain rule: the
last one before ``graph.step()`` counts.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["Declarations"]


class _Declaration:
    __slots__ = ("items", "reduction", "bound", "used")

    def __init__(self, items: float, reduction: str, bound: bool) -> None:
        self.items, self.reduction, self.bound, self.used = items, reduction, bound, False

    def fired(self, grad: torch.Tensor) -> None:
        self.used = True


class Declarations:
    """The declarations of the micro-batch being computed (emptied by :meth:`reset` at ``graph.step()``)."""

    def __init__(self) -> None:
        self._all: list[_Declaration] = []

    def declare(self, items: float, reduction: str, loss: Optional[torch.Tensor]) -> None:
        # A loss with nothing trainable on its path can never be backpropagated: bound, it never counts.
        declaration = _Declaration(float(items), reduction, loss is not None)
        if loss is not None and loss.requires_grad:
            loss.register_hook(declaration.fired)
        self._all.append(declaration)

    def current(self) -> Optional[tuple[float, str]]:
        """(items, reduction) that weigh this micro-batch as far as known now: the last declaration that is
        unbound or whose loss was backpropagated; None when there is none (the plan's sample count weighs it)."""
        chosen = None
        for d in self._all:
            if not d.bound or d.used:
                chosen = d
        return None if chosen is None else (chosen.items, chosen.reduction)

    def abandoned(self) -> bool:
        """Every declaration was bound to a loss that no backward pass reached (a skipped batch, an evaluation)."""
        return bool(self._all) and all(d.bound and not d.used for d in self._all)

    def reduction(self) -> str:
        """The reduction the micro-batch declared (its last declaration's), "mean" when it declared none."""
        return self._all[-1].reduction if self._all else "mean"

    def reset(self) -> None:
        self._all = []
