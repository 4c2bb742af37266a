"""Summing one window's gradients over the ranks, with El Che's figures riding in the same collectives.

Why it exists: without DDP (El Che's micro-batches differ in size per rank) the gradient reduction is ours. Each
rank's accumulated gradient is already scaled so that the *sum* over ranks is the gradient one process would have
(see ``flodl_hf.integrations.loss``), so one SUM all-reduce, in buckets, is the whole reduction. A parameter no rank
gave a gradient ends with ``grad = None`` on every rank, as on one process, so Adam-type optimizers skip it.
The per-rank timings and counts ride at the front of the first bucket (each rank writes only its own slots, or a
sum), so a window costs one collective per bucket.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = ["GradSum", "broadcast_module"]

_BUCKET_ELEMENTS = 8 * 1024 * 1024  # 32 MB of float32 per collective


def broadcast_module(module: torch.nn.Module) -> None:
    """Rank 0's parameters and buffers on every rank: one process starts from one set of weights."""
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor.data, src=0)


class GradSum:
    """The SUM all-reduce of the trainable parameters' gradients at a window's end."""

    def __init__(self, params: Sequence[torch.nn.Parameter], device: torch.device) -> None:
        self.params = list(params)
        self.device = device
        self.buckets: list[list[int]] = []
        current: list[int] = []
        size = 0
        for i, p in enumerate(self.params):
            if current and size + p.numel() > _BUCKET_ELEMENTS:
                self.buckets.append(current)
                current, size = [], 0
            current.append(i)
            size += p.numel()
        if current:
            self.buckets.append(current)

    def reduce(self, extra: Sequence[float], divisor_slot: int | None = None) -> list[float]:
        """Sum every rank's gradients in place; returns ``extra`` summed over the ranks.

        The presence flags and ``extra`` ride at the front of the first bucket (one collective per bucket). With
        ``divisor_slot``, the summed gradients are divided by the summed ``extra[divisor_slot]`` (a window's
        denominator known only at its end)."""
        params = self.params
        head = [0.0 if p.grad is None else 1.0 for p in params] + [float(x) for x in extra]
        flats = []
        for b, bucket in enumerate(self.buckets):
            parts = [torch.tensor(head, dtype=torch.float32, device=self.device)] if b == 0 else []
            parts += [(params[i].grad if params[i].grad is not None else torch.zeros_like(params[i]))
                      .detach().reshape(-1).to(torch.float32) for i in bucket]
            flats.append(torch.cat(parts))
        handles = [dist.all_reduce(f, async_op=True) for f in flats]
        for h in handles:
            h.wait()
        summed = flats[0][: len(head)].tolist()
        presence, out = summed[: len(params)], summed[len(params):]
        divisor = out[divisor_slot] if divisor_slot is not None else None
        for b, (bucket, flat) in enumerate(zip(self.buckets, flats)):
            offset = len(head) if b == 0 else 0
            if divisor:
                flat.div_(divisor)
            for i in bucket:
                p, n = params[i], params[i].numel()
                if presence[i] == 0:
                    p.grad = None
                else:
                    value = flat[offset:offset + n].view_as(p)
                    if p.grad is None:
                        p.grad = value.to(p.dtype).clone()
                    else:
                        p.grad.copy_(value)
                offset += n
        return out
