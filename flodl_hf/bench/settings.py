"""BenchSettings: every knob of ``flodl-hf bench`` in one validated dataclass, plus the list of modes.

Why it exists: the CLI is a thin layer over this dataclass (practices #5); a bad value fails here, before any
process starts, with a message naming the flag, the value and the fix. Defaults depend on the workload
(``throughput``: small MLP, 60 steps, 2 alternating rounds; ``accuracy``: tiny BERT, 200 steps, 1 round) and
are filled in by :meth:`BenchSettings.resolved`.

Real heterogeneity on CPU cores: ``pin_cores`` pins rank r to the r-th core this process may run on
(core r on an unrestricted machine), in every mode, solo included, so that "ideal = sum of solo rates" means the
same cores; ``busy_core`` runs a competing busy process on that core for the whole bench (started and always
killed by the harness), so the rank pinned there gets about half of it.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import asdict, dataclass, replace
from typing import Any, Optional

from .device_model import REFERENCE_BATCH
from .workloads import MODELS, REAL_COMPUTE_MODELS

__all__ = ["ALL_MODES", "ELCHE_VARIANTS", "ALIASES", "DEFAULT_MODES", "WORKLOADS", "BenchSettings", "mode_availability",
           "usable_cores"]

WORKLOADS = ("throughput", "accuracy")
BUILDER_POLICIES = ("builder-sync", "builder-cadence", "builder-async")
#: Builder modes are policy/backend pairs ("nccl" = the process group's collective: gloo on CPU ranks).
BUILDER_MODES = tuple(f"{p}/{b}" for p in BUILDER_POLICIES for b in ("nccl", "cpu"))
#: Names ``--modes`` also accepts: a policy alone runs it on both backends; ``builder`` runs all six.
ALIASES = {**{p: tuple(f"{p}/{b}" for b in ("nccl", "cpu")) for p in BUILDER_POLICIES}, "builder": BUILDER_MODES}
#: Every mode the bench knows, in table order.
#: El Che setup mode under each anchor rule: the default (goodput), the earlier throughput rule, anchor fixed at 1,
#: goodput with the LR following AdaScale's gain (``lr_scaling="adascale"``).
ELCHE_VARIANTS = ("elche-throughput", "elche-anchor1", "elche-adascale")
ALL_MODES = ("solo", "ddp", "accelerate", "accelerate-localsgd", "elche-setup") + ELCHE_VARIANTS + (
    "setup-sync",) + BUILDER_MODES
#: What ``--modes`` defaults to (the available ones among these). ``setup-sync`` is a diagnostic extra.
DEFAULT_MODES = ("solo", "ddp", "accelerate", "accelerate-localsgd", "elche-setup") + BUILDER_MODES


def _builder_problem() -> Optional[str]:
    """None when flodl_hf.builder is importable and has the API the bench drives, else why not."""
    try:
        from .. import builder as b  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
        return f"flodl_hf.builder is not importable yet ({type(exc).__name__}: {exc})"
    missing = [n for n in ("DdpBuilder", "ApplyPolicy", "AverageBackend") if not hasattr(b, n)]
    if missing:
        return f"flodl_hf.builder lacks {', '.join(missing)}"
    return None


def mode_availability() -> dict[str, Optional[str]]:
    """Per mode: None if it can run here, else a one-line reason."""
    out: dict[str, Optional[str]] = {m: None for m in ALL_MODES}
    if importlib.util.find_spec("accelerate") is None:
        for m in ("accelerate", "accelerate-localsgd"):
            out[m] = "accelerate is not installed (pip install 'flodl-hf[accelerate]')"
    problem = _builder_problem()
    if problem is not None:
        for m in BUILDER_MODES:
            out[m] = problem
    return out


def usable_cores() -> tuple[int, ...]:
    """The CPU cores this process may run on, sorted (empty where the platform cannot pin processes)."""
    if not hasattr(os, "sched_getaffinity"):
        return ()
    return tuple(sorted(os.sched_getaffinity(0)))


def _bad(flag: str, value: object, fix: str) -> ValueError:
    return ValueError(f"--{flag} {value!r} is invalid: {fix}")


@dataclass(frozen=True)
class BenchSettings:
    """What one ``flodl-hf bench`` invocation measures. ``None`` fields take workload-dependent defaults."""

    modes: Optional[tuple[str, ...]] = None
    """Modes to run, in table order (None: every available mode of DEFAULT_MODES)."""
    workload: str = "throughput"
    speeds: tuple[float, ...] = (1.0, 0.4)
    """One relative speed per rank, in (0, 1]: modelled device time is divided by it."""
    devices: Optional[tuple[str, ...]] = None
    """One device per rank (None: ``cpu`` for every rank)."""
    device_ms: Optional[float] = None
    """Modelled ms per 16 samples at speed 1.0 (None: 40 on CPU, 0 = real devices measured as they are)."""
    batch_size: int = 16
    steps: Optional[int] = None
    """Steps per run (every rank runs them; W * batch_size samples each). None: 60 / 200 (throughput / accuracy)."""
    warmup: int = 5
    """Throughput: steps before the timed region starts (at the first synchronisation point after them)."""
    repeats: Optional[int] = None
    """Alternating rounds (order reversed every other round). None: 2 / 1 (throughput / accuracy)."""
    model: Optional[str] = None
    """mlp, tiny-bert or minilm. None: mlp / tiny-bert (throughput / accuracy)."""
    eval_every: int = 10
    eval_samples: int = 1000
    target: Optional[float] = None
    """Accuracy target in (0, 1]. None: the final accuracy DDP reaches in the same round."""
    lr: Optional[float] = None
    localsgd_steps: int = 8
    elche_max_anchor: Optional[int] = None
    """DdpConfig.max_anchor for elche-setup (None: the engine default)."""
    sync_stretch: Optional[float] = None
    """Setup modes: DdpConfig.simulate_sync, a modelled slow interconnect (sleep this fraction of a micro-batch's
    compute after every synchronisation). None: the real sync."""
    max_length: int = 64
    """Tokens per text (tiny-bert, minilm)."""
    stretch: bool = False
    """Model slower devices by stretching real compute: ``device_ms`` is this machine's real compute per 16 samples
    (measure it), and a rank at speed v sleeps ``device_ms * b/16 * (1/v - 1)`` (speed 1.0: nothing)."""
    seed: int = 0
    timeout_s: float = 600.0
    """Bound on one run of one mode (and on its collectives)."""
    pin_cores: bool = False
    """Pin rank r to the r-th usable core (:func:`usable_cores`), in every mode (solo too), before torch starts."""
    busy_core: Optional[int] = None
    """A core on which a competing busy process runs for the whole bench (None: none)."""

    def resolved(self) -> "BenchSettings":
        """A copy with every None default filled in and every value checked."""
        if self.workload not in WORKLOADS:
            raise _bad("workload", self.workload, f"use one of {', '.join(WORKLOADS)}")
        acc = self.workload == "accuracy"
        speeds = tuple(float(s) for s in self.speeds)
        if len(speeds) < 2:
            raise _bad("speeds", ",".join(map(str, speeds)), "give one speed per rank, at least two (e.g. 1.0,0.4)")
        if any(not 0.0 < s <= 1.0 for s in speeds):
            raise _bad("speeds", ",".join(map(str, speeds)), "every speed must be in (0, 1], e.g. 1.0,0.4")
        devices = tuple(self.devices) if self.devices is not None else ("cpu",) * len(speeds)
        if len(devices) != len(speeds):
            raise _bad("devices", ",".join(devices), f"give one device per speed ({len(speeds)})")
        for d in devices:
            if d != "cpu" and not (d.startswith("cuda:") and d[5:].isdigit()):
                raise _bad("devices", d, "use cpu or cuda:N per rank")
        on_cpu = all(d == "cpu" for d in devices)
        device_ms = self.device_ms if self.device_ms is not None else (40.0 if on_cpu else 0.0)
        if not device_ms >= 0:
            raise _bad("device-ms", device_ms, f"use a modelled time >= 0 ms per {REFERENCE_BATCH} samples")
        if device_ms == 0 and any(s != 1.0 for s in speeds):
            raise _bad("speeds", ",".join(map(str, speeds)),
                       "speeds other than 1.0 need modelled device time (--device-ms > 0); with --device-ms 0 real "
                       "devices are measured as they are")
        model = self.model or ("tiny-bert" if acc else "mlp")
        if on_cpu and device_ms == 0 and model not in REAL_COMPUTE_MODELS:
            raise _bad("device-ms", device_ms, "CPU ranks need modelled device time (e.g. 40), except with --model "
                       f"{' or '.join(REAL_COMPUTE_MODELS)}, whose real compute is measured as it is")
        if self.stretch and not device_ms > 0:
            raise _bad("device-ms", device_ms, "--stretch needs the real compute time of 16 samples in ms (> 0)")
        if self.sync_stretch is not None and not self.sync_stretch >= 0:
            raise _bad("sync-stretch", self.sync_stretch, "use a fraction >= 0 of a micro-batch's compute, e.g. 0.5")
        if not isinstance(self.max_length, int) or self.max_length < 4:
            raise _bad("max-length", self.max_length, "use an integer >= 4 (tokens per text)")
        if model not in MODELS:
            raise _bad("model", model, f"use one of {', '.join(MODELS)}")
        steps = self.steps if self.steps is not None else (200 if acc else 60)
        repeats = self.repeats if self.repeats is not None else (1 if acc else 2)
        for flag, value, low in (("batch-size", self.batch_size, 1), ("steps", steps, 1), ("warmup", self.warmup, 0),
                                 ("repeats", repeats, 1), ("eval-every", self.eval_every, 1),
                                 ("eval-samples", self.eval_samples, 1), ("localsgd-steps", self.localsgd_steps, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise _bad(flag, value, f"use an integer >= {low}")
        if not acc and steps <= self.warmup:
            raise _bad("steps", steps, f"use more steps than --warmup ({self.warmup}), e.g. {self.warmup + 40}")
        if self.target is not None and not 0.0 < self.target <= 1.0:
            raise _bad("target", self.target, "use an accuracy in (0, 1], e.g. 0.95")
        if self.elche_max_anchor is not None and self.elche_max_anchor < 1:
            raise _bad("elche-max-anchor", self.elche_max_anchor, "use an integer >= 1 (El Che stays on)")
        if not self.timeout_s > 0:
            raise _bad("timeout", self.timeout_s, "use a positive number of seconds")
        available = mode_availability()
        if self.modes is None:
            modes = tuple(m for m in DEFAULT_MODES if available[m] is None and not (acc and m == "solo"))
        else:
            modes = tuple(dict.fromkeys(x for m in self.modes for x in ALIASES.get(m, (m,))))
            unknown = [m for m in modes if m not in ALL_MODES]
            if unknown or not modes:
                raise _bad("modes", ",".join(self.modes), f"use a comma list of {', '.join(ALL_MODES)} "
                           f"(or {', '.join(ALIASES)})")
            blocked = [f"{m} ({available[m]})" for m in modes if available[m] is not None]
            if blocked:
                raise _bad("modes", ",".join(self.modes), "unavailable here: " + "; ".join(blocked))
        cores = usable_cores()
        if self.pin_cores:
            if not cores:
                raise ValueError("--pin-cores is invalid: this platform cannot pin processes to cores "
                                 "(no os.sched_setaffinity)")
            if len(speeds) > len(cores):
                raise ValueError(f"--pin-cores is invalid: {len(speeds)} ranks need {len(speeds)} cores, this process "
                                 f"may run on {len(cores)} ({','.join(map(str, cores))}): use fewer ranks or drop "
                                 "--pin-cores")
            if any(m.startswith("builder-") for m in modes):
                raise _bad("modes", ",".join(modes), "--pin-cores pins the bench's rank processes; builder modes start "
                           "their own (drop --pin-cores or the builder modes)")
        if self.busy_core is not None:
            if not isinstance(self.busy_core, int) or isinstance(self.busy_core, bool) or self.busy_core < 0:
                raise _bad("busy-core", self.busy_core, "use a core number >= 0, e.g. 1")
            if not cores:
                raise _bad("busy-core", self.busy_core, "this platform cannot pin processes to cores")
            if self.busy_core not in cores:
                raise _bad("busy-core", self.busy_core, f"use a core this process may run on "
                           f"({','.join(map(str, cores))})")
        if self.stretch and any(m.startswith("builder-") for m in modes):
            raise _bad("modes", ",".join(modes), "--stretch is for the torch-level and setup modes; builder modes "
                       "model speeds with their own simulate_speeds (drop --stretch or the builder modes)")
        return replace(self, modes=modes, devices=devices, device_ms=float(device_ms), model=model, steps=steps,
                       repeats=repeats, speeds=speeds)

    @property
    def world(self) -> int:
        return len(self.speeds)

    @property
    def rank_cores(self) -> Optional[tuple[int, ...]]:
        """The core of each rank with ``pin_cores`` (rank r: the r-th usable core), else None."""
        return usable_cores()[:self.world] if self.pin_cores else None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
