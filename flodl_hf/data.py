"""Labelled text loading: CSV / TSV, JSON / JSON-lines and ``datasets`` saved on disk, into one small dataset type.

It exists so that every entry point (the CLI, scripts, tests) turns a user's file into ``(text, label_id)`` pairs
the same way, and fails on bad input with one message that names the file, the row or column, and the fix.

Decisions, stated once:

* Label names are sorted deterministically (numerically when every name is an integer, else as strings) unless
  ``labels`` is given, which fixes both the set and the order. Integer labels are taken as ids.
* Rows whose text is empty, whitespace-only or missing (an empty CSV cell, JSON ``null``) are **dropped**, not
  fatal: real corpora contain them and they carry no signal. The count is kept in ``TextDataset.dropped`` so
  callers can report it. A non-string text (a number, a list) is an error naming the row.
* ``limit`` keeps the first N usable rows, in file order.
* Row numbers in messages count data rows from 1 (a CSV header is not a row).
"""

from __future__ import annotations

import csv
import io
import json
import random
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

__all__ = ["TextDataset", "load_text_classification", "SUPPORTED_SUFFIXES"]

SUPPORTED_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".ndjson")
#: The most distinct labels a loaded dataset may hold (more means the label column is probably not labels).
MAX_LABELS = 10_000
_LABEL_FIX = "fix the row or pass the full label list with --labels"


class TextDataset:
    """Texts with integer label ids and the label names those ids index.

    Sized and indexable: ``ds[i] -> (text, label_id)``, which is what ``graph.set_data_loader`` and a head's
    ``collate`` expect.
    """

    def __init__(self, texts: Sequence[str], label_ids: Sequence[int], labels: Sequence[str],
                 *, source: str = "<memory>", dropped: int = 0) -> None:
        if len(texts) != len(label_ids):
            raise ValueError(f"{len(texts)} texts but {len(label_ids)} label ids: give one label per text")
        self.texts: list[str] = list(texts)
        self.label_ids: list[int] = [int(i) for i in label_ids]
        self.labels: list[str] = [str(label) for label in labels]
        self.source = source
        #: Rows skipped because their text was empty or missing.
        self.dropped = dropped
        for row, label_id in enumerate(self.label_ids, start=1):
            if not 0 <= label_id < len(self.labels):
                raise ValueError(f"{source}: row {row} has label id {label_id}, outside the {len(self.labels)} "
                                 f"known labels {self.labels}")

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> tuple[str, int]:
        return self.texts[index], self.label_ids[index]

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return iter(zip(self.texts, self.label_ids))

    def __repr__(self) -> str:
        return f"TextDataset({len(self)} rows, labels={self.labels}, source={self.source!r})"

    def label_counts(self) -> dict[str, int]:
        """Rows per label name, in label order (labels with no rows count 0)."""
        counts = [0] * len(self.labels)
        for label_id in self.label_ids:
            counts[label_id] += 1
        return dict(zip(self.labels, counts))

    def _take(self, indices: Iterable[int]) -> "TextDataset":
        indices = list(indices)
        return TextDataset([self.texts[i] for i in indices], [self.label_ids[i] for i in indices], self.labels,
                           source=self.source)

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


# --- reading -----------------------------------------------------------------------------------------------------

def _decode(raw: bytes, encoding: Optional[str], name: str) -> str:
    if encoding is not None:
        try:
            return raw.decode(encoding)
        except LookupError as exc:
            raise ValueError(f"unknown encoding {encoding!r}: pass --encoding a Python codec name such as utf-8 or "
                             "latin-1") from exc
        except UnicodeDecodeError as exc:
            raise ValueError(f"{name} is not valid {encoding} ({exc.reason} at byte {exc.start}): pass the file's "
                             "encoding with --encoding, or leave it out to try utf-8 then latin-1") from exc
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
        try:
            return raw.decode("utf-16")  # a byte-order mark says so
        except UnicodeDecodeError as exc:
            raise ValueError(f"{name} starts like UTF-16 but is not valid UTF-16 ({exc.reason}): save it as UTF-8, "
                             "or pass its encoding with --encoding") from exc
    if b"\x00" in raw[:4096]:
        raise ValueError(f"{name} holds NUL bytes, so it is binary or UTF-16/32 without a byte-order mark: save it "
                         "as UTF-8, or pass its encoding with --encoding (e.g. --encoding utf-16-le)")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        return raw.decode("latin-1")  # never fails: every byte is a latin-1 character


