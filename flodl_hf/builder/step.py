"""One training step of builder mode, identical in a worker process and in the single-device runner.

It exists so that what happens to a batch is written once: collate the epoch's slice of the seeded
permutation, move it to the device, call the user's ``train_fn``, backward, clip, optimizer step, LR
scheduler, time it, and (SIMULATION only) stretch the time to ``compute / speed`` by sleeping, as if the
device were slower. :class:`Recipe` is the picklable bundle of what a worker needs to build its replica.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ..partition import epoch_permutation
from .scalars import ScalarSink

__all__ = ["Recipe", "Replica", "build_replica", "to_device"]


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


class Replica:
    """A model, its optimizer and scheduler on one device, and the batch loop body."""

    def __init__(
        self,
        recipe: Recipe,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        device: torch.device,
        speed: float = 1.0,
    ) -> None:
        self.recipe = recipe
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.device = device
        self.speed = float(speed)
        self.sink = ScalarSink()
        self._perms: dict[int, torch.Tensor] = {}
        self._epochs_started: set[int] = set()
        self._collate = recipe.collate_fn or torch.utils.data.default_collate
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

    def run(self, epoch: int, batch: int) -> tuple[float, int, float, dict[str, list[float]]]:
        """Train on one batch: returns (loss, samples, wall ms, recorded scalars). The wall time includes the
        simulated slowdown, if any."""
        if epoch not in self._epochs_started:
            self._epochs_started.add(epoch)
            if self.recipe.epoch_fn is not None:
                self.recipe.epoch_fn(epoch, self.model)
        idx = self.indices(epoch, batch)
        start = time.perf_counter()
        data = to_device(self._collate([self.recipe.dataset[i] for i in idx]), self.device)
        with self.sink:
            loss = self.recipe.train_fn(self.model, data)
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
        if self.recipe.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.recipe.max_grad_norm)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        value = float(loss.detach())  # also waits for the device
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        compute = time.perf_counter() - start
        if self.speed < 1.0:  # SIMULATION: a device `speed` times as fast would take compute / speed
            time.sleep(compute * (1.0 / self.speed - 1.0))
        wall_ms = (time.perf_counter() - start) * 1000.0
        return value, len(idx), wall_ms, self.sink.take()


def build_replica(recipe: Recipe, device: torch.device, *, speed: float = 1.0) -> Replica:
    """Build the model (seeded with ``recipe.seed``), its optimizer (learning rate scaled by ``lr_scale``) and
    scheduler on ``device``."""
    torch.manual_seed(recipe.seed)
    model = recipe.model_factory(device)
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"model_factory must return a torch.nn.Module (a task head is one), got {type(model).__name__}"
        )
    model = model.to(device)
    model.train()
    optimizer = recipe.optim_factory(model.parameters())
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optim_factory must return a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if recipe.lr_scale != 1.0:
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * recipe.lr_scale
    scheduler = recipe.scheduler(optimizer) if recipe.scheduler is not None else None
    return Replica(recipe, model, optimizer, scheduler, device, speed)
