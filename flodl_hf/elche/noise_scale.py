"""The gradient noise scale, estimated online from what a data-parallel window already computes (pure Python).

Why it exists: how much a larger effective batch helps depends on how noisy the gradient is. McCandlish et al.
(2018, "An Empirical Model of Large-Batch Training") call ``B_noise = tr(Sigma) / |G|^2`` the *gradient noise
scale*: batches well below it make nearly linear progress per sample, batches well above it waste samples. Pollux
(OSDI 2021) turns it into the statistical efficiency of a batch, which El Che multiplies with its throughput model
to choose the window (``flodl_hf.elche.goodput``). This module only does arithmetic on floats, so it is unit-tested on
synthetic gradients and carries no torch or torch.distributed import.

The inputs of one window, at no extra collective (``flodl_hf.distributed.window`` sends them in the metadata prefix
the window's reduction already carries):

- ``small_sq[r] = |G_r|^2``: rank r's squared norm of *its own* window gradient, the mean over its ``items[r]``
  loss-denominator items (``G_r = sum_i d_i g_i / D_r``, the same weights that make the update exact);
- ``items[r] = B_r``: that denominator (samples, or counted tokens); ``B = sum_r B_r``;
- ``big_sq = |G_big|^2``: the squared norm of the reduced gradient, ``G_big = sum_r B_r G_r / B``.

Model: item gradients are independent with mean ``G`` and covariance ``Sigma`` (items of one window share the same
parameters: nothing is stepped inside a window). Then ``E|G_r|^2 = |G|^2 + tr(Sigma)/B_r`` and
``E|G_big|^2 = |G|^2 + tr(Sigma)/B``.

**Unequal sample counts** (El Che gives fast ranks more). Weight each rank's norm by its items,
``S = sum_r (B_r/B) |G_r|^2``, over the ``k`` ranks with ``B_r > 0``. Then ``E[S] = |G|^2 + k tr(Sigma)/B``: the
weighted small norm behaves like one batch of ``B_small = B/k`` (the mean rank batch), whatever the split. Solving
the two expectations gives the unbiased estimates::

    tr(Sigma)_hat = (S - |G_big|^2) / (k/B - 1/B)  = B (S - |G_big|^2) / (k - 1)
                  = sum_r B_r |G_r - G_big|^2 / (k - 1)          (the pooled between-rank scatter)
    |G|^2_hat     = (k |G_big|^2 - S) / (k - 1)

With equal counts ``B_r = b`` (``B_small = b``, ``B_big = k b``) these are exactly McCandlish's Appendix A:
``|G|^2 = (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)`` and
``tr(Sigma) = (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)``, with ``|G_small|^2`` the mean of the ranks'.
Both are unbiased for any split (``E[S - |G_big|^2] = (k - 1) tr(Sigma)/B``). Weighting by items rather than
equally keeps a slow rank's small, noisy batch from dominating.

**Smoothing.** One window's estimates are noisy (``|G|^2_hat`` can be negative). As McCandlish and Pollux do, each
is smoothed by an exponential moving average over windows (bias-corrected, so the first window counts in full) and
the noise scale is the *ratio of the smoothed estimates*, ``B_noise = EMA(tr Sigma) / EMA(|G|^2)``. While
``EMA(|G|^2) <= 0`` (noise dominates what the windows have seen) there is no usable estimate (``None``); a
non-positive ``EMA(tr Sigma)`` gives ``B_noise = 0``.

Units: ``B_noise`` is in loss-denominator items (samples for sequence classification). Token-level losses count
tokens, which are not independent; the estimate is then a heuristic in tokens, compared with batches in tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Optional

__all__ = ["window_estimates", "pooled_estimates", "NoiseScale", "WindowNoise", "statistical_efficiency",
           "fixed_lr_efficiency", "adascale_gain"]

DEFAULT_DECAY = 0.9  # EMA weight of the past: about ten windows of memory


def _finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} is invalid: pass a finite number")
    return float(value)


def window_estimates(small_sq: Sequence[float], items: Sequence[float],
                     big_sq: float) -> Optional[tuple[float, float]]:
    """Unbiased ``(|G|^2, tr(Sigma))`` of one window (see the module docstring), or None when fewer than two
    ranks counted items (one batch size alone cannot separate signal from noise).

    ``small_sq[r]``: rank r's ``|G_r|^2``; ``items[r]``: its denominator ``B_r`` (ranks with 0 are left out);
    ``big_sq``: ``|G_big|^2`` of the reduced gradient.
    """
    if len(small_sq) != len(items):
        raise ValueError(f"small_sq has {len(small_sq)} entries and items {len(items)}: give one of each per rank")
    big = _finite("big_sq", big_sq)
    if big < 0:
        raise ValueError(f"big_sq={big_sq!r} is invalid: a squared norm is >= 0")
    pairs = []
    for r, (sq, n) in enumerate(zip(small_sq, items)):
        sq, n = _finite(f"small_sq[{r}]", sq), _finite(f"items[{r}]", n)
        if sq < 0 or n < 0:
            raise ValueError(f"rank {r}: small_sq={sq!r}, items={n!r} are invalid: both must be >= 0")
        if n > 0:
            pairs.append((sq, n))
    return pooled_estimates(sum(n * sq for sq, n in pairs), sum(n for _, n in pairs), len(pairs), big)


def pooled_estimates(weighted_sq_sum: float, total: float, ranks: int,
                     big_sq: float) -> Optional[tuple[float, float]]:
    """:func:`window_estimates` from what one scalar all-reduce gives: ``weighted_sq_sum = sum_r B_r |G_r|^2``,
    ``total = sum_r B_r`` and ``ranks``, the number of ranks with ``B_r > 0`` (builder mode's SYNC rounds sum
    these across ranks instead of gathering per-rank lists). None when fewer than two ranks counted items."""
    big = _finite("big_sq", big_sq)
    weighted, total = _finite("weighted_sq_sum", weighted_sq_sum), _finite("total", total)
    if big < 0 or weighted < 0 or total < 0:
        raise ValueError(f"big_sq={big_sq!r}, weighted_sq_sum={weighted_sq_sum!r} and total={total!r} must be >= 0")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 0:
        raise ValueError(f"ranks={ranks!r} is invalid: pass the number of ranks that counted items")
    if ranks < 2 or total <= 0:
        return None
    s = weighted / total
    return (ranks * big - s) / (ranks - 1), total * (s - big) / (ranks - 1)


class NoiseScale:
    """Smoothed ``|G|^2`` and ``tr(Sigma)`` over windows, and their ratio ``B_noise`` (items).

    ``decay`` in [0, 1): the EMA's weight of the past (0 = the last window only). Deterministic; its
    :meth:`state_dict` is JSON-serialisable and :meth:`load_state_dict` restores it exactly.
    """

    def __init__(self, decay: float = DEFAULT_DECAY) -> None:
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 <= decay < 1.0:
            raise ValueError(f"decay={decay!r} is invalid: use an EMA decay in [0, 1), e.g. 0.9")
        self._decay = float(decay)
        self._grad_sq = 0.0  # raw (not bias-corrected) EMAs
        self._trace = 0.0
        self._windows = 0

    @property
    def windows(self) -> int:
        """Windows that gave an estimate so far."""
        return self._windows

    def _corrected(self, ema: float) -> Optional[float]:
        return None if self._windows == 0 else ema / (1.0 - self._decay ** self._windows)

    @property
    def grad_sq(self) -> Optional[float]:
        """Smoothed, bias-corrected ``|G|^2`` (None before the first estimate)."""
        return self._corrected(self._grad_sq)

    @property
    def trace(self) -> Optional[float]:
        """Smoothed, bias-corrected ``tr(Sigma)`` per item (None before the first estimate)."""
        return self._corrected(self._trace)

    @property
    def noise_scale(self) -> Optional[float]:
        """``B_noise = EMA(tr Sigma) / EMA(|G|^2)`` in items; None before any estimate or while EMA(|G|^2) <= 0."""
        if self._windows == 0 or self._grad_sq <= 0:
            return None
        return max(0.0, self._trace) / self._grad_sq  # the bias corrections cancel in the ratio

    def update(self, small_sq: Sequence[float], items: Sequence[float], big_sq: float) -> bool:
        """Fold one window in; False (nothing changed) when it cannot give an estimate."""
        return self._fold(window_estimates(small_sq, items, big_sq))

    def update_pooled(self, weighted_sq_sum: float, total: float, ranks: int, big_sq: float) -> bool:
        """:meth:`update` from :func:`pooled_estimates`' inputs (sums over ranks instead of per-rank lists)."""
        return self._fold(pooled_estimates(weighted_sq_sum, total, ranks, big_sq))

    def _fold(self, est: Optional[tuple[float, float]]) -> bool:
        if est is None:
            return False
        g2, tr = est
        b = self._decay
        self._grad_sq = b * self._grad_sq + (1.0 - b) * g2
        self._trace = b * self._trace + (1.0 - b) * tr
        self._windows += 1
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self._decay, "grad_sq_ema": self._grad_sq, "trace_ema": self._trace,
                "windows": self._windows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (the decay comes from the snapshot)."""
        missing = [k for k in self.state_dict() if k not in state]
        if missing:
            raise ValueError(f"noise state is missing keys {missing}: pass a dict from NoiseScale.state_dict()")
        self.__init__(float(state["decay"]))  # type: ignore[misc]  # validates the decay
        self._grad_sq, self._trace = float(state["grad_sq_ema"]), float(state["trace_ema"])
        self._windows = int(state["windows"])


class WindowNoise:
    """What El Che keeps of the noise: the smoothed :class:`NoiseScale` plus ``M0``, the loss-denominator items of
    one micro-step over every rank (the unit the anchor multiplies), both from the last window with an estimate."""

    def __init__(self) -> None:
        self.scale = NoiseScale()
        self.micro_items: Optional[float] = None

    def observe(self, world: int, micro_batches: int, grad_sq: Optional[Sequence[float]],
                grad_items: Optional[Sequence[float]], reduced_grad_sq: Optional[float]) -> None:
        """Fold in one window's figures (all three, or all None: nothing to do)."""
        given = [v is not None for v in (grad_sq, grad_items, reduced_grad_sq)]
        if not any(given):
            return
        if not all(given):
            raise ValueError("grad_sq, grad_items and reduced_grad_sq go together: pass all three or none")
        if len(grad_sq) != world or len(grad_items) != world:  # type: ignore[arg-type]
            counts = (len(grad_sq), len(grad_items))  # type: ignore[arg-type]
            raise ValueError(f"grad_sq and grad_items have {counts[0]} and {counts[1]} entries: "
                             f"pass one value per rank ({world})")
        if self.scale.update(grad_sq, grad_items, reduced_grad_sq):  # type: ignore[arg-type]
            self.micro_items = float(sum(grad_items)) / micro_batches  # type: ignore[arg-type]

    def rho(self, min_windows: int) -> Optional[float]:
        """``B_noise / M0`` once ``min_windows`` windows gave an estimate, else None."""
        phi, m0 = self.scale.noise_scale, self.micro_items
        if phi is None or not m0 or self.scale.windows < min_windows:
            return None
        return phi / m0

    def efficiency(self, anchor: int, adaptive_lr: bool = False) -> Optional[float]:
        """Statistical efficiency of ``anchor`` micro-steps per update relative to one, at the user's unchanged
        learning rate (:func:`fixed_lr_efficiency`), or with ``adaptive_lr`` at AdaScale's LR
        (:func:`statistical_efficiency`); None: no estimate."""
        phi, m0 = self.scale.noise_scale, self.micro_items
        if phi is None or not m0:
            return None
        return (statistical_efficiency if adaptive_lr else fixed_lr_efficiency)(phi, m0, anchor * m0)

    def state_dict(self) -> dict[str, Any]:
        return {**self.scale.state_dict(), "micro_items": self.micro_items}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale.load_state_dict(state)
        self.micro_items = None if state.get("micro_items") is None else float(state["micro_items"])


