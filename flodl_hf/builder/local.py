"""The single-device builder run: the same API and metrics, no worker processes and no averaging.

Why it exists: on one device there is nothing to average and nobody to coordinate, so spawning a process would
only cost start-up time and require picklable factories. The loop runs in a thread of the caller's process,
using the same step (``step.Replica``), epoch bookkeeping and checkpoint writer as the multi-device path, so a
script behaves the same on a laptop and on N GPUs.
"""

from __future__ import annotations

import queue
from collections import OrderedDict
from typing import Optional

import torch

from .checkpoint import write_checkpoint
from .resume import first_epoch, resume_meta, skipped
from .epochs import EpochBook
from .progress import ProgressBar
from .settings import BuilderSettings
from .step import Recipe, build_replica
from .types import EpochMetrics, TrainedState
from .workpool import WorkPool

__all__ = ["LocalRunner"]


class LocalRunner:
    """Trains on one device in the calling process; ``run()`` is the thread's target."""

    def __init__(self, s: BuilderSettings, recipe: Recipe, device: str) -> None:
        self.s = s
        self.recipe = recipe
        self.devices = [device]
        self.procs: list = []
        self.metrics: "queue.Queue[Optional[EpochMetrics]]" = queue.Queue()
        self.history: list[EpochMetrics] = []
        self.result: Optional[TrainedState] = None
        self.error: Optional[BaseException] = None
        self.lost: list[int] = []
        self.cancelled = False

    def run(self) -> None:
        bar = ProgressBar(int(self.s.num_epochs), enabled=bool(self.s.progress))
        try:
            self._train(bar)
        except BaseException as exc:  # noqa: BLE001 - handed to join()
            self.error = exc
        finally:
            bar.close()
            self.metrics.put(None)

    def _train(self, bar: ProgressBar) -> None:
        s = self.s
        speed = float(s.simulate_speeds[0]) if s.simulate_speeds is not None else 1.0
        rep = build_replica(self.recipe, torch.device(self.devices[0]), speed=speed)
        pool = WorkPool(len(s.dataset), int(s.batch_size), int(s.num_epochs), 1, equal_split=True)
        skip = skipped(s)  # a resumed multi-worker checkpoint may hold a few batches of the next epoch already
        book = EpochBook(int(s.num_epochs), pool.batches_per_epoch, 1, self.devices, first_epoch=first_epoch(s),
                         skipped=skip)
        # one replica is its own average after every batch: each batch is a round of one, and the global step (what
        # the LR schedule follows) is the batches run, counted from a resumed checkpoint's step
        start = step = int(self.recipe.start_step)
        for epoch in range(first_epoch(s), int(s.num_epochs)):
            for b in range(pool.batches_per_epoch):
                if self.cancelled:
                    raise RuntimeError("the builder run was cancelled")
                if (epoch, b) in skip:
                    continue
                loss, samples, _wall, scalars = rep.run(epoch, b)
                step += 1
                book.record(0, epoch, loss, samples, scalars)
            for m in book.completed(anchor=1, rounds=step - start, divergence=None, lost_ranks=[]):
                every = s.checkpoint_every
                if every and ((m.epoch + 1) % every == 0 or m.epoch + 1 == s.num_epochs):
                    write_checkpoint(
                        s.checkpoint_fn(m.epoch),
                        self._state(rep.model),
                        epoch=m.epoch,
                        world_size=1,
                        devices=self.devices,
                        rounds=step - start,
                        el_che=None,
                        lost_ranks=[],
                        optimizer=rep.optimizer.state_dict(),  # one replica: its state is the run's (resume.py)
                        **resume_meta(s, 1),
                    )
                self.history.append(m)
                bar.update(m)
                if s.metrics_fn is not None:
                    s.metrics_fn(m)
                self.metrics.put(m)
        self.result = TrainedState(
            self._state(rep.model), world_size=1, devices=self.devices, epochs=int(s.num_epochs),
            resumes=resume_meta(s, 1)["resumes"], rounds=step - start, global_step=step,
        )

    @staticmethod
    def _state(model: torch.nn.Module) -> "OrderedDict[str, torch.Tensor]":
        return OrderedDict((k, v.detach().to("cpu").clone()) for k, v in model.state_dict().items())
