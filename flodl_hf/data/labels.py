"""Label values to targets, matched by *name*: single-label ids, multi-label id sets and regression numbers.

It exists because a label id means nothing without its name list: a ``datasets`` ``ClassLabel`` column stores
ids into *its own* names, a model stores ids into *its* ``id2label``, and ``--labels`` gives a third order. Matching
them by position silently scores a model on shuffled classes. So every id that comes with names
(a ``ClassLabel``) is turned into its name first, and names are then looked up in the target list. The rules:

* ``ClassLabel`` ids -> their names -> the target names (given ``labels``, e.g. ``--labels`` or the model's
  labels; else the ``ClassLabel`` names in their own order). A subset of the target names is fine.
* Plain integer labels (a CSV or JSON column with no names attached) are ids into the given names when those are
  not themselves integers; otherwise integers compare by their text (``0/5/100`` give three labels).
* Target names that carry no meaning (transformers' defaults ``LABEL_0``, ``LABEL_1``, ...: a model saved without
  label names) cannot be matched by name: ``ClassLabel`` ids are then ids into them, as transformers' own
  ``run_glue`` does.
* Names not among the targets are refused in one message that lists every unknown name (with a row) and the
  known names.
* Multi-label: a row holds a list of names or ids, a comma-separated string (``"sports,politics"``) or one name
  or id; an empty list means no label applies.
* Regression: a row holds a number (an int, a float or a numeric string); anything else is refused by row.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional, Sequence

__all__ = ["map_single_labels", "map_multi_labels", "regression_targets", "class_label_names", "natural_sorted",
           "MAX_LABELS"]

#: The most distinct labels a loaded dataset may hold (more means the label column is probably not labels).
MAX_LABELS = 10_000


def class_label_names(feature: Any) -> Optional[list[str]]:
    """The names of a ``ClassLabel`` feature, or of the ``ClassLabel`` inside a list feature (multi-label)."""
    names = getattr(feature, "names", None)
    if names:
        return [str(n) for n in names]
    inner = getattr(feature, "feature", None)
    if inner is None and isinstance(feature, list) and len(feature) == 1:
        inner = feature[0]
    names = getattr(inner, "names", None)
    return [str(n) for n in names] if names else None


def natural_sorted(names: Iterable[str]) -> list[str]:
    names = list(names)
    if names and all(_is_int_text(n) for n in names):
        return sorted(names, key=int)
    return sorted(names)


def _is_int_text(text: str) -> bool:
    return text.lstrip("-").isdigit()


def _generic(labels: Optional[Sequence[str]]) -> bool:
    """True for transformers' placeholder names ``LABEL_0, LABEL_1, ...`` (no meaning to match by)."""
    return labels is not None and all(str(n) == f"LABEL_{i}" for i, n in enumerate(labels))


def _unknown_error(unknown: dict[str, int], names: Sequence[str], source: str, column: str, known: str,
                   fix: str) -> ValueError:
    if len(unknown) == 1:
        (value, row_no), = unknown.items()
        return ValueError(f"{source}: row {row_no} has label {value!r}, which is not one of {known} {list(names)}; "
                          f"{fix}")
    shown = ", ".join(f"{value!r} (row {row})" for value, row in list(unknown.items())[:10])
    more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
    return ValueError(f"{source}: column {column!r} has labels {shown}{more}, which are not among {known} "
                      f"{list(names)}; {fix}")


def _check_id(value: int, row_no: int, names: Sequence[str], source: str) -> None:
    if not 0 <= value < len(names):
        raise ValueError(f"{source}: row {row_no} has label id {value}, outside the {len(names)} known labels "
                         f"{list(names)}")


def _ids_as_names(raw: list[Any], rows: list[int], class_names: list[str], source: str) -> list[Any]:
    """ClassLabel ids -> their names (anything else unchanged)."""
    out = []
    for row_no, value in zip(rows, raw):
        if isinstance(value, int):
            _check_id(value, row_no, class_names, source)
            value = class_names[value]
        out.append(value)
    return out


