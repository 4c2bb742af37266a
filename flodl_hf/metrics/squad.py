"""SQuAD exact match and token F1, with the official evaluation script's answer normalisation.

It exists because extractive QA is scored on the answer *text*, not on token positions, and the project takes no new
dependency for it. Normalisation (SQuAD v1.1 / v2.0 ``normalize_answer``): lower-case, drop ASCII punctuation
(``string.punctuation``), drop the articles ``a``, ``an``, ``the`` as whole words, collapse whitespace.
Exact match is 1 when the normalised texts are equal; token F1 is the harmonic mean of precision and recall of the
normalised tokens (a multiset overlap). When either side normalises to no token, F1 is 1 if both do, else 0 (the
v2.0 script's rule; v1.1 would divide by zero). Each prediction takes the best score over its gold answers, and the
scores are averaged over questions, as fractions in [0, 1] (the official script prints them times 100).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Sequence

__all__ = ["normalize_answer", "exact_match", "token_f1", "squad_scores"]

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, strip punctuation and articles, collapse whitespace (the official script's order)."""
    text = "".join(ch for ch in str(text).lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Sequence[str], golds: Sequence[Sequence[str]]) -> dict:
    """Mean ``exact_match`` and ``f1`` of ``predictions``, each against the best of its gold answers."""
    if len(predictions) != len(golds):
        raise ValueError(f"{len(predictions)} predictions but {len(golds)} questions: give one prediction each")
    if not predictions:
        return {"exact_match": 0.0, "f1": 0.0, "questions": 0}
    em = f1 = 0.0
    for n, (prediction, answers) in enumerate(zip(predictions, golds)):
        answers = list(answers)
        if not answers:
            raise ValueError(f"question {n + 1} has no gold answer: give at least one answer text")
        em += max(exact_match(prediction, a) for a in answers)
        f1 += max(token_f1(prediction, a) for a in answers)
    return {"exact_match": em / len(predictions), "f1": f1 / len(predictions), "questions": len(predictions)}
