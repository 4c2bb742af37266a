"""Modelled device time: the one simulation every bench mode shares.

Why it exists: to compare training modes on heterogeneous devices without owning the devices, every mode must
pay exactly the same modelled cost for the same work, through the same code. A forward pre-hook on the model
sleeps ``device_ms * (b / 16) / speed`` before the forward pass of every micro-batch of ``b`` samples (40 ms per
16 samples = 2.5 ms/sample at speed 1.0; a rank with speed 0.4 takes 2.5x as long). A hook, not a wrapper, so
state dicts, ``DistributedDataParallel``, ``Accelerator.prepare`` and the El Che replica factory see the plain
model.

El Che setup mode therefore runs WITHOUT ``DdpConfig.simulate_speeds`` (that option stretches a rank's measured
compute by sleeping, which would stretch this sleep a second time). Real compute (the model's own forward and
backward on the CPU) is not stretched: keep it small next to the modelled time (the bench's models are tiny).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator, Optional

import torch

__all__ = ["REFERENCE_BATCH", "DeviceModel", "batch_size_of"]

#: The modelled ``device_ms`` is the time of one micro-batch of this many samples at speed 1.0.
REFERENCE_BATCH = 16


def batch_size_of(args: tuple, kwargs: dict) -> Optional[int]:
    """Samples in a forward call: the first dimension of its first tensor argument (positional, then keyword)."""
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return None


class DeviceModel:
    """Sleeps the modelled device time of each forward pass of one rank's model.

    ``device_ms``: modelled milliseconds per ``REFERENCE_BATCH`` samples at speed 1.0 (0 = no modelling: real
    devices are measured as they are). ``speed``: this rank's relative speed in (0, 1].
    """

    def __init__(self, device_ms: float, speed: float = 1.0, stretch: bool = False) -> None:
        if not device_ms >= 0:
            raise ValueError(f"device_ms={device_ms!r} is invalid: use a modelled time >= 0 ms per "
                             f"{REFERENCE_BATCH} samples (0 turns modelling off)")
        if not 0.0 < speed <= 1.0:
            raise ValueError(f"speed={speed!r} is invalid: use a relative speed in (0, 1]")
        self.device_ms = float(device_ms)
        self.speed = float(speed)
        self.stretch = bool(stretch)
        self.slept_s = 0.0
        self.calls = 0
        self._active = True

    def cost_s(self, samples: int) -> float:
        """Modelled seconds for a micro-batch of ``samples``. With ``stretch`` only the extra a slower device
        needs over this machine's real compute (``device_ms`` is then that real compute per 16 samples): a rank
        at speed 1.0 sleeps nothing, one at 0.4 sleeps 1.5x its real compute."""
        factor = (1.0 / self.speed - 1.0) if self.stretch else 1.0 / self.speed
        return self.device_ms * (samples / REFERENCE_BATCH) * factor / 1000.0

    def attach(self, module: torch.nn.Module) -> torch.nn.Module:
        """Register the sleeping pre-hook on ``module`` (returns it, for use inside a factory)."""
        if self.device_ms > 0:
            module.register_forward_pre_hook(self._hook, with_kwargs=True)
        return module

    def _hook(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if not self._active:
            return None
        samples = batch_size_of(args, kwargs)
        if samples:
            seconds = self.cost_s(samples)
            time.sleep(seconds)
            self.slept_s += seconds
            self.calls += 1
        return None

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """No modelled time inside (held-out evaluation is not training time and is off the clock anyway)."""
        previous, self._active = self._active, False
        try:
            yield
        finally:
            self._active = previous

    def summary(self) -> dict[str, Any]:
        return {"device_ms": self.device_ms, "speed": self.speed, "stretch": self.stretch,
                "modelled_s": round(self.slept_s, 4),
                "forward_calls": self.calls}