def _read_csv(text: str, delimiter: str, name: str) -> tuple[list[str], list[dict[str, Any]]]:
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
        columns = [c for c in (reader.fieldnames or []) if c is not None]
        rows = list(reader)
    except csv.Error as exc:
        raise ValueError(f"{name} is not a readable {'TSV' if delimiter == chr(9) else 'CSV'} file ({exc}): fix "
                         "the quoting or the line breaks, or save it as JSON-lines") from exc
    repeated = sorted({c for c in columns if columns.count(c) > 1})
    if repeated:
        raise ValueError(f"{name} has a header that repeats the column(s) {', '.join(map(repr, repeated))}, so "
                         "which one holds the data is ambiguous: give every column a distinct name")
    if len(columns) == 1 and ";" in columns[0] and delimiter == ",":
        raise ValueError(f"{name} looks semicolon-separated (its header is {columns[0][:60]!r}): flodl-hf reads "
                         "comma-separated .csv and tab-separated .tsv; save it with commas or tabs")
    return columns, rows


def _read_json(text: str, name: str, lines: bool) -> tuple[list[str], list[dict[str, Any]]]:
    if not lines:
        try:
            data = json.loads(text, object_pairs_hook=_distinct_keys(name)) if text.strip() else []
        except json.JSONDecodeError as exc:
            if exc.msg != "Extra data":
                raise ValueError(f"{name} is not valid JSON: {exc}") from exc
            lines = True  # one object per line in a .json file (what datasets' to_json writes)
        else:
            if isinstance(data, dict):
                # Column-oriented {"text": [...], "label": [...]} or {"data": [...]} / {"rows": [...]}.
                for key in ("data", "rows", "examples"):
                    if isinstance(data.get(key), list) and len(data) == 1:
                        data = data[key]
                        break
                else:
                    if data and all(isinstance(v, list) for v in data.values()):
                        lengths = {len(v) for v in data.values()}
                        if len(lengths) > 1:
                            raise ValueError(f"{name}: the columns have different lengths {sorted(lengths)}")
                        keys = list(data)
                        data = [dict(zip(keys, values)) for values in zip(*data.values())]
                    else:
                        raise ValueError(f"{name}: expected a list of objects, one per row, or an object of "
                                         "equal-length column lists")
            if not isinstance(data, list):
                raise ValueError(f"{name}: expected a list of objects, one per row")
            return _columns_of(data, name), data
    rows = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line, object_pairs_hook=_distinct_keys(f"{name}: line {line_no}")))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name}: line {line_no} is not valid JSON: {exc.msg}") from exc
    return _columns_of(rows, name), rows


def _distinct_keys(name: str) -> Any:
    """A ``json`` object hook that refuses a repeated key (json would silently keep the last value)."""
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        repeated = sorted({key for key in keys if keys.count(key) > 1})
        if repeated:
            raise ValueError(f"{name} has an object that repeats the key(s) {', '.join(map(repr, repeated))}, so "
                             "which value holds the data is ambiguous: give every field once")
        return dict(pairs)
    return hook


def _columns_of(rows: list, name: str) -> list[str]:
    columns: dict[str, None] = {}
    for row_no, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise ValueError(f"{name}: row {row_no} is a {type(row).__name__}, not an object with named fields")
        columns.update(dict.fromkeys(row))
    return list(columns)


