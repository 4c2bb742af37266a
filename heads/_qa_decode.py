"""Answer spans from start/end logits, the way transformers' ``question-answering`` pipeline chose them.

It exists so that ``QuestionAnsweringHead.answer`` gives the answers a transformers user knows (transformers 4.x
``pipeline("question-answering")``; transformers 5 no longer ships that pipeline): per window, logits outside the
context are masked (the CLS position stays, as the pipeline kept it), each of start and end is a softmax over the
window's tokens, the CLS probabilities give the "no answer" score and are then zeroed, a span scores
``p_start * p_end`` with ``start <= end < start + max_answer_len``, the ``2 * top_k + 10`` best spans of each window are
kept, each is widened to whole words (``token_to_word`` / ``word_to_chars``, offsets when the tokenizer has no words),
spans of equal text (case-insensitive) from any window add their scores, and the answers are sorted by score.

One deliberate difference: spans with a zero probability (those touching CLS, the question or padding) are never
returned; the pipeline could list such spans with score 0 when a window had fewer candidate spans than it looked at.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

__all__ = ["window_candidates", "merge_answers", "MASKED_LOGIT"]

MASKED_LOGIT = -10000.0
"""The logit given to tokens that cannot be in an answer (the pipeline's value)."""


def _allowed(encoding: Any, input_ids: list[int], cls_id: Optional[int]) -> torch.Tensor:
    """True for the tokens an answer may use: the context, and the CLS position(s)."""
    allowed = torch.tensor([s == 1 for s in encoding.sequence_ids], dtype=torch.bool)
    if cls_id is not None:
        allowed |= torch.tensor([t == cls_id for t in input_ids], dtype=torch.bool)
    return allowed


def _word_span(encoding: Any, s: int, e: int) -> tuple[int, int]:
    """Character span of tokens ``s..e`` widened to whole words (offsets where the tokenizer has no words)."""
    try:
        start_word, end_word = encoding.token_to_word(s), encoding.token_to_word(e)
        return encoding.word_to_chars(start_word, 1)[0], encoding.word_to_chars(end_word, 1)[1]
    except Exception:  # noqa: BLE001 - the pipeline's fallback: tokenizers without word ids
        return encoding.offsets[s][0], encoding.offsets[e][1]


def window_candidates(
    start_logits: torch.Tensor,
    end_logits: torch.Tensor,
    encoding: Any,
    input_ids: list[int],
    cls_id: Optional[int],
    *,
    keep: int,
    max_answer_len: int,
) -> tuple[list[tuple[int, int, float]], float]:
    """The ``keep`` best ``(start_char, end_char, score)`` spans of one window (best first) and its no-answer score.

    ``start_logits`` / ``end_logits``: the window's real tokens only (no padding), float32 on the CPU.
    """
    allowed = _allowed(encoding, input_ids, cls_id)
    start = torch.softmax(torch.where(allowed, start_logits, torch.tensor(MASKED_LOGIT)), dim=-1)
    end = torch.softmax(torch.where(allowed, end_logits, torch.tensor(MASKED_LOGIT)), dim=-1)
    null = float(start[0] * end[0])
    start[0] = end[0] = 0.0
    length = start.shape[0]
    scores = start[:, None] * end[None, :]
    i = torch.arange(length)
    band = (i[None, :] >= i[:, None]) & (i[None, :] - i[:, None] < max_answer_len)
    scores = torch.where(band & allowed[:, None] & allowed[None, :], scores, torch.zeros(()))
    flat = scores.flatten()
    count = min(keep, int((flat > 0).sum()))
    best = torch.topk(flat, count).indices.tolist() if count else []
    spans = []
    for index in best:
        s, e = divmod(index, length)
        start_char, end_char = _word_span(encoding, s, e)
        spans.append((start_char, end_char, float(flat[index])))
    return spans, null


def merge_answers(
    context: str,
    per_window: list[tuple[list[tuple[int, int, float]], float]],
    *,
    top_k: int,
    handle_impossible_answer: bool,
) -> list[dict[str, Any]]:
    """The ``top_k`` answers of one pair from its windows' candidates (in window order): equal texts
    (case-insensitive) add their scores, keeping the first span; the no-answer entry ``{"answer": "", "start": 0,
    "end": 0}`` scores the lowest window no-answer score and is listed when ``handle_impossible_answer``."""
    answers: list[dict[str, Any]] = []
    by_text: dict[str, dict[str, Any]] = {}
    null = 1_000_000.0
    for spans, window_null in per_window:
        null = min(null, window_null)
        for start, end, score in spans:
            text = context[start:end]
            found = by_text.get(text.lower())
            if found is not None:
                found["score"] += score
                continue
            answer = {"score": score, "start": start, "end": end, "answer": text}
            by_text[text.lower()] = answer
            answers.append(answer)
    if handle_impossible_answer:
        answers.append({"score": null, "start": 0, "end": 0, "answer": ""})
    return sorted(answers, key=lambda a: a["score"], reverse=True)[:top_k]
