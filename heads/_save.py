"""Atomic saving of a head's directory.

It exists so that a failed save (full disk, a tokenizer that cannot serialise, an interrupt) never leaves a
half-written model directory: everything is written into a temporary directory beside the target and renamed
into place, and a directory that is not a model directory is never overwritten.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from flodl_hf.atomic import atomic_dir

from ._io import PathLike

__all__ = ["atomic_save", "write_label_maps"]


def atomic_save(target: PathLike, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp_dir)`` in a temporary directory beside ``target``, then rename it to ``target``.

    An existing ``target`` is replaced only when it is empty or looks like a model directory (has ``config.json``);
    otherwise ``FileExistsError``. On any failure the temporary directory is removed and ``target`` is untouched.
    """
    target = Path(os.path.expanduser(str(target))).absolute()
    if target.exists():
        if not target.is_dir():
            raise FileExistsError(f"cannot save to {str(target)!r}: it is a file; choose a directory path")
        if any(target.iterdir()) and not (target / "config.json").is_file():
            raise FileExistsError(
                f"refusing to overwrite {str(target)!r}: it is a non-empty directory that is not "
                "a model directory (no config.json); choose a new or empty directory"
            )
    with atomic_dir(target) as tmp:
        write(tmp)
    return target


def write_label_maps(config_path: Path, labels: list[str]) -> None:
    """Make sure a saved ``config.json`` names its labels: transformers omits the default two-label maps
    (``LABEL_0``/``LABEL_1``), and we want every saved head to state its labels explicitly."""
    data = json.loads(config_path.read_text(encoding="utf-8"))
    id2label = {str(i): name for i, name in enumerate(labels)}
    label2id = {name: i for i, name in enumerate(labels)}
    if data.get("id2label") == id2label and data.get("label2id") == label2id:
        return
    data["id2label"], data["label2id"] = id2label, label2id
    config_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
