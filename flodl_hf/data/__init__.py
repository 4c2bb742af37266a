"""Labelled text loading: every source ``flodl_hf.data.sources`` reads, into one small dataset type.

It exists so that every entry point (the CLI, scripts, tests) turns a user's data into training items the same
way, and fails on bad input with one message that names the source, the row or column, and the fix. Reading files,
splits and Hub ids is ``flodl_hf.data.sources``' job; matching labels by name is ``flodl_hf.data.labels``'.

Decisions, stated once:

* Problem types: ``single_label`` (one class per row: ids), ``multi_label`` (a set of classes per row: a list of
  names or ids, or a comma-separated string) and ``regression`` (a number per row).
* Label names are sorted deterministically (numerically when every name is an integer, else as strings) unless
  ``labels`` is given, which fixes both the set and the order; ``ClassLabel`` ids are matched through their names.
* Rows whose text is empty, whitespace-only or missing (an empty CSV cell, JSON ``null``) are **dropped**, not
  fatal: real corpora contain them and they carry no signal. The count is kept in ``TextDataset.dropped`` so
  callers can report it. A non-string text (a number, a list) is an error naming the row; so is a missing or
  non-string second text of a pair (``text_pair_column``).
* ``limit`` keeps the first N usable rows, in file order.
* Row numbers in messages count data rows from 1 (a CSV header is not a row).
"""

from __future__ import annotations

import operator
import random
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

from .sources import SUPPORTED_SUFFIXES, read_table
from .labels import MAX_LABELS, class_label_names, map_multi_labels, map_single_labels, regression_targets

__all__ = ["TextDataset", "load_text_classification", "SUPPORTED_SUFFIXES", "PROBLEM_TYPES", "MAX_LABELS"]

#: The problem types a dataset (and ``--problem-type``) may have.
PROBLEM_TYPES = ("single_label", "multi_label", "regression")
_LABEL_FIX = "fix the row or pass the full label list with --labels"


def check_problem_type(problem_type: Any) -> str:
    if problem_type not in PROBLEM_TYPES:
        raise ValueError(f"problem type {problem_type!r} is invalid: use one of {', '.join(PROBLEM_TYPES)} "
                         "(--problem-type)")
    return str(problem_type)


