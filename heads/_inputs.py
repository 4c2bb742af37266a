"""Checks and parsing of what users hand a head: texts, collate items, label names, lengths.

It exists so that every malformed input fails with a message naming the index, the type and the fix, in one
place that the head, its tests and the family modules share.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, Sequence

__all__ = ["check_texts", "check_pairs", "split_items", "tokenized_items", "apply_labels", "check_max_length",
           "pad_multiple", "TOKEN_KEYS"]

#: The keys of a pre-tokenised row (``dataset.map(tokenizer)``) the model takes.
TOKEN_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def check_texts(texts: Any, what: str) -> list[str]:
    """``texts`` as a list of str; a single string or a non-str entry raises, naming ``what`` and the index."""
    if isinstance(texts, (str, bytes)):
        raise ValueError(
            f"{what} takes a list of texts, got a single {type(texts).__name__}: wrap it in a list, "
            f"e.g. {what}([text])"
        )
    try:
        texts = list(texts)
    except TypeError as exc:
        raise ValueError(f"{what} takes a list of texts, got {type(texts).__name__}") from exc
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(
                f"text at index {i} is {type(text).__name__} ({text!r:.60}), not str: {what} needs strings"
            )
    return texts


def apply_labels(config: Any, num_labels: Optional[int], labels: Optional[Sequence[str]]) -> None:
    """Set ``num_labels`` / ``id2label`` / ``label2id`` on ``config`` in place (validated)."""
    if labels is not None:
        if isinstance(labels, (str, bytes)) or not hasattr(labels, "__iter__"):
            kind = "string" if isinstance(labels, (str, bytes)) else type(labels).__name__
            raise ValueError(f"labels={labels!r:.60} is one {kind}: pass a list of label names, "
                             "e.g. ['neg', 'pos']")
        labels = list(labels)
        if not all(isinstance(name, str) for name in labels):
            raise ValueError(f"labels={labels!r:.80} is invalid: give a list of label names (str), e.g. ['neg', 'pos']")
        if len(set(labels)) != len(labels):
            raise ValueError(f"labels={labels!r:.80} is invalid: give each name once")
        if len(labels) < 2:
            raise ValueError(
                f"labels={labels!r:.80} names {'1 class' if labels else 'no class'}: a classifier needs at least 2 "
                "label names, e.g. ['neg', 'pos'] (--labels neg,pos); for one output (a regression) pass num_labels=1 "
                "(--problem-type regression) instead of labels"
            )
        if num_labels is not None and num_labels != len(labels):
            raise ValueError(
                f"num_labels={num_labels} disagrees with the {len(labels)} names in labels: drop "
                "num_labels (it follows from labels)"
            )
        config.id2label = dict(enumerate(labels))
        config.label2id = {name: i for i, name in enumerate(labels)}
    elif num_labels is not None:
        if not isinstance(num_labels, int) or isinstance(num_labels, bool) or num_labels < 1:
            raise ValueError(
                f"num_labels={num_labels!r} is invalid: use an integer >= 1 (1 means regression)"
            )
        if config.num_labels != num_labels:
            config.num_labels = num_labels  # resets id2label / label2id to LABEL_k


def check_max_length(max_length: Any) -> int:
    """``max_length`` if it is an integer >= 2 (room for the special tokens), else ValueError."""
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 2:
        raise ValueError(
            f"max_length={max_length!r} is invalid: use an integer >= 2 (tokens per text, special "
            "tokens included)"
        )
    return max_length


def check_pairs(texts: list[str], text_pairs: Any, what: str) -> Optional[list[str]]:
    """``text_pairs`` as a list of str as long as ``texts`` (None stays None: single texts)."""
    if text_pairs is None:
        return None
    pairs = check_texts(text_pairs, what)
    if len(pairs) != len(texts):
        raise ValueError(
            f"{what} got {len(texts)} texts but {len(pairs)} text_pairs: give one second text per text "
            "(or text_pairs=None for single texts)"
        )
    return pairs


def _parse_item(i: int, item: Any) -> tuple[Any, Any, Any, bool]:
    """``(text, pair, label, has_pair)`` of one collate item."""
    if isinstance(item, str):
        return item, None, None, False
    if isinstance(item, Mapping):
        if "text" not in item:
            raise ValueError(f"item at index {i} has keys {sorted(item)} but no 'text': give a dict with 'text' "
                             "(and 'text_pair', 'label' or 'labels')")
        label = item["label"] if "label" in item else item.get("labels")
        return item["text"], item.get("text_pair"), label, "text_pair" in item
    if isinstance(item, (tuple, list)) and len(item) in (2, 3):
        if len(item) == 2:
            return item[0], None, item[1], False
        return item[0], item[1], item[2], True
    raise ValueError(
        f"item at index {i} is {type(item).__name__}"
        f"{f' of length {len(item)}' if isinstance(item, (tuple, list)) else ''}: give (text, label) pairs, "
        "(text, text_pair, label) triples, or dicts with 'text' (+ 'text_pair') and 'label'"
    )


def split_items(items: Sequence[Any]) -> tuple[list[str], Optional[list[str]], list[Any]]:
    """Texts, second texts (None when no item has one) and raw labels of collate items.

    Items are ``(text, label)`` pairs, ``(text, text_pair, label)`` triples, dicts with ``text`` (+ ``text_pair``)
    and ``label`` (or ``labels``), or bare strings (label None). A batch mixing items with and without a second
    text is refused, as is a malformed item or a non-str text: ValueError naming the index.
    """
    texts: list[str] = []
    pairs: list[Any] = []
    labels: list[Any] = []
    first_has_pair: Optional[bool] = None
    for i, item in enumerate(items):
        text, pair, label, has_pair = _parse_item(i, item)
        if first_has_pair is None:
            first_has_pair = has_pair
        elif has_pair != first_has_pair:
            raise ValueError(
                f"item at index {i} {'has' if has_pair else 'lacks'} a text_pair but item 0 "
                f"{'has' if first_has_pair else 'lacks'} one: a batch is all single texts or all pairs; "
                "give every item a text_pair (or none)"
            )
        if not isinstance(text, str):
            raise ValueError(f"text at index {i} is {type(text).__name__} ({text!r:.60}), not str")
        if has_pair and not isinstance(pair, str):
            raise ValueError(
                f"text_pair at index {i} is {type(pair).__name__} ({pair!r:.60}), not str: a pair item needs "
                "two strings"
            )
        texts.append(text)
        pairs.append(pair)
        labels.append(label)
    return texts, (pairs if first_has_pair else None), labels


def tokenized_items(items: Sequence[Any]) -> Optional[tuple[list[dict], list[Any]]]:
    """``(token rows, raw labels)`` when the items are pre-tokenised rows (dicts with ``input_ids``, as
    ``dataset.map(tokenizer)`` leaves them; other columns such as ``text`` are left out, as transformers' Trainer
    leaves them out); None when no item is. A batch mixing them with other items is refused."""
    tokenized = [isinstance(item, Mapping) and "input_ids" in item for item in items]
    if not any(tokenized):
        return None
    if not all(tokenized):
        i = tokenized.index(False)
        raise ValueError(f"item at index {i} has no 'input_ids' but item {tokenized.index(True)} has: a batch is all "
                         "pre-tokenised rows (dataset.map(tokenizer)) or all texts; give every item the same form")
    rows, labels = [], []
    for item in items:
        rows.append({key: item[key] for key in TOKEN_KEYS if key in item})
        labels.append(item["label"] if "label" in item else item.get("labels"))
    return rows, labels


def pad_multiple(device: Any, limit: int, positions: Optional[int]) -> Optional[int]:
    """On CUDA, pad each batch to a multiple of 8 tokens. Padding to the longest text gives nearly every batch
    a new shape, and under bf16/fp16 the attention kernels are planned per shape: measured on an H200, the
    default job's first steps took 1.8 s instead of 0.07 s, and the whole job ran 4x slower than fp32. Eight
    lengths cover every batch (and suit tensor cores); the padding is masked, so results do not change. None
    on CPU, and where rounding up would pass the model's position limit."""
    if getattr(device, "type", str(device)) != "cuda":
        return None
    if positions is not None and -(-int(limit) // 8) * 8 > positions:
        return None
    return 8
