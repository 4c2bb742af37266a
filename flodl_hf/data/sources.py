"""Where labelled rows come from: local files of every common format, saved ``datasets`` directories and Hub
dataset ids, with their splits, as one small :class:`Table`.

It exists so that ``flodl_hf.data`` deals only with turning rows into texts and labels, while everything about
*finding and reading* a source lives here, once, for every entry point (``train --data``, ``--eval-data``,
``eval --data``):

* CSV / TSV / JSON / JSON-lines are read by flodl-hf's own strict readers (encoding detection, repeated header
  columns or JSON keys refused, semicolon files named; a CSV row with more or fewer fields than the header, JSON
  nested beyond Python's recursion limit and an integer too long to convert refused naming the row), because
  ``datasets``' readers guess silently. CSV fields may be of any length (csv's 128 KiB limit is lifted).
* parquet and arrow files, saved ``Dataset`` / ``DatasetDict`` directories and Hub dataset ids go through
  ``datasets`` / ``pyarrow``, so ``ClassLabel`` names travel with the rows (labels are then matched by name).
  Parquet and arrow files are read in memory (no cache directory is written).
* A source that is not an existing path, has no file suffix and looks like ``name`` or ``owner/name`` is taken as
  a Hub dataset id and loaded with ``datasets.load_dataset`` (which needs the network or its cache).
* Splits: a file or a saved ``Dataset`` has one split, ``train``. Without ``split``, the first of ``prefer``
  present is used, else the only split; a split that does not exist is refused naming the available ones.
"""

from __future__ import annotations

import csv
import io
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, Union

__all__ = ["Table", "read_table", "looks_like_hub_id", "pick_split", "load_json", "TEXT_SUFFIXES",
           "ARROW_SUFFIXES", "SUPPORTED_SUFFIXES"]

TEXT_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".ndjson")
ARROW_SUFFIXES = (".parquet", ".arrow")
SUPPORTED_SUFFIXES = TEXT_SUFFIXES + ARROW_SUFFIXES
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_DATASETS_HINT = "pip install datasets (or give a CSV / JSON file)"


@dataclass
class Table:
    """Rows of one split of a source: ``rows`` is a list of dicts or a ``datasets.Dataset``."""

    name: str
    """How messages name the source (a path, ``path[split]`` or ``hub:id[split]``)."""
    columns: list[str]
    rows: Any
    features: Optional[Any] = None
    """``datasets.Features`` when the source has them (saved datasets, parquet / arrow written by datasets)."""
    hub_id: Optional[str] = None
    splits: list[str] = field(default_factory=lambda: ["train"])
    split: str = "train"

    def __len__(self) -> int:
        return len(self.rows)

    def feature(self, column: str) -> Any:
        return None if self.features is None else self.features.get(column)

    def iter_rows(self, columns: Sequence[str]) -> Iterator[dict[str, Any]]:
        """The rows, reduced to ``columns`` (cheap on a ``datasets.Dataset``)."""
        if hasattr(self.rows, "select_columns"):
            return iter(self.rows.select_columns(list(columns)))
        return iter(self.rows)


def looks_like_hub_id(source: Union[str, Path]) -> bool:
    """True when ``source`` is not an existing path, has no file suffix and reads as ``name`` or ``owner/name``."""
    text = str(source)
    return not Path(text).exists() and not Path(text).suffix and bool(_HUB_ID.match(text))


def pick_split(available: Sequence[str], split: Optional[str], name: str, prefer: Sequence[str] = ("train",),
               option: str = "--split") -> str:
    """The split to use (see the module docstring); ValueError naming the available splits otherwise."""
    available = [str(s) for s in available]
    if split is not None:
        if split not in available:
            raise ValueError(f"{name} has no split {split!r}; available splits: {', '.join(available)}. Choose one "
                             f"with {option}")
        return split
    for preferred in prefer:
        if preferred in available:
            return preferred
    if len(available) == 1:
        return available[0]
    raise ValueError(f"{name} holds splits {available}: choose one with {option} (for example {option} "
                     f"{available[0]})")


def read_table(source: Union[str, Path], *, split: Optional[str] = None, encoding: Optional[str] = None,
               prefer: Sequence[str] = ("train",), option: str = "--split") -> Table:
    """Read one split of ``source`` (a file, a saved ``datasets`` directory, a Hub dataset id, or an in-memory
    ``datasets.Dataset`` / ``DatasetDict``)."""
    if _in_memory(source):
        return _from_dataset_dict(source, f"the in-memory {type(source).__name__}", split, prefer, option)
    path = Path(source)
    if not path.exists():
        if looks_like_hub_id(source):
            return _read_hub(str(source), split, prefer, option)
        raise FileNotFoundError(f"data file not found: {path}: give an existing file, a saved datasets directory or "
                                "a Hub dataset id with --data")
    name = str(path)
    if path.is_dir():
        return _read_saved_dataset(path, split, prefer, option)
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise ValueError(f"unsupported data file {path.name!r}: use one of {', '.join(SUPPORTED_SUFFIXES)}, a "
                         "directory written by datasets' save_to_disk, or a Hub dataset id")
    pick_split(["train"], split, name, prefer, option)
    if suffix in ARROW_SUFFIXES:
        dataset = _read_arrow(path, suffix)
        return Table(name, list(dataset.column_names), dataset, features=dataset.features)
    text = _decode(path.read_bytes(), encoding, name)
    if suffix in (".csv", ".tsv"):
        columns, rows = _read_csv(text, "\t" if suffix == ".tsv" else ",", name)
    else:
        columns, rows = _read_json(text, name, lines=suffix != ".json")
    return Table(name, columns, rows)


