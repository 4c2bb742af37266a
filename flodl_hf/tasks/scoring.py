"""Scoring a task head on held-out rows: the task's metrics, computed from the head's task-level predictions.

It exists so that ``train`` (the held-out evaluation before and after training, and every ``--eval-every``) and
``eval`` score a model with one function per task, from what a user of the model would see:

* token classification: ``head.predict_words`` (one tag per word) -> seqeval-style entity precision / recall / F1
  (:mod:`flodl_hf.tasks.entity_metrics`; only when the tags are IOB2) and word accuracy;
* question answering: ``head.answer`` (the best span, as transformers' pipeline returns it) -> SQuAD exact match and
  token F1 (:mod:`flodl_hf.tasks.squad_metrics`), the best over each question's gold answers;
* fill-mask: ``head.perplexity`` (exp of the mean masked-token loss, masks drawn with a fixed seed).

The model is scored in eval mode without gradients and put back in training mode when it was training.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

from .entity_metrics import entity_scores, is_iob_tagset, token_accuracy
from .names import FILL_MASK, QUESTION_ANSWERING, TOKEN_CLASSIFICATION
from .rows import Rows
from .squad_metrics import squad_scores

__all__ = ["score", "headline", "first_word_baseline", "all_o_baseline"]


@contextlib.contextmanager
def _evaluating(head: Any) -> Iterator[None]:
    import torch

    graph = head.graph() if hasattr(head, "graph") else None
    module = graph.module if graph is not None else head.model
    was_training = bool(module.training)
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        if was_training:
            module.train()


def _chunks(n: int, size: int, progress: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(range(0, n, size), disable=not progress, file=sys.stderr, dynamic_ncols=True, desc="eval",
                unit="batch", leave=False)


def _score_tokens(head: Any, rows: Rows, batch_size: int, progress: bool) -> dict:
    gold = [list(tags) for _, tags in rows.items]
    pred: list = []
    for start in _chunks(len(rows), batch_size, progress):
        pred.extend(head.predict_words([list(words) for words, _ in rows.items[start:start + batch_size]]))
    out: dict = {"accuracy": token_accuracy(gold, pred), "sentences": len(rows)}
    labels = [str(label) for label in head.labels()]
    if is_iob_tagset(labels) and all(is_iob_tagset(g) for g in gold):
        out.update(entity_scores(gold, pred))
    else:
        out.update(precision=None, recall=None, f1=None, per_type=None)
    return out


def _score_qa(head: Any, rows: Rows, batch_size: int, progress: bool) -> dict:
    predictions: list[str] = []
    for start in _chunks(len(rows), batch_size, progress):
        batch = rows.items[start:start + batch_size]
        answers = head.answer([item["question"] for item in batch], [item["context"] for item in batch])
        answers = answers if isinstance(answers, list) else [answers]
        predictions.extend(str(a[0]["answer"] if isinstance(a, list) else a["answer"]) for a in answers)
    return squad_scores(predictions, [item["answers"]["text"] for item in rows.items])


def score(head: Any, task: str, rows: Rows, batch_size: int = 64, progress: bool = False, seed: int = 0) -> dict:
    """The held-out metrics of ``task`` for ``head`` on ``rows`` (see the module docstring)."""
    with _evaluating(head):
        if task == TOKEN_CLASSIFICATION:
            return _score_tokens(head, rows, batch_size, progress)
        if task == QUESTION_ANSWERING:
            return _score_qa(head, rows, batch_size, progress)
        if task == FILL_MASK:
            return {"perplexity": float(head.perplexity(list(rows.items), batch_size=batch_size, seed=seed)),
                    "texts": len(rows)}
    raise ValueError(f"no scores for task {task!r}")


def headline(summary: dict, task: str) -> str:
    """One line of the task's scores: ``entity_f1=0.812 precision=... accuracy=...``."""
    if task == TOKEN_CLASSIFICATION:
        if summary.get("f1") is None:
            return f"word_accuracy={summary['accuracy']:.4f}"
        return (f"entity_f1={summary['f1']:.4f} precision={summary['precision']:.4f} recall={summary['recall']:.4f} "
                f"word_accuracy={summary['accuracy']:.4f}")
    if task == QUESTION_ANSWERING:
        return f"exact_match={summary['exact_match']:.4f} f1={summary['f1']:.4f}"
    return f"perplexity={summary['perplexity']:.3f}"


def all_o_baseline(rows: Rows) -> dict:
    """Scores of tagging every word ``O``: entity F1 0, word accuracy the share of ``O`` words."""
    gold = [list(tags) for _, tags in rows.items]
    return {"f1": 0.0, "accuracy": token_accuracy(gold, [["O"] * len(g) for g in gold])}


def first_word_baseline(rows: Rows) -> dict:
    """Scores of answering every question with the first word of its context."""
    firsts = [(item["context"].split() or [""])[0] for item in rows.items]
    return squad_scores(firsts, [item["answers"]["text"] for item in rows.items])
