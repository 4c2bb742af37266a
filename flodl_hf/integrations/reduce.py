"""Summing one window's gradients over the ranks, with El Che's figures riding in the same collectives.

Why it exists: without DDP (El Che's micro-batches differ in size per rank) the gradient reduction is ours. Each
rank's accumulated gradient is already scaled so that the *sum* over ranks is the gradient one process would have
(see ``flodl_hf.integrations.loss``), so one SUM all-reduce, in buckets, is the whole reduction. A parameter no rank
gave a gradient ends with ``grad = None`` on every rank, as on one process, so Adam-type optimizers skip it.
The per-rank timings travel in a small float64 vector reduced alongside (each rank writes only its own slots).
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

    def reduce(self, extra: Sequence[float]) -> list[float]:
        """Sum every rank's gradients in place; returns ``extra`` summed over the ranks."""
        params = self.params
        meta = torch.tensor([0.0 if p.grad is None else 1.0 for p in params] + [float(x) for x in extra],
                            dtype=torch.float64, device=self.device)
        flats = []
        for bucket in self.buckets:
            flats.append(torch.cat([
                (params[i].grad if params[i].grad is not None else torch.zeros_like(params[i]))
                .detach().reshape(-1).to(torch.float32) for i in bucket]))
        handles = [dist.all_reduce(meta, async_op=True)] + [dist.all_reduce(f, async_op=True) for f in flats]
        for h in handles:
            h.wait()
        presence = meta[: len(params)].tolist()
        for bucket, flat in zip(self.buckets, flats):
            offset = 0
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
        return meta[len(params):].tolist()
