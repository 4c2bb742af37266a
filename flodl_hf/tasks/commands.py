"""``flodl-hf train / eval / predict`` for a model of another task than text classification.

It exists so that ``flodl_hf.cli`` hands a ``--task`` run (or a model directory whose ``config.json`` names a
token-classification, question-answering or masked-LM head) to one place and stays a thin parser. ``eval`` and
``predict`` detect the task from the checkpoint (``names.check_task_matches``) and refuse a ``--task`` that
disagrees with it; options the task cannot honour are refused in one line (``options``).

``predict`` per task: token classification prints each text's entities (``head.tag``, aggregated words);
question answering answers ``--question`` (once for every TEXT, or once per TEXT) from each TEXT as the context;
fill-mask fills the tokenizer's mask token (e.g. ``[MASK]``) of each TEXT with the ``--top-k`` best tokens (5).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable, Optional

from .names import QUESTION_ANSWERING, TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION, check_task_matches, \
    task_of_model_dir
from .options import UNSUPPORTED_EVAL, UNSUPPORTED_PREDICT, refuse_unsupported

__all__ = ["run_task_train", "command_task", "route", "cmd_eval", "cmd_predict", "load_task_head",
           "verified_task"]


def run_task_train(args: argparse.Namespace, head_class: Callable[[str], Any]) -> dict:
    """``flodl-hf train --task X`` in-process (X other than text-classification); ``head_class(task)`` gives the
    task's head class (the CLI's: this package never imports ``heads``)."""
    from .job import run_task_train as job
    from .options import task_settings

    settings = task_settings(args)  # refusals first, before torch is imported
    return job(settings, head_class(settings.task))


def command_task(args: argparse.Namespace, command: str) -> str:
    """The task ``eval`` / ``predict`` runs with: ``--task`` or the checkpoint's (after checking the directory)."""
    from ..preflight import check_model_dir

    check_model_dir(args.model)
    return check_task_matches(args.model, getattr(args, "task", None), command)


def route(args: argparse.Namespace, command: str) -> str:
    """The task of an ``eval`` / ``predict`` command. A text-classification model (or a directory whose task
    cannot be read: the classifier path reports its problems as before) keeps the existing command unchanged."""
    task = getattr(args, "task", None)
    if task not in (None, TEXT_CLASSIFICATION):
        return command_task(args, command)
    try:
        found, _ = task_of_model_dir(args.model)
    except (OSError, ValueError, AttributeError, TypeError):
        found = None
    if found in (None, TEXT_CLASSIFICATION):
        if command == "predict":
            refuse_unsupported(args, TEXT_CLASSIFICATION, UNSUPPORTED_PREDICT, command)
        return TEXT_CLASSIFICATION
    return command_task(args, command)


def verified_task(path: Any) -> str:
    """The task ``export`` and ``verify`` check ``path`` as, from its ``config.json`` ``architectures``
    (text-classification when none is named, or when the directory cannot be read: the classifier path reports
    that). Architectures that name two different tasks are refused in one line."""
    from .names import ARCHITECTURE_SUFFIXES

    try:
        found, architectures = task_of_model_dir(path)
    except (OSError, ValueError, AttributeError, TypeError):
        return TEXT_CLASSIFICATION
    tasks = sorted({task for name in architectures for suffix, task in ARCHITECTURE_SUFFIXES.items()
                    if str(name).endswith(suffix)})
    if len(tasks) > 1:
        raise ValueError(f"{path}/config.json names heads of {len(tasks)} tasks ({', '.join(architectures)}): "
                         "export and verify check one; keep only the architecture of the head the weights hold")
    return found or TEXT_CLASSIFICATION


def load_task_head(path: str, head_cls: Any) -> Any:
    """The head (of class ``head_cls``) in a trained directory, with the ``max_length`` it trained with."""
    from ..cli import _trained_settings

    return head_cls.from_pretrained(str(path), **_trained_settings(Path(path)))


def _eval_rows(args: argparse.Namespace, task: str, head: Any) -> Any:
    from .job import load_task_rows

    text_column = None if args.text_column == "text" else args.text_column  # the parser's default: the task's own
    label_column = None if args.label_column == "label" else args.label_column
    labels = [str(label) for label in head.labels()] if task == TOKEN_CLASSIFICATION else None
    rows = load_task_rows(task, args.data, labels=labels, text_column=text_column, label_column=label_column,
                          encoding=args.encoding, split=args.split, prefer=("test", "validation", "train"),
                          known="the model's tags")
    if args.rows is not None:
        rows.items = rows.items[:args.rows]
    return rows


