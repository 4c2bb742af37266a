"""Regression metrics: Pearson and Spearman correlations, without scipy.

It exists so that ``train`` and ``eval`` of a regression model (``--problem-type regression``, e.g. STS) score it
as scipy.stats would: Spearman is the Pearson correlation of average ranks (ties share their rank), and a constant
side gives 0.0 rather than NaN (JSON has no NaN, and a best-checkpoint comparison needs a number). Tested against
``scipy.stats.pearsonr`` / ``spearmanr`` on seeded random cases, ties and constant sides included.
"""

from __future__ import annotations

import math
from typing import Sequence

__all__ = ["pearson", "spearman"]


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson correlation; 0.0 when either side is constant (undefined)."""
    n = len(xs)
    if n != len(ys) or n == 0:
        raise ValueError(f"pearson needs two equally long, non-empty sequences, got {n} and {len(ys)}")
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else 0.0


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1  # ties share their average rank
        i = j + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman rank correlation (Pearson of average ranks, as scipy.stats.spearmanr)."""
    return pearson(_ranks(xs), _ranks(ys))
