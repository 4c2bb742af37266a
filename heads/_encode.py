"""Tokenising texts and sentence pairs into a model's inputs, and ranking its outputs into predictions.

It exists so that the head and ``transformers.pipeline("text-classification")`` agree token for token: texts are
truncated to the head's ``max_length`` (which ``save_pretrained`` stores as the tokenizer's ``model_max_length``),
pairs with ``longest_first`` (what ``truncation=True`` means in transformers), and ``token_type_ids`` are returned
exactly where the family's model takes them.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from . import _losses

__all__ = ["tokenize", "pad", "rank", "PAIR_TRUNCATION"]

PAIR_TRUNCATION = "longest_first"
"""How a pair is cut to ``max_length``: one token at a time from the longer text (transformers' ``truncation=True``)."""


def tokenize(
    tokenizer: Any,
    texts: list[str],
    text_pairs: Optional[list[str]],
    *,
    limit: int,
    pad_to_multiple_of: Optional[int],
    input_names: Sequence[str],
    device: Any,
) -> dict[str, torch.Tensor]:
    """``input_names`` of ``tokenizer(texts, text_pairs)``, padded to the longest and truncated to ``limit``, on
    ``device``. Pairs give the second segment token type 1 in families that take ``token_type_ids``."""
    batch = tokenizer(
        texts,
        text_pairs,
        padding="longest",
        truncation=PAIR_TRUNCATION if text_pairs is not None else True,
        max_length=limit,
        pad_to_multiple_of=pad_to_multiple_of,
        return_tensors="pt",
        return_token_type_ids="token_type_ids" in input_names,
    )
    return {name: batch[name].to(device) for name in input_names if name in batch}


def pad(tokenizer: Any, rows: list[dict], *, limit: int, pad_to_multiple_of: Optional[int],
        input_names: Sequence[str], device: Any) -> dict[str, torch.Tensor]:
    """Pre-tokenised rows (``input_ids`` and the like, from ``dataset.map(tokenizer)``) padded to the longest with
    ``tokenizer.pad``, as transformers' ``DataCollatorWithPadding``; a row longer than ``limit`` (the head's
    ``max_length``) is refused: the tokenizer that made it decides truncation, not the collate."""
    for i, row in enumerate(rows):
        if len(row["input_ids"]) > limit:
            raise ValueError(f"pre-tokenised item at index {i} has {len(row['input_ids'])} tokens, more than this "
                             f"head's max_length {limit}: tokenise with truncation=True, max_length={limit} (or load "
                             "the head with a larger max_length)")
    batch = tokenizer.pad([{k: v for k, v in row.items() if k in input_names} for row in rows], padding="longest",
                          pad_to_multiple_of=pad_to_multiple_of, return_tensors="pt")
    return {name: batch[name].to(device) for name in input_names if name in batch}


def rank(row: torch.Tensor, names: list[str], problem: str, top_k: Optional[int]) -> list[tuple[str, float]]:
    """One row of logits as ``(label, probability)`` pairs, highest first (regression: the raw values)."""
    if problem == _losses.REGRESSION:
        pairs = (
            [("score", float(row[0]))] if row.numel() == 1 else list(zip(names, map(float, row), strict=True))
        )
        return pairs[:top_k]
    probs = torch.sigmoid(row) if problem == _losses.MULTI_LABEL else torch.softmax(row, dim=-1)
    order = torch.argsort(probs, descending=True, stable=True)
    return [(names[int(i)], float(probs[i])) for i in order][:top_k]
