"""Stride windows of extractive question answering: (question, context) pairs to model inputs, and answers to labels.

It exists because a QA context is often longer than the model's input: like transformers' QA examples and its
former ``question-answering`` pipeline, each pair is tokenised question first, context second, the context cut into
overlapping windows (``truncation="only_second"``, ``return_overflowing_tokens``, ``stride`` = the overlap in
tokens), so N pairs give W >= N windows. Training labels are token positions per window: the answer's character
span is mapped through the window's offsets to its first and last context token; a window that does not hold the
whole answer (and every window of an unanswerable question) is labelled with its CLS position, as transformers'
examples do. Checks that would otherwise end in a tokenizer panic (no room for the context, a stride too large for
it) are made first, with the row and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

__all__ = ["Windows", "tokenize_windows", "default_stride", "answer_positions", "pad_windows"]


def default_stride(max_length: int) -> int:
    """The overlap of consecutive windows when none is given: ``min(max_length // 2, 128)`` tokens (the value the
    transformers ``question-answering`` pipeline used)."""
    return min(max_length // 2, 128)


@dataclass
class Windows:
    """The windows of a batch of (question, context) pairs, unpadded.

    ``inputs[name][w]``: token list of window ``w`` for each model input; ``sample[w]``: the pair it comes from;
    ``encodings[w]``: its ``tokenizers.Encoding`` (offsets, sequence ids, words); ``cls[w]``: the CLS position.
    """

    inputs: dict[str, list[list[int]]]
    sample: list[int]
    encodings: list[Any]
    cls: list[int]

    def __len__(self) -> int:
        return len(self.sample)

    def context_range(self, w: int) -> tuple[int, int]:
        """First and last token position of window ``w`` that belong to the context (sequence id 1)."""
        ids = self.encodings[w].sequence_ids
        positions = [i for i, s in enumerate(ids) if s == 1]
        return positions[0], positions[-1]


def _token_counts(tokenizer: Any, texts: list[str]) -> list[int]:
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def tokenize_windows(
    tokenizer: Any,
    questions: list[str],
    contexts: list[str],
    *,
    max_length: int,
    stride: int,
    input_names: Sequence[str],
) -> Windows:
    """Every stride window of every pair (question first; only the context is cut). Raises ValueError naming the row
    when a question leaves no room for context, when a stride is not below that room, or when a question or context
    has no tokens."""
    specials = tokenizer.num_special_tokens_to_add(pair=True)
    q_tokens = _token_counts(tokenizer, questions)
    c_tokens = _token_counts(tokenizer, contexts)
    for i, (q, c) in enumerate(zip(q_tokens, c_tokens, strict=True)):
        if q == 0:
            raise ValueError(f"question at row {i} ({questions[i]!r:.60}) has no tokens: give a non-empty question")
        if c == 0:
            raise ValueError(f"context at row {i} ({contexts[i]!r:.60}) has no tokens: give a non-empty context")
        room = max_length - q - specials
        if room < 1:
            raise ValueError(
                f"question at row {i} has {q} tokens: with max_length={max_length} and {specials} special tokens no "
                "context token fits in a window; shorten the question or raise max_length"
            )
        if c > room and stride >= room:
            raise ValueError(
                f"doc_stride={stride} is not below the {room} context tokens a window of row {i} holds (max_length="
                f"{max_length} minus its {q}-token question and {specials} special tokens): use doc_stride < {room}"
            )
    batch = tokenizer(
        questions,
        contexts,
        truncation="only_second",
        max_length=max_length,
        stride=stride,
        padding=False,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        return_token_type_ids="token_type_ids" in input_names,
    )
    inputs = {name: list(batch[name]) for name in input_names if name in batch}
    cls_id = tokenizer.cls_token_id
    cls = [row.index(cls_id) if cls_id is not None and cls_id in row else 0 for row in batch["input_ids"]]
    return Windows(inputs=inputs, sample=list(batch["overflow_to_sample_mapping"]), encodings=batch.encodings,
                   cls=cls)


def answer_positions(windows: Windows, spans: list[Optional[tuple[int, int]]]) -> torch.Tensor:
    """LongTensor ``[W, 2]``: per window, the (start, end) token positions of its pair's answer, given as a character
    span ``(start_char, end_char)`` into the context (None: no answer). A window that does not contain the whole
    answer gets ``(cls, cls)``."""
    out = torch.empty(len(windows), 2, dtype=torch.long)
    for w in range(len(windows)):
        span = spans[windows.sample[w]]
        out[w, 0] = out[w, 1] = windows.cls[w]
        if span is None:
            continue
        start_char, end_char = span
        first, last = windows.context_range(w)
        offsets = windows.encodings[w].offsets
        if not (offsets[first][0] <= start_char and offsets[last][1] >= end_char):
            continue
        start = max(t for t in range(first, last + 1) if offsets[t][0] <= start_char)
        end = min(t for t in range(first, last + 1) if offsets[t][1] >= end_char)
        out[w, 0], out[w, 1] = start, max(start, end)
    return out


def pad_windows(
    windows: Windows, rows: Sequence[int], pad_id: int, device: Any, multiple: Optional[int] = None
) -> dict[str, torch.Tensor]:
    """The model inputs of windows ``rows`` as right-padded tensors on ``device`` (length rounded up to ``multiple``
    when given)."""
    length = max(len(windows.inputs["input_ids"][r]) for r in rows)
    if multiple:
        length = -(-length // multiple) * multiple
    out = {}
    for name, values in windows.inputs.items():
        fill = pad_id if name == "input_ids" else 0
        tensor = torch.full((len(rows), length), fill, dtype=torch.long)
        for j, r in enumerate(rows):
            tensor[j, : len(values[r])] = torch.tensor(values[r], dtype=torch.long)
        out[name] = tensor.to(device)
    if "attention_mask" not in out:
        mask = torch.zeros(len(rows), length, dtype=torch.long)
        for j, r in enumerate(rows):
            mask[j, : len(windows.inputs["input_ids"][r])] = 1
        out["attention_mask"] = mask.to(device)
    return out
