"""``flodl-hf predict``: run a trained model directory on the texts of the command line, for every task.

It exists so that each task's prediction prints in one way: text classification prints each text's label scores
(``--top-k`` best; ``--pair`` for sentence-pair models); token classification each text's entities (``head.tag``,
aggregated words); question answering answers ``--question`` (once for every TEXT, or once per TEXT) from each
TEXT as the context; fill-mask fills the tokenizer's mask token (e.g. ``[MASK]``) of each TEXT with the
``--top-k`` best tokens (5). ``--json`` prints the same as JSON.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Optional

from ..export.tasks import QUESTION_ANSWERING, TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION
from .head_classes import load_head
from .parser import UsageError
from .routing import refuse_options, route

__all__ = ["cmd_predict"]


def cmd_predict(args: argparse.Namespace) -> int:
    """``flodl-hf predict``; the exit code."""
    task = route(args, "predict")
    if task == TEXT_CLASSIFICATION:
        return _predict_classes(args)
    return _predict_task(args, task)


def _predict_classes(args: argparse.Namespace) -> int:
    from ..preflight import check_model_dir, check_texts, check_trained

    check_texts(args.texts)
    pairs = args.pair
    if pairs is not None:
        if len(pairs) != len(args.texts):
            raise UsageError(f"{len(args.texts)} TEXT(s) but {len(pairs)} --pair: give one --pair per TEXT, in the "
                             "same order")
        check_texts(pairs)
    check_model_dir(args.model, labels=True)  # the label map names what it prints / scores
    check_trained(args.model, args.allow_untrained, "predict")
    head = load_head(args.model)
    if pairs is None:
        results = head.predict(list(args.texts), top_k=args.top_k)
    else:
        from ..job.tasks.problems import require_pairs

        require_pairs(head, "--pair")
        results = head.predict(list(args.texts), text_pairs=list(pairs), top_k=args.top_k)
    shown_texts = list(args.texts) if pairs is None else [f"{a} [SEP] {b}" for a, b in zip(args.texts, pairs)]
    if args.json:
        print(json.dumps([dict({"text": text}, **({"text_pair": pairs[i]} if pairs else {}),
                               labels=[{"label": str(label), "score": float(prob)} for label, prob in ranked])
                          for i, (text, ranked) in enumerate(zip(args.texts, results))], indent=2))
        return 0
    for text, ranked in zip(shown_texts, results):
        shown = "  ".join(f"{label}={float(prob):.3f}" for label, prob in ranked)
        print(f"{shown}\t{text}")
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


def _predict_task(args: argparse.Namespace, task: str) -> int:
    """``flodl-hf predict`` of a token-classification, QA or fill-mask model."""
    from ..preflight import check_task_layer, check_texts

    refuse_options(args, task, "predict")
    check_texts(args.texts)
    check_task_layer(args.model, task, "predict")
    texts = list(args.texts)
    questions = _questions(args) if task == QUESTION_ANSWERING else None
    head = load_head(args.model, task)
    if questions is not None:
        from ..job.tasks.question_answering import window_problem

        found = window_problem(head, questions, texts)
        if found is not None:
            raise ValueError(f"--question {questions[found[0]]!r:.60} with TEXT {found[0] + 1}: {found[1]}: give a "
                             "shorter --question")
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

