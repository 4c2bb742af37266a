"""The ``flodl-hf`` command: ``train``, ``predict``, ``eval``, ``export``, ``verify``, ``convert-checkpoint`` and
``bench``.

It exists as the composition root that joins the engine and the job (``flodl_hf``, ``flodl_hf.job``) with the task
heads (``heads``): the only package of ``flodl_hf`` that imports ``heads``, and the only one that imports both.
Each subcommand parses its arguments into the job's own types (``TrainSettings``, the task plug-ins, the checks of
``flodl_hf.export``) and passes them the head classes. Importing the package loads the parser and the command modules, never torch or transformers (they load when a
command runs).

* ``entry``: :func:`main`, :func:`console` (the program: ``main`` and an end a Ctrl-C cannot garble) and the
  exit codes (0 done, 1 diverged / verify failed, 2 a user's error in one line,
  130 interrupted).
* ``parser``: :func:`build_parser`, every subcommand and option; ``argtypes``: the option value types.
* ``head_classes``: the ``heads`` class of each task, loading a trained head.
* ``train``: ``train`` -> ``TrainSettings`` -> ``flodl_hf.job.run.run_train``; the resume command.
* ``routing``: which task ``eval`` / ``predict`` / ``export`` / ``verify`` run a model directory as.
* ``predict``, ``evaluate``: ``predict`` and ``eval`` for every task.
* ``model_dirs``: ``export``, ``verify``, ``convert-checkpoint``; ``convert``: the legacy checkpoint conversion.
"""

from __future__ import annotations

from .entry import console, main
from .parser import UsageError, build_parser
from .train import resume_command, run_train, settings_from_args

__all__ = ["main", "console", "build_parser", "run_train", "settings_from_args", "resume_command", "UsageError"]
