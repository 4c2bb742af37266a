"""What a user's loop may not do to the gradients between ``backward()`` and ``graph.step()`` on N ranks.

Why it exists: on one device, ``loss.backward(); clip_grad_norm_(...); optimizer.step()`` clips the gradient of
the whole batch. On N ranks, ``graph.step()`` takes each rank's *own* micro-batch gradient into the window and the
average is formed only at the window end, so the same clip would act on each rank's part, not on the average, and
the model would differ from the one-device run with no sign of it (a user-trial measured 3e-2 on a BERT head). The
same holds for gradient accumulation done by the loop itself (``graph.step()`` every K batches): the plan's
per-batch weights then fall behind the batches actually computed. Both are refused here, on every rank, whatever
``DdpConfig.overlap`` says:

- ``p.grad`` changed after the backward pass gave it (another tensor, or its version counter moved: a clip, a
  scale, a zeroing, noise), or a gradient on a hooked parameter that no backward pass gave it;
- more than one backward pass per ``graph.step()`` while further batches of ``graph.epoch()`` are already drawn
  (the loop accumulates over batches). Two losses of one batch, each with its own backward, stay allowed (the
  gradients add as on one device), as does read-ahead with one backward per batch.

A post-accumulate-grad hook on every trainable parameter records the gradient it leaves and how often it fired;
``graph.step()`` compares before anything is taken. Edits through ``.data`` keep the version counter: the overlap
hooks' sampled fingerprint catches those for the buckets they started early; elsewhere they go unseen.
"""

from __future__ import annotations

import torch

from .errors import DistributedError
from .param_hooks import ParamHooks

__all__ = ["GradGuard"]


class GradGuard(ParamHooks):
    """Per-rank hooks recording each micro-batch's gradients, checked at ``graph.step()``."""

    def reset(self) -> None:
        """Forget the micro-batch (after ``graph.step()`` took its gradients)."""
        self.seen: dict[int, list] = {}  # parameter -> [backward passes, the grad it left, its version]

    def _on_grad(self, i: int, param: torch.Tensor) -> None:
        if self._paused:
            return
        grad = param.grad
        record = self.seen.get(i)
        version = grad._version if grad is not None else -1
        if record is None:
            self.seen[i] = [1, grad, version]
        else:
            record[0], record[1], record[2] = record[0] + 1, grad, version

    def check(self, drawn_ahead: int) -> None:
        """At ``graph.step()``, before its gradients are taken. ``drawn_ahead``: batches of ``graph.epoch()``
        drawn but not yet stepped (read-ahead, or a loop accumulating over batches)."""
        if self._paused:
            return
        for i, (_, grad, version) in self.seen.items():
            current = self.params[i].grad
            if current is not grad or (grad is not None and grad._version != version):
                raise DistributedError(self._changed(i, "was changed between backward() and graph.step()"))
        for i in self._handles:
            if i not in self.seen and self.params[i].grad is not None:
                raise DistributedError(self._changed(i, "was set between graph.step() calls without a backward "
                                                        "pass"))
        passes = max((record[0] for record in self.seen.values()), default=0)
        if passes > 1 and drawn_ahead > 0:
            raise DistributedError(
                f"graph.step() came after {passes} backward passes while {drawn_ahead} more batch(es) of "
                "graph.epoch() were already drawn: the loop accumulates gradients over batches itself, and on N "
                "ranks each batch's weight would then be another batch's. Call graph.step() after every batch's "
                "backward: El Che accumulates micro-batches into one optimizer step for you "
                "(DdpConfig(fixed_anchor=K) for a K-times larger effective batch); for two losses of one batch, add "
                "them and call backward once")

    def _changed(self, i: int, what: str) -> str:
        shape = tuple(self.params[i].shape)
        return (f"parameter #{i} {shape}: its gradient {what} (a clip, a scale, a zeroing, noise): on N ranks that "
                "would change each rank's own micro-batch gradient, not the window's averaged one a one-device run "
                "changes, so the models would differ. Clip with DdpConfig(max_grad_norm=...) (it clips the reduced "
                "gradient); express other changes in the loss")
