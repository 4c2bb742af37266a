"""Tiny, offline models, tokenizers, checkpoints and a toy task for tests (shared by every test module).

It exists so that no test needs the Hugging Face Hub or a network: every family of text encoder that flodl-hf
supports can be built here in milliseconds from a tiny config (2 layers, hidden 32) with a word-level tokenizer
made in-process by the ``tokenizers`` library. Nothing here imports ``heads`` or ``flodl_hf``, so engine tests
can use it too.

Stable API (other test modules rely on it; extend, do not change signatures):

- ``FAMILIES``: the supported ``model_type`` strings, in a fixed order.
- ``BERT_LIKE`` / ``ROBERTA_LIKE``: which families use ``[CLS]``-style or ``<s>``-style special tokens.
- ``tiny_tokenizer(family)``: a ``PreTrainedTokenizerFast`` covering every word of ``toy_task``.
- ``tiny_config(family, num_labels=2)``: a tiny transformers config matching that tokenizer.
- ``tiny_model(family, num_labels=2, seed=0)``: a seeded ``*ForSequenceClassification`` model (eval mode).
- ``make_checkpoint(family, dir, *, with_classifier, num_labels=2, seed=0)``: a real checkpoint directory
  (config.json, model.safetensors, tokenizer files) written by transformers' own ``save_pretrained``.
- ``toy_task(n, seed=0)``: a learnable sentiment task, a list of ``(text, label)`` with labels 0/1.
- ``TOY_WORDS``: the vocabulary of ``toy_task`` (every word is in every tiny tokenizer).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Union

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import (
    AlbertConfig,
    AlbertForSequenceClassification,
    AlbertModel,
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    DebertaV2Config,
    DebertaV2ForSequenceClassification,
    DebertaV2Model,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    DistilBertModel,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    RobertaConfig,
    RobertaForSequenceClassification,
    RobertaModel,
    XLMRobertaConfig,
    XLMRobertaForSequenceClassification,
    XLMRobertaModel,
)
from transformers.utils import logging as hf_logging

__all__ = [
    "FAMILIES",
    "BERT_LIKE",
    "ROBERTA_LIKE",
    "TOY_WORDS",
    "tiny_tokenizer",
    "tiny_config",
    "tiny_model",
    "make_checkpoint",
    "toy_task",
]

FAMILIES: tuple[str, ...] = ("bert", "distilbert", "roberta", "albert", "xlm-roberta", "deberta-v2")
"""Every supported ``config.model_type``, in the order tests parametrise over them."""

BERT_LIKE: frozenset[str] = frozenset({"bert", "distilbert", "albert", "deberta-v2"})
ROBERTA_LIKE: frozenset[str] = frozenset({"roberta", "xlm-roberta"})

_POSITIVE = ("good", "great", "excellent", "wonderful", "lovely", "superb")
_NEGATIVE = ("bad", "awful", "terrible", "horrible", "poor", "dreadful")
_SUBJECTS = (
    "the movie",
    "the film",
    "the plot",
    "the acting",
    "the music",
    "the ending",
    "this book",
    "the show",
    "the story",
    "the food",
)
_VERBS = ("was", "is", "seemed", "felt", "looked")
_INTENSIFIERS = ("", "very", "really", "quite", "so", "rather")
_TAILS = ("", "overall", "to me", "in the end", "i think", "for sure", "today", "as always")
_EXTRA = (
    "and",
    "but",
    "not",
    "it",
    "of",
    "with",
    "a",
    "an",
    "this",
    "that",
    "we",
    "you",
    "they",
    "he",
    "she",
    "okay",
    "fine",
    "yes",
    "no",
    "maybe",
    "again",
    "here",
    "there",
    "now",
    "then",
)

TOY_WORDS: tuple[str, ...] = tuple(
    dict.fromkeys(
        w
        for phrase in (_POSITIVE + _NEGATIVE + _SUBJECTS + _VERBS + _INTENSIFIERS + _TAILS + _EXTRA)
        for w in phrase.split()
    )
)
"""Every word ``toy_task`` can produce, plus a few common extras (each its own token)."""

_BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # ids 0..4: pad_token_id = 0
_ROBERTA_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")  # ids 0..4: bos 0, pad 1, eos 2

# Tiny architecture shared by every family (see tiny_config).
_HIDDEN, _LAYERS, _HEADS, _INTERMEDIATE, _MAX_POS = 32, 2, 4, 37, 64


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}: use one of {', '.join(FAMILIES)}")


def tiny_tokenizer(family: str) -> PreTrainedTokenizerFast:
    """A word-level fast tokenizer for ``family``: lower-cases, splits on whitespace and punctuation, adds the
    family's special tokens (``[CLS] x [SEP]`` for BERT-likes, ``<s> x </s>`` for RoBERTa-likes).

    Its vocabulary is the 5 special tokens followed by ``TOY_WORDS``; unknown words map to the unk token.
    """
    _check_family(family)
    bert_like = family in BERT_LIKE
    specials = _BERT_SPECIALS if bert_like else _ROBERTA_SPECIALS
    vocab = {tok: i for i, tok in enumerate(specials + TOY_WORDS)}
    cls_tok, sep_tok, pad_tok, unk_tok, mask_tok = (
        ("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]")
        if bert_like
        else ("<s>", "</s>", "<pad>", "<unk>", "<mask>")
    )
    backend = Tokenizer(models.WordLevel(vocab, unk_token=unk_tok))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls_tok} $A {sep_tok}",
        pair=f"{cls_tok} $A {sep_tok} $B:1 {sep_tok}:1",
        special_tokens=[(cls_tok, vocab[cls_tok]), (sep_tok, vocab[sep_tok])],
    )
    extra = {} if bert_like else {"bos_token": "<s>", "eos_token": "</s>"}
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        cls_token=cls_tok,
        sep_token=sep_tok,
        pad_token=pad_tok,
        unk_token=unk_tok,
        mask_token=mask_tok,
        **extra,
    )


def tiny_config(family: str, num_labels: int = 2) -> PretrainedConfig:
    """A tiny config of ``family`` (2 layers, hidden 32, 4 heads, intermediate 37, 64 positions) whose vocabulary
    size and special-token ids match ``tiny_tokenizer(family)``. Dropout is left at the family default."""
    _check_family(family)
    vocab_size = len(_BERT_SPECIALS) + len(TOY_WORDS)
    common = dict(vocab_size=vocab_size, num_labels=num_labels)
    if family in BERT_LIKE:
        common.update(pad_token_id=0)
    else:
        common.update(pad_token_id=1, bos_token_id=0, eos_token_id=2)
    encoder = dict(
        hidden_size=_HIDDEN,
        num_hidden_layers=_LAYERS,
        num_attention_heads=_HEADS,
        intermediate_size=_INTERMEDIATE,
        max_position_embeddings=_MAX_POS,
    )
    if family == "bert":
        return BertConfig(**common, **encoder)
    if family == "distilbert":
        return DistilBertConfig(
            **common,
            dim=_HIDDEN,
            n_layers=_LAYERS,
            n_heads=_HEADS,
            hidden_dim=_INTERMEDIATE,
            max_position_embeddings=_MAX_POS,
        )
    if family == "roberta":
        return RobertaConfig(**common, **encoder)
    if family == "xlm-roberta":
        return XLMRobertaConfig(**common, **encoder)
    if family == "albert":
        return AlbertConfig(**common, **encoder, embedding_size=16, bos_token_id=2, eos_token_id=3)
    # deberta-v2 (v3-style: relative attention with buckets, no absolute positions, no token types)
    return DebertaV2Config(
        **common,
        **encoder,
        relative_attention=True,
        position_buckets=16,
        max_relative_positions=-1,
        pos_att_type=["p2c", "c2p"],
        norm_rel_ebd="layer_norm",
        share_att_key=True,
        position_biased_input=False,
        type_vocab_size=0,
    )


_CLASSES: dict[str, tuple[type[PreTrainedModel], type[PreTrainedModel]]] = {
    "bert": (BertModel, BertForSequenceClassification),
    "distilbert": (DistilBertModel, DistilBertForSequenceClassification),
    "roberta": (RobertaModel, RobertaForSequenceClassification),
    "albert": (AlbertModel, AlbertForSequenceClassification),
    "xlm-roberta": (XLMRobertaModel, XLMRobertaForSequenceClassification),
    "deberta-v2": (DebertaV2Model, DebertaV2ForSequenceClassification),
}


def tiny_model(
    family: str, num_labels: int = 2, seed: int = 0, *, with_classifier: bool = True
) -> PreTrainedModel:
    """A freshly initialised tiny model of ``family`` (weights determined by ``seed``), in eval mode, on the CPU.

    ``with_classifier=True`` gives the ``*ForSequenceClassification`` model; ``False`` the bare encoder
    (``BertModel`` etc.), as found in a base checkpoint. The caller's torch RNG state is left untouched.
    """
    _check_family(family)
    base_cls, cls_cls = _CLASSES[family]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = (cls_cls if with_classifier else base_cls)(tiny_config(family, num_labels))
    return model.eval()


def make_checkpoint(
    family: str, dir: Union[str, Path], *, with_classifier: bool, num_labels: int = 2, seed: int = 0
) -> Path:
    """Write a real checkpoint directory of ``family`` to ``dir`` (created if needed) and return its path.

    It holds ``config.json`` and ``model.safetensors`` written by transformers' ``save_pretrained`` and the tokenizer
    files of ``tiny_tokenizer(family)``. ``with_classifier=False`` saves the bare encoder (e.g. ``BertModel``, whose
    keys carry no ``bert.`` prefix), the way a pretrained base checkpoint looks; ``True`` saves a
    ``*ForSequenceClassification`` model with a ``num_labels``-way classifier. Same ``seed``, same bytes.
    """
    path = Path(dir)
    path.mkdir(parents=True, exist_ok=True)
    model = tiny_model(family, num_labels, seed, with_classifier=with_classifier)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Writing model shards" bar on stderr
    try:
        model.save_pretrained(path)
        tiny_tokenizer(family).save_pretrained(path)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return path


def toy_task(n: int, seed: int = 0) -> list[tuple[str, int]]:
    """``n`` short review-like sentences labelled 1 (a positive adjective such as "good", "great") or 0 (a negative
    one such as "bad", "awful"), balanced and shuffled with ``seed``.

    Example: ``("the plot was really awful to me", 0)``. A tiny model learns it in a few dozen AdamW steps: the
    label depends on one word whose position varies a little.
    """
    if n < 1:
        raise ValueError(f"n={n!r} is invalid: ask for at least one sample")
    rng = random.Random(seed)
    data = []
    for i in range(n):
        label = i % 2
        adjective = rng.choice(_POSITIVE if label else _NEGATIVE)
        words = [
            rng.choice(_SUBJECTS),
            rng.choice(_VERBS),
            rng.choice(_INTENSIFIERS),
            adjective,
            rng.choice(_TAILS),
        ]
        data.append((" ".join(w for w in words if w), label))
    rng.shuffle(data)
    return data
