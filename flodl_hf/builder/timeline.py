"""Plot a builder run's timeline: where each worker's time went (batches, averaging, waits) and when the
coordinator averaged.

Why it exists: a throughput figure says that time was lost, not where. With ``.timeline(True)`` the workers
report every batch, snapshot or all-reduce, application of an average and throttle wait
(``DdpHandle.timeline()``); this draws them as one lane per rank, so an idle gap, a long average or a rank held
back by ``max_overshoot`` is visible at a glance. It also sums them per rank (:func:`summarize`).
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any, Sequence, Union

__all__ = ["summarize", "plot_timeline"]

_COLORS = {"batch": "#4c9a2a", "sync": "#1f77b4", "apply": "#17becf", "wait": "#d62728"}


def summarize(events: Sequence[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Per rank: seconds in each kind of event, the span from its first to its last event, and ``idle`` = the
    span not covered by batches, syncs or applications of an average."""
    out: dict[int, dict[str, float]] = {}
    per_rank: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("rank") is not None:
            per_rank[int(e["rank"])].append(e)
    for rank, evs in sorted(per_rank.items()):
        sums: dict[str, float] = defaultdict(float)
        for e in evs:
            sums[e["kind"]] += max(0.0, float(e["end"]) - float(e["start"]))
        span = max(float(e["end"]) for e in evs) - min(float(e["start"]) for e in evs)
        busy = sums["batch"] + sums["sync"] + sums["apply"]
        out[rank] = {**sums, "span": span, "idle": max(0.0, span - busy)}
    return out


def plot_timeline(events: Sequence[dict[str, Any]], path: Union[str, os.PathLike], title: str = "") -> None:
    """Write a PNG: one lane per rank, coloured by event kind, coordinator averages as vertical lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted({int(e["rank"]) for e in events if e.get("rank") is not None})
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.6 * max(1, len(ranks))))
    for e in events:
        if e.get("rank") is None:
            if e["kind"] == "average":
                ax.axvline(float(e["start"]), color="#999999", linewidth=0.5)
            continue
        start, end = float(e["start"]), float(e["end"])
        ax.broken_barh([(start, max(end - start, 1e-4))], (int(e["rank"]) - 0.4, 0.8),
                       facecolors=_COLORS.get(e["kind"], "#777777"))
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_xlabel("seconds since training started")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _COLORS.values()]
    ax.legend(handles, list(_COLORS), loc="upper right", fontsize=8, ncol=4)
    ax.set_title(title or "builder timeline (grey lines: averages)")
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=120)
    plt.close(fig)
