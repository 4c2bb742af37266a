"""The extractive question-answering plug-in of the job (``--task question-answering``).

It exists to hold what only this task does: read SQuAD-shaped rows (``flodl_hf.data.qa``), refuse the options
whose columns QA fixes (``question``, ``context``, ``answers``) and the memory probe (``--max-micro-batch auto``
cannot read start/end logits), score the head's best span (``head.answer``) with SQuAD exact match and token F1
(``flodl_hf.metrics.squad``; by the official v1.1 rule, as the reader refuses unanswerable questions), and compare
with answering the first word of the context.
"""

from __future__ import annotations

from typing import Any, Optional

from ...metrics.squad import squad_scores
from .base import refuse_unsupported
from .rows_task import CLASSIFICATION_ONLY, EVAL_PAIRS, PREDICT_PAIRS, TAGS_ONLY, RowsTask, chunks, evaluating

__all__ = ["QuestionAnswering", "TASK", "first_word_baseline", "window_problem"]


def first_word_baseline(rows: Any) -> dict:
    """Scores of answering every question with the first word of its context."""
    firsts = [(item["context"].split() or [""])[0] for item in rows.items]
    return squad_scores(firsts, [item["answers"]["text"] for item in rows.items])


def window_problem(head: Any, questions: list, contexts: list) -> Optional[tuple[int, str, int]]:
    """The first pair whose question leaves a window of ``head.max_length`` tokens no room for its context (or
    less room than the overlap between windows, so a long context could never be covered): ``(index, the problem,
    the max length that would hold it)``; None when every pair fits. Contexts are counted only where needed."""
    tokenizer, length = head.tokenizer, int(head.max_length)
    specials = int(tokenizer.num_special_tokens_to_add(pair=True))
    stride = int(head.stride())
    counts = [len(ids) for ids in tokenizer(list(questions), add_special_tokens=False)["input_ids"]]
    for index, q in enumerate(counts):
        room = length - q - specials
        if room > stride:
            continue
        if room >= 1 and len(tokenizer(contexts[index], add_special_tokens=False)["input_ids"]) <= room:
            continue  # the whole context fits in one window: no overlap needed
        need = length
        while need < 1 << 16 and need - q - specials <= min(need // 2, 128):
            need += 1
        what = (f"no context token fits beside its {q}-token question" if room < 1 else
                f"its {q}-token question leaves {room} context tokens, no more than the {stride}-token overlap "
                "between windows of a long context")
        return index, f"in a window of {length} tokens {what}", need
    return None


class QuestionAnswering(RowsTask):
    name = "question-answering"
    metrics = ("f1", "exact_match")
    unsupported = {"train": CLASSIFICATION_ONLY + TAGS_ONLY + (("text_column", "--text-column", None),),
                   "eval": EVAL_PAIRS + (("text_column", "--text-column", None),
                                         ("label_column", "--label-column", None)),
                   "predict": PREDICT_PAIRS}

    def check_settings(self, settings: Any) -> None:
        refuse_unsupported(settings, self.name, self.unsupported.get("train", ()), "train")
        if settings.max_micro_batch == "auto":
            raise ValueError("--max-micro-batch auto is not supported with --task question-answering (train): the "
                             "memory probe cannot read a QA model's start/end logits; give the cap as an integer, "
                             "e.g. --max-micro-batch 16")
        if settings.metric_for_best is not None:
            self.check_metric(settings.metric_for_best, settings)

    def read(self, source: Any, *, labels: Any = None, text_column: Optional[str] = None,
             label_column: Optional[str] = None, encoding: Optional[str] = None, split: Optional[str] = None,
             prefer: tuple = ("train",), known: str = "--labels") -> Any:
        from ...data.qa import load_qa_data

        return load_qa_data(source, encoding=encoding, split=split, prefer=prefer)

    def check_rows(self, head: Any, rows: Any, command: str = "train") -> None:
        for part in rows:
            found = window_problem(head, [item["question"] for item in part.items],
                                   [item["context"] for item in part.items])
            if found is not None:
                index, problem, need = found
                item = part.items[index]
                named = f"question id {item['id']!r}" if item.get("id") else f"question {item['question']!r:.40}"
                fixes = {"train": f"raise --max-length to at least {need}, or shorten the question",
                         "eval": "shorten the question (the model keeps the window length it was trained with), "
                                 "or evaluate a model trained with longer windows"}
                raise ValueError(f"{part.source}: {named}: {problem}: {fixes.get(command, fixes['eval'])}")

    def score(self, head: Any, rows: Any, batch_size: int = 64, progress: bool = False, seed: int = 0) -> dict:
        with evaluating(head):
            predictions: list[str] = []
            for start in chunks(len(rows), batch_size, progress):
                batch = rows.items[start:start + batch_size]
                answers = head.answer([item["question"] for item in batch], [item["context"] for item in batch])
                answers = answers if isinstance(answers, list) else [answers]
                predictions.extend(str(a[0]["answer"] if isinstance(a, list) else a["answer"]) for a in answers)
            return squad_scores(predictions, [item["answers"]["text"] for item in rows.items])

    def headline(self, summary: dict, settings: Any = None) -> str:
        return f"exact_match={summary['exact_match']:.4f} f1={summary['f1']:.4f}"

    def baselines(self, eval_rows: Any) -> dict:
        return {"first word of the context": {k: v for k, v in first_word_baseline(eval_rows).items()
                                              if isinstance(v, float)}}


TASK = QuestionAnswering()
