"""Held-out evaluation of the train job: scoring a head on a ``TextDataset`` (batched logits in eval mode, then the
problem type's metrics), and keeping the best periodic evaluation's weights.

It exists so that ``train`` (periodic and final held-out evaluation) and ``eval`` score a model with one function,
for every problem type (``flodl_hf.job.problems``) and for sentence pairs (the head's ``encode(texts, text_pairs)``).
A head without pair support is refused with one line rather than scored on the first texts alone.

:class:`BestWeights` keeps the best weights seen at a periodic evaluation, to write them instead of the last ones
when better, because early stopping stops *after* ``patience`` evaluations without improvement: the last weights are
then by construction not the best ones (transformers' ``load_best_model_at_end``). With ``--eval-every``, rank 0
copies the model's weights to CPU memory whenever the held-out ``--metric-for-best`` improves; after training,
the final evaluation is compared with the best one and the better weights are written (ties keep the final ones).

Rank 0 alone keeps and restores the copy: it alone evaluates and writes the output directory. The copy is not in
the checkpoint: after ``--resume``, the best is chosen among the evaluations since the resume and the final one.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Optional, Sequence

from ..data import TextDataset

__all__ = ["evaluate_head", "predict_logits", "predict_labels", "supports_pairs", "require_pairs",
           "BestWeights"]


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
    """The metrics of ``dataset.problem_type`` for ``head`` on ``dataset`` (``flodl_hf.job.problems.summarize``).

    For classification the head's label names must be the dataset's, in the same order (load the data with
    ``labels=head.labels()``: names are matched then); otherwise ids would not compare.
    """
    from .problems import summarize

    if dataset.problem_type != "regression":
        head_labels = [str(label) for label in head.labels()]
        if head_labels != dataset.labels:
            raise ValueError(f"the model's labels {head_labels} differ from the data's labels {dataset.labels}: "
                             f"pass --labels {','.join(head_labels)} (the model's order), or use matching data")
    logits = predict_logits(head, dataset.texts, dataset.text_pairs, batch_size, progress)
    return summarize(dataset.problem_type, logits, dataset.label_ids, dataset.labels)


# --- the best periodic evaluation's weights ------------------------------------------------------------------

class BestWeights:
    """The weights (CPU copy), step and summary of the best held-out evaluation so far."""

    def __init__(self, metric: str, greater_is_better: bool) -> None:
        self.metric = metric
        self.greater_is_better = greater_is_better
        self.step: Optional[int] = None
        self.summary: Optional[dict] = None
        self._weights: Optional[dict] = None

    def capture(self, module: Any, step: int, summary: dict) -> None:
        """Copy ``module``'s weights (called after an evaluation that improved the metric)."""
        self._weights = {name: tensor.detach().to("cpu", copy=True) for name, tensor in module.state_dict().items()}
        self.step, self.summary = int(step), dict(summary)

    def beats(self, final: dict) -> bool:
        """Whether the kept weights score strictly better than ``final`` (the summary of the last weights)."""
        if self.summary is None or self._weights is None:
            return False
        best, last = float(self.summary[self.metric]), float(final[self.metric])
        return best > last if self.greater_is_better else best < last

    def restore(self, module: Any) -> None:
        """Load the kept weights into ``module`` (on its device)."""
        if self._weights is None:
            raise RuntimeError("no best weights were kept: call capture() first")
        module.load_state_dict(self._weights)