def statistical_efficiency(noise_scale: float, m0: float, m: float) -> float:
    """Pollux's efficiency of batch ``m`` relative to ``m0``: ``(B_noise + m0) / (B_noise + m)``.

    Progress per *sample* at batch ``m`` as a fraction of that at ``m0`` (Pollux, OSDI'21, eq. 6, with the
    noise scale phi = B_noise). 1 at ``m = m0``; about ``m0 / m`` once both are far above the noise scale.
    """
    phi, m0, m = _finite("noise_scale", noise_scale), _finite("m0", m0), _finite("m", m)
    if phi < 0 or m0 <= 0 or m <= 0:
        raise ValueError(f"noise_scale={noise_scale!r}, m0={m0!r}, m={m!r}: need noise_scale >= 0 and "
                         "positive batch sizes")
    return (phi + m0) / (phi + m)


def fixed_lr_efficiency(noise_scale: float, m0: float, m: float) -> float:
    """Progress per sample at batch ``m`` relative to ``m0`` when the learning rate stays the one tuned for ``m0``.

    Pollux's :func:`statistical_efficiency` assumes the learning rate is re-tuned (AdaScale's gain) for the larger
    batch. El Che does not touch the user's LR, so a window of ``s = m / m0`` micro-steps takes one step where
    ``s`` would have been taken, and a larger batch only removes gradient noise from that one step. McCandlish et
    al.'s expected improvement of one SGD step, ``eps |G|^2 - eps^2/2 (G'HG + tr(H Sigma)/B)``, with ``eps`` the
    best learning rate for ``m0`` (``eps_max / (1 + rho)``, ``rho = B_noise / m0``) gives a step at batch ``s m0``
    ``1 + k (1 - 1/s)`` times the progress of a step at ``m0``, ``k = rho / (1 + rho)``. Per sample::

        E_fixed(s) = (1 + k (1 - 1/s)) / s

    1 at ``s = 1``; ``1/s`` without noise; at most ``(2 - 1/s)/s`` however noisy (a step at a fixed LR can at
    most double its progress). It never exceeds Pollux's ``(rho + 1)/(rho + s)``; with a smaller LR than the best
    for ``m0`` (usual when fine-tuning) the true figure is lower still, so this is an upper bound.
    """
    phi, a, b = _finite("noise_scale", noise_scale), _finite("m0", m0), _finite("m", m)
    if phi < 0 or a <= 0 or b <= 0:
        raise ValueError(f"noise_scale={noise_scale!r}, m0={m0!r}, m={m!r}: need noise_scale >= 0 and "
                         "positive batch sizes")
    s, rho = b / a, phi / a
    return (1.0 + rho / (1.0 + rho) * (1.0 - 1.0 / s)) / s


def adascale_gain(noise_scale: float, m0: float, scale: float) -> float:
    """AdaScale SGD's gain ratio (Johnson et al., ICML 2020) for a batch ``scale`` times ``m0``.

    ``r = (sigma^2 + mu^2) / (sigma^2 / scale + mu^2)`` with ``sigma^2 = tr(Sigma)/m0`` the variance of an
    ``m0``-batch gradient and ``mu^2 = |G|^2``; dividing by ``mu^2``, ``r = (rho + 1) / (rho / scale + 1)`` with
    ``rho = B_noise / m0``. It is ``scale * statistical_efficiency``: 1 at scale 1, ``scale`` for pure noise,
    1 for a noiseless gradient. Applied by the engine only with ``lr_scaling="adascale"``
    (``flodl_hf.elche.lr_scaling``).
    """
    s = _finite("scale", scale)
    if s < 1:
        raise ValueError(f"scale={scale!r} is invalid: AdaScale's scale is >= 1 (the batch over m0)")
    return s * statistical_efficiency(noise_scale, m0, s * m0)
