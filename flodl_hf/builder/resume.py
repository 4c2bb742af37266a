"""Resuming a builder run from one of its checkpoints, on any number of workers (``DdpBuilder.resume_from``).

It exists because builder checkpoints are written at epoch ends (the averaged model after epoch ``e``), which makes
resuming simple and independent of the worker count: the run continues at epoch ``e + 1`` with every worker
starting from the averaged model, whatever the number of workers was before. What is carried and what is not:

- **Carried:** the averaged model (parameters and buffers), loaded into every worker's model after
  ``model_factory`` built it; the epoch (the next one starts); the batches of later epochs the model already holds
  (``ahead``, below), which the resumed run does not run again; the LR schedule's position. The schedule follows
  the *global* step, the batches every device ran, and an epoch is ``len(dataset) // batch_size`` batches whatever
  the worker count, so the schedule continues at ``(e + 1) * batches_per_epoch + len(ahead)`` exactly as the run
  would have.
- **What "after epoch e" holds.** Epochs are pipelined (a rank that runs out of epoch ``e`` takes batches of
  ``e + 1``), and the model a checkpoint holds is the first average taken once every batch of epoch ``e`` was
  done, so it may also hold a few batches of epoch ``e + 1``. The checkpoint lists them (``ahead``: ``[epoch,
  batch]`` pairs); a resumed run skips them, so every epoch after the checkpoint trains on each of its batches
  exactly once, and that epoch's metrics cover the batches it ran.
- **Optimizer state under SYNC.** Under SYNC every replica takes the same steps, so their optimizer states are
  equal; the checkpoint holds it (``optimizer``) and a resumed run loads its state (AdamW's moments and step
  counts) into every worker's fresh optimizer, keeping the hyperparameters ``optim_factory`` gives (whatever the
  resumed run's policy). A SYNC resume on the same workers therefore continues as the uninterrupted run would have
  (tested to 1e-5) whenever the batches the checkpoint already holds are whole rounds, as when an epoch's batches
  divide evenly among the workers; otherwise the rest of the epoch is dealt afresh, so the rounds group different
  batches than the uninterrupted run's (each still exactly once).
- **Not carried:** optimizer state under CADENCE and ASYNC (each worker's is its own and there is no single right
  one to hand to a different set of workers: every worker starts a fresh optimizer, as at the start of a run, so
  momentum-type optimizers warm up again). El Che's state is not carried either: it restarts from ``.anchor(n)``
  and calibrates on the new devices. Per-epoch metrics of the epochs before the checkpoint are not replayed
  (``next_metrics`` starts at epoch ``e + 1``).

The dataset length and batch size must match the checkpoint's when it records them (checkpoints written before
this feature do not); a checkpoint of the run's last epoch (or later) leaves nothing to resume and is refused with
the fix (raise ``num_epochs``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

__all__ = ["ResumePoint", "load_resume_point", "load_optimizer_state", "first_epoch", "skipped", "resume_meta"]


@dataclass
class ResumePoint:
    """Where a resumed builder run starts: ``first_epoch``, with ``state`` (the averaged model) on every worker
    and the LR schedule at global step ``start_step``."""

    path: str
    first_epoch: int
    start_step: int
    state: Any
    world_size_before: int
    resumes: list
    ahead: frozenset = frozenset()
    """``(epoch, batch)`` pairs of later epochs the checkpoint's model already holds: the resumed run skips them."""
    optimizer: Any = None
    """SYNC checkpoints: the replicas' (equal) optimizer ``state_dict``; None otherwise."""

    def record(self, world_size: int) -> dict:
        """The JSON-able record of this resume (kept in later checkpoints and on ``TrainedState.resumes``)."""
        return {"checkpoint": self.path, "epoch": self.first_epoch, "world_size_before": self.world_size_before,
                "world_size_after": int(world_size)}


