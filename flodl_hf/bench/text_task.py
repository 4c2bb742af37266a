"""A small, offline, learnable text task and a tiny BERT for the accuracy workload of ``flodl-hf bench``.

Why it exists: time-to-accuracy needs a task that a model learns in a few hundred optimizer steps (so the curve
has a shape, not a step at 0) with no download and no corpus. Sentences are one or two clauses joined by
"but"; the label is the polarity of the *last* clause, flipped by "not" (``"the plot was good but the acting
was not great"`` -> negative). A bag of words cannot solve it (the same words appear in both orders), a small
BERT with attention can. The word-level tokenizer is built in-process with the ``tokenizers`` library.
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["VOCAB_WORDS", "make_task", "tiny_tokenizer", "tiny_bert_config"]

_POSITIVE = ("good", "great", "excellent", "wonderful", "lovely", "superb", "fine", "nice")
_NEGATIVE = ("bad", "awful", "terrible", "horrible", "poor", "dreadful", "weak", "boring")
_SUBJECTS = ("the movie", "the film", "the plot", "the acting", "the music", "the ending", "this book",
             "the show", "the story", "the food", "the service", "the cast")
_VERBS = ("was", "is", "seemed", "felt", "looked")
_INTENSIFIERS = ("", "", "very", "really", "quite", "so", "rather")
_TAILS = ("", "", "overall", "to me", "in the end", "i think", "for sure", "today")
# The adjective alone predicts ~70 % of labels (a fast first plateau); negation and "but" take longer to learn,
# so held-out accuracy rises gradually instead of jumping from 50 % after a random wait.
_NEGATION_RATE, _CONTRAST_RATE = 0.3, 0.5
_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

VOCAB_WORDS: tuple[str, ...] = tuple(dict.fromkeys(
    w for phrase in (_POSITIVE + _NEGATIVE + _SUBJECTS + _VERBS + _INTENSIFIERS + _TAILS + ("not", "but"))
    for w in phrase.split()
))
"""Every word :func:`make_task` can produce (each one token)."""


def _clause(rng: random.Random) -> tuple[str, int]:
    positive = rng.random() < 0.5
    negated = rng.random() < _NEGATION_RATE
    adjective = rng.choice(_POSITIVE if positive else _NEGATIVE)
    words = [rng.choice(_SUBJECTS), rng.choice(_VERBS), "not" if negated else "", rng.choice(_INTENSIFIERS),
             adjective, rng.choice(_TAILS)]
    return " ".join(w for w in words if w), int(positive != negated)


def make_task(n: int, seed: int) -> list[tuple[str, int]]:
    """``n`` labelled sentences ``(text, label)`` (label 1 = positive), deterministic in ``seed``."""
    if n < 1:
        raise ValueError(f"n={n!r} is invalid: ask for at least one sample")
    rng = random.Random(seed)
    data = []
    for _ in range(n):
        text, label = _clause(rng)
        if rng.random() < _CONTRAST_RATE:
            first, _ = _clause(rng)
            text = f"{first} but {text}"
        data.append((text, label))
    return data


def tiny_tokenizer() -> Any:
    """A word-level ``PreTrainedTokenizerFast`` (``[CLS] words [SEP]``) covering :data:`VOCAB_WORDS`."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(_SPECIALS + VOCAB_WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return PreTrainedTokenizerFast(tokenizer_object=backend, cls_token="[CLS]", sep_token="[SEP]",
                                   pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]")


def tiny_bert_config(num_labels: int = 2) -> Any:
    """BertConfig: 1 layer, hidden 32, 4 heads, intermediate 64, 64 positions, dropout off, init std 0.1.

    One layer (not two) keeps the real CPU compute of a 16-sample micro-batch (~15 ms on a loaded 2-core host,
    forward + backward) well under the modelled device time; the wider init (0.1 instead of BERT's 0.02) skips the
    long flat start of a tiny BERT. With AdamW at lr 2e-3 and 32 samples per step it passes 80 % held-out accuracy
    after about 80 steps and 98 % after about 120."""
    from transformers import BertConfig

    return BertConfig(vocab_size=len(_SPECIALS) + len(VOCAB_WORDS), hidden_size=32, num_hidden_layers=1,
                      num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                      num_labels=num_labels, pad_token_id=0, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, initializer_range=0.1)