def _read_saved_dataset(path: Path, split: Optional[str]) -> tuple[list[str], Any]:
    """Columns and row table of a ``datasets`` dataset saved on disk (one split of a ``DatasetDict``)."""
    try:
        import datasets
    except ImportError as exc:
        raise ValueError(f"{path} is a directory, which needs the `datasets` package to load: "
                         "pip install datasets (or give a CSV / JSON file)") from exc
    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError as exc:
        raise ValueError(f"{path} is a directory but not a dataset saved with save_to_disk: give a CSV / JSON "
                         "file or such a directory") from exc
    if isinstance(loaded, datasets.DatasetDict):
        splits = list(loaded)
        if split is None and len(splits) == 1:
            split = splits[0]
        if split not in loaded:
            raise ValueError(f"{path} holds splits {splits}: choose one with split=... (for example "
                             f"split={splits[0]!r}), or on the command line give its directory, e.g. --data "
                             f"{path / str(splits[0])}")
        loaded = loaded[split]
    return list(loaded.column_names), loaded


def _class_label_names(table: Any, column: str) -> Optional[list[str]]:
    feature = getattr(table, "features", {}).get(column) if hasattr(table, "features") else None
    names = getattr(feature, "names", None)
    return list(names) if names else None


def _natural_sorted(names: Iterable[str]) -> list[str]:
    names = list(names)
    if names and all(_is_int_text(n) for n in names):
        return sorted(names, key=int)
    return sorted(names)


def _is_int_text(text: str) -> bool:
    return text.lstrip("-").isdigit()


def _is_nan(label: Any) -> bool:
    if isinstance(label, float):
        return label != label
    return isinstance(label, str) and label.strip().lower() in ("nan", "na", "n/a", "null", "none")


def load_text_classification(path: Union[str, Path], *, text_column: str = "text", label_column: str = "label",
                             labels: Optional[Sequence[str]] = None, encoding: Optional[str] = None,
                             limit: Optional[int] = None, split: Optional[str] = None,
                             label_fix: str = _LABEL_FIX) -> TextDataset:
    """Load ``(text, label)`` rows from a CSV / TSV, JSON / JSON-lines file or a saved ``datasets`` directory.

    ``labels`` fixes the label names and their order (a row with another label raises); otherwise they are the
    distinct values sorted. ``encoding`` applies to text files (default: utf-8, falling back to latin-1).
    ``limit`` keeps the first N usable rows. ``split`` picks a split of a saved ``DatasetDict``. ``label_fix`` is
    the advice given with a row whose label is not among ``labels`` (callers name their own option).
    See the module docstring for what counts as a dropped row.
    """
    path = Path(path)
    name = str(path)
    if not path.exists():
        raise FileNotFoundError(f"data file not found: {path}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit={limit!r} is invalid: use an integer >= 1, or None for every row")
    if labels is not None:
        labels = [str(label) for label in labels]
        if not labels:
            raise ValueError("labels=[] is invalid: give at least one label name, or None to take them from the data")
        duplicates = sorted({label for label in labels if labels.count(label) > 1})
        if duplicates:
            raise ValueError(f"labels {labels} repeat {duplicates}: give each label name once (--labels)")

    if text_column == label_column:
        raise ValueError(f"the text column and the label column are both {text_column!r}: a model would train on "
                         "the answer; name two different columns with --text-column and --label-column")
    class_names: Optional[list[str]] = None
    if path.is_dir():
        columns, table = _read_saved_dataset(path, split)
        class_names = _class_label_names(table, label_column)
    else:
        suffix = path.suffix.lower()
        if suffix not in SUPPORTED_SUFFIXES:
            raise ValueError(f"unsupported data file {path.name!r}: use one of {', '.join(SUPPORTED_SUFFIXES)} "
                             "or a directory written by datasets' save_to_disk")
        text = _decode(path.read_bytes(), encoding, name)
        if suffix in (".csv", ".tsv"):
            columns, table = _read_csv(text, "\t" if suffix == ".tsv" else ",", name)
        else:
            columns, table = _read_json(text, name, lines=suffix != ".json")

    if len(table) == 0:
        raise ValueError(f"{name} has no data rows: give a file with a header and at least one labelled row")
    for column, kind, flag in ((text_column, "text", "text_column / --text-column"),
                               (label_column, "label", "label_column / --label-column")):
        if column not in columns:
            raise ValueError(f"{name} has no {kind} column {column!r}; available columns: "
                             f"{', '.join(map(repr, columns))}. Choose one with {flag}")

    texts: list[str] = []
    raw_labels: list[Any] = []
    row_numbers: list[int] = []
    blank: list[int] = []
    nan_rows: list[int] = []
    dropped = 0
    rows = table if not hasattr(table, "select_columns") else table.select_columns([text_column, label_column])
    for row_no, row in enumerate(rows, start=1):
        value = row.get(text_column)
        if value is None or (isinstance(value, str) and not value.strip()):
            dropped += 1
            continue
        if not isinstance(value, str):
            raise ValueError(f"{name}: row {row_no} has a {type(value).__name__} ({value!r:.40}) in text column "
                             f"{text_column!r}; every text must be a string")
        label = row.get(label_column)
        if label is None or (isinstance(label, str) and not label.strip()):
            blank.append(row_no)
            continue
        if _is_nan(label):
            nan_rows.append(row_no)
            continue
        if isinstance(label, bool) or not isinstance(label, (str, int)):
            raise ValueError(f"{name}: row {row_no} has a {type(label).__name__} label ({label!r:.40}) in column "
                             f"{label_column!r}; use a string name or an integer id")
        texts.append(value)
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

    label_ids, names = _map_labels(raw_labels, row_numbers, labels, class_names, name, label_column, label_fix)
    return TextDataset(texts, label_ids, names, source=name, dropped=dropped)


