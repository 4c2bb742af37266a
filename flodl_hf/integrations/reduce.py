"""Summing one window's gradients over the ranks, overlapped with the backward pass of its last micro-batch.

Why it exists: without DDP (El Che's micro-batches differ in size per rank) the gradient reduction is ours. Each
rank's accumulated gradient is already scaled so that the *sum* over ranks is the gradient one process would have
(see ``ElCheTrainer._contribution``), so one SUM all-reduce, in buckets, is the whole reduction.

It overlaps the backward pass as DDP's reducer does: the parameters are bucketed in reverse order (the order
backward produces their gradients; a small first bucket, then about 25 MB each), and while the window's last
micro-batch runs backward, each bucket's all-reduce starts as soon as every gradient in it is final, strictly in
bucket order, so every rank issues the same collectives in the same order whatever its timing. What backward did
not complete (a parameter without a gradient on this rank) is reduced at the window's end, with one small collective
that carries which parameters have a gradient anywhere, El Che's per-rank timings and counts, and a flag for a
gradient that changed after its bucket left (a parameter accumulated twice in one backward, e.g. through reentrant
activation checkpointing). If any rank raised that flag, every rank reduces the window again from its gradients,
which were left untouched, so the result is the same either way. A parameter no rank gave a gradient ends with
``grad = None`` on every rank, as on one process, so Adam-type optimizers skip it. The others' summed gradients
are views of the buckets (DDP's ``gradient_as_bucket_view``), which saves copying them back; Trainer sets them to
None after each step, and one still there when the next window's last backward begins gets its own memory first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["GradSum", "broadcast_module"]

_FIRST_BUCKET_ELEMENTS = 256 * 1024  # 1 MB of float32: the first gradients of backward leave early
_BUCKET_ELEMENTS = 25 * 256 * 1024  # 25 MB, DDP's bucket_cap_mb


def broadcast_module(module: torch.nn.Module) -> None:
    """Rank 0's parameters and buffers on every rank: one process starts from one set of weights."""
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor.data, src=0)


def _buckets(sizes: Sequence[int], first: int, rest: int) -> list[list[int]]:
    """Parameter indices in reverse order, cut into buckets of at most ``first`` elements, then ``rest`` (a larger
    tensor alone)."""
    buckets: list[list[int]] = []
    current: list[int] = []
    size, cap = 0, first
    for i in reversed(range(len(sizes))):
        if current and size + sizes[i] > cap:
            buckets.append(current)
            current, size, cap = [], 0, rest
        current.append(i)
        size += sizes[i]
    if current:
        buckets.append(current)
    return buckets


class GradSum:
    """The SUM all-reduce of the trainable parameters' gradients at a window's end, overlapped with its last
    backward when :meth:`arm` is called before it."""

    def __init__(self, params: Sequence[torch.nn.Parameter], device: torch.device, *,
                 first_bucket: int = _FIRST_BUCKET_ELEMENTS, bucket: int = _BUCKET_ELEMENTS) -> None:
        self.params = list(params)
        self.device = device
        self.buckets = _buckets([p.numel() for p in self.params], first_bucket, bucket)
        self._bucket_of = {i: b for b, bucket in enumerate(self.buckets) for i in bucket}
        self._flats = [torch.empty(sum(self.params[i].numel() for i in bucket), dtype=torch.float32, device=device)
                       for bucket in self.buckets]
        self._armed = False
        self._ready: list[bool] = []  # which gradients are final in the armed backward
        self._missing: list[int] = []  # per bucket, how many of its gradients are not final yet
        self._handles: list[Any] = []  # the all-reduce of each bucket launched so far, in bucket order
        #: whether the last window's gradients were reduced twice (a gradient changed after its bucket left)
        self.late = False
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook(i)) for i, p in enumerate(self.params)]

    def close(self) -> None:
        """Remove the gradient hooks (the parameters changed; a new GradSum takes over)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def arm(self) -> None:
        """The next backward is the window's last: start each bucket's all-reduce as soon as it is complete."""
        for p in self.params:  # a gradient left as a view of a bucket (not set to None since) gets its own memory
            if p.grad is not None and p.grad._base is not None and any(p.grad._base is f for f in self._flats):
                p.grad = p.grad.clone()
        self._armed = True
        self._ready = [False] * len(self.params)
        self._missing = [len(bucket) for bucket in self.buckets]
        self._handles = []
        self.late = False

    def _hook(self, i: int) -> Any:
        def ready(param: torch.Tensor) -> None:
            if not self._armed:
                return
            b = self._bucket_of[i]
            if b < len(self._handles):  # its bucket already left: the gradient changed after it was sent
                self.late = True
                return
            if not self._ready[i]:
                self._ready[i] = True
                self._missing[b] -= 1
            self._launch(complete_only=True)

        return ready

    def _launch(self, complete_only: bool) -> None:
        """Start the next buckets' all-reduces in order: while complete (during backward), or all (at the end)."""
        while len(self._handles) < len(self.buckets):
            b = len(self._handles)
            if complete_only and self._missing[b] > 0:
                return
            self._fill(b)
            self._handles.append(dist.all_reduce(self._flats[b], async_op=True))

    def _fill(self, b: int) -> None:
        flat, offset = self._flats[b], 0
        for i in self.buckets[b]:
            p = self.params[i]
            n = p.numel()
            if p.grad is None:
                flat[offset:offset + n].zero_()
            else:
                flat[offset:offset + n].copy_(p.grad.detach().reshape(-1))
            offset += n

    def reduce(self, extra: Sequence[float], divisor_slot: int | None = None) -> list[float]:
        """Sum every rank's gradients in place; returns ``extra`` summed over the ranks.

        With ``divisor_slot``, the summed gradients are divided by the summed ``extra[divisor_slot]`` (a window's
        denominator known only at its end)."""
        self._launch(complete_only=False)
        self._armed = False
        params = self.params
        head = torch.tensor([0.0 if p.grad is None else 1.0 for p in params] + [float(self.late)]
                            + [float(x) for x in extra], dtype=torch.float64, device=self.device)
        dist.all_reduce(head)
        for handle in self._handles:
            handle.wait()
        summed = head.tolist()
        presence, late, out = summed[: len(params)], summed[len(params)], summed[len(params) + 1:]
        self.late = bool(late)
        if late:  # a gradient changed after its bucket left, on some rank: reduce the untouched gradients again
            for b in range(len(self.buckets)):
                self._fill(b)
                dist.all_reduce(self._flats[b])
        divisor = out[divisor_slot] if divisor_slot is not None else None
        for bucket, flat in zip(self.buckets, self._flats):
            if divisor:
                flat.div_(divisor)
            offset = 0
            for i in bucket:
                p, n = params[i], params[i].numel()
                if presence[i] == 0:
                    p.grad = None
                else:
                    value = flat[offset:offset + n].view_as(p)
                    if p.dtype == value.dtype:
                        p.grad = value  # the bucket is the gradient until it is set to None: no copy back
                    elif p.grad is None:
                        p.grad = value.to(p.dtype)
                    else:
                        p.grad.copy_(value)
                offset += n
        self._handles = []
        return out
