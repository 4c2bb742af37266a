"""The CPU backend's shared-memory slots: where snapshots and averages live, allocated once per run.

Why it exists: the CPU backend used to send every snapshot and every average as fresh tensors through
multiprocessing queues. The queues' feeder threads then moved those tensors into shared memory in place while
the coordinator was still reading them (a segfault in about half the runs of a 30M-parameter model), and every
round made about four full copies of the model. Here each worker owns one slot (its snapshot, or in SYNC its
weighted gradients), and two average slots alternate between rounds. Messages carry only round numbers and
counts; the tensors never move. The rules that make this race-free:

- a worker writes its slot only after it applied the previous round's average, and the coordinator reads it
  only between that worker's "snapshot" message and the average it sends back;
- the coordinator averages round ``k`` into average slot ``k % 2``, in place and in buckets, and stamps the slot
  with a sequence number (odd while writing), so a worker that lags two rounds behind detects an overwritten
  slot instead of reading a torn one (it then takes the newer average).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

__all__ = ["Slots", "BUCKET_NUMEL", "average_into"]

#: Elements per averaging bucket (16 MiB of float32): bounds the temporaries of one round.
BUCKET_NUMEL = 4 * 1024 * 1024


class Slots:
    """``world`` snapshot slots and two average slots of ``numel`` float32 each, in shared memory."""

    def __init__(self, world: int, numel: int) -> None:
        self.world = int(world)
        self.numel = int(numel)
        self.snap = [torch.zeros(self.numel, dtype=torch.float32).share_memory_() for _ in range(self.world)]
        self.avg = [torch.zeros(self.numel, dtype=torch.float32).share_memory_() for _ in range(2)]
        # seq[i]: even = stable (2 * (round + 1) of the average it holds), odd = being written
        self.seq = torch.zeros(2, dtype=torch.int64).share_memory_()

    # -- coordinator side --------------------------------------------------------------------------------------
    def begin_write(self, k: int) -> torch.Tensor:
        i = k % 2
        self.seq[i] = 2 * k + 1
        return self.avg[i]

    def end_write(self, k: int) -> None:
        self.seq[k % 2] = 2 * (k + 1)

    # -- worker side -------------------------------------------------------------------------------------------
    def holds(self, k: int) -> bool:
        """Average slot ``k % 2`` holds round ``k``'s finished average (not being written, not overwritten)."""
        return int(self.seq[k % 2]) == 2 * (k + 1)


@torch.no_grad()
def average_into(
    out: torch.Tensor, sources: Sequence[torch.Tensor], weights: Sequence[float], n_weighted: int,
    bucket: int = BUCKET_NUMEL, divergence: bool = True, norms: Optional[dict] = None,
) -> float:
    """``out[:n_weighted] = sum_r w_r x_r / sum_r w_r`` and ``out[n_weighted:]`` = the plain mean, in place and
    bucket by bucket. Returns the largest relative distance ``||x_r - avg|| / ||avg||`` over the weighted part
    of ranks with a non-zero weight (how far the replicas drifted apart).

    Ranks with weight 0 (no batch since the last average) do not pull the average towards their stale state.
    When every weight is 0 nothing was trained anywhere: the weighted part is the plain mean. ``divergence=False``
    (averaging gradients) skips the measurement, a pass over every source, and returns 0. ``norms`` (a dict):
    filled with ``sources``, each source's squared norm over the weighted part, and ``average``, the average's
    (SYNC's gradient-noise inputs, measured in the same bucket pass)."""
    total = float(sum(weights))
    fractions = [float(w) / total for w in weights] if total > 0 else [1.0 / len(sources)] * len(sources)
    plain = 1.0 / len(sources)
    n = out.numel()
    dist2 = [0.0] * len(sources)
    norm2 = 0.0
    src_sq, avg_sq = [0.0] * len(sources), 0.0
    for start in range(0, n, bucket):
        end = min(n, start + bucket)
        split = min(max(n_weighted, start), end)  # [start, split) weighted, [split, end) plain
        chunk = out[start:end]
        chunk.zero_()
        for x, f in zip(sources, fractions):
            if split > start and f != 0.0:
                chunk[: split - start].add_(x[start:split], alpha=f)
            if end > split:
                chunk[split - start :].add_(x[split:end], alpha=plain)
        if norms is not None and split > start:
            avg_sq += float(chunk[: split - start].square().sum(dtype=torch.float64))
            for r, x in enumerate(sources):
                src_sq[r] += float(x[start:split].square().sum(dtype=torch.float64))
        if divergence and split > start:
            avg = chunk[: split - start]
            norm2 += float(avg.square().sum())
            for r, (x, f) in enumerate(zip(sources, fractions)):
                if f != 0.0:
                    dist2[r] += float((x[start:split] - avg).square().sum())
    if norms is not None:
        norms.update(sources=src_sq, average=avg_sq)
    if norm2 <= 0.0:
        return 0.0 if max(dist2, default=0.0) == 0.0 else float("inf")
    return max(d for d in dist2) ** 0.5 / norm2**0.5
