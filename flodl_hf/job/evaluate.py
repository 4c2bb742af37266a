"""The best periodic evaluation's weights (``--eval-every``), kept to be written instead of the last ones.

It exists because early stopping stops *after* ``patience`` evaluations without improvement: the last weights are
then by construction not the best ones (transformers' ``load_best_model_at_end``). With ``--eval-every``, rank 0
copies the model's weights to CPU memory whenever the held-out ``--metric-for-best`` improves; after training,
the final evaluation is compared with the best one and the better weights are written (ties keep the final ones).
Every task's held-out scores are a dict of named metrics, so this is the same for all of them.

Rank 0 alone keeps and restores the copy: it alone evaluates and writes the output directory. The copy is not in
the checkpoint: after ``--resume``, the best is chosen among the evaluations since the resume and the final one.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["BestWeights"]


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
