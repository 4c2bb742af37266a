"""Tiny offline pieces for the token classification tests: a subword tokenizer, tagged sentences, a toy tagging task.

It exists because ``tiny_models.tiny_tokenizer`` is word-level: a word only splits on punctuation, so the
word -> subword alignment and the pipeline's subword grouping would barely be exercised. ``subword_tokenizer`` is a
real WordPiece tokenizer (``##`` continuation prefix, like BERT's) whose vocabulary holds the toy words plus single
letters and a few suffixes, so unknown words split into several pieces and nothing maps to the unknown token.
"""

from __future__ import annotations

import random
import string

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PretrainedConfig, PreTrainedTokenizerFast

from tiny_models import BERT_LIKE, TOY_WORDS, tiny_config, toy_task

__all__ = ["TAGS", "SUFFIXES", "subword_tokenizer", "subword_config", "random_tagged", "toy_tagging",
           "tag_of", "random_labels", "byte_level_tokenizer"]

TAGS = ["O", "B-POS", "I-POS", "B-NEG", "I-NEG", "B-THING", "I-THING"]
"""Tag names of every test tagger, in id order (BIO, so B- -> I- mapping and entity grouping are exercised)."""

SUFFIXES = ("ness", "ly", "er", "est", "ing", "ed", "s")
_PUNCT = ("!", ",", ".", "?")
_POSITIVE = {"good", "great", "excellent", "wonderful", "lovely", "superb"}
_NEGATIVE = {"bad", "awful", "terrible", "horrible", "poor", "dreadful"}
_THINGS = {"movie", "film", "plot", "acting", "music", "ending", "book", "show", "story", "food"}
assert _POSITIVE | _NEGATIVE | _THINGS <= set(TOY_WORDS)

_BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_ROBERTA_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


def _vocab(family: str) -> dict[str, int]:
    specials = _BERT_SPECIALS if family in BERT_LIKE else _ROBERTA_SPECIALS
    pieces = list(TOY_WORDS) + list(string.ascii_lowercase) + ["##" + c for c in string.ascii_lowercase]
    pieces += ["##" + s for s in SUFFIXES] + list(_PUNCT)
    return {tok: i for i, tok in enumerate(dict.fromkeys(specials + tuple(pieces)))}


def subword_tokenizer(family: str) -> PreTrainedTokenizerFast:
    """A WordPiece fast tokenizer with ``family``'s special tokens (same ids as ``tiny_tokenizer``'s)."""
    bert_like = family in BERT_LIKE
    vocab = _vocab(family)
    cls_tok, sep_tok, pad_tok, unk_tok, mask_tok = (
        _BERT_SPECIALS[2], _BERT_SPECIALS[3], _BERT_SPECIALS[0], _BERT_SPECIALS[1], _BERT_SPECIALS[4]
    ) if bert_like else ("<s>", "</s>", "<pad>", "<unk>", "<mask>")
    backend = Tokenizer(models.WordPiece(vocab, unk_token=unk_tok, continuing_subword_prefix="##"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece(prefix="##")
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls_tok} $A {sep_tok}", pair=f"{cls_tok} $A {sep_tok} $B:1 {sep_tok}:1",
        special_tokens=[(cls_tok, vocab[cls_tok]), (sep_tok, vocab[sep_tok])],
    )
    extra = {} if bert_like else {"bos_token": "<s>", "eos_token": "</s>"}
    return PreTrainedTokenizerFast(tokenizer_object=backend, cls_token=cls_tok, sep_token=sep_tok,
                                   pad_token=pad_tok, unk_token=unk_tok, mask_token=mask_tok, **extra)


def subword_config(family: str, num_labels: int = len(TAGS), dropout: bool = True) -> PretrainedConfig:
    """``tiny_config(family)`` sized for :func:`subword_tokenizer`, labelled with :data:`TAGS`; ``dropout=False``
    zeroes every dropout (for exact multi-process comparisons in train mode)."""
    config = tiny_config(family, num_labels)
    config.vocab_size = len(_vocab(family))
    if num_labels == len(TAGS):
        config.id2label = dict(enumerate(TAGS))
        config.label2id = {t: i for i, t in enumerate(TAGS)}
    if not dropout:
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout",
                     "seq_classif_dropout", "classifier_dropout_prob", "pooler_dropout"):
            if hasattr(config, name):
                setattr(config, name, 0.0)
        config.classifier_dropout = 0.0
    return config


def _random_word(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.4:
        return rng.choice(TOY_WORDS)
    if kind < 0.7:
        return rng.choice(TOY_WORDS) + rng.choice(SUFFIXES)  # e.g. "goodness": good ##ness
    if kind < 0.9:
        return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 6)))
    return rng.choice(TOY_WORDS) + rng.choice(_PUNCT)  # "movie!": two pieces of one word


def random_tagged(n: int, seed: int, *, min_words: int = 1, max_words: int = 9) -> list[tuple[list[str], list[str]]]:
    """``n`` random ``(words, tags)`` sentences whose words often split into several subwords; tags are random
    BIO tag names of :data:`TAGS`."""
    rng = random.Random(seed)
    return [
        (words := [_random_word(rng) for _ in range(rng.randint(min_words, max_words))],
         [rng.choice(TAGS) for _ in words])
        for _ in range(n)
    ]


def tag_of(word: str) -> str:
    """The toy tagging rule: positive adjectives B-POS, negative ones B-NEG, nouns B-THING, all else O."""
    w = word.lower()
    return "B-POS" if w in _POSITIVE else "B-NEG" if w in _NEGATIVE else "B-THING" if w in _THINGS else "O"


def toy_tagging(n: int, seed: int = 0) -> list[tuple[list[str], list[str]]]:
    """``n`` review-like sentences (``tiny_models.toy_task``) tagged by :func:`tag_of`."""
    return [(text.split(), [tag_of(w) for w in text.split()]) for text, _ in toy_task(n, seed)]


def random_labels(shape: tuple[int, int], num_labels: int, seed: int, masked: float) -> torch.Tensor:
    """Random token labels with a fraction ``masked`` of -100 (seeded)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, num_labels, shape, generator=g)
    labels[torch.rand(shape, generator=g) < masked] = -100
    return labels


def byte_level_tokenizer(add_prefix_space: bool = False):
    """A real byte-level BPE ``RobertaTokenizer`` (RoBERTa's kind: ``Ġ`` marks a word start, no continuation
    prefix) over lower-case letters and punctuation, with merges ``Ġ``+letter and a few letter pairs, so words
    split into several pieces. Its ids fit ``tiny_config("roberta")`` when ``vocab_size`` is ``len(tokenizer)``."""
    from transformers import RobertaTokenizer

    letters = list(string.ascii_lowercase)
    pairs = [("t", "h"), ("e", "r"), ("i", "n"), ("o", "o"), ("e", "d")]
    merges = [("Ġ", c) for c in letters] + pairs
    pieces = letters + ["Ġ", "!", ",", ".", "?", "'"] + ["Ġ" + c for c in letters] + [a + b for a, b in pairs]
    vocab = {tok: i for i, tok in enumerate(_ROBERTA_SPECIALS + tuple(pieces))}
    return RobertaTokenizer(vocab=vocab, merges=merges, add_prefix_space=add_prefix_space)
