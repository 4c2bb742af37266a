"""Scoring a head on a ``TextDataset``: batched logits in eval mode, then the problem type's metrics.

It exists so that ``train`` (periodic and final held-out evaluation) and ``eval`` score a model with one function,
for every problem type (``flodl_hf.problem``) and for sentence pairs (the head's ``encode(texts, text_pairs)``).
A head without pair support is refused with one line rather than scored on the first texts alone.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Optional, Sequence

from .data import TextDataset

__all__ = ["evaluate_head", "predict_logits", "predict_labels", "supports_pairs", "require_pairs"]


def supports_pairs(head: Any) -> bool:
    """Whether ``head.encode`` takes ``text_pairs`` (the heads' sentence-pair API)."""
    try:
        return "text_pairs" in inspect.signature(head.encode).parameters
    except (TypeError, ValueError, AttributeError):
        return False


def require_pairs(head: Any, option: str = "--text-pair-column") -> None:
    """Refuse sentence pairs with a head that would silently drop the second text."""
    if not supports_pairs(head):
        raise ValueError(f"{option}: this installation's task heads cannot encode sentence pairs (head.encode has "
                         "no text_pairs): update flodl-hf's heads, or classify single texts")


def _progress(iterable: Any, *, enabled: bool, **kwargs: Any) -> Any:
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=not enabled, file=sys.stderr, dynamic_ncols=True, **kwargs)


def predict_logits(head: Any, texts: Sequence[str], text_pairs: Optional[Sequence[str]] = None,
                   batch_size: int = 64, progress: bool = False) -> Any:
    """Logits ``[N, C]`` (float32, CPU) of ``head`` on ``texts`` (and ``text_pairs``), in eval mode, no grad."""
    import torch

    if text_pairs is not None:
        require_pairs(head)
    module = head.graph().module if hasattr(head, "graph") else None
    was_training = bool(module is not None and module.training)
    if module is not None:
        module.eval()
    elif hasattr(head, "eval"):
        head.eval()
    chunks = []
    starts = range(0, len(texts), batch_size)
    try:
        with torch.no_grad():
            for start in _progress(starts, enabled=progress, desc="eval", unit="batch", leave=False):
                batch = list(texts[start:start + batch_size])
                if text_pairs is None:
                    enc = head.encode(batch)
                else:
                    enc = head.encode(batch, text_pairs=list(text_pairs[start:start + batch_size]))
                logits = head.forward(enc)
                chunks.append(getattr(logits, "logits", logits).detach().float().cpu())
    finally:
        if was_training and module is not None:
            module.train()
    return torch.cat(chunks) if chunks else torch.zeros(0, 0)


def predict_labels(head: Any, texts: Sequence[str], batch_size: int = 64, progress: bool = False) -> list[int]:
    """Arg-max label ids of ``head`` on ``texts``, in batches, in eval mode and without gradients."""
    return [int(i) for i in predict_logits(head, texts, None, batch_size, progress).argmax(dim=-1).tolist()]


def evaluate_head(head: Any, dataset: TextDataset, batch_size: int = 64, progress: bool = False) -> dict:
    """The metrics of ``dataset.problem_type`` for ``head`` on ``dataset`` (``flodl_hf.problem.summarize``).

    For classification the head's label names must be the dataset's, in the same order (load the data with
    ``labels=head.labels()``: names are matched then); otherwise ids would not compare.
    """
    from .problem import summarize

    if dataset.problem_type != "regression":
        head_labels = [str(label) for label in head.labels()]
        if head_labels != dataset.labels:
            raise ValueError(f"the model's labels {head_labels} differ from the data's labels {dataset.labels}: "
                             f"pass --labels {','.join(head_labels)} (the model's order), or use matching data")
    logits = predict_logits(head, dataset.texts, dataset.text_pairs, batch_size, progress)
    return summarize(dataset.problem_type, logits, dataset.label_ids, dataset.labels)
