"""How El Che turns per-rank speeds into integer setup-mode micro-batch sizes (pure Python).

Why it exists: the split must be exact integers summing to the global batch, each at least one sample and within
its rank's memory cap, and as close as possible to the speed-proportional quotas. Kept apart from the scheduler
(``flodl_hf.elche.scheduler``) because it is plain arithmetic with its own invariants.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["water_fill", "largest_remainder"]


def water_fill(weights: Sequence[float], total: int, caps: Sequence[int]) -> list[float]:
    """Real quotas proportional to ``weights``, summing to ``total``, none above its cap.

    Why iterate: a rank clamped to its cap frees work that goes to the others in
    proportion to *their* weights, which may push another over its cap. Each pass
    fixes at least one rank; ``sum(caps) >= total`` leaves an uncapped rank.
    With no cap binding this is exactly ``total * w / sum(w)``.
    """
    quotas, free, remaining = [0.0] * len(weights), list(range(len(weights))), float(total)
    while True:
        s = sum(weights[r] for r in free)
        for r in free:
            quotas[r] = remaining * weights[r] / s
        over = [r for r in free if quotas[r] > caps[r]]
        if not over:
            return quotas
        for r in over:
            quotas[r] = float(caps[r])
            remaining -= caps[r]
        free = [r for r in free if r not in over]


def largest_remainder(quotas: Sequence[float], total: int, caps: Sequence[int]) -> list[int]:
    """Integers summing exactly to ``total``, each in ``[1, cap]``, close to ``quotas``.

    Floors first, then one extra unit each to the largest fractional parts (ties:
    lower rank). A rank left at 0 takes one unit from the most over-allocated
    rank (largest ``b - quota``, ties: lower rank) that has more than 1; a rank
    then above its cap hands units to the most under-allocated rank with room.
    """
    out = [math.floor(q) for q in quotas]
    order = sorted(range(len(quotas)), key=lambda r: (-(quotas[r] - out[r]), r))
    for r in order[: total - sum(out)]:
        out[r] += 1
    for r in range(len(out)):
        if out[r] < 1:
            donor = max((q for q in range(len(out)) if out[q] > 1), key=lambda q: (out[q] - quotas[q], -q))
            out[donor] -= 1
            out[r] += 1
    for r in range(len(out)):
        while out[r] > caps[r]:
            room = [q for q in range(len(out)) if out[q] < caps[q]]
            taker = max(room, key=lambda q: (quotas[q] - out[q], -q))
            out[r] -= 1
            out[taker] += 1
    return out
