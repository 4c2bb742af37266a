"""Every builder setting in one dataclass, validated once at ``run()`` with every problem reported together.

It exists so that a bad setting fails in the caller's process, before any worker is spawned, with a message
that names the setting, the value given and the fix (practices.md #5), instead of failing later inside a
worker.
"""

from __future__ import annotations

import math
import numbers
import pickle
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ..elche.settings_check import anchor_over_bound, anchor_problem, max_anchor_problem, overhead_problem
from .types import ApplyPolicy, AverageBackend

__all__ = ["BuilderSettings", "DEFAULT_DIVERGENCE_THRESHOLD", "START_METHODS", "MAX_OVERSHOOT_LIMIT"]

#: How worker processes start: a fresh interpreter each ("spawn"), or forked from a server process that
# imported
#: torch once ("forkserver": much faster when a process runs several builder jobs; not on Windows).
START_METHODS = ("spawn", "forkserver")

#: Relative distance ``||p_r - avg|| / ||avg||`` above which a rising trend stops the anchor from growing (the
#: original's default, seed-builder.md).
DEFAULT_DIVERGENCE_THRESHOLD = 0.05

#: Async may grow ``max_overshoot`` one step per stable guard verdict, never above this.
MAX_OVERSHOOT_LIMIT = 15


def _clamp(v: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, v))


def _is_int(v: object) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v: object) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v))


