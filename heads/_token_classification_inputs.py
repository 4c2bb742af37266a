"""Words, tags and token labels of token classification: parsing, checks and the word -> subword alignment.

It exists so that every rule that turns a tagged sentence into the label tensor of a tagger is written once and
testable without a model: which collate items are accepted, how tag names become ids, which subword of a word
carries the word's label (the first only, or all of them as transformers' ``label_all_tokens`` does), where the
labels are ``-100`` (special tokens, padding, and -- in first-subword mode -- every later subword of a word), and
what a word that the tokenizer turns into no token at all means (an error) versus a word cut off by ``max_length``
(counted, its label simply absent).
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Mapping
from typing import Any, Optional, Sequence

import torch

__all__ = [
    "IGNORE_INDEX",
    "WordEncoding",
    "check_words_batch",
    "split_tagged_items",
    "tag_ids",
    "b_to_i_map",
    "align",
    "visible_words",
    "check_token_labels",
    "lacks_prefix_space",
]

IGNORE_INDEX = -100
"""The label of a token that no loss counts (transformers' convention)."""

_WORD_KEYS = ("words", "tokens")
_TAG_KEYS = ("tags", "ner_tags", "labels")


class WordEncoding(dict):
    """The model inputs of a batch of words (a plain ``dict`` of tensors, so ``head(**enc)`` and
    ``model(**enc)`` work), plus two attributes that are not model inputs:

    - ``word_ids``: per row, the tokenizer's ``word_ids()`` (None for special and padding tokens);
    - ``truncated_words``: per row, how many trailing words ``max_length`` cut off (their labels are absent
      from the label tensor: no token carries them).
    """

    word_ids: list[list[Optional[int]]]
    truncated_words: list[int]


def _check_words(words: Any, where: str) -> list[str]:
    if isinstance(words, str):
        return words.split()
    if not isinstance(words, (list, tuple)):
        raise ValueError(
            f"{where} is {type(words).__name__} ({words!r:.60}): give a list of words (list of str) or a text "
            "(split on whitespace)"
        )
    for j, word in enumerate(words):
        if not isinstance(word, str):
            raise ValueError(f"word {j} of {where} is {type(word).__name__} ({word!r:.60}), not str")
        if not word.strip():
            raise ValueError(
                f"word {j} of {where} is {word!r}: an empty or whitespace word has no token to carry its tag; "
                "drop it (and its tag)"
            )
    return list(words)


def check_words_batch(words_batch: Any, what: str) -> list[list[str]]:
    """``words_batch`` as a list of word lists. Each entry is a list of words (pre-split, as in CoNLL data) or a
    text, split on whitespace. A single text or a single word list is refused (wrap it in a list)."""
    if isinstance(words_batch, (str, bytes)):
        raise ValueError(
            f"{what} takes a list of sentences, got a single {type(words_batch).__name__}: wrap it in a list, "
            f"e.g. {what}([text])"
        )
    try:
        batch = list(words_batch)
    except TypeError as exc:
        raise ValueError(f"{what} takes a list of sentences (word lists or texts), got "
                         f"{type(words_batch).__name__}") from exc
    if not batch:
        raise ValueError(f"{what} got no sentences: give at least one")
    return [_check_words(words, f"sentence {i}") for i, words in enumerate(batch)]


def _parse_item(i: int, item: Any) -> tuple[Any, Any, bool]:
    """``(words, tags, has_tags)`` of one collate item."""
    if isinstance(item, str):
        return item, None, False
    if isinstance(item, Mapping):
        words_key = next((k for k in _WORD_KEYS if k in item), None)
        if words_key is None:
            raise ValueError(
                f"item at index {i} has keys {sorted(item)} but no 'words' or 'tokens': give a dict with "
                "'words' (or 'tokens') and 'tags' (or 'ner_tags' / 'labels')"
            )
        tags_key = next((k for k in _TAG_KEYS if k in item), None)
        return item[words_key], (item[tags_key] if tags_key else None), tags_key is not None
    if isinstance(item, (tuple, list)):
        if len(item) == 2 and (isinstance(item[0], (list, tuple)) or (isinstance(item[0], str)
                                                                      and not isinstance(item[1], str))):
            return item[0], item[1], True  # (words, tags) or (text, tags)
        if all(isinstance(x, str) for x in item):
            return list(item), None, False  # bare words, for prediction
    raise ValueError(
        f"item at index {i} is {type(item).__name__}"
        f"{f' of length {len(item)}' if isinstance(item, (tuple, list)) else ''}: give (words, tags) pairs, "
        "dicts with 'words'/'tokens' and 'tags'/'ner_tags'/'labels', or bare word lists / texts for prediction"
    )


def split_tagged_items(items: Sequence[Any]) -> tuple[list[list[str]], Optional[list[Any]]]:
    """Word lists and raw tag lists of collate items (tags None when no item has any). A batch mixing tagged and
    untagged items is refused, as is a malformed item: ValueError naming the index."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence) or not items:
        raise ValueError("collate takes a non-empty list of items: (words, tags) pairs or dicts")
    words_batch, tags_batch, first = [], [], None
    for i, item in enumerate(items):
        words, tags, has_tags = _parse_item(i, item)
        if first is None:
            first = has_tags
        elif has_tags != first:
            raise ValueError(
                f"item at index {i} {'has' if has_tags else 'lacks'} tags but item 0 "
                f"{'has' if first else 'lacks'} them: tag every item (training) or none (prediction)"
            )
        words_batch.append(_check_words(words, f"item {i}"))
        tags_batch.append(tags)
    return words_batch, (tags_batch if first else None)


def tag_ids(tags: Any, words: list[str], index: int, label2id: Mapping[str, int], names: list[str]) -> list[int]:
    """The ids of one sentence's tags: one per word, a tag name or an id in ``0..len(names)-1``, or ``-100``
    (this word counts in no loss)."""
    if isinstance(tags, torch.Tensor):
        tags = tags.tolist()
    if isinstance(tags, (str, bytes)) or not isinstance(tags, Sequence):
        raise ValueError(
            f"tags of item {index} are {type(tags).__name__} ({tags!r:.60}): give a list with one tag per word"
        )
    if len(tags) != len(words):
        raise ValueError(
            f"item {index} has {len(words)} words but {len(tags)} tags: give exactly one tag per word "
            f"(words {words!r:.80})"
        )
    out = []
    for j, tag in enumerate(tags):
        if isinstance(tag, str):
            if tag not in label2id:
                raise ValueError(
                    f"tag {tag!r} of word {j} ({words[j]!r}) in item {index} is not one of this head's labels "
                    f"{names}: use one of those names or an id (load the head with labels=[...] naming every tag)"
                )
            out.append(int(label2id[tag]))
        elif isinstance(tag, numbers.Integral) and not isinstance(tag, bool):
            if tag != IGNORE_INDEX and not 0 <= int(tag) < len(names):
                raise ValueError(
                    f"tag id {int(tag)} of word {j} ({words[j]!r}) in item {index} is out of range: valid ids are "
                    f"0..{len(names) - 1} ({len(names)} labels), or -100 to ignore the word"
                )
            out.append(int(tag))
        else:
            raise ValueError(
                f"tag {tag!r} of word {j} in item {index} is {type(tag).__name__}: give a label name or an int id"
            )
    return out


def b_to_i_map(names: list[str]) -> list[int]:
    """For each label id, the id later subwords of a word take under ``label_all_subwords``: ``B-X`` -> ``I-X``
    when the head has an ``I-X`` label (as transformers' ``run_ner.py`` does with ``label_all_tokens``, so that
    a multi-subword entity stays one entity), every other label unchanged."""
    index = {name: i for i, name in enumerate(names)}
    return [index.get("I-" + name[2:], i) if name.startswith("B-") else i for i, name in enumerate(names)]


def align(word_ids: Sequence[Optional[int]], word_tags: Sequence[int], all_subwords: bool,
          later: Optional[Sequence[int]] = None) -> list[int]:
    """Token labels of one row from its word tags: ``-100`` on special and padding tokens (word id None); the
    first token of each word gets the word's tag; later tokens of the same word get ``-100``, or with
    ``all_subwords`` the word's tag mapped through ``later`` (see :func:`b_to_i_map`; None: unchanged)."""
    out: list[int] = []
    previous = None
    for word in word_ids:
        if word is None:
            out.append(IGNORE_INDEX)
        elif word != previous:
            out.append(word_tags[word])
        elif all_subwords:
            tag = word_tags[word]
            out.append(tag if later is None or tag == IGNORE_INDEX else later[tag])
        else:
            out.append(IGNORE_INDEX)
        previous = word
    return out


def visible_words(word_ids: Sequence[Optional[int]], n_words: int, full: bool, index: int,
                  words: list[str]) -> int:
    """How many leading words of a row have a token; ValueError for a word that produced no token although
    later words did (or although the row was not cut by ``max_length``). ``full``: the row reached the limit."""
    seen = sorted({w for w in word_ids if w is not None})
    visible = seen[-1] + 1 if seen else 0
    if len(seen) != visible or (visible < n_words and not full):
        missing = next(j for j in range(n_words) if j not in set(seen))
        raise ValueError(
            f"word {missing} ({words[missing]!r}) of sentence {index} produced no token: this tokenizer drops it, "
            "so its tag could carry no label; remove or replace that word"
        )
    return visible


def check_token_labels(labels: Any, input_shape: Sequence[int], num_labels: int) -> torch.Tensor:
    """``labels`` as a tensor, checked before the forward pass: integer ids of shape ``input_shape`` (``[B, T]``,
    as ``input_ids``), each in ``0..num_labels-1`` or ``-100``. ValueError naming the problem and the fix."""
    if not isinstance(labels, torch.Tensor):
        try:
            labels = torch.as_tensor(labels)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(
                f"labels of type {type(labels).__name__} cannot become a tensor ({exc}): give a LongTensor "
                f"of shape {list(input_shape)} (what collate returns)"
            ) from exc
    shape = list(input_shape)
    if list(labels.shape) != shape:
        raise ValueError(
            f"labels of shape {list(labels.shape)} do not match input_ids of shape {shape}: give one label per "
            "token (-100 for tokens no loss counts), as collate returns"
        )
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(
            f"labels have dtype {labels.dtype}: token labels are integer class ids (a LongTensor), -100 to ignore"
        )
    bad = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= num_labels))
    if bool(bad.any()):
        row, col = (int(v) for v in bad.nonzero()[0])
        raise ValueError(
            f"label {int(labels[row, col])} at row {row}, token {col} is out of range: valid ids are "
            f"0..{num_labels - 1} (num_labels={num_labels}), or -100 to ignore the token"
        )
    return labels


def _byte_level_without_prefix(node: Any) -> bool:
    if isinstance(node, Mapping):
        if node.get("type") == "ByteLevel" and node.get("add_prefix_space") is False:
            return True
        return any(_byte_level_without_prefix(v) for v in node.values())
    if isinstance(node, list):
        return any(_byte_level_without_prefix(v) for v in node)
    return False


def lacks_prefix_space(tokenizer: Any) -> bool:
    """True for a byte-level BPE tokenizer (RoBERTa's, GPT-2's) built with ``add_prefix_space=False``: it would
    encode each pre-split word without the leading space that marks a word start in pretraining, so every word
    would look like a continuation. transformers' ``run_ner.py`` loads such tokenizers with
    ``add_prefix_space=True``."""
    pre = getattr(getattr(tokenizer, "backend_tokenizer", None), "pre_tokenizer", None)
    if pre is None:
        return False
    try:
        state = json.loads(pre.__getstate__())  # the pre-tokenizer's own JSON (not the whole vocabulary)
    except (TypeError, ValueError, AttributeError):
        return False
    return _byte_level_without_prefix(state)
