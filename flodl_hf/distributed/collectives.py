"""Flattened, bucketed collectives over a module's gradients, parameters and buffers.

It exists so that a window end costs a few large all-reduces instead of one per tensor (hundreds for a
transformer), and so that the setup-mode window (``window_grads``) and the manual ``Ddp`` share one bucket layout.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import torch
import torch.distributed as dist

__all__ = ["GradBuckets", "bucket_layout", "broadcast_tensors", "all_reduce_tensors"]


def bucket_layout(numels: Sequence[int], bucket_mb: float, prefix: int = 0
                  ) -> tuple[list[tuple[int, int]], list[int]]:
    """Assign tensors of ``numels`` elements to buckets of at most ``bucket_mb`` MiB of float32 (a tensor larger
    than a bucket gets one of its own). The first bucket starts after ``prefix`` reserved elements. Returns each
    tensor's (bucket, offset) and every bucket's size."""
    limit = max(1, int(bucket_mb * 1024 * 1024 / 4))
    where: list[tuple[int, int]] = []
    sizes: list[int] = []
    used, has_tensors = prefix, False
    for n in numels:
        if has_tensors and used + n > limit:
            sizes.append(used)
            used, has_tensors = 0, False
        where.append((len(sizes), used))
        used += n
        has_tensors = True
    sizes.append(used)
    return where, sizes


class GradBuckets:
    """Preallocated float32 buffers holding every trainable parameter's gradient, in buckets of bounded size."""

    def __init__(self, params: Iterable[torch.nn.Parameter], device: torch.device, *, bucket_mb: float = 64.0) -> None:
        self.params = [p for p in params if p.requires_grad]
        where, sizes = bucket_layout([p.numel() for p in self.params], bucket_mb)
        self.layout: list[list[tuple[torch.nn.Parameter, int, int]]] = [[] for _ in sizes]  # (param, start, numel)
        for p, (b, start) in zip(self.params, where):
            self.layout[b].append((p, start, p.numel()))
        self.buffers = [torch.zeros(max(1, s), dtype=torch.float32, device=device) for s in sizes]

    def pack(self, scale: float) -> None:
        """Copy ``grad * scale`` of every parameter into the buffers (zeros where a gradient is missing)."""
        for buf, bucket in zip(self.buffers, self.layout):
            for p, start, n in bucket:
                view = buf[start: start + n]
                if p.grad is None:
                    view.zero_()
                else:
                    view.copy_(p.grad.detach().reshape(-1))
                    if scale != 1.0:
                        view.mul_(scale)

    def unpack(self, divisor: float) -> None:
        """Write ``buffer / divisor`` back as every parameter's gradient."""
        inv = 1.0 / divisor
        for buf, bucket in zip(self.buffers, self.layout):
            for p, start, n in bucket:
                value = buf[start: start + n].view(p.shape)
                if p.grad is None:
                    p.grad = torch.empty_like(p)
                p.grad.copy_(value * inv if inv != 1.0 else value)

    def all_reduce(self) -> None:
        """SUM all-reduce of the buckets (all launched, then all awaited)."""
        works = [dist.all_reduce(buf, op=dist.ReduceOp.SUM, async_op=True) for buf in self.buffers]
        for work in works:
            work.wait()


def _flat_groups(tensors: Sequence[torch.Tensor]) -> dict[tuple[torch.dtype, torch.device], list[torch.Tensor]]:
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    return groups


def broadcast_tensors(tensors: Sequence[torch.Tensor], src: int = 0, group: Optional[dist.ProcessGroup] = None) -> None:
    """Broadcast tensors in place from ``src`` with one flattened collective per dtype."""
    for _, ts in _flat_groups([t.data for t in tensors]).items():
        flat = torch.cat([t.reshape(-1) for t in ts])
        dist.broadcast(flat, src=src, group=group)
        offset = 0
        for t in ts:
            n = t.numel()
            t.copy_(flat[offset: offset + n].view_as(t))
            offset += n


def all_reduce_tensors(tensors: Sequence[torch.Tensor], *, average: bool,
                       group: Optional[dist.ProcessGroup] = None) -> None:
    """SUM (or mean) all-reduce of floating tensors in place, one flattened collective per dtype."""
    world = dist.get_world_size(group)
    for _, ts in _flat_groups([t.data for t in tensors if t.is_floating_point()]).items():
        flat = torch.cat([t.reshape(-1) for t in ts])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        if average:
            flat.div_(world)
        offset = 0
        for t in ts:
            n = t.numel()
            t.copy_(flat[offset: offset + n].view_as(t))
            offset += n