def load_resume_point(path: Any, num_samples: int, batch_size: int, num_epochs: int) -> ResumePoint:
    """Read the builder checkpoint at ``path`` and check it fits this run; ValueError naming the problem and fix."""
    from .checkpoint import read_checkpoint

    where = os.fspath(path)
    if not os.path.isfile(where):
        raise ValueError(f"resume_from={where!r} is not a file: pass the path of a checkpoint written by "
                         ".checkpoint_fn(fn) (fn(epoch) -> path)")
    try:
        ckpt = read_checkpoint(where)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same one-line answer
        raise ValueError(f"resume_from={where!r} is unreadable ({type(exc).__name__}: {exc}): pass a checkpoint "
                         "written by .checkpoint_fn(fn)") from exc
    epoch = ckpt.get("epoch")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise ValueError(f"resume_from={where!r} records no epoch (epoch={epoch!r}): pass a checkpoint written "
                         "by .checkpoint_fn(fn)")
    for key, now in (("samples", num_samples), ("batch_size", batch_size)):
        was = ckpt.get(key)
        if was is not None and int(was) != int(now):
            raise ValueError(f"resume_from={where!r} was written with {key} {was} but this run has {now}: resume "
                             f"with the same dataset and batch size, or start afresh without .resume_from")
    if epoch + 1 >= int(num_epochs):
        raise ValueError(f"resume_from={where!r} is the checkpoint of epoch {epoch}, and num_epochs={num_epochs} "
                         f"ends there: nothing is left to train; raise .num_epochs(n) above {epoch + 1} to continue")
    ahead = _ahead(ckpt.get("ahead"), epoch, num_samples // batch_size, num_epochs, where)
    if len(ahead) >= (int(num_epochs) - epoch - 1) * (num_samples // batch_size):
        raise ValueError(f"resume_from={where!r} is the checkpoint of epoch {epoch}, but its model already holds every "
                         f"batch up to num_epochs={num_epochs}: nothing is left to train; raise .num_epochs(n) to "
                         "continue")
    return ResumePoint(path=where, first_epoch=epoch + 1,
                       start_step=(epoch + 1) * (num_samples // batch_size) + len(ahead),
                       state=ckpt["model"], world_size_before=int(ckpt.get("world_size") or 1),
                       resumes=list(ckpt.get("resumes") or []), ahead=ahead, optimizer=ckpt.get("optimizer"))


def _ahead(raw: Any, epoch: int, per_epoch: int, num_epochs: int, where: str) -> frozenset:
    """The checkpoint's ``ahead`` list, checked: pairs of a later epoch and a batch index within it."""
    if raw is None:
        return frozenset()
    pairs = set()
    for item in raw if isinstance(raw, (list, tuple)) else [raw]:
        ok = (isinstance(item, (list, tuple)) and len(item) == 2
              and all(isinstance(v, int) and not isinstance(v, bool) for v in item)
              and epoch < item[0] < num_epochs and 0 <= item[1] < per_epoch)
        if not ok:
            raise ValueError(f"resume_from={where!r} lists a batch it already holds that this run does not have "
                             f"({item!r}): resume with the run's dataset, batch size and num_epochs, or start "
                             "afresh without .resume_from")
        pairs.add((int(item[0]), int(item[1])))
    return frozenset(pairs)


def load_optimizer_state(optimizer: Any, saved: dict) -> None:
    """Load a SYNC checkpoint's optimizer state into a fresh optimizer, keeping the fresh one's hyperparameters
    (``lr``, weight decay, ...: this run's ``optim_factory`` and scale); ValueError naming the fix if it does not
    fit."""
    from .state import cpu_clone

    fresh = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    try:
        # cloned: ``load_state_dict`` keeps tensors that already have the right dtype and device, and a recipe's
        # tensors reach the workers in shared memory, one storage for all of them: every worker would update the
        # same moments
        optimizer.load_state_dict(cpu_clone(saved))
    except (ValueError, KeyError, RuntimeError) as exc:
        raise ValueError(f"the checkpoint given to .resume_from holds a SYNC optimizer state that does not fit the "
                         f"optimizer optim_factory builds ({str(exc).splitlines()[0]}): resume with the same "
                         "optimizer and model") from exc
    for group, hyper in zip(optimizer.param_groups, fresh):
        for key in [k for k in group if k != "params" and k not in hyper]:  # e.g. the old scheduler's initial_lr
            del group[key]
        group.update(hyper)


def first_epoch(settings: Any) -> int:
    """The first epoch a run trains: 0, or the one after a resumed checkpoint's."""
    point = getattr(settings, "resume_point", None)
    return 0 if point is None else int(point.first_epoch)


def skipped(settings: Any) -> frozenset:
    """The ``(epoch, batch)`` pairs a resumed run does not run: its checkpoint's model already holds them."""
    point = getattr(settings, "resume_point", None)
    return frozenset() if point is None else point.ahead


def resume_meta(settings: Any, world_size: int) -> dict:
    """What a checkpoint records so that it can be resumed and its history kept: the dataset length and batch size
    it was written with, and every resume of the run so far (JSON-able)."""
    point = getattr(settings, "resume_point", None)
    resumes = [] if point is None else [*point.resumes, point.record(world_size)]
    return {"samples": len(settings.dataset), "batch_size": int(settings.batch_size), "resumes": resumes}
