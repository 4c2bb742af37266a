"""Token scores to tagged words and entity spans, exactly as ``transformers.pipeline("token-classification")`` does.

It exists so that ``head.tag(texts)`` agrees with the pipeline on the exported model, key for key and score for
score, without building a pipeline (which runs one text at a time): the steps below follow transformers'
``TokenClassificationPipeline.gather_pre_entities`` / ``aggregate`` / ``group_entities`` (transformers 5.x) on the
softmax of one row's logits. Strategies: ``"none"`` (one dict per token, with ``entity`` and ``index``),
``"simple"`` (adjacent tokens of one entity grouped, ``entity_group``), and the word-level ``"first"``,
``"average"`` and ``"max"`` (a word's subwords agree first). Entries whose label is in ``ignore_labels`` are
dropped, as in the pipeline.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional, Sequence

import numpy as np

__all__ = ["STRATEGIES", "check_strategy", "entities_of_row"]

STRATEGIES = ("none", "simple", "first", "average", "max")
_WORD_LEVEL = ("first", "average", "max")


def check_strategy(strategy: Any) -> str:
    """``strategy`` lower-cased if it is one of :data:`STRATEGIES`, else ValueError."""
    if not isinstance(strategy, str) or strategy.lower() not in STRATEGIES:
        raise ValueError(
            f"aggregation_strategy={strategy!r} is unknown: use one of {', '.join(map(repr, STRATEGIES))}"
        )
    return strategy.lower()


def _pre_entities(tokenizer: Any, sentence: str, input_ids: Sequence[int], scores: np.ndarray,
                  offsets: Sequence[tuple[int, int]], special: Sequence[int], strategy: str) -> list[dict]:
    """One dict per non-special token: its token string, scores, character span and whether it continues a word."""
    word_aware = bool(getattr(getattr(tokenizer, "_tokenizer", None), "model", None) is not None
                      and getattr(tokenizer._tokenizer.model, "continuing_subword_prefix", None))
    if not word_aware and strategy in _WORD_LEVEL:
        warnings.warn("Tokenizer does not support real words, using fallback heuristic", UserWarning, stacklevel=3)
    out = []
    for idx, token_scores in enumerate(scores):
        if special[idx]:
            continue
        token_id = int(input_ids[idx])
        word = tokenizer.convert_ids_to_tokens(token_id)
        start, end = int(offsets[idx][0]), int(offsets[idx][1])
        word_ref = sentence[start:end]
        if word_aware:
            is_subword = len(word) != len(word_ref)
        else:
            is_subword = start > 0 and " " not in sentence[start - 1 : start + 1]
        if token_id == tokenizer.unk_token_id:
            word, is_subword = word_ref, False
        out.append({"word": word, "scores": token_scores, "start": start, "end": end, "index": idx,
                    "is_subword": is_subword})
    return out


def _aggregate_word(tokenizer: Any, entities: list[dict], strategy: str, names: list[str]) -> dict:
    word = tokenizer.convert_tokens_to_string([e["word"] for e in entities])
    if strategy == "first":
        scores = entities[0]["scores"]
    elif strategy == "max":
        scores = max(entities, key=lambda e: e["scores"].max())["scores"]
    else:  # average
        scores = np.nanmean(np.stack([e["scores"] for e in entities]), axis=0)
    idx = int(scores.argmax())
    return {"entity": names[idx], "score": scores[idx], "word": word, "start": entities[0]["start"],
            "end": entities[-1]["end"]}


def _aggregate_words(tokenizer: Any, entities: list[dict], strategy: str, names: list[str]) -> list[dict]:
    words, group = [], None
    for entity in entities:
        if group is None:
            group = [entity]
        elif entity["is_subword"]:
            group.append(entity)
        else:
            words.append(_aggregate_word(tokenizer, group, strategy, names))
            group = [entity]
    if group is not None:
        words.append(_aggregate_word(tokenizer, group, strategy, names))
    return words


def _bio(name: str) -> tuple[str, str]:
    if name.startswith("B-"):
        return "B", name[2:]
    if name.startswith("I-"):
        return "I", name[2:]
    return "I", name  # not in B-/I- form: a continuation


def _group(tokenizer: Any, entities: list[dict]) -> dict:
    score = np.nanmean([e["score"] for e in entities])
    return {"entity_group": entities[0]["entity"].split("-", 1)[-1], "score": np.mean(score),
            "word": tokenizer.convert_tokens_to_string([e["word"] for e in entities]),
            "start": entities[0]["start"], "end": entities[-1]["end"]}


def _group_entities(tokenizer: Any, entities: list[dict]) -> list[dict]:
    groups, pending = [], []
    for entity in entities:
        if not pending:
            pending.append(entity)
            continue
        bi, tag = _bio(entity["entity"])
        _, last_tag = _bio(pending[-1]["entity"])
        if tag == last_tag and bi != "B":
            pending.append(entity)
        else:
            groups.append(_group(tokenizer, pending))
            pending = [entity]
    if pending:
        groups.append(_group(tokenizer, pending))
    return groups


def _plain(entity: dict) -> dict:
    """numpy scalars -> Python floats and ints (the pipeline returns numpy float32 scores; values are equal)."""
    return {key: (float(value) if key == "score" else value) for key, value in entity.items()}


def entities_of_row(tokenizer: Any, sentence: str, input_ids: Sequence[int], scores: np.ndarray,
                    offsets: Sequence[tuple[int, int]], special: Sequence[int], names: list[str], strategy: str,
                    ignore_labels: Optional[Sequence[str]]) -> list[dict]:
    """The pipeline's output for one text: ``scores`` is the float32 softmax ``[T, num_labels]`` of its tokens
    (padding marked special), ``offsets`` the fast tokenizer's character offsets."""
    pre = _pre_entities(tokenizer, sentence, input_ids, scores, offsets, special, strategy)
    if strategy in ("none", "simple"):
        entities = []
        for p in pre:
            idx = int(p["scores"].argmax())
            entities.append({"entity": names[idx], "score": p["scores"][idx], "index": p["index"],
                             "word": p["word"], "start": p["start"], "end": p["end"]})
    else:
        entities = _aggregate_words(tokenizer, pre, strategy, names)
    if strategy != "none":
        entities = _group_entities(tokenizer, entities)
    ignore = set(["O"] if ignore_labels is None else ignore_labels)
    return [_plain(e) for e in entities
            if e.get("entity") not in ignore and e.get("entity_group") not in ignore]
