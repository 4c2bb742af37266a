"""DdpConfig: every knob of multi-device training in one validated dataclass.

It exists so that a bad setting fails at construction, with a message naming the field, the value and the fix,
instead of deep inside a collective on one rank. The CLI and ``Trainer.setup_*_with`` are thin layers over it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional, Sequence

from .elche.settings_check import (
    anchor_over_bound,
    anchor_problem,
    check_batch_sizes,
    check_speed_hint,
    max_anchor_problem,
    overhead_problem,
)

__all__ = ["DdpConfig", "PRECISIONS", "ANCHOR_RULES", "LR_SCALINGS", "DEVICES_ENV", "NO_LAUNCH_ENV"]

PRECISIONS = ("fp32", "bf16", "fp16")
ANCHOR_RULES = ("goodput", "throughput")
LR_SCALINGS = ("none", "adascale")  # flodl_hf.elche.lr_scaling (kept equal by tests/unit/elche/test_lr_scaling.py)
#: Comma-separated device list (e.g. ``cpu,cpu``) used when ``DdpConfig.devices`` is not given.
DEVICES_ENV = "FLODL_HF_DEVICES"
#: Set to ``1`` to stop ``Trainer.setup*`` from starting the other ranks itself.
NO_LAUNCH_ENV = "FLODL_HF_NO_LAUNCH"


def _bad(name: str, value: object, fix: str) -> ValueError:
    return ValueError(f"DdpConfig.{name}={value!r} is invalid: {fix}")


def _check_device(name: str) -> str:
    """Return a normalised device string or raise a ValueError naming the bad entry."""
    text = str(name).strip().lower()
    if text in ("cpu", "cuda", "mps"):
        return text
    if text.startswith("cuda:") and text[5:].isdigit():
        return text
    raise ValueError(
        f"unknown device {name!r}: use 'cpu', 'cuda' or 'cuda:N' (for example devices=['cuda:0', 'cuda:1'] "
        "or devices=['cpu', 'cpu'])"
    )


def _check_device_mix(devices: Sequence[str]) -> None:
    """Several ranks need one collective backend: NCCL for CUDA, gloo for CPU. A mixed list is refused."""
    kinds = sorted({d.split(":")[0] for d in devices})
    if len(devices) > 1 and "mps" in kinds:
        raise ValueError(f"devices {list(devices)} include 'mps': Apple MPS trains on one device only (no "
                         "collective backend supports it); use devices=['mps'], or CPU/CUDA ranks")
    if len(kinds) > 1:
        raise ValueError(f"devices {list(devices)} mix {' and '.join(kinds)}: all ranks of one job use one backend "
                         "(NCCL on CUDA, gloo on CPU), so use only CUDA devices or only CPU devices")


@dataclass
class DdpConfig:
    """How ``Trainer.setup_*_with`` places and synchronises ranks.

    Every field has a safe default; the defaults train on whatever one device is present, or on every rank of a
    ``torchrun`` / ``accelerate launch`` job.
    """

    devices: Optional[Sequence[str]] = None
    """Devices to run on, one rank each (``["cpu", "cpu"]``, ``["cuda:0", "cuda:1"]``). None: the launcher's
    environment, else ``$FLODL_HF_DEVICES``, else every visible GPU, else one CPU."""

    seed: int = 0
    """Seed for data shuffling (permutation of epoch n uses ``seed + n``), unless ``graph.set_data_loader`` is given
    the loop's own ``sampler``."""

    overhead_target: Optional[float] = None
    """Ceiling of El Che's synchronisation time / compute time, in [0.01, 0.5]. With the goodput rule it is a
    floor on the window that goodput may exceed (None, the default: no ceiling, goodput alone decides); with the
    throughput rule it is the target (None: 0.10). See ``flodl_hf.elche.goodput``. Acts on longer windows only, so
    it needs ``max_anchor > 1`` (or ``fixed_anchor``)."""

    anchor_rule: str = "goodput"
    """How El Che chooses its window: ``goodput`` (throughput x statistical efficiency from the online gradient
    noise scale) or ``throughput`` (the smallest window whose sync overhead meets ``overhead_target``). Either rule
    chooses among windows up to ``max_anchor``: ``throughput`` needs ``max_anchor > 1``."""

    lr_scaling: str = "none"
    """``none`` (default): El Che never changes the learning rate. ``adascale`` (opt-in): when a window averages
    more than one micro-step, its step's LR is multiplied by AdaScale's gain (SGD) or its square root (Adam family),
    the LR schedule advances by the gain, and goodput rates a longer window accordingly (``flodl_hf.elche.lr_scaling``).
    No effect on one device, or while the anchor stays 1, so ``adascale`` needs ``max_anchor > 1`` (or
    ``fixed_anchor``)."""

    anchor: Optional[int] = None
    """Initial El Che window length in micro-batches (default 1)."""

    max_anchor: Optional[int] = None
    """The longest window El Che may choose, in micro-batches per rank per optimizer step. None (the default): the
    window never grows past ``anchor`` (1 unless set), so every optimizer step averages the batch the loop's data
    loader defines (one micro-batch per rank), at any load; El Che still balances the split between ranks, which
    leaves the batch unchanged. ``N > 1`` is an opt-in trade: **fewer synchronisations for a larger, varying
    effective batch** (El Che lengthens the window when synchronising costs more than computing and the gradient
    is noisy; the LR schedule still counts micro-steps, so it ends on the last sample). ``0`` disables El Che:
    equal split, sync every step."""

    speed_hint: Optional[tuple[int, float]] = None
    """``(slow_rank, ratio)``: the other ranks are ``ratio`` (>= 1) times faster than ``slow_rank``. Seeds the
    split until the first measured window replaces it."""

    batch_sizes: Optional[Sequence[int]] = None
    """Fixed per-rank micro-batch sizes (summing to world_size * batch_size). Freezes El Che's split: used for
    exactness tests and for users who know their devices."""

    freeze_plan: bool = False
    """Keep the anchor and the split fixed (no auto-tuning)."""

    replay_plan: Optional[dict] = None
    """A plan an earlier run recorded (its ``metrics.json`` ``el_che.plan``, or ``graph.el_che_plan()``): every
    window's anchor and every split are played back instead of El Che's timing decisions, so the same command on the
    same devices repeats that run exactly (dropout draws included) whatever the machine's load. Overrides
    ``batch_sizes``, ``speed_hint``, ``fixed_anchor`` and the anchor rule; the world size and batch size must be the
    recorded ones. See ``flodl_hf.elche.plan_record``."""

    fixed_anchor: Optional[int] = None
    """Keep El Che's window at exactly this many micro-batches, so every optimizer step averages
    ``fixed_anchor x world_size x batch_size`` samples (a constant effective batch); El Che still balances the
    split between ranks. None: the window stays within [1, max_anchor] (by default at 1)."""

    max_micro_batch: Optional[int | Sequence[int] | str] = None
    """Memory cap: the most samples one rank's micro-batch may hold (one int for every rank, or one per rank).
    El Che never gives a rank more and spreads the rest over the others; a cap that cannot hold the global batch
    is refused at setup. ``"auto"``: every rank probes the largest micro-batch it can train when the data is set
    (``flodl_hf.elche.memory_probe``; out of memory means ``torch.OutOfMemoryError``). None: no cap."""

    max_grad_norm: Optional[float] = None
    """Clip the *reduced* gradient to this norm before each optimizer step (None: no clipping)."""

    simulate_speeds: Optional[Sequence[float]] = None
    """SIMULATION ONLY, for tests and benchmarks: rank r's compute time is stretched to compute / speed_r (the
    host sleeps, as it would wait on a slower GPU). Values in (0, 1]."""

    simulate_sync: Optional[float] = None
    """SIMULATION ONLY, for tests and benchmarks: a slow interconnect. After each window's reduction every rank
    sleeps this fraction of its mean compute time per micro-batch (so sync >= ``simulate_sync`` x compute at anchor
    1, whatever the machine); El Che counts it as synchronisation time. A value >= 0."""

    timeout_s: float = 300.0
    """Bound on any collective and on the rendezvous; a failed or vanished rank makes the others raise within it."""

    launch: bool = True
    """Start the other ranks by re-running this script when needed (plain ``python train.py`` with 2+ devices).
    ``$FLODL_HF_NO_LAUNCH=1`` also turns it off."""

    precision: str = "fp32"
    """``fp32``, ``bf16`` or ``fp16`` autocast for the forward pass."""

    drop_last: bool = True
    """Drop the final partial step of an epoch. False pads it with zero-weight samples (same step counts)."""

    verbose: bool = True
    """Print the one-line hardware diagnostic at setup (rank 0 only)."""

    bucket_mb: float = 25.0
    """Size of one gradient all-reduce bucket, in MiB of float32 (25, as torch DDP: small enough that ``overlap``
    can start the first buckets early in the backward pass)."""

    overlap: bool = True
    """Setup mode on N ranks: start the window-end all-reduce bucket by bucket during the last micro-batch's
    backward pass, as torch DDP does, instead of after it. The update is identical either way. With it on, a
    micro-batch runs one backward pass (a second one reaching a bucket already sent is refused with a clear
    error). False: reduce after the backward pass. Either way ``p.grad`` must not be changed between
    ``backward()`` and ``graph.step()`` (clip with ``max_grad_norm``): refused on every rank."""

    extra: dict = field(default_factory=dict)
    """Free-form settings carried along (recorded in model cards)."""

    def __post_init__(self) -> None:
        if self.devices is not None:
            if isinstance(self.devices, str):
                self.devices = [d for d in self.devices.split(",") if d.strip()]
            if len(self.devices) == 0:
                raise _bad("devices", self.devices, "give at least one device, e.g. ['cpu'] or ['cuda:0', 'cuda:1']")
            self.devices = [_check_device(d) for d in self.devices]
            _check_device_mix(self.devices)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise _bad("seed", self.seed, "use an integer seed")
        if self.anchor_rule not in ANCHOR_RULES:
            raise _bad("anchor_rule", self.anchor_rule, f"use one of {', '.join(ANCHOR_RULES)}")
        if self.replay_plan is not None:
            from .elche.plan_record import check_plan

            check_plan(self.replay_plan)
        if self.lr_scaling not in LR_SCALINGS:
            raise _bad("lr_scaling", self.lr_scaling, f"use one of {', '.join(LR_SCALINGS)} (the default, 'none', "
                       "never changes the learning rate)")
        if self.simulate_sync is not None and not float(self.simulate_sync) >= 0:
            raise _bad("simulate_sync", self.simulate_sync,
                       "use a fraction >= 0 of a micro-batch's compute time, e.g. 0.5, or None")
        for name, check in (("overhead_target", overhead_problem), ("anchor", anchor_problem),
                            ("max_anchor", max_anchor_problem)):
            value = getattr(self, name)
            problem = None if value is None else check(value)
            if problem is not None:
                raise _bad(name, value, problem)
        if self.fixed_anchor is not None and (not isinstance(self.fixed_anchor, int)
                                              or isinstance(self.fixed_anchor, bool) or self.fixed_anchor < 1):
            raise _bad("fixed_anchor", self.fixed_anchor, "use an integer >= 1 (micro-batches per optimizer step), "
                       "or None to let El Che adapt it")
        if self.max_micro_batch is not None and self.max_micro_batch != "auto":
            caps = [self.max_micro_batch] if isinstance(self.max_micro_batch, int) else list(self.max_micro_batch)
            if not caps or any(not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in caps):
                raise _bad("max_micro_batch", self.max_micro_batch,
                           "use an integer >= 1 (samples per micro-batch), one such integer per rank, or 'auto'")
            if not isinstance(self.max_micro_batch, int):
                self.max_micro_batch = caps
        over = anchor_over_bound(self.anchor, self.max_anchor)  # None unless both are set, valid, and out of order
        if over is not None:
            raise _bad("anchor", self.anchor, over)
        self._check_window_options()
        if self.speed_hint is not None:
            self.speed_hint = check_speed_hint(self.speed_hint, "DdpConfig.speed_hint")
        if self.batch_sizes is not None:
            self.batch_sizes = check_batch_sizes(self.batch_sizes, "DdpConfig.batch_sizes")
        if self.max_grad_norm is not None and not float(self.max_grad_norm) > 0:
            raise _bad("max_grad_norm", self.max_grad_norm, "use a positive norm, or None to disable clipping")
        if self.simulate_speeds is not None:
            speeds = [float(s) for s in self.simulate_speeds]
            if not speeds or any(not (0.0 < s <= 1.0) for s in speeds):
                raise _bad("simulate_speeds", self.simulate_speeds,
                           "give one simulated relative speed in (0, 1] per rank, e.g. [1.0, 0.4]")
            self.simulate_speeds = speeds
        if not float(self.timeout_s) > 0:
            raise _bad("timeout_s", self.timeout_s, "use a positive number of seconds, e.g. 300")
        if self.precision not in PRECISIONS:
            raise _bad("precision", self.precision, f"use one of {', '.join(PRECISIONS)}")
        if not float(self.bucket_mb) > 0:
            raise _bad("bucket_mb", self.bucket_mb, "use a positive bucket size in MiB, e.g. 25")
        if not isinstance(self.overlap, bool):
            raise _bad("overlap", self.overlap, "use True (reduce during backward) or False (after it)")

    def window_bound(self) -> int:
        """The longest El Che window this config allows, in micro-batches (0: El Che off)."""
        if self.fixed_anchor is not None:
            return int(self.fixed_anchor)
        if self.max_anchor is not None:
            return int(self.max_anchor)
        return max(1, int(self.anchor or 1))

    def _check_window_options(self) -> None:
        """Refuse a setting that only acts on a window longer than one micro-batch when no such window is allowed:
        it would be ignored, and the user would believe it trained as asked."""
        if self.replay_plan is not None or self.window_bound() != 1:
            return
        opt_in = ("set max_anchor=N as well (e.g. 8; CLI --max-anchor N), the opt-in that trades a larger, varying "
                  "effective batch for fewer synchronisations, or fixed_anchor=N (CLI --fixed-anchor N) for a "
                  "constant batch of N micro-batches per rank")
        acting = (("overhead_target", self.overhead_target is not None, "it lengthens El Che's window"),
                  ("anchor_rule", self.anchor_rule != "goodput", "it chooses El Che's window length"),
                  ("lr_scaling", self.lr_scaling != "none", "it scales the LR of windows longer than one micro-batch"))
        for name, set_, what in acting:
            if set_:
                raise _bad(name, getattr(self, name), f"{what}, but this config keeps every optimizer step at the "
                           f"batch the loop asked for (one micro-batch per rank, the default): {opt_in}")

    def el_che_kwargs(self, world: int, batch_size: int, probed: Optional[Sequence[int]] = None) -> dict:
        """The El Che settings of this config for ``world`` ranks of ``batch_size`` (checked here, where the
        message can name the DdpConfig field). ``probed``: the caps ``max_micro_batch="auto"`` found."""
        kwargs: dict = {"anchor": self.anchor, "max_anchor": self.window_bound(),
                        "overhead_target": self.overhead_target,
                        "anchor_rule": self.anchor_rule, "lr_scaling": self.lr_scaling,
                        "batch_sizes": list(self.batch_sizes) if self.batch_sizes is not None else None}
        if self.fixed_anchor is not None:
            if self.max_anchor == 0:
                raise _bad("fixed_anchor", self.fixed_anchor, "it needs El Che on: remove max_anchor=0")
            a = int(self.fixed_anchor)
            kwargs.update(anchor=a, min_anchor=a, max_anchor=a)
        caps = list(probed) if probed is not None else self.micro_batch_caps(world)
        if caps is not None:
            if world == 1 or self.max_anchor == 0:
                if any(c < batch_size for c in caps):
                    raise _bad("max_micro_batch", self.max_micro_batch,
                               f"with {'one rank' if world == 1 else 'El Che off (max_anchor=0)'} every micro-batch "
                               f"holds batch_size={batch_size} samples: lower batch_size to {min(caps)} or below")
                caps = None
            elif sum(caps) < world * batch_size:
                raise _bad("max_micro_batch", self.max_micro_batch,
                           f"the caps {caps} hold {sum(caps)} samples per step but {world} rank(s) x batch_size "
                           f"{batch_size} = {world * batch_size}: raise the cap, lower batch_size or add ranks")
            kwargs["max_batch_sizes"] = caps
        return kwargs

    def micro_batch_caps(self, world: int) -> Optional[list[int]]:
        """``max_micro_batch`` as one cap per rank (None: no cap)."""
        cap = self.max_micro_batch
        if cap is None or cap == "auto":  # "auto": known once probed (Graph.set_data_loader)
            return None
        if isinstance(cap, int):
            return [cap] * world
        caps = list(cap)
        if len(caps) != world:
            raise _bad("max_micro_batch", cap, f"give one cap per rank ({world}), or one int for all")
        return caps

    def resolved_devices(self) -> Optional[list[str]]:
        """The explicit device list: the field, else ``$FLODL_HF_DEVICES``, else None (auto)."""
        if self.devices is not None:
            return list(self.devices)
        env = os.environ.get(DEVICES_ENV, "").strip()
        if env:
            devices = [_check_device(d) for d in env.split(",") if d.strip()]
            _check_device_mix(devices)
            return devices
        return None

    def launch_enabled(self) -> bool:
        return self.launch and os.environ.get(NO_LAUNCH_ENV, "") not in ("1", "true", "yes")
