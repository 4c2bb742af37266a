"""One rank's clock, sample count and accuracy curve inside a bench run, the same for every mode.

Why it exists: a fair comparison needs one definition of "time" across modes. Throughput workload: the timed
region starts at the first synchronisation point at or after ``warmup`` steps (so process start, model build,
the first El Che windows including calibration, and the first DDP buckets are excluded) and ends after the last
step's synchronisation and a barrier. Accuracy workload: the clock starts after setup, at a barrier before the
first step, and held-out evaluation is taken off the clock (barrier, rank 0 evaluates, barrier) so that it costs
no mode anything. Evaluations happen only at synchronisation points, where every replica is identical.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from .device_model import DeviceModel
from .ranks import process_cores
from .workloads import Workload

__all__ = ["RunSpec", "Meter"]


@dataclass(frozen=True)
class RunSpec:
    """What one run of one mode does (picklable; sent to every rank process)."""

    mode: str
    workload: str  # "throughput" or "accuracy"
    speeds: tuple[float, ...]
    devices: tuple[str, ...]
    device_ms: float
    batch_size: int
    steps: int
    warmup: int
    eval_every: int
    localsgd_steps: int
    timeout_s: float
    seed: int
    max_anchor: Optional[int] = None
    """DdpConfig.max_anchor for elche-setup (None: the engine default)."""
    sync_stretch: Optional[float] = None
    """DdpConfig.simulate_sync for the setup modes (None: the real sync)."""
    stretch: bool = False
    """DeviceModel(stretch=True): device_ms is the real compute per 16 samples and a slower rank sleeps the extra."""

    @property
    def world(self) -> int:
        return len(self.speeds)

    @property
    def accuracy(self) -> bool:
        return self.workload == "accuracy"


class Meter:
    """Clock, samples and evaluations of one rank. Call :meth:`begin`, then :meth:`step` after every
    micro-batch, then :meth:`finish`."""

    def __init__(self, spec: RunSpec, rank: int, workload: Workload, device: torch.device, model: DeviceModel,
                 barrier: Callable[[], None]) -> None:
        self.spec, self.rank, self.workload, self.device = spec, rank, workload, device
        self.device_model, self.barrier = model, barrier
        self.t0: Optional[float] = None
        self.start_step = 0
        self.steps = 0
        self.optimizer_steps = 0
        self.last_eval: Optional[int] = None
        self.samples = 0
        self.paused = 0.0
        self.next_eval = spec.eval_every
        self.curve: list[tuple[float, int, float]] = []

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def clock(self) -> float:
        """Seconds of training on the clock so far (evaluation excluded)."""
        return 0.0 if self.t0 is None else self._now() - self.t0 - self.paused

    def begin(self, module: torch.nn.Module) -> None:
        """Before the first step: in the accuracy workload, start the clock (and record the step-0 accuracy)."""
        if self.spec.accuracy:
            self.barrier()
            self.t0 = self._now()
            self.evaluate(module, 0)

    def step(self, samples: int, synced: bool, module: Optional[torch.nn.Module] = None,
             optimizer_steps: Optional[int] = None) -> None:
        """One micro-batch of ``samples`` done; ``synced``: every rank is now at the same synchronisation point
        (replicas identical). ``optimizer_steps`` (default: steps so far) paces the evaluations."""
        self.steps += 1
        if self.t0 is not None:
            self.samples += samples
        if synced:
            self.sync_point(module, optimizer_steps)

    def sync_point(self, module: Optional[torch.nn.Module] = None, optimizer_steps: Optional[int] = None) -> None:
        """Every rank is at the same synchronisation point: maybe start the timed region, maybe evaluate."""
        if not self.spec.accuracy and self.t0 is None and self.steps >= self.spec.warmup:
            self.barrier()
            self.t0, self.start_step = self._now(), self.steps
            return
        done = self.steps if optimizer_steps is None else optimizer_steps
        self.optimizer_steps = done
        if self.spec.accuracy and module is not None and done >= self.next_eval:
            while self.next_eval <= done:
                self.next_eval += self.spec.eval_every
            self.evaluate(module, done)

    def evaluate(self, module: torch.nn.Module, done: int) -> None:
        """Held-out accuracy on rank 0, off the clock (all ranks pause together)."""
        self.barrier()
        self.last_eval = done
        at = self.clock()
        paused_from = self._now()
        if self.rank == 0:
            with self.device_model.suspended():
                acc = self.workload.accuracy(module, self.device)
            self.curve.append((round(at, 4), done, acc))
        self.barrier()
        self.paused += self._now() - paused_from

    def finish(self, module: Optional[torch.nn.Module], extra: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        """End of the run (after the final synchronisation): stop the clock, final evaluation, the rank's result."""
        self.barrier()
        if self.t0 is None:
            raise RuntimeError(f"mode {self.spec.mode}: the timed region never started ({self.steps} steps, "
                               f"warm-up {self.spec.warmup}): raise --steps above --warmup")
        elapsed = self.clock()
        final = None
        if self.spec.accuracy and module is not None:
            if self.last_eval != self.optimizer_steps:
                self.evaluate(module, self.optimizer_steps)
            final = self.curve[-1][2] if self.rank == 0 else None
        result: dict[str, Any] = {"rank": self.rank, "samples": self.samples, "elapsed_s": elapsed,
                                  "steps": self.steps, "timed_steps": self.steps - self.start_step,
                                  "curve": self.curve, "final_accuracy": final,
                                  "device_model": self.device_model.summary(), "cores": process_cores()}
        result.update(extra or {})
        return result
