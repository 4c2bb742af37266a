"""The tasks ``flodl-hf`` trains, their heads, their transformers architectures, and the task of a checkpoint.

It exists so that every command agrees on one mapping: ``--task`` names (the Hub's pipeline tags), the transformers
class suffix a trained directory's ``config.json`` ``architectures`` carries (``BertForTokenClassification`` ->
``token-classification``), and the name of each task's ``heads`` auto class (the CLI, the composition root and
the only module that imports ``heads``, resolves it: :func:`head_class_name`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

__all__ = ["TASKS", "TEXT_CLASSIFICATION", "TOKEN_CLASSIFICATION", "QUESTION_ANSWERING", "FILL_MASK",
           "ARCHITECTURE_SUFFIXES", "task_of_config", "task_of_model_dir", "head_class_name", "check_task_matches"]

TEXT_CLASSIFICATION = "text-classification"
TOKEN_CLASSIFICATION = "token-classification"
QUESTION_ANSWERING = "question-answering"
FILL_MASK = "fill-mask"
TASKS = (TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION, QUESTION_ANSWERING, FILL_MASK)

#: transformers class-name suffix -> task.
ARCHITECTURE_SUFFIXES = {"ForSequenceClassification": TEXT_CLASSIFICATION,
                         "ForTokenClassification": TOKEN_CLASSIFICATION,
                         "ForQuestionAnswering": QUESTION_ANSWERING, "ForMaskedLM": FILL_MASK}
_AUTO_HEADS = {TEXT_CLASSIFICATION: "AutoHeadForSequenceClassification",
               TOKEN_CLASSIFICATION: "AutoHeadForTokenClassification",
               QUESTION_ANSWERING: "AutoHeadForQuestionAnswering", FILL_MASK: "AutoHeadForMaskedLM"}


def task_of_config(config: dict) -> Optional[str]:
    """The task of a ``config.json`` from its ``architectures`` (None: a base model, or no architectures)."""
    for name in config.get("architectures") or []:
        for suffix, task in ARCHITECTURE_SUFFIXES.items():
            if str(name).endswith(suffix):
                return task
    return None


def task_of_model_dir(path: Any) -> tuple[Optional[str], list]:
    """``(task, architectures)`` of a model directory (its ``config.json``; call ``check_model_dir`` first)."""
    target = Path(path) / "config.json"
    if not target.is_file():  # missing, or a FIFO / device that would block the read: check_model_dir names it
        raise ValueError(f"{target} is not a regular file")
    config = json.loads(target.read_text(encoding="utf-8"))
    return task_of_config(config), list(config.get("architectures") or [])


def check_task_matches(path: Any, task: Optional[str], command: str) -> str:
    """The task to run ``command`` with on the model in ``path``: ``task`` (``--task``) or the checkpoint's; a
    ``--task`` that disagrees with the checkpoint's head is refused in one line."""
    found, architectures = task_of_model_dir(path)
    if task is not None and found is not None and task != found:
        raise ValueError(f"--task {task} does not match the checkpoint's head: {path} holds a {found} model "
                         f"({', '.join(architectures)}); leave --task out to {command} it as {found}, or give a "
                         f"{task} model with --model")
    return task or found or TEXT_CLASSIFICATION


def head_class_name(task: str) -> str:
    """The name of ``task``'s auto head class in ``heads`` (e.g. ``AutoHeadForTokenClassification``)."""
    return _AUTO_HEADS[task]
