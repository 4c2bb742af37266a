"""Validate first: everything a command can check before a model loads or a rank starts, checked then.

It exists so that no run trains for minutes and then fails on something it could have seen at start, and so that
those checks live in one place rather than in each command. Everything here is plain Python (``torch`` is imported
only to ask whether a CUDA or MPS device named by ``--devices`` exists), so a refusal costs milliseconds:

* output paths: the parent is a writable directory, the name is short enough and encodable
  (:func:`flodl_hf.files.ownership.writable_parent`), ownership and overlap (:mod:`flodl_hf.files.ownership`);
* devices supported on this machine;
* the model directory complete: ``config.json`` (valid JSON with a ``model_type``), a weights file, tokenizer files;
  and, for ``predict`` / ``eval``, a trained classifier (safetensors keys);
* disk space for the output and a checkpoint, estimated from the weights' size.

Numbers are checked by the command-line parser's types (``flodl_hf.cli``) and ``TrainSettings``; data columns and
labels by ``flodl_hf.data``.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections import Counter
from pathlib import Path
from typing import Any, Optional, Sequence

from .files.reader import require_regular_file

__all__ = ["check_model_dir", "label_map_problem", "classifier_trained", "check_devices", "check_disk_space",
           "check_texts", "WEIGHT_FILES", "TOKENIZER_FILES", "TASK_LAYERS", "task_layer_trained", "check_task_layer",
           "require_regular_file", "safetensors_problem"]

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                   "sentencepiece.bpe.model", "spm.model")


def check_model_dir(path: Any, option: str = "--model", tokenizer: bool = True,
                    labels: Optional[bool] = None) -> Path:
    """Refuse a model directory that is missing, lacks or has a broken config, lacks weights or tokenizer files,
    or (``labels``; by default when its weights hold a trained classifier, whose outputs the map names) has a
    damaged label map."""
    model = Path(path)
    if not model.exists():
        raise FileNotFoundError(f"model directory not found: {model}: give an existing directory with {option}")
    if not model.is_dir():
        raise ValueError(f"{option} {model} is a file, not a model directory: give the directory that holds "
                         f"config.json with {option}")
    config_path = model / "config.json"
    require_regular_file(config_path, option, missing_ok=True)
    if not config_path.is_file():
        raise ValueError(f"{model} is not a model directory (no config.json): give a directory written by "
                         f"save_pretrained or flodl-hf with {option}")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{config_path} is not valid JSON ({exc.__class__.__name__}): re-save the model, or give "
                         f"another directory with {option}") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ValueError(f"{config_path} names no model_type: re-save the model with save_pretrained, or give "
                         f"another directory with {option}")
    for name in (*WEIGHT_FILES, *TOKENIZER_FILES, "config.json"):
        require_regular_file(model / name, option, missing_ok=True)
    if not any((model / name).is_file() for name in WEIGHT_FILES):
        raise ValueError(f"no weights file in {str(model)!r}: expected one of {', '.join(WEIGHT_FILES)}; give a "
                         f"complete model directory with {option}")
    if tokenizer and not any((model / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"{model} has no tokenizer files (tokenizer.json, vocab.txt, ...): copy the base model's "
                         f"tokenizer files into it, or give a complete model directory with {option}")
    if (model / "model.safetensors").is_file():
        problem = safetensors_problem(model / "model.safetensors")
        if problem:
            raise ValueError(f"{model / 'model.safetensors'} {problem}: re-download or re-save the checkpoint, or "
                             f"give another directory with {option}")
    if labels or (labels is None and classifier_trained(model) is not False):
        problem = label_map_problem(config.get("id2label"))
        if problem:
            raise ValueError(f"{config_path} has a damaged label map: id2label {problem}, so the model's outputs "
                             "cannot be named: give each id 0..n-1 one distinct name in id2label (and label2id), "
                             f"e.g. {{\"0\": \"neg\", \"1\": \"pos\"}}, or give another directory with {option}")
    return model


def safetensors_problem(path: Path) -> Optional[str]:
    """What is wrong with a safetensors file's framing (None: its header parses and its tensors fill the file
    exactly): a truncated download or copy is caught here, in one line, before any loader sees it."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return f"is corrupt or truncated ({size} bytes, not even a header)"
            (length,) = struct.unpack("<Q", head)
            if length > min(size - 8, 100_000_000):
                return f"is corrupt or truncated ({size} bytes; its header claims {length} bytes of header)"
            header = json.loads(fh.read(length))
    except (OSError, ValueError, struct.error) as exc:
        return f"is corrupt or truncated (unreadable header: {type(exc).__name__})"
    if not isinstance(header, dict):
        return "is damaged (its header is not an object)"
    ends = [info.get("data_offsets", [0, 0])[1] for key, info in header.items()
            if key != "__metadata__" and isinstance(info, dict) and isinstance(info.get("data_offsets"), list)
            and len(info["data_offsets"]) == 2]
    expected = 8 + length + max((int(e) for e in ends if isinstance(e, int)), default=0)
    if expected != size:
        return f"is corrupt or truncated: {size} bytes where its header describes {expected}"
    return None


