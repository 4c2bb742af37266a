"""Checkpoint and resume for a Graph: everything needed to continue a run as if it had never stopped.

A checkpoint is written by rank 0 (replicas are identical) into a directory, in the safe format of
``flodl_hf.checkpoint.format``: ``checkpoint.json`` (positions, settings, optimizer and scheduler non-tensor state,
El Che state, Python and NumPy RNG states, the job's ``extra``; format version and SHA-256 checksums) and
``checkpoint.0.safetensors`` or ``checkpoint.1.safetensors`` (the module's weights, the optimizer's tensors, every
rank's torch / CUDA RNG states). It holds the module's weights, the optimizer and LR-scheduler states, the El Che
state, every rank's RNG states (torch, CUDA, Python, NumPy), the epoch position (epoch, micro-batches done in it,
and samples of the epoch's permutation consumed: ``epoch_position``), the optimizer step count and the data plan
(batch size, world size, seed). Resuming restores all of it; ``graph.epoch(n)`` then skips what was done, so the user's loop runs unchanged and, on CPU, reproduces the
uninterrupted run's losses exactly. Loading never unpickles: a legacy ``checkpoint.pt`` (a pickle) is refused with
the command that converts it (``flodl-hf convert-checkpoint --trust-pickle DIR``).

The first save into a directory locks it for the rest of the process (``flodl_hf.files.dirlock``): another process that
saves there is refused with a line naming this one. A failed write (full disk, read-only directory) raises
``CheckpointWriteError`` and leaves the previous checkpoint loadable.

A checkpoint written on N ranks resumes on any number M of ranks (elastic resume): the epoch continues at the same
sample, rank 0's weights and optimizer state apply to every rank, El Che recalibrates, and ranks beyond the old
world get derived RNG states. What is carried and what is not: ``flodl_hf.checkpoint.elastic``.

Checkpoints are taken at a window boundary (right after a ``graph.step()`` that stepped the optimizer).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

import torch

from ..files import dirlock
from .errors import ResumeError
from .format import read_state, refuse_legacy, write_state
from .elastic import derived_seed, restore_el_che, saved_position, seed_everything
from .position import EpochPosition

if TYPE_CHECKING:
    from ..graph import Graph

__all__ = ["CHECKPOINT_FILE", "LEGACY_FILE", "ResumeError", "save_checkpoint", "load_checkpoint",
           "find_checkpoint"]

#: The manifest of a directory's checkpoint (its tensors are in ``checkpoint.{0,1}.safetensors`` beside it).
CHECKPOINT_FILE = "checkpoint.json"
#: The pickle file of flodl-hf's first checkpoint format: refused, or converted by ``convert-checkpoint``.
LEGACY_FILE = "checkpoint.pt"
#: Version of the state layout inside the manifest (``"format"`` of the state dict).
FORMAT = 2
KIND = "setup"


def _rng_state() -> dict:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])


def _gather_rng(graph: "Graph") -> list[dict]:
    own = _rng_state()
    if not graph.is_distributed:
        return [own]
    import torch.distributed as dist

    from ..distributed.context import side_group

    gathered: list[Optional[dict]] = [None] * graph.world_size
    dist.all_gather_object(gathered, own, group=side_group())  # gloo beside NCCL: a lost peer raises at once
    return [g for g in gathered if g is not None]


def find_checkpoint(directory: Union[str, Path]) -> Optional[Path]:
    """The checkpoint manifest in ``directory`` if there is one."""
    path = Path(directory) / CHECKPOINT_FILE
    return path if path.is_file() else None


def save_checkpoint(graph: "Graph", directory: Union[str, Path], extra: Optional[dict] = None) -> Optional[Path]:
    """Write the checkpoint in ``directory`` atomically (rank 0 writes; every rank must call it). Returns the
    manifest path (``<directory>/checkpoint.json``) on rank 0, None elsewhere. CheckpointLockedError when another
    process writes ``directory``; CheckpointWriteError (previous checkpoint intact) when the write fails."""
    runtime = graph._runtime
    if runtime is not None and runtime.pending_micro_batches() > 0:
        raise ResumeError("save_checkpoint in the middle of an El Che window: call it right after a "
                              "graph.step() that stepped the optimizer (graph.training_step changed)")
    rng = _gather_rng(graph)
    if not graph.is_main:
        return None
    el_che = graph.el_che()
    state = {
        "format": FORMAT,
        "model": {k: v.detach().cpu() for k, v in graph.module.state_dict().items()},
        "optimizer": graph.optimizer.state_dict() if graph.optimizer is not None else None,
        "scheduler": graph.scheduler.state_dict() if graph.scheduler is not None else None,
        "el_che": el_che.state_dict() if el_che is not None else None,
        "rng": rng,
        "position": graph.position(),
        "epoch_position": graph.epoch_position().to_state(),
        "training_step": graph.training_step,
        "plan": {"world_size": graph.world_size, "batch_size": graph._batch_size, "seed": graph._seed},
        "extra": extra or {},
    }
    dirlock.hold(directory, "checkpoint directory", "save to another checkpoint directory")
    return write_state(Path(directory) / CHECKPOINT_FILE, state, KIND)


def _load_file(path: Path) -> dict:
    if path.is_dir():
        path = path / CHECKPOINT_FILE
    if not path.is_file():
        legacy = path.parent / LEGACY_FILE
        if path.name == CHECKPOINT_FILE and legacy.is_file():
            raise refuse_legacy(legacy)
        raise ResumeError(f"no checkpoint at {path}: pass a directory written by graph.save_checkpoint "
                              "(or `flodl-hf train --resume DIR` with such a directory)")
    if path.suffix == ".pt":
        raise refuse_legacy(path)
    state = read_state(path, KIND)
    if state.get("format") != FORMAT:
        raise ResumeError(f"{path} is not a flodl-hf setup-mode checkpoint (state format {FORMAT} expected)")
    return state


def load_checkpoint(graph: "Graph", directory: Union[str, Path]) -> dict:
    """Restore ``graph`` (already set up, with its data loader set) from a checkpoint; returns its ``extra``."""
    state = _load_file(Path(directory))
    plan = state["plan"]
    saved_world = int(plan["world_size"])
    if graph._batch_size and plan["batch_size"] and plan["batch_size"] != graph._batch_size:
        raise ResumeError(f"checkpoint used batch_size {plan['batch_size']} but this run uses "
                              f"{graph._batch_size}: resume with the same batch size")
    own = graph.module.state_dict()
    saved = state["model"]
    missing = sorted(set(own) - set(saved))
    unexpected = sorted(set(saved) - set(own))
    shapes = [k for k in own if k in saved and tuple(own[k].shape) != tuple(saved[k].shape)]
    if missing or unexpected or shapes:
        detail = "; ".join(part for part in (
            f"missing {missing[:3]}" if missing else "", f"unexpected {unexpected[:3]}" if unexpected else "",
            f"shape mismatch {shapes[:3]}" if shapes else "") if part)
        raise ResumeError(f"checkpoint does not fit this model ({detail}): resume with the same model and "
                              "number of labels")
    total = None if graph._dataset is None else len(graph._dataset)
    try:
        position = saved_position(state, total, graph.config.drop_last)
    except (ValueError, KeyError, TypeError) as exc:
        raise ResumeError(f"checkpoint {directory} has an unreadable epoch position ({exc}); it may be damaged: "
                          "start afresh") from exc
    if not isinstance(position, EpochPosition) and saved_world != graph.world_size:
        raise ResumeError(f"checkpoint {directory} of {saved_world} rank(s) records its position in steps: call "
                          f"graph.set_data_loader(...) before load_checkpoint to resume it on {graph.world_size}")
    if isinstance(position, EpochPosition) and total is not None and position.end > total:
        raise ResumeError(f"checkpoint's epoch covers {position.end} samples but this dataset has "
                          f"{len(graph._dataset)}: resume with the same dataset")
    graph.module.load_state_dict(saved)
    if state["optimizer"] is not None and graph.optimizer is not None:
        graph.optimizer.load_state_dict(state["optimizer"])
    if state["scheduler"] is not None and graph.scheduler is not None:
        graph.scheduler.load_state_dict(state["scheduler"])
    restore_el_che(graph.el_che(), state["el_che"], saved_world, graph.world_size)
    rng = state["rng"]
    graph.training_step = int(state["training_step"])
    if graph.rank < len(rng):
        _set_rng_state(rng[graph.rank])
    else:  # a rank the old run did not have (flodl_hf.checkpoint.elastic)
        seed_everything(derived_seed(int(plan["seed"]), graph.training_step, graph.rank))
    graph._seed = int(plan["seed"])
    graph.resume_from(position)
    if saved_world != graph.world_size and graph.is_main and graph.config.verbose \
            and isinstance(position, EpochPosition):
        print(f"flodl-hf: resuming a checkpoint of {saved_world} rank(s) on {graph.world_size}: epoch "
              f"{position.epoch + 1} continues at sample {position.samples} of {position.end}; El Che recalibrates "
              "on the new devices", file=sys.stderr)
    return dict(state.get("extra") or {})
