"""Entity-level precision, recall and F1 of IOB2 tag sequences, the way seqeval scores named-entity recognition.

It exists because token accuracy says little about NER (a model that tags everything ``O`` scores high) and the
project takes no new dependency for a 60-line metric. The rules are seqeval's default (non-strict) mode:

* An entity is a maximal run ``B-X I-X I-X ...`` of one type ``X``; it ends before ``O``, before any ``B-``, and
  before an ``I-`` of another type.
* An ``I-X`` that does not continue an entity of type ``X`` (after ``O``, at the start of a sentence, or after
  another type) *starts* a new entity of type ``X``, as seqeval's default does (its strict IOB2 mode would drop it).
* A predicted entity counts as correct only when its type, first and last word all equal a gold entity's.

Micro scores pool every entity of every type; ``per_type`` gives the same three figures (and the gold count,
``support``) per entity type. With no predicted (gold) entity, precision (recall) is 0, as in seqeval. Tested against
``seqeval.metrics`` (default mode) on seeded random tag sequences, malformed ones included.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["entities", "entity_scores", "is_iob_tagset", "token_accuracy"]


def _split(tag: str) -> tuple[str, str]:
    if tag == "O":
        return "O", ""
    prefix, sep, kind = tag.partition("-")
    if not sep or prefix not in ("B", "I") or not kind:
        raise ValueError(f"tag {tag!r} is not IOB2: use O, B-TYPE or I-TYPE (e.g. B-PER, I-PER)")
    return prefix, kind


def is_iob_tagset(tags: Sequence[str]) -> bool:
    """Whether every tag is ``O``, ``B-TYPE`` or ``I-TYPE`` (entity scores apply)."""
    try:
        for tag in tags:
            _split(str(tag))
    except ValueError:
        return False
    return True


def entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The entities of one tag sequence as ``(type, first, last)`` word indices (inclusive)."""
    found: list[tuple[str, int, int]] = []
    kind, start = "", -1
    for i, tag in enumerate(tags):
        prefix, tag_kind = _split(str(tag))
        continues = prefix == "I" and start >= 0 and tag_kind == kind
        if start >= 0 and not continues:
            found.append((kind, start, i - 1))
            start, kind = -1, ""
        if prefix in ("B", "I") and not continues:
            start, kind = i, tag_kind
    if start >= 0:
        found.append((kind, start, len(tags) - 1))
    return found


def _prf(tp: int, n_pred: int, n_gold: int) -> dict:
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def entity_scores(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict:
    """Micro ``precision``, ``recall``, ``f1`` and ``per_type`` scores of predicted against gold tag sequences."""
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold sequences but {len(pred)} predicted: score one prediction per sentence")
    gold_set: set = set()
    pred_set: set = set()
    for n, (g, p) in enumerate(zip(gold, pred)):
        if len(g) != len(p):
            raise ValueError(f"sentence {n + 1} has {len(g)} gold tags but {len(p)} predicted: predict one tag per "
                             "word")
        gold_set.update((n, *e) for e in entities(g))
        pred_set.update((n, *e) for e in entities(p))
    correct = gold_set & pred_set
    out = _prf(len(correct), len(pred_set), len(gold_set))
    per_type = {}
    for kind in sorted({e[1] for e in gold_set | pred_set}):
        tp = sum(1 for e in correct if e[1] == kind)
        n_pred = sum(1 for e in pred_set if e[1] == kind)
        n_gold = sum(1 for e in gold_set if e[1] == kind)
        per_type[kind] = dict(_prf(tp, n_pred, n_gold), support=n_gold)
    out["per_type"] = per_type
    out["gold_entities"], out["predicted_entities"] = len(gold_set), len(pred_set)
    return out


def token_accuracy(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> float:
    """The fraction of words whose predicted tag equals the gold tag."""
    pairs = [(a, b) for g, p in zip(gold, pred) for a, b in zip(g, p)]
    return sum(a == b for a, b in pairs) / len(pairs) if pairs else 0.0
