"""The task plug-ins of the job (train; eval and predict score through them), one module per task, and their registry.

It exists so that the job (``flodl_hf.job.run``) is one pipeline for every task: text classification (the
default), token classification, extractive question answering and fill-mask each provide their data, packaged
corpus, head keywords, held-out scores, baselines, metrics.json fields, model card and unsupported options through
the :class:`~flodl_hf.job.tasks.base.Task` interface; nothing else in the job knows which task runs. The task names
are the Hub's pipeline tags (``flodl_hf.export.tasks``, where a model directory's task is read too).

* ``base``: the ``Task`` interface, ``refuse_unsupported``, ``scalar_scores``.
* ``rows_task``: what the three tasks reading ``flodl_hf.data.rows.Rows`` share (packaged corpora, the score before
  training, metrics.json, the task model card).
* ``text_classification`` (with ``problems``: problem types, their metrics, scoring a classifier),
  ``token_classification``, ``question_answering``, ``fill_mask``: the plug-ins.
"""

from __future__ import annotations

from ...export.tasks import TASKS
from .base import Task
from .fill_mask import TASK as _FILL_MASK
from .question_answering import TASK as _QUESTION_ANSWERING
from .text_classification import TASK as _TEXT_CLASSIFICATION
from .token_classification import TASK as _TOKEN_CLASSIFICATION

__all__ = ["get_task", "TASKS", "Task", "PLUGINS"]

#: Task name -> its plug-in.
PLUGINS: dict[str, Task] = {task.name: task for task in (_TEXT_CLASSIFICATION, _TOKEN_CLASSIFICATION,
                                                         _QUESTION_ANSWERING, _FILL_MASK)}
assert tuple(PLUGINS) == TASKS, "one plug-in per task name, in the same order"


def get_task(name: str) -> Task:
    """The plug-in of task ``name`` (a ``--task`` value); one ValueError line naming the choices otherwise."""
    try:
        return PLUGINS[name]
    except (KeyError, TypeError):
        raise ValueError(f"task={name!r} is invalid: use one of {', '.join(TASKS)} (--task)") from None
