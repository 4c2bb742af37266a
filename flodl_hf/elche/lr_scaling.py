"""The opt-in learning-rate rule of El Che's window: AdaScale's gain (pure Python).

Why it exists: the learning rate is the user's hyper-parameter, so by default El Che never changes it
(``lr_scaling="none"``), and a longer window (anchor A) is then worth at most what a fixed-LR step on a larger batch
is worth (``flodl_hf.elche.goodput``). ``lr_scaling="adascale"`` (``DdpConfig(lr_scaling=...)``, CLI
``--lr-scaling``) is the opt-in that lets the LR follow the batch, by AdaScale SGD's rule (Johnson et al., ICML
2020):

- **The gain.** A window of ``s`` micro-steps averages ``s`` times the micro-step's batch ``M0``. AdaScale's gain is
  ``r = (sigma^2 + mu^2) / (sigma^2 / s + mu^2) = (rho + 1) / (rho / s + 1)`` with ``rho = B_noise / M0``, from the
  gradient noise scale El Che already estimates at no extra collective
  (:func:`flodl_hf.elche.noise_scale.adascale_gain`). It is 1 at ``s = 1`` and without noise, and at most ``s``.
  Until the estimate is usable (the same three windows the anchor rule waits for) nothing is scaled: the gain is
  unknown, so the window is treated as with ``none`` (LR unchanged, the schedule advanced by its micro-steps).
- **The step.** SGD steps at ``r`` x the scheduled LR. AdaScale is derived for SGD; for Adam-family optimizers
  (Adam, AdamW, NAdam, RAdam, Adamax, RMSprop), whose update does not grow with the gradient's size, the LR is
  multiplied by ``sqrt(r)``: the square-root rule for adaptive optimizers (Malladi et al., NeurIPS 2022, "On the
  SDEs and Scaling Rules for Adaptive Gradient Algorithms"; AdaptDL's ``AdamScale`` uses the same power). Any other
  optimizer is refused at setup: its rule is unknown.
- **The schedule.** AdaScale's clock advances by the gain: one window is ``r`` micro-steps of progress, not ``s``
  (:class:`ScheduleClock` carries the fraction, so a schedule stepped in whole steps advances by ``r`` on average
  and by exactly ``floor`` of the running total). A run that scaled therefore ends its epochs before its LR
  schedule ends (the fraction it reached is recorded as ``schedule_progress``); AdaScale's answer is to train
  until the schedule ends, which here means more epochs.

The factors multiply with ``Graph.set_lr_scale`` (a constant the user sets) and the builder's ``lr_scale_ratio``
(a constant from the world size): ``lr_scaling`` names the *rule* that varies per window, hence its own name.
Everything here is deterministic arithmetic on figures every rank holds identically, so every rank steps with the
same LR.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from .noise_scale import adascale_gain

__all__ = ["LR_SCALINGS", "ADAPTIVE_OPTIMIZERS", "SGD_OPTIMIZERS", "lr_exponent", "ScheduleClock"]

#: ``lr_scaling`` values: ``none`` (the user's LR; the default) or ``adascale`` (AdaScale's gain, opt-in).
LR_SCALINGS = ("none", "adascale")
#: Optimizers (class names, or a base class's) whose LR follows ``sqrt(gain)``.
ADAPTIVE_OPTIMIZERS = ("Adam", "AdamW", "NAdam", "RAdam", "Adamax", "RMSprop")
#: Optimizers whose LR follows the gain itself (AdaScale SGD, with or without momentum).
SGD_OPTIMIZERS = ("SGD",)


def lr_exponent(optimizer_mro: list[str]) -> float:
    """The power of the gain an optimizer's LR is multiplied by: 1 for SGD, 0.5 for the Adam family.

    ``optimizer_mro``: the names of the optimizer's class and its bases (``[c.__name__ for c in type(opt).__mro__]``),
    so a subclass of AdamW follows AdamW's rule. Any other optimizer: ValueError naming the fix."""
    for name in optimizer_mro:
        if name in SGD_OPTIMIZERS:
            return 1.0
        if name in ADAPTIVE_OPTIMIZERS:
            return 0.5
    raise ValueError(f"DdpConfig.lr_scaling='adascale' does not know how to scale the LR of {optimizer_mro[0]}: it "
                     f"scales SGD by AdaScale's gain and {', '.join(ADAPTIVE_OPTIMIZERS)} by its square root; use "
                     "one of those optimizers, or lr_scaling='none' (the default: the LR is yours)")


class ScheduleClock:
    """How far each window moves the LR schedule, and the gain of its step.

    ``none``: a window of ``s`` micro-steps advances the schedule ``s`` steps (it ends on the run's last sample).
    ``adascale``: it advances by the gain ``r``; the fraction not yet stepped is carried to the next window.
    """

    def __init__(self, rule: str = "none") -> None:
        if rule not in LR_SCALINGS:
            raise ValueError(f"lr_scaling={rule!r} is invalid: use one of {', '.join(LR_SCALINGS)}")
        self.rule = rule
        self.carry = 0.0  # schedule progress earned but not yet stepped (adascale)
        self.progress = 0.0  # sum of the gains (adascale) or micro-steps (none) so far
        self.micro_steps = 0  # micro-steps the windows ran so far
        self.last_gain = 1.0

    def gain(self, micro_batches: int, noise_scale: Optional[float], micro_items: Optional[float],
             usable: bool) -> Optional[float]:
        """AdaScale's gain for a window of ``micro_batches`` micro-steps; None when nothing is scaled (``none``, or
        no usable noise estimate yet). A one-micro-step window's gain is 1 (its batch is the unscaled one)."""
        if self.rule != "adascale" or not usable or noise_scale is None or not micro_items:
            return None
        if micro_batches <= 1:
            return 1.0
        return adascale_gain(noise_scale, micro_items, float(micro_batches))

    def advance(self, micro_batches: int, gain: Optional[float]) -> int:
        """Record one window; return how many times to step the LR scheduler now (>= 1). ``gain`` None: the window
        was not scaled, and the schedule advances by its micro-steps."""
        if gain is not None and not (math.isfinite(gain) and 1.0 <= gain <= max(1, micro_batches) + 1e-9):
            raise ValueError(f"gain={gain!r} is invalid for a window of {micro_batches} micro-steps: AdaScale's gain "
                             "is in [1, micro-steps]")
        self.last_gain = 1.0 if gain is None else float(gain)
        self.micro_steps += int(micro_batches)
        if self.rule == "none" or gain is None:
            self.progress += micro_batches
            self.carry += micro_batches
            steps = int(math.floor(self.carry + 1e-9))
            self.carry = max(0.0, self.carry - steps)
            return max(1, steps)
        self.progress += gain
        self.carry += gain
        steps = int(math.floor(self.carry + 1e-9))
        self.carry = max(0.0, self.carry - steps)
        return steps  # >= 1: the gain is >= 1

    @property
    def schedule_progress(self) -> float:
        """Schedule steps earned over micro-steps run (1.0 unless ``adascale`` scaled some window)."""
        return 1.0 if self.micro_steps == 0 else self.progress / self.micro_steps

    def state_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "carry": self.carry, "progress": self.progress, "micro_steps": self.micro_steps,
                "last_gain": self.last_gain}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the clock's counters (the rule stays this run's: a resume may change it)."""
        self.carry, self.progress = float(state["carry"]), float(state["progress"])
        self.micro_steps, self.last_gain = int(state["micro_steps"]), float(state["last_gain"])