class TextDataset:
    """Texts (and optional second texts of pairs) with targets and the label names those targets index.

    ``label_ids`` holds one target per row: a label id (``single_label``), a sorted tuple of label ids
    (``multi_label``) or a float (``regression``, where ``labels`` is empty). Sized and indexable, as
    ``graph.set_data_loader`` and a head's ``collate`` expect: ``ds[i]`` is ``(text, target)`` for single texts,
    ``{"text", "text_pair", "label"}`` for pairs; a multi-label target is a multi-hot list of floats. Texts must
    be strings and label ids integers (a float, bool or str id is refused rather than truncated by ``int``).
    """

    def __init__(self, texts: Sequence[str], label_ids: Sequence[Any], labels: Sequence[str],
                 *, source: str = "<memory>", dropped: int = 0, text_pairs: Optional[Sequence[str]] = None,
                 problem_type: str = "single_label") -> None:
        if len(texts) != len(label_ids):
            raise ValueError(f"{len(texts)} texts but {len(label_ids)} label ids: give one label per text")
        if text_pairs is not None and len(text_pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(text_pairs)} second texts: give one pair per text")
        self.problem_type = check_problem_type(problem_type)
        self.texts: list[str] = _strings(texts, "text", source)
        self.text_pairs: Optional[list[str]] = None if text_pairs is None else _strings(text_pairs, "second text",
                                                                                          source)
        self.labels: list[str] = _label_names(labels, self.problem_type)
        self.source = source
        #: Rows skipped because their text was empty or missing.
        self.dropped = dropped
        if self.problem_type == "regression":
            self.label_ids: list[Any] = [float(v) for v in label_ids]
            return
        if self.problem_type == "multi_label":
            self.label_ids = [tuple(sorted({_label_id(i, row, source) for i in _id_set(ids, row, source)}))
                              for row, ids in enumerate(label_ids, start=1)]
            checked = [(row, i) for row, ids in enumerate(self.label_ids, start=1) for i in ids]
        else:
            self.label_ids = [_label_id(i, row, source) for row, i in enumerate(label_ids, start=1)]
            checked = list(enumerate(self.label_ids, start=1))
        for row, label_id in checked:
            if not 0 <= label_id < len(self.labels):
                raise ValueError(f"{source}: row {row} has label id {label_id}, outside the {len(self.labels)} "
                                 f"known labels {self.labels}")

    def __len__(self) -> int:
        return len(self.texts)

    def target(self, index: int) -> Any:
        """The training target of row ``index``: an id, a multi-hot list of floats, or a float."""
        value = self.label_ids[index]
        if self.problem_type == "multi_label":
            hot = [0.0] * len(self.labels)
            for i in value:
                hot[i] = 1.0
            return hot
        return value

    def __getitem__(self, index: int) -> Any:
        if self.text_pairs is not None:
            return {"text": self.texts[index], "text_pair": self.text_pairs[index], "label": self.target(index)}
        return self.texts[index], self.target(index)

    def __iter__(self) -> Iterator[Any]:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        pairs = ", pairs" if self.text_pairs is not None else ""
        return (f"TextDataset({len(self)} rows, {self.problem_type}{pairs}, labels={self.labels}, "
                f"source={self.source!r})")

    def label_counts(self) -> dict[str, int]:
        """Rows per label name, in label order (labels with no rows count 0); empty for regression."""
        counts = [0] * len(self.labels)
        for value in self.label_ids:
            if self.problem_type == "multi_label":
                for label_id in value:
                    counts[label_id] += 1
            elif self.problem_type == "single_label":
                counts[value] += 1
        return dict(zip(self.labels, counts))

    def _take(self, indices: Iterable[int]) -> "TextDataset":
        indices = list(indices)
        pairs = None if self.text_pairs is None else [self.text_pairs[i] for i in indices]
        return TextDataset([self.texts[i] for i in indices], [self.label_ids[i] for i in indices], self.labels,
                           source=self.source, text_pairs=pairs, problem_type=self.problem_type)

    def split(self, eval_size: Union[float, int], seed: int = 0) -> tuple["TextDataset", "TextDataset"]:
        """Seeded random ``(train, eval)`` split (not stratified).

        ``eval_size`` is a fraction in (0, 1) of the rows, or a row count >= 1 that leaves at least one row to
        train on. The same ``seed`` gives the same split on every machine and every rank.
        """
        n = len(self)
        if isinstance(eval_size, bool) or not isinstance(eval_size, (int, float)):
            raise ValueError(f"eval_size={eval_size!r} is invalid: give a fraction in (0, 1) or a row count")
        if isinstance(eval_size, float):
            if not 0.0 < eval_size < 1.0:
                raise ValueError(f"eval_size={eval_size!r} is invalid: a fraction must be in (0, 1), e.g. 0.2")
            n_eval = max(1, round(n * eval_size))
        else:
            n_eval = eval_size
        if not 1 <= n_eval < n:
            raise ValueError(f"cannot hold out {n_eval} of {n} rows for evaluation: give between 1 and {n - 1} "
                             "(at least one row must remain for training)")
        order = list(range(n))
        random.Random(seed).shuffle(order)
        return self._take(sorted(order[n_eval:])), self._take(sorted(order[:n_eval]))

    def subset(self, n: int, seed: int = 0) -> "TextDataset":
        """``n`` rows drawn at random with ``seed`` (kept in file order); every row when ``n >= len(self)``."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"subset size n={n!r} is invalid: use an integer >= 1")
        if n >= len(self):
            return self._take(range(len(self)))
        order = list(range(len(self)))
        random.Random(seed).shuffle(order)
        return self._take(sorted(order[:n]))


def _strings(texts: Sequence[Any], what: str, source: str) -> list[str]:
    """``texts`` as a list, every item a str: a number or None would reach the tokenizer as garbage or crash it."""
    texts = list(texts)
    for row, text in enumerate(texts, start=1):
        if not isinstance(text, str):
            raise ValueError(f"{source}: {what} {row} is a {type(text).__name__} ({text!r:.40}), not a string: give "
                             f"every {what} as a str")
    return texts


def _label_id(value: Any, row: int, source: str) -> int:
    """``value`` as a label id: an integer (numpy and torch integers too); a float, bool or str is refused, since
    ``int()`` would silently truncate 1.9 to class 1 or turn True into class 1."""
    if not isinstance(value, (bool, str, bytes, float)) and type(value).__name__ not in ("bool_", "bool"):
        try:
            return int(operator.index(value))
        except TypeError:
            pass
    raise ValueError(f"{source}: row {row} has label id {value!r:.40} (a {type(value).__name__}): a label id is an "
                     "integer index into the label names; give integers (or load the data with "
                     "load_text_classification, which maps names to ids)")


def _id_set(ids: Any, row: int, source: str) -> list[Any]:
    """The ids of one multi-label row (an iterable of ids, not a string)."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise ValueError(f"{source}: row {row} has the multi-label target {ids!r:.40} (a {type(ids).__name__}): "
                         "give each row a list of integer label ids, e.g. [0, 2]")
    return list(ids)


