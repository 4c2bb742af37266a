"""Model cards: the ``README.md`` written beside every trained model, with Hub-readable YAML metadata.

It exists so that a trained directory documents itself (base model, data, labels, scores, training setup, loss
curve, intended use) in the format the Hugging Face Hub reads. The text comes from the Jinja template
``model_cards/default.md``, rendered through ``huggingface_hub.ModelCard.from_template``; the metadata is a
``ModelCardData`` whose ``eval_results`` become the ``model-index`` block. ``check_model_card`` parses a written card
back and checks it offline (the Hub's own validator needs the network).
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

__all__ = ["CardInfo", "build_model_card", "write_model_card", "check_model_card", "LIBRARY_NAME",
           "PIPELINE_TAG", "default_template_path"]

LIBRARY_NAME = "flodl-hf"
PIPELINE_TAG = "text-classification"
_REQUIRED_METADATA = ("library_name", "pipeline_tag", "tags", "metrics", "datasets")


def default_template_path() -> Path:
    """Path of ``model_cards/default.md`` (shipped as package data)."""
    return Path(str(importlib.resources.files("model_cards").joinpath("default.md")))


@dataclass
class CardInfo:
    """Everything a model card states. ``metrics`` is ``flodl_hf.metrics.classification_summary`` output."""

    model_name: str
    labels: Sequence[str]
    metrics: dict
    dataset_name: str
    """Short dataset identifier (a Hub dataset id when there is one; else a name for the local file)."""
    train_rows: int
    eval_rows: int
    base_model: Optional[str] = None
    """Hub id of the base checkpoint, when known (becomes ``base_model`` metadata)."""
    base_model_path: str = ""
    """Where the base checkpoint was loaded from (shown when ``base_model`` is unknown)."""
    dataset_description: str = ""
    training: dict = field(default_factory=dict)
    """Setting name -> value, shown in order in the training table (devices, El Che, epochs, batch, lr...)."""
    train_label_counts: Optional[dict] = None
    majority_baseline: Optional[float] = None
    loss_curve: Optional[str] = "loss_curve.png"
    model_type: Optional[str] = None
    language: Optional[Union[str, list]] = None
    license: Optional[str] = None
    extra_tags: Sequence[str] = ()
    max_length: Optional[int] = None
    example_text: str = "What a great day!"
    notes: str = ""


def _card_data(info: CardInfo) -> Any:
    from huggingface_hub import EvalResult, ModelCardData

    results = [
        EvalResult(task_type=PIPELINE_TAG, task_name="Text Classification", dataset_type=info.dataset_name,
                   dataset_name=info.dataset_name, dataset_split="held-out", metric_type=metric,
                   metric_name=name, metric_value=round(float(info.metrics[key]), 4), metric_config=config)
        for metric, name, key, config in (("accuracy", "Accuracy", "accuracy", None),
                                          ("f1", "Macro F1", "macro_f1", "macro"))
    ]
    tags = [LIBRARY_NAME, PIPELINE_TAG]
    if info.model_type:
        tags.append(info.model_type)
    tags.extend(info.extra_tags)
    return ModelCardData(
        base_model=info.base_model,
        datasets=[info.dataset_name],
        eval_results=results,
        language=info.language,
        library_name=LIBRARY_NAME,
        license=info.license,
        metrics=["accuracy", "f1"],
        model_name=info.model_name,
        pipeline_tag=PIPELINE_TAG,
        tags=tags,
    )


def _label_rows(info: CardInfo) -> list[dict]:
    per_label = info.metrics.get("per_label", {})
    train_counts = info.train_label_counts or {}
    rows = []
    for i, label in enumerate(info.labels):
        scores = per_label.get(label, {})
        rows.append({"id": i, "label": _cell(label), "precision": scores.get("precision", 0.0),
                     "recall": scores.get("recall", 0.0), "f1": scores.get("f1", 0.0),
                     "support": scores.get("support", 0), "train_rows": train_counts.get(label, "")})
    return rows


def _cell(value: Any) -> str:
    """A value safe inside one Markdown table cell."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def _example(text: str) -> str:
    """A sample text safe inside a double-quoted Python / shell string."""
    cleaned = " ".join(str(text).split())[:120]
    return "".join(ch for ch in cleaned if ch not in '"\\`$')


def build_model_card(info: CardInfo, template_path: Optional[Union[str, Path]] = None) -> Any:
    """Render the card (a ``huggingface_hub.ModelCard``) from ``model_cards/default.md`` or ``template_path``."""
    from huggingface_hub import ModelCard

    for key in ("accuracy", "macro_f1"):
        if key not in info.metrics:
            raise ValueError(f"CardInfo.metrics has no {key!r}: pass flodl_hf.metrics.classification_summary(...)")
    if not info.labels:
        raise ValueError("CardInfo.labels is empty: a classifier card needs its label names")
    description = info.dataset_description or f"`{info.dataset_name}`"
    return ModelCard.from_template(
        _card_data(info),
        template_path=str(template_path or default_template_path()),
        model_name=info.model_name,
        labels=[str(label) for label in info.labels],
        base_model_path=info.base_model_path,
        dataset_description=description,
        eval_rows=info.eval_rows,
        accuracy=float(info.metrics["accuracy"]),
        macro_f1=float(info.metrics["macro_f1"]),
        majority_baseline=info.majority_baseline,
        label_rows=_label_rows(info),
        training_rows=[(_cell(k), _cell(v)) for k, v in info.training.items()],
        loss_curve=info.loss_curve,
        example_text=_example(info.example_text),
        max_length=info.max_length,
        notes=info.notes,
    )


def write_model_card(info: CardInfo, directory: Union[str, Path], filename: str = "README.md") -> Path:
    """Render the card into ``directory/README.md`` and check that it parses back."""
    path = Path(directory) / filename
    build_model_card(info).save(path)
    check_model_card(path)
    return path


def check_model_card(path: Union[str, Path]) -> Any:
    """Load a card with ``ModelCard.load`` (strict metadata parsing) and check the fields flodl-hf promises.

    Returns the loaded card; raises ``ValueError`` listing every problem found.
    """
    from huggingface_hub import ModelCard

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"model card not found: {path}")
    try:
        card = ModelCard.load(path, ignore_metadata_errors=False)
    except Exception as exc:  # yaml errors, invalid model-index, ...
        raise ValueError(f"{path}: the model card metadata does not parse: {exc}") from exc
    data = card.data
    problems = [f"missing metadata field {key!r}" for key in _REQUIRED_METADATA if not data.get(key)]
    if data.get("library_name") not in (None, LIBRARY_NAME):
        problems.append(f"library_name is {data.get('library_name')!r}, expected {LIBRARY_NAME!r}")
    if data.get("pipeline_tag") not in (None, PIPELINE_TAG):
        problems.append(f"pipeline_tag is {data.get('pipeline_tag')!r}, expected {PIPELINE_TAG!r}")
    results = data.get("eval_results") or []
    if not results:
        problems.append("no model-index evaluation results")
    for result in results:
        if not isinstance(result.metric_value, (int, float)):
            problems.append(f"metric {result.metric_type!r} has a non-numeric value {result.metric_value!r}")
    if not card.text.strip():
        problems.append("the card has no text below the metadata")
    if problems:
        raise ValueError(f"{path}: invalid model card: " + "; ".join(problems))
    return card
