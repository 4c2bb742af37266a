"""Atomic saving of a head's directory.

It exists so that a failed save (full disk, a tokenizer that cannot serialise, an interrupt) never leaves a
half-written model directory: everything is written into a temporary directory beside the target and renamed
into place. A directory that is not a model directory is never written into, and in one that is (a Hub clone
with its ``.git/``) only the files the save writes are replaced: nothing else is ever moved or deleted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Sequence

from flodl_hf.files.atomic import atomic_dir

from ._io import PathLike

__all__ = ["atomic_save", "write_label_maps", "save_tokenizer"]


def _model_config(path: Path) -> bool:
    """True when ``path`` is a transformers model config (a JSON object naming its ``model_type``)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and isinstance(data.get("model_type"), str)


#: Weight files a saved directory may hold; one a save did not rewrite could be loaded instead of the new weights.
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")


def atomic_save(target: PathLike, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp_dir)`` in a temporary directory beside ``target``, then move what it wrote into ``target``.

    - ``target`` absent: the temporary directory is renamed to it.
    - ``target`` an empty directory, or a model directory (its ``config.json`` names a ``model_type``, e.g. a
      clone of a Hub repository): each file written replaces the file of the same name; every other entry
      (``.git/``, notes, a model card) is left as it is. Refused (``FileExistsError``, nothing written) when a
      weight file the save did not write would shadow the new weights (``model.safetensors`` beside a sharded
      save), or when a written name is a directory or link there.
    - any other non-empty directory: ``FileExistsError``, nothing written.

    On any failure before the files move, the temporary directory is removed and ``target`` is untouched.
    """
    target = Path(os.path.expanduser(str(target))).absolute()
    if target.exists():
        if not target.is_dir():
            raise FileExistsError(f"cannot save to {str(target)!r}: it is a file; choose a directory path")
        if any(target.iterdir()) and not _model_config(target / "config.json"):
            raise FileExistsError(
                f"refusing to write into {str(target)!r}: it is a non-empty directory that is not a model "
                "directory (no config.json naming a model_type); choose a new or empty directory"
            )
    holder: list[Path] = []

    def check_shadows() -> None:
        written = {p.name for p in holder[0].iterdir()}
        stale = [n for n in _WEIGHTS if n not in written and (target / n).exists()]
        if stale and written & set(_WEIGHTS):
            raise FileExistsError(f"refusing to save into {str(target)!r}: its {', '.join(stale)} was not "
                                  "rewritten by this save and would be loaded instead of (or mixed with) the new "
                                  "weights; remove it, or choose a new directory")

    with atomic_dir(target, before_swap=check_shadows, in_place=True) as tmp:
        holder.append(tmp)
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