# --- loading -------------------------------------------------------------------------------------------------------

def _label_names(labels: Any, problem_type: str) -> list[str]:
    """``TextDataset``'s ``labels``, checked: a list of distinct names (one string would be split into letters)."""
    if isinstance(labels, (str, bytes)) or not hasattr(labels, "__iter__"):
        kind = "string" if isinstance(labels, (str, bytes)) else type(labels).__name__
        raise ValueError(f"TextDataset labels={labels!r:.60} is one {kind}: pass a list of label names, e.g. "
                         "['neg', 'pos']")
    names = [str(label) for label in labels]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"TextDataset labels {names!r:.80} repeat {repeated!r:.40}: give each label name once")
    if problem_type == "regression" and names:
        raise ValueError(f"TextDataset labels {names!r:.80} name classes, but a regression has none: pass labels=[]")
    return names


def _is_nan(label: Any) -> bool:
    if isinstance(label, float):
        return label != label
    return isinstance(label, str) and label.strip().lower() in ("nan", "na", "n/a", "null", "none")


def _check_labels_arg(labels: Optional[Sequence[str]]) -> Optional[list[str]]:
    if labels is None:
        return None
    if isinstance(labels, (str, bytes)) or not hasattr(labels, "__iter__"):
        kind = "string" if isinstance(labels, (str, bytes)) else type(labels).__name__
        raise ValueError(f"labels={labels!r:.60} is one {kind}: pass a list of label names, e.g. "
                         "['neg', 'pos'] (the command line's --labels neg,pos is split at the commas for you)")
    labels = [str(label) for label in labels]
    if not labels:
        raise ValueError("labels=[] is invalid: give at least one label name, or None to take them from the data")
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise ValueError(f"labels {labels} repeat {duplicates}: give each label name once (--labels)")
    return labels


