"""Which samples each rank takes inside `transformers.Trainer`: El Che's split over Trainer's own windows.

Why it exists: Trainer counts optimizer steps from ``len(train_dataloader)`` and prefetches one gradient-accumulation
window of micro-batches per step, so every rank must have the same number of micro-batches, in the same windows, or
the next collective hangs. This module keeps that shape and changes only *how many samples* each rank takes:

* one seeded permutation of the train set per epoch, the same on every rank (``flodl_hf.elche.partition``);
* global micro-batch ``k`` covers positions ``[k*U, (k+1)*U)`` of it (``U`` = per-device batch x world size at the
  run's start), the micro-batches a one-process Trainer with batch ``U`` would draw;
* inside it rank ``r`` takes ``b_r`` consecutive positions, El Che's sizes for the window, fixed for the window.

Window ``w`` of the run (counted over epochs: optimizer step ``w``) takes El Che's current sizes, or, with
``ElCheArguments(replay_plan=...)``, the sizes a recorded run gave it; either way the split is recorded
(``WindowPlan.record``, written to ``output_dir/elche_plan.json``). A rank whose share of a short final micro-batch
is empty gets one sample of weight 0, so it still runs the micro-batch. The positions consumed after ``k`` windows do not depend on the split, which is why a checkpoint
resumes on any number of ranks with every remaining sample seen once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ..elche.partition import epoch_permutation, length_grouped
from ..elche.plan_record import PlanRecord, PlanReplay
from ..elche.split import largest_remainder

__all__ = [
    "WEIGHT_KEY",
    "PlanBatchSampler",
    "PlanLoader",
    "WeighedBatches",
    "WeightedCollate",
    "WeightedRows",
    "WindowPlan",
    "check_sizes",
    "equal_sizes",
    "spans",
    "split_partial",
]

#: Key under which the collated batch carries its weight (1 real, 0 padding); popped before the model sees it.
WEIGHT_KEY = "__elche_weight__"


def spans(sizes: Sequence[int], count: int) -> list[tuple[int, int]]:
    """Each rank's ``(offset, length)`` in a global micro-batch of ``count`` samples: El Che's ``sizes``, or, for a
    short last micro-batch (``count < sum(sizes)``), the sizes split in proportion, where a rank may get 0 (it then
    runs the micro-batch's first sample at weight 0). One rule for the plan sampler and the stream's dealer."""
    own = list(sizes) if count == sum(sizes) else split_partial(sizes, count)
    out, lo = [], 0
    for size in own:
        out.append((lo, size))
        lo += size
    return out


def split_partial(sizes: Sequence[int], total: int) -> list[int]:
    """``total`` (< ``sum(sizes)``) samples split in the proportions of ``sizes``; a rank may get 0."""
    full = sum(sizes)
    quotas = [total * s / full for s in sizes]
    out = [int(q) for q in quotas]
    order = sorted(range(len(sizes)), key=lambda r: (-(quotas[r] - out[r]), r))
    for r in order[: total - sum(out)]:
        out[r] += 1
    return out


class WindowPlan:
    """The split of the current window, read by the batch sampler when a window's first micro-batch is drawn.

    ``sizes`` is set by the trainer after each window's report (El Che's next plan). The sampler snapshots it at a
    window's first micro-batch, a point every rank reaches in the same program order, so all ranks agree even when
    a DataLoader reads ahead.
    """

    def __init__(self, world_size: int, rank: int, global_micro_batch: int, micro_batches_per_window: int,
                 sizes: Sequence[int], replay: PlanReplay | None = None) -> None:
        self.world_size = world_size
        self.rank = rank
        self.global_micro_batch = global_micro_batch
        self.micro_batches_per_window = micro_batches_per_window
        self.sizes = list(sizes)
        #: the sizes of the window drawn last, and how many windows were drawn (for logs and tests)
        self.last_drawn: list[int] = list(sizes)
        self.windows_drawn = 0
        #: a recorded plan played back instead of ``sizes`` (``ElCheArguments(replay_plan=...)``)
        self.replay = replay
        #: the split of every window drawn, by its index in the run (``elche_plan.json``)
        self.record = PlanRecord(world_size)
        self.record.restart(global_micro_batch // world_size)
        self.record.window(0, micro_batches_per_window)
        self.record_from = 0

    def draw(self, window: int) -> list[int]:
        """The split of window ``window`` (its index in the run, counted over epochs): the replayed one, or El Che's
        current sizes; recorded either way."""
        sizes = self.replay.split(window) if self.replay is not None else list(self.sizes)
        if window >= self.record_from:  # a resume skips (draws again) the windows its checkpoint recorded
            self.record.split(window, sizes)
        self.last_drawn, self.windows_drawn = sizes, self.windows_drawn + 1
        return sizes


class PlanBatchSampler:
    """This rank's micro-batches of each epoch, as lists of dataset indices (``-1 - i`` marks a weight-0 sample).

    ``len()`` is the same on every rank and equals a one-process Trainer's number of micro-batches for batch ``U``.
    """

    def __init__(self, n: int, plan: WindowPlan, seed: int, *, order: str = "random",
                 lengths: Sequence[int] | None = None, drop_last: bool = False) -> None:
        if order not in ("random", "sequential", "group_by_length"):
            raise ValueError(f"order={order!r} is unknown: use 'random', 'sequential' or 'group_by_length'")
        if order == "group_by_length" and lengths is None:
            raise ValueError("group_by_length needs one length per sample")
        self.n, self.plan, self.seed, self.order = n, plan, int(seed), order
        self.lengths, self.drop_last, self.epoch = lengths, drop_last, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        u = self.plan.global_micro_batch
        return self.n // u if self.drop_last else -(-self.n // u)

    def permutation(self, epoch: int) -> torch.Tensor:
        """The order of ``range(n)`` for ``epoch``, identical on every rank."""
        if self.order == "sequential":
            return torch.arange(self.n)
        perm = epoch_permutation(self.n, self.seed + epoch)
        if self.order == "group_by_length":
            u, m = self.plan.global_micro_batch, self.plan.micro_batches_per_window
            perm = length_grouped(perm, self.lengths, 50 * u * m)  # Trainer's mega-batch: 50 x its batch x GA
        return perm

    def __iter__(self) -> Iterator[list[int]]:
        perm = self.permutation(self.epoch).tolist()
        plan = self.plan
        u, m, r = plan.global_micro_batch, plan.micro_batches_per_window, plan.rank
        sizes: list[int] = plan.sizes
        per_epoch = -(-len(self) // m)  # windows per epoch, the last one possibly short
        for k in range(len(self)):
            if k % m == 0:
                sizes = plan.draw(self.epoch * per_epoch + k // m)
            start = k * u
            lo, size = spans(sizes, min(u, self.n - start))[r]
            if size > 0:
                yield perm[start + lo:start + lo + size]
            else:  # nothing of this short micro-batch is ours: run one sample at weight 0
                yield [-1 - perm[start]]


class WeightedRows(torch.utils.data.Dataset):
    """The train set seen through the plan's indices: yields ``(row, weight)``."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: int) -> tuple[Any, int]:
        return (self.dataset[key], 1) if key >= 0 else (self.dataset[-1 - key], 0)

    def __getitems__(self, keys: list[int]) -> list[tuple[Any, int]]:
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is None:
            return [self[k] for k in keys]
        rows = getitems([k if k >= 0 else -1 - k for k in keys])
        return [(row, int(k >= 0)) for row, k in zip(rows, keys)]


