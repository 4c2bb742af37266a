"""Model cards: the ``README.md`` written beside every trained model, with Hub-readable YAML metadata.

It exists so that a trained directory documents itself (base model, data, labels, scores, training setup, loss
curve, intended use) in the format the Hugging Face Hub reads. The text comes from the Jinja template
``model_cards/default.md``, rendered through ``huggingface_hub.ModelCard.from_template``; the metadata is a
``ModelCardData`` whose ``eval_results`` become the ``model-index`` block. ``check_model_card`` parses a written card
back and checks it offline (the Hub's own validator needs the network).

Hub conventions: a flodl-hf model is a plain transformers model, so the card says ``library_name: transformers``
(which gives the Hub's "Use in Transformers" snippet) and carries a ``flodl-hf`` tag; ``datasets:`` names a dataset
only when it is a Hub id (``CardInfo.dataset_hub_id``), never a local file name that would become a broken link.
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

__all__ = ["CardInfo", "build_model_card", "write_model_card", "check_model_card", "upgrade_card_metadata",
           "write_basic_card",
           "LIBRARY_NAME", "FLODL_TAG", "PIPELINE_TAG", "TASK_PIPELINE_TAGS", "default_template_path"]

LIBRARY_NAME = "transformers"
"""``library_name`` of every card: the model loads with transformers alone."""
FLODL_TAG = "flodl-hf"
"""Tag that marks a model trained with flodl-hf (it used to be the ``library_name``)."""
PIPELINE_TAG = "text-classification"
TASK_PIPELINE_TAGS = (PIPELINE_TAG, "token-classification", "question-answering", "fill-mask")
"""``pipeline_tag`` values a card may carry (the tasks of flodl-hf's heads)."""
_REQUIRED_METADATA = ("library_name", "pipeline_tag", "tags", "metrics")


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
    """Short dataset name shown in the card and its evaluation results (a Hub id, or a local file's name)."""
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
    dataset_hub_id: Optional[str] = None
    """The Hub dataset id (e.g. ``"glue"`` or ``"stanfordnlp/imdb"``) when the data came from the Hub; it becomes the
    ``datasets:`` metadata. None for local files (no ``datasets:`` entry: it would be a broken link)."""
    pairs: bool = False
    """True when the model classifies sentence pairs: the usage snippets then pass ``text`` and ``text_pair``."""
    example_pair: str = "It was a wonderful day."
    """Second text of the pair example (used when ``pairs``)."""
    eval_source: Optional[str] = None
    """The evaluation data when it was given apart from the training data (``--eval-data``, ``--eval-split``), as
    the card names it; None: rows carved out of the training data, never seen in training."""


def _card_data(info: CardInfo) -> Any:
    from huggingface_hub import EvalResult, ModelCardData

    results = [
        EvalResult(task_type=PIPELINE_TAG, task_name="Text Classification",
                   dataset_type=info.dataset_hub_id or "local",
                   dataset_name=info.dataset_name, dataset_split="held-out", metric_type=metric,
                   metric_name=name, metric_value=round(float(info.metrics[key]), 4), metric_config=config)
        for metric, name, key, config in (("accuracy", "Accuracy", "accuracy", None),
                                          ("f1", "Macro F1", "macro_f1", "macro"))
    ]
    tags = [FLODL_TAG, PIPELINE_TAG]
    if info.model_type:
        tags.append(info.model_type)
    tags.extend(info.extra_tags)
    return ModelCardData(
        base_model=info.base_model,
        datasets=[info.dataset_hub_id] if info.dataset_hub_id else None,
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
    if info.dataset_hub_id is not None:
        _check_hub_id(info.dataset_hub_id)
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
        example_pair=_example(info.example_pair),
        pairs=bool(info.pairs),
        max_length=info.max_length,
        notes=info.notes,
        eval_source=info.eval_source,
    )


def write_model_card(info: CardInfo, directory: Union[str, Path], filename: str = "README.md") -> Path:
    """Render the card into ``directory/README.md`` and check that it parses back. On N ranks every rank may call
    it: rank 0 writes and the others wait until it has."""
    from ..distributed.main_writes import written_by_main

    path = Path(directory) / filename

    def write() -> Path:
        build_model_card(info).save(path)
        check_model_card(path)
        return path

    return written_by_main(path, write)


def check_model_card(path: Union[str, Path], *, scores: bool = True) -> Any:
    """Load a card with ``ModelCard.load`` (strict metadata parsing) and check the fields flodl-hf promises.

    ``scores=False`` accepts a card without evaluation results (:func:`write_basic_card`'s). Returns the loaded
    card; raises ``ValueError`` listing every problem found.
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
    required = _REQUIRED_METADATA if scores else tuple(k for k in _REQUIRED_METADATA if k != "metrics")
    problems = [f"missing metadata field {key!r}" for key in required if not data.get(key)]
    if data.get("library_name") not in (None, LIBRARY_NAME):
        problems.append(f"library_name is {data.get('library_name')!r}, expected {LIBRARY_NAME!r} (a flodl-hf model "
                        "is a transformers model; `flodl-hf export` rewrites an older card)")
    tags = data.get("tags") or []
    if tags and FLODL_TAG not in tags:
        problems.append(f"tags {tags!r} lack {FLODL_TAG!r}")
    datasets = data.get("datasets")
    if datasets is not None:
        for name in datasets if isinstance(datasets, list) else [datasets]:
            try:
                _check_hub_id(name)
            except ValueError as exc:
                problems.append(str(exc))
    if data.get("pipeline_tag") not in (None,) + TASK_PIPELINE_TAGS:
        problems.append(f"pipeline_tag is {data.get('pipeline_tag')!r}, expected one of {TASK_PIPELINE_TAGS!r}")
    results = data.get("eval_results") or []
    if not results and scores:
        problems.append("no model-index evaluation results")
    for result in results:
        if not isinstance(result.metric_value, (int, float)):
            problems.append(f"metric {result.metric_type!r} has a non-numeric value {result.metric_value!r}")
    if not card.text.strip():
        problems.append("the card has no text below the metadata")
    if problems:
        raise ValueError(f"{path}: invalid model card: " + "; ".join(problems))
    return card


def _check_hub_id(name: Any) -> str:
    """``name`` if it can be a Hub dataset id (``name`` or ``owner/name``), else ValueError: a file path or a
    name with spaces would become a broken link on the Hub."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        if not isinstance(name, str) or name.endswith((".csv", ".tsv", ".json", ".jsonl", ".parquet", ".arrow")):
            raise HFValidationError("a file name")
        validate_repo_id(name)
    except HFValidationError:
        raise ValueError(f"datasets entry {name!r} is not a Hub dataset id: give dataset_hub_id only for data "
                         "loaded from the Hub (e.g. 'stanfordnlp/imdb'), None for local files") from None
    return name


def upgrade_card_metadata(path: Union[str, Path]) -> bool:
    """Rewrite an older flodl-hf card's metadata to the Hub conventions above: ``library_name: transformers``,
    the ``flodl-hf`` tag, and no ``datasets:`` entry that is not a Hub id. Returns True when the file changed."""
    from huggingface_hub import ModelCard

    path = Path(path)
    card = ModelCard.load(path)
    data, changed = card.data, False
    if data.get("library_name") != LIBRARY_NAME:
        data.library_name, changed = LIBRARY_NAME, True
    tags = list(data.get("tags") or [])
    if FLODL_TAG not in tags:
        data.tags, changed = [FLODL_TAG, *tags], True
    datasets = data.get("datasets")
    if datasets:
        kept = []
        for name in datasets if isinstance(datasets, list) else [datasets]:
            try:
                kept.append(_check_hub_id(name))
            except ValueError:
                changed = True
        data.datasets = kept or None
    if changed:
        card.save(path)
    return changed


def write_basic_card(directory: Union[str, Path], *, model_name: str, labels: Sequence[str],
                     model_type: Optional[str] = None, max_length: Optional[int] = None, pairs: bool = False,
                     filename: str = "README.md", pipeline_tag: str = PIPELINE_TAG) -> Path:
    """A short card for a head pushed without a training run's scores (``head.push_to_hub`` without ``card=``):
    the same metadata conventions, the labels and how to use it. Checked with ``check_model_card(scores=False)``.
    ``pipeline_tag``: the head's task (one of :data:`TASK_PIPELINE_TAGS`)."""
    from huggingface_hub import ModelCard, ModelCardData

    if not labels:
        raise ValueError("labels is empty: a classifier card needs its label names")
    if pipeline_tag not in TASK_PIPELINE_TAGS:
        raise ValueError(f"pipeline_tag={pipeline_tag!r} is unknown: use one of {', '.join(TASK_PIPELINE_TAGS)}")
    tags = [FLODL_TAG, pipeline_tag] + ([model_type] if model_type else [])
    data = ModelCardData(library_name=LIBRARY_NAME, pipeline_tag=pipeline_tag, tags=tags, model_name=model_name)
    if pipeline_tag == "token-classification":
        what, make, call = ("A token classifier (tagger)", 'tagger = pipeline("token-classification", model="{}", '
                            'aggregation_strategy="simple")', 'tagger("My name is Sarah and I live in London")')
    else:
        what, make = "A text classifier", 'classifier = pipeline("text-classification", model="{}", truncation=True)'
        call = ('classifier({"text": "first text", "text_pair": "second text"})' if pairs
                else 'classifier("What a great day!")')
    limit = f" Texts are truncated to {max_length} tokens, as in training." if max_length else ""
    text = (f"---\n{data.to_yaml()}\n---\n\n# {_cell(model_name)}\n\n"
            f"{what} fine-tuned with [flodl-hf](https://pypi.org/project/flodl-hf/), with "
            f"{len(labels)} labels: {', '.join(_cell(label) for label in labels)}.{limit}\n\n"
            "## How to use\n\n```python\nfrom transformers import pipeline\n\n"
            + make.format(_cell(model_name)) + "\n" + f"{call}\n```\n")
    path = Path(directory) / filename
    ModelCard(text).save(path)
    check_model_card(path, scores=False)
    return path


__all__ += ["write_task_card"]  # the card of a `flodl-hf train --task` model (token classification, QA, fill-mask)

_TASK_USAGE = {
    "token-classification": ('tagger = pipeline("token-classification", model=MODEL, aggregation_strategy="simple")',
                             'tagger("What a great day!")'),
    "question-answering": ('qa = pipeline("question-answering", model=MODEL)',
                           'qa(question="Which word is positive?", context="What a great day!")'),
    "fill-mask": ('fill = pipeline("fill-mask", model=MODEL)', 'fill(f"What a {fill.tokenizer.mask_token} day!")'),
}


def write_task_card(directory: Union[str, Path], *, task: str, model_name: str, scores: dict, dataset_name: str,
                    dataset_description: str, training: dict, base_model: Optional[str] = None,
                    base_model_path: str = "", model_type: Optional[str] = None,
                    language: Optional[Union[str, list]] = None, extra_tags: Sequence[str] = (),
                    labels: Sequence[str] = (), baselines: Optional[dict] = None,
                    dataset_hub_id: Optional[str] = None, loss_curve: Optional[str] = "loss_curve.png",
                    filename: str = "README.md") -> Path:
    """The card of a ``flodl-hf train --task`` model (token classification, question answering, fill-mask): the
    same metadata conventions as the classifier card, ``pipeline_tag`` the task, the held-out ``scores``
    (name -> value) as evaluation results, the ``baselines`` they beat, the training table and the loss curve."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    if task not in _TASK_USAGE:
        raise ValueError(f"task {task!r} has no task card: use one of {', '.join(_TASK_USAGE)} (text-classification "
                         "models get write_model_card)")
    if not scores:
        raise ValueError("scores is empty: a task card needs the held-out scores")
    if dataset_hub_id is not None:
        _check_hub_id(dataset_hub_id)
    results = [EvalResult(task_type=task, dataset_type=dataset_hub_id or "local", dataset_name=dataset_name,
                          dataset_split="held-out", metric_type=name, metric_value=round(float(value), 4))
               for name, value in scores.items()]
    tags = [FLODL_TAG, task] + ([model_type] if model_type else []) + list(extra_tags)
    data = ModelCardData(base_model=base_model, datasets=[dataset_hub_id] if dataset_hub_id else None,
                         eval_results=results, language=language, library_name=LIBRARY_NAME, metrics=list(scores),
                         model_name=model_name, pipeline_tag=task, tags=tags)
    base = f"`{base_model}`" if base_model else f"`{_cell(base_model_path)}`"
    lines = [f"# {_cell(model_name)}", "",
             f"A {task} model fine-tuned with [flodl-hf](https://pypi.org/project/flodl-hf/) from {base} on "
             f"{dataset_description}.", ""]
    if labels:
        lines += [f"Tags ({len(labels)}): {', '.join(_cell(label) for label in labels)}.", ""]
    lines += ["## Held-out scores", "", "| metric | value |", "|---|---|"]
    lines += [f"| {_cell(name)} | {float(value):.4f} |" for name, value in scores.items()]
    for name, values in (baselines or {}).items():
        shown = ", ".join(f"{k} {float(v):.4f}" for k, v in values.items() if isinstance(v, (int, float)))
        lines += ["", f"Baseline, {_cell(name)}: {shown}."]
    build, call = _TASK_USAGE[task]
    lines += ["", "## How to use", "", "```python", "from transformers import pipeline", "",
              f"MODEL = \"{_cell(model_name)}\"", build, call, "```", "", "## Training", "",
              "| setting | value |", "|---|---|"]
    lines += [f"| {_cell(k)} | {_cell(v)} |" for k, v in training.items()]
    if loss_curve:
        lines += ["", f"![loss curve]({loss_curve})"]
    path = Path(directory) / filename
    ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n").save(path)
    check_model_card(path)
    return path
