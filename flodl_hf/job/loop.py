"""The loop of ``flodl-hf train``: the plain setup-mode loop plus what a long run needs at each optimizer step.

It exists to keep ``flodl_hf.job.run`` (settings, data, model, outputs) apart from the per-step policy, which is:

- **Checkpoints** every ``checkpoint_every`` optimizer steps, always right after a ``graph.step()`` that stepped the
  optimizer (the engine's requirement). The job's own state (rank 0's loss history, evaluation history,
  early-stopping counters, training time, resume records) rides in the checkpoint's ``extra``, so a resumed run's
  ``metrics.json`` and loss curve cover the whole run.
- **Ctrl-C**: the first SIGINT (see ``flodl_hf.job.interrupt``) makes the loop finish the current step, write a
  checkpoint and raise :class:`TrainingInterrupted`; a second SIGINT aborts at once.
- **Divergence**: a NaN or infinite loss raises :class:`TrainingDiverged` naming the step; no checkpoint is written
  from that state, so the last good one is kept.
- **TensorBoard**: each micro-batch's loss and learning rate (``train/loss``, ``train/learning_rate``), and after
  each optimizer step the gradient norm before clipping (``train/grad_norm``) and, on N ranks, El Che's anchor,
  gradient noise scale, estimated statistical efficiency, each rank's share of the global batch and the share of
  the window's time spent synchronising (``el_che/...``), all at the micro-step.
- **Evaluation** on the held-out split every ``eval_every`` optimizer steps (rank 0), recorded in the history, the
  progress bar and TensorBoard; each evaluation that improves ``LoopOptions.metric`` is handed to
  ``LoopOptions.on_best`` (the job keeps those weights: ``flodl_hf.job.evaluate.BestWeights``), and **early
  stopping** follows ``patience`` evaluations without improvement.

On N ranks every decision must be the same on every rank (they all checkpoint, stop or go on together): the three
flags (interrupted, diverged, early stop) are raised with ``graph.raise_flag`` before ``graph.step()`` and read
with ``graph.agreed_flags()`` after the optimizer step. They ride in the window's metadata, so agreeing costs no
collective, and a rank that fails between two windows is reported by the next exchange instead of meeting a
mismatched collective. Rank 0's early-stopping verdict, decided after an evaluation, reaches the others with the
next optimizer step.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ..checkpoint.graph_state import CHECKPOINT_FILE
from .interrupt import GracefulInterrupt
from .outputs import step_scalars

__all__ = ["LoopOptions", "LoopState", "TrainingInterrupted", "TrainingDiverged", "run_loop"]


class TrainingInterrupted(Exception):
    """Ctrl-C stopped the run at an optimizer-step boundary, after writing a checkpoint."""

    def __init__(self, step: int, epoch: int, checkpoint_dir: Path, is_main: bool) -> None:
        super().__init__(f"interrupted at step {step} (epoch {epoch}); checkpoint written to {checkpoint_dir}")
        self.step, self.epoch, self.checkpoint_dir, self.is_main = step, epoch, checkpoint_dir, is_main


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite; nothing was written from that state."""

    def __init__(self, message: str, is_main: bool) -> None:
        super().__init__(message)
        self.is_main = is_main


@dataclass
class LoopOptions:
    epochs: int
    steps_per_epoch: int
    checkpoint_dir: Path
    checkpoint_every: Optional[int] = None
    eval_every: Optional[int] = None
    patience: Optional[int] = None
    lr: float = 5e-5
    progress: bool = True
    metric: str = "accuracy"
    """The held-out metric that decides improvement (early stopping, the best checkpoint)."""
    greater_is_better: bool = True
    on_best: Optional[Callable[[int, dict], None]] = None
    """Called on rank 0 with (step, summary) after each evaluation that improves ``metric``."""
    prefetch: int = 2
    """Batches tokenised ahead on a background thread (``graph.epoch(n, prefetch=...)``)."""
    total_steps: Optional[int] = None
    """Micro-steps of the whole run, when a resume on another device count made it differ from
    ``steps_per_epoch * epochs``."""


