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

The IOB2 rule (:func:`check_iob_spelling`), on every path that reads tags (train, ``--eval-data``, ``eval``): tags
*look IOB* when one of them (or of ``--labels``) is a ``B`` or an ``I``, in either case, then a hyphen or an
underscore and a type (``B-PER``, ``i_per``). Then every tag must be ``O``,
``B-TYPE`` or ``I-TYPE`` exactly: the prefix a capital ``B`` or ``I``, a hyphen, a type of no whitespace. Anything
else (``B_POS``, ``b-pos``, ``X-POS``, ``S-POS``, ``o``, ``B-``) is refused naming the first row that holds it,
rather than becoming one more class that silently removes entity scores from the whole run. Tags that do not look
IOB at all (part-of-speech tags such as ``NN``, ``ADJ``) are accepted and scored by word accuracy.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from .rows import Rows

__all__ = ["load_token_data", "read_conll", "CONLL_SUFFIXES", "WORD_COLUMNS", "TAG_COLUMNS", "order_tags",
           "check_iob_spelling", "iob_spelling_fix"]

CONLL_SUFFIXES = (".conll", ".iob", ".iob2", ".bio", ".txt")
WORD_COLUMNS = ("words", "tokens")
TAG_COLUMNS = ("tags", "ner_tags")


def order_tags(names: Sequence[str]) -> list[str]:
    """``O`` first, then the other tag names sorted (so B-X sits before I-X)."""
    distinct = sorted(set(names))
    return (["O"] if "O" in distinct else []) + [n for n in distinct if n != "O"]


_IOB = re.compile(r"[BI]-\S+")
_IOB_LIKE = re.compile(r"([BbIiEeSsLlUu])[-_.](\S*)")


_IOB_ANY = re.compile(r"[BbIi][-_]\S+")


def _looks_iob(tag: str) -> bool:
    return _IOB.fullmatch(tag) is not None


def iob_spelling_fix(tag: str, spelt: Optional[dict] = None) -> Optional[str]:
    """None when ``tag`` is spelt as IOB2 (``O``, ``B-TYPE``, ``I-TYPE``), else what to write instead (``spelt``:
    well-spelt tags by their lower case, preferred as the fix)."""
    if tag == "O" or _looks_iob(tag):
        return None
    if tag.strip().upper() == "O":
        return "O"
    found = _IOB_LIKE.fullmatch(tag.strip())
    if found and found.group(2) and found.group(1) in "BbIi":
        wanted = f"{found.group(1).upper()}-{found.group(2)}"
        return (spelt or {}).get(wanted.lower(), wanted)
    if found and found.group(2):
        kind = found.group(2)
        return f"B-{kind} or I-{kind} (IOB2; convert IOBES: S-X to B-X, E-X and L-X to I-X)"
    return "O, B-TYPE or I-TYPE"


def check_iob_spelling(first_rows: dict, name: str, given: Optional[Sequence[str]] = None,
                       known: str = "--labels") -> None:
    """Refuse tags that break the IOB2 rule (see the module docstring). ``first_rows``: tag -> the first row
    (1-based) holding it; ``given``: tag names the user typed (``known``), checked by the same rule."""
    names = list(given or ())
    if not any(_IOB_ANY.fullmatch(str(t)) for t in [*first_rows, *names]):
        return
    spelt = {str(t).lower(): str(t) for t in [*first_rows, *names] if _looks_iob(str(t))}
    for tag, row_no in sorted(first_rows.items(), key=lambda item: item[1]):
        fix = iob_spelling_fix(str(tag), spelt)
        if fix is not None:
            raise ValueError(f"{name}: the tags look IOB, but row {row_no} has the tag {tag!r:.40}, which is not "
                             f"IOB2 (O, B-TYPE or I-TYPE: a capital B or I, a hyphen, the type): write it as {fix}, "
                             "or fix the data")
    for tag in names:
        fix = iob_spelling_fix(tag, spelt)
        if fix is not None:
            raise ValueError(f"the tags look IOB, but {known} names the tag {tag!r:.40}, which is not IOB2 (O, "
                             f"B-TYPE or I-TYPE: a capital B or I, a hyphen, the type): write it as {fix}")


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
    first_rows: dict[str, int] = {}
    dropped = 0
    for row_no, (words, tags) in enumerate(raw, start=1):
        _check_row(name, row_no, words, tags, words_col, tags_col)
        if not words:
            dropped += 1
            continue
        names_of_row = [_tag_name(t, id_names, name, row_no) for t in tags]
        for tag in names_of_row:
            first_rows.setdefault(tag, row_no)
        items.append((list(words), names_of_row))
    if not items:
        raise ValueError(f"{name} has no sentence with words: give at least one row of words and tags")
    check_iob_spelling(first_rows, name, given if known == "--labels" else None, known)
    seen = order_tags([t for _, tags in items for t in tags])
    if given is not None:
        unknown = [t for t in seen if t not in given]
        if unknown:
            row_no = next(i for i, (_, tags) in enumerate(items, start=1) if unknown[0] in tags)
            fix = "add them to --labels, or fix the data" if known == "--labels" else "fix the data"
            raise ValueError(f"{name}: tag(s) {', '.join(unknown)} (first in sentence {row_no}) are not among "
                             f"{known} ({','.join(given)}): {fix}")
        tag_names = given
    elif names is not None:
        tag_names = list(names)
    else:
        tag_names = seen
    return Rows(items, name, tag_names, dropped)