def load_text_classification(path: Union[str, Path, Any], *, text_column: str = "text", label_column: str = "label",
                             labels: Optional[Sequence[str]] = None, encoding: Optional[str] = None,
                             limit: Optional[int] = None, split: Optional[str] = None,
                             label_fix: str = _LABEL_FIX, text_pair_column: Optional[str] = None,
                             problem_type: str = "single_label", prefer_splits: Sequence[str] = ("train",),
                             split_option: str = "--split", known: str = "the known labels") -> TextDataset:
    """Load labelled rows from a file, a saved ``datasets`` directory, a Hub dataset id or an in-memory
    ``datasets.Dataset`` / ``DatasetDict`` (``flodl_hf.data.sources``).

    ``labels`` fixes the label names and their order; labels of the data are matched to them *by name* (a
    ``ClassLabel`` id through its own names); a name not among them raises, naming every unknown name. Without
    ``labels`` they are the data's ``ClassLabel`` names, else its distinct values sorted. ``encoding`` applies to
    text files (default: utf-8, falling back to latin-1). ``limit`` keeps the first N usable rows. ``split`` picks
    a split (default: the first of ``prefer_splits`` present, else the only one). ``text_pair_column`` names the
    column of the second text of sentence pairs. ``label_fix`` / ``known`` / ``split_option`` word the messages
    for the caller's options. See the module docstring for problem types and dropped rows.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit={limit!r} is invalid: use an integer >= 1, or None for every row")
    problem_type = check_problem_type(problem_type)
    labels = _check_labels_arg(labels)
    if text_column == label_column:
        raise ValueError(f"the text column and the label column are both {text_column!r}: a model would train on "
                         "the answer; name two different columns with --text-column and --label-column")
    columns_used = [text_column, label_column] + ([text_pair_column] if text_pair_column else [])
    for i, column in enumerate(columns_used):
        if column in columns_used[:i]:
            raise ValueError(f"the column {column!r} is named twice among --text-column, --label-column and "
                             "--text-pair-column: a model would train on the answer or on one text twice; name "
                             "distinct columns")
    table = read_table(path, split=split, encoding=encoding, prefer=prefer_splits, option=split_option)
    name, columns = table.name, table.columns
    if len(table) == 0:
        raise ValueError(f"{name} has no data rows: give a file with a header and at least one labelled row")
    for column, kind, flag in ((text_column, "text", "text_column / --text-column"),
                               (label_column, "label", "label_column / --label-column"),
                               (text_pair_column, "text-pair", "--text-pair-column")):
        if column is not None and column not in columns:
            raise ValueError(f"{name} has no {kind} column {column!r}; available columns: "
                             f"{', '.join(map(repr, columns))}. Choose one with {flag}")

    texts: list[str] = []
    pairs: list[str] = []
    raw_labels: list[Any] = []
    row_numbers: list[int] = []
    blank: list[int] = []
    nan_rows: list[int] = []
    dropped = 0
    for row_no, row in enumerate(table.iter_rows(columns_used), start=1):
        value = row.get(text_column)
        if value is None or (isinstance(value, str) and not value.strip()):
            dropped += 1
            continue
        if not isinstance(value, str):
            raise ValueError(f"{name}: row {row_no} has a {type(value).__name__} ({value!r:.40}) in text column "
                             f"{text_column!r}; every text must be a string")
        if text_pair_column is not None:
            second = row.get(text_pair_column)
            if not isinstance(second, str) or not second.strip():
                what = "no text" if second is None or isinstance(second, str) else \
                    f"a {type(second).__name__} ({second!r:.40})"
                raise ValueError(f"{name}: row {row_no} has {what} in text-pair column {text_pair_column!r}; every "
                                 "pair needs a second text (a string): fix the row, or choose the column with "
                                 "--text-pair-column")
        label = row.get(label_column)
        if label is None or (isinstance(label, str) and not label.strip()):
            blank.append(row_no)
            continue
        if _is_nan(label):
            nan_rows.append(row_no)
            continue
        if problem_type == "single_label" and (isinstance(label, bool) or not isinstance(label, (str, int))):
            raise ValueError(f"{name}: row {row_no} has a {type(label).__name__} label ({label!r:.40}) in column "
                             f"{label_column!r}; use a string name or an integer id (or --problem-type "
                             "regression for numbers, multi_label for lists)")
        if problem_type != "regression":
            _check_label_digits(label, name, row_no, label_column)
        texts.append(value)
        if text_pair_column is not None:
            pairs.append(second)
        raw_labels.append(label.strip() if isinstance(label, str) else label)
        row_numbers.append(row_no)
        if limit is not None and len(texts) >= limit:
            break
    if blank:
        raise ValueError(f"{name}: {_rows_text(blank)} no label in column {label_column!r}: give every "
                         "row a label, or remove those rows")
    if nan_rows:
        raise ValueError(f"{name}: {_rows_text(nan_rows)} the label NaN in column {label_column!r} (a "
                         "missing value): give every row a real label, or remove those rows")
    if not texts:
        raise ValueError(f"{name} has no rows with text in column {text_column!r} ({dropped} empty rows)")

    class_names = class_label_names(table.feature(label_column))
    if problem_type == "regression":
        targets: list[Any] = regression_targets(raw_labels, row_numbers, name, label_column)
        names: list[str] = []
    elif problem_type == "multi_label":
        targets, names = map_multi_labels(raw_labels, row_numbers, labels, class_names, name, label_column,
                                          label_fix, known)
    else:
        targets, names = map_single_labels(raw_labels, row_numbers, labels, class_names, name, label_column,
                                           label_fix, known)
    return TextDataset(texts, targets, names, source=name, dropped=dropped,
                       text_pairs=pairs if text_pair_column is not None else None, problem_type=problem_type)


def _check_label_digits(label: Any, name: str, row_no: int, column: str) -> None:
    """Refuse an integer label too long for Python to convert (``sys.get_int_max_str_digits``): labels are
    sorted and matched as integers, and Python's own error names no file, no row and a Python setting as the fix."""
    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
    parts = label.split(",") if isinstance(label, str) else label if isinstance(label, (list, tuple)) else []
    for part in parts:
        digits = part.strip().lstrip("-") if isinstance(part, str) else ""
        if limit and len(digits) > limit and digits.isdigit():
            raise ValueError(f"{name}: row {row_no} has a label of {len(digits)} digits ({digits[:20]}...) in column "
                             f"{column!r}, more than the {limit} Python converts: no class id is that long; is "
                             f"{column!r} the label column? Choose another with --label-column, or fix the row")


def _rows_text(rows: list[int], limit: int = 10) -> str:
    """``row 3 has`` / ``rows 3, 7 and 12 more have``."""
    if len(rows) == 1:
        return f"row {rows[0]} has"
    shown = ", ".join(str(r) for r in rows[:limit])
    return f"rows {shown}" + (f" and {len(rows) - limit} more" if len(rows) > limit else "") + " have"