def _rows_text(rows: list[int], limit: int = 10) -> str:
    """``row 3 has`` / ``rows 3, 7 and 12 more have``."""
    if len(rows) == 1:
        return f"row {rows[0]} has"
    shown = ", ".join(str(r) for r in rows[:limit])
    return f"rows {shown}" + (f" and {len(rows) - limit} more" if len(rows) > limit else "") + " have"


def _map_labels(raw: list[Any], row_numbers: list[int], labels: Optional[list[str]],
                class_names: Optional[list[str]], name: str, column: str,
                label_fix: str = _LABEL_FIX) -> tuple[list[int], list[str]]:
    """Label ids and names.

    Without given names, the names are the distinct values seen, sorted (integers numerically), so integer labels
    ``0/5/100`` give three labels; memory follows the rows, never a label's value. With given names (``labels`` or
    a saved dataset's ``ClassLabel``), integer labels are ids into them unless every name is itself an integer,
    in which case they match by name.
    """
    kinds = {type(v) for v in raw}
    names = labels or class_names
    if kinds == {int} and names is not None and not all(_is_int_text(str(n)) for n in names):
        for row_no, value in zip(row_numbers, raw):
            if not 0 <= value < len(names):
                raise ValueError(f"{name}: row {row_no} has label id {value}, outside the "
                                 f"{len(names)} known labels {list(names)}")
        return list(raw), list(names)
    if kinds == {int} and names is None and min(raw) < 0:
        raise ValueError(f"{name}: column {column!r} holds the negative label id {min(raw)}; integer labels must "
                         "be >= 0 (or use label names)")
    # Strings (or integers, compared by their text as a CSV would give them).
    texts = [str(v) for v in raw]
    if names is None:
        distinct = set(texts)
        if len(distinct) > MAX_LABELS:
            raise ValueError(f"{name}: column {column!r} holds {len(distinct)} distinct labels, more than the "
                             f"{MAX_LABELS} a classifier here may have: is {column!r} the label column? Choose "
                             "another with --label-column")
        names = _natural_sorted(distinct)
    index = {label: i for i, label in enumerate(names)}
    ids = []
    for row_no, value in zip(row_numbers, texts):
        if value not in index:
            raise ValueError(f"{name}: row {row_no} has label {value!r}, which is not one of the "
                             f"known labels {list(names)}; {label_fix}")
        ids.append(index[value])
    return ids, list(names)
