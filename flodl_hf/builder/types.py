"""The public value types of builder mode: the two policy enums, ``EpochMetrics`` and ``TrainedState``.

They live apart from the machinery (workers, coordinator) so that a user script, a test or the CLI can import
and inspect them without starting anything, and so that their fields, which are the builder's observable
contract, are documented in one place.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

__all__ = ["ApplyPolicy", "AverageBackend", "EpochMetrics", "TrainedState"]


class ApplyPolicy(enum.Enum):
    """When the workers' parameters are averaged (see design/el-che.md, "Builder-mode triggers").

    - ``SYNC``: after every batch (every rank runs one batch, then all average); data split equally. This is
      plain synchronous data parallelism and runs at the slowest device's pace.
    - ``CADENCE``: once calibrated, when every rank has computed for at least ``anchor`` batches of the
      slowest rank (``min_r wall_r >= anchor * max_r ms_per_batch``); before calibration, when every rank
      reached its El Che count. Work is handed out progressively, so fast ranks run more batches.
    - ``ASYNC``: when every rank reached its El Che count ``c_r`` (fast ranks may overshoot while they wait).
    """

    SYNC = "sync"
    CADENCE = "cadence"
    ASYNC = "async"


class AverageBackend(enum.Enum):
    """How an average is computed.

    - ``NCCL``: the process group's collective all-reduce among the workers (NCCL between GPUs, gloo on CPU).
      Fast, but every worker takes part in every average, so a dead worker stops the run (with a clear error).
    - ``CPU``: the workers send parameter snapshots to the coordinator (in the caller's process), which
      averages them off the workers' critical path and sends the result back; the workers keep training
      meanwhile and apply ``average - snapshot`` to their current parameters. A worker that does not answer
      within the round timeout is left out of that round; a dead worker is dropped and the survivors finish.
    """

    NCCL = "nccl"
    CPU = "cpu"


@dataclass
class EpochMetrics:
    """What one epoch did, aggregated over every rank (streamed by ``DdpHandle.next_metrics``).

    Epochs are pipelined (a fast rank may start epoch e+1 while a slow one finishes epoch e), so an epoch is
    reported when its last batch is done, and ``epoch_ms`` is the time since the previous epoch was done (or
    since training started): the sum over epochs is the training time.
    """

    epoch: int
    """0-based epoch index."""
    avg_loss: float
    """Mean training loss over the epoch's batches (every batch weighs the same; batches have equal size)."""
    epoch_ms: float
    """Milliseconds from the previous epoch's completion (or the start of training) to this one's."""
    scalars: dict[str, float]
    """Mean of every ``record_scalar(name, value)`` call of the epoch, over all ranks."""
    per_rank_scalars: list[dict[str, float]]
    """The same means, per rank."""
    per_rank_throughput: list[float]
    """Samples per second each rank delivered over the epoch (its samples / ``epoch_ms``); they sum to the
    epoch's throughput."""
    per_rank_batch_share: list[float]
    """Fraction of the epoch's batches each rank ran (sums to 1)."""
    devices: list[str]
    """Device of each rank."""
    per_rank_batches: list[int] = field(default_factory=list)
    """Batches each rank ran in this epoch."""
    samples: int = 0
    """Samples trained on in this epoch."""
    anchor: int = 1
    """El Che anchor when the epoch was reported (the divergence guard may have lowered it)."""
    rounds: int = 0
    """Averaging rounds completed since the start of training (on one device every batch is a round of one)."""
    divergence: Optional[float] = None
    """Largest relative distance ``||p_r - avg|| / ||avg||`` of the last averaging round (None before any)."""
    lost_ranks: list[int] = field(default_factory=list)
    """Ranks dropped so far (CPU backend: dead workers)."""
    noise_scale: Optional[float] = None
    """SYNC: the gradient noise scale ``B_noise`` in samples (``flodl_hf.elche.noise_scale``), smoothed over the
    averaged rounds so far, from the workers' own gradients and their average (no extra collective); None under
    CADENCE and ASYNC (replicas step on their own, so no round holds the gradients of one set of parameters) and
    before two ranks have contributed to a round."""


class TrainedState:
    """The trained model: averaged parameters and buffers, on the CPU, keyed like ``model.state_dict()``.

    ``load_into(model)`` copies them into a freshly built model of the same architecture (strictly: every key
    must match). Non-floating buffers (e.g. ``num_batches_tracked``) are taken from the lowest surviving rank.
    """

    def __init__(
        self,
        state: "OrderedDict[str, torch.Tensor]",
        *,
        world_size: int,
        devices: list[str],
        lost_ranks: Optional[list[int]] = None,
        rounds: int = 0,
        epochs: int = 0,
        el_che: Optional[dict[str, Any]] = None,
        lost_batches: Optional[dict[int, int]] = None,
        global_step: int = 0,
        resumes: Optional[list] = None,
    ) -> None:
        self._state = OrderedDict((k, v.detach().to("cpu")) for k, v in state.items())
        self.lost_batches = dict(lost_batches or {})
        """CPU backend: per dropped rank, the batches it ran after its last snapshot (their effect is lost)."""
        self.global_step = int(global_step)
        """Batches run by every device, counted at the last average (what the LR schedule followed)."""
        self.world_size = int(world_size)
        self.devices = list(devices)
        self.lost_ranks = list(lost_ranks or [])
        self.rounds = int(rounds)
        """Averaging rounds completed (on one device every batch is a round of one)."""
        self.epochs = int(epochs)
        self.el_che = el_che
        self.resumes = list(resumes or [])
        """One dict per resume of this run (``DdpBuilder.resume_from``): checkpoint, epoch it continued at,
        ``world_size_before`` / ``world_size_after``."""

    def state_dict(self) -> "OrderedDict[str, torch.Tensor]":
        """A copy of the averaged state (CPU tensors), loadable with ``model.load_state_dict``."""
        return OrderedDict((k, v.clone()) for k, v in self._state.items())

    def load_into(self, model: Any) -> Any:
        """Load the averaged state into ``model`` (strict) and return it: an ``nn.Module``, or a task head
        (its ``graph().module``)."""
        from .step import unwrap_model

        try:
            module = unwrap_model(model)
        except TypeError:
            raise TypeError(
                f"load_into takes a torch.nn.Module or a task head, got {type(model).__name__}") from None
        try:
            module.load_state_dict(self._state, strict=True)
        except RuntimeError as exc:
            raise ValueError(
                "the trained state does not fit this model: build it with the same model_factory "
                f"(same architecture and config) - {exc}"
            ) from exc
        return model

    def __repr__(self) -> str:
        numel = sum(v.numel() for v in self._state.values())
        return (
            f"TrainedState({len(self._state)} tensors, {numel} values, world_size={self.world_size}, "
            f"rounds={self.rounds}, lost_ranks={self.lost_ranks})"
        )
