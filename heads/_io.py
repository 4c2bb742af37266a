"""Strict checkpoint loading for task heads (saving lives in ``_save``).

It exists because transformers' ``from_pretrained`` is lenient where fine-tuning needs strictness: a missing
encoder weight is only logged and silently re-initialised, so a wrong or damaged checkpoint trains from noise.
Here every checkpoint is checked first (directory, ``config.json``, weights file, safetensors header), loaded with
transformers' loading report, and refused unless the only missing keys are the task head's own. Nothing here knows about a particular model family: the family's key layout arrives as a
:class:`HeadKeys`.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch

from flodl_hf.quiet import quiet_transformers

__all__ = [
    "CheckpointError",
    "CheckpointNotFoundError",
    "HeadKeys",
    "LoadResult",
    "quiet_transformers",
    "is_local_path",
    "find_weights",
    "read_model_type",
    "load_config",
    "load_weights",
    "load_tokenizer",
    "log_main",
    "logger",
]

logger = logging.getLogger("flodl_hf.heads")

PathLike = Union[str, os.PathLike]

#: Weight files we accept, in order of preference (the first found is used).
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
#: Any of these marks a directory that holds a tokenizer.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "spm.model",
)


class CheckpointError(ValueError):
    """A checkpoint exists but cannot be used as asked: corrupt file, wrong family, missing or mis-shaped weights,
    or a label count that disagrees with its classifier. The message names the file or key and the fix."""


class CheckpointNotFoundError(FileNotFoundError):
    """A checkpoint directory, its ``config.json`` or its weights file does not exist."""


@dataclass(frozen=True)
class HeadKeys:
    """Which state-dict keys of a ``*ForSequenceClassification`` model belong to the task head.

    ``head``: the classifier's keys; all absent means a base checkpoint and a freshly initialised head, some absent
    means a damaged checkpoint. ``optional``: encoder keys a base checkpoint may lack (a pooler that masked-LM
    checkpoints do not carry); they are initialised fresh too. ``classifier``: the output projection, whose first
    dimension is the number of labels.
    """

    head: tuple[str, ...]
    optional: tuple[str, ...]
    classifier: str


@dataclass
class LoadResult:
    """What :func:`load_weights` found: the model and which keys it initialised fresh."""

    model: Any
    fresh_head: bool
    fresh_keys: list[str]
    unexpected_keys: list[str]


def log_main(level: int, message: str, *args: Any) -> None:
    """Log on the main rank only (``$RANK`` unset or 0); other ranks log the same line at DEBUG."""
    if os.environ.get("RANK", "0").strip() not in ("", "0"):
        level = logging.DEBUG
    logger.log(level, message, *args)




def is_local_path(path_or_id: PathLike) -> bool:
    """True when ``path_or_id`` can only mean a local path (exists, absolute, ``./``, ``~``, or a Path object);
    False for something that may be a Hub id such as ``bert-base-uncased`` or ``org/name``."""
    if isinstance(path_or_id, os.PathLike):
        return True
    text = str(path_or_id)
    if os.path.exists(text) or os.path.isabs(text) or text.startswith((".", "~")):
        return True
    return text.count("/") > 1 or "\\" in text


def _local_dir(path_or_id: PathLike) -> Optional[Path]:
    """The checked local directory, or None for a Hub id. Raises when a local path is missing or not a directory."""
    if not is_local_path(path_or_id):
        return None
    path = Path(os.path.expanduser(str(path_or_id)))
    if not path.exists():
        raise CheckpointNotFoundError(
            f"checkpoint directory {str(path)!r} does not exist: pass the directory that "
            "holds config.json and model.safetensors"
        )
    if not path.is_dir():
        raise CheckpointNotFoundError(
            f"checkpoint path {str(path)!r} is a file, not a directory: pass the directory "
            "that holds config.json and model.safetensors"
        )
    return path


def find_weights(directory: Path) -> Path:
    """The weights file of a local checkpoint directory (``model.safetensors`` preferred), header-checked."""
    for name in WEIGHT_FILES:
        candidate = directory / name
        if candidate.is_file():
            if name.endswith(".index.json"):
                _check_index(candidate)
            elif name.endswith(".safetensors"):
                _check_safetensors(candidate)
            return candidate
    raise CheckpointNotFoundError(
        f"no weights file in {str(directory)!r}: expected one of {', '.join(WEIGHT_FILES)}"
    )


def _check_safetensors(path: Path) -> None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            handle.keys()
    except Exception as exc:  # SafetensorError, OSError: truncated, garbage or unreadable
        raise CheckpointError(
            f"weights file {str(path)!r} is corrupt or truncated ({exc}): re-download or re-save "
            "the checkpoint"
        ) from exc


def _check_index(path: Path) -> None:
    try:
        weight_map = json.loads(path.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"shard index {str(path)!r} is unreadable ({exc}): re-save the checkpoint"
        ) from exc
    for shard in sorted(set(weight_map.values())):
        shard_path = path.parent / shard
        if not shard_path.is_file():
            raise CheckpointNotFoundError(f"shard {str(shard_path)!r} listed in {path.name} does not exist")
        if shard.endswith(".safetensors"):
            _check_safetensors(shard_path)


def read_model_type(path_or_id: PathLike) -> Optional[str]:
    """``model_type`` from a local ``config.json`` (None for a Hub id). Raises when the file is missing or bad."""
    directory = _local_dir(path_or_id)
    if directory is None:
        return None
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise CheckpointNotFoundError(
            f"no config.json in {str(directory)!r}: a checkpoint directory needs "
            "config.json next to its weights (save it with save_pretrained)"
        )
    try:
        data = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"config file {str(config_path)!r} is not valid JSON ({exc})") from exc
    model_type = data.get("model_type") if isinstance(data, dict) else None
    if not isinstance(model_type, str) or not model_type:
        raise CheckpointError(
            f"config file {str(config_path)!r} has no model_type: it is not a transformers model config"
        )
    return model_type


def load_config(
    path_or_id: PathLike, check_type: Callable[[str], None], hub_kwargs: Optional[dict[str, Any]] = None
) -> Any:
    """Load the transformers config, calling ``check_type(model_type)`` before transformers parses it.
    ``hub_kwargs`` (``revision``, ``cache_dir``, ``local_files_only``, ``token``) go to ``AutoConfig``."""
    from transformers import AutoConfig

    model_type = read_model_type(path_or_id)
    if model_type is not None:
        check_type(model_type)
    try:
        with quiet_transformers():
            config = AutoConfig.from_pretrained(str(path_or_id), **(hub_kwargs or {}))
    except OSError as exc:
        where = (
            "" if model_type is not None else " (not a local directory; tried the Hugging Face cache and Hub)"
        )
        raise CheckpointNotFoundError(f"cannot load the config of {str(path_or_id)!r}{where}: {exc}") from exc
    except ValueError as exc:
        raise CheckpointError(f"cannot read the config of {str(path_or_id)!r}: {exc}") from exc
    if model_type is None:
        check_type(config.model_type)
    return config


def load_weights(
    model_class: Any,
    path_or_id: PathLike,
    config: Any,
    keys: HeadKeys,
    requested_labels: Optional[str] = None,
    *,
    dtype: Any = torch.float32,
    hub_kwargs: Optional[dict[str, Any]] = None,
) -> LoadResult:
    """Load ``model_class`` from a checkpoint, strictly.

    Refuses (``CheckpointError``) a mis-shaped key, a missing key outside ``keys.head + keys.optional``, and a
    partially present head. A classifier whose label count differs from ``config.num_labels`` raises a ValueError
    naming both counts; ``requested_labels`` is how the caller asked for that count (e.g. ``"num_labels=3"``).
    Keys in the checkpoint that the model lacks (a masked-LM head, an unused pooler) are ignored and logged at INFO.
    ``dtype`` and ``hub_kwargs`` go to transformers' ``from_pretrained``.
    """
    directory = _local_dir(path_or_id)
    source = str(find_weights(directory)) if directory is not None else str(path_or_id)
    try:
        with quiet_transformers():
            model, info = model_class.from_pretrained(
                str(path_or_id),
                config=config,
                dtype=dtype,
                ignore_mismatched_sizes=True,
                output_loading_info=True,
                **(hub_kwargs or {}),
            )
    except OSError as exc:
        raise CheckpointNotFoundError(f"cannot load weights from {source!r}: {exc}") from exc
    except Exception as exc:  # safetensors / pickle / RuntimeError from a damaged file
        raise CheckpointError(f"cannot load weights from {source!r}: {exc}") from exc
    if info.get("error_msgs"):
        raise CheckpointError(f"loading {source!r} failed: {'; '.join(map(str, info['error_msgs']))}")

    mismatched = sorted(info.get("mismatched_keys") or (), key=lambda item: item[0])
    encoder_mismatch = [m for m in mismatched if m[0] not in keys.head]
    if encoder_mismatch:
        shown = ", ".join(
            f"{k} (checkpoint {list(a)} vs model {list(b)})" for k, a, b in encoder_mismatch[:5]
        )
        raise CheckpointError(
            f"{len(encoder_mismatch)} weight(s) in {source!r} do not match the shapes its "
            f"config.json describes: {shown}. The weights and config.json come from different "
            "models: re-save the checkpoint"
        )
    if mismatched:
        ckpt_labels = next((int(a[0]) for k, a, _ in mismatched if k == keys.classifier), None)
        shape = next((list(a) for k, a, _ in mismatched if k == keys.classifier), None)
        asked = requested_labels or f"num_labels={config.num_labels}"
        raise CheckpointError(
            f"{asked} disagrees with the checkpoint {source!r}: its classifier ({keys.classifier}, shape {shape}) "
            f"has {ckpt_labels} labels, not {config.num_labels}. Drop num_labels/labels to use its {ckpt_labels} "
            f"labels, or load the base model (a checkpoint without classifier weights) to re-initialise a fresh "
            f"{config.num_labels}-label head"
        )

    missing = set(info.get("missing_keys") or ())
    allowed = set(keys.head) | set(keys.optional)
    not_allowed = sorted(missing - allowed)
    if not_allowed:
        shown = ", ".join(not_allowed[:8]) + (", ..." if len(not_allowed) > 8 else "")
        raise CheckpointError(
            f"{source!r} lacks {len(not_allowed)} encoder weight(s) that "
            f"{model_class.__name__} needs: {shown}. It is not a complete "
            f"{config.model_type} checkpoint"
        )
    head_missing = [k for k in keys.head if k in missing]
    if head_missing and len(head_missing) != len(keys.head):
        raise CheckpointError(
            f"{source!r} holds only part of the classifier: {', '.join(head_missing)} missing. "
            "Re-save the checkpoint, or load its base model to start a fresh head"
        )
    fresh = [k for k in keys.head + keys.optional if k in missing]
    unexpected = sorted(info.get("unexpected_keys") or ())
    if unexpected:
        log_main(
            logging.INFO,
            "ignored %d checkpoint weight(s) that %s does not use (e.g. %s)",
            len(unexpected),
            model_class.__name__,
            ", ".join(unexpected[:3]),
        )
    return LoadResult(
        model=model, fresh_head=bool(head_missing), fresh_keys=fresh, unexpected_keys=unexpected
    )


def load_tokenizer(path_or_id: PathLike, hub_kwargs: Optional[dict[str, Any]] = None) -> Any:
    """The checkpoint's tokenizer, or None when a local directory holds no tokenizer files."""
    from transformers import AutoTokenizer

    directory = _local_dir(path_or_id)
    if directory is not None and not any((directory / name).is_file() for name in TOKENIZER_FILES):
        log_main(
            logging.WARNING,
            "no tokenizer files in %s: pass tokenizer=... to from_pretrained (or set "
            "head.tokenizer) before encode/collate/predict",
            directory,
        )
        return None
    try:
        with quiet_transformers():
            return AutoTokenizer.from_pretrained(str(path_or_id), **(hub_kwargs or {}))
    except Exception as exc:
        if directory is None:
            log_main(
                logging.WARNING, "could not load a tokenizer for %s (%s): pass tokenizer=...", path_or_id, exc
            )
            return None
        raise CheckpointError(f"the tokenizer files in {str(directory)!r} cannot be loaded: {exc}") from exc
