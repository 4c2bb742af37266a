"""Tiny offline data for ``flodl-hf train --task`` tests: token tags, QA items and texts made of the words the
tiny word-level tokenizers know (``tiny_models.TOY_WORDS``), and a tiny checkpoint of another task's head.

Kept apart from ``tiny_models.py`` (shared by every worker): these builders serve the task CLI tests only.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tiny_models import tiny_config, tiny_tokenizer, toy_task

__all__ = ["POSITIVE", "NEGATIVE", "token_rows", "qa_rows", "texts", "write_jsonl", "write_conll",
           "write_squad", "head_checkpoint"]

POSITIVE = ("good", "great", "excellent", "wonderful", "lovely", "superb")
NEGATIVE = ("bad", "awful", "terrible", "horrible", "poor", "dreadful")


def _tag(word: str) -> str:
    return "B-POS" if word in POSITIVE else "B-NEG" if word in NEGATIVE else "O"


def token_rows(n: int, seed: int = 0) -> list[dict]:
    """``{"words", "tags"}`` rows: each toy sentence's adjective tagged ``B-POS`` / ``B-NEG``."""
    rows = []
    for text, _ in toy_task(n, seed):
        words = text.split()
        rows.append({"words": words, "tags": [_tag(w) for w in words]})
    return rows


def qa_rows(n: int, seed: int = 0) -> list[dict]:
    """SQuAD-style rows: a context with one positive and one negative sentence; the question ``yes`` asks for the
    positive adjective, ``no`` for the negative one."""
    rng = random.Random(seed)
    positives = [t for t, label in toy_task(2 * n, seed) if label == 1]
    negatives = [t for t, label in toy_task(2 * n, seed + 1) if label == 0]
    rows = []
    for i in range(n):
        first, second = (positives[i], negatives[i]) if rng.random() < 0.5 else (negatives[i], positives[i])
        context = f"{first} and {second}"
        wanted = POSITIVE if i % 2 == 0 else NEGATIVE
        start = next(m for m in range(len(context)) if any(
            context.startswith(w, m) and (m == 0 or context[m - 1] == " ") for w in wanted))
        word = next(w for w in wanted if context.startswith(w, start))
        rows.append({"id": str(i), "question": "yes" if i % 2 == 0 else "no", "context": context,
                     "answers": {"text": [word], "answer_start": [start]}})
    return rows


def texts(n: int, seed: int = 0) -> list[str]:
    return [t for t, _ in toy_task(n, seed)]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_conll(path: Path, rows: list[dict]) -> Path:
    lines = ["-DOCSTART- O", ""]
    for row in rows:
        lines += [f"{w} {t}" for w, t in zip(row["words"], row["tags"])] + [""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def write_squad(path: Path, rows: list[dict]) -> Path:
    data = {"data": [{"title": "toy", "paragraphs": [
        {"context": r["context"], "qas": [{"id": r["id"], "question": r["question"],
                                           "answers": [{"text": t, "answer_start": s} for t, s in
                                                       zip(r["answers"]["text"], r["answers"]["answer_start"])]}]}
        for r in rows]}]}
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def head_checkpoint(directory: Path, suffix: str, family: str = "bert", num_labels: int = 3) -> Path:
    """A tiny transformers ``<Family><suffix>`` checkpoint (e.g. ``ForTokenClassification``) with its tokenizer."""
    import transformers
    from transformers.utils import logging as hf_logging

    config = tiny_config(family, num_labels=num_labels)
    cls = getattr(transformers, f"{type(config).__name__.removesuffix('Config')}{suffix}")
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Writing model shards" bar on stderr
    try:
        cls(config).save_pretrained(directory)
        tiny_tokenizer(family).save_pretrained(directory)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return directory
