"""Token-classification data: one sentence per row, a list of words and one tag per word.

It exists so that ``flodl-hf train / eval --task token-classification`` read the two common formats strictly, with
each bad row named (file, row, the fix), and hand the head ``(words, tag names)`` items:

* **Columns** (JSON lines, JSON, parquet / arrow, a saved ``datasets`` directory or a Hub id, through
  ``flodl_hf.data.sources``): a word-list column ``words`` or ``tokens`` and a tag-list column ``tags`` or
  ``ner_tags``. Tags are names (``B-PER``) or integer ids; ids need names: a ``datasets`` ``ClassLabel`` feature
  (``Sequence(ClassLabel)``, as in conll2003) or ``--labels`` in id order.
* **CoNLL** (``.conll``, ``.iob``, ``.iob2``, ``.bio``, ``.txt``): one word per line, whitespace-separated columns,
  the word in the first and its tag in the last; a blank line ends a sentence; ``-DOCSTART-`` lines are skipped.

Tag names: ``labels`` (``--labels``, or a trained model's labels) fixes them and their order, and a tag outside it
is refused naming the row; without it the names are the data's, ``O`` first and the others sorted. A row with no
word is dropped (counted in ``Rows.dropped``); a row whose tag count differs from its word count is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence, Union

from .rows import Rows

__all__ = ["load_token_data", "read_conll", "CONLL_SUFFIXES", "WORD_COLUMNS", "TAG_COLUMNS", "order_tags"]

CONLL_SUFFIXES = (".conll", ".iob", ".iob2", ".bio", ".txt")
WORD_COLUMNS = ("words", "tokens")
TAG_COLUMNS = ("tags", "ner_tags")


def order_tags(names: Sequence[str]) -> list[str]:
    """``O`` first, then the other tag names sorted (so B-X sits before I-X)."""
    distinct = sorted(set(names))
    return (["O"] if "O" in distinct else []) + [n for n in distinct if n != "O"]


def read_conll(path: Union[str, Path], encoding: Optional[str] = None) -> list[tuple[list[str], list[str]]]:
    """The sentences of a CoNLL file as ``(words, tags)``; a line without a tag column is refused by number."""
    from .sources import _decode

    path = Path(path)
    text = _decode(path.read_bytes(), encoding, str(path))
    sentences: list[tuple[list[str], list[str]]] = []
    words: list[str] = []
    tags: list[str] = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            if words:
                sentences.append((words, tags))
            words, tags = [], []
            continue
        if fields[0] == "-DOCSTART-":
            continue
        if len(fields) < 2:
            raise ValueError(f"{path}: line {line_no} ({line.strip()[:40]!r}) has no tag column: write each word "
                             "and its tag on one line, separated by whitespace (the tag last), and a blank line "
                             "between sentences")
        words.append(fields[0])
        tags.append(fields[-1])
    if words:
        sentences.append((words, tags))
    return sentences


def _pick(columns: Sequence[str], wanted: Optional[str], choices: Sequence[str], what: str, flag: str,
          name: str) -> str:
    if wanted is not None:
        if wanted not in columns:
            raise ValueError(f"{name} has no {what} column {wanted!r}; available columns: "
                             f"{', '.join(map(repr, columns))}. Choose one with {flag}")
        return wanted
    for choice in choices:
        if choice in columns:
            return choice
    raise ValueError(f"{name} has no {what} column ({' or '.join(map(repr, choices))}); available columns: "
                     f"{', '.join(map(repr, columns))}: rename the column, or name it with {flag}")


def _rows_from_table(source: Union[str, Path], words_column: Optional[str], tags_column: Optional[str],
                     encoding: Optional[str], split: Optional[str], prefer: Sequence[str]) -> tuple:
    from .sources import read_table
    from .labels import class_label_names

    table = read_table(source, split=split, encoding=encoding, prefer=prefer)
    words_col = _pick(table.columns, words_column, WORD_COLUMNS, "word-list", "--text-column", table.name)
    tags_col = _pick(table.columns, tags_column, TAG_COLUMNS, "tag-list", "--label-column", table.name)
    names = class_label_names(table.feature(tags_col))
    rows = [(row.get(words_col), row.get(tags_col)) for row in table.iter_rows([words_col, tags_col])]
    return table.name, rows, names, words_col, tags_col


def _check_row(name: str, row_no: int, words: Any, tags: Any, words_col: str, tags_col: str) -> None:
    for value, column, what in ((words, words_col, "words"), (tags, tags_col, "tags")):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{name}: row {row_no} column {column!r} is a {type(value).__name__} ({value!r:.40}), "
                             f"not a list of {what}: give a JSON list per row, e.g. [\"EU\", \"rejects\"]")
    bad = [w for w in words if not isinstance(w, str)]
    if bad:
        raise ValueError(f"{name}: row {row_no} has a non-text word {bad[0]!r} in column {words_col!r}: give every "
                         "word as a string")
    if len(words) != len(tags):
        raise ValueError(f"{name}: row {row_no} has {len(words)} words but {len(tags)} tags, so the tags do not match "
                         f"the words: give exactly one tag per word (columns {words_col!r} and {tags_col!r})")


def _tag_name(tag: Any, names: Optional[Sequence[str]], name: str, row_no: int) -> str:
    if isinstance(tag, bool) or not isinstance(tag, (int, str)):
        raise ValueError(f"{name}: row {row_no} has a tag {tag!r:.40} of type {type(tag).__name__}: give tag names "
                         "(B-PER) or integer ids")
    if isinstance(tag, str):
        return tag
    if names is None:
        raise ValueError(f"{name}: row {row_no} gives tag ids (e.g. {tag}) but the data names no tags: pass "
                         "--labels with the tag names in id order, e.g. --labels O,B-PER,I-PER")
    if not 0 <= tag < len(names):
        raise ValueError(f"{name}: row {row_no} has tag id {tag}, outside the {len(names)} tag names "
                         f"({','.join(names)}): fix the id, or give every tag name in id order with --labels")
    return str(names[tag])


def load_token_data(source: Union[str, Path], *, labels: Optional[Sequence[str]] = None,
                    words_column: Optional[str] = None, tags_column: Optional[str] = None,
                    encoding: Optional[str] = None, split: Optional[str] = None,
                    prefer: Sequence[str] = ("train",), known: str = "--labels") -> Rows:
    """Read token-classification rows from ``source`` (see the module docstring) as ``Rows`` of
    ``(words, tag names)`` with ``Rows.labels`` the tag names in id order."""
    path = Path(source)
    given = [str(label) for label in labels] if labels is not None else None
    if path.is_file() and path.suffix.lower() in CONLL_SUFFIXES:
        name, raw, names, words_col, tags_col = str(path), read_conll(path, encoding), None, "word", "tag"
    else:
        name, raw, names, words_col, tags_col = _rows_from_table(source, words_column, tags_column, encoding, split,
                                                                 prefer)
    id_names = given if given is not None else names
    items: list[tuple[list[str], list[str]]] = []
    dropped = 0
    for row_no, (words, tags) in enumerate(raw, start=1):
        _check_row(name, row_no, words, tags, words_col, tags_col)
        if not words:
            dropped += 1
            continue
        items.append((list(words), [_tag_name(t, id_names, name, row_no) for t in tags]))
    if not items:
        raise ValueError(f"{name} has no sentence with words: give at least one row of words and tags")
    seen = order_tags([t for _, tags in items for t in tags])
    if given is not None:
        unknown = [t for t in seen if t not in given]
        if unknown:
            row_no = next(i for i, (_, tags) in enumerate(items, start=1) if unknown[0] in tags)
            raise ValueError(f"{name}: tag(s) {', '.join(unknown)} (first in sentence {row_no}) are not among "
                             f"{known} ({','.join(given)}): add them to --labels, or fix the data")
        tag_names = given
    elif names is not None:
        tag_names = list(names)
    else:
        tag_names = seen
    return Rows(items, name, tag_names, dropped)