def label_map_problem(id2label: Any) -> Optional[str]:
    """What is wrong with a ``config.json`` ``id2label`` (None: nothing, or no map): ids must be exactly 0..n-1 and
    names distinct, non-empty strings, or predictions print one name twice and labels match the wrong class."""
    if id2label is None or id2label == {}:
        return None
    if not isinstance(id2label, dict):
        return f"is a {type(id2label).__name__}, not an object of id -> name"
    if set(id2label) != {str(i) for i in range(len(id2label))}:
        shown = ", ".join(key if key.isdigit() else repr(key)
                          for key in sorted(map(str, id2label), key=lambda k: (not k.isdigit(), k.zfill(20))))
        return f"has ids {shown[:80]} where {len(id2label)} labels need exactly 0..{len(id2label) - 1}"
    for key, name in id2label.items():
        if not isinstance(name, str) or not name.strip():
            return f"names id {key} {name!r:.40}"
    repeated = sorted(name for name, count in Counter(id2label.values()).items() if count > 1)
    if repeated:
        return f"repeats the label name(s) {', '.join(map(repr, repeated))[:80]}"
    return None


def _safetensors_keys(path: Path) -> Optional[list[str]]:
    try:
        with path.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            if size > 100_000_000:
                return None
            header = json.loads(fh.read(size))
    except (OSError, struct.error, ValueError):
        return None
    return [k for k in header if k != "__metadata__"] if isinstance(header, dict) else None


def classifier_trained(path: Any) -> Optional[bool]:
    """Whether the weights of ``path`` hold classifier weights (None: cannot tell without loading them)."""
    model = Path(path)
    keys: Optional[list[str]] = None
    if (model / "model.safetensors").is_file():
        keys = _safetensors_keys(model / "model.safetensors")
    elif (model / "model.safetensors.index.json").is_file():
        try:
            keys = list(json.loads((model / "model.safetensors.index.json").read_text())["weight_map"])
        except (OSError, ValueError, KeyError, TypeError):
            keys = None
    if keys is None:
        return None
    return any(k.startswith("classifier.") or ".classifier." in k or k.startswith("score.") for k in keys)


#: Where each task's own layer lives in a transformers state dict (key prefixes, also after a ``<base>.`` prefix).
TASK_LAYERS = {
    "text-classification": ("classifier.", "score."),
    "token-classification": ("classifier.", "score."),
    "question-answering": ("qa_outputs.",),
    "fill-mask": ("cls.predictions.", "lm_head.", "predictions.", "lm_predictions.", "vocab_transform.",
                  "vocab_projector.", "vocab_layer_norm."),
}


