"""Where a ``flodl-hf train`` job keeps its checkpoint, what it records there, and which resumes it refuses.

It exists so that the training job (``flodl_hf.job.run``) and its loop (``flodl_hf.job.loop``) share one set of
rules about the checkpoint directory, kept apart from the engine's file format (``flodl_hf.checkpoint.graph_state``):

- The directory is ``--checkpoint-dir``, else the ``--resume`` directory, else ``<output-dir>.checkpoint`` beside
  the output directory (outside it, so the output directory is still written in one atomic swap at the end).
  It holds the engine's checkpoint (``checkpoint.json`` and its ``checkpoint.{0,1}.safetensors``, the safe format
  of ``flodl_hf.checkpoint.format``) and, with ``--report-to tensorboard``, the live ``runs/`` event files.
- The job locks the checkpoint and output directories for the whole run (``flodl_hf.files.dirlock``, taken in
  ``flodl_hf.job.run``): a second run on either is refused naming the first.
- ``--resume`` reads the job plan from the manifest alone (JSON, checksum verified; no tensor, no torch, never a
  pickle); a legacy ``checkpoint.pt`` is refused with the ``flodl-hf convert-checkpoint --trust-pickle`` command.
- A fresh run refuses a directory that already holds a checkpoint (resume it, or pass ``--overwrite``).
- The job records a *plan* in the checkpoint's ``extra``: every setting that decides which rows, in which order,
  through which model. Resuming with any of them changed is refused with one
  :class:`~flodl_hf.checkpoint.graph_state.ResumeError` line naming the setting, both values and the fix. The learning rate
  may change on resume (e.g. lower it after a divergence); the output directory and reporting options too.
  The plan also records the SHA-256 of the data, the model and the other settings (``flodl_hf.job.fingerprints``):
  a resume on inputs whose content changed, under the same name and size, is refused naming what changed.
- The device count may change (elastic resume, ``flodl_hf.checkpoint.elastic``): ``--devices`` with another number
  of devices continues the epoch at the same sample, and the LR schedule keeps the run's sample position: its
  clock covers what remained of it in the micro-steps that remain on the new devices
  (``TrainerSchedule.continue_over``). Each resume is recorded with the device
  counts before and after (``metrics.json`` ``resumed``, the model card's "resumed" row).
- After a successful run the job removes what it wrote there (the checkpoint files, ``runs/``, the directory when
  it created it and it is left empty), unless ``--keep-checkpoint``. It deletes or replaces only what the
  directory's ownership marker records (``flodl_hf.files.ownership``): a user's files there are never touched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from ..files import ownership
from ..checkpoint.errors import ResumeError
from ..checkpoint.format import read_manifest, refuse_legacy, slot_names

#: The engine's checkpoint manifest (``flodl_hf.checkpoint.graph_state.CHECKPOINT_FILE``; not imported: that pulls in torch).
CHECKPOINT_FILE = "checkpoint.json"
#: Everything a job's checkpoint is made of (the manifest and its two tensor slots).
CHECKPOINT_FILES = (CHECKPOINT_FILE, *slot_names(CHECKPOINT_FILE))
#: The pickle checkpoint of earlier flodl-hf versions (refused; ``flodl-hf convert-checkpoint`` converts it).
LEGACY_FILE = "checkpoint.pt"

__all__ = ["start_or_resume", "CHECKPOINT_FILE", "CHECKPOINT_FILES", "LEGACY_FILE", "checkpoint_dir_for", "check_fresh_checkpoint_dir",
           "job_plan", "read_job_state", "check_plan",
           "prepare_checkpoints", "resume", "remove_job_checkpoint", "PLAN_FLAGS", "RUNS_DIR"]

RUNS_DIR = "runs"

#: Plan field -> the ``flodl-hf train`` option that sets it (named in refusal messages).
PLAN_FLAGS = {
    "model": "--model", "data": "--data", "text_column": "--text-column", "label_column": "--label-column",
    "labels": "--labels", "seed": "--seed", "train_rows": "--train-rows", "eval_rows": "--eval-rows",
    "max_length": "--max-length", "batch_size": "--batch-size",
    "epochs": "--epochs", "warmup_ratio": "--warmup-ratio", "precision": "--precision",
    "lr_scheduler_type": "--lr-scheduler-type", "lr_scheduler_kwargs": "--lr-scheduler-kwargs",
    "warmup_steps": "--warmup-steps", "weight_decay": "--weight-decay", "max_grad_norm": "--max-grad-norm",
    "split": "--split", "eval_data": "--eval-data", "eval_split": "--eval-split", "problem_type": "--problem-type",
    "text_pair_column": "--text-pair-column", "group_by_length": "--group-by-length",
}


def checkpoint_dir_for(output_dir: str, checkpoint_dir: Optional[str], resume: Optional[str]) -> Path:
    """The directory this job writes checkpoints to (see the module docstring)."""
    if checkpoint_dir:
        return Path(checkpoint_dir)
    if resume:
        return Path(resume)
    out = Path(output_dir)
    return out.parent / f"{out.name}.checkpoint"


def check_fresh_checkpoint_dir(directory: Path, overwrite: bool) -> None:
    """Refuse to start a fresh run over another run's checkpoint (call before any long work)."""
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"checkpoint path {directory} exists and is a file: choose a directory with "
                         "--checkpoint-dir")
    if ((directory / CHECKPOINT_FILE).is_file() or (directory / LEGACY_FILE).is_file()) and not overwrite:
        raise ValueError(f"{directory} already holds a checkpoint of an unfinished run: continue it with "
                         f"--resume {directory}, or pass --overwrite to start afresh (or choose --checkpoint-dir)")