def _in_memory(source: Any) -> bool:
    """A ``datasets.Dataset`` or ``DatasetDict`` object (checked without importing datasets for paths)."""
    if isinstance(source, (str, Path)) or not type(source).__module__.startswith("datasets"):
        return False
    datasets = _datasets()
    return isinstance(source, (datasets.Dataset, datasets.DatasetDict))


def _datasets() -> Any:
    try:
        import datasets
    except ImportError as exc:
        raise ValueError(f"this data source needs the `datasets` package: {_DATASETS_HINT}") from exc
    return datasets


def _read_arrow(path: Path, suffix: str) -> Any:
    datasets = _datasets()
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            return datasets.Dataset(pq.read_table(str(path)))
        try:
            return datasets.Dataset.from_file(str(path))  # the arrow stream format datasets writes
        except Exception:  # noqa: BLE001 - try the arrow IPC file (Feather v2) format next
            import pyarrow.ipc

            with pyarrow.ipc.open_file(str(path)) as reader:
                return datasets.Dataset(reader.read_all())
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets one line
        kind = "parquet" if suffix == ".parquet" else "arrow"
        raise ValueError(f"{path} is not a readable {kind} file ({type(exc).__name__}: {str(exc)[:120]}): re-save "
                         f"it (e.g. Dataset.to_parquet), or give a CSV / JSON-lines file") from exc


def _from_dataset_dict(loaded: Any, name: str, split: Optional[str], prefer: Sequence[str], option: str,
                       hub_id: Optional[str] = None) -> Table:
    datasets = _datasets()
    if isinstance(loaded, datasets.DatasetDict):
        splits = list(loaded)
        chosen = pick_split(splits, split, name, prefer, option)
        dataset = loaded[chosen]
    else:
        splits, chosen = ["train"], pick_split(["train"], split, name, prefer, option)
        dataset = loaded
    shown = f"{name}[{chosen}]" if len(splits) > 1 else name
    return Table(shown, list(dataset.column_names), dataset, features=dataset.features, hub_id=hub_id,
                 splits=splits, split=chosen)


def _read_saved_dataset(path: Path, split: Optional[str], prefer: Sequence[str], option: str) -> Table:
    """One split of a ``datasets`` dataset saved on disk with ``save_to_disk``."""
    try:
        import datasets
    except ImportError as exc:
        raise ValueError(f"{path} is a directory, which needs the `datasets` package to load: "
                         f"{_DATASETS_HINT}") from exc
    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError as exc:
        raise ValueError(f"{path} is a directory but not a dataset saved with save_to_disk: give a CSV / JSON "
                         "file or such a directory") from exc
    return _from_dataset_dict(loaded, str(path), split, prefer, option)


def _read_hub(hub_id: str, split: Optional[str], prefer: Sequence[str], option: str) -> Table:
    """A Hub dataset id, through ``datasets.load_dataset`` (network or the datasets cache)."""
    datasets = _datasets()
    try:
        loaded = datasets.load_dataset(hub_id)
    except Exception as exc:  # noqa: BLE001 - offline, unknown id, gated: one line, with the fix
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ValueError(f"{hub_id!r} is not a local file or directory, and loading it as a Hub dataset id "
                         f"failed ({type(exc).__name__}: {reason}): check the path, or the id and the network "
                         "(Hub datasets need one, or datasets' cache)") from exc
    return _from_dataset_dict(loaded, f"hub:{hub_id}", split, prefer, option, hub_id=hub_id)


# --- flodl-hf's own readers of text formats ------------------------------------------------------------------------

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


#: The largest CSV field read (csv's default, 131,072 characters, refuses a long review as "unreadable").
_CSV_FIELD_LIMIT = 2**31 - 1


def _read_csv(text: str, delimiter: str, name: str) -> tuple[list[str], list[dict[str, Any]]]:
    kind = "TSV" if delimiter == "\t" else "CSV"
    previous = csv.field_size_limit(_CSV_FIELD_LIMIT)
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
        columns = [c for c in (reader.fieldnames or []) if c is not None]
        _check_header(columns, delimiter, name)
        rows = [_full_row(row, row_no, reader.line_num, columns, delimiter, name)
                for row_no, row in enumerate(reader, start=1)]
    except csv.Error as exc:
        raise ValueError(f"{name} is not a readable {kind} file ({exc}): fix the quoting or the line breaks, or save "
                         "it as JSON-lines") from exc
    finally:
        csv.field_size_limit(previous)
    return columns, rows


