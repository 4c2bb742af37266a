"""Problem types of text classification and their metrics: single-label, multi-label and regression, scored from
a classifier head's logits.

It exists so that ``train`` (held-out scores, periodic evaluation, early stopping, the best checkpoint),
``eval`` and ``metrics.json`` score each problem type with the same metrics, computed the same way, without
scikit-learn or scipy:

* ``single_label``: accuracy and macro-F1 (``flodl_hf.metrics``), per-label scores and the confusion matrix.
* ``multi_label``: a label applies when its sigmoid is >= 0.5; micro-F1 and macro-F1 (scikit-learn's: a zero
  denominator counts 0; macro averages every label column, as ``f1_score`` on indicator rows does), subset
  accuracy (every label of the row right), per-label scores.
* ``regression``: Pearson and Spearman correlations (scipy.stats'; Spearman: Pearson of average ranks, ties
  shared; 0.0 where either side is constant, where scipy gives NaN) and MSE.

Every summary also holds ``loss``, the problem's training loss on the data (cross-entropy, BCE or MSE), so that
``--metric-for-best loss`` works for every type. :data:`DEFAULT_METRIC` names the metric early stopping and the
best checkpoint use by default; :func:`evaluate_head` scores a head on a ``TextDataset`` (batched logits in eval
mode, then the problem type's metrics), sentence pairs included (the head's ``encode(texts, text_pairs)``); a head without pair support is
refused with one line rather than scored on the first texts alone.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Optional, Sequence

from ...data import PROBLEM_TYPES, TextDataset
from ...metrics.classification import classification_summary, multi_label_summary
from ...metrics.regression import pearson, spearman

__all__ = ["PROBLEM_TYPES", "HF_PROBLEM_TYPES", "DEFAULT_METRIC", "METRICS", "problem_from_config",
           "summarize", "headline", "pearson", "spearman", "multi_label_summary", "check_metric",
           "evaluate_head", "predict_logits", "supports_pairs", "require_pairs"]

#: flodl-hf's problem type -> transformers' ``config.problem_type``.
HF_PROBLEM_TYPES = {"single_label": "single_label_classification", "multi_label": "multi_label_classification",
                    "regression": "regression"}
#: The metric that picks the best checkpoint (and drives early stopping) when ``--metric-for-best`` is not given.
DEFAULT_METRIC = {"single_label": "accuracy", "multi_label": "micro_f1", "regression": "pearson"}
#: The scalar metrics each problem type reports (all usable with ``--metric-for-best``).
METRICS = {"single_label": ("accuracy", "macro_f1", "loss"),
           "multi_label": ("micro_f1", "macro_f1", "accuracy", "loss"),
           "regression": ("pearson", "spearman", "mse", "loss")}


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


# --- scoring a head ------------------------------------------------------------------------------------------

def supports_pairs(head: Any) -> bool:
    """Whether ``head.encode`` takes ``text_pairs`` (the heads' sentence-pair API)."""
    try:
        return "text_pairs" in inspect.signature(head.encode).parameters
    except (TypeError, ValueError, AttributeError):
        return False


def require_pairs(head: Any, option: str = "--text-pair-column") -> None:
    """Refuse sentence pairs with a head that would silently drop the second text."""
    if not supports_pairs(head):
        raise ValueError(f"{option}: this installation's task heads cannot encode sentence pairs (head.encode has "
                         "no text_pairs): update flodl-hf's heads, or classify single texts")


def _progress(iterable: Any, *, enabled: bool, **kwargs: Any) -> Any:
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=not enabled, file=sys.stderr, dynamic_ncols=True, **kwargs)


def predict_logits(head: Any, texts: Sequence[str], text_pairs: Optional[Sequence[str]] = None,
                   batch_size: int = 64, progress: bool = False) -> Any:
    """Logits ``[N, C]`` (float32, CPU) of ``head`` on ``texts`` (and ``text_pairs``), in eval mode, no grad."""
    import torch

    if text_pairs is not None:
        require_pairs(head)
    module = head.graph().module if hasattr(head, "graph") else None
    was_training = bool(module is not None and module.training)
    if module is not None:
        module.eval()
    elif hasattr(head, "eval"):
        head.eval()
    chunks = []
    starts = range(0, len(texts), batch_size)
    try:
        with torch.no_grad():
            for start in _progress(starts, enabled=progress, desc="eval", unit="batch", leave=False):
                batch = list(texts[start:start + batch_size])
                if text_pairs is None:
                    enc = head.encode(batch)
                else:
                    enc = head.encode(batch, text_pairs=list(text_pairs[start:start + batch_size]))
                logits = head.forward(enc)
                chunks.append(getattr(logits, "logits", logits).detach().float().cpu())
    finally:
        if was_training and module is not None:
            module.train()
    return torch.cat(chunks) if chunks else torch.zeros(0, 0)



def evaluate_head(head: Any, dataset: TextDataset, batch_size: int = 64, progress: bool = False) -> dict:
    """The metrics of ``dataset.problem_type`` for ``head`` on ``dataset`` (:func:`summarize`).

    For classification the head's label names must be the dataset's, in the same order (load the data with
    ``labels=head.labels()``: names are matched then); otherwise ids would not compare.
    """
    if dataset.problem_type != "regression":
        head_labels = [str(label) for label in head.labels()]
        if head_labels != dataset.labels:
            raise ValueError(f"the model's labels {head_labels} differ from the data's labels {dataset.labels}: "
                             f"pass --labels {','.join(head_labels)} (the model's order), or use matching data")
    logits = predict_logits(head, dataset.texts, dataset.text_pairs, batch_size, progress)
    return summarize(dataset.problem_type, logits, dataset.label_ids, dataset.labels)
