"""How El Che picks its setup-mode window (the anchor A): by goodput, with an optional overhead ceiling (pure Python).

Why it exists: a longer window synchronises less often (more samples per second) but makes the effective batch
``A * M0`` larger (``M0`` = items of one micro-step over every rank), so each sample does less. Pollux (OSDI 2021)
calls the product *goodput*; El Che maximises it. Both factors come from figures El Che already has:

- **Throughput**, from El Che's timing model: a micro-step costs ``c`` (the balanced per-rank compute) and a window
  adds ``s`` of synchronisation that does not grow with A, so samples per second are ``A M0 / (A c + s)``.
  Relative to a sync-free run that is ``A / (A + o1)`` with ``o1 = s / c``, the window's overhead at anchor 1 (the
  median of the last five windows, as the overhead rule uses).
- **Statistical efficiency**, from the gradient noise scale (``flodl_hf.elche.noise_scale``), relative to ``M0`` *at
  the user's unchanged learning rate* (El Che does not scale it): ``E(A) = (1 + k (1 - 1/A)) / A`` with
  ``k = rho / (1 + rho)``, ``rho = B_noise / M0`` (:func:`flodl_hf.elche.noise_scale.fixed_lr_efficiency`).

``goodput(A) = A / (A + o1) * E(A) = (1 + k (1 - 1/A)) / (A + o1)``: 1.0 would be anchor 1 with free
synchronisation. Between 1 and 2 the switch is at ``k (1 + o1) = 2``: since ``k < 1``, a longer window pays only
when synchronising costs more than computing (``o1 > 1``) *and* the gradient is noisy (``rho > 2 / (o1 - 1)``).
With no noise estimate yet (or a usable one not yet smoothed over ``min_windows`` windows) ``rho = 0``: no
benefit from a larger batch is assumed, so goodput picks ``min_anchor`` (1 by default).

Design note (measured): the first version used Pollux's efficiency ``(rho + 1) / (rho + A)``, which
assumes the LR is re-tuned (AdaScale) for the larger batch. At an unchanged LR it overstates what a longer window
is worth: on the packaged MiniLM with a modelled interconnect 8x slower than compute it chose longer windows and
ended one 1,536-row epoch at 0.545 held-out accuracy where anchor 1 reached 0.625. ``E(A)`` above never exceeds
Pollux's, so wherever the first version kept anchor 1 this one does too.

**With the LR following the batch** (``lr_scaling="adascale"``, opt-in): the engine multiplies the
window's LR by AdaScale's gain (``flodl_hf.elche.lr_scaling``), so a window of A is worth what Pollux assumes,
``E(A) = (rho + 1) / (rho + A)`` (:func:`flodl_hf.elche.noise_scale.statistical_efficiency`), and goodput uses that
form: ``goodput(A) = A / (A + o1) * (rho + 1) / (rho + A)``. Without noise both forms are ``1 / A``; with noise
this one is the larger, so a longer window pays sooner: A = 2 beats A = 1 when ``o1 rho > 2`` (before the
hysteresis below), against ``k (1 + o1) > 2`` at a fixed LR.

**Hysteresis**: the anchor moves only when the best candidate's goodput beats the current anchor's by more than
``GAIN_THRESHOLD`` (5 %), so noise in either factor does not make it flap between neighbours.

**overhead_target (tau) as a ceiling** (only when set): the overhead rule's anchor, the smallest A with
``o1 / A <= tau`` (:func:`overhead_anchor`, with its own 7 % band), is a *floor* on the window, i.e. a ceiling on
the time spent synchronising. The anchor is ``clamp(max(goodput's, overhead's), min_anchor, max_anchor)``: goodput
may choose a longer window than tau needs, never a costlier synchronisation than the user allowed. Unset (the
setup default), goodput alone decides; with tau set and no noise estimate the result is exactly the overhead rule
(El Che's earlier rule, still selectable as ``anchor_rule="throughput"`` with tau 0.10 by default).
"""

from __future__ import annotations

import math
from typing import Optional

from .lr_scaling import LR_SCALINGS

