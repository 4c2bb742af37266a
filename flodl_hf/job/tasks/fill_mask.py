"""The masked-language-modelling plug-in of the job (``--task fill-mask``).

It exists to hold what only this task does: read plain texts (``flodl_hf.data.texts``: raw text, or a text column)
and score the head by its perplexity on them (``head.perplexity``: exp of the mean masked-token loss, masks drawn
with the run's seed, so a score is reproducible).
"""

from __future__ import annotations

from typing import Any, Optional

from .rows_task import CLASSIFICATION_ONLY, EVAL_PAIRS, PREDICT_PAIRS, TAGS_ONLY, RowsTask, evaluating

__all__ = ["FillMask", "TASK"]


class FillMask(RowsTask):
    name = "fill-mask"
    metrics = ("perplexity",)
    unsupported = {"train": CLASSIFICATION_ONLY + TAGS_ONLY,
                   "eval": EVAL_PAIRS + (("label_column", "--label-column", None),),
                   "predict": PREDICT_PAIRS + (("question", "--question", None),)}

    def read(self, source: Any, *, labels: Any = None, text_column: Optional[str] = None,
             label_column: Optional[str] = None, encoding: Optional[str] = None, split: Optional[str] = None,
             prefer: tuple = ("train",), known: str = "--labels") -> Any:
        from ...data.texts import load_texts

        return load_texts(source, text_column=text_column, encoding=encoding, split=split, prefer=prefer)

    def score(self, head: Any, rows: Any, batch_size: int = 64, progress: bool = False, seed: int = 0) -> dict:
        with evaluating(head):
            return {"perplexity": float(head.perplexity(list(rows.items), batch_size=batch_size, seed=seed)),
                    "texts": len(rows)}

    def headline(self, summary: dict, settings: Any = None) -> str:
        return f"perplexity={summary['perplexity']:.3f}"


TASK = FillMask()