def _weight_keys(model: Path) -> Optional[list[str]]:
    if (model / "model.safetensors").is_file():
        return _safetensors_keys(model / "model.safetensors")
    if (model / "model.safetensors.index.json").is_file():
        try:
            return list(json.loads((model / "model.safetensors.index.json").read_text())["weight_map"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return None


def task_layer_trained(path: Any, task: str) -> Optional[bool]:
    """Whether the weights of ``path`` hold ``task``'s own layer (None: cannot tell without loading them)."""
    keys = _weight_keys(Path(path))
    if keys is None:
        return None
    prefixes = TASK_LAYERS[task]
    return any(k.startswith(prefixes) or any(f".{p}" in k for p in prefixes) for k in keys)


def check_task_layer(path: Any, task: str, command: str, option: str = "--model") -> None:
    """Refuse a model directory whose weights lack ``task``'s own layer (every output of it would be random): the
    rule text classification's :func:`check_trained` applies, for every task and command."""
    if task_layer_trained(path, task) is False:
        layer = "*, ".join(TASK_LAYERS[task][:2]) + "*"
        other = f"with {option}" if option.startswith("--") else f"as {option}"
        raise ValueError(f"{path} has no trained {task} layer (its weights hold no {layer}), so what {command} "
                         f"would print or write is random: fine-tune it first with `flodl-hf train --task {task}`, "
                         f"or give a trained {task} model {other}")


def check_trained(path: Any, allow_untrained: bool, command: str) -> None:
    """Refuse ``predict`` / ``eval`` on a base checkpoint, whose classifier would be random."""
    if not allow_untrained and classifier_trained(path) is False:
        raise ValueError(f"{path} has no trained classifier (it is a base checkpoint): its scores would be random. "
                         f"Fine-tune it with flodl-hf train first, or pass --allow-untrained to {command} anyway")


def check_devices(devices: Optional[Sequence[str]]) -> None:
    """Refuse CUDA / MPS devices this machine does not have (asks torch only when such a device is named)."""
    if not devices:
        return
    kinds = {str(d).split(":")[0] for d in devices}
    if not kinds & {"cuda", "mps"}:
        return
    import torch

    if "mps" in kinds:
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ValueError("--devices mps: Apple MPS is not available on this machine: use --devices cpu"
                             + (" or cuda" if torch.cuda.is_available() else ""))
    if "cuda" in kinds:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"--devices {','.join(devices)}: this machine has no CUDA GPU: use --devices cpu "
                             "(or cpu,cpu for several ranks)")
        for device in devices:
            index = str(device).partition(":")[2]
            if index and int(index) >= count:
                raise ValueError(f"--devices {','.join(devices)}: {device} does not exist, this machine has {count} "
                                 f"GPU(s): name cuda:0 to cuda:{count - 1}")


def _weights_bytes(model: Path) -> int:
    return sum((model / name).stat().st_size for name in WEIGHT_FILES if (model / name).is_file())


def check_disk_space(model: Path, targets: Sequence[tuple[str, Path]], checkpoints: bool) -> None:
    """Refuse when the filesystem of an output cannot hold the model (and, with checkpoints, its optimizer state),
    estimated from the weights' size."""
    size = _weights_bytes(model)
    for option, target in targets:
        probe = Path(target).absolute()
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        need = size * (4 if checkpoints and option == "--checkpoint-dir" else 1) + 1_000_000
        try:
            free = shutil.disk_usage(probe).free
        except OSError:
            continue
        if free < need:
            raise ValueError(f"{option} {target}: only {free / 1e6:.0f} MB free on its filesystem, and about "
                             f"{need / 1e6:.0f} MB are needed: free space, or choose another {option}")


def check_texts(texts: Sequence[str]) -> None:
    """Refuse command-line texts that are not valid Unicode (bytes the terminal could not decode)."""
    for i, text in enumerate(texts, start=1):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"TEXT {i} is not valid UTF-8 (the shell passed undecodable bytes): give the texts "
                             "in UTF-8") from None
        if not text.strip():
            raise ValueError(f"TEXT {i} is empty: give non-empty texts to classify")


#: What a failed write of ``train`` leaves intact (each command says its own: ``fs_error_message(intact=...)``).
TRAIN_INTACT = "the previous checkpoint, if any, and --output-dir are as they were"


def os_error_of(exc: BaseException) -> Optional[OSError]:
    """The OS error inside a library's own exception: safetensors' Rust writer reports a failed write (a full disk,
    a file-size limit) as ``SafetensorError("... (os error 28)")``, not as an ``OSError``; None for anything else."""
    import errno
    import re

    if isinstance(exc, OSError):
        return exc
    if type(exc).__name__ != "SafetensorError":
        return None
    found = re.search(r"\(os error (\d+)\)", str(exc))
    if found is None:
        return None
    code = int(found.group(1))
    return OSError(code, os.strerror(code)) if code in errno.errorcode else None


def fs_error_message(exc: OSError, options: str, intact: str = TRAIN_INTACT) -> Optional[str]:
    """One line for a filesystem failure a user can fix (full disk, file-size limit, read-only filesystem), saying
    what happened and what is ``intact``, or None."""
    import errno

    where = f" writing {exc.filename}" if getattr(exc, "filename", None) else ""
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        return f"no space left on the device{where}; {intact}: free space, or choose another {options}"
    if exc.errno == errno.EFBIG:
        return (f"a file grew past the size limit{where} (the filesystem's, or the process's: ulimit -f); {intact}: "
                f"raise the limit, or choose another {options}")
    if exc.errno == errno.EROFS:
        return f"read-only filesystem{where}: choose a writable {options}"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied{where}: choose a writable {options}"
    if exc.errno == errno.ENAMETOOLONG:
        return f"file name too long{where}: choose a shorter {options}"
    if exc.errno in (errno.ENOTDIR, errno.EISDIR, errno.ENOENT, errno.EEXIST, errno.ELOOP):
        return f"{os.strerror(exc.errno).lower()}{where}: check the path, or choose another {options}"
    return None


def model_labels(path: Any) -> Optional[list[str]]:
    """The label names of a model directory's ``config.json`` (``id2label`` in id order), None if absent."""
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
        id2label = config.get("id2label") or {}
        return [str(id2label.get(str(i), id2label.get(i))) for i in range(len(id2label))] if id2label else None
    except (OSError, ValueError, AttributeError):
        return None
