"""One training step of builder mode, identical in a worker process and in the single-device runner.

It exists so that what happens to a batch is written once: collate the epoch's slice of the seeded
permutation, move it to the device, call the user's ``train_fn``, backward, clip, optimizer step, LR
scheduler, time it, and (SIMULATION only) stretch the time to ``compute / speed`` by sleeping, as if the
device were slower. :class:`Recipe` is the picklable bundle of what a worker needs to build its replica.

The LR schedule follows the GLOBAL step (seed-builder.md): the batches every device has run, counted at the
last average, plus this replica's batches since. :class:`GlobalSchedule` drives the user's scheduler there, so
a transformers warmup-and-decay schedule sized for one device gives every replica the same LR at the same
global progress and ends at 0. Under SYNC the step is split: ``backward`` first, then, after the gradients are
averaged, ``apply_step``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ..elche.partition import epoch_permutation
from .scalars import ScalarSink

__all__ = ["Recipe", "Replica", "GlobalSchedule", "build_replica", "to_device", "unwrap_model"]


@dataclass
class Recipe:
    """Everything needed to build and train one replica (picklable when the factories are)."""

    model_factory: Callable[[torch.device], torch.nn.Module]
    optim_factory: Callable[..., torch.optim.Optimizer]
    train_fn: Callable[[torch.nn.Module, Any], torch.Tensor]
    dataset: Any
    batch_size: int
    seed: int = 0
    collate_fn: Optional[Callable[[list], Any]] = None
    scheduler: Optional[Callable[[torch.optim.Optimizer], Any]] = None
    epoch_fn: Optional[Callable[[int, torch.nn.Module], None]] = None
    max_grad_norm: Optional[float] = None
    lr_scale: float = 1.0
    initial_state: Optional[dict] = None
    """A resumed run's averaged model (``flodl_hf.builder.resume``), loaded after ``model_factory``."""
    start_step: int = 0
    """The global step a resumed run starts at: the LR schedule is advanced there."""
    initial_optimizer: Optional[dict] = None
    """A resumed SYNC (or one-device) run's optimizer state, loaded into the fresh optimizer (its moments; the
    hyperparameters stay ``optim_factory``'s)."""


def to_device(obj: Any, device: torch.device) -> Any:
    """Move tensors (also inside dicts, lists, tuples and objects with ``.to``, like BatchEncoding) to
    ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, dict):
        moved = {k: to_device(v, device) for k, v in obj.items()}
        try:
            return type(obj)(moved)
        except Exception:  # noqa: BLE001 - a dict subclass with another constructor: a plain dict will do
            return moved
    if isinstance(obj, list):
        return [to_device(v, device) for v in obj]
    if isinstance(obj, tuple):
        moved = [to_device(v, device) for v in obj]
        return type(obj)(*moved) if hasattr(obj, "_fields") else tuple(moved)
    if hasattr(obj, "to") and callable(obj.to):
        try:
            return obj.to(device)
        except (TypeError, RuntimeError):
            return obj
    return obj


class GlobalSchedule:
    """The user's LR scheduler, stepped to a global step (it only moves forward, one ``step()`` at a time, so
    closed-form and chainable schedulers alike give what one device would at that step)."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.at = 0

    def advance_to(self, step: int) -> None:
        if self.scheduler is None:
            self.at = max(self.at, int(step))
            return
        while self.at < step:
            self.scheduler.step()
            self.at += 1


def unwrap_model(obj: Any) -> torch.nn.Module:
    """The ``nn.Module`` a model factory's result trains: itself, or a task head's ``graph().module``."""
    if isinstance(obj, torch.nn.Module):
        return obj
    graph = getattr(obj, "graph", None)
    if callable(graph):
        module = getattr(graph(), "module", None)
        if isinstance(module, torch.nn.Module):
            return module
    raise TypeError(
        f"model_factory must return a torch.nn.Module or a task head from heads/ (an object whose "
        f".graph().module is the model), got {type(obj).__name__}"
    )