def job_plan(settings: Any, sources: Any, labels: list, world_size: Optional[int]) -> dict:
    """The settings that fix the data plan and the model of a run (compared on resume)."""
    return {
        "model": str(Path(sources.model_path).resolve()), "data": str(Path(sources.data_path).resolve()),
        "text_column": sources.text_column, "label_column": sources.label_column, "labels": list(labels),
        "seed": settings.seed, "train_rows": settings.train_rows_cap, "eval_rows": settings.eval_rows,
        "max_length": settings.max_length, "batch_size": settings.batch_size, "world_size": world_size,
        "epochs": settings.epochs, "warmup_ratio": settings.warmup_ratio, "precision": settings.precision,
        # None when unset, so that checkpoints written before these options existed still resume
        "split": settings.split, "eval_split": settings.eval_split,
        "eval_data": str(Path(settings.eval_data).resolve()) if settings.eval_data else None,
        "problem_type": None if settings.problem_type == "single_label" else settings.problem_type,
        "text_pair_column": settings.text_pair_column, "group_by_length": bool(settings.group_by_length),
        "lr_scheduler_type": settings.lr_scheduler_type, "lr_scheduler_kwargs": settings.lr_scheduler_kwargs,
        "warmup_steps": settings.warmup_steps, "weight_decay": float(settings.weight_decay),
        "max_grad_norm": settings.clip_norm,
    }


def read_job_state(directory: str) -> dict:
    """The job state (``extra``) of the checkpoint in ``directory``, from its manifest alone (verified JSON; the
    tensors are checked when the engine loads them). A legacy pickle is refused, never opened."""
    from ..checkpoint.tree import decode

    path = Path(directory)
    target = path / CHECKPOINT_FILE if path.is_dir() or not path.exists() else path
    if not target.is_file():
        legacy = target.parent / LEGACY_FILE
        if legacy.is_file():
            raise refuse_legacy(legacy)
        raise ResumeError(f"no checkpoint at {target}: pass --resume the directory an interrupted "
                          "`flodl-hf train` printed")
    if target.suffix == ".pt":
        raise refuse_legacy(target)
    record = read_manifest(target, "setup")
    state = record.get("state")
    extra = decode(state.get("extra"), {}, str(target)) if isinstance(state, dict) else None
    if not isinstance(extra, dict) or not isinstance(extra.get("plan"), dict):
        raise ResumeError(f"{target} was not written by `flodl-hf train` (no job plan in it): resume it with the "
                          "script that wrote it, or start afresh without --resume")
    return extra


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return "default" if value is None else str(value)


def check_plan(saved: dict, current: dict, directory: Any) -> None:
    """Raise ResumeError naming the first plan setting that differs (None in ``current`` means unknown yet)."""
    if "lr_scheduler_type" not in saved:
        raise ResumeError(f"cannot resume from {directory}: it was written by an earlier flodl-hf, whose LR "
                          "schedule, weight decay and clipping were not Trainer's; finish it with that version, or "
                          "start afresh without --resume")
    from .fingerprints import named_by_content

    for key, flag in PLAN_FLAGS.items():  # the device count is not one of them: it may change (elastic resume)
        if named_by_content(saved, current, key):
            continue  # an input whose content both plans record: the content decides (flodl_hf.job.fingerprints)
        was, now = saved.get(key), current.get(key)
        if key == "group_by_length":  # absent: written before length grouping existed (plain shuffled batches)
            was, now = bool(was), bool(now)
        if key == "max_grad_norm":  # None: no clipping, which the option spells 0
            was, now = was or 0, now or 0
        if was != now:
            raise ResumeError(f"cannot resume from {directory}: it was written with {flag} {_shown(was)} but this "
                              f"run has {_shown(now)}; resume with the same settings, or start afresh without "
                              "--resume")


