"""The train loader on N ranks for a train set without indices (a stream): rank 0 reads, El Che's shares are dealt.

Why it exists: a stream (``torch.utils.data.IterableDataset``, ``datasets.IterableDataset``, ``streaming=True``) has
no indices for the plan sampler to permute and cut, and a stream that every rank reads is read W times and need not
even be the same on each (an unseeded shuffle buffer, a network source). So, as accelerate's ``dispatch_batches``
does for Trainer-DDP, one rank reads:

* rank 0 iterates a DataLoader built as `transformers.Trainer` builds its own for one process with batch ``U``
  (per-device batch x world size): the user's dataset, workers and prefetch, the dataset's ``set_epoch``; its rows
  stay uncollated, so global micro-batch ``k`` is the ``k``-th micro-batch one Trainer process reads;
* each rank receives (one ``scatter_object_list`` per micro-batch) ``b_r`` consecutive rows of it, El Che's sizes
  for the window (split in proportion where a short last micro-batch has fewer than ``U``); a rank with none of a
  short micro-batch gets its first row at weight 0, so it still runs the micro-batch;
* each rank collates its own rows with the user's collator, as the plan loader does for a map-style set.

The end of the stream, and an error while reading it, reach every rank in the same collective, so no rank waits on a
reader that has stopped. Trainer skips the batches a resumed checkpoint trained by iterating this loader's dataset
(accelerate's ``skip_first_batches``), which keeps the ranks in step: the skipped micro-batches are read and dealt
like any other, so the stream continues where it stopped, as it does for one Trainer process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from .plan import WEIGHT_KEY, WeighedBatches, WindowPlan, spans

__all__ = ["SizedStreamLoader", "StreamLoader", "StreamShares", "deal", "rows_as_read", "sized"]


def rows_as_read(rows: list[Any]) -> list[Any]:
    """Rank 0's reader collates nothing: each rank collates its own share."""
    return rows


def _same(batch: Any) -> Any:
    return batch


def deal(rows: list[Any], sizes: list[int]) -> list[tuple[list[Any], int]]:
    """Each rank's consecutive rows of one global micro-batch (``plan.spans``), with their weight (1, or 0 for a
    stand-in row)."""
    return [(rows[lo:lo + size], 1) if size > 0 else (rows[:1], 0) for lo, size in spans(sizes, len(rows))]


class StreamShares(torch.utils.data.IterableDataset):
    """This rank's collated share of every global micro-batch of the stream, weight under ``WEIGHT_KEY``.

    ``reader`` (rank 0 only) is the DataLoader whose batches are the global micro-batches, as uncollated lists.
    """

    def __init__(self, dataset: Any, reader: Iterable[list[Any]] | None, plan: WindowPlan,
                 collate: Callable[[list[Any]], Any]) -> None:
        self.dataset, self.reader, self.plan, self.collate = dataset, reader, plan, collate
        self.epoch = 0
        self.windows = 0  # windows drawn so far in this run (the plan's window index)
        self.ended = 0  # how often the stream has ended in this run (a checkpoint after that cannot be resumed)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _read(self) -> Iterator[list[Any]]:
        if hasattr(self.dataset, "set_epoch"):  # as accelerate's loader does before each pass of one process
            self.dataset.set_epoch(self.epoch)
        yield from self.reader
        self.epoch += 1

    def __iter__(self) -> Iterator[Any]:
        plan = self.plan
        ga, rank, world = plan.micro_batches_per_window, plan.rank, plan.world_size
        source = self._read() if rank == 0 else None
        sizes, k = plan.sizes, 0
        while True:
            if k % ga == 0:  # every rank draws here, in the same order: the split of the window that begins
                sizes = plan.draw(self.windows)
                self.windows += 1
            parcels: list[Any] | None = None
            failure: BaseException | None = None
            if source is not None:
                try:
                    rows = next(source)
                except StopIteration:
                    parcels = [("end",)] * world
                except Exception as exc:  # every rank hears of it, then rank 0 raises it
                    failure = exc
                    parcels = [("error", f"{type(exc).__name__}: {exc}")] * world
                else:
                    parcels = [("rows", *parcel) for parcel in deal(list(rows), sizes)]
            received: list[Any] = [None]
            dist.scatter_object_list(received, parcels, src=0)
            message = received[0]
            if failure is not None:
                raise failure
            if message[0] == "end":
                self.ended += 1
                return
            if message[0] == "error":
                raise RuntimeError(f"ElCheTrainer: rank 0 could not read the next batch of the train stream "
                                   f"({message[1]}); rank 0's traceback has the cause")
            _, own, weight = message
            batch = self.collate(own)
            batch[WEIGHT_KEY] = weight
            k += 1
            yield batch


class StreamLoader(torch.utils.data.DataLoader):
    """The train loader on N ranks for a stream, with the surface of the one Trainer returns for it on one process
    (``total_batch_size``, ``set_epoch``; no ``len``): ``batch_size`` is None because a rank's batch is El Che's
    share, which changes; each batch's weight travels beside it on the iterator (``weights``)."""

    def __init__(self, shares: StreamShares, *, pin_memory: bool = False) -> None:
        super().__init__(shares, batch_size=None, collate_fn=_same, num_workers=0, pin_memory=pin_memory)

    @property
    def total_batch_size(self) -> int:
        """Samples per micro-batch over all ranks (El Che splits each one unequally between them)."""
        return self.dataset.plan.global_micro_batch

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def __iter__(self) -> WeighedBatches:
        return WeighedBatches(super().__iter__())


class SizedStreamLoader(StreamLoader):
    """A ``StreamLoader`` over an iterable set that declares its length: ``len`` is one Trainer process's number of
    micro-batches, ``ceil(len(dataset) / U)``, from which Trainer counts its epochs."""

    def __len__(self) -> int:
        return -(-len(self.dataset.dataset) // self.dataset.plan.global_micro_batch)


def sized(dataset: Any) -> bool:
    """Whether an iterable train set declares a length, from which Trainer counts its epochs (``SizedStreamLoader``);
    without one Trainer syncs only every ``gradient_accumulation_steps`` micro-batches, so a window the stream's
    end cuts short goes on into its next pass."""
    return hasattr(type(dataset), "__len__")
