"""A tagger's predictions: tagged words and entity spans, exactly as ``pipeline("token-classification")`` gives.

It exists so that ``head.tag(texts)`` agrees with the pipeline on the exported model, key for key and score for
score, without building a pipeline (which runs one text at a time): the steps below follow transformers'
``TokenClassificationPipeline.gather_pre_entities`` / ``aggregate`` / ``group_entities`` (transformers 5.x) on the
softmax of one row's logits. Strategies: ``"none"`` (one dict per token, with ``entity`` and ``index``),
``"simple"`` (adjacent tokens of one entity grouped, ``entity_group``), and the word-level ``"first"``,
``"average"`` and ``"max"`` (a word's subwords agree first). Entries whose label is in ``ignore_labels`` are
dropped, as in the pipeline. :func:`predict_words` gives one tag per input word instead, for seqeval-style scoring.
Both run in eval mode without gradients and restore every module's mode afterwards.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Optional, Sequence, TypeVar

import numpy as np
import torch

from . import _inputs
from . import _token_classification_inputs as _words

__all__ = ["STRATEGIES", "check_strategy", "entities_of_row", "tag_texts", "predict_words"]

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


T = TypeVar("T")


def _check_batch_size(batch_size: Any) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is invalid: use an integer >= 1")


def _in_eval_mode(head: Any, run: Callable[[], T]) -> T:
    """``run()`` with the head's model in eval mode and no gradients; every module's mode restored afterwards."""
    module = head.graph().module
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            return run()
    finally:
        for m, training in modes:
            m.training = training


def predict_words(head: Any, words_batch: Sequence[Any], batch_size: int,
                  truncated: Optional[str]) -> list[list[str]]:
    """``head.predict_words``: per sentence, the tag predicted at each word's first subword; words cut off by
    ``max_length`` get ``truncated`` (None: ValueError)."""
    words_batch = _words.check_words_batch(words_batch, "predict_words")
    _check_batch_size(batch_size)
    names = head.labels()

    def run() -> list[list[str]]:
        out = []
        for start in range(0, len(words_batch), batch_size):
            chunk = words_batch[start : start + batch_size]
            enc = head.encode(chunk)
            best = head.forward(enc).argmax(-1).cpu().tolist()
            for i, words in enumerate(chunk):
                if enc.truncated_words[i] and truncated is None:
                    raise ValueError(
                        f"sentence {start + i} has {enc.truncated_words[i]} word(s) beyond max_length="
                        f"{head.max_length}: raise max_length, or pass truncated='O' to tag them 'O'"
                    )
                tags: list[Optional[str]] = [None] * len(words)
                for t, w in enumerate(enc.word_ids[i]):
                    if w is not None and tags[w] is None:
                        tags[w] = names[best[i][t]]
                out.append([tag if tag is not None else str(truncated) for tag in tags])
        return out

    return _in_eval_mode(head, run)


def tag_texts(head: Any, texts: Sequence[str], strategy: Any, ignore_labels: Optional[Sequence[str]],
              batch_size: int) -> list[list[dict]]:
    """``head.tag``: the pipeline's entities per text, computed in padded batches (see :func:`entities_of_row`)."""
    texts = _inputs.check_texts(texts, "tag")
    strategy = check_strategy(strategy)
    _check_batch_size(batch_size)
    tokenizer = head._require_tokenizer()
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"tag needs a fast tokenizer (character offsets), got {type(tokenizer).__name__}: load "
                         "it with AutoTokenizer.from_pretrained(path, use_fast=True)")
    if ignore_labels is not None and (isinstance(ignore_labels, str) or
                                      not all(isinstance(x, str) for x in ignore_labels)):
        raise ValueError(f"ignore_labels={ignore_labels!r} is invalid: give a list of label names, e.g. ['O']")
    names, device, wanted = head.labels(), head.graph().device, head.input_names

    def run() -> list[list[dict]]:
        out = []
        for start in range(0, len(texts), batch_size):
            chunk = texts[start : start + batch_size]
            batch = tokenizer(chunk, padding="longest", truncation=True, max_length=head.max_length,
                              return_tensors="pt", return_special_tokens_mask=True, return_offsets_mapping=True,
                              return_token_type_ids="token_type_ids" in wanted)
            enc = {name: batch[name].to(device) for name in wanted if name in batch}
            scores = torch.softmax(head.forward(enc).float(), dim=-1).cpu().numpy().astype(np.float32)
            special = (batch["special_tokens_mask"].bool() | ~batch["attention_mask"].bool()).tolist()
            for i, text in enumerate(chunk):
                out.append(entities_of_row(tokenizer, text, batch["input_ids"][i].tolist(), scores[i],
                                           batch["offset_mapping"][i].tolist(), special[i], names, strategy,
                                           ignore_labels))
        return out

    return _in_eval_mode(head, run)
