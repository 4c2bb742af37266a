"""Checks and parsing of what users hand a question-answering head: questions, contexts, answers, labels.

It exists so that every malformed QA input fails before any tokenisation or forward pass with a ValueError naming
the row, the value and the fix -- above all an answer whose character offset does not point at its text in the
context (the bad-input catalogue's "an answer span not in its context"), which would otherwise train on a wrong span.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, Sequence

import torch

__all__ = ["check_pairs", "parse_items", "check_positions", "QA_FIELDS"]

QA_FIELDS = "SQuAD-style dicts {'question', 'context', 'answers': {'text': [...], 'answer_start': [...]}} or flat " \
            "dicts {'question', 'context', 'answer_text', 'answer_start'}"


def _check_text(value: Any, what: str, row: int) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} at row {row} is {type(value).__name__} ({value!r:.60}), not str")
    if not value.strip():
        raise ValueError(f"{what} at row {row} is empty ({value!r}): give a non-empty {what}")
    return value


def check_pairs(questions: Any, contexts: Any, what: str) -> tuple[list[str], list[str]]:
    """``questions`` and ``contexts`` as equally long lists of non-empty strings (one string each: a one-pair list)."""
    if isinstance(questions, str) != isinstance(contexts, str):
        raise ValueError(
            f"{what} got a {'str' if isinstance(questions, str) else 'list'} question and a "
            f"{'str' if isinstance(contexts, str) else 'list'} context: give one string each, or two lists of equal "
            "length"
        )
    if isinstance(questions, str):
        questions, contexts = [questions], [contexts]
    try:
        questions, contexts = list(questions), list(contexts)
    except TypeError as exc:
        raise ValueError(f"{what} takes strings or lists of strings: {exc}") from exc
    if len(questions) != len(contexts):
        raise ValueError(
            f"{what} got {len(questions)} questions but {len(contexts)} contexts: give one context per question"
        )
    if not questions:
        raise ValueError(f"{what} got no questions: give at least one (question, context) pair")
    for i, (q, c) in enumerate(zip(questions, contexts, strict=True)):
        _check_text(q, "question", i)
        _check_text(c, "context", i)
    return questions, contexts


def _answer_of(item: Mapping, row: int) -> Optional[tuple[str, Any]]:
    """``(text, answer_start)`` of an item, or None for an unanswerable one (SQuAD form with empty lists)."""
    if "answers" in item:
        answers = item["answers"]
        if not isinstance(answers, Mapping) or "text" not in answers or "answer_start" not in answers:
            raise ValueError(
                f"item at row {row}: 'answers' is {answers!r:.80}; give {{'text': [...], 'answer_start': [...]}}"
            )
        texts, starts = list(answers["text"]), list(answers["answer_start"])
        if len(texts) != len(starts):
            raise ValueError(
                f"item at row {row}: answers has {len(texts)} texts but {len(starts)} answer_start values: give one "
                "start per text"
            )
        if not texts:
            return None  # SQuAD v2: no answer in the context
        return texts[0], starts[0]  # training uses the first answer, as transformers' QA examples do
    if "answer_text" in item and "answer_start" in item:
        return item["answer_text"], item["answer_start"]
    raise ValueError(f"item at row {row} has keys {sorted(item)} but no answer: give {QA_FIELDS}")


def _check_span(context: str, text: Any, start: Any, row: int) -> tuple[int, int]:
    if not isinstance(text, str) or not text.strip():
        raise ValueError(
            f"answer at row {row} is {text!r:.60}: give the answer's non-empty text (an unanswerable question has "
            "'answers': {'text': [], 'answer_start': []})"
        )
    if not isinstance(start, int) or isinstance(start, bool):
        raise ValueError(f"answer_start at row {row} is {start!r:.60}: give the answer's character offset (an int)")
    found = context[start : start + len(text)] if 0 <= start <= len(context) else None
    if found != text:
        where = context.find(text)
        hint = f"the text occurs at offset {where}" if where >= 0 else "the text does not occur in the context"
        raise ValueError(
            f"answer at row {row} is not in its context: context[{start}:{start + len(text)}] is {found!r:.60}, not "
            f"the answer {text!r:.60} ({hint}); answer_start must be the character offset of the answer text"
        )
    return start, start + len(text)


def parse_items(items: Sequence[Any]) -> tuple[list[str], list[str], list[Optional[tuple[int, int]]]]:
    """Questions, contexts and character answer spans (None: no answer) of collate items (see ``QA_FIELDS``)."""
    questions, contexts, spans = [], [], []
    items = list(items)
    if not items:
        raise ValueError("collate got no items: give at least one")
    for row, item in enumerate(items):
        if not isinstance(item, Mapping) or "question" not in item or "context" not in item:
            raise ValueError(f"item at row {row} is {type(item).__name__} ({item!r:.80}): give {QA_FIELDS}")
        question = _check_text(item["question"], "question", row)
        context = _check_text(item["context"], "context", row)
        answer = _answer_of(item, row)
        spans.append(None if answer is None else _check_span(context, answer[0], answer[1], row))
        questions.append(question)
        contexts.append(context)
    return questions, contexts, spans


def check_positions(labels: Any, windows: int, length: int) -> torch.Tensor:
    """``labels`` as a LongTensor ``[W, 2]`` of (start, end) token positions inside each window.

    A position outside ``[0, length)`` is refused: transformers clamps it to ``length`` and ignores it, which lets the
    start and end losses average over different numbers of windows and breaks exact weighting across ranks.
    """
    if isinstance(labels, torch.Tensor):
        tensor = labels.detach().to("cpu")
    else:
        try:
            tensor = torch.as_tensor(labels)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"labels must be (start, end) token positions per window, [W, 2]: {exc}") from exc
    if tensor.dtype.is_floating_point or tensor.dtype == torch.bool or tensor.is_complex():
        raise ValueError(f"labels have dtype {tensor.dtype}: give integer token positions (a LongTensor [W, 2])")
    if tensor.dim() != 2 or tensor.shape[1] != 2 or tensor.shape[0] != windows:
        raise ValueError(
            f"labels have shape {list(tensor.shape)}: give [W, 2] (start, end) token positions, one row per window "
            f"of the batch ({windows} windows)"
        )
    tensor = tensor.long()
    bad = ((tensor < 0) | (tensor >= length)).any(dim=1).nonzero().flatten().tolist()
    if bad:
        row = bad[0]
        start, end = tensor[row].tolist()
        raise ValueError(
            f"window {row} has (start, end) = ({start}, {end}) but its window holds {length} tokens (positions 0.."
            f"{length - 1}): transformers would clamp and ignore such a position, so the start and end losses would "
            "average over different window counts; label a window without the answer with its CLS position (0), "
            "or re-encode with collate()"
        )
    crossed = (tensor[:, 0] > tensor[:, 1]).nonzero().flatten().tolist()
    if crossed:
        row = crossed[0]
        raise ValueError(
            f"window {row} has start {int(tensor[row, 0])} after end {int(tensor[row, 1])}: an answer's start token "
            "cannot follow its end token"
        )
    return tensor