@dataclass
class LoopState:
    """What the job carries across a resume (stored in the checkpoint's ``extra`` next to the job plan)."""

    losses: list = field(default_factory=list)
    """Rank 0's loss of every micro-batch so far."""
    evals: list = field(default_factory=list)
    """One dict per held-out evaluation: step, micro_batch, epoch and the problem type's scalar metrics."""
    best_metric: Optional[str] = None
    best_value: Optional[float] = None
    best_step: Optional[int] = None
    evals_since_best: int = 0
    train_time_s: float = 0.0
    resumes: list = field(default_factory=list)
    """One dict per resume: the step it continued from, the checkpoint directory, the device counts before and
    after (``world_size_before`` / ``world_size_after``, and the device names when known), the LR if it changed."""
    stop_reason: str = "completed"
    stopped_at_step: Optional[int] = None

    def to_extra(self, plan: dict) -> dict:
        return {"plan": plan, "loop": asdict(self)}

    @classmethod
    def from_extra(cls, extra: dict) -> "LoopState":
        known = {k: v for k, v in (extra.get("loop") or {}).items() if k in cls.__dataclass_fields__}
        return cls(**known)


_INTERRUPTED, _DIVERGED, _EARLY = 0, 1, 2


def _agreed(graph: Any) -> list[bool]:
    """The three stop flags as agreed at the last optimizer step (an OR over ranks carried by the window)."""
    bits = graph.agreed_flags()
    return [bool(bits >> i & 1) for i in (_INTERRUPTED, _DIVERGED, _EARLY)]


def _bar(total: int, initial: int, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, file=sys.stderr, dynamic_ncols=True,
                desc="train", unit="step")


def run_loop(head: Any, graph: Any, state: LoopState, options: LoopOptions, *, plan: dict,
             evaluate: Callable[[], dict], board: Any = None,
             say: Callable[[str], None] = print) -> LoopState:
    """Train ``options.epochs`` epochs (skipping what a loaded checkpoint already did); return the updated state.

    ``evaluate()`` (called on rank 0 only) returns a classification summary of the held-out split. ``board`` is a
    ``flodl_hf.job.outputs.ScalarBoard`` or None. Raises :class:`TrainingInterrupted` / :class:`TrainingDiverged`.
    """
    main = graph.is_main
    total = options.total_steps or options.steps_per_epoch * options.epochs
    last_saved: Optional[int] = None
    started = time.perf_counter()
    base_time = state.train_time_s
    bad: Optional[tuple[int, int, float]] = None  # (step, epoch, loss) of the first non-finite loss
    postfix: dict = {}
    if state.evals and options.metric in state.evals[-1]:
        postfix[options.metric] = f"{state.evals[-1][options.metric]:.3f}"

    def save(step: int) -> None:
        nonlocal last_saved
        state.train_time_s = base_time + (time.perf_counter() - started)
        graph.save_checkpoint(options.checkpoint_dir, extra=state.to_extra(plan))
        last_saved = step
        say(f"flodl-hf: checkpoint at step {step} written to {options.checkpoint_dir}")

    bar = _bar(total, len(state.losses) if main else 0, options.progress and main)
    try:
        with GracefulInterrupt() as interrupt:
            early_pending = False  # rank 0's early-stopping verdict, raised with the next step
            for epoch in range(options.epochs):
                for enc, labels in graph.epoch(epoch, prefetch=options.prefetch):
                    loss = head.compute_loss(enc, labels)
                    graph.backward(loss)  # loss.backward(), scaled under fp16 loss scaling
                    before = graph.training_step
                    lr = graph.optimizer.param_groups[0]["lr"] if board is not None else None  # this batch's
                    value = float(loss.detach())
                    if not math.isfinite(value) and bad is None:
                        bad = (before + 1, epoch + 1, value)
                    # Flags raised now are seen by every rank right after the next optimizer step.
                    if interrupt.requested:
                        graph.raise_flag(_INTERRUPTED)
                    if bad is not None:
                        graph.raise_flag(_DIVERGED)
                    if early_pending:
                        graph.raise_flag(_EARLY)
                    graph.step()
                    if main:
                        state.losses.append(value)
                        if board is not None:
                            board.add("train/loss", value, len(state.losses))
                            board.add("train/learning_rate", float(lr), len(state.losses))
                        postfix.update(loss=f"{value:.4f}", epoch=epoch + 1)
                        bar.set_postfix(postfix, refresh=False)
                    bar.update(1)
                    if graph.training_step == before:
                        continue  # inside an El Che window: nothing may be decided until it closes
                    step = graph.training_step
                    if board is not None:
                        for tag, scalar in step_scalars(graph).items():
                            board.add(tag, scalar, len(state.losses))
                    stop, diverged, early = _agreed(graph)
                    early_pending = False
                    if diverged:
                        graph.close()
                        raise TrainingDiverged(_diverged_message(bad, step, epoch, options, last_saved,
                                                                 state), main)
                    if options.eval_every and step % options.eval_every == 0 and bad is None and main and not early:
                        # Rank 0's verdict reaches the other ranks with the next optimizer step (one more step on
                        # N ranks; on one device it stops at once).
                        early_pending = _evaluate(state, options, step, epoch, evaluate, board, postfix, bar)
                        if early_pending and not graph.is_distributed:
                            early, early_pending = True, False
                    if (options.checkpoint_every and step % options.checkpoint_every == 0) or stop:
                        if not _weights_finite(graph):  # identical replicas: every rank finds the same
                            graph.close()
                            raise TrainingDiverged(_diverged_message(None, step, epoch, options, last_saved,
                                                                     state, "the weights became non-finite"), main)
                        save(step)
                    if stop:
                        graph.close()
                        raise TrainingInterrupted(step, epoch + 1, options.checkpoint_dir, main)
                    if early:
                        state.stop_reason = (f"early stopping: held-out {options.metric} did not improve for "
                                             f"{options.patience} evaluations" + (
                                                 f" (best {state.best_value:.4f} at step {state.best_step})"
                                                 if state.best_value is not None else ""))
                        state.stopped_at_step = step
                        say(f"flodl-hf: {state.stop_reason}; stopping at step {step}")
                        break
                if state.stopped_at_step is not None:
                    break
            graph.close()
    finally:
        bar.close()
    state.train_time_s = base_time + (time.perf_counter() - started)
    if state.stopped_at_step is None:
        state.stopped_at_step = graph.training_step
    return state


