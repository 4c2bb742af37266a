"""Which task a command runs a model directory as: ``--task``, or the head its ``config.json`` names.

It exists so that ``eval``, ``predict``, ``export`` and ``verify`` agree on one rule: the task comes from the
checkpoint's ``architectures`` (``flodl_hf.export.tasks``), a ``--task`` that disagrees with it is refused in one
line, and a directory whose task cannot be read is handled as a text classifier (whose checks then report what is
wrong with it). Options the task cannot honour are refused naming the option and the task (the plug-ins'
``unsupported`` tables, ``flodl_hf.job.tasks``).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..export.tasks import ARCHITECTURE_SUFFIXES, TEXT_CLASSIFICATION, check_task_matches, task_of_model_dir
from ..job.tasks import get_task
from ..job.tasks.base import refuse_unsupported

__all__ = ["command_task", "route", "verified_task", "refuse_options"]


def refuse_options(args: argparse.Namespace, task: str, command: str) -> None:
    """Refuse the first option of ``command`` that ``task`` does not support and ``args`` sets."""
    refuse_unsupported(args, task, get_task(task).unsupported.get(command, ()), command)


def command_task(args: argparse.Namespace, command: str) -> str:
    """The task ``eval`` / ``predict`` runs with: ``--task`` or the checkpoint's (after checking the directory)."""
    from ..preflight import check_model_dir

    check_model_dir(args.model)
    return check_task_matches(args.model, getattr(args, "task", None), command)


def route(args: argparse.Namespace, command: str) -> str:
    """The task of an ``eval`` / ``predict`` command. A text-classification model (or a directory whose task
    cannot be read: the classifier path reports its problems) keeps the classifier's checks."""
    task = getattr(args, "task", None)
    if task not in (None, TEXT_CLASSIFICATION):
        return command_task(args, command)
    try:
        found, _ = task_of_model_dir(args.model)
    except (OSError, ValueError, AttributeError, TypeError):
        found = None
    if found in (None, TEXT_CLASSIFICATION):
        if command == "predict":
            refuse_options(args, TEXT_CLASSIFICATION, command)
        return TEXT_CLASSIFICATION
    return command_task(args, command)


def verified_task(path: Any) -> str:
    """The task ``export`` and ``verify`` check ``path`` as, from its ``config.json`` ``architectures``
    (text-classification when none is named, or when the directory cannot be read: the classifier path reports
    that). Architectures that name two different tasks are refused in one line."""
    try:
        found, architectures = task_of_model_dir(path)
    except (OSError, ValueError, AttributeError, TypeError):
        return TEXT_CLASSIFICATION
    tasks = sorted({task for name in architectures for suffix, task in ARCHITECTURE_SUFFIXES.items()
                    if str(name).endswith(suffix)})
    if len(tasks) > 1:
        raise ValueError(f"{path}/config.json names heads of {len(tasks)} tasks ({', '.join(architectures)}): "
                         "export and verify check one; keep only the architecture of the head the weights hold")
    return found or TEXT_CLASSIFICATION