def _device_ok(name: object) -> bool:
    text = str(name).strip().lower()
    return text in ("cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit())


@dataclass
class BuilderSettings:
    """Raw values from the ``DdpBuilder`` setters; :meth:`validate` checks them and fills the derived ones."""

    model_factory: Any = None
    optim_factory: Any = None
    train_fn: Any = None
    dataset: Any = None
    batch_size: Any = None
    num_epochs: Any = None
    policy: Any = ApplyPolicy.CADENCE
    backend: Any = AverageBackend.NCCL
    anchor: Any = 10
    overhead_target: Any = 0.10
    max_anchor: Any = 200
    max_batch_diff: Any = None
    progressive_dispatch: Optional[bool] = None
    """None: on unless the policy is SYNC. On: ranks pull chunks of each epoch from a shared pool (fast ranks
    take more, ranks stream into the next epoch); off: one equal slice per rank per epoch."""
    max_overshoot: Optional[int] = None
    """Progressive dispatch with the CPU backend: a rank may run at most its count + this many batches past
    the last average. None: auto, see :meth:`resolved_max_overshoot`."""
    timeline: bool = False
    """Record per-rank events (batches, averages, throttles) with their times, to see where time went."""
    max_grad_norm: Any = None
    divergence_threshold: Any = DEFAULT_DIVERGENCE_THRESHOLD
    divergence_guard: bool = True
    scheduler: Any = None
    lr_scale_ratio: Any = 0.0
    checkpoint_every: Any = None
    checkpoint_fn: Any = None
    epoch_fn: Any = None
    metrics_fn: Any = None
    collate_fn: Any = None
    devices: Any = None
    seed: Any = 0
    simulate_speeds: Any = None
    progress: Any = True
    timeout_s: Any = 60.0
    round_timeout_s: Any = 5.0
    start_method: Any = "spawn"
    resume_from: Any = None
    """A builder checkpoint to continue from (``flodl_hf.builder.resume``), on any number of devices."""
    resume_point: Any = None
    """Set by ``run()``: the checked checkpoint (a ``ResumePoint``)."""

    def resolved_devices(self) -> list[str]:
        """The device list: the setting, else every visible GPU, else one CPU ("cuda" means "cuda:0")."""
        if self.devices is not None:
            out = []
            for d in self.devices:
                text = str(d).strip().lower()
                out.append("cuda:0" if text == "cuda" else text)
            return out
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        return ["cpu"]

    def rank_device(self, local_rank: int) -> str:
        """Under torchrun: this rank's device (``.devices([d])`` if set, "cuda" meaning ``cuda:LOCAL_RANK``; else
        ``cuda:LOCAL_RANK`` when CUDA is available, else the CPU)."""
        if self.devices is not None:
            text = str(self.devices[0]).strip().lower()
            return f"cuda:{local_rank}" if text == "cuda" else text
        import torch

        return f"cuda:{local_rank}" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "cpu"

    def resolved_progressive(self) -> bool:
        """Whether work is handed out progressively: the setting, else on unless the policy is SYNC."""
        if self.progressive_dispatch is not None:
            return bool(self.progressive_dispatch)
        return self.policy is not ApplyPolicy.SYNC

    def total_batches(self) -> int:
        """Batches of the run on one device: ``len(dataset) // batch_size * num_epochs`` (after validate)."""
        return len(self.dataset) // int(self.batch_size) * int(self.num_epochs)

    def resolved_max_overshoot(self) -> Optional[int]:
        """The starting overshoot bound, or None where it does not apply (no progressive dispatch, SYNC, or
        the collective backend, whose averages hold every rank anyway). Auto:
        clamp(total_batches // 100, 2, 5)."""
        if (
            not self.resolved_progressive()
            or self.policy is ApplyPolicy.SYNC
            or self.backend is not AverageBackend.CPU
        ):
            return None
        if self.max_overshoot is not None:
            return int(self.max_overshoot)
        return _clamp(self.total_batches() // 100, 2, 5)

    def max_overshoot_ceiling(self) -> int:
        """How far ASYNC may grow the bound (one per stable guard verdict): clamp(total_batches // 50, 3,
        10), at least the starting value, never above 15 unless the user set a larger start (then no growth).
        Computed from the configured or auto start even where overshoot does not apply."""
        start = (
            int(self.max_overshoot)
            if self.max_overshoot is not None
            else _clamp(self.total_batches() // 100, 2, 5)
        )
        if start >= MAX_OVERSHOOT_LIMIT:
            return start
        return min(MAX_OVERSHOOT_LIMIT, max(start, _clamp(self.total_batches() // 50, 3, 10)))

    def validate(self, ranks: Optional[int] = None) -> list[str]:  # noqa: C901 - one flat list of independent checks
        """Check every setting; return the resolved devices, or raise one ValueError listing every problem.

        ``ranks``: under torchrun, the job's world size; this process is one rank (one device) and nothing is
        pickled (each rank runs the script itself)."""
        errors: list[str] = []

        def bad(name: str, value: object, fix: str) -> None:
            errors.append(f"{name}={value!r} is invalid: {fix}")

        for name in ("model_factory", "optim_factory", "train_fn"):
            if not callable(getattr(self, name)):
                bad(
                    name,
                    getattr(self, name),
                    "pass a callable to Trainer.builder(model_factory, optim_factory, train_fn)",
                )
        if self.dataset is None:
            errors.append("dataset is missing: call .dataset(ds) with a sized, indexable dataset")
        elif not (hasattr(self.dataset, "__len__") and hasattr(self.dataset, "__getitem__")):
            bad(
                "dataset",
                type(self.dataset).__name__,
                "pass a sized, indexable object (len(ds) and ds[i]), e.g. a list or a torch Dataset",
            )
        if self.batch_size is None:
            errors.append("batch_size is missing: call .batch_size(n) with the per-device batch size")
        elif not _is_int(self.batch_size) or self.batch_size < 1:
            bad(
                "batch_size",
                self.batch_size,
                ".batch_size(n) takes the per-device batch size, an integer >= 1",
            )
        if self.num_epochs is None:
            errors.append(
                "num_epochs is missing: call .num_epochs(n) with the number of passes over the dataset"
            )
        elif not _is_int(self.num_epochs) or self.num_epochs < 1:
            bad("num_epochs", self.num_epochs, ".num_epochs(n) takes an integer >= 1")
        if not isinstance(self.policy, ApplyPolicy):
            bad("policy", self.policy, "use ApplyPolicy.SYNC, ApplyPolicy.CADENCE or ApplyPolicy.ASYNC")
        if not isinstance(self.backend, AverageBackend):
            bad("backend", self.backend, "use AverageBackend.NCCL or AverageBackend.CPU")
        for name, check in (("anchor", anchor_problem), ("max_anchor", max_anchor_problem),
                            ("overhead_target", overhead_problem)):
            problem = check(getattr(self, name))
            if problem is not None:
                bad(name, getattr(self, name), problem)
        over = anchor_over_bound(self.anchor, self.max_anchor)
        if over is not None:
            bad("anchor", self.anchor, over)
        if self.max_batch_diff is not None and (not _is_int(self.max_batch_diff) or self.max_batch_diff < 1):
            bad(
                "max_batch_diff",
                self.max_batch_diff,
                ".max_batch_diff(n) takes an integer >= 1 (or leave it unset)",
            )
        if self.progressive_dispatch is not None and not isinstance(self.progressive_dispatch, bool):
            bad(
                "progressive_dispatch",
                self.progressive_dispatch,
                ".progressive_dispatch(flag) takes True or False",
            )
        elif self.progressive_dispatch is True and self.policy is ApplyPolicy.SYNC:
            bad(
                "progressive_dispatch",
                True,
                "SYNC splits each epoch equally up front (every rank runs one batch per average): drop "
                ".progressive_dispatch(True), or use ApplyPolicy.CADENCE or ASYNC",
            )
        if self.max_overshoot is not None:
            if not _is_int(self.max_overshoot) or self.max_overshoot < 1:
                bad(
                    "max_overshoot",
                    self.max_overshoot,
                    ".max_overshoot(n) takes an integer >= 1 (or leave it unset: auto)",
                )
            elif self.policy is ApplyPolicy.SYNC:
                bad(
                    "max_overshoot",
                    self.max_overshoot,
                    "SYNC averages after every batch, so no rank runs ahead: drop .max_overshoot(n)",
                )
            elif self.progressive_dispatch is False:
                bad(
                    "max_overshoot",
                    self.max_overshoot,
                    "it bounds progressive dispatch, which .progressive_dispatch(False) turned off: drop one",
                )
            elif self.backend is not AverageBackend.CPU:
                bad(
                    "max_overshoot",
                    self.max_overshoot,
                    "with the NCCL backend every average is a collective that holds every rank, so none "
                    "overshoots: use .backend(AverageBackend.CPU) or drop .max_overshoot(n)",
                )
        if not isinstance(self.timeline, bool):
            bad("timeline", self.timeline, ".timeline(enabled) takes True or False")
        if self.max_grad_norm is not None and (not _is_real(self.max_grad_norm) or self.max_grad_norm <= 0):
            bad(
                "max_grad_norm",
                self.max_grad_norm,
                ".max_grad_norm(f) takes a positive norm (or leave it unset)",
            )
        if self.divergence_guard and (
            not _is_real(self.divergence_threshold) or self.divergence_threshold <= 0
        ):
            bad(
                "divergence_threshold",
                self.divergence_threshold,
                ".divergence_threshold(f) takes a positive "
                "relative distance, e.g. 0.05; use .no_divergence_guard() to turn the guard off",
            )
        if not _is_real(self.lr_scale_ratio) or not 0.0 <= float(self.lr_scale_ratio) <= 1.0:
            bad(
                "lr_scale_ratio",
                self.lr_scale_ratio,
                ".lr_scale_ratio(f) takes f in [0, 1]: the learning rate is "
                "multiplied by 1 + (world_size - 1) * f",
            )
        if self.checkpoint_every is not None and (
            not _is_int(self.checkpoint_every) or self.checkpoint_every < 1
        ):
            bad(
                "checkpoint_every",
                self.checkpoint_every,
                ".checkpoint_every(n) takes a number of epochs >= 1",
            )
        if self.checkpoint_every is not None and self.checkpoint_fn is None:
            errors.append(
                f"checkpoint_every={self.checkpoint_every!r} needs a destination: also call "
                ".checkpoint_fn(fn) with fn(epoch) -> path of the file to write"
            )
        for name in ("checkpoint_fn", "epoch_fn", "metrics_fn", "scheduler", "collate_fn"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                bad(name, value, f".{name}(fn) takes a callable")
        if not _is_int(self.seed):
            bad("seed", self.seed, ".seed(n) takes an integer")
        if not isinstance(self.progress, bool):
            bad("progress", self.progress, ".progress(flag) takes True or False")
        for name in ("timeout_s", "round_timeout_s"):
            value = getattr(self, name)
            if not _is_real(value) or value <= 0:
                setter = "timeout" if name == "timeout_s" else "round_timeout"
                bad(name, value, f".{setter}(s) takes a positive number of seconds")

        if self.start_method not in START_METHODS:
            bad("start_method", self.start_method, f"use one of {', '.join(START_METHODS)}")
        devices: list[str] = []
        if self.devices is not None:
            if (
                isinstance(self.devices, str)
                or not isinstance(self.devices, Sequence)
                or len(self.devices) == 0
            ):
                bad(
                    "devices",
                    self.devices,
                    ".devices([...]) takes a non-empty list, e.g. ['cpu', 'cpu'] or ['cuda:0', 'cuda:1']",
                )
            else:
                wrong = [d for d in self.devices if not _device_ok(d)]
                if wrong:
                    bad(
                        "devices",
                        list(self.devices),
                        f"unknown device {wrong[0]!r}: use 'cpu', 'cuda' or 'cuda:N'",
                    )
        if ranks is not None:
            if self.devices is not None and not isinstance(self.devices, str) and len(self.devices) > 1:
                bad("devices", list(self.devices), "under torchrun each process is one rank with one device: "
                    "drop .devices(...) (cuda:LOCAL_RANK, else the CPU) or give one, e.g. .devices(['cpu'])")
            if self.backend is AverageBackend.CPU:
                bad("backend", self.backend, "the CPU backend averages in the launching process's shared memory, "
                    "on one machine: under torchrun use AverageBackend.NCCL (a gloo all-reduce on CPUs)")
        if not any(e.startswith("devices=") for e in errors):
            devices = self.resolved_devices() if ranks is None else ["?"] * ranks
        world = len(devices) or 1
        if self.simulate_speeds is not None:
            speeds = self.simulate_speeds
            if (
                isinstance(speeds, str)
                or not isinstance(speeds, Sequence)
                or len(speeds) != world
                or any(not _is_real(s) or not 0.0 < float(s) <= 1.0 for s in speeds)
            ):
                bad(
                    "simulate_speeds",
                    speeds,
                    f"give one simulated relative speed in (0, 1] per device ({world} "
                    "device(s)), e.g. [1.0, 0.4]; this is a SIMULATION for tests and benchmarks",
                )
        if (
            self.dataset is not None
            and hasattr(self.dataset, "__len__")
            and _is_int(self.batch_size)
            and self.batch_size >= 1
            and len(self.dataset) < self.batch_size
        ):
            bad(
                "dataset",
                f"<{len(self.dataset)} samples>",
                f"it holds fewer samples than batch_size="
                f"{self.batch_size}: lower the batch size or add data (incomplete final batches are dropped)",
            )
        if world > 1 and not errors and ranks is None:
            for name in ("model_factory", "optim_factory", "train_fn", "scheduler", "epoch_fn", "collate_fn"):
                value = getattr(self, name)
                if value is None:
                    continue
                try:
                    pickle.dumps(value)
                except Exception as exc:  # noqa: BLE001 - any pickling failure means the same fix
                    bad(
                        name,
                        value,
                        f"it cannot be pickled ({type(exc).__name__}: {exc}). Builder workers are "
                        "spawned processes and receive it by pickling: use a module-level function or "
                        "functools.partial of one; lambdas and functions defined inside other functions "
                        "cannot be pickled",
                    )
        if errors:
            if len(errors) == 1:
                raise ValueError(errors[0])
            raise ValueError("invalid builder settings:\n  - " + "\n  - ".join(errors))
        return devices
