"""``flodl-hf train``: the parsed options -> ``TrainSettings`` -> the job, and the exit code of its outcome.

It exists so that the train command is only this translation: the job itself (every task, one pipeline) is
``flodl_hf.job.run.run_train``, which never imports ``heads``; the task's head class is passed from here
(``flodl_hf.cli.head_classes``). A Ctrl-C prints the command that resumes the run (:func:`resume_command`) and
exits 130; a diverged run exits 1.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any, Sequence

from ..export.tasks import TEXT_CLASSIFICATION
from .head_classes import LazyHeadClass
from .parser import PROG

__all__ = ["settings_from_args", "run_train", "resume_command", "cmd_train"]


def settings_from_args(args: argparse.Namespace) -> Any:
    """The ``TrainSettings`` of a parsed ``train`` command (validated: a bad value is one ValueError line)."""
    from ..job.settings import TrainSettings

    return TrainSettings(task=getattr(args, "task", None) or TEXT_CLASSIFICATION, model=args.model, data=args.data,
                         text_column=args.text_column,
                         label_column=args.label_column, labels=args.labels, encoding=args.encoding,
                         split=args.split, eval_data=args.eval_data, eval_split=args.eval_split,
                         problem_type=args.problem_type, text_pair_column=args.text_pair_column,
                         metric_for_best=args.metric_for_best,
                         epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, max_length=args.max_length,
                         train_rows=args.train_rows, eval_rows=args.eval_rows, seed=args.seed,
                         output_dir=args.output_dir, overwrite=args.overwrite, devices=args.devices,
                         precision=args.precision, warmup_ratio=args.warmup_ratio, warmup_steps=args.warmup_steps,
                         lr_scheduler_type=args.lr_scheduler_type, lr_scheduler_kwargs=args.lr_scheduler_kwargs,
                         weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm,
                         progress=not args.no_progress,
                         group_by_length=args.group_by_length,
                         checkpoint_every=args.checkpoint_every, checkpoint_dir=args.checkpoint_dir,
                         keep_checkpoint=args.keep_checkpoint, resume=args.resume, eval_every=args.eval_every,
                         early_stopping_patience=args.early_stopping_patience, report_to=args.report_to,
                         speed_hint=args.speed_hint, overhead_target=args.overhead_target,
                         anchor_rule=args.anchor_rule, fixed_anchor=args.fixed_anchor, lr_scaling=args.lr_scaling,
                         max_anchor=args.max_anchor,
                         replay_plan=args.replay_plan,
                         max_micro_batch=args.max_micro_batch)




def run_train(args: Any) -> dict:
    """Run ``flodl-hf train`` in-process: ``args`` is a parsed Namespace or a ``TrainSettings``."""
    from ..job.run import run_train as job
    from ..job.settings import TrainSettings

    settings = args if isinstance(args, TrainSettings) else settings_from_args(args)
    try:
        return job(settings, LazyHeadClass(settings.task))
    finally:
        context = sys.modules.get("flodl_hf.distributed.context")
        if context is not None:  # nothing to shut down when the run stopped before starting ranks
            context.shutdown()


def resume_command(argv: Sequence[str], directory: Any) -> str:
    """The ``flodl-hf train`` command line that continues an interrupted run (``argv`` minus any old --resume)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--resume":
            skip = True
        elif not arg.startswith("--resume="):
            kept.append(str(arg))
    return " ".join(shlex.quote(a) for a in [PROG, *kept, "--resume", str(directory)])


def cmd_train(args: argparse.Namespace, argv: Sequence[str] = ("train",)) -> int:
    """``flodl-hf train``; the exit code (130 after Ctrl-C with the resume command printed, 1 when diverged)."""
    try:
        run_train(args)
    except Exception as exc:
        loop = sys.modules.get("flodl_hf.job.loop")  # not imported: the run stopped before training
        if loop is not None and isinstance(exc, loop.TrainingInterrupted):
            if not exc.is_main:
                return 0  # rank 0 reports and sets the exit code
            print(f"{PROG}: interrupted at step {exc.step} (epoch {exc.epoch}); checkpoint saved. Resume with: "
                  f"{resume_command(argv, exc.checkpoint_dir)}", file=sys.stderr, flush=True)
            return 130
        if loop is not None and isinstance(exc, loop.TrainingDiverged):
            if not exc.is_main:
                return 0
            print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
            return 1
        raise
    return 0
