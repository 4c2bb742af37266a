"""Problem types and their metrics: single-label, multi-label and regression, scored from a model's logits.

It exists so that ``train`` (held-out scores, periodic evaluation, early stopping, the best checkpoint),
``eval`` and ``metrics.json`` score each problem type with the same metrics, computed the same way, without
scikit-learn or scipy:

* ``single_label``: accuracy and macro-F1 (``flodl_hf.metrics``), per-label scores and the confusion matrix.
* ``multi_label``: a label applies when its sigmoid is >= 0.5; micro-F1 and macro-F1 over the labels (sklearn's
  conventions: a zero denominator counts 0; macro averages labels present in references or predictions), subset
  accuracy (every label of the row right), per-label scores.
* ``regression``: Pearson and Spearman correlations (Spearman: Pearson of average ranks, ties shared) and MSE.

Every summary also holds ``loss``, the problem's training loss on the data (cross-entropy, BCE or MSE), so that
``--metric-for-best loss`` works for every type. :data:`DEFAULT_METRIC` names the metric early stopping and the
best checkpoint use by default; :func:`greater_is_better` says which way a metric improves.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..data import PROBLEM_TYPES
from ..metrics import classification_summary

__all__ = ["PROBLEM_TYPES", "HF_PROBLEM_TYPES", "DEFAULT_METRIC", "METRICS", "problem_from_config",
           "greater_is_better", "summarize", "headline", "pearson", "spearman", "check_metric"]

#: flodl-hf's problem type -> transformers' ``config.problem_type``.
HF_PROBLEM_TYPES = {"single_label": "single_label_classification", "multi_label": "multi_label_classification",
                    "regression": "regression"}
#: The metric that picks the best checkpoint (and drives early stopping) when ``--metric-for-best`` is not given.
DEFAULT_METRIC = {"single_label": "accuracy", "multi_label": "micro_f1", "regression": "pearson"}
#: The scalar metrics each problem type reports (all usable with ``--metric-for-best``).
METRICS = {"single_label": ("accuracy", "macro_f1", "loss"),
           "multi_label": ("micro_f1", "macro_f1", "accuracy", "loss"),
           "regression": ("pearson", "spearman", "mse", "loss")}
_LOWER_IS_BETTER = ("loss", "mse")


def problem_from_config(config: dict) -> str:
    """flodl-hf's problem type of a model's ``config.json`` (transformers' rule when ``problem_type`` is unset)."""
    value = config.get("problem_type")
    for ours, theirs in HF_PROBLEM_TYPES.items():
        if value == theirs:
            return ours
    if value is None:
        num_labels = len(config.get("id2label") or {}) or int(config.get("num_labels", 2) or 2)
        return "regression" if num_labels == 1 else "single_label"
    raise ValueError(f"the model's config.json has problem_type {value!r}, which flodl-hf cannot score: use one "
                     f"of {', '.join(HF_PROBLEM_TYPES.values())}")


def check_metric(metric: str, problem_type: str) -> str:
    """``metric`` if ``problem_type`` reports it; else ValueError naming the choices."""
    if metric not in METRICS[problem_type]:
        raise ValueError(f"--metric-for-best {metric} is not a metric of a {problem_type} problem: use one of "
                         f"{', '.join(METRICS[problem_type])}")
    return metric


def greater_is_better(metric: str) -> bool:
    return metric not in _LOWER_IS_BETTER


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


def _f1(tp: int, fp: int, fn: int) -> float:
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def multi_label_summary(predicted: Sequence[Sequence[int]], references: Sequence[Sequence[int]],
                        labels: Sequence[str]) -> dict:
    """Micro- and macro-F1, subset accuracy and per-label scores of label-id sets."""
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
    per_label = {}
    present = []
    for i, name in enumerate(labels):
        f1 = _f1(tp[i], fp[i], fn[i])
        per_label[str(name)] = {"precision": tp[i] / (tp[i] + fp[i]) if tp[i] + fp[i] else 0.0,
                                "recall": tp[i] / (tp[i] + fn[i]) if tp[i] + fn[i] else 0.0,
                                "f1": f1, "support": tp[i] + fn[i]}
        if tp[i] + fn[i] or tp[i] + fp[i]:
            present.append(f1)
    return {"micro_f1": _f1(sum(tp), sum(fp), sum(fn)),
            "macro_f1": sum(present) / len(present) if present else 0.0,
            "accuracy": exact / len(references) if references else 0.0,
            "num_examples": len(references), "per_label": per_label}


def summarize(problem_type: str, logits: Any, targets: Sequence[Any], labels: Sequence[str]) -> dict:
    """The metrics of ``problem_type`` for ``logits`` (a float tensor ``[N, C]``) against the dataset targets
    (ids, id tuples or floats, as ``TextDataset.label_ids`` holds them); JSON-ready, with ``loss``."""
    import torch
    import torch.nn.functional as F

    logits = logits.float()
    if problem_type == "single_label":
        target = torch.tensor(list(targets), dtype=torch.long)
        summary = classification_summary(logits.argmax(dim=-1).tolist(), list(targets), labels)
        summary["loss"] = float(F.cross_entropy(logits, target))
        return summary
    if problem_type == "multi_label":
        hot = torch.zeros(len(targets), len(labels))
        for row, ids in enumerate(targets):
            hot[row, list(ids)] = 1.0
        predicted = [[i for i, on in enumerate(row) if on] for row in (torch.sigmoid(logits) >= 0.5).tolist()]
        summary = multi_label_summary(predicted, list(targets), labels)
        summary["loss"] = float(F.binary_cross_entropy_with_logits(logits, hot))
        return summary
    predictions = logits.reshape(len(targets), -1)[:, 0].tolist()
    references = [float(t) for t in targets]
    mse = sum((p - r) ** 2 for p, r in zip(predictions, references)) / len(references)
    return {"pearson": pearson(predictions, references), "spearman": spearman(predictions, references),
            "mse": mse, "loss": mse, "num_examples": len(references)}


def headline(summary: dict, problem_type: str) -> str:
    """``accuracy=0.750 macro_f1=0.700`` (the problem's metrics, loss left out)."""
    return " ".join(f"{name}={summary[name]:.3f}" for name in METRICS[problem_type] if name != "loss")