def cmd_eval(args: argparse.Namespace, task: str, head_cls: Any) -> int:
    """``flodl-hf eval`` of a token-classification, QA or fill-mask model: the task's scores on ``--data``."""
    from ..files.ownership import check_output_file, writable_parent
    from .report import scalar_scores
    from .scoring import headline, score

    refuse_unsupported(args, task, UNSUPPORTED_EVAL, "eval")
    if args.json:
        writable_parent(args.json, "--json")
        check_output_file(args.json, "--json", inputs=[args.data, args.model])
    head = load_task_head(args.model, head_cls)
    rows = _eval_rows(args, task, head)
    summary = score(head, task, rows, args.batch_size, progress=not args.no_progress)
    print(f"{headline(summary, task)} rows={len(rows)} task={task} model={args.model} data={args.data}")
    if args.json:
        from ..files.atomic import atomic_path

        record = dict(summary, **scalar_scores(summary), generator="flodl-hf", kind="eval", task=task,
                      model=str(args.model), data=str(args.data), split=args.split,
                      labels=[str(label) for label in head.labels()] if task == TOKEN_CLASSIFICATION else None)
        check_output_file(args.json, "--json", inputs=[args.data, args.model])
        with atomic_path(args.json) as tmp:
            tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return 0


def _questions(args: argparse.Namespace) -> list[str]:
    questions = args.question or []
    if len(questions) == 1:
        questions = questions * len(args.texts)
    if len(questions) != len(args.texts):
        raise ValueError(f"{len(args.texts)} TEXT(s) (the contexts) but {len(args.question or [])} --question: give "
                         "one --question for every TEXT, or one per TEXT in the same order")
    return questions


def _entity_text(entity: dict) -> str:
    group = entity.get("entity_group", entity.get("entity"))
    return f"{group}={entity.get('word')!s}({float(entity.get('score', 0.0)):.3f})"


def cmd_predict(args: argparse.Namespace, task: str, head_cls: Any) -> int:
    """``flodl-hf predict`` of a token-classification, QA or fill-mask model."""
    from ..preflight import check_texts

    refuse_unsupported(args, task, UNSUPPORTED_PREDICT, "predict")
    check_texts(args.texts)
    texts = list(args.texts)
    questions = _questions(args) if task == QUESTION_ANSWERING else None
    head = load_task_head(args.model, head_cls)
    if task == TOKEN_CLASSIFICATION:
        results: list = head.tag(texts)
        lines = ["  ".join(_entity_text(e) for e in found) or "(no entity)" for found in results]
    elif task == QUESTION_ANSWERING:
        top_k = args.top_k or 1
        results = [head.answer(q, c, top_k=top_k) for q, c in zip(questions, texts)]
        results = [r if isinstance(r, list) else [r] for r in results]
        lines = ["  ".join(f"{a['answer']!r}({float(a['score']):.3f})" for a in found) for found in results]
    else:
        mask = _mask_token(head)
        missing = [t for t in texts if mask not in t]
        if missing:
            raise ValueError(f"TEXT {missing[0]!r:.60} has no mask token {mask}: write {mask} where the model should "
                             f"fill in a word, e.g. \"What a {mask} day!\"")
        results = [head.fill_mask(text, top_k=args.top_k or 5) for text in texts]
        lines = ["  ".join(f"{c.get('token_str', '').strip()}={float(c['score']):.3f}" for c in _flat(found))
                 for found in results]
    if args.json:
        print(json.dumps([_json_entry(task, text, found, questions[i] if questions else None)
                          for i, (text, found) in enumerate(zip(texts, results))], indent=2, default=str))
        return 0
    for i, (text, line) in enumerate(zip(texts, lines)):
        shown = f"{questions[i]} | {text}" if questions else text
        print(f"{line}\t{shown}")
    return 0


def _flat(found: Any) -> list:
    """``fill_mask``'s candidates of one mask (a text with several masks gives one list per mask: the first)."""
    return found[0] if found and isinstance(found[0], list) else list(found)


def _mask_token(head: Any) -> str:
    tokenizer = getattr(head, "tokenizer", None)
    mask = getattr(tokenizer, "mask_token", None)
    if not mask:
        raise ValueError("this model's tokenizer has no mask token, so it cannot fill masks: give a masked-LM model")
    return str(mask)


def _json_entry(task: str, text: str, found: Any, question: Optional[str]) -> dict:
    if task == TOKEN_CLASSIFICATION:
        return {"text": text, "entities": [{k: (float(v) if k == "score" else v) for k, v in e.items()}
                                           for e in found]}
    if task == QUESTION_ANSWERING:
        return {"question": question, "context": text, "answers": found}
    return {"text": text, "candidates": _flat(found)}