class WeightedCollate:
    """The user's collator on the rows, then the batch's weight under ``WEIGHT_KEY``."""

    def __init__(self, collate: Callable[[list[Any]], Any]) -> None:
        self.collate = collate

    def __call__(self, pairs: list[tuple[Any, int]]) -> Any:
        batch = self.collate([row for row, _ in pairs])
        batch[WEIGHT_KEY] = min(w for _, w in pairs)
        return batch


class PlanLoader(torch.utils.data.DataLoader):
    """The train loader on N ranks, with the surface of the one Trainer returns (``total_batch_size``,
    ``set_epoch``, ``len``): its batches are what the user's collator makes, and each batch's weight travels beside
    it, on the iterator (``weights``), so no key of El Che's reaches code that reads the loader."""

    def __init__(self, dataset: Any, *, batch_sampler: PlanBatchSampler, collate_fn: Callable, **kwargs: Any) -> None:
        super().__init__(WeightedRows(dataset), batch_sampler=batch_sampler, collate_fn=WeightedCollate(collate_fn),
                         **kwargs)

    @property
    def total_batch_size(self) -> int:
        """Samples per micro-batch over all ranks (El Che splits each one unequally between them)."""
        return self.batch_sampler.plan.global_micro_batch

    @property
    def drop_last(self) -> bool:
        """Whether a short last global micro-batch is dropped (``dataloader_drop_last``), as on Trainer's loader."""
        return bool(self.batch_sampler.drop_last)

    @drop_last.setter
    def drop_last(self, value: bool) -> None:
        """DataLoader sets it to False for a batch sampler; the batch sampler's own is the truth."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)

    def __iter__(self) -> WeighedBatches:
        return WeighedBatches(super().__iter__())


class WeighedBatches:
    """An iteration of a ``PlanLoader``: each batch without its weight, which is queued in ``weights``."""

    def __init__(self, batches: Iterator[Any]) -> None:
        self.batches = batches
        self.weights: deque[int] = deque()

    def __iter__(self) -> WeighedBatches:
        return self

    def __next__(self) -> Any:
        batch = next(self.batches)
        self.weights.append(int(batch.pop(WEIGHT_KEY)))
        return batch


def check_sizes(sizes: Sequence[int], world_size: int, global_micro_batch: int) -> list[int]:
    """A pinned split must give every rank at least one sample and sum to the global micro-batch."""
    out = list(sizes)
    if len(out) != world_size or any(not isinstance(s, int) or s < 1 for s in out) or sum(out) != global_micro_batch:
        raise ValueError(
            f"ElCheArguments(batch_sizes={list(sizes)!r}) does not fit this run: give {world_size} ints >= 1 summing "
            f"to per_device_train_batch_size x world size = {global_micro_batch}, or leave batch_sizes unset")
    return out


def equal_sizes(world_size: int, global_micro_batch: int) -> list[int]:
    """An equal split of ``U`` over the ranks (largest remainder when it does not divide)."""
    return largest_remainder([global_micro_batch / world_size] * world_size, global_micro_batch,
                             [global_micro_batch] * world_size)