class Replica:
    """A model, its optimizer and scheduler on one device, and the batch loop body.

    ``target`` is what ``train_fn`` receives: the module, or the task head the factory returned."""

    def __init__(
        self,
        recipe: Recipe,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        device: torch.device,
        speed: float = 1.0,
        target: Any = None,
    ) -> None:
        self.recipe = recipe
        self.model = model
        self.target = model if target is None else target
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.schedule = GlobalSchedule(scheduler)
        self.device = device
        self.speed = float(speed)
        self.sink = ScalarSink()
        self._perms: dict[int, torch.Tensor] = {}
        self._epochs_started: set[int] = set()
        from .data import collate as default_collate

        self._collate = recipe.collate_fn or default_collate
        self._n = len(recipe.dataset)

    def indices(self, epoch: int, batch: int) -> list[int]:
        perm = self._perms.get(epoch)
        if perm is None:
            perm = epoch_permutation(self._n, self.recipe.seed + epoch)
            self._perms[epoch] = perm
            for old in [e for e in self._perms if e < epoch - 1]:
                del self._perms[old]
        b = self.recipe.batch_size
        return perm[batch * b : (batch + 1) * b].tolist()

    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def backward(self, epoch: int, batch: int) -> tuple[float, int, float, dict[str, list[float]]]:
        """Forward and backward on one batch (no optimizer step): (loss, samples, compute ms, scalars)."""
        if epoch not in self._epochs_started:
            self._epochs_started.add(epoch)
            if self.recipe.epoch_fn is not None:
                self.recipe.epoch_fn(epoch, self.target)
        idx = self.indices(epoch, batch)
        start = time.perf_counter()
        data = to_device(self._collate([self.recipe.dataset[i] for i in idx]), self.device)
        with self.sink:
            loss = self.recipe.train_fn(self.target, data)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError(
                f"train_fn must return the loss as a one-element tensor, got {type(loss).__name__}"
                + (f" of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else "")
            )
        if not loss.requires_grad:
            raise ValueError(
                "train_fn returned a loss that does not require grad: compute it from the model's "
                "output (and do not call backward or step yourself; the builder does)"
            )
        loss.backward()
        value = float(loss.detach())  # also waits for the device
        return value, len(idx), (time.perf_counter() - start) * 1000.0, self.sink.take()

    def apply_step(self, advance: bool = True) -> None:
        """Clip, optimizer step, zero the gradients, and (``advance``) one local step of the schedule."""
        if self.recipe.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.recipe.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if advance:
            self.schedule.advance_to(self.schedule.at + 1)

    def stretch(self, compute_ms: float) -> float:
        """SIMULATION: a device ``speed`` times as fast would take compute / speed; returns the wall ms."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if self.speed < 1.0:
            time.sleep(compute_ms / 1000.0 * (1.0 / self.speed - 1.0))
            return compute_ms / self.speed
        return compute_ms

    def run(self, epoch: int, batch: int) -> tuple[float, int, float, dict[str, list[float]]]:
        """Train on one batch (local SGD step): returns (loss, samples, wall ms, recorded scalars). The wall time
        includes the simulated slowdown, if any."""
        start = time.perf_counter()
        loss, samples, _, scalars = self.backward(epoch, batch)
        self.apply_step()
        compute = (time.perf_counter() - start) * 1000.0
        return loss, samples, self.stretch(compute), scalars


def build_replica(recipe: Recipe, device: torch.device, *, speed: float = 1.0) -> Replica:
    """Build the model (seeded with ``recipe.seed``), its optimizer (learning rate scaled by ``lr_scale``) and
    scheduler on ``device``."""
    torch.manual_seed(recipe.seed)
    target = recipe.model_factory(device)
    model = unwrap_model(target)
    if model is target:
        model = model.to(device)
        target = model
    else:
        moved = model.to(device)
        if moved is not model:  # pragma: no cover - nn.Module.to returns self
            raise TypeError("a task head's model must move in place")
    model.train()
    optimizer = recipe.optim_factory(model.parameters())
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optim_factory must return a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if recipe.lr_scale != 1.0:
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * recipe.lr_scale
    if recipe.initial_state is not None:
        try:
            model.load_state_dict(recipe.initial_state)
        except RuntimeError as exc:
            raise ValueError(f"the checkpoint given to .resume_from does not fit the model model_factory builds "
                             f"({str(exc).splitlines()[0]}): resume with the same model") from exc
    if recipe.initial_optimizer is not None:
        from .resume import load_optimizer_state

        load_optimizer_state(optimizer, recipe.initial_optimizer)
    scheduler = recipe.scheduler(optimizer) if recipe.scheduler is not None else None
    replica = Replica(recipe, model, optimizer, scheduler, device, speed, target=target)
    replica.schedule.advance_to(recipe.start_step)
    return replica
