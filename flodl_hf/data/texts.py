"""Fill-mask (masked-LM) data: plain texts.

It exists so that ``flodl-hf train / eval --task fill-mask`` read texts from the usual places: a raw text file
(``.txt`` / ``.text``: one text per line, blank lines skipped) or one column of a CSV / TSV / JSON / JSON-lines /
parquet / arrow file, saved ``datasets`` directory or Hub id (``--text-column``, default ``text``). Empty texts are
dropped and counted; a non-text value is refused naming its row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Union

from .rows import Rows

__all__ = ["load_texts", "RAW_SUFFIXES"]

RAW_SUFFIXES = (".txt", ".text")


def load_texts(source: Union[str, Path], *, text_column: Optional[str] = None, encoding: Optional[str] = None,
               split: Optional[str] = None, prefer: Sequence[str] = ("train",)) -> Rows:
    """The non-empty texts of ``source`` as ``Rows`` of strings."""
    path = Path(source)
    if path.is_file() and path.suffix.lower() in RAW_SUFFIXES:
        from .sources import _decode

        if text_column is not None:
            raise ValueError(f"--text-column {text_column}: {path} is a raw text file (one text per line) and has no "
                             "columns: leave --text-column out, or give a CSV / JSON file")
        lines = _decode(path.read_bytes(), encoding, str(path)).splitlines()
        texts = [line.strip() for line in lines if line.strip()]
        name, dropped = str(path), len(lines) - len(texts)
    else:
        from .sources import read_table

        table = read_table(source, split=split, encoding=encoding, prefer=prefer)
        name, column = table.name, text_column or "text"
        if column not in table.columns:
            raise ValueError(f"{name} has no text column {column!r}; available columns: "
                             f"{', '.join(map(repr, table.columns))}. Choose one with --text-column")
        texts, dropped = [], 0
        for row_no, row in enumerate(table.iter_rows([column]), start=1):
            value = row.get(column)
            if value is None or (isinstance(value, str) and not value.strip()):
                dropped += 1
                continue
            if not isinstance(value, str):
                raise ValueError(f"{name}: row {row_no} has a {type(value).__name__} ({value!r:.40}) in text column "
                                 f"{column!r}: give text, or choose another column with --text-column")
            texts.append(value)
    if not texts:
        raise ValueError(f"{name} holds no text: give at least one non-empty text")
    return Rows(texts, name, [], dropped)