__all__ = ["GAIN_THRESHOLD", "goodput", "goodput_anchor", "overhead_anchor", "combined_anchor"]

GAIN_THRESHOLD = 0.05  # a new anchor must promise this much more goodput than the current one
_ANCHOR_DEAD_ZONE = 0.07  # overhead rule: about two standard errors of a 5-window median under 5 % timing noise
_CEIL_TOL = 1e-9  # absorbs float noise in ceil(o1 / tau), e.g. 5.000000000000001 -> 5


def _check(o1: float, rho: float) -> None:
    if not (math.isfinite(o1) and o1 >= 0):
        raise ValueError(f"o1={o1!r} is invalid: the overhead at anchor 1 is a finite ratio >= 0")
    if not (math.isfinite(rho) and rho >= 0):
        raise ValueError(f"rho={rho!r} is invalid: the noise scale over the micro-step batch is finite and >= 0")


def goodput(anchor: int, o1: float, rho: float, lr_scaling: str = "none") -> float:
    """Throughput x statistical efficiency at ``anchor``, relative to anchor 1 with free sync (see module doc).
    ``lr_scaling="adascale"``: the efficiency of a window whose LR follows AdaScale's gain (Pollux's form)."""
    _check(o1, rho)
    if anchor < 1:
        raise ValueError(f"anchor={anchor!r} is invalid: use an anchor >= 1")
    if lr_scaling == "adascale":
        return anchor / (anchor + o1) * (rho + 1.0) / (rho + anchor)
    if lr_scaling != "none":
        raise ValueError(f"lr_scaling={lr_scaling!r} is invalid: use one of {', '.join(LR_SCALINGS)}")
    k = rho / (1.0 + rho)
    return (1.0 + k * (1.0 - 1.0 / anchor)) / (anchor + o1)


def goodput_anchor(current: int, o1: float, rho: float, lo: int, hi: int,
                   threshold: float = GAIN_THRESHOLD, lr_scaling: str = "none") -> int:
    """The anchor in ``[lo, hi]`` of highest goodput (ties: the smaller), or ``current`` unless that beats it by
    more than ``threshold`` (a ``current`` outside the bounds always moves)."""
    _check(o1, rho)
    if not 1 <= lo <= hi:
        raise ValueError(f"bounds [{lo}, {hi}] are invalid: need 1 <= min_anchor <= max_anchor")
    best = max(range(lo, hi + 1), key=lambda a: (goodput(a, o1, rho, lr_scaling), -a))
    if not lo <= current <= hi:
        return best
    gain = goodput(best, o1, rho, lr_scaling) / goodput(current, o1, rho, lr_scaling)
    return best if gain > 1.0 + threshold else current


def overhead_anchor(current: int, o1: float, tau: float, lo: int, hi: int) -> int:
    """The overhead rule: the smallest A in ``[lo, hi]`` with ``o1 / A <= tau``, moved to only when ``current``
    misses tau by more than 7 % of it, or ``current - 1`` meets it with 7 % to spare (else ``current``)."""
    band = tau * _ANCHOR_DEAD_ZONE
    if o1 / current > tau + band or (current > 1 and o1 / (current - 1) <= tau - band):
        return min(max(math.ceil(o1 / tau - _CEIL_TOL), lo), hi)
    return current


def combined_anchor(current: int, o1: float, rho: Optional[float], tau: Optional[float], lo: int, hi: int,
                    rule: str, lr_scaling: str = "none") -> int:
    """The next anchor. ``rule="throughput"``: the overhead rule alone. ``rule="goodput"``:
    ``clamp(max(goodput_anchor, overhead_anchor if tau is set), lo, hi)``; ``rho=None`` counts as 0."""
    if rule == "throughput":
        if tau is None:
            raise ValueError("the throughput rule needs overhead_target: pass a value in [0.01, 0.5]")
        return overhead_anchor(current, o1, tau, lo, hi)
    chosen = goodput_anchor(current, o1, 0.0 if rho is None else rho, lo, hi, lr_scaling=lr_scaling)
    if tau is not None:
        chosen = max(chosen, overhead_anchor(current, o1, tau, lo, hi))
    return min(max(chosen, lo), hi)
