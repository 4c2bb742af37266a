"""Classification metrics: accuracy, macro-F1, per-label scores and the confusion matrix of label ids
(single-label), and micro- / macro-F1 and subset accuracy of label-id sets (multi-label).

It exists so that the CLI, the model card and user scripts report the same numbers computed the same way, with no
scikit-learn dependency. Every figure is scikit-learn's, with ``zero_division=0`` (a precision, recall or F1 whose
denominator is zero counts as 0, which is what scikit-learn's default ``"warn"`` returns), and is tested against
scikit-learn on seeded random cases (``tests/unit/metrics/test_metrics_vs_libraries.py``):

* single-label: ``accuracy_score``; ``f1_score(average="macro")`` without ``labels=``, i.e. averaged over the labels
  that occur in the references or the predictions; ``precision_recall_fscore_support(average=None)``;
  ``confusion_matrix`` (rows: references, columns: predictions). Above ``DENSE_LABELS`` labels the summary holds
  the matrix's non-zero cells instead (``confusion_cells``): a dense 10,000-label matrix is 10^8 counts, gigabytes
  as Python lists and as JSON, while its non-zero cells are at most one per example.
* multi-label (label-id sets as indicator rows): ``f1_score(average="micro")``; ``f1_score(average="macro")`` over
  **every** label column, a label that is neither gold nor predicted anywhere counting F1 0; subset accuracy
  (``accuracy_score``: a row counts when every label is right).
"""

from __future__ import annotations

from typing import Optional, Sequence

__all__ = ["accuracy", "macro_f1", "per_label_scores", "confusion_matrix", "confusion_cells",
           "classification_summary", "multi_label_summary", "DENSE_LABELS"]

#: Up to this many labels a summary holds the dense confusion matrix (at most 1,000,000 counts); above it, the
#: matrix's non-zero cells.
DENSE_LABELS = 1000


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
    """Unweighted mean F1 over the labels present in the references or the predictions (scikit-learn's
    ``f1_score(average="macro")`` without ``labels=``; ``num_labels`` sizes the table, it adds no absent label)."""
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


def confusion_cells(predictions: Sequence[int], references: Sequence[int]) -> list[list[int]]:
    """The confusion matrix's non-zero cells, ``[reference, prediction, count]``, in row-major order: the sparse
    form of ``confusion_matrix``, whose size follows the examples, not the labels squared."""
    _check(predictions, references)
    counts: dict[tuple[int, int], int] = {}
    for p, r in zip(predictions, references):
        counts[(r, p)] = counts.get((r, p), 0) + 1
    return [[r, p, n] for (r, p), n in sorted(counts.items())]


def classification_summary(predictions: Sequence[int], references: Sequence[int],
                           labels: Sequence[str]) -> dict:
    """Accuracy, macro-F1, per-label scores keyed by name, and the confusion matrix (its non-zero cells above
    ``DENSE_LABELS`` labels, ``confusion_matrix`` then None): JSON-ready."""
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
        **({"confusion_matrix": confusion_matrix(predictions, references, num_labels)}
           if num_labels <= DENSE_LABELS
           else {"confusion_matrix": None, "confusion_cells": confusion_cells(predictions, references)}),
    }


def _f1(tp: int, fp: int, fn: int) -> float:
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def multi_label_summary(predicted: Sequence[Sequence[int]], references: Sequence[Sequence[int]],
                        labels: Sequence[str]) -> dict:
    """Micro- and macro-F1, subset accuracy and per-label scores of label-id sets (macro: over every label)."""
    k = len(labels)
    tp, fp, fn = [0] * k, [0] * k, [0] * k
    exact = 0
    for pred, ref in zip(predicted, references):
        pred, ref = set(pred), set(ref)
        exact += int(pred == ref)
        for i in pred & ref:
            tp[i] += 1
        for i in pred - ref:
            fp[i] += 1
        for i in ref - pred:
            fn[i] += 1
    f1s = [_f1(tp[i], fp[i], fn[i]) for i in range(k)]
    per_label = {str(name): {"precision": tp[i] / (tp[i] + fp[i]) if tp[i] + fp[i] else 0.0,
                             "recall": tp[i] / (tp[i] + fn[i]) if tp[i] + fn[i] else 0.0,
                             "f1": f1s[i], "support": tp[i] + fn[i]} for i, name in enumerate(labels)}
    return {"micro_f1": _f1(sum(tp), sum(fp), sum(fn)),
            "macro_f1": sum(f1s) / len(f1s) if f1s else 0.0,
            "accuracy": exact / len(references) if references else 0.0,
            "num_examples": len(references), "per_label": per_label}
