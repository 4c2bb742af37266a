"""Ddp: manual collectives for loops that want to decide themselves when and how ranks agree.

``Trainer.setup*`` already synchronises through El Che windows; this class is for advanced users who write their
own schedule (e.g. gradient accumulation with custom weights). Every method is a no-op on a single device.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist

from .collectives import GradBuckets, all_reduce_tensors, broadcast_tensors

__all__ = ["Ddp"]


def _module_of(target: Any) -> torch.nn.Module:
    if isinstance(target, torch.nn.Module):
        return target
    graph = target.graph() if hasattr(target, "graph") else None
    module = getattr(graph, "module", None)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"Ddp needs a torch.nn.Module, a Graph or a task head, got {type(target).__name__}")
    return module


class Ddp:
    """Explicit parameter, gradient and buffer synchronisation over the current process group."""

    def __init__(self, target: Any, group: Optional[dist.ProcessGroup] = None) -> None:
        self.module = _module_of(target)
        self.group = group
        self._buckets: Optional[GradBuckets] = None

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.group) if dist.is_available() and dist.is_initialized() else 1

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group) if dist.is_available() and dist.is_initialized() else 0

    def _device(self) -> torch.device:
        try:
            return next(self.module.parameters()).device
        except StopIteration:
            return torch.device("cpu")

    def sync_params(self, src: int = 0) -> None:
        """Make every rank's parameters and buffers bit-identical to rank ``src``'s."""
        if self.world_size == 1:
            return
        tensors = [p.data for p in self.module.parameters()] + [b for b in self.module.buffers()]
        broadcast_tensors(tensors, src=src, group=self.group)

    def sync_buffers(self, src: int = 0) -> None:
        """Broadcast buffers (e.g. BatchNorm running statistics) from rank ``src``."""
        if self.world_size == 1:
            return
        buffers = list(self.module.buffers())
        if buffers:
            broadcast_tensors(buffers, src=src, group=self.group)

    def all_reduce_gradients(self) -> None:
        """Replace every gradient by its plain mean over ranks."""
        self.weighted_all_reduce_gradients([1.0] * self.world_size)

    def weighted_all_reduce_gradients(self, counts: Sequence[float]) -> None:
        """Replace every gradient by ``sum_r counts[r] * grad_r / sum(counts)``.

        With ``counts[r]`` = samples rank r averaged over, this is the exact mean gradient over all samples.
        """
        world = self.world_size
        if len(counts) != world:
            raise ValueError(f"counts has {len(counts)} entries for a world of {world} ranks: give one per rank")
        if any(c < 0 for c in counts) or sum(counts) <= 0:
            raise ValueError(f"counts={list(counts)} must be >= 0 with a positive sum")
        if world == 1:
            return
        if self._buckets is None:
            self._buckets = GradBuckets(self.module.parameters(), self._device())
        self._buckets.pack(float(counts[self.rank]))
        self._buckets.all_reduce()
        self._buckets.unpack(float(sum(counts)))

    def all_reduce_buffers(self) -> None:
        """Average floating buffers over ranks (an alternative to broadcasting them)."""
        if self.world_size > 1:
            all_reduce_tensors(list(self.module.buffers()), average=True, group=self.group)