def map_single_labels(raw: list[Any], rows: list[int], labels: Optional[Sequence[str]],
                      class_names: Optional[Sequence[str]], source: str, column: str, fix: str,
                      known: str = "the known labels") -> tuple[list[int], list[str]]:
    """Label ids into the returned names (see the module docstring). ``labels``: the target names, or None."""
    class_names = None if _generic(labels) else class_names
    if class_names:
        raw = _ids_as_names(raw, rows, list(class_names), source)
    names = list(labels) if labels is not None else (list(class_names) if class_names else None)
    kinds = {type(v) for v in raw}
    if kinds == {int} and names is not None and not all(_is_int_text(str(n)) for n in names):
        for row_no, value in zip(rows, raw):
            _check_id(value, row_no, names, source)
        return list(raw), names
    if kinds == {int} and names is None and min(raw) < 0:
        raise ValueError(f"{source}: column {column!r} holds the negative label id {min(raw)}; integer labels must "
                         "be >= 0 (or use label names)")
    texts = [str(v) for v in raw]  # integers compare by their text, as a CSV would give them
    if names is None:
        distinct = set(texts)
        if len(distinct) > MAX_LABELS:
            raise ValueError(f"{source}: column {column!r} holds {len(distinct)} distinct labels, more than the "
                             f"{MAX_LABELS} a classifier here may have: is {column!r} the label column? Choose "
                             "another with --label-column")
        names = natural_sorted(distinct)
    index = {label: i for i, label in enumerate(names)}
    unknown: dict[str, int] = {}
    for row_no, value in zip(rows, texts):
        if value not in index and value not in unknown:
            unknown[value] = row_no
    if unknown:
        raise _unknown_error(unknown, names, source, column, known, fix)
    return [index[value] for value in texts], list(names)


def _split_multi(value: Any, row_no: int, source: str, column: str) -> list[Any]:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"{source}: row {row_no} has a {type(value).__name__} label ({value!r:.40}) in column "
                         f"{column!r}; a multi-label row holds a list of label names or ids, or 'a,b'")
    if isinstance(value, (int, float)):
        return [int(value)]
    if isinstance(value, (list, tuple)):
        out = []
        for item in value:
            if isinstance(item, bool) or not isinstance(item, (str, int)):
                raise ValueError(f"{source}: row {row_no} has a {type(item).__name__} ({item!r:.40}) in its label "
                                 f"list in column {column!r}; give label names or integer ids")
            out.append(item.strip() if isinstance(item, str) else item)
        return [item for item in out if item != ""]
    raise ValueError(f"{source}: row {row_no} has a {type(value).__name__} label ({value!r:.40}) in column "
                     f"{column!r}; a multi-label row holds a list of label names or ids, or 'a,b'")


def map_multi_labels(raw: list[Any], rows: list[int], labels: Optional[Sequence[str]],
                     class_names: Optional[Sequence[str]], source: str, column: str, fix: str,
                     known: str = "the known labels") -> tuple[list[tuple[int, ...]], list[str]]:
    """Per row, the sorted tuple of label ids that apply, and the label names (see the module docstring)."""
    per_row = [_split_multi(value, row_no, source, column) for row_no, value in zip(rows, raw)]
    class_names = None if _generic(labels) else class_names
    if class_names:
        per_row = [_ids_as_names(items, [row_no] * len(items), list(class_names), source)
                   for row_no, items in zip(rows, per_row)]
    names = list(labels) if labels is not None else (list(class_names) if class_names else None)
    flat = [item for items in per_row for item in items]
    ints_are_ids = names is not None and all(isinstance(v, int) for v in flat) and not all(
        _is_int_text(str(n)) for n in names)
    if names is None:
        distinct = {str(v) for v in flat}
        if len(distinct) > MAX_LABELS:
            raise ValueError(f"{source}: column {column!r} holds {len(distinct)} distinct labels, more than the "
                             f"{MAX_LABELS} a classifier here may have: check --label-column")
        names = natural_sorted(distinct)
    index = {label: i for i, label in enumerate(names)}
    unknown: dict[str, int] = {}
    out: list[tuple[int, ...]] = []
    for row_no, items in zip(rows, per_row):
        ids = set()
        for item in items:
            if ints_are_ids:
                _check_id(item, row_no, names, source)
                ids.add(item)
            elif str(item) in index:
                ids.add(index[str(item)])
            else:
                unknown.setdefault(str(item), row_no)
        out.append(tuple(sorted(ids)))
    if unknown:
        raise _unknown_error(unknown, names, source, column, known, fix)
    return out, list(names)


def regression_targets(raw: list[Any], rows: list[int], source: str, column: str) -> list[float]:
    """Finite floats from ints, floats or numeric strings; anything else raises naming the row."""
    out = []
    for row_no, value in zip(rows, raw):
        number: Optional[float] = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                number = None
        if number is None or not math.isfinite(number):
            raise ValueError(f"{source}: row {row_no} has the target {value!r:.40} in column {column!r}, which is "
                             "not a finite number: --problem-type regression needs a number in every row (or "
                             "choose the column with --label-column)")
        out.append(number)
    return out
