"""Test helpers for the question-answering heads: random QA items over ``TOY_WORDS``, a toy extractive task
(``opinion_task``), and a plain reference of the transformers ``question-answering`` pipeline.

The pipeline itself was removed in transformers 5 (``pipeline("question-answering")`` now raises), so
:func:`pipeline_answers` restates its documented algorithm (transformers 4.57 ``QuestionAnsweringPipeline``) the
simplest way: one unpadded window at a time through the exported model loaded by ``AutoModelForQuestionAnswering``,
its tokenizer loaded by ``AutoTokenizer``, and plain loops over every span. It shares no code with ``heads``.
"""

from __future__ import annotations

import math
import random
from typing import Any, Optional

import torch

from tiny_models import TOY_WORDS

__all__ = ["random_context", "random_item", "opinion_task", "pipeline_answers", "normalise"]

ADJECTIVES = ("good", "great", "excellent", "wonderful", "lovely", "superb", "bad", "awful", "terrible", "horrible",
              "poor", "dreadful")
INTENSIFIERS = ("very", "really", "quite", "so", "rather")
FILLERS = tuple(w for w in TOY_WORDS if w not in ADJECTIVES + INTENSIFIERS)


def random_context(rng: random.Random, n_words: int) -> str:
    """``n_words`` random toy words; some upper-cased, some followed by punctuation (its own token)."""
    words = []
    for _ in range(n_words):
        word = rng.choice(TOY_WORDS)
        if rng.random() < 0.1:
            word = word.upper()
        if rng.random() < 0.1:
            word += rng.choice((",", ".", "!"))
        words.append(word)
    return " ".join(words)


def random_item(rng: random.Random, n_words: int, *, squad: Optional[bool] = None) -> dict[str, Any]:
    """A QA item whose answer is a random run of 1-3 words of a random context (SQuAD or flat form)."""
    context = random_context(rng, n_words)
    spans, position = [], 0
    for word in context.split(" "):
        spans.append((position, position + len(word)))
        position += len(word) + 1
    first = rng.randrange(len(spans))
    last = min(len(spans) - 1, first + rng.randint(0, 2))
    start, end = spans[first][0], spans[last][1]
    text = context[start:end]
    question = " ".join(rng.choice(TOY_WORDS) for _ in range(rng.randint(1, 4)))
    squad = rng.random() < 0.5 if squad is None else squad
    if squad:
        return {"question": question, "context": context, "answers": {"text": [text], "answer_start": [start]}}
    return {"question": question, "context": context, "answer_text": text, "answer_start": start}


def opinion_task(n: int, seed: int) -> list[dict[str, Any]]:
    """Toy extractive task: the context is 5-10 filler words with one opinion inserted at a random place, an adjective
    ("good", "awful", ...) after an intensifier ("very", ...) half the time; the question is "what was it like"; the
    answer is the opinion, intensifier included (one or two words). Picking one context word at random is right
    about 1 time in 10."""
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        words = [rng.choice(FILLERS) for _ in range(rng.randint(5, 10))]
        opinion = ([rng.choice(INTENSIFIERS)] if rng.random() < 0.5 else []) + [rng.choice(ADJECTIVES)]
        k = rng.randint(0, len(words))
        context = " ".join(words[:k] + opinion + words[k:])
        start = len(" ".join(words[:k])) + (1 if k else 0)
        items.append({"question": "what was it like", "context": context, "answer_text": " ".join(opinion),
                      "answer_start": start})
    return items


def _softmax(values: list[float]) -> list[float]:
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    total = sum(exps)
    return [e / total for e in exps]


def _chars(encoding: Any, s: int, e: int) -> tuple[int, int]:
    try:
        return (encoding.word_to_chars(encoding.token_to_word(s), 1)[0],
                encoding.word_to_chars(encoding.token_to_word(e), 1)[1])
    except Exception:  # noqa: BLE001 - no word ids: token offsets, as the pipeline does
        return encoding.offsets[s][0], encoding.offsets[e][1]


def pipeline_answers(model: Any, tokenizer: Any, question: str, context: str, *, top_k: int = 1,
                     max_answer_len: int = 15, doc_stride: Optional[int] = None,
                     handle_impossible_answer: bool = False) -> list[dict[str, Any]]:
    """The answers transformers 4.x ``pipeline("question-answering", model=..., top_k=...)`` returns, as a list.

    Windows of ``min(model_max_length, 384)`` tokens overlapping by ``doc_stride`` (default ``min(len // 2, 128)``);
    per window: logits of non-context tokens (CLS excepted) set to -10000, softmax, the no-answer score CLS*CLS, CLS
    zeroed, spans ``s <= e < s + max_answer_len`` scored ``p_s * p_e``, the ``2 * top_k + 10`` best positive ones
    kept, widened to words; equal texts (case-insensitive) add their scores; sorted by score (stable).
    """
    max_len = min(tokenizer.model_max_length, 384)
    stride = min(max_len // 2, 128) if doc_stride is None else doc_stride
    batch = tokenizer(question, context, truncation="only_second", max_length=max_len, stride=stride,
                      return_overflowing_tokens=True, return_offsets_mapping=True, return_token_type_ids=True)
    answers: list[dict[str, Any]] = []
    null = 1e6
    for w in range(len(batch["input_ids"])):
        ids = batch["input_ids"][w]
        inputs = {name: torch.tensor([batch[name][w]]) for name in tokenizer.model_input_names}
        with torch.no_grad():
            out = model(**inputs)
        seq = batch.sequence_ids(w)
        allowed = [seq[i] == 1 or ids[i] == tokenizer.cls_token_id for i in range(len(ids))]
        p_start = _softmax([float(v) if ok else -10000.0 for v, ok in zip(out.start_logits[0], allowed)])
        p_end = _softmax([float(v) if ok else -10000.0 for v, ok in zip(out.end_logits[0], allowed)])
        null = min(null, p_start[0] * p_end[0])
        p_start[0] = p_end[0] = 0.0
        spans = [
            (p_start[s] * p_end[e], s, e)
            for s in range(len(ids)) for e in range(s, min(len(ids), s + max_answer_len))
            if allowed[s] and allowed[e] and p_start[s] * p_end[e] > 0
        ]
        spans.sort(key=lambda t: -t[0])
        for score, s, e in spans[: 2 * top_k + 10]:
            start, end = _chars(batch.encodings[w], s, e)
            text = context[start:end]
            same = [a for a in answers if a["answer"].lower() == text.lower()]
            if same:
                same[0]["score"] += score
            else:
                answers.append({"score": score, "start": start, "end": end, "answer": text})
    if handle_impossible_answer:
        answers.append({"score": null, "start": 0, "end": 0, "answer": ""})
    return sorted(answers, key=lambda a: a["score"], reverse=True)[:top_k]


def normalise(result: Any) -> list[dict[str, Any]]:
    """A head's ``answer`` result (a dict, or a list of dicts) as a list."""
    return [result] if isinstance(result, dict) else list(result)
