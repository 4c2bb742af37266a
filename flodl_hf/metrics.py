"""Classification metrics (accuracy, macro-F1, per-label scores) and the loss-curve plot.

It exists so that the CLI, the model card and user scripts report the same numbers computed the same way, with no
scikit-learn dependency. Conventions follow scikit-learn's defaults: macro-F1 averages over the labels that occur
in either the references or the predictions, and a score whose denominator is zero counts as 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Union

__all__ = ["accuracy", "macro_f1", "per_label_scores", "confusion_matrix", "classification_summary",
           "plot_loss_curve"]


def _check(predictions: Sequence[int], references: Sequence[int]) -> None:
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references: give one prediction "
                         "per reference")
    if len(references) == 0:
        raise ValueError("no references: metrics need at least one labelled example")


def accuracy(predictions: Sequence[int], references: Sequence[int]) -> float:
    """Fraction of predictions equal to their reference."""
    _check(predictions, references)
    return sum(int(p == r) for p, r in zip(predictions, references)) / len(references)


def per_label_scores(predictions: Sequence[int], references: Sequence[int],
                     num_labels: Optional[int] = None) -> list[dict[str, float]]:
    """Precision, recall, F1 and support of every label id ``0..num_labels-1`` (default: the largest id seen)."""
    _check(predictions, references)
    if num_labels is None:
        num_labels = max(max(predictions), max(references)) + 1
    tp = [0] * num_labels
    fp = [0] * num_labels
    fn = [0] * num_labels
    for p, r in zip(predictions, references):
        if p == r:
            tp[r] += 1
        else:
            fp[p] += 1
            fn[r] += 1
    scores = []
    for k in range(num_labels):
        precision = tp[k] / (tp[k] + fp[k]) if tp[k] + fp[k] else 0.0
        recall = tp[k] / (tp[k] + fn[k]) if tp[k] + fn[k] else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        scores.append({"precision": precision, "recall": recall, "f1": f1, "support": tp[k] + fn[k],
                       "predicted": tp[k] + fp[k]})
    return scores


def macro_f1(predictions: Sequence[int], references: Sequence[int], num_labels: Optional[int] = None) -> float:
    """Unweighted mean F1 over the labels present in the references or the predictions."""
    scores = per_label_scores(predictions, references, num_labels)
    present = [s["f1"] for s in scores if s["support"] or s["predicted"]]
    return sum(present) / len(present)


def confusion_matrix(predictions: Sequence[int], references: Sequence[int],
                     num_labels: Optional[int] = None) -> list[list[int]]:
    """``matrix[reference][prediction]`` counts."""
    _check(predictions, references)
    if num_labels is None:
        num_labels = max(max(predictions), max(references)) + 1
    matrix = [[0] * num_labels for _ in range(num_labels)]
    for p, r in zip(predictions, references):
        matrix[r][p] += 1
    return matrix


def classification_summary(predictions: Sequence[int], references: Sequence[int],
                           labels: Sequence[str]) -> dict:
    """Accuracy, macro-F1, per-label scores keyed by name, and the confusion matrix: JSON-ready."""
    num_labels = len(labels)
    for ids, what in ((predictions, "prediction"), (references, "reference")):
        bad = [i for i in ids if not 0 <= i < num_labels]
        if bad:
            raise ValueError(f"{what} id {bad[0]} is outside the {num_labels} labels {list(labels)}")
    scores = per_label_scores(predictions, references, num_labels)
    return {
        "accuracy": accuracy(predictions, references),
        "macro_f1": macro_f1(predictions, references, num_labels),
        "num_examples": len(references),
        "per_label": {name: {k: v for k, v in s.items() if k != "predicted"} for name, s in zip(labels, scores)},
        "confusion_matrix": confusion_matrix(predictions, references, num_labels),
    }


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
