"""The caller-side progress bar of a builder run: epochs, loss and each rank's share of the batches.

It exists so that the only bar of a multi-process run is drawn once, by the caller's process, from metrics
that are already aggregated over ranks (practices.md #10); workers never print progress. ``.progress(False)``
turns it off.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

from .types import EpochMetrics

__all__ = ["ProgressBar"]


class ProgressBar:
    def __init__(self, total_epochs: int, *, enabled: bool = True) -> None:
        self._bar: Optional[Any] = None
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total_epochs,
                desc="flodl-hf builder",
                unit="epoch",
                file=sys.stderr,
                dynamic_ncols=True,
                leave=True,
            )

    def update(self, m: EpochMetrics) -> None:
        if self._bar is None:
            return
        shares = "/".join(f"{s:.2f}" for s in m.per_rank_batch_share)
        self._bar.set_postfix_str(f"loss {m.avg_loss:.4f} | share {shares}", refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