def _check_header(columns: list[str], delimiter: str, name: str) -> None:
    repeated = sorted({c for c in columns if columns.count(c) > 1})
    if repeated:
        raise ValueError(f"{name} has a header that repeats the column(s) {', '.join(map(repr, repeated))}, so "
                         "which one holds the data is ambiguous: give every column a distinct name")
    if len(columns) == 1 and ";" in columns[0] and delimiter == ",":
        raise ValueError(f"{name} looks semicolon-separated (its header is {columns[0][:60]!r}): flodl-hf reads "
                         "comma-separated .csv and tab-separated .tsv; save it with commas or tabs")


def _full_row(row: dict, row_no: int, line_no: int, columns: list[str], delimiter: str, name: str) -> dict:
    """``row`` when it has one field per header column. ``DictReader`` would silently put extra fields under the
    key None (an unquoted delimiter in a text cuts it in two) and fill missing ones with None."""
    extra = row.pop(None, None)
    missing = sum(1 for value in row.values() if value is None)
    if not extra and not missing:
        return row
    if not extra and all(value is None or not value.strip() for value in row.values()):
        return row  # a whitespace-only line: an empty text, dropped like any other
    fields = len(columns) + len(extra or ()) - missing
    header = f"{name}: row {row_no} (line {line_no}) has {fields} fields but the header has {len(columns)} columns " \
             f"({', '.join(columns)[:80]})"
    if extra:
        sep = "a tab" if delimiter == "\t" else "a comma"
        raise ValueError(f"{header}: a field holding {sep} must be in double quotes, e.g. \"hello, world\",pos; "
                         "quote the text field, or save the file as JSON-lines")
    example = "a<TAB><TAB>b" if delimiter == "\t" else "a,,b"
    raise ValueError(f"{header}: give every row one field per column (an empty field is fine: {example}), or save "
                     "the file as JSON-lines")


def _read_json(text: str, name: str, lines: bool) -> tuple[list[str], list[dict[str, Any]]]:
    if not lines:
        numbers = _LongNumbers()
        try:
            data = load_json(text, name, numbers) if text.strip() else []
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
            numbers.check(data, name)
            return _columns_of(data, name), data
    rows = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(load_json(line, f"{name}: line {line_no}"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name}: line {line_no} is not valid JSON: {exc.msg}") from exc
    return _columns_of(rows, name), rows


def load_json(text: str, name: str, numbers: Optional["_LongNumbers"] = None) -> Any:
    """``json.loads`` as flodl-hf reads data: a repeated key, nesting too deep for Python's recursion limit and an
    integer too long to convert are one ValueError naming ``name`` (pass ``numbers`` to check the integers later,
    naming their row); malformed JSON stays a ``json.JSONDecodeError`` for the caller to word."""
    found = numbers if numbers is not None else _LongNumbers()
    try:
        data = json.loads(text, object_pairs_hook=_distinct_keys(name), parse_int=found.parse)
    except RecursionError:
        raise ValueError(f"{name} is nested too deeply (arrays or objects inside each other beyond Python's "
                         f"recursion limit of {sys.getrecursionlimit()}): data rows hold flat fields (texts, labels, "
                         "lists of labels or answers); fix the file") from None
    if numbers is None:
        found.check(None, name)
    return data


def _int_digits_limit() -> int:
    """The most digits Python converts to an int (0: no limit; Python < 3.11 has none)."""
    return int(getattr(sys, "get_int_max_str_digits", lambda: 0)())


class _LongNumbers:
    """``parse_int`` for ``json.loads``: an integer longer than Python converts (``sys.get_int_max_str_digits``)
    becomes a marker instead of Python's error (which names no file, no row, and a Python setting as the fix);
    :meth:`check` then refuses it, naming the row that holds it when rows are given."""

    def __init__(self) -> None:
        self.found: list[_LongNumber] = []

    def parse(self, digits: str) -> Any:
        limit = _int_digits_limit()
        if limit and len(digits.lstrip("-")) > limit:
            self.found.append(_LongNumber(digits))
            return self.found[-1]
        return int(digits)

    def check(self, rows: Optional[list], name: str) -> None:
        if not self.found:
            return
        number = self.found[0]
        where = next((f"{name}: row {row_no}" for row_no, row in enumerate(rows or [], start=1)
                      if _holds(row, number)), name)
        raise ValueError(f"{where} holds a number of {len(number.lstrip('-'))} digits ({number[:20]}...), more "
                         f"than the {_int_digits_limit()} Python converts: no label, id or offset is that long; fix "
                         "the value (a text belongs in quotes), or choose another column")


class _LongNumber(str):
    """An integer too long to convert, as its digits (see :class:`_LongNumbers`)."""


def _holds(value: Any, number: "_LongNumber") -> bool:
    """Whether ``value`` (a parsed JSON row) holds ``number``, searched without recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        if item is number:
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


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
