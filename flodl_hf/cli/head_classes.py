"""The ``heads`` class of each task, and loading a trained head from a model directory.

It exists because the CLI is the composition root: the only part of ``flodl_hf`` that imports ``heads``. The job
(``flodl_hf.job``) and the checks of model directories (``flodl_hf.export``) take a head class or a loader from here
as a parameter. Imports of ``heads`` (and so of torch and transformers) happen on first use, so that the commands'
early refusals cost no import.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..export.tasks import TEXT_CLASSIFICATION, head_class_name

__all__ = ["head_class", "LazyHeadClass", "load_head", "trained_settings"]


def head_class(task: str = TEXT_CLASSIFICATION) -> Any:
    """The ``heads`` auto class of ``task`` (``AutoHeadForSequenceClassification`` for text classification)."""
    import heads

    cls = getattr(heads, head_class_name(task), None)
    if cls is None:
        raise ValueError(f"this installation's heads package has no {head_class_name(task)}: update flodl-hf to use "
                         f"--task {task}")
    return cls


class LazyHeadClass:
    """The auto head class of ``task``, imported (with torch and transformers) on first use, so that the job's
    early refusals cost no import."""

    def __init__(self, task: str = TEXT_CLASSIFICATION) -> None:
        self._task = task

    def __getattr__(self, name: str) -> Any:
        return getattr(head_class(self._task), name)


def trained_settings(model: Path) -> dict:
    """The ``max_length`` a flodl-hf run trained with (from its metrics.json), so predictions truncate alike."""
    from ..export import trained_max_length

    max_length = trained_max_length(model)
    return {} if max_length is None else {"max_length": max_length}


def load_head(path: Any, task: str = TEXT_CLASSIFICATION, cls: Any = None) -> Any:
    """The head of ``task`` (of class ``cls``, default the task's auto class) in a trained directory its caller
    already checked (``preflight.check_model_dir``), with the ``max_length`` it trained with."""
    cls = head_class(task) if cls is None else cls
    try:
        return cls.from_pretrained(str(path), **trained_settings(Path(path)))
    except ValueError as exc:
        message = str(exc)
        if "num_labels" not in message and "labels=" not in message:
            raise
        # the loader's fix names its Python arguments, which no command passes: the directory itself is damaged
        problem = message.split(". Drop", 1)[0].split(": drop", 1)[0]
        problem = re.sub(r"num_labels=(\d+) disagrees", r"the \1 outputs its head needs disagree", problem)
        raise ValueError(f"{path} is damaged ({problem}): save the model again, or give another model "
                         "directory") from None