def _evaluate(state: LoopState, options: LoopOptions, step: int, epoch: int, evaluate: Callable[[], dict],
              board: Any, postfix: dict, bar: Any) -> bool:
    """Evaluate now (rank 0), record it; True when early stopping's patience is exhausted."""
    summary = evaluate()
    scalars = {k: float(v) for k, v in summary.items() if isinstance(v, (int, float)) and k != "num_examples"}
    record = {"step": step, "micro_batch": len(state.losses), "epoch": epoch + 1, **scalars}
    state.evals.append(record)
    if board is not None:
        for name, value in scalars.items():
            board.add(f"eval/{name}", value, record["micro_batch"])
    value = record[options.metric]
    postfix[options.metric] = f"{value:.3f}"
    bar.set_postfix(postfix, refresh=False)
    improved = state.best_value is None or (value > state.best_value if options.greater_is_better
                                            else value < state.best_value)
    if improved:
        state.best_metric, state.best_value, state.best_step, state.evals_since_best = options.metric, value, step, 0
        if options.on_best is not None:
            options.on_best(step, summary)
    else:
        state.evals_since_best += 1
    return bool(options.patience) and state.evals_since_best >= int(options.patience)


def _weights_finite(graph: Any) -> bool:
    import torch

    with torch.no_grad():
        return all(bool(torch.isfinite(p).all()) for p in graph.module.parameters())


def _diverged_message(bad: Optional[tuple[int, int, float]], step: int, epoch: int, options: LoopOptions,
                      last_saved: Optional[int], state: LoopState, what: Optional[str] = None) -> str:
    where = f"step {bad[0]} (epoch {bad[1]})" if bad is not None else f"step {step} (epoch {epoch + 1})"
    what = what or f"the training loss became {bad[2] if bad is not None else 'nan'}"
    lower = options.lr / 10 if options.lr <= 1e-2 else 5e-5
    message = (f"{what} at {where}: the learning rate {options.lr:g} is probably too high; retry with a lower "
               f"--lr (e.g. {lower:g})")
    saved_step = last_saved if last_saved is not None else (state.resumes[-1]["step"] if state.resumes else None)
    if (options.checkpoint_dir / CHECKPOINT_FILE).is_file() and saved_step is not None:
        message += (f"; the last checkpoint, from before it (step {saved_step}), is kept in {options.checkpoint_dir}: "
                    f"add --resume {options.checkpoint_dir} and a lower --lr to continue from it")
    return message + "; nothing was written to the output directory"
