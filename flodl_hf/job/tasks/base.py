"""``Task``: what a task plug-in of the train / eval / predict job provides, and the refusal of the options a task
does not support.

It exists so that the job (``flodl_hf.job.run``) is written once for every task: it calls the plug-in of
``settings.task`` for what differs per task (the data and its packaged corpus, the head's keywords, the held-out
scores and their one-line headline, baselines, the metrics.json fields and the model card) and does everything
else itself (preflight, directory locks and ownership, ``Trainer.setup_head_with``, the loop, checkpoints and
resume, periodic evaluation, the output directory). Each task is one module of :mod:`flodl_hf.job.tasks`; this
module holds the interface and what its implementations share.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

__all__ = ["Task", "Option", "refuse_unsupported", "scalar_scores"]

#: ``(settings field or argparse dest, flag, default)``: an option a task refuses when it differs from its default.
Option = tuple


def refuse_unsupported(values: Any, task: str, options: Sequence[Option], command: str) -> None:
    """Raise one line naming the first of ``options`` that ``values`` (a ``TrainSettings`` or a parsed Namespace)
    sets to something else than its default."""
    for dest, flag, default in options:
        if getattr(values, dest, default) != default:
            raise ValueError(f"{flag} is not supported with --task {task} ({command}): leave {flag} out"
                             + ("" if task == "text-classification" else ", or use --task text-classification"))


def scalar_scores(summary: dict) -> dict:
    """The numeric scores of a summary (no counts, no per-type tables)."""
    return {k: float(v) for k, v in summary.items()
            if isinstance(v, float) and k not in ("gold_entities", "predicted_entities")}


class Task:
    """A task of the job. Subclasses set the class attributes and implement the data, scoring and report hooks;
    the job calls them in this order: settings checks, :meth:`columns`, :meth:`load`, :meth:`check_data`, the
    shared split, :meth:`check_split`, :meth:`head_kwargs`, :meth:`check_head`, :meth:`check_rows`,
    :meth:`lengths`, :meth:`describe`, :meth:`score` (periodic, final and, with ``scores_before_training``, before
    training), :meth:`build_metrics`, :meth:`write_card`, :meth:`result_note`."""

    name: str = ""
    #: The held-out metrics ``--metric-for-best`` may name.
    metrics: tuple = ()
    #: Metrics that improve downwards.
    lower_is_better: tuple = ("loss", "perplexity", "mse")
    #: Options refused per command (``train``: ``TrainSettings`` fields; ``eval`` / ``predict``: parser dests).
    unsupported: dict = {}
    #: Score the held-out rows before training too (``before_training`` in metrics.json).
    scores_before_training: bool = False

    # --- settings -----------------------------------------------------------------------------------------------

    def check_settings(self, settings: Any) -> None:
        """Refuse the ``train`` settings this task cannot honour, then a ``--metric-for-best`` it does not report
        (called first when settings are built, so these come before the shared checks)."""
        refuse_unsupported(settings, self.name, self.unsupported.get("train", ()), "train")
        if getattr(settings, "metric_for_best", None) is not None:
            self.check_metric(settings.metric_for_best, settings)

    def default_metric(self, settings: Any) -> str:
        return self.metrics[0]

    def check_metric(self, metric: str, settings: Any) -> str:
        if metric not in self.metrics:
            raise ValueError(f"--metric-for-best {metric} is not a metric of --task {self.name}: use one of "
                             f"{', '.join(self.metrics)}")
        return metric

    def greater_is_better(self, metric: str) -> bool:
        return metric not in self.lower_is_better

    def recorded_settings(self, settings: Any, recorded: dict) -> dict:
        """The ``settings`` of metrics.json (``recorded``: every field of ``settings``)."""
        return recorded

    def plan_extras(self) -> dict:
        """Fields the checkpoint's job plan records besides the shared ones (compared on resume)."""
        return {"task": self.name}

    # --- data ---------------------------------------------------------------------------------------------------

    def columns(self, settings: Any, packaged: bool) -> tuple[Optional[str], Optional[str], Optional[str], str]:
        """``(text column, label column, encoding, dataset name)`` of the data (``dataset name`` is used for the
        packaged corpus only)."""
        raise NotImplementedError

    def load(self, settings: Any, sources: Any) -> tuple[Any, Optional[Any]]:
        """The training data and, with ``--eval-data`` / ``--eval-split``, the named held-out data."""
        raise NotImplementedError

    def check_data(self, settings: Any, sources: Any, dataset: Any) -> None:
        """Refusals that need the loaded data (before it is split)."""

    def check_split(self, settings: Any, train: Any) -> None:
        """Refusals that need the training rows."""

    # --- model --------------------------------------------------------------------------------------------------

    def head_kwargs(self, settings: Any, train: Any) -> dict:
        """``from_pretrained`` keywords besides ``max_length``."""
        return {}

    def check_head(self, head: Any, settings: Any) -> None:
        """Refuse a loaded head that cannot train what the settings ask."""

    def check_rows(self, head: Any, rows: Sequence[Any], command: str = "train") -> None:
        """Refuse rows the loaded head cannot train or score, every row, before the first step (``rows``: the
        training and held-out data; ``command`` words the fix with that command's options)."""

    def num_labels(self, head: Any) -> int:
        return int(head.num_labels)

    def lengths(self, settings: Any, train: Any) -> Optional[list]:
        """Per-row lengths for ``--group-by-length`` (None: plain shuffled batches)."""
        return None

    def describe(self, settings: Any, sources: Any, dataset: Any, train: Any, eval_rows: Any, named: bool,
                 num_labels: int, steps: int) -> str:
        """The line announcing the run."""
        raise NotImplementedError

    # --- scores and report --------------------------------------------------------------------------------------

    def score(self, head: Any, rows: Any, batch_size: int = 64, progress: bool = False, seed: int = 0) -> dict:
        """The held-out metrics of ``head`` on ``rows``."""
        raise NotImplementedError

    def headline(self, summary: dict, settings: Any = None) -> str:
        """One line of the scores, e.g. ``accuracy=0.750 macro_f1=0.700`` (``settings``: the run's, when known)."""
        raise NotImplementedError

    def build_metrics(self, *, settings: Any, sources: Any, dataset: Any, train: Any, eval_rows: Any,
                      summary: dict, before: dict, run: dict) -> dict:
        """The content of metrics.json (``run``: ``flodl_hf.job.outputs.run_metrics``)."""
        raise NotImplementedError

    def write_card(self, directory: Any, head: Any, settings: Any, sources: Any, metrics: dict) -> None:
        """Write the model card into the staged output directory."""
        raise NotImplementedError

    def result_note(self, metrics: dict, before: dict) -> str:
        """What the final line adds after the headline (a baseline, the score before training)."""
        return ""