def prepare_checkpoints(settings: Any) -> tuple[Path, Optional[dict]]:
    """The checkpoint directory and, when resuming, the checkpoint's job state; refusals happen here, early."""
    directory = checkpoint_dir_for(settings.output_dir, settings.checkpoint_dir, settings.resume)
    saved = read_job_state(settings.resume) if settings.resume else None
    if not settings.resume or directory.resolve() != Path(settings.resume).resolve():
        check_fresh_checkpoint_dir(directory, settings.overwrite)
    return directory, saved


def resume(graph: Any, settings: Any, saved: dict, plan: dict, schedule: Any, say: Callable[[str], None]) -> Any:
    """Load the checkpoint into ``graph``; return the loop state it carries (with this resume recorded)."""
    from .loop import LoopState

    check_plan(saved["plan"], plan, settings.resume)
    state = LoopState.from_extra(graph.load_checkpoint(settings.resume))
    before = int(saved["plan"].get("world_size") or 1)
    record: dict = {"step": int(graph.training_step), "micro_batch": len(state.losses),
                    "checkpoint_dir": str(settings.resume),
                    "world_size_before": before, "world_size_after": int(graph.world_size)}
    if saved["plan"].get("devices") is not None:
        record["devices_before"] = list(saved["plan"]["devices"])
    if plan.get("devices") is not None:
        record["devices_after"] = list(plan["devices"])
    if schedule is not None:
        schedule.continue_over(graph.steps_remaining(settings.epochs))
    old_lr = saved["plan"].get("lr")
    if old_lr is not None and float(old_lr) != float(settings.lr):
        if schedule is not None:
            schedule.set_base_lr(settings.lr)
        else:
            for group in graph.optimizer.param_groups:
                group["lr"] = settings.lr
        record.update(lr=settings.lr, previous_lr=old_lr)
    state.resumes.append(record)
    at = graph.epoch_position()
    devices = "" if before == graph.world_size else (f"; {before} -> {graph.world_size} device(s): epoch "
                                                     f"{at.epoch + 1} continues at sample {at.samples} of "
                                                     f"{at.end}, El Che recalibrates")
    say(f"flodl-hf: resuming from step {graph.training_step} (epoch {at.epoch + 1}, {at.steps} steps into it) of "
        f"{settings.resume}" + (f"; lr {old_lr:g} -> {settings.lr:g}" if "lr" in record else "") + devices)
    return state


def remove_job_checkpoint(directory: Path, runs: bool = True) -> None:
    """Remove what a job wrote in its checkpoint directory: the checkpoint files, ``runs/`` (when ``runs``), and
    the directory itself if flodl-hf created it and nothing else is left. Only entries its marker records."""
    names = [*CHECKPOINT_FILES, LEGACY_FILE] + ([RUNS_DIR] if runs else [])
    ownership.remove_owned(directory, names)


def start_or_resume(graph: Any, settings: Any, rows: int, saved: Optional[dict], plan: dict,
                    say: Callable[[str], None]) -> tuple[int, int, Any, Any]:
    """After the data loader is set: ``(steps per epoch, total micro-steps, the TrainerSchedule, the
    LoopState)``, with the schedule set on the graph, the plan's device fields filled, and ``saved`` (a checkpoint
    read by :func:`prepare_checkpoints`) resumed. Every task's job starts this way. Raises ValueError when the rows
    are fewer than one global batch."""
    from .loop import LoopState
    from .schedule import TrainerSchedule, warmup_steps_for

    steps = graph.steps_per_epoch()
    if steps == 0:
        raise ValueError(f"{rows} training rows are fewer than one global batch of "
                         f"{graph.world_size * settings.batch_size}: lower --batch-size or add rows")
    total = steps * settings.epochs
    warmup = warmup_steps_for(total, settings.warmup_steps, settings.warmup_ratio)
    schedule = TrainerSchedule(graph.optimizer, settings.lr_scheduler_type, total, warmup,
                               settings.lr_scheduler_kwargs)
    graph.set_scheduler(schedule)
    plan["world_size"] = graph.world_size
    plan["devices"] = [str(d) for d in settings.devices] if settings.devices else [str(graph.device)]
    state = resume(graph, settings, saved, plan, schedule, say) if saved is not None else LoopState()
    if saved is not None:  # on another device count the remaining epochs have another number of steps
        total = len(state.losses) + graph.steps_remaining(settings.epochs)
    return steps, total, schedule, state
