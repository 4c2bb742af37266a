"""SQuAD exact match and token F1, by the official v1.1 and v2.0 evaluation rules.

It exists because extractive QA is scored on the answer *text*, not on token positions, and the project takes no new
dependency for it (``evaluate``'s ``squad`` metrics fetch their scripts from the Hub). The rules, as the official
``evaluate-v1.1.py`` and ``evaluate-v2.0.py`` define them (tested against both, written out from their published
definitions, on seeded random cases: ``tests/unit/metrics/test_metrics_vs_libraries.py``):

* Normalisation (both): lower-case, drop ASCII punctuation (``string.punctuation``), drop the articles ``a``,
  ``an``, ``the`` as whole words, collapse whitespace. Exact match is 1 when the normalised texts are equal.
* Token F1 (both): the harmonic mean of precision and recall of the normalised tokens (a multiset overlap), 0 when
  no token is shared. They differ when a side normalises to no token: v1.1 gives 0 (no token is shared, even when
  both are empty); v2.0 gives 1 if both are empty, else 0.
* Gold answers: each prediction takes its best score over its question's gold answers. v2.0 first drops the gold
  answers that normalise to nothing and scores an unanswerable question (none left) against the empty answer, so
  only an empty prediction is right there; v1.1 has no unanswerable question.

Which rule applies: ``version="1.1"`` or ``"2.0"``; by default v2.0 when any question has no gold answer (SQuAD
2.0 data), else v1.1. The job's data are always answerable (``flodl_hf.data.qa`` refuses unanswerable questions),
so ``train`` and ``eval`` score with v1.1. Scores are averaged over questions, as fractions in [0, 1] (the
official scripts print them times 100).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Optional, Sequence

__all__ = ["SQUAD_VERSIONS", "normalize_answer", "exact_match", "token_f1", "squad_version", "squad_scores"]

#: The official rules this module implements.
SQUAD_VERSIONS = ("1.1", "2.0")

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def _check_version(version: str) -> str:
    if version not in SQUAD_VERSIONS:
        raise ValueError(f"SQuAD version {version!r} is unknown: use one of {', '.join(SQUAD_VERSIONS)}")
    return version


def normalize_answer(text: str) -> str:
    """Lower-case, strip punctuation and articles, collapse whitespace (the official scripts' order)."""
    text = "".join(ch for ch in str(text).lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised texts are equal, else 0.0 (v1.1 and v2.0 alike)."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str, version: str = "1.1") -> float:
    """Token F1 of one prediction against one gold answer by ``version``'s rule (see the module docstring)."""
    _check_version(version)
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if version == "2.0" and (not pred_tokens or not gold_tokens):
        return float(pred_tokens == gold_tokens)
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_version(golds: Sequence[Sequence[str]]) -> str:
    """``"2.0"`` when any question has no gold answer (SQuAD 2.0's unanswerable questions), else ``"1.1"``."""
    return "2.0" if any(len(list(answers)) == 0 for answers in golds) else "1.1"


def squad_scores(predictions: Sequence[str], golds: Sequence[Sequence[str]],
                 version: Optional[str] = None) -> dict:
    """Mean ``exact_match`` and ``f1`` of ``predictions``, each against the best of its gold answers, by the
    official rule of ``version`` (default: :func:`squad_version` of ``golds``), which ``squad_version`` names."""
    if len(predictions) != len(golds):
        raise ValueError(f"{len(predictions)} predictions but {len(golds)} questions: give one prediction each")
    golds = [list(answers) for answers in golds]
    version = squad_version(golds) if version is None else _check_version(version)
    if not predictions:
        return {"exact_match": 0.0, "f1": 0.0, "questions": 0, "squad_version": version}
    em = f1 = 0.0
    for n, (prediction, answers) in enumerate(zip(predictions, golds)):
        if version == "2.0":
            answers = [a for a in answers if normalize_answer(a)] or [""]
        elif not answers:
            raise ValueError(f"question {n + 1} has no gold answer, which SQuAD v1.1 cannot score: give at least "
                             "one answer text, or score with version='2.0' (unanswerable questions)")
        em += max(exact_match(prediction, a) for a in answers)
        f1 += max(token_f1(prediction, a, version) for a in answers)
    return {"exact_match": em / len(predictions), "f1": f1 / len(predictions), "questions": len(predictions),
            "squad_version": version}
