"""The collective backend's averages: all-reduce the replicas' parameters (CADENCE, ASYNC) or gradients
(SYNC) among the workers, bucket by bucket, in place.

Why it exists: one all-reduce of one flat copy of the model (plus the copies around it) made about four full
fp32 copies of the model per round, which does not fit next to a large model on a GPU. Here the tensors are
packed into one reusable bucket of at most ``BUCKET_NUMEL`` elements at a time, reduced, and unpacked back, so
a round's extra memory is one bucket. A small all-reduce of the per-rank weights comes first, so every rank
knows the total before it scales its share: a rank that ran no batch since the last average has weight 0 and
does not pull the average towards its stale state.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import torch

from .slots import BUCKET_NUMEL

__all__ = ["pieces", "reduce_scalars", "average_parameters", "average_gradients", "squared_norm", "GradNoise"]

GradNoise = tuple[float, float, int, float]
"""A SYNC round's gradient-noise inputs: ``(sum_r B_r |G_r|^2, sum_r B_r, ranks with B_r > 0, |G_big|^2)``, what
:func:`flodl_hf.elche.noise_scale.pooled_estimates` takes."""


def squared_norm(tensors: Sequence[torch.Tensor]) -> float:
    """``sum |t|^2`` over ``tensors`` in float64, with one device synchronisation."""
    if not tensors:
        return 0.0
    return float(torch.stack([torch.linalg.vector_norm(t, dtype=torch.float64).square() for t in tensors]).sum())


def pieces(tensors: Sequence[torch.Tensor], bucket: int) -> Iterator[list[tuple[torch.Tensor, int]]]:
    """Consecutive buckets over the flattened tensors: lists of (1-d view of a tensor's part, offset in the
    bucket). A tensor larger than a bucket is split across buckets."""
    current: list[tuple[torch.Tensor, int]] = []
    used = 0
    for t in tensors:
        flat = t.detach().view(-1)
        start = 0
        while start < flat.numel():
            take = min(flat.numel() - start, bucket - used)
            current.append((flat[start : start + take], used))
            used += take
            start += take
            if used == bucket:
                yield current
                current, used = [], 0
    if current:
        yield current


def reduce_scalars(values: Sequence[float], device: torch.device) -> list[float]:
    """Sum a few float64 scalars over the group."""
    import torch.distributed as dist

    t = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


@torch.no_grad()
def _reduce_in_buckets(
    tensors: Sequence[torch.Tensor], scale: float, device: torch.device, bucket: int, divergence: bool
) -> tuple[float, float]:
    """``t = sum over ranks of scale_r * t_r`` for every tensor; returns (||local - avg||^2, ||avg||^2)."""
    import torch.distributed as dist

    total = sum(t.numel() for t in tensors)
    if total == 0:
        return 0.0, 0.0
    buf = torch.empty(min(bucket, total), dtype=torch.float32, device=device)
    dist2 = norm2 = 0.0
    for group in pieces(tensors, buf.numel()):
        size = sum(v.numel() for v, _ in group)
        work = buf[:size]
        for view, at in group:
            work[at : at + view.numel()].copy_(view)
        if divergence:
            local = work.clone()
        work.mul_(scale)
        dist.all_reduce(work)
        if divergence:
            norm2 += float(work.square().sum())
            dist2 += float((local - work).square().sum())
            del local
        for view, at in group:
            view.copy_(work[at : at + view.numel()])
    return dist2, norm2


def average_parameters(
    params: Sequence[torch.Tensor], buffers: Sequence[torch.Tensor], batches: int, done: bool,
    device: torch.device, world: int, bucket: int = BUCKET_NUMEL,
) -> tuple[float, int, bool]:
    """Replace the parameters by their batch-weighted average over the group and the floating buffers by
    their plain mean. Returns (this rank's relative distance from the average, the batches every rank ran in
    the round, whether every rank is done)."""
    w_sum, done_sum = reduce_scalars([float(batches), 1.0 if done else 0.0], device)
    scale = float(batches) / w_sum if w_sum > 0 else 1.0 / world
    dist2, norm2 = _reduce_in_buckets(params, scale, device, bucket, divergence=True)
    _reduce_in_buckets(buffers, 1.0 / world, device, bucket, divergence=False)
    distance = 0.0 if norm2 <= 0 else (dist2 / norm2) ** 0.5
    return distance, int(round(w_sum)), done_sum > world - 0.5


def average_gradients(
    params: Sequence[torch.Tensor], buffers: Sequence[torch.Tensor], samples: int, done: bool,
    device: torch.device, world: int, bucket: int = BUCKET_NUMEL,
) -> tuple[int, bool, int, GradNoise]:
    """SYNC: every parameter's ``.grad`` becomes the sample-weighted mean gradient over the group (None where
    no rank had one, as on one device); floating buffers their plain mean. Returns (total samples, whether
    this is the final round: every rank is done and none brought a batch, the batches run by all ranks, the
    round's :data:`GradNoise`). The noise inputs ride in the scalar all-reduce that runs anyway: no extra
    collective, two local norms."""
    present = [p.grad is not None for p in params]
    local = [p.grad for p in params if p.grad is not None]
    local_sq = squared_norm(local) if samples > 0 else 0.0
    scalars = reduce_scalars(
        [float(samples), 1.0 if done else 0.0, 1.0 if samples > 0 else 0.0, float(samples) * local_sq,
         *(1.0 if h else 0.0 for h in present)],
        device,
    )
    total, done_sum, batches, weighted_sq = scalars[0], scalars[1], int(round(scalars[2])), scalars[3]
    any_grad = [v > 0.5 for v in scalars[4:]]
    for p, has in zip(params, any_grad):
        if has and p.grad is None:
            p.grad = torch.zeros_like(p)
        elif not has:
            p.grad = None
    grads = [p.grad for p in params if p.grad is not None]
    if grads:
        if samples == 0:
            for g in grads:
                g.zero_()
        scale = float(samples) / total if total > 0 else 0.0
        _reduce_in_buckets(grads, scale, device, bucket, divergence=False)
    _reduce_in_buckets(buffers, 1.0 / world, device, bucket, divergence=False)
    noise = (weighted_sq, total, batches, squared_norm(grads) if total > 0 else 0.0)
    return int(round(total)), done_sum > world - 0.5 and total == 0, batches, noise
