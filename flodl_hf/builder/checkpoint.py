"""Builder checkpoints: the averaged model and the run's bookkeeping, in the safe format, written atomically.

Why it exists: a checkpoint that is half-written when the machine dies is worse than none, and one that runs code
when opened is worse still. ``checkpoint_fn(epoch)`` names the checkpoint's manifest (e.g. ``ckpt/epoch2.json``);
beside it the tensors go to ``epoch2.0.safetensors`` or ``epoch2.1.safetensors`` (``flodl_hf.checkpoint.format``:
JSON manifest with format version and SHA-256 checksums, safetensors for the weights, committed by renaming the
manifest last). A reader therefore sees the previous checkpoint or the new one, never a torn one, and reading
never unpickles: a legacy pickle written by an earlier flodl-hf is refused with the command that converts it
(``flodl-hf convert-checkpoint --trust-pickle FILE``). Each write holds the path's lock (``flodl_hf.files.dirlock``),
so two runs writing the same checkpoint at once get a clear error instead of a mix.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Union

from ..files import dirlock
from ..checkpoint.errors import ResumeError
from ..checkpoint.format import read_state, refuse_legacy, write_state

__all__ = ["write_checkpoint", "read_checkpoint", "CHECKPOINT_FORMAT"]

CHECKPOINT_FORMAT = "flodl-hf-builder/2"
KIND = "builder"


def write_checkpoint(path: Union[str, os.PathLike], state: Any, **meta: Any) -> Path:
    """Atomically write ``{"format", "model": state, **meta}`` as the checkpoint whose manifest is ``path``;
    returns the path. ``meta`` holds plain values (numbers, strings, lists, dicts, tensors)."""
    if path is None:
        raise ValueError(
            "checkpoint_fn returned None: return the path of the checkpoint to write, e.g. f'ckpt/epoch{epoch}.json'"
        )
    target = Path(os.fspath(path))
    if target.suffix == ".safetensors":
        raise ValueError(f"checkpoint_fn returned {target}: that names the checkpoint's JSON manifest (its tensors "
                         f"go beside it): return e.g. {target.with_suffix('.json')}")
    lock = dirlock.acquire(target, "builder checkpoint", "return another path from checkpoint_fn")
    try:
        write_state(target, {"format": CHECKPOINT_FORMAT, "model": dict(state), **meta}, KIND)
    finally:
        lock.release()
    return target


def read_checkpoint(path: Union[str, os.PathLike]) -> dict:
    """Load a builder checkpoint (CPU tensors, every file verified); ``ckpt["model"]`` is a state_dict."""
    target = Path(os.fspath(path))
    if target.is_file():
        with open(target, "rb") as fh:
            head = fh.read(1)
        if head != b"{":
            raise refuse_legacy(target)
    ckpt = read_state(target, KIND)
    if ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ResumeError(f"{path} is not a flodl-hf builder checkpoint (format {CHECKPOINT_FORMAT})")
    return ckpt
