"""Overlap of the window-end all-reduce with the last micro-batch's backward pass (``DdpConfig.overlap``).

Why it exists: torch DDP hides most of its all-reduce behind backward; an El Che window that reduces only after
``graph.step()`` pays the whole reduction on top of compute. Here a post-accumulate-grad hook on every trainable
parameter notices, during the backward pass of a window's *last* micro-batch, that a bucket's gradients are all
ready, adds them (weighted by the micro-batch's loss denominator, exactly as ``WindowGrads.accumulate`` would at
``graph.step()``) and starts that bucket's all-reduce at once. Buckets start in ``WindowGrads``' fixed launch
order (last bucket first), so every rank's collectives match; ``graph.step()`` then launches the rest, exchanges
the metadata and waits.

The update is unchanged: the same buffers receive the same ``d * grad`` terms, only earlier. What could make it
differ is refused instead of being silently wrong:

- a second backward pass in the same micro-batch that reaches a parameter whose bucket is already on the wire;
- ``p.grad`` changed between ``backward()`` and ``graph.step()`` through ``.data`` (a sampled fingerprint of the
  buckets started early; edits the version counter sees are refused for every parameter, overlap or not, by
  ``grad_guard``; clip with ``DdpConfig.max_grad_norm``, which clips the reduced gradient);
- ``graph.loss_items(...)`` declared after the backward pass with a different count than the weight used.

A micro-batch is armed only when it is known to close the window: its plan step ends a window, or it fills the
anchor. Parameters that are trainable but get no gradient keep their bucket (and the ones after it in the order)
for ``graph.step()``: correct, just not overlapped.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from .errors import DistributedError
from .param_hooks import ParamHooks

__all__ = ["OverlapHooks"]

_SAMPLES = 64  # elements per gradient in the fingerprint


def _fingerprint(grad: torch.Tensor) -> torch.Tensor:
    """A cheap float64 sum of about ``_SAMPLES`` evenly spaced elements: it changes when a whole gradient is scaled,
    clipped, zeroed or noised, whatever route the edit took (no device sync: compared once at ``graph.step()``)."""
    flat = grad.detach().reshape(-1)
    step = max(1, flat.numel() // _SAMPLES)
    return flat[::step].sum(dtype=torch.float64)


# (weight, counts, items were declared) of an armed micro-batch; None: not armed
Arming = Optional[tuple[float, bool, bool]]


class OverlapHooks(ParamHooks):
    """Per-rank hooks that launch a window's buckets during its last backward pass."""

    def __init__(self, grads: Any, arm: Callable[[], Arming]) -> None:
        self.grads = grads
        self._arm = arm  # decides, at the first gradient of a micro-batch, whether it closes the window
        self.launched_early = 0  # buckets started during a backward pass, over the run (for tests and figures)
        super().__init__(grads.params)

    # --- per micro-batch ----------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the micro-batch (after ``graph.step()``)."""
        self.armed: Optional[bool] = None  # None: not decided yet in this micro-batch
        self.weight, self.counts, self.declared = 0.0, True, False
        self.fired: set[int] = set()
        self.added: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}  # parameter -> (grad, version, print)
        self._waiting: dict[int, set[int]] = {}  # bucket -> trainable parameters whose gradient is not ready yet

    def _decide(self) -> None:
        arming = None if self._paused else self._arm()
        self.armed = arming is not None
        if arming is None:
            return
        self.weight, self.counts, self.declared = arming
        params = self.grads.params
        self._waiting = {b: {i for i in self.grads.members[b] if params[i].requires_grad}
                         for b in range(len(self.grads.buffers))}

    def _on_grad(self, i: int, param: torch.Tensor) -> None:
        if self.armed is None:
            self._decide()
        if not self.armed:
            return
        where = self.grads.where.get(i)
        if i in self.added or (i in self.fired and where is not None and where[0] not in self._waiting):
            raise DistributedError(
                f"parameter #{i} ({tuple(param.shape)}) got a gradient twice in one micro-batch, after its bucket "
                "had started its all-reduce (DdpConfig(overlap=True)): a second backward pass (sum the losses "
                "first), a backward pass between two graph.step() calls that is not training, or reentrant "
                "gradient checkpointing over shared weights. Run one backward per graph.step(), or set "
                "DdpConfig(overlap=False)")
        self.fired.add(i)
        if where is None:
            return  # outside the bucket layout: added at graph.step() and reduced after the metadata
        waiting = self._waiting.get(where[0])
        if waiting is not None:
            waiting.discard(i)
        self._launch_ready()

    def _launch_ready(self) -> None:
        grads = self.grads
        while True:
            b = grads.next_bucket()
            if b is None or self._waiting.get(b):
                return
            for i in grads.members[b]:
                grad = grads.params[i].grad
                if i in self.fired and grad is not None:
                    if self.counts:
                        grads.add(i, grad, self.weight)
                    self.added[i] = (grad, grad._version, _fingerprint(grad))
            self._waiting.pop(b, None)
            grads.launch_next()
            self.launched_early += 1

    # --- graph.step() ---------------------------------------------------------------------------------------
    def settle(self, items: Optional[tuple[float, str]], weight: float) -> frozenset:
        """At ``graph.step()`` of an armed micro-batch: check nothing changed what the launched buckets hold, clear
        their ``p.grad`` and return their parameters (``accumulate`` skips them)."""
        if not self.added:
            return frozenset()
        if self.counts and weight != self.weight:
            declared = f"graph.loss_items({items[0]:g})" if items is not None else "the plan's sample count"
            raise DistributedError(
                f"this micro-batch's weight is {declared} = {weight:g}, but its gradients were already being "
                f"reduced with weight {self.weight:g} during backward (DdpConfig(overlap=True)): call "
                "graph.loss_items(...) once, before loss.backward() (every head's compute_loss does), or set "
                "DdpConfig(overlap=False)")
        changed = [i for i, (kept, version, _) in self.added.items()
                   if self.grads.params[i].grad is not kept or kept._version != version]
        if not changed:  # an edit through .data keeps the version: compare the sampled fingerprints (one sync)
            before = torch.stack([f for _, _, f in self.added.values()])
            after = torch.stack([_fingerprint(kept) for kept, _, _ in self.added.values()])
            differs = (before.view(torch.int64) != after.view(torch.int64)).nonzero().flatten().tolist()  # NaN-safe
            keys = list(self.added)
            changed = [keys[k] for k in differs]
        if changed:
            raise DistributedError(
                f"parameter #{changed[0]}'s gradient was changed between backward() and graph.step() (through "
                "its .data) after it had started its all-reduce; on N ranks an edit of each rank's own gradient "
                "never equals the one-device edit of the averaged one. Clip with DdpConfig(max_grad_norm=...) (it "
                "clips the reduced gradient); express other changes in the loss")
        for i in self.added:
            self.grads.params[i].grad = None
        return frozenset(self.added)
