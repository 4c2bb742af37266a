"""Elastic resume: what a setup-mode checkpoint written on N ranks gives each of M ranks that resume it.

It exists so that the rules for a change of device count live in one place, apart from the file format
(``flodl_hf.checkpoint.graph_state``):

- **Position.** The epoch continues at the same *sample* of its permutation (``flodl_hf.checkpoint.position``): every
  remaining sample of the interrupted epoch is seen exactly once, none twice. Checkpoints of the older form, which
  recorded ``(epoch, steps done)``, are read with the global batch they were written with.
- **Model and optimizer.** Replicas are identical in setup mode, so rank 0's weights and optimizer state apply to
  every new rank, whatever M is. The LR scheduler's state is restored as saved (its clock counts micro-steps,
  whose number per epoch depends on the world size: ``flodl-hf train`` rescales its schedule, see
  ``flodl_hf.job.schedule``; a script sizes its own with ``graph.steps_remaining(epochs)``).
- **El Che** restarts its calibration when M differs from N: its state is per rank (speeds, micro-batch split)
  and its anchor was tuned against the old devices' compute and synchronisation times, so nothing of it is
  carried; the new El Che starts from the configuration (``DdpConfig.anchor`` / speed hint) and measures the new
  devices. On the same M its whole state is restored, as before.
- **RNG.** Rank r gets the RNG states saved by rank r when the old run had one; a rank beyond the old world gets a
  deterministic derivation: torch (CPU and CUDA), Python and NumPy generators seeded from ``(seed, optimizer step,
  rank)`` (:func:`derived_seed`). On the same M every rank gets its own saved states, so a resume reproduces the
  uninterrupted run exactly on CPU.
"""

from __future__ import annotations

import random
from typing import Any, Optional, Union

import torch

from .position import EpochPosition

__all__ = ["saved_position", "derived_seed", "seed_everything", "restore_el_che"]


def saved_position(state: dict, total: Optional[int], drop_last: bool) -> Union[EpochPosition, tuple[int, int]]:
    """The epoch position a checkpoint state records: ``epoch_position`` when present, else the older
    ``(epoch, steps done)`` at the global batch the checkpoint was written with (left as that pair when the
    dataset is not known yet and the world size did not change: ``graph.resume_from`` reads it then)."""
    if state.get("epoch_position") is not None:
        return EpochPosition.from_state(state["epoch_position"])
    plan = state["plan"]
    epoch, steps = (int(v) for v in state["position"])
    if total is None:
        return (epoch, steps)
    global_batch = int(plan["world_size"]) * int(plan["batch_size"] or 1)
    return EpochPosition.from_steps((epoch, steps), total, global_batch, drop_last)


def derived_seed(seed: int, step: int, rank: int) -> int:
    """The seed of a rank that did not exist when the checkpoint was written (a 63-bit mix of its inputs)."""
    value = (int(seed) * 0x9E3779B97F4A7C15 + int(step) * 0xBF58476D1CE4E5B9 + int(rank) * 0x94D049BB133111EB)
    return value % (2 ** 63)


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and every CUDA device), Python and NumPy from ``seed``."""
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % (2 ** 32))
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass


def restore_el_che(el_che: Any, saved: Any, saved_world: int, world: int) -> bool:
    """Load El Che's saved state on the same world size; on another one keep the fresh scheduler (it
    recalibrates on the new devices). True when the state was loaded."""
    if el_che is None or saved is None or saved_world != world:
        return False
    el_che.load_state_dict(saved)
    return True
