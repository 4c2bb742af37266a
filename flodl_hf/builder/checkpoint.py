"""Builder checkpoints: the averaged model, written atomically.

Why it exists: a checkpoint that is half-written when the machine dies is worse than none, so the file is
written to a temporary name in the same directory, flushed to disk, then renamed over the destination
(``os.replace`` is atomic on POSIX and Windows). A reader therefore sees the previous checkpoint or the new
one, never a torn file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Union

import torch

from ..atomic import atomic_path

__all__ = ["write_checkpoint", "read_checkpoint", "CHECKPOINT_FORMAT"]

CHECKPOINT_FORMAT = "flodl-hf-builder/1"


def write_checkpoint(path: Union[str, os.PathLike], state: Any, **meta: Any) -> Path:
    """Atomically write ``{"format", "model": state, **meta}`` to ``path`` with ``torch.save``; returns the
    path."""
    if path is None:
        raise ValueError(
            "checkpoint_fn returned None: return the path of the file to write, e.g. f'ckpt/epoch{epoch}.pt'"
        )
    target = Path(os.fspath(path))
    with atomic_path(target) as tmp:
        torch.save({"format": CHECKPOINT_FORMAT, "model": dict(state), **meta}, tmp)
    return target


def read_checkpoint(path: Union[str, os.PathLike]) -> dict:
    """Load a builder checkpoint (CPU tensors); ``ckpt["model"]`` is a state_dict."""
    ckpt = torch.load(os.fspath(path), map_location="cpu", weights_only=False)
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a flodl-hf builder checkpoint (format {CHECKPOINT_FORMAT})")
    return ckpt
