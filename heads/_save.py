"""Atomic saving of a head's directory.

It exists so that a failed save (full disk, a tokenizer that cannot serialise, an interrupt) never leaves a
half-written model directory: everything is written into a temporary directory beside the target and renamed
into place, and a directory that is not a model directory is never overwritten.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Sequence

from flodl_hf.atomic import atomic_dir

from ._io import PathLike

__all__ = ["atomic_save", "write_label_maps", "save_tokenizer"]


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


def save_tokenizer(tokenizer: Any, directory: Path, max_length: int, input_names: Sequence[str] = ()) -> None:
    """Save ``tokenizer`` into ``directory`` as the head uses it, so that transformers' pipeline encodes alike:
    ``model_max_length = max_length`` (``truncation=True`` cuts where the head does) and, when the family takes
    ``token_type_ids`` (``input_names``) but the tokenizer does not return them by default, ``model_input_names``
    listing them (else a pipeline would give a pair's second text type 0). ``tokenizer`` itself is left unchanged."""
    saved = {"model_max_length": int(max_length)}
    names = list(getattr(tokenizer, "model_input_names", None) or [])
    if "token_type_ids" in input_names and names and "token_type_ids" not in names:
        saved["model_input_names"] = ["input_ids", "token_type_ids"] + [n for n in names if n != "input_ids"]
    previous = {key: getattr(tokenizer, key) for key in saved}
    previous_init = {key: tokenizer.init_kwargs.get(key, _MISSING) for key in saved}
    try:
        for key, value in saved.items():
            setattr(tokenizer, key, value)
            tokenizer.init_kwargs[key] = value
        tokenizer.save_pretrained(directory)
    finally:
        for key, value in previous.items():
            setattr(tokenizer, key, value)
            if previous_init[key] is _MISSING:
                tokenizer.init_kwargs.pop(key, None)
            else:
                tokenizer.init_kwargs[key] = previous_init[key]


_MISSING = object()
