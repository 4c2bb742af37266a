"""The token-classification plug-in of the job (``--task token-classification``): NER-style tags, one per word.

It exists to hold what only this task does: read ``(words, tags)`` rows (``flodl_hf.data.tokens``: JSON lines /
datasets columns or CoNLL), give the head its tag names (``from_pretrained(labels=...)``), score the head's
``predict_words`` with seqeval-style entity precision / recall / F1 (``flodl_hf.metrics.entities``; only when the
tags are IOB2) and word accuracy, and compare with tagging every word ``O``.
"""

from __future__ import annotations

from typing import Any, Optional

from ...metrics.entities import entity_scores, is_iob_tagset, token_accuracy
from .rows_task import CLASSIFICATION_ONLY, EVAL_PAIRS, PREDICT_PAIRS, RowsTask, chunks, evaluating

__all__ = ["TokenClassification", "TASK", "all_o_baseline"]


def all_o_baseline(rows: Any) -> dict:
    """Scores of tagging every word ``O``: entity F1 0, word accuracy the share of ``O`` words."""
    gold = [list(tags) for _, tags in rows.items]
    return {"f1": 0.0, "accuracy": token_accuracy(gold, [["O"] * len(g) for g in gold])}


class TokenClassification(RowsTask):
    name = "token-classification"
    metrics = ("f1", "precision", "recall", "accuracy")
    unsupported = {"train": CLASSIFICATION_ONLY, "eval": EVAL_PAIRS,
                   "predict": PREDICT_PAIRS + (("question", "--question", None), ("top_k", "--top-k", None))}

    def read(self, source: Any, *, labels: Any = None, text_column: Optional[str] = None,
             label_column: Optional[str] = None, encoding: Optional[str] = None, split: Optional[str] = None,
             prefer: tuple = ("train",), known: str = "--labels") -> Any:
        from ...data.tokens import load_token_data

        return load_token_data(source, labels=labels, words_column=text_column, tags_column=label_column,
                               encoding=encoding, split=split, prefer=prefer, known=known)

    def eval_labels(self, head: Any) -> Optional[list]:
        return [str(label) for label in head.labels()]

    def check_data(self, settings: Any, sources: Any, dataset: Any) -> None:
        tags = list(dataset.labels)
        if len(tags) < 2:
            given = settings.labels is not None
            raise ValueError(f"{'--labels names' if given else f'{dataset.source} holds'} a single tag {tags}: "
                             "token classification needs at least 2 tags, e.g. O and B-PER: "
                             + ("name every tag with --labels, e.g. --labels O,B-PER,I-PER" if given else
                                "give data with tagged words, or name every tag with --labels"))
        if not sources.packaged_model:
            from ...export.tasks import TOKEN_CLASSIFICATION, task_of_model_dir
            from ..preflight import check_label_order

            try:
                found, _ = task_of_model_dir(sources.model_path)
            except (OSError, ValueError, AttributeError, TypeError):
                found = None
            if found == TOKEN_CLASSIFICATION:  # a trained tagger: its tags, in its order, or a fresh base model
                self._check_trained_tags(sources.model_path, tags)
                check_label_order(sources.model_path, tags, settings.labels is not None)

    @staticmethod
    def _check_trained_tags(model: Any, tags: list) -> None:
        """A trained tagger's classifier rows mean its own tags: data with other tag names would rename them."""
        from ...preflight import classifier_trained, model_labels

        names = model_labels(model)
        if not names or classifier_trained(model) is not True or all(n == f"LABEL_{i}" for i, n in enumerate(names)):
            return
        lacking = [t for t in tags if t not in names]
        if lacking and len(names) == len(tags):
            raise ValueError(f"the model's trained tags ({','.join(names)}) lack {', '.join(lacking)}, so each of "
                             "its outputs would be renamed: fine-tune from the base model it came from (--model), or "
                             f"give data with its tags (--labels {','.join(names)})")

    def check_split(self, settings: Any, train: Any) -> None:
        metric = settings.best_metric
        if settings.eval_every and metric in ("f1", "precision", "recall") and not is_iob_tagset(train.labels):
            raise ValueError(f"the tags {','.join(train.labels)} are not IOB2 (O, B-TYPE, I-TYPE), so entity "
                             f"{metric} is undefined and cannot pick the best weights (--eval-every): pass "
                             "--metric-for-best accuracy, or give IOB2 tags")

    def head_kwargs(self, settings: Any, train: Any) -> dict:
        return {"labels": list(train.labels)}

    def _tags_note(self, train: Any) -> str:
        return f", tags {train.labels}"

    def score(self, head: Any, rows: Any, batch_size: int = 64, progress: bool = False, seed: int = 0) -> dict:
        with evaluating(head):
            gold = [list(tags) for _, tags in rows.items]
            pred: list = []
            for start in chunks(len(rows), batch_size, progress):
                pred.extend(head.predict_words([list(words) for words, _ in rows.items[start:start + batch_size]]))
            out: dict = {"accuracy": token_accuracy(gold, pred), "sentences": len(rows)}
            labels = [str(label) for label in head.labels()]
            if is_iob_tagset(labels) and all(is_iob_tagset(g) for g in gold):
                out.update(entity_scores(gold, pred))
            else:
                out.update(precision=None, recall=None, f1=None, per_type=None)
            return out

    def headline(self, summary: dict, settings: Any = None) -> str:
        if summary.get("f1") is None:
            return f"word_accuracy={summary['accuracy']:.4f}"
        return (f"entity_f1={summary['f1']:.4f} precision={summary['precision']:.4f} recall={summary['recall']:.4f} "
                f"word_accuracy={summary['accuracy']:.4f}")

    def baselines(self, eval_rows: Any) -> dict:
        return {"all O tags": all_o_baseline(eval_rows)} if "O" in eval_rows.labels else {}

    def card_labels(self, metrics: dict) -> list:
        return metrics["labels"]


TASK = TokenClassification()
