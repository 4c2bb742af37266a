"""Epoch partitioning: which samples each rank takes at each step, identical arithmetic on every rank.

It exists apart from data loading because it is the contract between El Che and the data: step k of an epoch
covers positions ``[k*W*B, (k+1)*W*B)`` of one seeded permutation, and rank r takes ``b_r`` consecutive positions
at offset ``sum(b_q for q < r)``. Whatever sizes El Che picks, an epoch's partition stays disjoint and complete.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

__all__ = ["epoch_permutation", "length_grouped", "steps_per_epoch", "rank_slice", "LENGTH_GROUP"]

#: Length grouping sorts runs of this many per-rank batches (``LENGTH_GROUP * batch_size`` samples).
LENGTH_GROUP = 50


def epoch_permutation(n: int, seed: int) -> torch.Tensor:
    """The permutation of ``range(n)`` for one epoch: a CPU generator seeded with ``seed``, the same everywhere."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(int(seed))
    return torch.randperm(n, generator=generator)


def length_grouped(perm: torch.Tensor, lengths: Sequence[int], group: int) -> torch.Tensor:
    """``perm`` with each run of ``group`` consecutive positions sorted by length, longest first (stable).

    Batches cut from the result hold samples of similar length, so padding to the longest in a batch wastes little
    (on the packaged corpus at max length 64: 1.75x the real tokens with random batches, 1.02x grouped). Where
    length correlates with the label, length-sorted runs skew each step's labels, so it is opt-in. It is
    still a permutation, a pure function of ``perm`` and ``lengths``; ``group`` is fixed in samples (not in global
    batches), so the order does not depend on the number of ranks and an elastic resume keeps its coverage."""
    if group < 1:
        raise ValueError(f"length group={group} is invalid: it must be >= 1 samples")
    lens = torch.as_tensor(list(lengths), dtype=torch.int64)
    if lens.numel() != perm.numel():
        raise ValueError(f"{lens.numel()} lengths for {perm.numel()} samples: give one length per sample")
    out = perm.clone()
    for start in range(0, perm.numel(), group):
        chunk = perm[start:start + group]
        order = torch.sort(lens[chunk], descending=True, stable=True).indices
        out[start:start + group] = chunk[order]
    return out


def steps_per_epoch(n: int, global_batch: int, drop_last: bool = True) -> int:
    """Steps every rank runs: ``floor(n / global_batch)``, or the ceiling when the last partial step is kept."""
    if global_batch < 1:
        raise ValueError(f"global batch={global_batch} is invalid: it must be >= 1")
    return n // global_batch if drop_last else -(-n // global_batch)


def rank_slice(perm: torch.Tensor, step: int, global_batch: int, sizes: Sequence[int],
               rank: int, *, start: int = 0, end: Optional[int] = None) -> tuple[list[int], int]:
    """Indices rank ``rank`` takes at ``step`` and how many of them are padding.

    ``start`` / ``end``: the steps cover positions ``[start, end)`` of ``perm`` (default: all of it); a resumed
    epoch starts at the position its checkpoint recorded (``flodl_hf.checkpoint.position``).

    ``sizes`` are the per-rank micro-batch sizes (summing to ``global_batch``). A final partial step (only with
    ``drop_last=False``) is shared out in the same proportions; a rank whose share is zero gets one padding sample
    (from the start of the permutation) so every rank still runs the same number of steps. The window weights
    each rank by its real samples, so padding carries zero weight in the reduced gradient.
    """
    if sum(sizes) != global_batch:
        raise ValueError(f"per-rank sizes {list(sizes)} sum to {sum(sizes)}, not the global batch {global_batch}")
    n = len(perm) if end is None else int(end)
    first = int(start) + step * global_batch
    available = min(global_batch, n - first)
    if available >= global_batch:
        offset = first + sum(sizes[:rank])
        return perm[offset: offset + sizes[rank]].tolist(), 0
    # Final partial step: scale the split to what is left (largest remainder), pad the short ranks.
    exact = [available * s / global_batch for s in sizes]
    share = [int(x) for x in exact]
    order = sorted(range(len(sizes)), key=lambda q: (-(exact[q] - share[q]), q))
    for q in order[: available - sum(share)]:
        share[q] += 1
    offset = first + sum(share[:rank])
    own = perm[offset: offset + share[rank]].tolist()
    want = max(1, share[rank])
    padding = want - len(own)
    if padding > 0:
        own += perm[:padding].tolist()
    return own, padding
