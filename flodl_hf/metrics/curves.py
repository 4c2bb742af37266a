"""The loss-curve plot of a training run (``loss_curve.png`` in every output directory).

It exists so that every task's job, and a user script, draw the same figure: the per-step loss and its moving
average, on a private Agg canvas (pyplot's global state and the user's backend are left untouched).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence, Union

__all__ = ["plot_loss_curve"]


def _smooth(values: Sequence[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_loss_curve(losses: Sequence[float], path: Union[str, Path], *, title: str = "Training loss",
                    xlabel: str = "step") -> Path:
    """Write a PNG of the per-step loss (and a moving average when there are many steps) to ``path``.

    Draws on a private Agg canvas: pyplot's global state and the user's backend are left untouched.
    """
    if len(losses) == 0:
        raise ValueError("no loss values to plot: train for at least one step")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    figure = Figure(figsize=(6.4, 3.6), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    steps = list(range(1, len(losses) + 1))
    axes.plot(steps, list(losses), color="#9bb7d4", linewidth=1.0, label="loss")
    window = max(1, len(losses) // 20)
    if window > 1:
        axes.plot(steps, _smooth(list(losses), window), color="#1f4e79", linewidth=2.0,
                  label=f"moving average ({window} steps)")
    axes.set_xlabel(xlabel)
    axes.set_ylabel("loss")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend(loc="upper right")
    figure.tight_layout()
    figure.savefig(path, format="png")
    return path
