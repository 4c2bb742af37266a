"""Extractive question-answering data: a question, a context and the answer spans of the context.

It exists so that ``flodl-hf train / eval --task question-answering`` read SQuAD-shaped data strictly and hand the
head SQuAD-style items ``{"id", "question", "context", "answers": {"text": [...], "answer_start": [...]}}``:

* **SQuAD JSON** (a ``.json`` file): ``{"data": [{"paragraphs": [{"context": ..., "qas": [{"id", "question",
  "answers": [{"text", "answer_start"}]}]}]}]}`` (articles may have a ``title``).
* **Columns** (JSON lines, JSON, parquet / arrow, a saved ``datasets`` directory or a Hub id, through
  ``flodl_hf.data.sources``): ``question``, ``context`` and ``answers`` as ``{"text": [...], "answer_start":
  [...]}`` (the ``datasets`` squad layout) or as a list of ``{"text", "answer_start"}`` objects.

Every answer must be a span of its context: ``context[answer_start:answer_start + len(text)] == text``
(``answer_start`` is a 0-based character offset). A row that breaks it is refused naming the row, the answer and
what the context holds there. Questions without an answer (SQuAD 2.0's unanswerable ones) are refused too: the QA
head here learns answerable questions only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from .rows import Rows

__all__ = ["load_qa_data", "check_qa_item", "squad_items"]


def _answers(raw: Any, where: str) -> tuple[list, list]:
    if isinstance(raw, dict):
        texts, starts = raw.get("text"), raw.get("answer_start")
        if not isinstance(texts, (list, tuple)) or not isinstance(starts, (list, tuple)) or len(texts) != len(starts):
            raise ValueError(f"{where}: answers must hold equal-length lists 'text' and 'answer_start', e.g. "
                             "{\"text\": [\"Paris\"], \"answer_start\": [12]}")
        return list(texts), list(starts)
    if isinstance(raw, (list, tuple)) and all(isinstance(a, dict) for a in raw):
        return [a.get("text") for a in raw], [a.get("answer_start") for a in raw]
    raise ValueError(f"{where}: answers is a {type(raw).__name__} ({raw!r:.40}): give {{\"text\": [...], "
                     "\"answer_start\": [...]}} or a list of {\"text\", \"answer_start\"} objects")


def check_qa_item(item: dict, where: str) -> dict:
    """One SQuAD-style item, checked: texts are strings, every answer is a span of the context."""
    for key in ("question", "context"):
        value = item.get(key)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{where}: {key} is {'missing' if value is None else repr(value)[:40]}: give a "
                             f"non-empty {key} text")
    texts, starts = _answers(item.get("answers"), where)
    if not texts:
        raise ValueError(f"{where}: the question has no answer: this QA job learns answerable questions only "
                         "(extractive, SQuAD 1.1 style); drop unanswerable rows")
    context = item["context"]
    for text, start in zip(texts, starts):
        if not isinstance(text, str) or not text:
            raise ValueError(f"{where}: an answer text is {text!r:.40}: give the answer's text as it appears in the "
                             "context")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"{where}: answer_start {start!r:.20} of answer {text!r:.40} is not a character offset "
                             "(an integer >= 0)")
        found = context[start:start + len(text)]
        if found != text:
            hint = context.find(text)
            fix = (f"answer_start {hint} is where it first occurs" if hint >= 0
                   else "the text does not occur in the context at all")
            raise ValueError(f"{where}: the answer {text!r:.60} is not in its context at answer_start {start} (the "
                             f"context reads {found!r:.60} there): fix answer_start, a 0-based character offset "
                             f"({fix})")
    return {"id": str(item.get("id", "")), "question": item["question"], "context": context,
            "answers": {"text": list(texts), "answer_start": list(starts)}}


def squad_items(data: Any, name: str) -> list[dict]:
    """The items of a SQuAD JSON document ``{"data": [{"paragraphs": [...]}]}``, each answer checked."""
    items = []
    for a, article in enumerate(data.get("data") or [], start=1):
        for p, paragraph in enumerate(article.get("paragraphs") or [] if isinstance(article, dict) else [], start=1):
            if not isinstance(paragraph, dict):
                raise ValueError(f"{name}: article {a}, paragraph {p} is not an object with context and qas")
            for q, qa in enumerate(paragraph.get("qas") or [], start=1):
                if not isinstance(qa, dict):
                    raise ValueError(f"{name}: article {a}, paragraph {p}, question {q} is not an object")
                where = f"{name}: article {a}, paragraph {p}, question {q}"
                where += f" (id {qa['id']})" if "id" in qa else ""
                items.append(check_qa_item(dict(qa, context=paragraph.get("context")), where))
    return items


def _squad_document(path: Path, encoding: Optional[str]) -> Optional[dict]:
    """The parsed document when ``path`` is a SQuAD-shaped ``.json`` file, else None."""
    if path.suffix.lower() != ".json" or not path.is_file():
        return None
    from .sources import _decode, load_json

    try:  # the data readers' rules: repeated keys, too deep nesting, too long integers are refused naming the file
        data = load_json(_decode(path.read_bytes(), encoding, str(path)), str(path))
    except json.JSONDecodeError:
        return None  # JSON lines in a .json file: the column reader handles it
    if isinstance(data, dict) and isinstance(data.get("data"), list) and any(
            isinstance(a, dict) and "paragraphs" in a for a in data["data"]):
        return data
    return None


def load_qa_data(source: Union[str, Path], *, encoding: Optional[str] = None, split: Optional[str] = None,
                 prefer: Sequence[str] = ("train",)) -> Rows:
    """Read question-answering items from ``source`` (see the module docstring) as ``Rows``."""
    path = Path(source)
    document = _squad_document(path, encoding)
    if document is not None:
        items, name = squad_items(document, str(path)), str(path)
    else:
        from .sources import read_table

        table = read_table(source, split=split, encoding=encoding, prefer=prefer)
        name = table.name
        missing = [c for c in ("question", "context", "answers") if c not in table.columns]
        if missing:
            raise ValueError(f"{name} has no {', '.join(map(repr, missing))} column(s); available columns: "
                             f"{', '.join(map(repr, table.columns))}: give SQuAD-style columns question, context "
                             "and answers, or a SQuAD JSON file")
        columns = ["question", "context", "answers"] + (["id"] if "id" in table.columns else [])
        items = [check_qa_item(dict(row), f"{name}: row {n}")
                 for n, row in enumerate(table.iter_rows(columns), start=1)]
    if not items:
        raise ValueError(f"{name} holds no question: give at least one question with its context and answer")
    return Rows(items, name)
